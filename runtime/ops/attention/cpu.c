// KV-cache CPU kernels: causal GQA attention over a cache, the in-place
// cache write that fills it, and attention's backward kernel.
//
// The forward is flash.c's blocked kernel (online softmax over key
// tiles read in place, threaded over heads and query blocks, or split over
// the keys for a few queries): keys a query cannot see contribute nothing --
// not even NaN from an unwritten cache row, as long as it lies past start + T
// (only rows [0, start + T) are ever read).
//
// The backward follows transformers' eager path in f32 per query head and
// block of QBLOCK queries: scores = (q @ k^T) * scale (one sgemm, alpha =
// scale), softmax with the row max subtracted and the sum's reciprocal
// multiplied in (torch's CPU softmax), masked probabilities exactly 0, then
// the gradient sgemms; OpenBLAS threads each GEMM.
//
// Both also take the document form (ops.h: + lo (T) i32, packed training
// sequences): query t sees keys [lo[t], start + t]. The forward skips the keys
// before lo[t] as it skips those past start + t; the backward gives them
// probability exactly 0, so they get no gradient from t.
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"
#include "attention.h"

#include "runtime/ops/strided.h"

enum { QBLOCK = 128 };

bool tpr__fits_blasint(int64_t v) { return (int64_t)(blasint)v == v; }

// Rows [start, start + T) must lie in the cache's [0, S).
static tpr_status check_start(const char *op, const char *what, int64_t start, int64_t T, int64_t S) {
  if (start < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: start %lld is negative", op, (long long)start);
  if (start > S - T)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: start %lld + T %lld %s exceeds the cache's S = %lld rows", op,
                    (long long)start, (long long)T, what, (long long)S);
  return TPR_OK;
}

// The document form's lo (T) i32 (ops.h), read into (T) int64 the kernels
// index directly; NULL in *out without it. Each bound must lie in
// [0, start + t]: a query always sees its own key.
static tpr_status read_docs_lo(const char *op, const tpr_tensor *const *in, int n_in, int at,
                               const tpr_op_attrs *attrs, int64_t start, int64_t T, int64_t **out) {
  *out = NULL;
  const bool docs = attrs->n_i > 0 && attrs->i[0] != 0;
  if (n_in != at + docs)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s (cpu): expected %d inputs%s, got %d", op, at + docs,
                    docs ? " (document form)" : "", n_in);
  if (!docs) return TPR_OK;
  const tpr_tensor *lo = in[at];
  if (lo->dtype != TPR_I32 || lo->ndim != 1 || lo->shape[0] != T)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s (cpu): lo must be (T = %lld) i32", op, (long long)T);
  int64_t *v = malloc((size_t)(T > 0 ? T : 1) * sizeof *v);
  if (!v) return TPR_FAIL(TPR_ERR_OOM, "%s (cpu): lo", op);
  for (int64_t t = 0; t < T; t++) {
    v[t] = tpr__index_at(lo, t * lo->stride[0]);
    if (v[t] < 0 || v[t] > start + t) {
      tpr_status rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: lo[%lld] = %lld outside [0, start + %lld = %lld]: a query "
                               "must see its own key", op, (long long)t, (long long)v[t], (long long)t,
                               (long long)(start + t));
      free(v);
      return rc;
    }
  }
  *out = v;
  return TPR_OK;
}

// attention.h: a tensor's heads as sgemm operands, copied when its layout cannot be read in place.
tpr_status tpr__heads_view_init(const char *what, const tpr_tensor *t, int64_t rows, tpr__heads_view *v) {
  const int64_t NH = t->shape[1], D = t->shape[2], *s = t->stride;
  memset(v, 0, sizeof *v);
  if ((D <= 1 || s[2] == 1) && (rows <= 1 || s[0] >= D)) {
    v->base = tpr_tensor_data(t);
    v->hstride = s[1];
    v->ld = rows > 1 ? s[0] : (D > 1 ? D : 1);
  } else {
    v->scratch = malloc((size_t)(rows * NH * D) * sizeof(float));
    if (!v->scratch) return TPR_FAIL(TPR_ERR_OOM, "attention (cpu): scratch copy of %s", what);
    const int64_t shape[3] = {rows, NH, D}, cs[3] = {NH * D, D, 1};
    tpr__strided_copy(v->scratch, cs, tpr_tensor_data(t), s, 3, shape, sizeof(float));
    v->base = v->scratch;
    v->hstride = D;
    v->ld = NH * D;
  }
  if (!tpr__fits_blasint(v->ld)) {
    free(v->scratch);
    v->scratch = NULL;
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "attention (cpu): %s row stride exceeds the BLAS integer range", what);
  }
  return TPR_OK;
}

