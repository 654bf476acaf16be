#include "models/minicpm_sala.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/family_step.h"
#include "models/train_loss.h"
#include "runtime/ops.h"
#include "runtime/program/autodiff.h"
#include "shard/mesh.h"

#define SLOPES TPR_FAMILY_CONST_PREFIX "minicpm_sala.slopes"      // (nh) f32 ALiBi slopes, every lightning layer
#define KV_INDEX TPR_FAMILY_CONST_PREFIX "minicpm_sala.kv_index"  // (tp, nh/tp) i32 lightning kv head per q head
#define GROUP_Q TPR_FAMILY_CONST_PREFIX "minicpm_sala.group_q"    // (tp, G) i32 the group's heads in gathered q
#define OWN_Q TPR_FAMILY_CONST_PREFIX "minicpm_sala.own_q"        // (tp, q_per_rank) i32 own heads in the group
#define STATE0 TPR_FAMILY_CONST_PREFIX "minicpm_sala.state0"      // (nh/tp, D, D) zeros: training's lightning start

typedef struct sala {
  tpr_fstep c;
  int control;
  bool dense;                // the sparse layers run dense
  tpr_value_id state_slot;   // (T) i32 each row's state slot (-1 padded)
  tpr_value_id slopes;       // (nh/tp) the rank's slopes
  tpr_value_id kv_index;     // (nh/tp) i32 the rank's kv head per q head; -1 when the identity
  tpr_value_id group_q;      // (G) i32; -1 when the rank holds whole groups
  tpr_value_id own_q;        // (q_per_rank) i32
  tpr_value_id prefill_len;  // (T) i32 each row's prompt length (tpr_step.prefill_lens); -1 without sparse layers
  const tpr_sala_train_opts *train;  // the training program's options; NULL: the step program
  tpr_value_id state0;       // (nh/tp, D, D) zeros (declared by both programs: the session binds every constant)
} sala;

// Training: x, replicated over the tp group, enters rank-local compute here,
// so its cotangent must be summed over the group (Megatron's f,
// runtime/program/autodiff.h). The step program carries no marks.
static tpr_status mark_tp(sala *b, int kind, tpr_value_id *x) {
  if (!b->train || (b->train->skip_grad_marks & kind) || b->c.plan->tp == 1) return TPR_OK;
  return tpr_pb_grad_all_reduce(b->c.p, *x, TPR_AXIS_TP, b->c.plan->tp, x);
}

// Whether the lightning layers' k/v need a head map: repeated (nkv < nh) or
// held whole (nkv % tp != 0).
static bool needs_kv_index(const tpr_shard_plan *p) {
  const tpr_model_config *c = &p->config;
  return c->num_linear_layers && (c->linear_kv_heads != c->num_heads || c->linear_kv_heads % p->tp);
}
// Whether a sparse layer's query groups are split over ranks (KV replicated).
static bool split_groups(const tpr_shard_plan *p) {
  return p->config.num_layers > p->config.num_linear_layers && p->attn.strategy == TPR_KV_REPLICATE;
}

// Row rank_tp of a (tp, n) table -> (n).
static tpr_status rank_row(sala *b, tpr_value_id t, int64_t n, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  TPR_CHECK(tpr_pb_reshape(c->p, t, 2, (const int64_t[]){c->plan->tp, n}, &t));
  TPR_CHECK(tpr_pb_index_select(c->p, t, 0, c->rank_tp, &t));  // (1, n)
  return tpr_pb_reshape(c->p, t, 1, (const int64_t[]){n}, out);
}

static tpr_status weight_in(sala *b, const char *pattern, tpr_attn_layers set, int64_t L, tpr_fweight *w) {
  int k = -1;
  TPR_CHECK(tpr_fstep_kind_in(&b->c, pattern, set, &k));
  return tpr_fstep_weight_of(&b->c, k, L, w);
}
static tpr_status param_in(sala *b, const char *pattern, tpr_attn_layers set, int64_t L, tpr_value_id *v) {
  int k = -1;
  TPR_CHECK(tpr_fstep_kind_in(&b->c, pattern, set, &k));
  return tpr_fstep_param_of(&b->c, k, L, v);
}

