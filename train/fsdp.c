// FSDP for a training state (shard/fsdp.h), whatever the family: each trained
// param's chunk as the f32 master (and its bf16 copy), the gradient
// accumulators and the moments all chunk-sized; the whole rank-layout tensor
// exists only while the program gathers it, or while a step folds copied
// heads, saves or exports.
#include <stdlib.h>
#include <string.h>

#include "train/state_impl.h"
#include "shard/unshard.h"

static bool has_heads(const tpr_shard_plan *pl, const train_param *p) {
  for (int j = 0; j < p->n_pieces; j++)
    if (tpr_unshard_heads_layout(&pl->tensors[p->pieces[j].kind])) return true;
  return false;
}

// The elements of the rank-layout tensor the chunk really holds (the rest
// is padding).
static int64_t held(const tpr_train_param *p) {
  int64_t n = p->full_numel - p->offset;
  return n < 0 ? 0 : n > p->numel ? p->numel : n;
}

static tpr_status own_copy(tpr_train_state *t, train_param *p, int64_t from, int64_t n, int64_t len) {
  TPR_CHECK(tpr_tensor_new(t->be, TPR_F32, 1, &len, &p->master));
  float *d = tpr_tensor_data(p->master);
  memset(d, 0, (size_t)len * sizeof *d);
  if (n > 0) memcpy(d, p->full + from, (size_t)n * sizeof *d);
  p->pub.data = d;
  p->bound = p->master;
  return TPR_OK;
}

// Cuts param p into this rank's chunk (the next rank's with the negative
// control debug_wrong_shard).
static tpr_status shard_one(tpr_train_state *t, train_param *p) {
  if (!p->trained) return own_copy(t, p, 0, p->pub.full_numel, p->pub.full_numel);  // the arena goes away
  int n, r;
  tpr_fsdp_group(t->mesh, p->expert, &n, &r);
  int64_t full = p->pub.full_numel, chunk = tpr_fsdp_chunk(full, n);
  int src = t->o.fsdp.debug_wrong_shard ? (r + 1) % n : r;
  int64_t from = (int64_t)src * chunk, take = full - from < chunk ? full - from : chunk;
  TPR_CHECK(own_copy(t, p, from, take, chunk));
  p->pub.numel = chunk, p->pub.offset = (int64_t)r * chunk, p->pub.shards = n, p->pub.shard_index = r;
  if (!(p->grad_own = p->pub.grad = calloc((size_t)chunk, sizeof(float))))
    return TPR_FAIL(TPR_ERR_OOM, "gradients of %s", p->name);
  if (t->o.fsdp.param_dtype == TPR_BF16) TPR_CHECK(tpr_tensor_new(t->be, TPR_BF16, 1, &chunk, &p->bound));
  return TPR_OK;
}

tpr_status tpr__train_fsdp_shard(tpr_train_state *t) {
  tpr_dtype dt = t->o.fsdp.param_dtype;
  if (dt != TPR_F32 && dt != TPR_BF16)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "fsdp: --param-dtype %s (want f32 or bf16)", tpr_dtype_name(dt));
  for (int i = 0; i < t->n_params; i++) TPR_CHECK(shard_one(t, &t->params[i]));
  // Every param now has its own memory: the loader's arena, the tensors
  // wrapping it and the stacked experts are freed.
  for (int i = 0; i < t->n_params; i++) t->params[i].full = NULL;
  tpr__session_release_weights(t->s);
  tpr__train_fsdp_refresh(t);
  for (int i = 0; i < t->n_params; i++) TPR_CHECK(tpr_exec_bind(t->exec, t->params[i].name, t->params[i].bound));
  return TPR_OK;
}

void tpr__train_fsdp_refresh(tpr_train_state *t) {
  for (int i = 0; i < t->n_trained; i++) {
    train_param *p = &t->params[i];
    if (p->bound == p->master) continue;
    uint16_t *h = tpr_tensor_data(p->bound);
    const float *f = p->pub.data;
    int64_t n = p->pub.numel;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t j = 0; j < n; j++) h[j] = tpr_f32_to_bf16(f[j]);
  }
}

tpr_status tpr__train_fsdp_unshard(const tpr_train_state *t, const train_param *p, bool grads, float *full) {
  tpr_comm_t c = tpr__session_axis(t->s, p->expert ? TPR_AXIS_EDP : TPR_AXIS_DP);
  const float *mine = grads ? p->pub.grad : p->pub.data;
  return tpr_comm_all_gather(c, mine, full, (size_t)p->pub.numel, TPR_F32);
}

// The params laid out by heads are folded whole: gathered over their group
// (every rank then holds the same tensor), folded over tp, counted for the
// norm on dp rank 0, and this rank's chunk taken back.
tpr_status tpr__train_fsdp_reduce(tpr_train_state *t) {
  const tpr_shard_plan *pl = t->plan;
  t->heads_sumsq = 0;
  float *whole = NULL;
  tpr_status rc = TPR_OK;
  for (int i = 0; rc == TPR_OK && i < t->n_trained; i++) {
    train_param *p = &t->params[i];
    if (!has_heads(pl, p)) continue;
    free(whole);
    whole = malloc((size_t)(p->pub.shards * p->pub.numel) * sizeof *whole);
    rc = whole ? tpr__train_fsdp_unshard(t, p, true, whole) : TPR_FAIL(TPR_ERR_OOM, "fold %s", p->name);
    if (rc == TPR_OK) rc = tpr__train_fold_param(t, i, whole);
    for (int j = 0; rc == TPR_OK && j < p->n_pieces; j++)
      t->heads_sumsq += tpr_unshard_sumsq(pl, &pl->tensors[p->pieces[j].kind], t->mesh, whole + p->pieces[j].offset);
    if (rc == TPR_OK) memcpy(p->pub.grad, whole + p->pub.offset, (size_t)held(&p->pub) * sizeof *whole);
  }
  free(whole);
  return rc;
}

// Chunks are disjoint over the group, so every rank counts the part of
// each piece its chunk holds, as tpr_unshard_sumsq counts inside a replica.
double tpr__train_fsdp_sumsq(const tpr_train_state *t) {
  const tpr_shard_plan *pl = t->plan;
  double sum = t->heads_sumsq;
  for (int i = 0; i < t->n_trained; i++) {
    const train_param *p = &t->params[i];
    if (has_heads(pl, p)) continue;
    int64_t lo = p->pub.offset, hi = lo + held(&p->pub);
    for (int j = 0; j < p->n_pieces; j++) {
      const tpr_shard_tensor *k = &pl->tensors[p->pieces[j].kind];
      int64_t a = p->pieces[j].offset, b = a + tpr__kind_numel(k);  // the piece in the param
      int64_t from = a > lo ? a : lo, to = b < hi ? b : hi;
      if (to > from) sum += tpr_unshard_sumsq_range(k, t->mesh, p->pub.grad + (from - lo), from - a, to - a);
    }
  }
  return sum;
}
