#include "models/qk_head_decoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "models/family_step.h"
#include "models/layers/router_softmax.h"
#include "models/train_loss.h"
#include "runtime/program/autodiff.h"
#include "shard/mesh.h"

typedef struct qkhd {
  tpr_fstep c;
  const tpr_qkhd_desc *d;
  const tpr_qkhd_opts *o;
  tpr_qk_control control;
  tpr_value_id start;           // training: (1) i32 the first position (0)
  tpr_value_id attn_lo;         // packed training: (T) i32 each token's document start
  tpr_value_id *router_logits;  // training: the MoE layers' (T, E) router logits, for the aux loss
  int n_router;
} qkhd;

// Training: x, replicated over the tp group, enters rank-local compute here,
// so its cotangent must be summed over the group (Megatron's f,
// runtime/program/autodiff.h). Inference programs carry no marks.
static tpr_status mark_tp(qkhd *b, int kind, tpr_value_id *x) {
  if (!b->o->training || (b->o->skip_grad_marks & kind) || b->c.plan->tp == 1) return TPR_OK;
  return tpr_pb_grad_all_reduce(b->c.p, *x, TPR_AXIS_TP, b->c.plan->tp, x);
}

// Training inputs: the rank tensor, tokens, positions (and MRoPE's), start.
static tpr_status begin_training(qkhd *b) {
  tpr_fstep *c = &b->c;
  int64_t T = b->o->tokens;
  if (T < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: %lld tokens per training run", c->family->name, (long long)T);
  TPR_CHECK(tpr_fstep_begin_tokens(c, T));
  if (b->o->pack) TPR_CHECK(tpr_program_input(c->p, "attn_lo", TPR_I32, 1, (const int64_t[]){T}, &b->attn_lo));
  return tpr_program_input(c->p, "start", TPR_I32, 1, (const int64_t[]){1}, &b->start);
}

// Training attention: one whole sequence per run, so attention reads this
// run's k and v (no cache); then the row-parallel o_proj and its all-reduce.
static tpr_status attend_training(qkhd *b, tpr_value_id q, tpr_value_id k, tpr_value_id v, const tpr_fweight *wo,
                                  tpr_value_id x, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  int64_t D = c->plan->config.head_dim, qr = c->plan->attn.q_per_rank;
  tpr_value_id att, o;
  float scale = (float)(1.0 / sqrt((double)D));
  if (b->o->pack)  // packed documents: a block-diagonal causal mask
    TPR_CHECK(tpr_pb_attention_docs(c->p, q, k, v, b->start, b->attn_lo, scale, &att));  // (T, qr, D)
  else
    TPR_CHECK(tpr_pb_attention(c->p, q, k, v, b->start, scale, &att));  // (T, qr, D)
  TPR_CHECK(tpr_pb_reshape(c->p, att, 2, (const int64_t[]){c->T, qr * D}, &att));
  TPR_CHECK(tpr_fstep_linear(c->p, att, wo, &o));  // (T, H) partial over tp
  TPR_CHECK(tpr_pb_all_reduce(c->p, o, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, &o));
  return tpr_pb_add(c->p, x, o, out);
}

// x (T, heads, D) q or k -> normalised as the control says, (T, heads, D).
static tpr_status qk_norm(qkhd *b, tpr_value_id x, tpr_value_id w, int64_t heads, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  int64_t T = c->T, D = cfg->head_dim;
  float eps = (float)cfg->rms_norm_eps;
  if (b->control != TPR_QK_CONTROL_FULL_LOCAL && b->control != TPR_QK_CONTROL_FULL_ALLREDUCE)
    return tpr_pb_rms_norm(c->p, x, w, eps, out);  // over D, per head: rank-local
  // Controls: one RMS over the rank's whole slice (or, all-reduced, over the
  // whole projection), then the (D) weight on every head.
  tpr_value_id x2, ss, row, ones, y;
  int64_t divisor = heads * D;
  TPR_CHECK(tpr_pb_reshape(c->p, x, 2, (const int64_t[]){T, heads * D}, &x2));
  TPR_CHECK(tpr_pb_sum_squares(c->p, x2, &ss));  // (T, 1)
  if (b->control == TPR_QK_CONTROL_FULL_ALLREDUCE) {
    TPR_CHECK(tpr_pb_all_reduce(c->p, ss, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, &ss));
    divisor *= c->plan->tp;
  }
  TPR_CHECK(tpr_pb_slice(c->p, x2, 0, 0, 1, &row));  // (1, heads*D): a shape to fill
  TPR_CHECK(tpr_pb_reshape(c->p, row, 1, (const int64_t[]){heads * D}, &row));
  TPR_CHECK(tpr_pb_fill(c->p, row, 1.0f, &ones));
  TPR_CHECK(tpr_pb_rms_scale(c->p, x2, ss, ones, (float)divisor, eps, &y));
  TPR_CHECK(tpr_pb_reshape(c->p, y, 3, (const int64_t[]){T, heads, D}, &y));
  return tpr_pb_mul(c->p, y, w, out);
}

// x (T, n) += the column-parallel bias `pattern` (n): this rank's slice of
// the same heads as its weight's rows (padding heads: zeros).
static tpr_status add_bias(qkhd *b, const char *pattern, int64_t L, tpr_value_id *x) {
  tpr_value_id bias;
  TPR_CHECK(tpr_fstep_param(&b->c, pattern, L, &bias));  // (n) f32; declared even unused: the session binds it
  if (b->control == TPR_QK_CONTROL_NO_BIAS) return TPR_OK;
  // Training: the bias is this rank's slice, rank-local like its weight's
  // rows (replicated KV heads' copies are summed by the gradient fold), so
  // it takes no mark; the control marks it anyway.
  if (b->o->training && (b->o->skip_grad_marks & TPR_QKHD_MARKS_BIAS_WRONG) && b->c.plan->tp > 1)
    TPR_CHECK(tpr_pb_grad_all_reduce(b->c.p, bias, TPR_AXIS_TP, b->c.plan->tp, &bias));
  return tpr_pb_add(b->c.p, *x, bias, x);  // broadcast over T: the backward sums the cotangent over T
}

// x (T, H) -> x + attention(x), one layer.
static tpr_status attention(qkhd *b, int64_t L, tpr_value_id x, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  int64_t T = c->T, D = cfg->head_dim, qr = c->plan->attn.q_per_rank, kr = c->plan->attn.kv_per_rank;
  // RoPE is a rotation of pairs: it keeps the RMS but not the per-dim
  // weight's alignment, so the two orders differ.
  bool after = b->d->qk_norm_after_rope != (b->control == TPR_QK_CONTROL_SWAP_ORDER);
  tpr_value_id ln, qn = -1, kn = -1, h, q, k, v;
  tpr_fweight wq, wk, wv, wo;
  bool norm = b->d->q_norm != NULL;
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.input_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.q_proj.weight", L, &wq));  // (qr*D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.k_proj.weight", L, &wk));  // (kr*D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.v_proj.weight", L, &wv));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.o_proj.weight", L, &wo));  // (H, qr*D)
  if (norm) {
    TPR_CHECK(tpr_fstep_param(c, b->d->q_norm, L, &qn));  // (D)
    TPR_CHECK(tpr_fstep_param(c, b->d->k_norm, L, &kn));  // (D)
  }
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));               // (T, H)
  // Training: h enters the column-parallel q/k/v; the (D) norm weights enter
  // this rank's heads only (each rank's cotangent covers its own heads).
  TPR_CHECK(mark_tp(b, TPR_QKHD_MARKS_COLUMN, &h));
  if (norm) {
    TPR_CHECK(mark_tp(b, TPR_QKHD_MARKS_QK_NORM, &qn));
    TPR_CHECK(mark_tp(b, TPR_QKHD_MARKS_QK_NORM, &kn));
  }
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wq, &q));  // (T, qr*D)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wk, &k));  // (T, kr*D)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wv, &v));
  if (b->d->qkv_bias) {
    TPR_CHECK(add_bias(b, "model.layers.{L}.self_attn.q_proj.bias", L, &q));  // + (qr*D)
    TPR_CHECK(add_bias(b, "model.layers.{L}.self_attn.k_proj.bias", L, &k));  // + (kr*D)
    TPR_CHECK(add_bias(b, "model.layers.{L}.self_attn.v_proj.bias", L, &v));
  }
  TPR_CHECK(tpr_pb_reshape(c->p, q, 3, (const int64_t[]){T, qr, D}, &q));
  TPR_CHECK(tpr_pb_reshape(c->p, k, 3, (const int64_t[]){T, kr, D}, &k));
  TPR_CHECK(tpr_pb_reshape(c->p, v, 3, (const int64_t[]){T, kr, D}, &v));
  if (norm && !after) {
    TPR_CHECK(qk_norm(b, q, qn, qr, &q));
    TPR_CHECK(qk_norm(b, k, kn, kr, &k));
  }
  TPR_CHECK(tpr_fstep_rope(c, q, &q));  // NeoX RoPE, or MRoPE at positions_3d
  TPR_CHECK(tpr_fstep_rope(c, k, &k));
  if (norm && after) {
    TPR_CHECK(qk_norm(b, q, qn, qr, &q));  // (T, qr, D)
    TPR_CHECK(qk_norm(b, k, kn, kr, &k));  // (T, kr, D)
  }
  if (b->o->training) return attend_training(b, q, k, v, &wo, x, out);
  return tpr_fstep_attend(c, L, q, k, v, &wo, x, out);
}