// h (T, H) normed -> (T, H) the lightning layer's output, replicated over tp.
static tpr_status lightning(sala *b, int64_t L, tpr_value_id h, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  const tpr_attn_layers LIN = TPR_ATTN_LAYERS_LINEAR;
  int64_t T = c->T, D = cfg->head_dim, nh = cfg->num_heads, nr = nh / c->plan->tp;
  const bool kv_whole = cfg->linear_kv_heads % c->plan->tp != 0;  // every rank computes all kv heads
  int64_t kr = kv_whole ? cfg->linear_kv_heads : cfg->linear_kv_heads / c->plan->tp;
  tpr_fweight wq, wk, wv, wo, wz;
  tpr_value_id q, k, v, o, w, ss, g, pool, hc = h;
  char name[160];
  TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.q_proj.weight", LIN, L, &wq));  // (nr*D, H)
  TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.k_proj.weight", LIN, L, &wk));  // (kr*D, H)
  TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.v_proj.weight", LIN, L, &wv));
  TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.o_proj.weight", LIN, L, &wo));  // (H, nr*D)
  // Training: h enters the column-parallel q (and z, and k/v when split);
  // k/v held whole are the same on every rank and are marked after RoPE
  // instead (their cotangent, from this rank's heads only, summed there), so
  // they read the unmarked h, and so does their replicated k_norm.
  TPR_CHECK(mark_tp(b, TPR_SALA_MARKS_COLUMN, &hc));
  TPR_CHECK(tpr_fstep_linear(c->p, hc, &wq, &q));
  TPR_CHECK(tpr_fstep_linear(c->p, kv_whole ? h : hc, &wk, &k));
  TPR_CHECK(tpr_fstep_linear(c->p, kv_whole ? h : hc, &wv, &v));
  TPR_CHECK(tpr_pb_reshape(c->p, q, 3, (const int64_t[]){T, nr, D}, &q));
  TPR_CHECK(tpr_pb_reshape(c->p, k, 3, (const int64_t[]){T, kr, D}, &k));
  TPR_CHECK(tpr_pb_reshape(c->p, v, 3, (const int64_t[]){T, kr, D}, &v));
  if (cfg->linear_qk_norm) {  // per head over D, before RoPE (the published order)
    // Training: the (D) weights are replicated and see this rank's heads only.
    TPR_CHECK(param_in(b, "model.layers.{L}.self_attn.q_norm.weight", LIN, L, &w));  // (D)
    TPR_CHECK(mark_tp(b, TPR_SALA_MARKS_NORM, &w));
    TPR_CHECK(tpr_pb_rms_norm(c->p, q, w, (float)cfg->rms_norm_eps, &q));
    TPR_CHECK(param_in(b, "model.layers.{L}.self_attn.k_norm.weight", LIN, L, &w));
    if (!kv_whole) TPR_CHECK(mark_tp(b, TPR_SALA_MARKS_NORM, &w));
    TPR_CHECK(tpr_pb_rms_norm(c->p, k, w, (float)cfg->rms_norm_eps, &k));
  }
  if (cfg->linear_rope) {
    TPR_CHECK(tpr_fstep_rope(c, q, &q));
    TPR_CHECK(tpr_fstep_rope(c, k, &k));
  }
  if (kv_whole) {
    TPR_CHECK(mark_tp(b, TPR_SALA_MARKS_COLUMN, &k));
    TPR_CHECK(mark_tp(b, TPR_SALA_MARKS_COLUMN, &v));
  }
  if (b->kv_index >= 0) {  // (T, kr, D) -> (T, nr, D): each q head's kv head (norm and RoPE are per head)
    TPR_CHECK(tpr_pb_index_select(c->p, k, 1, b->kv_index, &k));
    TPR_CHECK(tpr_pb_index_select(c->p, v, 1, b->kv_index, &v));
  }
  TPR_CHECK(tpr_pb_scale(c->p, q, (float)(1.0 / sqrt((double)D)), &q));  // lightning_scale 1/sqrt(d)
  if (b->train) {  // one whole sequence from the zero state
    tpr_value_id st;
    TPR_CHECK(tpr_pb_lightning_attention(c->p, q, k, v, b->state0, b->slopes, cfg->linear_block_size, &o, &st));
    TPR_CHECK(tpr_pb_scale(c->p, o, 1.0f, &o));  // a contiguous copy of the packed output's view
  } else {  // the step's sequences, each from its state slot, written back in place
    tpr_family_state_name(L, name, sizeof name);
    const tpr_step_shape *sh = &c->o->shape;
    TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 4, (const int64_t[]){sh->state_slots, nr, D, D}, &pool));
    TPR_CHECK(tpr_pb_lightning_paged(c->p, q, k, v, pool, b->slopes, b->state_slot, c->positions,
                                     cfg->linear_block_size, &o));  // (T, nr, D)
  }
  TPR_CHECK(tpr_pb_reshape(c->p, o, 2, (const int64_t[]){T, nr * D}, &o));
  if (cfg->linear_out_norm) {
    // One RMSNorm over every head's output: the sum of squares all-reduced
    // over tp, divided by nh*D (the control: this rank's heads alone).
    int64_t divisor = nh * D;
    TPR_CHECK(tpr_pb_sum_squares(c->p, o, &ss));  // (T, 1)
    if (b->control == TPR_SALA_CONTROL_LOCAL_NORM)
      divisor = nr * D;
    else
      TPR_CHECK(tpr_pb_all_reduce(c->p, ss, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, &ss));
    // Training: the all-reduced sum and the whole weight feed this rank's
    // slice only, so their cotangents are summed over tp (as minimax's norm).
    TPR_CHECK(mark_tp(b, TPR_SALA_MARKS_NORM, &ss));
    TPR_CHECK(param_in(b, "model.layers.{L}.self_attn.o_norm.weight", LIN, L, &w));  // (nh*D) whole
    TPR_CHECK(mark_tp(b, TPR_SALA_MARKS_NORM, &w));
    TPR_CHECK(tpr_pb_reshape(c->p, w, 2, (const int64_t[]){c->plan->tp, nr * D}, &w));
    TPR_CHECK(tpr_pb_index_select(c->p, w, 0, c->rank_tp, &w));
    TPR_CHECK(tpr_pb_reshape(c->p, w, 1, (const int64_t[]){nr * D}, &w));
    TPR_CHECK(tpr_pb_rms_scale(c->p, o, ss, w, (float)divisor, (float)cfg->rms_norm_eps, &o));
  }
  if (cfg->linear_out_gate) {  // reads the layer's input h, column-parallel with the heads
    TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.z_proj.weight", LIN, L, &wz));  // (nr*D, H)
    TPR_CHECK(tpr_fstep_linear(c->p, hc, &wz, &g));
    TPR_CHECK(tpr_pb_sigmoid(c->p, g, &g));
    TPR_CHECK(tpr_pb_mul(c->p, g, o, &o));
  }
  TPR_CHECK(tpr_fstep_linear(c->p, o, &wo, &o));  // (T, H) partial over tp
  return tpr_pb_all_reduce(c->p, o, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, out);
}

