#include "models/family_step.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/train_loss.h"
#include "runtime/ops/rope/rope.h"
#include "shard/mesh.h"

tpr_status tpr_fstep_begin_tokens(tpr_fstep *c, int64_t T) {
  TPR_CHECK(tpr_moe_opts_check(&c->o->moe, c->plan));
  c->T = T;
  TPR_CHECK(tpr_program_rank_param(c->p, &c->rank));
  TPR_CHECK(tpr_pb_rank_index(c->p, c->rank, TPR_RANK_TP, &c->rank_tp));
  TPR_CHECK(tpr_program_input(c->p, "tokens", TPR_I32, 1, (const int64_t[]){T}, &c->tokens));
  TPR_CHECK(tpr_program_input(c->p, "positions", TPR_I32, 1, (const int64_t[]){T}, &c->positions));
  if (c->plan->config.mrope_layout)
    TPR_CHECK(tpr_program_input(c->p, "positions_3d", TPR_I32, 2, (const int64_t[]){3, T}, &c->positions_3d));
  return TPR_OK;
}

tpr_status tpr_fstep_begin(tpr_fstep *c) {
  const tpr_step_shape *st = &c->o->shape;
  const char *fam = c->family->name;
  if (st->tokens < 1 || st->samples < 1 || st->batch < 1 || st->max_blocks < 1 || st->pool_blocks < 1 ||
      st->block_size < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: bad step shape (T %lld, N %lld, B %lld, MB %lld, NB %lld, bs %lld)", fam,
                    (long long)st->tokens, (long long)st->samples, (long long)st->batch, (long long)st->max_blocks,
                    (long long)st->pool_blocks, (long long)st->block_size);
  TPR_CHECK(tpr_fstep_begin_tokens(c, st->tokens));
  int64_t T = c->T;
  TPR_CHECK(tpr_program_input(c->p, "slot_mapping", TPR_I32, 1, (const int64_t[]){T}, &c->slots));
  TPR_CHECK(tpr_program_input(c->p, "seq", TPR_I32, 1, (const int64_t[]){T}, &c->seq));
  return tpr_program_input(c->p, "block_tables", TPR_I32, 2, (const int64_t[]){st->batch, st->max_blocks}, &c->blocks);
}

static tpr_dtype kind_dtype(const tpr_fstep *c, int kind) { return c->o->kind_dtype ? c->o->kind_dtype[kind] : TPR_F32; }
static int kind_block(const tpr_fstep *c, int kind) { return c->o->kind_block ? c->o->kind_block[kind] : 0; }

tpr_status tpr_fstep_kind(const tpr_fstep *c, const char *pattern, int *kind) {
  for (int i = 0; i < c->plan->n_tensors; i++)
    if (strcmp(c->plan->tensors[i].name, pattern) == 0) return *kind = i, TPR_OK;
  return TPR_FAIL(TPR_ERR_INTERNAL, "%s: the plan has no tensor %s", c->family->name, pattern);
}

tpr_status tpr_fstep_gather_param(tpr_program *p, const tpr_shard_plan *plan, const tpr_moe_opts *moe,
                                  const tpr_fsdp_opts *f, int group, const char *name, int ndim,
                                  const int64_t *shape, bool expert, tpr_value_id *out) {
  int n = expert ? plan->edp : plan->dp;
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (n < 1 || numel < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "fsdp: param %s of %lld elements over a group of %d", name,
                    (long long)numel, n);
  int64_t chunk = tpr_fsdp_chunk(numel, n);
  // The gradient's mean over the replicas. Experts under the alltoall
  // dispatcher: each edp copy saw only its ep group's tokens, so the sum over
  // edp divided by dp; under the allreduce dispatcher every copy saw every
  // token and the sum over edp counts each edp times.
  bool split = tpr_moe_dispatch_resolve(moe->dispatch, plan) == TPR_MOE_DISPATCH_ALLTOALL;
  float scale = 1.0f / (float)(expert && !split ? plan->edp : plan->dp);
  tpr_param_gather_opts g = {.axis = expert ? TPR_AXIS_EDP : TPR_AXIS_DP,
                             .n = n,
                             .group = group,
                             .prefetch = f->prefetch,
                             .reshard = f->reshard,
                             .grad_scale = f->debug_sum_grads ? 1.0f : scale};
  tpr_value_id shard, full;
  TPR_CHECK(tpr_program_param(p, name, f->param_dtype, 1, &chunk, &shard));  // (chunk)
  TPR_CHECK(tpr_pb_param_gather(p, shard, &g, &full));                       // (n*chunk) f32
  if (chunk * n != numel) TPR_CHECK(tpr_pb_slice(p, full, 0, 0, numel, &full));
  return tpr_pb_reshape(p, full, ndim, shape, out);
}

