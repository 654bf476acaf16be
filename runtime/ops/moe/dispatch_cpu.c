// Expert-parallel dispatch CPU kernels (ops.h, "Expert parallelism"):
// capacity mode, row_slice, and the alltoall dispatcher's local halves
// (moe_counts, moe_permute, moe_unpermute; all_to_allv is a collective and
// moe_grouped_ffn lives in cpu.c beside moe_experts).
//
// Routing is dense gates (N, E): a nonzero entry is an assignment. A
// dispatched buffer holds one row per assignment in (expert, token) order,
// so permute and unpermute find every row by walking the gates in that same
// order -- no index tensor travels between them. Every result is a fixed
// function of the inputs (and the seed). permute, unpermute and their
// backwards number the rows on one thread, then split rows or tokens over
// threads (cpu_threads.h), each output element written by one thread in the
// single-threaded order.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rng.h"
#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"

#include "runtime/ops/strided.h"

// gates[t, e] of a (N, E) f32 tensor, any strides.
static inline float gate_at(const tpr_tensor *g, const float *gd, int64_t t, int64_t e) {
  return gd[t * g->stride[0] + e * g->stride[1]];
}

// row[t * E + e] = the dispatched row of assignment (t, e) in (expert, token)
// order, -1 for a zero gate; returns NULL when out of memory.
static int64_t *number_rows(const tpr_tensor *g) {
  const int64_t N = g->shape[0], E = g->shape[1];
  int64_t *row = malloc((size_t)(N * E > 0 ? N * E : 1) * sizeof *row);
  if (!row) return NULL;
  const float *gd = tpr_tensor_data(g);
  int64_t r = 0;
  for (int64_t e = 0; e < E; e++)
    for (int64_t t = 0; t < N; t++) row[t * E + e] = gate_at(g, gd, t, e) != 0.0f ? r++ : -1;
  return row;
}

// Number of nonzero gates: the rows moe_permute writes.
static int64_t count_assignments(const tpr_tensor *g) {
  const float *gd = tpr_tensor_data(g);
  int64_t n = 0;
  for (int64_t t = 0; t < g->shape[0]; t++)
    for (int64_t e = 0; e < g->shape[1]; e++) n += gate_at(g, gd, t, e) != 0.0f;
  return n;
}

// ---------------------------------------------------------------- capacity

typedef struct ranked {
  float w;
  int64_t t;
} ranked;

// Descending weight (a NaN ranks below every number), then ascending token:
// a total order, so qsort's instability cannot show.
static int by_weight_desc(const void *pa, const void *pb) {
  const ranked *a = pa, *b = pb;
  bool an = isnan(a->w), bn = isnan(b->w);
  if (an != bn) return an ? 1 : -1;
  if (!an && a->w != b->w) return a->w > b->w ? -1 : 1;
  return (a->t > b->t) - (a->t < b->t);
}