bool tpr_minicpm_sala_ck_pool(const tpr_model_config *cfg, int64_t max_seq, bool dense_sparse_layers) {
  return cfg->family == TPR_FAMILY_MINICPM_SALA && !dense_sparse_layers && cfg->sparse_dense_len <= max_seq;
}

// q (T, G', D) -> (T, G', D): the sparse layer's attention over its pools:
// sparse with the compressed-key pool ckp (or without: ckp < 0), each row
// deciding by its prompt's length where the program reads "prefill_len", or
// plain causal attention.
static tpr_status attend(sala *b, bool sparse_op, tpr_value_id q, tpr_value_id kp, tpr_value_id vp,
                         tpr_value_id ckp, const tpr_sparse_attn *sa, tpr_value_id *att) {
  tpr_fstep *c = &b->c;
  if (sparse_op)
    return tpr_pb_sparse_attention_paged(c->p, q, kp, vp, ckp, c->blocks, c->seq, c->positions, b->prefill_len, sa,
                                         att);
  return tpr_pb_paged_attention(c->p, q, kp, vp, c->blocks, c->seq, c->positions, sa->scale, att);
}

// h (T, H) normed -> (T, H) the sparse layer's output, replicated over tp.
static tpr_status sparse(sala *b, int64_t L, tpr_value_id h, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  const tpr_attn_plan *a = &c->plan->attn;
  const tpr_attn_layers SM = TPR_ATTN_LAYERS_SOFTMAX;
  const tpr_step_shape *st = &c->o->shape;
  int64_t T = c->T, D = cfg->head_dim, qr = a->q_per_rank, kr = a->kv_per_rank;
  tpr_fweight wq, wk, wv, wo, wg;
  tpr_value_id q, k, v, kp, vp, done, att, g, hc = h;
  char name[160];
  TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.q_proj.weight", SM, L, &wq));  // (qr*D, H)
  TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.k_proj.weight", SM, L, &wk));  // (kr*D, H)
  TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.v_proj.weight", SM, L, &wv));
  TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.o_proj.weight", SM, L, &wo));  // (H, qr*D)
  // Training: h enters the column-parallel q/k/v and gate. Replicated KV
  // heads' copies see only their rank's heads; the trainer's fold sums them.
  TPR_CHECK(mark_tp(b, TPR_SALA_MARKS_COLUMN, &hc));
  TPR_CHECK(tpr_fstep_linear(c->p, hc, &wq, &q));
  TPR_CHECK(tpr_fstep_linear(c->p, hc, &wk, &k));
  TPR_CHECK(tpr_fstep_linear(c->p, hc, &wv, &v));
  TPR_CHECK(tpr_pb_reshape(c->p, q, 3, (const int64_t[]){T, qr, D}, &q));
  TPR_CHECK(tpr_pb_reshape(c->p, k, 3, (const int64_t[]){T, kr, D}, &k));
  TPR_CHECK(tpr_pb_reshape(c->p, v, 3, (const int64_t[]){T, kr, D}, &v));
  if (b->control == TPR_SALA_CONTROL_SPARSE_ROPE) {  // the control: these layers have no position encoding
    TPR_CHECK(tpr_fstep_rope(c, q, &q));
    TPR_CHECK(tpr_fstep_rope(c, k, &k));
  }
  tpr_value_id ckp = -1;
  bool sparse_op = true;  // training: sparse_attention (dense below dense_len, as the published forward)
  if (!b->train) {        // the paged KV pools (training attends this run's k and v)
    const int64_t pshape[4] = {st->pool_blocks, st->block_size, kr, D};
    tpr_family_pool_name(L, "k", name, sizeof name);
    TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 4, pshape, &kp));
    tpr_family_pool_name(L, "v", name, sizeof name);
    TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 4, pshape, &vp));
    TPR_CHECK(tpr_pb_paged_cache_write(c->p, kp, k, c->slots, &done));  // before the attention that reads them
    TPR_CHECK(tpr_pb_paged_cache_write(c->p, vp, v, c->slots, &done));
    // Sparse only when a sequence may reach dense_len: its compressed keys in
    // the "ck" pool. Else plain causal attention (the op's dense result up to
    // rounding) on paged_attention's faster kernel.
    sparse_op = tpr_minicpm_sala_ck_pool(cfg, st->max_blocks * st->block_size, b->dense);
    if (sparse_op && b->control != TPR_SALA_CONTROL_RECOMPUTE_CK) {
      tpr_family_pool_name(L, "ck", name, sizeof name);
      const int64_t cshape[4] = {st->pool_blocks, tpr_sparse_ck_rows(st->block_size, cfg->sparse_kernel_stride), kr,
                                 D};
      TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 4, cshape, &ckp));
    }
  }
  tpr_sparse_attn sa = {.kernel_size = cfg->sparse_kernel_size,
                        .kernel_stride = cfg->sparse_kernel_stride,
                        .block_size = cfg->sparse_block_size,
                        .topk = cfg->sparse_topk,
                        .init_blocks = cfg->sparse_init_blocks,
                        .window_size = cfg->sparse_window_size,
                        .dense_len = b->dense ? INT64_MAX : cfg->sparse_dense_len,  // training: every block
                        .scale = (float)(1.0 / sqrt((double)D))};
  if (b->group_q >= 0) {
    // The group's q heads live on several ranks: gather every rank's heads
    // (nq', T, D), attend with the G real heads of this rank's KV group (its
    // one KV head), keep this rank's own heads.
    tpr_value_id qa;
    TPR_CHECK(tpr_pb_permute(c->p, q, (const int[]){1, 0, 2}, &qa));  // (qr, T, D) view
    TPR_CHECK(tpr_pb_scale(c->p, qa, 1.0f, &qa));                     // contiguous for the gather
    TPR_CHECK(tpr_pb_all_gather(c->p, qa, TPR_AXIS_TP, c->plan->tp, &qa));  // (nq', T, D)
    TPR_CHECK(tpr_pb_index_select(c->p, qa, 0, b->group_q, &qa));            // (G, T, D)
    TPR_CHECK(tpr_pb_permute(c->p, qa, (const int[]){1, 0, 2}, &qa));
    TPR_CHECK(tpr_pb_scale(c->p, qa, 1.0f, &qa));  // (T, G, D)
    // Training: the selection has no gradient, so head h's dq comes from its
    // own dout alone: this rank's cotangent of the gathered q is nonzero only
    // in its own block, which is what all_gather's backward keeps.
    if (b->train)
      TPR_CHECK(tpr_pb_sparse_attention(c->p, qa, k, v, &sa, &att));
    else
      TPR_CHECK(attend(b, sparse_op, qa, kp, vp, ckp, &sa, &att));
    TPR_CHECK(tpr_pb_index_select(c->p, att, 1, b->own_q, &att));  // (T, qr, D)
  } else if (b->train) {
    TPR_CHECK(tpr_pb_sparse_attention(c->p, q, k, v, &sa, &att));  // one whole sequence (T, qr, D)
  } else {
    TPR_CHECK(attend(b, sparse_op, q, kp, vp, ckp, &sa, &att));
  }
  TPR_CHECK(tpr_pb_reshape(c->p, att, 2, (const int64_t[]){T, qr * D}, &att));
  if (cfg->attn_out_gate) {
    TPR_CHECK(weight_in(b, "model.layers.{L}.self_attn.o_gate.weight", SM, L, &wg));  // (qr*D, H)
    TPR_CHECK(tpr_fstep_linear(c->p, hc, &wg, &g));
    TPR_CHECK(tpr_pb_sigmoid(c->p, g, &g));
    TPR_CHECK(tpr_pb_mul(c->p, g, att, &att));
  }
  TPR_CHECK(tpr_fstep_linear(c->p, att, &wo, &att));  // (T, H) partial over tp
  return tpr_pb_all_reduce(c->p, att, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, out);
}