// h (T, H) -> the SwiGLU MLP named `prefix` + "{gate,up,down}_proj.weight":
// column/row-parallel, y (T, H) replicated over tp.
// marks: the TPR_QKHD_MARKS_* bits any of which leaves out the input's mark.
static tpr_status swiglu_mlp(qkhd *b, const char *prefix, int marks, int64_t L, tpr_value_id h, tpr_value_id *y) {
  tpr_fstep *c = &b->c;
  char pg[160], pu[160], pd[160];
  snprintf(pg, sizeof pg, "%sgate_proj.weight", prefix);
  snprintf(pu, sizeof pu, "%sup_proj.weight", prefix);
  snprintf(pd, sizeof pd, "%sdown_proj.weight", prefix);
  tpr_fweight wg, wu, wd;
  tpr_value_id g, u, a;
  TPR_CHECK(tpr_fstep_weight(c, pg, L, &wg));  // (F/tp, H)
  TPR_CHECK(tpr_fstep_weight(c, pu, L, &wu));
  TPR_CHECK(tpr_fstep_weight(c, pd, L, &wd));  // (H, F/tp)
  TPR_CHECK(mark_tp(b, marks, &h));  // training: the column-parallel gate/up input
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wg, &g));
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wu, &u));
  TPR_CHECK(tpr_pb_swiglu(c->p, g, u, &a));      // (T, F/tp)
  TPR_CHECK(tpr_fstep_linear(c->p, a, &wd, y));  // (T, H) partial over tp
  return tpr_pb_all_reduce(c->p, *y, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, y);
}