// The capacity decision, shared by the forward and the backward so both see
// the same one. gates (T, E); o (T, E) contiguous gets the routed gates; src
// (T*E), when given, gets for each entry of o the input expert whose weight
// it holds (itself when kept, the origin when re-routed), -1 for none.
// attrs: i[0] top_k, i[1] reroute, i[2] seed (the bits of a uint64), f[0]
// factor.
static tpr_status capacity_decide(const tpr_tensor *g, const tpr_op_attrs *attrs, float *o, int64_t *src) {
  const int64_t T = g->shape[0], E = g->shape[1], k = attrs->i[0];
  const bool reroute = attrs->i[1] != 0;
  const double cd = ceil((double)T * (double)k * (double)attrs->f[0] / (double)E);
  // An expert never holds more than T assignments: a larger C drops nothing
  // (and a huge factor must not overflow the integer).
  const int64_t C = cd >= (double)T ? T : (int64_t)cd;
  const float *gd = tpr_tensor_data(g);
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++) {
      o[t * E + e] = gate_at(g, gd, t, e);
      if (src) src[t * E + e] = o[t * E + e] != 0.0f ? e : -1;
    }
  if (T == 0 || E == 0) return TPR_OK;
  ranked *list = malloc((size_t)T * sizeof *list);
  unsigned char *dropped = calloc((size_t)(T * E), 1);  // (T, E)
  int64_t *load = malloc((size_t)E * sizeof *load);
  int *slot = NULL;
  unsigned char *taken = NULL;
  tpr_status rc = TPR_OK;
  if (!list || !dropped || !load) {
    rc = TPR_FAIL(TPR_ERR_OOM, "moe_capacity (cpu): scratch for (%lld, %lld)", (long long)T, (long long)E);
    goto done;
  }
  int64_t n_dropped = 0, n_slots = 0;
  for (int64_t e = 0; e < E; e++) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++)
      if (o[t * E + e] != 0.0f) list[n++] = (ranked){o[t * E + e], t};
    load[e] = n < C ? n : C;
    n_slots += C - load[e];
    if (n <= C) continue;
    qsort(list, (size_t)n, sizeof *list, by_weight_desc);
    for (int64_t i = C; i < n; i++) {
      o[list[i].t * E + e] = 0.0f;
      dropped[list[i].t * E + e] = 1;
      if (src) src[list[i].t * E + e] = -1;
    }
    n_dropped += n - C;
  }
  if (!reroute || n_dropped == 0 || n_slots == 0) goto done;
  // Something was dropped, so C < T and the slots number at most E*T.
  slot = malloc((size_t)n_slots * sizeof *slot);
  taken = calloc((size_t)n_slots, 1);
  if (!slot || !taken) {
    rc = TPR_FAIL(TPR_ERR_OOM, "moe_capacity (cpu): %lld spare slots", (long long)n_slots);
    goto done;
  }
  int64_t ns = 0;
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = load[e]; i < C; i++) slot[ns++] = (int)e;
  // Fisher-Yates from the back: j uniform in [0, i] as next() % (i + 1).
  tpr_rng rng = {.state = (uint64_t)attrs->i[2]};
  for (int64_t i = n_slots - 1; i > 0; i--) {
    int64_t j = (int64_t)(tpr_rng_next(&rng) % (uint64_t)(i + 1));
    int tmp = slot[i];
    slot[i] = slot[j], slot[j] = tmp;
  }
  int64_t first = 0;  // slots before it are all taken
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++) {
      if (!dropped[t * E + e]) continue;
      while (first < n_slots && taken[first]) first++;
      for (int64_t i = first; i < n_slots; i++)
        if (!taken[i] && o[t * E + slot[i]] == 0.0f) {  // the token does not use that expert yet
          o[t * E + slot[i]] = gate_at(g, gd, t, e);
          if (src) src[t * E + slot[i]] = e;
          taken[i] = 1;
          break;
        }
    }
done:
  free(list), free(dropped), free(load), free(slot), free(taken);
  return rc;
}

