#include "models/qwen3_moe.h"

#include <stdio.h>

#include "models/family_step.h"
#include "models/qwen3_vl_moe.h"
#include "models/layers/router_softmax.h"
#include "shard/mesh.h"

// q or k (T, heads*D) -> (T, heads, D) normalised as the control says.
static tpr_status qk_norm(tpr_fstep *c, const tpr_qwen3_build_opts *o, tpr_value_id x, tpr_value_id w, int64_t heads,
                          tpr_value_id *out) {
  const tpr_model_config *cfg = &c->plan->config;
  int64_t T = c->T, D = cfg->head_dim;
  float eps = (float)cfg->rms_norm_eps;
  tpr_value_id x3;
  TPR_CHECK(tpr_pb_reshape(c->p, x, 3, (const int64_t[]){T, heads, D}, &x3));
  if (o->qk_control == TPR_QWEN3_QK_PER_HEAD) return tpr_pb_rms_norm(c->p, x3, w, eps, out);  // over D, per head
  // Controls: one RMS over the rank's whole slice (or, all-reduced, over the
  // whole projection), then the (D) weight on every head.
  tpr_value_id ss, row, ones, y;
  int64_t divisor = heads * D;
  TPR_CHECK(tpr_pb_sum_squares(c->p, x, &ss));  // (T, 1)
  if (o->qk_control == TPR_QWEN3_QK_FULL_ALLREDUCE) {
    TPR_CHECK(tpr_pb_all_reduce(c->p, ss, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, &ss));
    divisor *= c->plan->tp;
  }
  TPR_CHECK(tpr_pb_slice(c->p, x, 0, 0, 1, &row));  // (1, heads*D): a shape to fill
  TPR_CHECK(tpr_pb_reshape(c->p, row, 1, (const int64_t[]){heads * D}, &row));
  TPR_CHECK(tpr_fstep_fill(c->p, row, 1.0f, &ones));
  TPR_CHECK(tpr_pb_rms_scale(c->p, x, ss, ones, (float)divisor, eps, &y));
  TPR_CHECK(tpr_pb_reshape(c->p, y, 3, (const int64_t[]){T, heads, D}, &y));
  return tpr_pb_mul(c->p, y, w, out);
}

// x (T, H) -> x + attention(x), one layer.
static tpr_status attention(tpr_fstep *c, const tpr_qwen3_build_opts *o, int64_t L, tpr_value_id x, tpr_value_id *out) {
  const tpr_model_config *cfg = &c->plan->config;
  int64_t T = c->T, D = cfg->head_dim, qr = c->plan->attn.q_per_rank, kr = c->plan->attn.kv_per_rank;
  tpr_value_id ln, qn, kn, h, q, k, v;
  tpr_fweight wq, wk, wv, wo;
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.input_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.q_proj.weight", L, &wq));  // (qr*D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.k_proj.weight", L, &wk));  // (kr*D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.v_proj.weight", L, &wv));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.o_proj.weight", L, &wo));  // (H, qr*D)
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.self_attn.q_norm.weight", L, &qn));   // (D)
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.self_attn.k_norm.weight", L, &kn));   // (D)
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));               // (T, H)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wq, &q));  // (T, qr*D)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wk, &k));  // (T, kr*D)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wv, &v));
  TPR_CHECK(qk_norm(c, o, q, qn, qr, &q));  // (T, qr, D)
  TPR_CHECK(qk_norm(c, o, k, kn, kr, &k));  // (T, kr, D)
  TPR_CHECK(tpr_pb_reshape(c->p, v, 3, (const int64_t[]){T, kr, D}, &v));
  TPR_CHECK(tpr_fstep_rope(c, q, &q));  // NeoX RoPE, or MRoPE (qwen3_vl_moe)
  TPR_CHECK(tpr_fstep_rope(c, k, &k));
  return tpr_fstep_attend(c, L, q, k, v, &wo, x, out);
}

// x (T, H) -> x + mlp(x): the routed experts or, on a dense layer, the
// column/row-parallel SwiGLU MLP.
static tpr_status mlp(tpr_fstep *c, int64_t L, tpr_value_id x, tpr_value_id *out) {
  const tpr_model_config *cfg = &c->plan->config;
  tpr_value_id ln, h, y;
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.post_attention_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));  // (T, H)
  if (tpr_model_config_layer_is_moe(cfg, L)) {
    tpr_fweight gate;
    tpr_value_id logits, gates;
    TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.gate.weight", L, &gate));  // (E, H)
    TPR_CHECK(tpr_fstep_linear(c->p, h, &gate, &logits));                              // (T, E)
    TPR_CHECK(tpr_router_softmax_topk(c->p, logits, cfg->experts_per_tok, cfg->norm_topk_prob, &gates));
    TPR_CHECK(tpr_fstep_moe(c, L, h, gates, &y));
  } else {
    tpr_fweight wg, wu, wd;
    tpr_value_id g, u, a;
    TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.gate_proj.weight", L, &wg));  // (F/tp, H)
    TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.up_proj.weight", L, &wu));
    TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.down_proj.weight", L, &wd));  // (H, F/tp)
    TPR_CHECK(tpr_fstep_linear(c->p, h, &wg, &g));
    TPR_CHECK(tpr_fstep_linear(c->p, h, &wu, &u));
    TPR_CHECK(tpr_pb_swiglu(c->p, g, u, &a));       // (T, F/tp)
    TPR_CHECK(tpr_fstep_linear(c->p, a, &wd, &y));     // (T, H) partial over tp
    TPR_CHECK(tpr_pb_all_reduce(c->p, y, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, &y));
  }
  return tpr_pb_add(c->p, x, y, out);
}