// p (L): softmax over the visible scores [a, n) (a < n), zeros elsewhere.
static void causal_softmax_row(float *p, int64_t a, int64_t n, int64_t L) {
  float m = p[a];
  for (int64_t i = a + 1; i < n; i++) m = p[i] > m ? p[i] : m;
  for (int64_t i = a; i < n; i++) p[i] = expf(p[i] - m);
  const float inv = 1.0f / tpr__sum8_f32(p + a, n - a);  // sum >= 1: the max gives exp(0)
  for (int64_t i = a; i < n; i++) p[i] *= inv;
  for (int64_t i = 0; i < a; i++) p[i] = 0.0f;
  for (int64_t i = n; i < L; i++) p[i] = 0.0f;
}

// q (T, Hq, D), k_cache/v_cache (S, Hkv, D), start (1) (document form: +
// lo (T)); out (T, Hq, D) contiguous. attrs->f[0] = scale.
TPR_CPU_KERNEL(attention) {
  if (n_in != 4 && n_in != 5)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention (cpu): expected 4 or 5 inputs, got %d", n_in);
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2], *st = in[3];
  if (q->dtype != TPR_F32 || k->dtype != TPR_F32 || v->dtype != TPR_F32 || out->dtype != TPR_F32 ||
      (st->dtype != TPR_I32 && st->dtype != TPR_I64))
    return TPR_FAIL(TPR_ERR_DTYPE, "attention (cpu): q %s, k %s, v %s, start %s, out %s; need f32 and i32/i64 start",
                    tpr_dtype_name(q->dtype), tpr_dtype_name(k->dtype), tpr_dtype_name(v->dtype),
                    tpr_dtype_name(st->dtype), tpr_dtype_name(out->dtype));
  if (!attrs || attrs->n_f < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention (cpu): missing scale f[0]");
  if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3 || tpr_tensor_numel(st) != 1 || !tpr_tensor_same_shape(q, out) ||
      !tpr_tensor_same_shape(k, v) || k->shape[2] != q->shape[2] || k->shape[1] < 1 || q->shape[1] % k->shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "attention (cpu): q, k_cache, v_cache, start and out shapes do not fit");
  const int64_t T = q->shape[0], Hq = q->shape[1], D = q->shape[2], S = k->shape[0], Hkv = k->shape[1];
  const int64_t start = tpr__index_at(st, 0);
  TPR_CHECK(check_start("attention", "queries", start, T, S));
  int64_t *lo = NULL;
  TPR_CHECK(read_docs_lo("attention", in, n_in, 4, attrs, start, T, &lo));
  float *o = tpr_tensor_data(out);
  const int64_t L = start + T;  // keys read: rows [0, L)
  const float scale = attrs->f[0];

  tpr__heads_view qv, kv, vv;
  tpr_status rc = TPR_OK;
  memset(&qv, 0, sizeof qv), memset(&kv, 0, sizeof kv), memset(&vv, 0, sizeof vv);
  if (T == 0 || Hq == 0 || D == 0) goto done;
  TPR_CHECK_GOTO(tpr__heads_view_init("q", q, T, &qv), rc, done);
  TPR_CHECK_GOTO(tpr__heads_view_init("k_cache", k, L, &kv), rc, done);
  TPR_CHECK_GOTO(tpr__heads_view_init("v_cache", v, L, &vv), rc, done);
  const tpr__kv_src ks = {.base = kv.base, .ld = kv.ld, .hs = kv.hstride};
  const tpr__kv_src vs = {.base = vv.base, .ld = vv.ld, .hs = vv.hstride};
  tpr__attn_run run = {.q = qv.base, .o = o, .lo = lo, .n = T, .start = start};
  const int n_threads = ctx ? ((const tpr_cpu_ctx *)ctx)->n_threads : 1;
  rc = tpr__attention_fwd(n_threads, "attention (cpu)", &run, 1, qv.ld, qv.hstride, &ks, &vs, NULL, 0, Hq, Hkv, D,
                          scale);
done:
  free(lo);
  free(qv.scratch), free(kv.scratch), free(vv.scratch);
  return rc;
}

// ---- Backward (training). Flash-attention style: the probabilities are
// recomputed block by block (one sgemm and a softmax per block; the forward's
// blocked kernel gives the same values to rounding), so no (T, S) matrix is
// kept between the passes. For query
// head h (KV head g = h / group) and a block of queries with P (tb, Lb):
//   dV_g += P^T dO,  dP = dO V_g^T,  dS = P * (dP - rowsum(P * dP)),
//   dQ = scale * dS K_g,  dK_g += scale * dS^T Q.
// Masked entries have P = 0, hence dS = 0: keys a query cannot see get
// nothing from it. dK/dV of a KV head sum its query heads in ascending order,
// then the query blocks in ascending order: a fixed order.

