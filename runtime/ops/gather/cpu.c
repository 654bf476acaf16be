// Gather CPU kernels: embedding, embedding_shard and index_select, for any
// element type.
//
// Both move whole elements as bytes (no conversion), so one code path serves
// every dtype. Every id is range-checked before anything is written: a bad id
// returns TPR_ERR_INVALID_ARG, never reads out of bounds, and leaves out as
// it was. The forward gathers split their rows over threads (cpu_threads.h):
// pure copies, each out row written by one thread. The backward scatter-adds
// stay on one thread (two tokens may add into one row, in token order).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"
#include "runtime/ops/strided.h"

static tpr_status check_ids(const char *op, const tpr_tensor *ids) {
  if (ids->dtype != TPR_I32 && ids->dtype != TPR_I64)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s (cpu): ids are %s, expected i32 or i64", op,
                    tpr_dtype_name(ids->dtype));
  return TPR_OK;
}

// Visits ids (any shape, any strides) in row-major order, storing each value
// in vals (numel). Fails on the first value outside [0, limit); limit < 0
// means no upper bound (only negative values fail).
static tpr_status load_ids(const char *op, const char *what, const tpr_tensor *ids, int64_t limit,
                           int64_t *vals) {
  const int64_t *st[1] = {ids->stride};
  tpr__iter it;
  if (!tpr__iter_init(&it, ids->ndim, ids->shape, 1, st)) return TPR_OK;
  int64_t pos = 0;
  do {
    for (int64_t i = 0; i < it.n; i++, pos++) {
      const int64_t v = tpr__index_at(ids, it.off[0] + i * it.inner[0]);
      if (v < 0 && limit < 0)
        return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: %s %lld at position %lld is negative", op, what, (long long)v,
                        (long long)pos);
      if (v < 0 || (limit >= 0 && v >= limit))
        return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: %s %lld at position %lld is out of range [0, %lld)",
                        op, what, (long long)v, (long long)pos, (long long)limit);
      vals[pos] = v;
    }
  } while (tpr__iter_next(&it));
  return TPR_OK;
}

// Loads ids (numel n) checked against [0, limit) (limit < 0: only >= 0) into a
// new array; *vals stays NULL when there are none.
static tpr_status load_ids_new(const char *op, const char *what, const tpr_tensor *ids, int64_t limit,
                               int64_t **vals) {
  *vals = NULL;
  const int64_t n = tpr_tensor_numel(ids);
  if (n == 0) return TPR_OK;
  *vals = malloc((size_t)n * sizeof **vals);
  if (!*vals) return TPR_FAIL(TPR_ERR_OOM, "%s (cpu): %lld ids of scratch", op, (long long)n);
  tpr_status rc = load_ids(op, what, ids, limit, *vals);
  if (rc == TPR_OK) return TPR_OK;
  free(*vals);
  *vals = NULL;
  return tpr__propagate(rc, __FILE__, __LINE__);
}

// The vocab-parallel embedding's ids and shard index: both i32/i64, the
// shard read (it must not be negative).
static tpr_status shard_of(const char *op, const tpr_tensor *ids, const tpr_tensor *shard, int64_t *sh) {
  TPR_CHECK(check_ids(op, ids));
  TPR_CHECK(check_ids(op, shard));
  return load_ids(op, "shard index", shard, -1, sh);
}