// Training: the router's gates (gradients flow through the chosen, and
// renormalised, probabilities: router_softmax.h), the tokens routed per
// expert as an output, the logits kept for the aux loss, and the experts
// with their inputs marked.
static tpr_status routed_training(qkhd *b, int64_t L, tpr_value_id h, tpr_value_id logits, tpr_value_id *y) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  tpr_value_id gates, load;
  char name[64];
  TPR_CHECK(tpr_router_softmax_topk(c->p, logits, cfg->experts_per_tok, cfg->norm_topk_prob, &gates));  // (T, E)
  b->router_logits[b->n_router++] = logits;
  snprintf(name, sizeof name, "moe_load.%lld", (long long)L);
  TPR_CHECK(tpr_pb_moe_counts(c->p, gates, &load));  // (E) i32
  TPR_CHECK(tpr_program_output(c->p, load, name));
  tpr_step_build_opts so = *c->o;
  so.moe.mark_grads = !(b->o->skip_grad_marks & TPR_QKHD_MARKS_COLUMN);
  const tpr_step_build_opts *saved = c->o;
  c->o = &so;
  tpr_status rc = tpr_fstep_moe(c, L, h, gates, y);
  c->o = saved;
  return rc;
}

// h (T, H) -> the routed experts' y (T, H), replicated.
static tpr_status routed(qkhd *b, int64_t L, tpr_value_id h, tpr_value_id *y) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  tpr_fweight gate;
  tpr_value_id logits, gates;
  TPR_CHECK(tpr_fstep_weight(c, b->d->router, L, &gate));  // (E, H)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &gate, &logits));    // (T, E)
  if (b->o->training) return routed_training(b, L, h, logits, y);
  if (!b->d->reroute_own_prob) {
    TPR_CHECK(tpr_router_softmax_topk(c->p, logits, cfg->experts_per_tok, cfg->norm_topk_prob, &gates));
    return tpr_fstep_moe(c, L, h, gates, y);
  }
  tpr_router_softmax_values r;
  TPR_CHECK(tpr_router_softmax_topk_values(c->p, logits, cfg->experts_per_tok, cfg->norm_topk_prob, &r));
  // The step options are the session's, so this layer's copy carries the
  // router's values.
  tpr_step_build_opts so = *c->o;
  so.moe.reroute_own_prob = true, so.moe.probs = r.probs, so.moe.chosen = r.chosen;
  const tpr_step_build_opts *saved = c->o;
  c->o = &so;
  tpr_status rc = tpr_fstep_moe(c, L, h, r.gates, y);
  c->o = saved;
  return rc;
}