// h (T, H) normed -> the dense SwiGLU MLP (T, H), replicated.
static tpr_status mlp(sala *b, int64_t L, tpr_value_id h, tpr_value_id *y) {
  tpr_fstep *c = &b->c;
  tpr_fweight wg, wu, wd;
  tpr_value_id g, u;
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.gate_proj.weight", L, &wg));  // (F/tp, H)
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.up_proj.weight", L, &wu));
  TPR_CHECK(tpr_fstep_weight(c, "model.layers.{L}.mlp.down_proj.weight", L, &wd));  // (H, F/tp)
  TPR_CHECK(mark_tp(b, TPR_SALA_MARKS_COLUMN, &h));  // training: the column-parallel gate and up's input
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wg, &g));
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wu, &u));
  TPR_CHECK(tpr_pb_swiglu(c->p, g, u, &g));
  TPR_CHECK(tpr_fstep_linear(c->p, g, &wd, y));
  return tpr_pb_all_reduce(c->p, *y, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, y);
}

// x + s * y
static tpr_status residual(sala *b, tpr_value_id x, tpr_value_id y, double s, tpr_value_id *out) {
  TPR_CHECK(tpr_pb_scale(b->c.p, y, (float)s, &y));
  return tpr_pb_add(b->c.p, x, y, out);
}