// dp (L) := p * (dp - sum(p * dp)) over the visible entries [a, n), the dot
// accumulated in double in index order; entries outside (masked keys, which
// the next sgemms still read) are set to exactly 0.
static void softmax_bwd_row(const float *p, float *dp, int64_t a, int64_t n, int64_t L) {
  double dot = 0;
  for (int64_t i = a; i < n; i++) dot += (double)p[i] * (double)dp[i];
  const float c = (float)dot;
  for (int64_t i = a; i < n; i++) dp[i] = p[i] * (dp[i] - c);
  for (int64_t i = 0; i < a; i++) dp[i] = 0.0f;
  for (int64_t i = n; i < L; i++) dp[i] = 0.0f;
}

// q (T, Hq, D), k/v (S, Hkv, D), start (1), dout (T, Hq, D) (document
// form: + lo (T)); out packed (dq (T*Hq*D) | dk (S*Hkv*D) | dv (S*Hkv*D))
// contiguous. attrs->f[0] = scale.
TPR_CPU_KERNEL(attention_bwd) {
  if (n_in != 5 && n_in != 6)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention_bwd (cpu): expected 5 or 6 inputs, got %d", n_in);
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2], *st = in[3], *dy = in[4];
  if (q->dtype != TPR_F32 || k->dtype != TPR_F32 || v->dtype != TPR_F32 || dy->dtype != TPR_F32 ||
      out->dtype != TPR_F32 || (st->dtype != TPR_I32 && st->dtype != TPR_I64))
    return TPR_FAIL(TPR_ERR_DTYPE, "attention_bwd (cpu): q, k, v, dout and out must be f32 and start i32/i64");
  if (!attrs || attrs->n_f < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention_bwd (cpu): missing scale f[0]");
  if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3 || tpr_tensor_numel(st) != 1 || !tpr_tensor_same_shape(q, dy) ||
      !tpr_tensor_same_shape(k, v) || k->shape[2] != q->shape[2] || k->shape[1] < 1 || q->shape[1] % k->shape[1] ||
      tpr_tensor_numel(out) != tpr_tensor_numel(q) + 2 * tpr_tensor_numel(k))
    return TPR_FAIL(TPR_ERR_SHAPE, "attention_bwd (cpu): q, k, v, start, dout and out shapes do not fit");
  const int64_t T = q->shape[0], Hq = q->shape[1], D = q->shape[2], S = k->shape[0], Hkv = k->shape[1];
  const int64_t start = tpr__index_at(st, 0);
  TPR_CHECK(check_start("attention_bwd", "queries", start, T, S));
  int64_t *lo = NULL;
  TPR_CHECK(read_docs_lo("attention_bwd", in, n_in, 5, attrs, start, T, &lo));
  float *dq = tpr_tensor_data(out), *dk = dq + T * Hq * D, *dv = dk + S * Hkv * D;
  // Rows of k/v past start + T - 1 are never read: their gradient is zero.
  memset(dq, 0, (size_t)tpr_tensor_numel(out) * sizeof *dq);
  const int64_t L = start + T, group = Hq / Hkv;
  const float scale = attrs->f[0];
  const blasint ldq = (blasint)(Hq * D), ldk = (blasint)(Hkv * D);

  tpr__heads_view qv, kv, vv, dyv;
  tpr_status rc = TPR_OK;
  float *p = NULL;
  memset(&qv, 0, sizeof qv), memset(&kv, 0, sizeof kv), memset(&vv, 0, sizeof vv), memset(&dyv, 0, sizeof dyv);
  if (T == 0 || Hq == 0 || D == 0) goto done;
  if (!tpr__fits_blasint(L) || !tpr__fits_blasint(Hq * D) || !tpr__fits_blasint(Hkv * D)) {
    rc = TPR_FAIL(TPR_ERR_UNSUPPORTED, "attention_bwd (cpu): sizes exceed the BLAS integer range");
    goto done;
  }
  TPR_CHECK_GOTO(tpr__heads_view_init("q", q, T, &qv), rc, done);
  TPR_CHECK_GOTO(tpr__heads_view_init("k", k, L, &kv), rc, done);
  TPR_CHECK_GOTO(tpr__heads_view_init("v", v, L, &vv), rc, done);
  TPR_CHECK_GOTO(tpr__heads_view_init("dout", dy, T, &dyv), rc, done);
  const int64_t tb_max = T < QBLOCK ? T : QBLOCK;
  p = malloc(2 * (size_t)(tb_max * L) * sizeof *p);  // (tb, Lb) probabilities, then (tb, Lb) dP / dS
  if (!p) {
    rc = TPR_FAIL(TPR_ERR_OOM, "attention_bwd (cpu): 2 x %lld x %lld scores", (long long)tb_max, (long long)L);
    goto done;
  }
  float *ds = p + tb_max * L;
  for (int64_t h = 0; h < Hq; h++) {
    const int64_t g = h / group;  // the forward's GQA mapping
    const float *qh = qv.base + h * qv.hstride, *dyh = dyv.base + h * dyv.hstride;
    const float *kg = kv.base + g * kv.hstride, *vg = vv.base + g * vv.hstride;
    float *dkg = dk + g * D, *dvg = dv + g * D;
    for (int64_t t0 = 0; t0 < T; t0 += QBLOCK) {
      const int64_t tb = T - t0 < QBLOCK ? T - t0 : QBLOCK;
      const int64_t Lb = start + t0 + tb;
      const float *qb = qh + t0 * qv.ld, *dyb = dyh + t0 * dyv.ld;
      // P: the forward's scores and softmax.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)tb, (blasint)Lb, (blasint)D, scale, qb,
                  (blasint)qv.ld, kg, (blasint)kv.ld, 0.0f, p, (blasint)Lb);
      for (int64_t i = 0; i < tb; i++) causal_softmax_row(p + i * Lb, lo ? lo[t0 + i] : 0, start + t0 + i + 1, Lb);
      // dV_g[0, Lb) += P^T dO (Lb, D)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)Lb, (blasint)D, (blasint)tb, 1.0f, p,
                  (blasint)Lb, dyb, (blasint)dyv.ld, 1.0f, dvg, ldk);
      // dP = dO V_g^T (tb, Lb), then dS in place
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)tb, (blasint)Lb, (blasint)D, 1.0f, dyb,
                  (blasint)dyv.ld, vg, (blasint)vv.ld, 0.0f, ds, (blasint)Lb);
      for (int64_t i = 0; i < tb; i++)
        softmax_bwd_row(p + i * Lb, ds + i * Lb, lo ? lo[t0 + i] : 0, start + t0 + i + 1, Lb);
      // dQ (tb, D) = scale * dS K_g; every query row is written by exactly one block
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)tb, (blasint)D, (blasint)Lb, scale, ds,
                  (blasint)Lb, kg, (blasint)kv.ld, 0.0f, dq + (t0 * Hq + h) * D, ldq);
      // dK_g[0, Lb) += scale * dS^T Q (Lb, D)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)Lb, (blasint)D, (blasint)tb, scale, ds,
                  (blasint)Lb, qb, (blasint)qv.ld, 1.0f, dkg, ldk);
    }
  }