// gates (T, E); out (T, E) contiguous.
TPR_CPU_KERNEL(moe_capacity) {
  const tpr_tensor *g = in[0];
  if (n_in != 1 || g->dtype != TPR_F32 || out->dtype != TPR_F32 || g->ndim != 2 || !tpr_tensor_same_shape(g, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_capacity (cpu): needs gates (T, E) f32 and out of the same shape");
  return capacity_decide(g, attrs, tpr_tensor_data(out), NULL);
}

// gates_in (T, E), dout (T, E); out dgates_in (T, E) contiguous; attrs as
// moe_capacity's. The decision is recomputed exactly and is piecewise
// constant, so each routed entry passes its cotangent back to the input
// entry whose weight it carries: a kept one to itself, a re-routed one from
// e' back to its origin e; dropped and unused entries get 0.
TPR_CPU_KERNEL(moe_capacity_bwd) {
  const tpr_tensor *g = in[0], *dy = in[1];
  if (n_in != 2 || g->dtype != TPR_F32 || dy->dtype != TPR_F32 || out->dtype != TPR_F32 || g->ndim != 2 ||
      !tpr_tensor_same_shape(g, dy) || !tpr_tensor_same_shape(g, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_capacity_bwd (cpu): needs gates_in and dout (T, E) f32, out the same");
  const int64_t T = g->shape[0], E = g->shape[1];
  float *o = tpr_tensor_data(out);
  memset(o, 0, (size_t)(T * E) * sizeof *o);
  if (T == 0 || E == 0) return TPR_OK;
  float *routed = malloc((size_t)(T * E) * sizeof *routed);
  int64_t *src = malloc((size_t)(T * E) * sizeof *src);
  tpr_status rc = TPR_OK;
  if (!routed || !src) {
    rc = TPR_FAIL(TPR_ERR_OOM, "moe_capacity_bwd (cpu): scratch for (%lld, %lld)", (long long)T, (long long)E);
    goto done;
  }
  if ((rc = capacity_decide(g, attrs, routed, src)) != TPR_OK) goto done;
  const float *dd = tpr_tensor_data(dy);
  // Each input entry is the origin of at most one routed entry: plain stores.
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++)
      if (src[t * E + e] >= 0) o[t * E + src[t * E + e]] = dd[t * dy->stride[0] + e * dy->stride[1]];
done:
  free(routed), free(src);
  return rc;
}

// ---------------------------------------------------------------- row_slice

// x (T, C) any dtype and strides, part (1) i32/i64; out (ceil(T/n), C).
TPR_CPU_KERNEL(row_slice) {
  const tpr_tensor *x = in[0], *part = in[1];
  if (n_in != 2 || x->ndim != 2 || out->ndim != 2 || out->dtype != x->dtype || out->shape[1] != x->shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "row_slice (cpu): x and out shapes do not fit");
  const int64_t n = attrs->i[0], T = x->shape[0], Ts = out->shape[0];
  const void *pd = tpr_tensor_data(part);
  const int64_t p = part->dtype == TPR_I64 ? *(const int64_t *)pd : *(const int32_t *)pd;
  if (p < 0 || p >= n)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "row_slice: part %lld is outside [0, n = %lld)", (long long)p, (long long)n);
  const size_t esz = tpr_dtype_size(x->dtype);
  const int64_t first = p * Ts, rows = first >= T ? 0 : (T - first < Ts ? T - first : Ts), C = x->shape[1];
  char *o = tpr_tensor_data(out);
  if (rows > 0) {
    const int64_t shape[2] = {rows, C}, os[2] = {C, 1};
    tpr__strided_copy(o, os, (const char *)tpr_tensor_data(x) + first * x->stride[0] * (int64_t)esz, x->stride, 2,
                      shape, esz);
  }
  // The last parts hang past T when n does not divide it: zero rows.
  memset(o + rows * C * (int64_t)esz, 0, (size_t)((Ts - rows) * C) * esz);
  return TPR_OK;
}

// dy (Ts, C) f32, part (1) i32/i64; attrs i[0] n, i[1] T; out (T, C): dy's
// rows placed at part*Ts (rows of dy past T dropped), zeros elsewhere.
TPR_CPU_KERNEL(row_slice_bwd) {
  const tpr_tensor *dy = in[0], *part = in[1];
  if (n_in != 2 || dy->ndim != 2 || out->ndim != 2 || dy->dtype != TPR_F32 || out->dtype != TPR_F32 ||
      out->shape[1] != dy->shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "row_slice_bwd (cpu): dy and out shapes do not fit");
  const int64_t n = attrs->i[0], T = out->shape[0], Ts = dy->shape[0], C = dy->shape[1];
  const void *pd = tpr_tensor_data(part);
  const int64_t p = part->dtype == TPR_I64 ? *(const int64_t *)pd : *(const int32_t *)pd;
  if (p < 0 || p >= n)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "row_slice_bwd: part %lld is outside [0, n = %lld)", (long long)p,
                    (long long)n);
  float *o = tpr_tensor_data(out);
  memset(o, 0, (size_t)(T * C) * sizeof *o);
  const int64_t first = p * Ts, rows = first >= T ? 0 : (T - first < Ts ? T - first : Ts);
  if (rows > 0) {
    const int64_t shape[2] = {rows, C}, os[2] = {C, 1};
    tpr__strided_copy(o + first * C, os, tpr_tensor_data(dy), dy->stride, 2, shape, sizeof(float));
  }
  return TPR_OK;
}

// ---------------------------------------------------------------- counts, permute, unpermute

// gates (N, E); out (E) i32.
TPR_CPU_KERNEL(moe_counts) {
  const tpr_tensor *g = in[0];
  if (n_in != 1 || g->dtype != TPR_F32 || g->ndim != 2 || out->dtype != TPR_I32 || out->ndim != 1 ||
      out->shape[0] != g->shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_counts (cpu): needs gates (N, E) f32 and out (E) i32");
  const int64_t N = g->shape[0], E = g->shape[1];
  if (N > INT32_MAX)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "moe_counts (cpu): N = %lld tokens overflow i32 counts", (long long)N);
  const float *gd = tpr_tensor_data(g);
  int32_t *o = tpr_tensor_data(out);
  for (int64_t e = 0; e < E; e++) {
    int32_t c = 0;
    for (int64_t t = 0; t < N; t++) c += gate_at(g, gd, t, e) != 0.0f;
    o[e] = c;
  }
  return TPR_OK;
}

// x (N, H), gates (N, E); out (R, H): one row per assignment, expert-major.
TPR_CPU_KERNEL(moe_permute) {
  const tpr_tensor *x = in[0], *g = in[1];
  if (n_in != 2 || x->ndim != 2 || g->ndim != 2 || out->ndim != 2 || out->shape[1] != x->shape[1] ||
      g->shape[0] != x->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_permute (cpu): x, gates and out shapes do not fit");
  const int64_t N = x->shape[0], H = x->shape[1], E = g->shape[1], R = out->shape[0];
  // Counted first, so a buffer that is too small is left untouched.
  const int64_t total = count_assignments(g);
  if (total > R)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_permute: %lld assignments (nonzero gates) do not fit R = %lld rows",
                    (long long)total, (long long)R);
  int64_t *row = number_rows(g);
  if (!row) return TPR_FAIL(TPR_ERR_OOM, "moe_permute (cpu): (%lld, %lld) row numbers", (long long)N, (long long)E);
  const float *xd = tpr_tensor_data(x);
  float *o = tpr_tensor_data(out);
  const int64_t one = 1;
  const int nt = tpr__cpu_nt(ctx, total * H);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < N; t++)
    for (int64_t e = 0; e < E; e++)
      if (row[t * E + e] >= 0)
        tpr__strided_copy(o + row[t * E + e] * H, &one, xd + t * x->stride[0], &x->stride[1], 1, &H, sizeof(float));
  free(row);
  return TPR_OK;
}