// A param of the program: the held dtype (inference), f32 (training), or
// gathered from its FSDP chunk (training under FSDP; every param of these
// families is trained).
static tpr_status declare(tpr_fstep *c, const char *name, tpr_dtype dt, int ndim, const int64_t *shape, bool expert,
                          tpr_value_id *out) {
  if (!c->training) return tpr_program_param(c->p, name, dt, ndim, shape, out);
  if (!c->fsdp || !c->fsdp->on) return tpr_program_param(c->p, name, TPR_F32, ndim, shape, out);
  return tpr_fstep_gather_param(c->p, c->plan, &c->o->moe, c->fsdp, c->group, name, ndim, shape, expert, out);
}

tpr_status tpr_fstep_kind_in(const tpr_fstep *c, const char *pattern, tpr_attn_layers layers, int *kind) {
  for (int i = 0; i < c->plan->n_tensors; i++)
    if (strcmp(c->plan->tensors[i].name, pattern) == 0 && c->plan->tensors[i].attn_layers == layers)
      return *kind = i, TPR_OK;
  return TPR_FAIL(TPR_ERR_INTERNAL, "%s: the plan has no tensor %s in layer set %d", c->family->name, pattern,
                  (int)layers);
}

tpr_status tpr_fstep_param_of(tpr_fstep *c, int kind, int64_t layer, tpr_value_id *out) {
  const tpr_shard_tensor *t = &c->plan->tensors[kind];
  char name[160];
  tpr_family_param_name(t->name, layer, name, sizeof name);
  return declare(c, name, kind_dtype(c, kind), t->ndim, t->rank_shape, false, out);
}

tpr_status tpr_fstep_param(tpr_fstep *c, const char *pattern, int64_t layer, tpr_value_id *out) {
  int i = -1;
  TPR_CHECK(tpr_fstep_kind(c, pattern, &i));
  return tpr_fstep_param_of(c, i, layer, out);
}

tpr_status tpr_fstep_weight_of(tpr_fstep *c, int kind, int64_t layer, tpr_fweight *out) {
  *out = (tpr_fweight){.block = kind_block(c, kind)};
  TPR_CHECK(tpr_fstep_param_of(c, kind, layer, &out->w));
  if (out->block <= 0) return TPR_OK;
  char name[160];
  tpr_family_param_name(c->plan->tensors[kind].name, layer, name, sizeof name);
  return tpr_fstep_scales(c->p, name, 2, c->plan->tensors[kind].rank_shape, out->block, &out->scale);
}

tpr_status tpr_fstep_scales(tpr_program *p, const char *name, int ndim, const int64_t *shape, int block,
                            tpr_value_id *out) {
  char sname[192];
  int64_t sshape[TPR_MAX_DIMS];
  memcpy(sshape, shape, (size_t)ndim * sizeof *sshape);
  sshape[ndim - 1] = (shape[ndim - 1] + block - 1) / block;
  snprintf(sname, sizeof sname, "%s.scale", name);
  return tpr_program_param(p, sname, TPR_F32, ndim, sshape, out);
}

tpr_status tpr_fstep_weight(tpr_fstep *c, const char *pattern, int64_t layer, tpr_fweight *out) {
  int i = -1;
  TPR_CHECK(tpr_fstep_kind(c, pattern, &i));
  return tpr_fstep_weight_of(c, i, layer, out);
}

