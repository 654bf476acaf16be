#include "models/minimax.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/family_step.h"
#include "models/layers/router_softmax.h"
#include "models/train_loss.h"
#include "runtime/ops.h"
#include "runtime/program/autodiff.h"
#include "shard/mesh.h"

// The lightning layers' norm: MiniMaxRMSNorm's default eps (the layer does not
// pass rms_norm_eps to it).
#define LINEAR_NORM_EPS 1e-6f

#define STATE0 TPR_FAMILY_CONST_PREFIX "minimax.linear_state0"   // (nh/tp, D, D) zeros: every step starts a sequence

typedef struct mm {
  tpr_fstep c;
  const tpr_minimax_opts *o;
  tpr_value_id state0;
  tpr_value_id state_slot;      // inference: (T) i32 each row's state slot (-1 padded)
  tpr_value_id start;           // training: (1) i32 the first position (0)
  tpr_value_id attn_lo;         // packed training: (T) i32 each token's document start
  tpr_value_id *router_logits;  // training: each layer's (T, E) router logits, for the aux loss
  int n_router;
} mm;

static void slopes_name(int64_t L, char *buf, size_t cap) {
  snprintf(buf, cap, TPR_FAMILY_CONST_PREFIX "model.layers.%lld.self_attn.slopes", (long long)L);
}

// Training: x, replicated over the tp group, enters rank-local compute here,
// so its cotangent must be summed over the group (Megatron's f,
// runtime/program/autodiff.h). Inference programs carry no marks.
static tpr_status mark_tp(mm *b, int kind, tpr_value_id *x) {
  if (!b->o->training || (b->o->skip_grad_marks & kind) || b->c.plan->tp == 1) return TPR_OK;
  return tpr_pb_grad_all_reduce(b->c.p, *x, TPR_AXIS_TP, b->c.plan->tp, x);
}

// w (tp * per_rank) whole -> (per_rank), the block of this rank (its tp coordinate).
static tpr_status rank_slice(mm *b, tpr_value_id w, int64_t per_rank, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  TPR_CHECK(tpr_pb_reshape(c->p, w, 2, (const int64_t[]){c->plan->tp, per_rank}, &w));  // (tp, per_rank)
  TPR_CHECK(tpr_pb_index_select(c->p, w, 0, c->rank_tp, &w));                           // (1, per_rank)
  return tpr_pb_reshape(c->p, w, 1, (const int64_t[]){per_rank}, out);
}