// rows (R, H) in moe_permute's order for gates (N, E); out (N, H): for each
// token the sum of its rows, each times its gate when `weighted`, added in
// f32 from 0 in ascending expert order (moe_experts' order). Rows past the
// counted ones are never read. moe_unpermute is the weighted sum;
// moe_permute's backward the plain one (the rows that copied x[t]).
static tpr_status sum_rows(const void *ctx, const char *op, const tpr_tensor *y, const tpr_tensor *g, int n_in, bool weighted,
                           tpr_tensor *out) {
  if (n_in != 2 || y->ndim != 2 || g->ndim != 2 || out->ndim != 2 || out->shape[0] != g->shape[0] ||
      out->shape[1] != y->shape[1] || y->dtype != TPR_F32 || g->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s (cpu): rows, gates and out shapes do not fit", op);
  const int64_t N = g->shape[0], E = g->shape[1], R = y->shape[0], H = y->shape[1];
  const int64_t total = count_assignments(g);
  if (total > R)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: %lld assignments (nonzero gates) need more rows than R = %lld", op,
                    (long long)total, (long long)R);
  int64_t *row = number_rows(g);
  if (!row) return TPR_FAIL(TPR_ERR_OOM, "%s (cpu): (%lld, %lld) row numbers", op, (long long)N, (long long)E);
  const float *gd = tpr_tensor_data(g), *yd = tpr_tensor_data(y);
  const int64_t ys0 = y->stride[0], ys1 = y->stride[1];
  float *o = tpr_tensor_data(out);
  const int nt = tpr__cpu_nt(ctx, (N + total) * H);
  // Token t's row of out is one thread's: its rows added in ascending expert order.
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < N; t++) {
    float *orow = o + t * H;
    memset(orow, 0, (size_t)H * sizeof *orow);
    for (int64_t e = 0; e < E; e++) {
      if (row[t * E + e] < 0) continue;
      const float *yr = yd + row[t * E + e] * ys0, w = weighted ? gate_at(g, gd, t, e) : 1.0f;
      if (weighted)
        for (int64_t j = 0; j < H; j++) orow[j] += w * yr[j * ys1];
      else
        for (int64_t j = 0; j < H; j++) orow[j] += yr[j * ys1];
    }
  }
  free(row);
  return TPR_OK;
}

