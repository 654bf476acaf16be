#include "minimax_m2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "minimax_m2_impl.h"
#include "models/family_step.h"
#include "runtime/program/autodiff.h"
#include "shard/fsdp.h"
#include "shard/mesh.h"

// What every layer builder needs: the program, the plan, and the run's inputs.
typedef struct m2_ctx {
  tpr_program *p;
  const tpr_shard_plan *plan;
  const tpr_m2_build_opts *o;
  tpr_value_id rank;       // the rank tensor param
  tpr_value_id rank_tp;    // (1) i32: this rank's tp coordinate, from the rank tensor
  tpr_value_id positions;  // (T) i32
  tpr_value_id start;      // (1) i32, training: the first position (0)
  tpr_value_id attn_lo;    // (T) i32, packed training: each token's document start
  tpr_value_id slots;      // (T) i32, inference: each token's pool row (-1 padded)
  tpr_value_id seq;        // (T) i32, inference: each token's block-table row (-1 padded)
  tpr_value_id blocks;     // (B, MB) i32, inference: the block tables
  int64_t T;
  tpr_value_id *router_logits;  // (layers) training: each layer's (T, E) router logits, for the aux loss
  int group;                    // FSDP: the prefetch group of the params declared now (one per layer part)
} m2_ctx;

// Declares a param with the rank's shape. Under FSDP (training) a trained
// param is this rank's flat chunk (shard/fsdp.h), gathered here -- just
// before the layer that declares it runs -- into the rank's shape
// (tpr_fstep_gather_param). Inference params have the dtype the session
// holds them in (dt).
static tpr_status declare(m2_ctx *c, const char *name, tpr_dtype dt, int ndim, const int64_t *shape, bool expert,
                          bool trained, tpr_value_id *out) {
  const tpr_fsdp_opts *f = &c->o->fsdp;
  if (!c->o->training) return tpr_program_param(c->p, name, dt, ndim, shape, out);
  if (!f->on || !trained) return tpr_program_param(c->p, name, TPR_F32, ndim, shape, out);
  return tpr_fstep_gather_param(c->p, c->plan, &c->o->moe, f, c->group, name, ndim, shape, expert, out);
}

// Declares the param of plan tensor `pattern` for `layer` with the plan's
// per-rank shape.
static tpr_dtype kind_dtype(const m2_ctx *c, int kind) { return c->o->kind_dtype ? c->o->kind_dtype[kind] : TPR_F32; }
static int kind_block(const m2_ctx *c, int kind) { return c->o->kind_block ? c->o->kind_block[kind] : 0; }

static tpr_status find_kind(const m2_ctx *c, const char *pattern, int *kind) {
  for (int i = 0; i < c->plan->n_tensors; i++)
    if (strcmp(c->plan->tensors[i].name, pattern) == 0) return *kind = i, TPR_OK;
  return TPR_FAIL(TPR_ERR_INTERNAL, "minimax_m2: the plan has no tensor %s", pattern);
}

static tpr_status param(m2_ctx *c, const char *pattern, int64_t layer, tpr_value_id *out) {
  int i = -1;
  TPR_CHECK(find_kind(c, pattern, &i));
  const tpr_shard_tensor *t = &c->plan->tensors[i];
  char name[160];
  tpr_family_param_name(pattern, layer, name, sizeof name);
  // The routing bias only selects experts: never trained, never sharded.
  return declare(c, name, kind_dtype(c, i), t->ndim, t->rank_shape, false, !strstr(pattern, "e_score_correction_bias"),
                 out);
}

// A weight matrix the program multiplies by (linear): its param, and its
// scales when the session holds it FP8.
static tpr_status weight(m2_ctx *c, const char *pattern, int64_t layer, tpr_fweight *out) {
  int i = -1;
  TPR_CHECK(find_kind(c, pattern, &i));
  *out = (tpr_fweight){.block = kind_block(c, i)};
  TPR_CHECK(param(c, pattern, layer, &out->w));
  if (out->block <= 0) return TPR_OK;
  char name[160];
  tpr_family_param_name(pattern, layer, name, sizeof name);
  return tpr_fstep_scales(c->p, name, 2, c->plan->tensors[i].rank_shape, out->block, &out->scale);
}

static tpr_status all_reduce(m2_ctx *c, tpr_mesh_axis axis, int n, tpr_value_id x, tpr_value_id *out) {
  return tpr_pb_all_reduce(c->p, x, axis, n, 0 /* sum */, out);
}