// x (T, H) -> x + mlp(x): the routed experts (plus the shared expert where
// the config has one) or, on a dense layer, the dense MLP.
static tpr_status mlp(qkhd *b, int64_t L, tpr_value_id x, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  tpr_value_id ln, h, y, ys;
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.post_attention_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));  // (T, H)
  if (!tpr_model_config_layer_is_moe(cfg, L)) {
    TPR_CHECK(swiglu_mlp(b, b->d->dense_mlp, TPR_QKHD_MARKS_COLUMN, L, h, &y));
  } else {
    TPR_CHECK(routed(b, L, h, &y));
    if (cfg->shared_expert_intermediate_size) {
      // h is replicated; each rank's shared-expert slice sees only its
      // columns' share of the cotangent, so the backward sums it over tp.
      TPR_CHECK(swiglu_mlp(b, b->d->shared_mlp, TPR_QKHD_MARKS_COLUMN | TPR_QKHD_MARKS_SHARED, L, h, &ys));
      TPR_CHECK(tpr_pb_add(c->p, y, ys, &y));
    }
  }
  return tpr_pb_add(c->p, x, y, out);
}

static tpr_status check_supported(const tpr_qkhd_desc *d, const tpr_shard_plan *plan, const tpr_step_build_opts *o) {
  const tpr_model_config *cfg = &plan->config;
  const char *fam = d->family->name;
  if (cfg->family != d->family->family)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: the checkpoint is %s", fam, tpr_model_family_name(cfg->family));
  if (d->mrope != (cfg->mrope_layout != 0))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: MRoPE layout %d (the family %s MRoPE)", fam, cfg->mrope_layout,
                    d->mrope ? "needs" : "has no");
  if (!d->q_norm) {
    if (cfg->qk_norm != TPR_QK_NORM_NONE)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: the family has no QK-norm, the config has one", fam);
  } else if (cfg->qk_norm != TPR_QK_NORM_PER_HEAD || cfg->qk_norm_after_rope != d->qk_norm_after_rope) {
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: needs a per-head QK-norm %s RoPE", fam,
                    d->qk_norm_after_rope ? "after" : "before");
  }
  if (cfg->qkv_bias != d->qkv_bias)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: the family %s q/k/v biases, the config %s", fam,
                    d->qkv_bias ? "has" : "has no", cfg->qkv_bias ? "has them" : "has none");
  if (!d->router) {
    // A dense model: nothing to route, so the MoE options mean nothing.
    if (cfg->num_experts || cfg->num_moe_layers)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: the family is dense, the config has %lld experts", fam,
                      (long long)cfg->num_experts);
    if (o->moe.capacity_factor > 0 || o->moe.reroute_dropped || o->moe_stats)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: a dense model has no experts: --capacity-factor, --reroute-dropped "
                      "and MoE statistics do not apply", fam);
  } else if (cfg->router != TPR_ROUTER_SOFTMAX || cfg->routing_bias) {
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: needs an unbiased softmax router", fam);
  }
  if ((cfg->shared_expert_intermediate_size != 0) != (d->shared_mlp != NULL))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: the family %s a shared expert, the config %s one", fam,
                    d->shared_mlp ? "has" : "has no", cfg->shared_expert_intermediate_size ? "has" : "has no");
  // The loader finds dense layers from the top-level config keys, which a
  // nested text_config (qwen3_vl_moe) does not have.
  if (!d->dense_mlp && cfg->num_moe_layers != cfg->num_layers)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: dense (mlp_only) layers are not supported", fam);
  if (cfg->rotary_dim != cfg->head_dim)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: partial rotary (%lld of %lld dims) is not the family's", fam,
                    (long long)cfg->rotary_dim, (long long)cfg->head_dim);
  int64_t moe = 0;
  for (int64_t l = 0; l < cfg->num_layers; l++) moe += tpr_model_config_layer_is_moe(cfg, l);
  if (moe != cfg->num_moe_layers)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: %lld layers are MoE by mlp_only_layers/decoder_sparse_step, the "
                    "config counts %lld", fam, (long long)moe, (long long)cfg->num_moe_layers);
  return TPR_OK;
}