// The embeddings' gather: out row p (of n) = table (V, H) row vals[p] - lo,
// or zeros where that lies outside [0, V) or the table owns no id (none).
// Rows are split over threads: pure copies, each out row by one thread.
static void gather_rows(const void *ctx, const tpr_tensor *table, const int64_t *vals, int64_t n, int64_t lo,
                        bool none, tpr_tensor *out) {
  const int64_t V = table->shape[0], H = table->shape[1], one = 1, ts = table->stride[1];
  const size_t esz = tpr_dtype_size(table->dtype);
  const char *t = tpr_tensor_data(table);
  char *o = tpr_tensor_data(out);
  const int nt = tpr__cpu_nt(ctx, n * H);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t p = 0; p < n; p++) {
    char *dst = o + p * H * (int64_t)esz;
    if (none || vals[p] < lo || vals[p] - lo >= V) {
      memset(dst, 0, (size_t)H * esz);  // all-zero bits are 0 in every dtype
      continue;
    }
    const char *row = t + (vals[p] - lo) * table->stride[0] * (int64_t)esz;
    if (ts == 1 || H == 1)
      memcpy(dst, row, (size_t)H * esz);
    else
      tpr__strided_copy(dst, &one, row, &ts, 1, &H, esz);
  }
}

// table (V, H), ids (...) i32/i64; out (..., H) contiguous, table's dtype.
TPR_CPU_KERNEL(embedding) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "embedding (cpu): expected 2 inputs, got %d", n_in);
  const tpr_tensor *table = in[0], *ids = in[1];
  TPR_CHECK(check_ids("embedding", ids));
  if (out->dtype != table->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "embedding (cpu): out is %s but the table is %s",
                    tpr_dtype_name(out->dtype), tpr_dtype_name(table->dtype));
  if (table->ndim != 2 || out->ndim != ids->ndim + 1 || out->shape[ids->ndim] != table->shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "embedding (cpu): table, ids and out shapes do not fit");
  const int64_t n = tpr_tensor_numel(ids);
  if (n == 0) return TPR_OK;
  int64_t *vals;
  TPR_CHECK(load_ids_new("embedding", "token id", ids, table->shape[0], &vals));  // all in [0, V)
  gather_rows(ctx, table, vals, n, 0, false, out);
  free(vals);
  return TPR_OK;
}

// One slice of x along `dim` (x without that dim) and its place in a
// contiguous out: out's strides (ostride), then the slice's shape, x's
// strides (xs) and out's (os), nd dims.
typedef struct slice_geom {
  int nd;
  int64_t ostride[TPR_MAX_DIMS], shape[TPR_MAX_DIMS], xs[TPR_MAX_DIMS], os[TPR_MAX_DIMS];
} slice_geom;

static void slice_geom_of(const tpr_tensor *x, const tpr_tensor *out, int dim, slice_geom *g) {
  tpr__contig_strides(out->ndim, out->shape, g->ostride);
  g->nd = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (d == dim) continue;
    g->shape[g->nd] = x->shape[d];
    g->xs[g->nd] = x->stride[d];
    g->os[g->nd++] = g->ostride[d];
  }
}

// x (..., X_dim, ...), index (n) i32/i64; out (..., n, ...) contiguous.
TPR_CPU_KERNEL(index_select) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "index_select (cpu): expected 2 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *index = in[1];
  TPR_CHECK(check_ids("index_select", index));
  if (!attrs || attrs->n_i < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "index_select (cpu): missing dim attribute i[0]");
  int dim = (int)attrs->i[0];
  if (dim < 0) dim += x->ndim;
  if (dim < 0 || dim >= x->ndim)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "index_select (cpu): dim %lld out of range for %d-d x",
                    (long long)attrs->i[0], x->ndim);
  if (out->dtype != x->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "index_select (cpu): out is %s but x is %s",
                    tpr_dtype_name(out->dtype), tpr_dtype_name(x->dtype));
  if (index->ndim != 1 || out->ndim != x->ndim || out->shape[dim] != index->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "index_select (cpu): x, index and out shapes do not fit");
  const int64_t n = index->shape[0];
  if (n == 0 || tpr_tensor_numel(out) == 0) return TPR_OK;
  int64_t *vals;
  TPR_CHECK(load_ids_new("index_select", "index", index, x->shape[dim], &vals));
  // Each selected slice is x with `dim` removed, copied into out's slice j.
  slice_geom g;
  slice_geom_of(x, out, dim, &g);
  const size_t esz = tpr_dtype_size(x->dtype);
  const char *xd = tpr_tensor_data(x);
  char *o = tpr_tensor_data(out);
  const int nt = tpr__cpu_nt(ctx, tpr_tensor_numel(out));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t j = 0; j < n; j++)
    tpr__strided_copy(o + j * g.ostride[dim] * (int64_t)esz, g.os, xd + vals[j] * x->stride[dim] * (int64_t)esz,
                      g.xs, g.nd, g.shape, esz);
  free(vals);
  return TPR_OK;
}