// Training: x, replicated over the tp group, enters rank-local compute here,
// so its cotangent must be summed over the group (Megatron's f; see
// runtime/program/autodiff.h). Inference programs carry no marks.
static tpr_status mark_tp(m2_ctx *c, int kind, tpr_value_id *x) {
  if (!c->o->training || (c->o->skip_grad_marks & kind) || c->plan->tp == 1) return TPR_OK;
  return tpr_pb_grad_all_reduce(c->p, *x, TPR_AXIS_TP, c->plan->tp, x);
}

// q or k (T, heads_r*D) -> full-projection RMS norm with the rank's weight
// slice. The weight param holds all tp slices: (tp * heads_r * D).
static tpr_status qk_norm(m2_ctx *c, tpr_value_id x, tpr_value_id weight, int64_t width, int64_t divisor,
                          tpr_value_id *out) {
  int tp = c->plan->tp;
  float eps = (float)c->plan->config.rms_norm_eps;
  tpr_value_id ss, blocks, mine, w;
  TPR_CHECK(tpr_pb_sum_squares(c->p, x, &ss));  // (T, 1)
  if (c->o->per_rank_qk_norm)
    divisor = width;  // negative control: the local slice alone
  else
    TPR_CHECK(all_reduce(c, TPR_AXIS_TP, tp, ss, &ss));
  // The all-reduced sum and the whole weight feed this rank's slice only.
  TPR_CHECK(mark_tp(c, TPR_M2_MARKS_QK_NORM, &ss));
  TPR_CHECK(mark_tp(c, TPR_M2_MARKS_QK_NORM, &weight));
  TPR_CHECK(tpr_pb_reshape(c->p, weight, 2, (const int64_t[]){tp, width}, &blocks));  // (tp, width)
  TPR_CHECK(tpr_pb_index_select(c->p, blocks, 0, c->rank_tp, &mine));                 // (1, width)
  TPR_CHECK(tpr_pb_reshape(c->p, mine, 1, (const int64_t[]){width}, &w));
  return tpr_pb_rms_scale(c->p, x, ss, w, (float)divisor, eps, out);
}