tpr_status tpr_fstep_linear(tpr_program *p, tpr_value_id x, const tpr_fweight *w, tpr_value_id *out) {
  if (w->block > 0) return tpr_pb_matmul_fp8(p, x, w->w, w->scale, w->block, out);
  return tpr_pb_matmul(p, x, w->w, false, true, out);
}

tpr_status tpr_fstep_embed(tpr_fstep *c, tpr_value_id *embed, tpr_value_id *x) {
  TPR_CHECK(tpr_fstep_param(c, "model.embed_tokens.weight", 0, embed));  // (V'/tp, H)
  TPR_CHECK(tpr_pb_embedding_shard(c->p, *embed, c->tokens, c->rank_tp, x));  // (T, H) partial over tp
  tpr_tensor ev;
  TPR_CHECK(tpr_program_value(c->p, *x, &ev));
  if (ev.dtype != TPR_F32) TPR_CHECK(tpr_pb_cast(c->p, *x, TPR_F32, x));  // a bf16 table's rows, widened
  return tpr_pb_all_reduce(c->p, *x, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, x);
}

tpr_status tpr_fstep_attend(tpr_fstep *c, int64_t L, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                            const tpr_fweight *wo, tpr_value_id x, tpr_value_id *out) {
  tpr_value_id o;
  TPR_CHECK(tpr_fstep_attend_out(c, L, q, k, v, wo, &o));
  return tpr_pb_add(c->p, x, o, out);
}

tpr_status tpr_fstep_attend_out(tpr_fstep *c, int64_t L, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                const tpr_fweight *wo, tpr_value_id *out) {
  const tpr_step_shape *st = &c->o->shape;
  int64_t D = c->plan->config.head_dim, qr = c->plan->attn.q_per_rank, kr = c->plan->attn.kv_per_rank;
  const int64_t pool[4] = {st->pool_blocks, st->block_size, kr, D};
  char name[160];
  tpr_value_id kp, vp, done, att, o;
  tpr_family_pool_name(L, "k", name, sizeof name);
  TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 4, pool, &kp));
  tpr_family_pool_name(L, "v", name, sizeof name);
  TPR_CHECK(tpr_program_param(c->p, name, TPR_F32, 4, pool, &vp));
  // The writes come first: a token attends its own sequence's rows up to its
  // position, this step's included.
  TPR_CHECK(tpr_pb_paged_cache_write(c->p, kp, k, c->slots, &done));
  TPR_CHECK(tpr_pb_paged_cache_write(c->p, vp, v, c->slots, &done));
  float scale = (float)(1.0 / sqrt((double)D));
  TPR_CHECK(tpr_pb_paged_attention(c->p, q, kp, vp, c->blocks, c->seq, c->positions, scale, &att));  // (T, qr, D)
  TPR_CHECK(tpr_pb_reshape(c->p, att, 2, (const int64_t[]){c->T, qr * D}, &att));
  TPR_CHECK(tpr_fstep_linear(c->p, att, wo, &o));  // (T, H) partial over tp
  return tpr_pb_all_reduce(c->p, o, TPR_AXIS_TP, c->plan->tp, 0 /* sum */, out);
}

// The first plan kind holding the family's expert gate projection: the
// session holds the three expert kinds in its dtype and block.
static int expert_kind(const tpr_fstep *c) {
  for (int i = 0; i < c->plan->n_tensors; i++)
    if (strstr(c->plan->tensors[i].name, c->family->expert_gate)) return i;
  return -1;
}