static tpr_status build(qkhd *b) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  tpr_value_id embed, x;
  TPR_CHECK(b->o->training ? begin_training(b) : tpr_fstep_begin(c));
  c->group = 0;  // FSDP prefetch groups: one per layer part
  TPR_CHECK(tpr_fstep_embed(c, &embed, &x));  // (T, H)
  for (int64_t L = 0; L < tpr_step_layers(&c->o->shape, cfg->num_layers); L++) {
    c->group = (int)(1 + 2 * L);
    TPR_CHECK(attention(b, L, x, &x));
    c->group = (int)(2 + 2 * L);
    TPR_CHECK(mlp(b, L, x, &x));
  }
  c->group = (int)(1 + 2 * cfg->num_layers);
  if (!b->o->training) return tpr_fstep_finish(c, x, embed, NULL, NULL, 0);
  tpr_train_loss_opts lo = {.tokens = c->T,
                            .aux_coef = b->o->aux_coef,
                            .skip_head_mark = (b->o->skip_grad_marks & TPR_QKHD_MARKS_COLUMN) != 0,
                            .family = c->family->name};
  return tpr_fstep_finish(c, x, embed, &lo, b->router_logits, b->n_router);
}

tpr_status tpr_qkhd_build(const tpr_qkhd_desc *d, const tpr_shard_plan *plan, const tpr_qkhd_opts *o,
                          tpr_program **out) {
  *out = NULL;
  if ((unsigned)o->qk_control > TPR_QK_CONTROL_NO_BIAS)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: unknown QK-norm control %d", d->family->name, (int)o->qk_control);
  TPR_CHECK(check_supported(d, plan, &o->step));
  if (o->training && d->reroute_own_prob && o->step.moe.capacity_factor > 0)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: --capacity-factor %g has no backward in training (the re-routed "
                    "token's own-probability gate); train dropless, as transformers' model is", d->family->name,
                    o->step.moe.capacity_factor);
  qkhd b = {.c = {.plan = plan, .o = &o->step, .family = d->family, .training = o->training,
                  .fsdp = o->training ? &o->fsdp : NULL},
            .d = d,
            .o = o,
            .control = o->qk_control};
  if (o->training && !(b.router_logits = calloc((size_t)plan->config.num_layers + 1, sizeof *b.router_logits)))
    return TPR_FAIL(TPR_ERR_OOM, "%s: router logits", d->family->name);
  tpr_status rc = tpr_program_new(&b.c.p);
  if (rc == TPR_OK) rc = build(&b);
  free(b.router_logits);
  if (rc != TPR_OK) {
    tpr_program_free(b.c.p);
    return rc;
  }
  *out = b.c.p;
  return TPR_OK;
}

tpr_status tpr_qkhd_build_step(const tpr_qkhd_desc *d, const tpr_shard_plan *plan, const tpr_step_build_opts *o,
                               tpr_program **out) {
  tpr_qkhd_opts qo = {.step = *o, .qk_control = o->per_rank_qk_norm ? d->session_control : TPR_QK_CONTROL_NONE};
  return tpr_qkhd_build(d, plan, &qo, out);
}