// x (T, H) -> x + attention(x), one layer.
static tpr_status attention(m2_ctx *c, int64_t L, tpr_value_id x, tpr_value_id *out) {
  const tpr_model_config *cfg = &c->plan->config;
  const tpr_attn_plan *a = &c->plan->attn;
  const tpr_step_shape *st = &c->o->step;
  int64_t T = c->T, D = cfg->head_dim, qr = a->q_per_rank, kr = a->kv_per_rank;
  tpr_value_id ln, qn, kn, kp, vp, h, q, k, v, q3, k3, v3, qr3, kr3, done, att, att2, o;
  tpr_fweight wq, wk, wv, wo;
  TPR_CHECK(param(c, "model.layers.{L}.input_layernorm.weight", L, &ln));
  TPR_CHECK(weight(c, "model.layers.{L}.self_attn.q_proj.weight", L, &wq));  // (qr*D, H)
  TPR_CHECK(weight(c, "model.layers.{L}.self_attn.k_proj.weight", L, &wk));  // (kr*D, H)
  TPR_CHECK(weight(c, "model.layers.{L}.self_attn.v_proj.weight", L, &wv));
  TPR_CHECK(weight(c, "model.layers.{L}.self_attn.o_proj.weight", L, &wo));  // (H, qr*D)
  TPR_CHECK(param(c, "model.layers.{L}.self_attn.q_norm.weight", L, &qn));  // (nq'*D)
  TPR_CHECK(param(c, "model.layers.{L}.self_attn.k_norm.weight", L, &kn));  // (nkv'*D)
  char name[160];
  if (!c->o->training) {  // the paged KV pools (NB, bs, kr, D)
    const int64_t pool[4] = {st->pool_blocks, st->block_size, kr, D};
    tpr_family_pool_name(L, "k", name, sizeof name);
    TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 4, pool, &kp));
    tpr_family_pool_name(L, "v", name, sizeof name);
    TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 4, pool, &vp));
  }

  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));  // (T, H)
  TPR_CHECK(mark_tp(c, TPR_M2_MARKS_COLUMN, &h));  // column-parallel q/k/v
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wq, &q));  // (T, qr*D)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wk, &k));  // (T, kr*D)
  TPR_CHECK(tpr_fstep_linear(c->p, h, &wv, &v));
  TPR_CHECK(qk_norm(c, q, qn, qr * D, a->q_norm_divisor, &q));
  TPR_CHECK(qk_norm(c, k, kn, kr * D, a->k_norm_divisor, &k));
  TPR_CHECK(tpr_pb_reshape(c->p, q, 3, (const int64_t[]){T, qr, D}, &q3));
  TPR_CHECK(tpr_pb_reshape(c->p, k, 3, (const int64_t[]){T, kr, D}, &k3));
  TPR_CHECK(tpr_pb_reshape(c->p, v, 3, (const int64_t[]){T, kr, D}, &v3));
  float theta = (float)cfg->rope_theta;
  TPR_CHECK(tpr_pb_rope(c->p, q3, c->positions, cfg->rotary_dim, theta, &qr3));
  TPR_CHECK(tpr_pb_rope(c->p, k3, c->positions, cfg->rotary_dim, theta, &kr3));
  float scale = (float)(1.0 / sqrt((double)D));
  if (c->o->training) {  // one whole sequence per run: attention reads this run's k and v (start 0)
    if (c->o->pack)  // packed documents: a block-diagonal causal mask
      TPR_CHECK(tpr_pb_attention_docs(c->p, qr3, kr3, v3, c->start, c->attn_lo, scale, &att));  // (T, qr, D)
    else
      TPR_CHECK(tpr_pb_attention(c->p, qr3, kr3, v3, c->start, scale, &att));  // (T, qr, D)
  } else {
    // The writes come first: a token attends its own sequence's rows up to
    // its position, this step's included.
    TPR_CHECK(tpr_pb_paged_cache_write(c->p, kp, kr3, c->slots, &done));
    TPR_CHECK(tpr_pb_paged_cache_write(c->p, vp, v3, c->slots, &done));
    TPR_CHECK(tpr_pb_paged_attention(c->p, qr3, kp, vp, c->blocks, c->seq, c->positions, scale, &att));  // (T, qr, D)
  }
  TPR_CHECK(tpr_pb_reshape(c->p, att, 2, (const int64_t[]){T, qr * D}, &att2));
  TPR_CHECK(tpr_fstep_linear(c->p, att2, &wo, &o));  // (T, H) partial over tp
  TPR_CHECK(all_reduce(c, TPR_AXIS_TP, c->plan->tp, o, &o));
  return tpr_pb_add(c->p, x, o, out);
}

// The dtype of the stacked experts: that of the gate kind (the session holds
// the three expert kinds in one dtype).
static tpr_dtype expert_dtype(const m2_ctx *c) {
  for (int i = 0; i < c->plan->n_tensors; i++)
    if (strstr(c->plan->tensors[i].name, tpr_family_minimax_m2.expert_gate)) return kind_dtype(c, i);
  return TPR_F32;
}

static int expert_block(const m2_ctx *c) {
  for (int i = 0; i < c->plan->n_tensors; i++)
    if (strstr(c->plan->tensors[i].name, tpr_family_minimax_m2.expert_gate)) return kind_block(c, i);
  return 0;
}