static tpr_status check_supported(const tpr_shard_plan *plan) {
  const tpr_model_config *cfg = &plan->config;
  if (cfg->family != TPR_FAMILY_QWEN3_MOE && cfg->family != TPR_FAMILY_QWEN3_VL_MOE)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "qwen3_moe: the checkpoint is %s", tpr_model_family_name(cfg->family));
  if ((cfg->family == TPR_FAMILY_QWEN3_VL_MOE) != (cfg->mrope_layout != 0))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "qwen3_moe: %s with MRoPE layout %d", tpr_model_family_name(cfg->family),
                    cfg->mrope_layout);
  // The loader finds dense layers from the top-level config keys, which a
  // nested text_config does not have; Qwen3-VL-MoE checkpoints have none.
  if (cfg->family == TPR_FAMILY_QWEN3_VL_MOE && cfg->num_moe_layers != cfg->num_layers)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "qwen3_vl_moe: dense (mlp_only) layers are not supported");
  if (cfg->qk_norm != TPR_QK_NORM_PER_HEAD || cfg->router != TPR_ROUTER_SOFTMAX || cfg->routing_bias ||
      cfg->shared_expert_intermediate_size)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "qwen3_moe: needs a per-head QK-norm and an unbiased softmax router, no "
                    "shared expert");
  if (cfg->rotary_dim != cfg->head_dim)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "qwen3_moe: partial rotary (%lld of %lld dims) is not Qwen3's",
                    (long long)cfg->rotary_dim, (long long)cfg->head_dim);
  int64_t moe = 0;
  for (int64_t l = 0; l < cfg->num_layers; l++) moe += tpr_model_config_layer_is_moe(cfg, l);
  if (moe != cfg->num_moe_layers)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "qwen3_moe: %lld layers are MoE by mlp_only_layers/decoder_sparse_step, the "
                    "config counts %lld", (long long)moe, (long long)cfg->num_moe_layers);
  return TPR_OK;
}

static tpr_status build(tpr_fstep *c, const tpr_qwen3_build_opts *o) {
  const tpr_model_config *cfg = &c->plan->config;
  tpr_value_id embed, x, fn, head;
  TPR_CHECK(tpr_fstep_begin(c));
  TPR_CHECK(tpr_fstep_embed(c, &embed, &x));  // (T, H)
  for (int64_t L = 0; L < cfg->num_layers; L++) {
    TPR_CHECK(attention(c, o, L, x, &x));
    TPR_CHECK(mlp(c, L, x, &x));
  }
  TPR_CHECK(tpr_fstep_param(c, "model.norm.weight", 0, &fn));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, fn, (float)cfg->rms_norm_eps, &x));
  if (cfg->tie_word_embeddings)
    head = embed;
  else
    TPR_CHECK(tpr_fstep_param(c, "lm_head.weight", 0, &head));
  return tpr_fstep_logits(c, x, head);
}

tpr_status tpr_qwen3_build(const tpr_shard_plan *plan, const tpr_qwen3_build_opts *o, tpr_program **out) {
  *out = NULL;
  TPR_CHECK(check_supported(plan));
  tpr_fstep c = {.plan = plan,
                 .o = &o->step,
                 .family = plan->config.family == TPR_FAMILY_QWEN3_VL_MOE ? &tpr_family_qwen3_vl_moe
                                                                          : &tpr_family_qwen3_moe};
  TPR_CHECK(tpr_program_new(&c.p));
  tpr_status rc = build(&c, o);
  if (rc != TPR_OK) {
    tpr_program_free(c.p);
    return rc;
  }
  *out = c.p;
  return TPR_OK;
}

tpr_status tpr__qwen3_build_step(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out) {
  tpr_qwen3_build_opts qo = {.step = *o, .qk_control = o->per_rank_qk_norm ? TPR_QWEN3_QK_FULL_LOCAL : 0};
  return tpr_qwen3_build(plan, &qo, out);
}

const tpr_family tpr_family_qwen3_moe = {
    .name = "qwen3_moe",
    .family = TPR_FAMILY_QWEN3_MOE,
    .build_step = tpr__qwen3_build_step,
    .expert_gate = "experts.{E}.gate_proj.weight",
    .expert_up = "experts.{E}.up_proj.weight",
    .expert_down = "experts.{E}.down_proj.weight",
};