// table (Vl, H), ids (...) i32/i64, shard (1) i32/i64; out (..., H)
// contiguous, table's dtype. Row id - shard*Vl, or zeros outside [0, Vl).
TPR_CPU_KERNEL(embedding_shard) {
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "embedding_shard (cpu): expected 3 inputs, got %d", n_in);
  const tpr_tensor *table = in[0], *ids = in[1], *shard = in[2];
  if (out->dtype != table->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "embedding_shard (cpu): out is %s but the table is %s",
                    tpr_dtype_name(out->dtype), tpr_dtype_name(table->dtype));
  if (table->ndim != 2 || out->ndim != ids->ndim + 1 || out->shape[ids->ndim] != table->shape[1] ||
      tpr_tensor_numel(shard) != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "embedding_shard (cpu): table, ids, shard and out shapes do not fit");
  int64_t sh;
  TPR_CHECK(shard_of("embedding_shard", ids, shard, &sh));
  const int64_t n = tpr_tensor_numel(ids), V = table->shape[0];
  if (n == 0) return TPR_OK;
  int64_t *vals;
  TPR_CHECK(load_ids_new("embedding_shard", "token id", ids, -1, &vals));
  // Ids and shard are >= 0 here; a shard*V past INT64_MAX owns no id at all.
  const bool none = V == 0 || sh > INT64_MAX / V;
  gather_rows(ctx, table, vals, n, none ? 0 : sh * V, none, out);
  free(vals);
  return TPR_OK;
}

// ---- Backward kernels: scatter-adds of f32 cotangent rows into zeros, in
// token (index) order, in f32: a fixed order, so results are deterministic.
// Every id is checked before anything is written.

// dy (rows, H) viewed through its strides: visits rows in row-major order of
// the leading dims and adds row p into dst_row(p) (NULL: the row is dropped).
typedef float *(*dst_row_fn)(void *ctx, int64_t p);
static void scatter_rows(const tpr_tensor *dy, dst_row_fn dst_row, void *ctx) {
  const int64_t H = dy->shape[dy->ndim - 1], hs = dy->stride[dy->ndim - 1];
  const float *d = tpr_tensor_data(dy);
  const int64_t *st[1] = {dy->stride};
  tpr__iter it;
  if (H == 0 || !tpr__iter_init(&it, dy->ndim - 1, dy->shape, 1, st)) return;
  int64_t p = 0;
  do {
    for (int64_t r = 0; r < it.n; r++, p++) {
      float *o = dst_row(ctx, p);
      const float *row = d + it.off[0] + r * it.inner[0];
      if (o)
        for (int64_t i = 0; i < H; i++) o[i] += row[i * hs];
    }
  } while (tpr__iter_next(&it));
}

typedef struct scatter_ctx {
  float *out;          // (rows, H)
  int64_t H, lo, n;    // a token's row is id - lo when in [0, n)
  const int64_t *ids;  // (tokens)
} scatter_ctx;

static float *token_row(void *ctx, int64_t p) {
  const scatter_ctx *c = ctx;
  int64_t r = c->ids[p] - c->lo;
  return r >= 0 && r < c->n ? c->out + r * c->H : NULL;
}