// h (T, H) normed -> a (T, H), the lightning layer's output, replicated over tp.
static tpr_status lightning(mm *b, int64_t L, tpr_value_id h, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  int64_t T = c->T, D = cfg->head_dim, nh = cfg->num_heads, nr = nh / c->plan->tp;
  tpr_fweight wqkv, wg, wo;
  tpr_value_id nw, sl, qkv, q, k, v, o, st, ss, w, g, a;
  char name[160];
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.qkv_proj.weight", L, &wqkv));   // (nr*3D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.output_gate.weight", L, &wg));  // (nr*D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.out_proj.weight", L, &wo));     // (H, nr*D)
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.self_attn.norm.weight", L, &nw));          // (nh*D) whole
  slopes_name(L, name, sizeof name);
  TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 1, (const int64_t[]){nh}, &sl));  // (nh) whole
  TPR_CHECK(rank_slice(b, sl, nr, &sl));                                             // (nr) the rank's heads
  // Training: h enters the column-parallel qkv_proj and output_gate (the
  // residual keeps the unmarked h: its cotangent is whole on every rank).
  TPR_CHECK(mark_tp(b, TPR_MINIMAX_MARKS_COLUMN, &h));
  // qkv = silu(h Wqkv^T): the activation before the split (swiglu with up = 1).
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wqkv, &qkv));  // (T, nr*3D)
  TPR_CHECK(tpr_pb_fill(c->p, qkv, 1.0f, &a));
  TPR_CHECK(tpr_pb_swiglu(c->p, qkv, a, &qkv));
  TPR_CHECK(tpr_pb_reshape(c->p, qkv, 3, (const int64_t[]){T, nr, 3 * D}, &qkv));
  TPR_CHECK(tpr_pb_slice(c->p, qkv, 2, 0, D, &q));  // (T, nr, D) strided views
  TPR_CHECK(tpr_pb_slice(c->p, qkv, 2, D, D, &k));
  TPR_CHECK(tpr_pb_slice(c->p, qkv, 2, 2 * D, D, &v));
  if (b->o->training && b->o->pack && !b->o->debug_carry_state) {  // packed documents: zeros at each one's start
    TPR_CHECK(tpr_pb_lightning_attention_docs(c->p, q, k, v, b->state0, sl, b->attn_lo, cfg->linear_block_size, &o,
                                              &st));
    TPR_CHECK(tpr_pb_scale(c->p, o, 1.0f, &o));  // a contiguous copy of the packed output's view
  } else if (b->o->training) {  // one whole sequence from the zero state
    TPR_CHECK(tpr_pb_lightning_attention(c->p, q, k, v, b->state0, sl, cfg->linear_block_size, &o, &st));
    TPR_CHECK(tpr_pb_scale(c->p, o, 1.0f, &o));  // a contiguous copy of the packed output's view
  } else {  // the step's sequences, each from its state slot (zeros at position 0), written back in place
    tpr_value_id pool;
    const tpr_step_shape *sh = &c->o->shape;
    tpr_family_state_name(L, name, sizeof name);
    TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 4, (const int64_t[]){sh->state_slots, nr, D, D}, &pool));
    TPR_CHECK(tpr_pb_lightning_paged(c->p, q, k, v, pool, sl, b->state_slot, c->positions, cfg->linear_block_size,
                                     &o));  // (T, nr, D)
  }
  TPR_CHECK(tpr_pb_reshape(c->p, o, 2, (const int64_t[]){T, nr * D}, &o));  // (T, nr*D)
  // The norm is over every head's output: the sum of squares all-reduced
  // over tp, divided by nh*D (the control: this rank's heads alone).
  int64_t divisor = nh * D;
  TPR_CHECK(tpr_pb_sum_squares(c->p, o, &ss));  // (T, 1)
  if (b->o->control == TPR_MINIMAX_CONTROL_LOCAL_NORM)
    divisor = nr * D;
  else
    TPR_CHECK(tpr_pb_all_reduce(c->p, ss, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, &ss));
  // Training: the all-reduced sum and the whole weight feed this rank's
  // slice only, so their cotangents are summed over tp (as minimax_m2's QK-norm).
  TPR_CHECK(mark_tp(b, TPR_MINIMAX_MARKS_NORM, &ss));
  TPR_CHECK(mark_tp(b, TPR_MINIMAX_MARKS_NORM, &nw));
  TPR_CHECK(rank_slice(b, nw, nr * D, &w));
  TPR_CHECK(tpr_pb_rms_scale(c->p, o, ss, w, (float)divisor, LINEAR_NORM_EPS, &o));
  // The gate reads the layer's input h, column-parallel with the heads.
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wg, &g));  // (T, nr*D)
  TPR_CHECK(tpr_pb_sigmoid(c->p, g, &g));
  TPR_CHECK(tpr_pb_mul(c->p, g, o, &o));
  TPR_CHECK(tpr_fstep_linear(c->p, o, &wo, &a));  // (T, H) partial over tp
  return tpr_pb_all_reduce(c->p, a, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, out);
}

// h (T, H) normed -> the softmax attention's output (T, H), replicated.
static tpr_status softmax_attention(mm *b, int64_t L, tpr_value_id h, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  int64_t T = c->T, D = c->plan->config.head_dim, qr = c->plan->attn.q_per_rank, kr = c->plan->attn.kv_per_rank;
  tpr_fweight wq, wk, wv, wo;
  tpr_value_id q, k, v;
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.q_proj.weight", L, &wq));  // (qr*D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.k_proj.weight", L, &wk));  // (kr*D, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.v_proj.weight", L, &wv));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.self_attn.o_proj.weight", L, &wo));  // (H, qr*D)
  TPR_CHECK(mark_tp(b, TPR_MINIMAX_MARKS_COLUMN, &h));  // training: the column-parallel q/k/v input
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wq, &q));
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wk, &k));
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wv, &v));
  TPR_CHECK(tpr_pb_reshape(c->p, q, 3, (const int64_t[]){T, qr, D}, &q));
  TPR_CHECK(tpr_pb_reshape(c->p, k, 3, (const int64_t[]){T, kr, D}, &k));
  TPR_CHECK(tpr_pb_reshape(c->p, v, 3, (const int64_t[]){T, kr, D}, &v));
  TPR_CHECK(tpr_fstep_rope(c, q, &q));
  TPR_CHECK(tpr_fstep_rope(c, k, &k));
  if (!b->o->training) return tpr_fstep_attend_out(c, L, q, k, v, &wo, out);
  // Training: one whole sequence per run, attention over this run's k and v
  // (packed documents: never across a document's start).
  tpr_value_id att;
  const float scale = (float)(1.0 / sqrt((double)D));
  if (b->o->pack)
    TPR_CHECK(tpr_pb_attention_docs(c->p, q, k, v, b->start, b->attn_lo, scale, &att));  // (T, qr, D)
  else
    TPR_CHECK(tpr_pb_attention(c->p, q, k, v, b->start, scale, &att));  // (T, qr, D)
  TPR_CHECK(tpr_pb_reshape(c->p, att, 2, (const int64_t[]){T, qr * D}, &att));
  TPR_CHECK(tpr_fstep_linear(c->p, att, &wo, &att));  // (T, H) partial over tp
  return tpr_pb_all_reduce(c->p, att, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, out);
}