done:
  free(p), free(lo);
  free(qv.scratch), free(kv.scratch), free(vv.scratch), free(dyv.scratch);
  return rc;
}

// cache (S, Hkv, D), new (T, Hkv, D) same dtype, start (1); writes
// cache[start + i] = new[i] in place; out (1) i32 = start + T.
TPR_CPU_KERNEL(cache_write) {
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "cache_write (cpu): expected 3 inputs, got %d", n_in);
  const tpr_tensor *cache = in[0], *nw = in[1], *st = in[2];
  if (nw->dtype != cache->dtype || out->dtype != TPR_I32 || (st->dtype != TPR_I32 && st->dtype != TPR_I64))
    return TPR_FAIL(TPR_ERR_DTYPE, "cache_write (cpu): cache %s, new %s, start %s, out %s",
                    tpr_dtype_name(cache->dtype), tpr_dtype_name(nw->dtype), tpr_dtype_name(st->dtype),
                    tpr_dtype_name(out->dtype));
  if (cache->ndim != 3 || nw->ndim != 3 || nw->shape[1] != cache->shape[1] || nw->shape[2] != cache->shape[2] ||
      tpr_tensor_numel(st) != 1 || tpr_tensor_numel(out) != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "cache_write (cpu): cache, new, start and out shapes do not fit");
  const int64_t T = nw->shape[0], S = cache->shape[0], start = tpr__index_at(st, 0);
  TPR_CHECK(check_start("cache_write", "new rows", start, T, S));
  if (start + T > INT32_MAX)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "cache_write: end position %lld does not fit the i32 token",
                    (long long)(start + T));
  // The one op that writes an input: the handle is const, its storage is not
  // (see ops.h); a bound param keeps these rows for the next run.
  const size_t esz = tpr_dtype_size(cache->dtype);
  char *dst = (char *)tpr_tensor_data(cache) + start * cache->stride[0] * (int64_t)esz;
  tpr__strided_copy(dst, cache->stride, tpr_tensor_data(nw), nw->stride, 3, nw->shape, esz);
  const int32_t end = (int32_t)(start + T);
  memcpy(tpr_tensor_data(out), &end, sizeof end);
  return TPR_OK;
}

const tpr__kernel_def tpr__attention_cpu[] = {
    {TPR_OP_ATTENTION, cpu_attention},
    {TPR_OP_ATTENTION_BWD, cpu_attention_bwd},
    {TPR_OP_CACHE_WRITE, cpu_cache_write},
    {0},
};