static tpr_status layer(sala *b, int64_t L, tpr_value_id x, tpr_value_id *out) {
  tpr_fstep *c = &b->c;
  const tpr_model_config *cfg = &c->plan->config;
  double rs = b->control == TPR_SALA_CONTROL_NO_MUP ? 1.0 : cfg->residual_scale;
  tpr_value_id ln, h, a;
  c->group = (int)(1 + 2 * L);  // FSDP: the mixer's params, its input norm's included
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.input_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));  // (T, H)
  TPR_CHECK(tpr_model_config_layer_is_linear(cfg, L) ? lightning(b, L, h, &a) : sparse(b, L, h, &a));
  TPR_CHECK(residual(b, x, a, rs, &x));
  c->group = (int)(2 + 2 * L);  // FSDP: the MLP's params
  TPR_CHECK(tpr_fstep_param(c, "model.layers.{L}.post_attention_layernorm.weight", L, &ln));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));
  TPR_CHECK(mlp(b, L, h, &a));
  return residual(b, x, a, rs, out);
}

static tpr_status check_supported(const tpr_shard_plan *plan, const tpr_step_build_opts *o) {
  const tpr_model_config *cfg = &plan->config;
  if (cfg->family != TPR_FAMILY_MINICPM_SALA)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "minicpm_sala: the checkpoint is %s", tpr_model_family_name(cfg->family));
  if (cfg->num_experts || cfg->qk_norm != TPR_QK_NORM_NONE || cfg->qkv_bias || cfg->mrope_layout ||
      cfg->rotary_dim != cfg->head_dim || !cfg->linear_alibi_slopes || !(cfg->logit_divisor > 0))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "minicpm_sala: the config is not the family's (dense MLP, no biases, whole-"
                    "head RoPE, ALiBi lightning slopes, muP)");
  if (cfg->num_linear_layers && (cfg->num_heads % plan->tp || cfg->linear_block_size < 1))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "minicpm_sala: %lld lightning heads over tp=%d", (long long)cfg->num_heads,
                    plan->tp);
  if ((unsigned)o->family_control >= TPR_SALA_CONTROL_COUNT)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "minicpm_sala: unknown control %d", o->family_control);
  if (o->moe_stats) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "minicpm_sala: no MoE layers to count routing statistics of");
  return TPR_OK;
}