// x (T, H) -> x + moe(x), one layer: the router here, the experts and their
// dispatch in models/layers/moe.c.
static tpr_status moe(m2_ctx *c, int64_t L, tpr_value_id x, tpr_value_id *out) {
  const tpr_model_config *cfg = &c->plan->config;
  int64_t H = cfg->hidden_size, Er = c->plan->experts_per_rank, Fr = c->plan->expert_inter_per_rank;
  tpr_value_id ln, bias, w13, w2, h, logits, gates, y;
  tpr_fweight gate;
  tpr_moe_values v;
  TPR_CHECK(param(c, "model.layers.{L}.post_attention_layernorm.weight", L, &ln));
  TPR_CHECK(weight(c, "model.layers.{L}.block_sparse_moe.gate.weight", L, &gate));  // (E, H)
  TPR_CHECK(param(c, "model.layers.{L}.block_sparse_moe.e_score_correction_bias", L, &bias));  // (E)
  char name[160];
  tpr_dtype edt = expert_dtype(c);
  tpr_family_expert_name(L, "w13", name, sizeof name);
  TPR_CHECK(declare(c, name, edt, 3, (const int64_t[]){Er, 2 * Fr, H}, true, true, &w13));
  tpr_family_expert_name(L, "w2", name, sizeof name);
  TPR_CHECK(declare(c, name, edt, 3, (const int64_t[]){Er, H, Fr}, true, true, &w2));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, ln, (float)cfg->rms_norm_eps, &h));
  TPR_CHECK(tpr_fstep_linear(c->p, h, &gate, &logits));  // (T, E) f32
  TPR_CHECK(tpr_pb_router_sigmoid_topk(c->p, logits, bias, (int)cfg->experts_per_tok, &gates));
  if (c->router_logits) c->router_logits[L] = logits;
  if (c->o->training) {  // tokens per expert as routed, for the trainer's routing-bias update
    tpr_value_id load;
    snprintf(name, sizeof name, "moe_load.%lld", (long long)L);
    TPR_CHECK(tpr_pb_moe_counts(c->p, gates, &load));  // (E) i32
    TPR_CHECK(tpr_program_output(c->p, load, name));
  }
  tpr_moe_opts mo = c->o->moe;
  mo.mark_grads = c->o->training && !(c->o->skip_grad_marks & TPR_M2_MARKS_COLUMN);
  if ((mo.fp8_block = expert_block(c)) > 0) {  // FP8 experts: their stacked scales
    tpr_family_expert_name(L, "w13", name, sizeof name);
    TPR_CHECK(tpr_fstep_scales(c->p, name, 3, (const int64_t[]){Er, 2 * Fr, H}, mo.fp8_block, &mo.s13));
    tpr_family_expert_name(L, "w2", name, sizeof name);
    TPR_CHECK(tpr_fstep_scales(c->p, name, 3, (const int64_t[]){Er, H, Fr}, mo.fp8_block, &mo.s2));
  }
  TPR_CHECK(tpr_moe_build(c->p, c->plan, &mo, L, c->rank, h, gates, w13, w2, &y, &v));
  if (c->o->moe_stats) {
    snprintf(name, sizeof name, "moe_gates.%lld", (long long)L);
    TPR_CHECK(tpr_program_output(c->p, v.gates, name));
    snprintf(name, sizeof name, "moe_router.%lld", (long long)L);
    if (v.gates != gates) TPR_CHECK(tpr_program_output(c->p, gates, name));
  }
  return tpr_pb_add(c->p, x, y, out);
}

static tpr_status check_supported(const tpr_shard_plan *plan, const tpr_m2_build_opts *o) {
  const tpr_model_config *cfg = &plan->config;
  if (cfg->family != TPR_FAMILY_MINIMAX_M2)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "minimax_m2: the checkpoint is %s", tpr_model_family_name(cfg->family));
  if (cfg->qk_norm != TPR_QK_NORM_FULL || cfg->router != TPR_ROUTER_SIGMOID || !cfg->routing_bias)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "minimax_m2: needs full-projection QK-norm and a biased sigmoid router");
  if (cfg->num_moe_layers != cfg->num_layers)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "minimax_m2: dense-MLP layers are not built");
  const tpr_step_shape *st = &o->step;
  if (o->tokens < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "minimax_m2: %lld tokens per run", (long long)o->tokens);
  if (!o->training && (st->tokens != o->tokens || st->samples < 1 || st->batch < 1 || st->max_blocks < 1 ||
                       st->pool_blocks < 1 || st->block_size < 1))
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "minimax_m2: bad step shape (T %lld of %lld, N %lld, B %lld, MB %lld, NB %lld, bs %lld)",
                    (long long)st->tokens, (long long)o->tokens, (long long)st->samples, (long long)st->batch,
                    (long long)st->max_blocks, (long long)st->pool_blocks, (long long)st->block_size);
  return tpr_moe_opts_check(&o->moe, plan);
}