tpr_status tpr_fstep_moe(tpr_fstep *c, int64_t L, tpr_value_id h, tpr_value_id gates, tpr_value_id *y) {
  int64_t H = c->plan->config.hidden_size, Er = c->plan->experts_per_rank, Fr = c->plan->expert_inter_per_rank;
  int ek = expert_kind(c);
  if (ek < 0) return TPR_FAIL(TPR_ERR_INTERNAL, "%s: the plan has no expert weights", c->family->name);
  const int64_t s13[3] = {Er, 2 * Fr, H}, s2[3] = {Er, H, Fr};
  char n13[160], n2[160], name[160];
  tpr_value_id w13, w2;
  tpr_moe_values v;
  tpr_family_expert_name(L, "w13", n13, sizeof n13);
  tpr_family_expert_name(L, "w2", n2, sizeof n2);
  TPR_CHECK(declare(c, n13, kind_dtype(c, ek), 3, s13, true, &w13));
  TPR_CHECK(declare(c, n2, kind_dtype(c, ek), 3, s2, true, &w2));
  tpr_moe_opts mo = c->o->moe;
  if ((mo.fp8_block = kind_block(c, ek)) > 0) {  // FP8 experts: their stacked scales
    TPR_CHECK(tpr_fstep_scales(c->p, n13, 3, s13, mo.fp8_block, &mo.s13));
    TPR_CHECK(tpr_fstep_scales(c->p, n2, 3, s2, mo.fp8_block, &mo.s2));
  }
  TPR_CHECK(tpr_moe_build(c->p, c->plan, &mo, L, c->rank, h, gates, w13, w2, y, &v));
  if (!c->o->moe_stats) return TPR_OK;
  snprintf(name, sizeof name, "moe_gates.%lld", (long long)L);
  TPR_CHECK(tpr_program_output(c->p, v.gates, name));
  snprintf(name, sizeof name, "moe_router.%lld", (long long)L);
  if (v.gates != gates) TPR_CHECK(tpr_program_output(c->p, gates, name));
  return TPR_OK;
}

tpr_status tpr_fstep_finish(tpr_fstep *c, tpr_value_id x, tpr_value_id embed, const tpr_train_loss_opts *lo,
                            const tpr_value_id *router_logits, int n_router) {
  const tpr_model_config *cfg = &c->plan->config;
  tpr_value_id fn, head = embed;
  TPR_CHECK(tpr_fstep_param(c, "model.norm.weight", 0, &fn));
  TPR_CHECK(tpr_pb_rms_norm(c->p, x, fn, (float)cfg->rms_norm_eps, &x));
  if (!cfg->tie_word_embeddings) TPR_CHECK(tpr_fstep_param(c, "lm_head.weight", 0, &head));
  if (!lo) return tpr_fstep_logits(c, x, head);
  return tpr_train_build_loss(c->p, c->plan, lo, c->rank, c->rank_tp, x, head, router_logits, n_router);
}

tpr_status tpr_fstep_logits(tpr_fstep *c, tpr_value_id x, tpr_value_id head) {
  // Logits only where a token is sampled: the lm head (the largest GEMM of a
  // small model) and its all-gather run on N rows, not T.
  tpr_value_id rows, xs, logits;
  TPR_CHECK(tpr_program_input(c->p, "sample_rows", TPR_I32, 1, (const int64_t[]){c->o->shape.samples}, &rows));
  TPR_CHECK(tpr_pb_index_select(c->p, x, 0, rows, &xs));            // (N, H)
  TPR_CHECK(tpr_pb_matmul(c->p, head, xs, false, true, &logits));  // (V'/tp, N)
  TPR_CHECK(tpr_pb_all_gather(c->p, logits, TPR_AXIS_TP, c->plan->tp, &logits));  // (V', N)
  return tpr_program_output(c->p, logits, "logits_t");
}

tpr_status tpr_fstep_rope(tpr_fstep *c, tpr_value_id x, tpr_value_id *out) {
  const tpr_model_config *cfg = &c->plan->config;
  if (!cfg->mrope_layout) return tpr_pb_rope(c->p, x, c->positions, cfg->rotary_dim, (float)cfg->rope_theta, out);
  tpr_rope_opts o = {.rotary_dim = cfg->rotary_dim,
                     .theta = (float)cfg->rope_theta,
                     .pairing = TPR_ROPE_PAIR_HALF,  // every Qwen-VL text decoder rotates halves
                     .layout = (tpr_mrope_layout)(c->o->mrope_layout_control > 0 ? c->o->mrope_layout_control
                                                                                 : cfg->mrope_layout),
                     .section = {cfg->mrope_section[0], cfg->mrope_section[1], cfg->mrope_section[2]}};
  return tpr_pb_rope_ex(c->p, x, c->positions_3d, &o, out);
}
