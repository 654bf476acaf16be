#include "models/hunyuan_moe.h"

#include "models/family_step.h"
#include "models/layers/router_softmax.h"
#include "shard/mesh.h"

// x (T, H) -> x + attention(x), one layer.
static tpr_status attention(tpr_fstep *c, const tpr_hunyuan_build_opts *o, int64_t L, tpr_value_id x,
                            tpr_value_id *out) {
  const tpr_model_config *cfg = &c->plan->config;
  int64_t T = c->T, D = cfg->head_dim, qr = c->plan->attn.q_per_rank, kr = c->plan->attn.kv_per_rank;
  float eps = (float)cfg->rms_norm_eps, theta = (float)cfg->rope_theta;
  tpr_value_id ln, qn, kn, h, q, k, v;
  tpr_fweight wq, wk, wv, wo;
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.input_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.q_proj.weight", L, &wq));  // (qr*D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.k_proj.weight", L, &wk));  // (kr*D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.v_proj.weight", L, &wv));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.o_proj.weight", L, &wo));  // (H, qr*D)
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.self_attn.query_layernorm.weight", L, &qn));  // (D)
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.self_attn.key_layernorm.weight", L, &kn));    // (D)
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, eps, &h));  // (T, H)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wq, &q));     // (T, qr*D)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wk, &k));     // (T, kr*D)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wv, &v));
  TPR_CHECK(tpr_pb_reshape(c->p, q, 3, (const int64_t[]){T, qr, D}, &q));
  TPR_CHECK(tpr_pb_reshape(c->p, k, 3, (const int64_t[]){T, kr, D}, &k));
  TPR_CHECK(tpr_pb_reshape(c->p, v, 3, (const int64_t[]){T, kr, D}, &v));
  // RMS over each head's D: rank-local whatever the order. RoPE is a rotation
  // of pairs, so it keeps the RMS but not the per-dim weight's alignment:
  // the two orders differ.
  if (o->qk_norm_before_rope) {
    TPR_CHECK(tpr_pb_rms_norm(c->p, q, qn, eps, &q));
    TPR_CHECK(tpr_pb_rms_norm(c->p, k, kn, eps, &k));
  }
  TPR_CHECK(tpr_pb_rope(c->p, q, c->positions, cfg->rotary_dim, theta, &q));
  TPR_CHECK(tpr_pb_rope(c->p, k, c->positions, cfg->rotary_dim, theta, &k));
  if (!o->qk_norm_before_rope) {
    TPR_CHECK(tpr_pb_rms_norm(c->p, q, qn, eps, &q));  // (T, qr, D)
    TPR_CHECK(tpr_pb_rms_norm(c->p, k, kn, eps, &k));  // (T, kr, D)
  }
  return tpr_fstep_attend(c, L, q, k, v, &wo, x, out);
}

// h (T, H) -> the shared MLP's output (T, H), replicated over tp.
static tpr_status shared_mlp(tpr_fstep *c, int64_t L, tpr_value_id h, tpr_value_id *y) {
  tpr_fweight wg, wu, wd;
  tpr_value_id g, u, a;
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.shared_mlp.gate_proj.weight", L, &wg));  // (S/tp, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.shared_mlp.up_proj.weight", L, &wu));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.shared_mlp.down_proj.weight", L, &wd));  // (H, S/tp)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wg, &g));
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wu, &u));
  TPR_CHECK(tpr_pb_swiglu(c->p, g, u, &a));    // (T, S/tp)
  TPR_CHECK(tpr_fstep_linear(c->p, a, &wd, y));  // (T, H) partial over tp
  return tpr_pb_all_reduce(c->p, *y, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, y);
}