static tpr_status build(m2_ctx *c) {
  const tpr_model_config *cfg = &c->plan->config;
  int tp = c->plan->tp;
  int64_t T = c->T;
  tpr_value_id tokens, embed, x, fn, head, logits;
  TPR_CHECK(tpr_program_rank_param(c->p, &c->rank));
  TPR_CHECK(tpr_pb_rank_index(c->p, c->rank, TPR_RANK_TP, &c->rank_tp));
  TPR_CHECK(tpr_program_input(c->p, "tokens", TPR_I32, 1, (const int64_t[]){T}, &tokens));
  TPR_CHECK(tpr_program_input(c->p, "positions", TPR_I32, 1, (const int64_t[]){T}, &c->positions));
  if (c->o->training) {
    TPR_CHECK(tpr_program_input(c->p, "start", TPR_I32, 1, (const int64_t[]){1}, &c->start));
    if (c->o->pack) TPR_CHECK(tpr_program_input(c->p, "attn_lo", TPR_I32, 1, (const int64_t[]){T}, &c->attn_lo));
  } else {
    const tpr_step_shape *st = &c->o->step;
    TPR_CHECK(tpr_program_input(c->p, "slot_mapping", TPR_I32, 1, (const int64_t[]){T}, &c->slots));
    TPR_CHECK(tpr_program_input(c->p, "seq", TPR_I32, 1, (const int64_t[]){T}, &c->seq));
    TPR_CHECK(tpr_program_input(c->p, "block_tables", TPR_I32, 2, (const int64_t[]){st->batch, st->max_blocks},
                                &c->blocks));
  }
  c->group = 0;
  TPR_CHECK(param(c, "model.embed_tokens.weight", 0, &embed));  // (V'/tp, H)
  TPR_CHECK(tpr_pb_embedding_shard(c->p, embed, tokens, c->rank_tp, &x));  // (T, H) partial over tp
  tpr_tensor ev;
  TPR_CHECK(tpr_program_value(c->p, x, &ev));
  if (ev.dtype != TPR_F32) TPR_CHECK(tpr_pb_cast(c->p, x, TPR_F32, &x));  // a bf16 table's rows, widened
  TPR_CHECK(all_reduce(c, TPR_AXIS_TP, tp, x, &x));
  for (int64_t L = 0; L < tpr_step_layers(&c->o->step, cfg->num_layers); L++) {
    c->group = (int)(1 + 2 * L);
    TPR_CHECK(attention(c, L, x, &x));
    c->group = (int)(2 + 2 * L);
    TPR_CHECK(moe(c, L, x, &x));
  }
  c->group = (int)(1 + 2 * cfg->num_layers);
  TPR_CHECK(param(c, "model.norm.weight", 0, &fn));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, fn, (float)cfg->rms_norm_eps, &x));
  if (cfg->tie_word_embeddings)
    head = embed;
  else
    TPR_CHECK(param(c, "lm_head.weight", 0, &head));
  if (c->o->training) return tpr__m2_build_loss(c->p, c->plan, c->o, c->rank, c->rank_tp, x, head, c->router_logits);
  // Logits only where a token is sampled: the lm head (the largest GEMM of a
  // small model) and its all-gather run on N rows, not T.
  tpr_value_id rows, xs;
  TPR_CHECK(tpr_program_input(c->p, "sample_rows", TPR_I32, 1, (const int64_t[]){c->o->step.samples}, &rows));
  TPR_CHECK(tpr_pb_index_select(c->p, x, 0, rows, &xs));                 // (N, H)
  TPR_CHECK(tpr_pb_matmul(c->p, head, xs, false, true, &logits));       // (V'/tp, N)
  TPR_CHECK(tpr_pb_all_gather(c->p, logits, TPR_AXIS_TP, tp, &logits));  // (V', N)
  return tpr_program_output(c->p, logits, "logits_t");
}

tpr_status tpr_m2_build(const tpr_shard_plan *plan, const tpr_m2_build_opts *o, tpr_program **out) {
  *out = NULL;
  TPR_CHECK(check_supported(plan, o));
  m2_ctx c = {.plan = plan, .o = o, .T = o->tokens};
  if (o->training && !(c.router_logits = calloc((size_t)plan->config.num_layers, sizeof *c.router_logits)))
    return TPR_FAIL(TPR_ERR_OOM, "minimax_m2: router logits");
  tpr_status rc = tpr_program_new(&c.p);
  if (rc == TPR_OK) rc = build(&c);
  free(c.router_logits);
  if (rc != TPR_OK) {
    tpr_program_free(c.p);
    return rc;
  }
  *out = c.p;
  return TPR_OK;
}

static tpr_status build_step(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out) {
  tpr_m2_build_opts bo = {.tokens = o->shape.tokens,
                          .step = o->shape,
                          .per_rank_qk_norm = o->per_rank_qk_norm,
                          .moe = o->moe,
                          .moe_stats = o->moe_stats,
                          .kind_dtype = o->kind_dtype,
                          .kind_block = o->kind_block};
  return tpr_m2_build(plan, &bo, out);
}

const tpr_family tpr_family_minimax_m2 = {
    .name = "minimax_m2",
    .family = TPR_FAMILY_MINIMAX_M2,
    .build_step = build_step,
    .expert_gate = ".w1.weight",
    .expert_up = ".w3.weight",
    .expert_down = ".w2.weight",
};