static tpr_status build(sala *b) {
  tpr_fstep *c = &b->c;
  const tpr_shard_plan *plan = c->plan;
  const tpr_model_config *cfg = &plan->config;
  int64_t nh = cfg->num_heads, nr = nh / plan->tp, G = plan->attn.nq / plan->attn.nkv;
  const int64_t D = cfg->head_dim;
  tpr_value_id embed, x, t;
  if (b->train) {
    if (b->train->tokens < 1)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "minicpm_sala: %lld tokens per training run", (long long)b->train->tokens);
    TPR_CHECK(tpr_fstep_begin_tokens(c, b->train->tokens));
  } else {
    TPR_CHECK(tpr_fstep_begin(c));
  }
  b->kv_index = b->group_q = b->own_q = b->prefill_len = -1;
  // The step program's sparse layers decide dense or sparse per row (program.h); a training run is one call.
  const tpr_step_shape *sh = &c->o->shape;
  if (!b->train && cfg->num_layers > cfg->num_linear_layers &&
      tpr_minicpm_sala_ck_pool(cfg, sh->max_blocks * sh->block_size, b->dense))
    TPR_CHECK(tpr_program_input(c->p, "prefill_len", TPR_I32, 1, (const int64_t[]){c->T}, &b->prefill_len));
  if (cfg->num_linear_layers) {
    if (!b->train && c->o->shape.state_slots < 1)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "minicpm_sala: a step program of lightning layers needs state slots "
                      "(got %lld)", (long long)c->o->shape.state_slots);
    if (!b->train)
      TPR_CHECK(tpr_program_input(c->p, "state_slot", TPR_I32, 1, (const int64_t[]){c->T}, &b->state_slot));
    TPR_CHECK(tpr_program_param(c->p, STATE0, TPR_F32, 3, (const int64_t[]){nr, D, D}, &b->state0));
    TPR_CHECK(tpr_program_param(c->p, SLOPES, TPR_F32, 1, (const int64_t[]){nh}, &t));  // (nh) whole
    TPR_CHECK(tpr_pb_reshape(c->p, t, 2, (const int64_t[]){plan->tp, nr}, &t));
    TPR_CHECK(tpr_pb_index_select(c->p, t, 0, c->rank_tp, &t));
    TPR_CHECK(tpr_pb_reshape(c->p, t, 1, (const int64_t[]){nr}, &b->slopes));  // (nr) the rank's heads
  }
  if (needs_kv_index(plan)) {
    TPR_CHECK(tpr_program_param(c->p, KV_INDEX, TPR_I32, 2, (const int64_t[]){plan->tp, nr}, &t));
    TPR_CHECK(rank_row(b, t, nr, &b->kv_index));
  }
  if (split_groups(plan)) {
    TPR_CHECK(tpr_program_param(c->p, GROUP_Q, TPR_I32, 2, (const int64_t[]){plan->tp, G}, &t));
    TPR_CHECK(rank_row(b, t, G, &b->group_q));
    TPR_CHECK(tpr_program_param(c->p, OWN_Q, TPR_I32, 2, (const int64_t[]){plan->tp, plan->attn.q_per_rank}, &t));
    TPR_CHECK(rank_row(b, t, plan->attn.q_per_rank, &b->own_q));
    // The control declares the tables (the session binds every constant) but
    // scores each rank's blocks with its own heads.
    if (b->control == TPR_SALA_CONTROL_LOCAL_GROUP) b->group_q = b->own_q = -1;
  }
  c->group = 0;  // FSDP prefetch groups: one per layer part (layer moves them on)
  TPR_CHECK(tpr_fstep_embed(c, &embed, &x));  // (T, H)
  TPR_CHECK(tpr_pb_scale(c->p, x, (float)cfg->embed_scale, &x));  // muP: scale_emb
  int64_t n = tpr_step_layers(&c->o->shape, cfg->num_layers);
  for (int64_t L = 0; L < n; L++) TPR_CHECK(layer(b, L, x, &x));
  c->group = (int)(1 + 2 * cfg->num_layers);
  // The head reads norm(x) / (hidden_size / dim_model_base).
  tpr_value_id fn, head;
  TPR_CHECK(tpr_fstep_param(c, "model.norm.weight", 0, &fn));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, fn, (float)cfg->rms_norm_eps, &x));
  TPR_CHECK(tpr_pb_scale(c->p, x, (float)(1.0 / cfg->logit_divisor), &x));
  head = embed;
  if (!cfg->tie_word_embeddings) TPR_CHECK(tpr_fstep_param(c, "lm_head.weight", 0, &head));
  if (!b->train) return tpr_fstep_logits(c, x, head);
  // The cross-entropy alone (no experts, so no load-balancing loss).
  const tpr_train_loss_opts lo = {.tokens = c->T,
                                  .aux_coef = 0,
                                  .skip_head_mark = (b->train->skip_grad_marks & TPR_SALA_MARKS_COLUMN) != 0,
                                  .family = c->family->name};
  return tpr_train_build_loss(c->p, c->plan, &lo, c->rank, c->rank_tp, x, head, NULL, 0);
}