TPR_CPU_KERNEL(moe_unpermute) { return sum_rows(ctx, "moe_unpermute", in[0], in[1], n_in, true, out); }
TPR_CPU_KERNEL(moe_permute_bwd) { return sum_rows(ctx, "moe_permute_bwd", in[0], in[1], n_in, false, out); }

// y (R, H), gates (N, E), dout (N, H); out packed (dy (R*H) | dgates (N*E)):
// dy[row(t, e)] = gates[t, e] * dout[t] (uncounted rows 0), dgates[t, e] =
// dout[t] . y[row(t, e)] (double accumulation) for nonzero gates, else 0.
TPR_CPU_KERNEL(moe_unpermute_bwd) {
  const tpr_tensor *y = in[0], *g = in[1], *dout = in[2];
  if (n_in != 3 || y->ndim != 2 || g->ndim != 2 || dout->ndim != 2 || dout->shape[0] != g->shape[0] ||
      dout->shape[1] != y->shape[1] || y->dtype != TPR_F32 || g->dtype != TPR_F32 || dout->dtype != TPR_F32 ||
      out->dtype != TPR_F32 || out->ndim != 1 ||
      out->shape[0] != y->shape[0] * y->shape[1] + g->shape[0] * g->shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_unpermute_bwd (cpu): y, gates, dout and out shapes do not fit");
  const int64_t N = g->shape[0], E = g->shape[1], R = y->shape[0], H = y->shape[1];
  const int64_t total = count_assignments(g);
  if (total > R)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_unpermute_bwd: %lld assignments (nonzero gates) need more rows than "
                    "y's R = %lld", (long long)total, (long long)R);
  const float *gd = tpr_tensor_data(g), *yd = tpr_tensor_data(y), *od = tpr_tensor_data(dout);
  const int64_t ys0 = y->stride[0], ys1 = y->stride[1], os0 = dout->stride[0], os1 = dout->stride[1];
  int64_t *row = number_rows(g);
  if (!row)
    return TPR_FAIL(TPR_ERR_OOM, "moe_unpermute_bwd (cpu): (%lld, %lld) row numbers", (long long)N, (long long)E);
  float *dy = tpr_tensor_data(out), *dg = dy + R * H;
  memset(dy, 0, (size_t)tpr_tensor_numel(out) * sizeof *dy);
  const int nt = tpr__cpu_nt(ctx, 2 * total * H);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < N; t++)
    for (int64_t e = 0; e < E; e++) {
      const float gate = gate_at(g, gd, t, e);
      if (row[t * E + e] < 0) continue;
      const float *yr = yd + row[t * E + e] * ys0, *orow = od + t * os0;
      float *dr = dy + row[t * E + e] * H;
      double dot = 0;
      for (int64_t j = 0; j < H; j++) {
        dr[j] = gate * orow[j * os1];
        dot += (double)orow[j * os1] * (double)yr[j * ys1];
      }
      dg[t * E + e] = (float)dot;
    }
  free(row);
  return TPR_OK;
}

const tpr__kernel_def tpr__moe_dispatch_cpu[] = {
    {TPR_OP_MOE_CAPACITY, cpu_moe_capacity},
    {TPR_OP_MOE_CAPACITY_BWD, cpu_moe_capacity_bwd},
    {TPR_OP_ROW_SLICE, cpu_row_slice},
    {TPR_OP_ROW_SLICE_BWD, cpu_row_slice_bwd},
    {TPR_OP_MOE_COUNTS, cpu_moe_counts},
    {TPR_OP_MOE_PERMUTE, cpu_moe_permute},
    {TPR_OP_MOE_UNPERMUTE, cpu_moe_unpermute},
    {TPR_OP_MOE_PERMUTE_BWD, cpu_moe_permute_bwd},
    {TPR_OP_MOE_UNPERMUTE_BWD, cpu_moe_unpermute_bwd},
    {0},
};