// alpha * h + beta * y
static tpr_status weighted(mm *b, tpr_value_id h, double alpha, tpr_value_id y, double beta, tpr_value_id *out) {
  TPR_CHECK(tpr_pb_scale(b->c.p, h, (float)alpha, &h));
  TPR_CHECK(tpr_pb_scale(b->c.p, y, (float)beta, &y));
  return tpr_pb_add(b->c.p, h, y, out);
}

// One decoder layer: x (T, H) -> (T, H).
static tpr_status layer(mm *b, int64_t L, tpr_value_id x, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  bool linear = tpr_model_config_layer_is_linear(cfg, L);
  tpr_value_id ln, h, a, logits, gates, y;
  tpr_fweight router;
  c->group = (int)(1 + 2 * L);  // FSDP: the attention's params, its input norm's included
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.input_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));  // (T, H)
  TPR_CHECK(linear ? lightning(b, L, h, &a) : softmax_attention(b, L, h, &a));
  TPR_CHECK(weighted(b, h, cfg->attn_alpha[linear], a, cfg->attn_beta[linear], &x));
  c->group = (int)(2 + 2 * L);  // FSDP: the MoE part's params
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.post_attention_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.block_sparse_moe.gate.weight", L, &router));  // (E, H)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &router, &logits));                                   // (T, E)
  TPR_CHECK(tpr_router_softmax_topk(c->p, logits, cfg->experts_per_tok, cfg->norm_topk_prob, &gates));
  if (!b->o->training) {
    TPR_CHECK(tpr_fstep_moe(c, L, h, gates, &y));
  } else {  // the tokens routed per expert as an output, the logits kept for the aux loss, the experts' inputs marked
    tpr_value_id load;
    char name[64];
    b->router_logits[b->n_router++] = logits;
    snprintf(name, sizeof name, "moe_load.%lld", (long long)L);
    TPR_CHECK(tpr_pb_moe_counts(c->p, gates, &load));  // (E) i32
    TPR_CHECK(tpr_program_output(c->p, load, name));
    tpr_step_build_opts so = *c->o;
    so.moe.mark_grads = !(b->o->skip_grad_marks & TPR_MINIMAX_MARKS_COLUMN);
    const tpr_step_build_opts *saved = c->o;
    c->o = &so;
    tpr_status rc = tpr_fstep_moe(c, L, h, gates, &y);
    c->o = saved;
    TPR_CHECK(rc);
  }
  return weighted(b, h, cfg->mlp_alpha, y, cfg->mlp_beta, out);
}

static tpr_status check_supported(const tpr_shard_plan *plan) {
  const tpr_model_config *cfg = &plan->config;
  if (cfg->family != TPR_FAMILY_MINIMAX)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "minimax: the checkpoint is %s", tpr_model_family_name(cfg->family));
  if (cfg->qk_norm != TPR_QK_NORM_NONE || cfg->qkv_bias || cfg->router != TPR_ROUTER_SOFTMAX || cfg->routing_bias ||
      cfg->mrope_layout || cfg->shared_expert_intermediate_size || cfg->num_moe_layers != cfg->num_layers ||
      cfg->rotary_dim != cfg->head_dim)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "minimax: the config is not the family's (no QK-norm, no biases, an "
                    "unbiased softmax router on every layer, full RoPE)");
  if (cfg->num_linear_layers && (cfg->num_heads % plan->tp || cfg->linear_block_size < 1))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "minimax: %lld lightning heads over tp=%d (block %lld)",
                    (long long)cfg->num_heads, plan->tp, (long long)cfg->linear_block_size);
  return TPR_OK;
}