// A new program built by build(b) into *out (freed on failure).
static tpr_status new_program(sala *b, tpr_program **out) {
  tpr_status rc = tpr_program_new(&b->c.p);
  if (rc == TPR_OK) rc = build(b);
  if (rc != TPR_OK) {
    tpr_program_free(b->c.p);
    return rc;
  }
  *out = b->c.p;
  return TPR_OK;
}

tpr_status tpr_minicpm_sala_build(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out) {
  *out = NULL;
  TPR_CHECK(check_supported(plan, o));
  sala b = {.c = {.plan = plan, .o = o, .family = &tpr_family_minicpm_sala},
            .control = o->family_control,
            .dense = o->dense_sparse_layers};
  if (o->per_rank_qk_norm && !b.control) b.control = TPR_SALA_CONTROL_LOCAL_NORM;
  return new_program(&b, out);
}

static tpr_status build_step(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out) {
  return tpr_minicpm_sala_build(plan, o, out);
}

tpr_status tpr_minicpm_sala_build_training(const tpr_shard_plan *plan, const tpr_sala_train_opts *o,
                                           tpr_program **out) {
  *out = NULL;
  const tpr_step_build_opts so = {.family_control = o->family_control};  // its MoE options: none
  TPR_CHECK(check_supported(plan, &so));
  sala b = {.c = {.plan = plan, .o = &so, .family = &tpr_family_minicpm_sala, .training = true, .fsdp = &o->fsdp},
            .control = o->family_control,
            .dense = o->dense,
            .train = o};
  return new_program(&b, out);
}