// x (T, H) -> x + routed experts(h) + shared MLP(h), h the post-attention norm.
static tpr_status moe(tpr_fstep *c, int64_t L, tpr_value_id x, tpr_value_id *out) {
  const tpr_model_config *cfg = &c->plan->config;
  tpr_value_id ln, h, logits, y, ys;
  tpr_fweight gate;
  tpr_router_softmax_values r;
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.post_attention_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));  // (T, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.gate.wg.weight", L, &gate));  // (E, H)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &gate, &logits));                             // (T, E)
  TPR_CHECK(tpr_router_softmax_topk_values(c->p, logits, cfg->experts_per_tok, cfg->norm_topk_prob, &r));
  // Seed 003's rule for a re-routed token's gate; the step options are the
  // session's, so this layer's copy carries the router's values.
  tpr_step_build_opts so = *c->o;
  so.moe.reroute_own_prob = true, so.moe.probs = r.probs, so.moe.chosen = r.chosen;
  const tpr_step_build_opts *saved = c->o;
  c->o = &so;
  tpr_status rc = tpr_fstep_moe(c, L, h, r.gates, &y);
  c->o = saved;
  TPR_CHECK(rc);
  TPR_CHECK(shared_mlp(c, L, h, &ys));
  TPR_CHECK(tpr_pb_add(c->p, y, ys, &y));
  return tpr_pb_add(c->p, x, y, out);
}

static tpr_status check_supported(const tpr_shard_plan *plan) {
  const tpr_model_config *cfg = &plan->config;
  if (cfg->family != TPR_FAMILY_HUNYUAN_V1_MOE)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "hunyuan_v1_moe: the checkpoint is %s", tpr_model_family_name(cfg->family));
  if (cfg->qk_norm != TPR_QK_NORM_PER_HEAD || !cfg->qk_norm_after_rope || cfg->router != TPR_ROUTER_SOFTMAX ||
      cfg->routing_bias || !cfg->shared_expert_intermediate_size || cfg->num_moe_layers != cfg->num_layers)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "hunyuan_v1_moe: needs a per-head QK-norm after RoPE, an unbiased softmax "
                    "router, a shared expert and the MoE block in every layer");
  if (cfg->rotary_dim != cfg->head_dim)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "hunyuan_v1_moe: partial rotary (%lld of %lld dims) is not Hunyuan's",
                    (long long)cfg->rotary_dim, (long long)cfg->head_dim);
  return TPR_OK;
}

static tpr_status build(tpr_fstep *c, const tpr_hunyuan_build_opts *o) {
  const tpr_model_config *cfg = &c->plan->config;
  tpr_value_id embed, x, fn, head;
  TPR_CHECK(tpr_fstep_begin(c));
  TPR_CHECK(tpr_fstep_embed(c, &embed, &x));  // (T, H)
  for (int64_t L = 0; L < cfg->num_layers; L++) {
    TPR_CHECK(attention(c, o, L, x, &x));
    TPR_CHECK(moe(c, L, x, &x));
  }
  TPR_CHECK(tpr_fstep_param(c, "model.norm.weight", 0, &fn));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, fn, (float)cfg->rms_norm_eps, &x));
  if (cfg->tie_word_embeddings)
    head = embed;
  else
    TPR_CHECK(tpr_fstep_param(c, "lm_head.weight", 0, &head));
  return tpr_fstep_logits(c, x, head);
}

tpr_status tpr_hunyuan_build(const tpr_shard_plan *plan, const tpr_hunyuan_build_opts *o, tpr_program **out) {
  *out = NULL;
  TPR_CHECK(check_supported(plan));
  tpr_fstep c = {.plan = plan, .o = &o->step, .family = &tpr_family_hunyuan_v1_moe};
  TPR_CHECK(tpr_program_new(&c.p));
  tpr_status rc = build(&c, o);
  if (rc != TPR_OK) {
    tpr_program_free(c.p);
    return rc;
  }
  *out = c.p;
  return TPR_OK;
}

static tpr_status build_step(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out) {
  tpr_hunyuan_build_opts ho = {.step = *o, .qk_norm_before_rope = o->per_rank_qk_norm};
  return tpr_hunyuan_build(plan, &ho, out);
}

const tpr_family tpr_family_hunyuan_v1_moe = {
    .name = "hunyuan_v1_moe",
    .family = TPR_FAMILY_HUNYUAN_V1_MOE,
    .build_step = build_step,
    .expert_gate = "experts.{E}.gate_proj.weight",
    .expert_up = "experts.{E}.up_proj.weight",
    .expert_down = "experts.{E}.down_proj.weight",
};