static tpr_status build(mm *b) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  int64_t D = cfg->head_dim, nr = cfg->num_heads / c->plan->tp;
  tpr_value_id embed, x;
  if (b->o->training) {
    if (b->o->tokens < 1)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "minimax: %lld tokens per training run", (long long)b->o->tokens);
    TPR_CHECK(tpr_fstep_begin_tokens(c, b->o->tokens));
    TPR_CHECK(tpr_program_input(c->p, "start", TPR_I32, 1, (const int64_t[]){1}, &b->start));
    if (b->o->pack)
      TPR_CHECK(tpr_program_input(c->p, "attn_lo", TPR_I32, 1, (const int64_t[]){b->o->tokens}, &b->attn_lo));
  } else {
    TPR_CHECK(tpr_fstep_begin(c));
    // Lightning layers need state slots; a config with none (every layer
    // softmax) has no state and no "state_slot" input, like any family.
    if (cfg->num_linear_layers && c->o->shape.state_slots < 1)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "minimax: a step program of lightning layers needs state slots (got %lld)",
                      (long long)c->o->shape.state_slots);
    if (cfg->num_linear_layers)
      TPR_CHECK(tpr_program_input(c->p, "state_slot", TPR_I32, 1, (const int64_t[]){c->T}, &b->state_slot));
  }
  if (cfg->num_linear_layers) {
    TPR_CHECK(tpr_program_param(c->p, STATE0, TPR_F32, 3, (const int64_t[]){nr, D, D}, &b->state0));
  }
  c->group = 0;  // FSDP prefetch groups: one per layer part (layer moves them on)
  TPR_CHECK(tpr_fstep_embed(c, &embed, &x));  // (T, H)
  for (int64_t L = 0; L < tpr_step_layers(&c->o->shape, cfg->num_layers); L++) TPR_CHECK(layer(b, L, x, &x));
  c->group = (int)(1 + 2 * cfg->num_layers);
  if (!b->o->training) return tpr_fstep_finish(c, x, embed, NULL, NULL, 0);
  tpr_train_loss_opts lo = {.tokens = c->T,
                            .aux_coef = b->o->aux_coef,
                            .skip_head_mark = (b->o->skip_grad_marks & TPR_MINIMAX_MARKS_COLUMN) != 0,
                            .family = c->family->name};
  return tpr_fstep_finish(c, x, embed, &lo, b->router_logits, b->n_router);
}

tpr_status tpr_minimax_build(const tpr_shard_plan *plan, const tpr_minimax_opts *o, tpr_program **out) {
  *out = NULL;
  if ((unsigned)o->control > TPR_MINIMAX_CONTROL_LOCAL_NORM)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "minimax: unknown control %d", (int)o->control);
  TPR_CHECK(check_supported(plan));
  mm b = {.c = {.plan = plan, .o = &o->step, .family = &tpr_family_minimax, .training = o->training,
                .fsdp = o->training ? &o->fsdp : NULL},
          .o = o};
  if (o->training && !(b.router_logits = calloc((size_t)plan->config.num_layers + 1, sizeof *b.router_logits)))
    return TPR_FAIL(TPR_ERR_OOM, "minimax: router logits");
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

static tpr_status build_step(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out) {
  tpr_minimax_opts mo = {.step = *o,
                         .control = o->per_rank_qk_norm ? TPR_MINIMAX_CONTROL_LOCAL_NORM : TPR_MINIMAX_CONTROL_NONE};
  return tpr_minimax_build(plan, &mo, out);
}

// Each lightning layer's slopes (all heads: the program takes the rank's),
// and the zero initial state.
static tpr_status constants(const tpr_shard_plan *plan, tpr_backend *be, tpr_family_consts *out) {
  const tpr_model_config *cfg = &plan->config;
  int64_t nh = cfg->num_heads, D = cfg->head_dim, n = cfg->num_linear_layers + 1;
  *out = (tpr_family_consts){0};
  if (!cfg->num_linear_layers) return TPR_OK;
  float *sl = malloc((size_t)nh * sizeof *sl);
  out->names = calloc((size_t)n, sizeof *out->names);
  out->t = calloc((size_t)n, sizeof *out->t);
  tpr_status rc = sl && out->names && out->t ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "minimax: constants");
  char name[96];
  for (int64_t L = 0; rc == TPR_OK && L < cfg->num_layers; L++) {
    if (!tpr_model_config_layer_is_linear(cfg, L)) continue;
    tpr_lightning_slopes(nh, L, cfg->num_layers, sl);  // transformers' get_slope_rate of layer L
    slopes_name(L, name, sizeof name);
    rc = tpr_family_consts_add(out, be, name, TPR_F32, 1, (const int64_t[]){nh}, sl);
  }
  if (rc == TPR_OK) rc = tpr_family_consts_add(out, be, STATE0, TPR_F32, 3, (const int64_t[]){nh / plan->tp, D, D}, NULL);
  free(sl);
  if (rc != TPR_OK) tpr_family_consts_free(out);
  return rc;
}

const tpr_family tpr_family_minimax = {
    .name = "minimax",
    .family = TPR_FAMILY_MINIMAX,
    .build_step = build_step,
    .expert_gate = ".w1.weight",
    .expert_up = ".w3.weight",
    .expert_down = ".w2.weight",
    .constants = constants,
    .state_shape = tpr_family_lightning_state_shape,
};