// The slopes (ALiBi's, the same in every lightning layer), and the head
// tables rank_row selects from: the lightning kv head of each of a rank's q
// heads (an index into the kv heads it holds), and, when a sparse layer's
// query group spans ranks, the group's real heads in the all-gathered q and
// the rank's own heads among them.
static tpr_status constants(const tpr_shard_plan *plan, tpr_backend *be, tpr_family_consts *out) {
  const tpr_model_config *cfg = &plan->config;
  const tpr_attn_plan *a = &plan->attn;
  int tp = plan->tp;
  int64_t nh = cfg->num_heads, nr = nh / tp, nkv = cfg->linear_kv_heads, G = a->nq / a->nkv, qr = a->q_per_rank;
  int64_t pg = a->nq_padded / a->nkv;  // padded heads per group (REPLICATE layout)
  *out = (tpr_family_consts){0};
  out->names = calloc(5, sizeof *out->names);
  out->t = calloc(5, sizeof *out->t);
  size_t cap = (size_t)(nh + tp * (nr + G + qr) + 4);
  float *sl = malloc((size_t)nh * sizeof *sl);
  int32_t *ix = malloc(cap * sizeof *ix);
  tpr_status rc = sl && ix && out->names && out->t ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "minicpm_sala: constants");
  if (rc == TPR_OK && cfg->num_linear_layers) {
    tpr_alibi_slopes(nh, sl);
    rc = tpr_family_consts_add(out, be, SLOPES, TPR_F32, 1, (const int64_t[]){nh}, sl);
    if (rc == TPR_OK)  // zeros
      rc = tpr_family_consts_add(out, be, STATE0, TPR_F32, 3, (const int64_t[]){nr, cfg->head_dim, cfg->head_dim},
                                 NULL);
  }
  if (rc == TPR_OK && needs_kv_index(plan)) {
    bool whole = nkv % tp != 0;  // the rank holds every kv head, else its block of nkv/tp
    for (int r = 0; r < tp; r++)
      for (int64_t i = 0; i < nr; i++) {
        int64_t kv = (r * nr + i) / (nh / nkv);  // the model's kv head of q head r*nr+i
        ix[r * nr + i] = (int32_t)(whole ? kv : kv - r * (nkv / tp));
      }
    rc = tpr_family_consts_add(out, be, KV_INDEX, TPR_I32, 2, (const int64_t[]){tp, nr}, ix);
  }
  if (rc == TPR_OK && split_groups(plan)) {
    int64_t copies = tp / a->nkv;
    for (int r = 0; r < tp; r++)
      for (int64_t j = 0; j < G; j++) ix[r * G + j] = (int32_t)((r / copies) * pg + j);
    rc = tpr_family_consts_add(out, be, GROUP_Q, TPR_I32, 2, (const int64_t[]){tp, G}, ix);
    for (int r = 0; rc == TPR_OK && r < tp; r++)
      for (int64_t i = 0; i < qr; i++) {
        int64_t j = r * qr + i, pos = j % pg;  // padded head j, its place in its group
        ix[r * qr + i] = (int32_t)(a->q_head_map[j] >= 0 && pos < G ? pos : 0);  // padding reads any: o_proj's zeros
      }
    if (rc == TPR_OK)
      rc = tpr_family_consts_add(out, be, OWN_Q, TPR_I32, 2, (const int64_t[]){tp, qr}, ix);
  }
  free(sl), free(ix);
  if (rc != TPR_OK) tpr_family_consts_free(out);
  return rc;
}

// The expert names match no plan tensor of this dense family.
const tpr_family tpr_family_minicpm_sala = {
    .name = "minicpm_sala",
    .family = TPR_FAMILY_MINICPM_SALA,
    .build_step = build_step,
    .expert_gate = "experts.{E}.gate_proj.weight",
    .expert_up = "experts.{E}.up_proj.weight",
    .expert_down = "experts.{E}.down_proj.weight",
    .constants = constants,
    .state_shape = tpr_family_lightning_state_shape,
};