// dy (..., H) f32, ids (...) i32/i64 in [0, V); i[0] V; out (V, H).
TPR_CPU_KERNEL(embedding_bwd) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "embedding_bwd (cpu): expected 2 inputs, got %d", n_in);
  const tpr_tensor *dy = in[0], *ids = in[1];
  TPR_CHECK(check_ids("embedding_bwd", ids));
  const int64_t V = out->shape[0], H = out->shape[1];
  int64_t *vals;
  TPR_CHECK(load_ids_new("embedding_bwd", "token id", ids, V, &vals));
  float *o = tpr_tensor_data(out);
  memset(o, 0, (size_t)(V * H) * sizeof *o);
  scatter_ctx c = {o, H, 0, V, vals};
  if (vals) scatter_rows(dy, token_row, &c);
  free(vals);
  return TPR_OK;
}

// dy (..., H) f32, ids (...) >= 0, shard (1) >= 0; i[0] Vl; out (Vl, H): the
// row of id - shard*Vl when that is in [0, Vl); other ids add nothing.
TPR_CPU_KERNEL(embedding_shard_bwd) {
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "embedding_shard_bwd (cpu): expected 3 inputs, got %d", n_in);
  const tpr_tensor *dy = in[0], *ids = in[1], *shard = in[2];
  int64_t sh, *vals;
  TPR_CHECK(shard_of("embedding_shard_bwd", ids, shard, &sh));
  TPR_CHECK(load_ids_new("embedding_shard_bwd", "token id", ids, -1, &vals));
  const int64_t V = out->shape[0], H = out->shape[1];
  float *o = tpr_tensor_data(out);
  memset(o, 0, (size_t)(V * H) * sizeof *o);
  // As the forward: a shard*V past INT64_MAX owns no id at all.
  const bool none = V == 0 || sh > INT64_MAX / V;
  scatter_ctx c = {o, H, none ? 0 : sh * V, none ? 0 : V, vals};
  if (vals) scatter_rows(dy, token_row, &c);
  free(vals);
  return TPR_OK;
}

// dy (..., k, ...), index (k) in [0, n); i[0] dim, i[1] n; out (..., n, ...):
// zeros, then dy's slice j added at index[j] for j ascending.
TPR_CPU_KERNEL(index_select_bwd) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "index_select_bwd (cpu): expected 2 inputs, got %d", n_in);
  const tpr_tensor *dy = in[0], *index = in[1];
  TPR_CHECK(check_ids("index_select_bwd", index));
  const int dim = (int)attrs->i[0];
  const int64_t n = attrs->i[1], k = index->shape[0];
  int64_t *vals;
  TPR_CHECK(load_ids_new("index_select_bwd", "index", index, n, &vals));
  float *o = tpr_tensor_data(out);
  memset(o, 0, (size_t)tpr_tensor_numel(out) * sizeof *o);
  slice_geom g;
  slice_geom_of(dy, out, dim, &g);
  const float *dd = tpr_tensor_data(dy);
  const int64_t *st[2] = {g.os, g.xs};
  for (int64_t j = 0; vals && j < k; j++) {
    float *oj = o + vals[j] * g.ostride[dim];
    const float *dj = dd + j * dy->stride[dim];
    tpr__iter it;
    if (!tpr__iter_init(&it, g.nd, g.shape, 2, st)) break;
    do {
      for (int64_t i = 0; i < it.n; i++) oj[it.off[0] + i * it.inner[0]] += dj[it.off[1] + i * it.inner[1]];
    } while (tpr__iter_next(&it));
  }
  free(vals);
  return TPR_OK;
}

const tpr__kernel_def tpr__gather_cpu[] = {
    {TPR_OP_EMBEDDING, cpu_embedding},
    {TPR_OP_INDEX_SELECT, cpu_index_select},
    {TPR_OP_EMBEDDING_SHARD, cpu_embedding_shard},
    {TPR_OP_EMBEDDING_BWD, cpu_embedding_bwd},
    {TPR_OP_EMBEDDING_SHARD_BWD, cpu_embedding_shard_bwd},
    {TPR_OP_INDEX_SELECT_BWD, cpu_index_select_bwd},
    {0},
};
