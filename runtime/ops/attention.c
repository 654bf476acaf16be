// KV-cache CPU kernels: causal GQA attention over a cache, and the in-place
// cache write that fills it.
//
// Attention follows transformers' eager path in f32: scores = (q @ k^T) *
// scale (one sgemm per query head and block of queries, alpha = scale, which
// BLAS applies to the finished dot product as torch does), masked entries
// removed, softmax with the row max subtracted and the sum's reciprocal
// multiplied in (torch's CPU softmax), then p @ v (a second sgemm). Masked
// scores are set to exactly 0 before p @ v, so keys a query cannot see
// contribute nothing -- not even NaN from an unwritten cache row, as long as
// it lies past start + T (only rows [0, start + T) are ever read).
//
// Queries go in blocks of QBLOCK rows; each block reads only the keys its
// last query may see, which bounds the score scratch to QBLOCK x (start + T)
// and skips most of the masked upper triangle in a long prefill. Heads run
// one after another; OpenBLAS threads each GEMM.
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "strided.h"

enum { QBLOCK = 128 };

static bool fits_blasint(int64_t v) { return (int64_t)(blasint)v == v; }

static int64_t load_index(const tpr_tensor *t) {  // element 0 of an i32/i64 tensor
  const void *p = tpr_tensor_data(t);
  if (t->dtype == TPR_I32) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, p, 8);
  return v;
}

// Rows [start, start + T) must lie in the cache's [0, S).
static tpr_status check_start(const char *op, const char *what, int64_t start, int64_t T, int64_t S) {
  if (start < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: start %lld is negative", op, (long long)start);
  if (start > S - T)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: start %lld + T %lld %s exceeds the cache's S = %lld rows", op,
                    (long long)start, (long long)T, what, (long long)S);
  return TPR_OK;
}

// The first `rows` rows of a (rows', heads, D) tensor, read per head as a
// row-major (rows, D) matrix at base + h * hstride with leading dim ld. A
// tensor whose D stride is not 1 (or whose rows overlap) is first copied into
// a contiguous scratch, which the caller frees.
typedef struct heads_view {
  const float *base;
  int64_t hstride, ld;
  float *scratch;
} heads_view;

static tpr_status heads_view_init(const char *what, const tpr_tensor *t, int64_t rows, heads_view *v) {
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
  if (!fits_blasint(v->ld)) {
    free(v->scratch);
    v->scratch = NULL;
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "attention (cpu): %s row stride exceeds the BLAS integer range", what);
  }
  return TPR_OK;
}

// Eight interleaved partial sums: a fixed order (see norm.c).
static float sum_f32(const float *x, int64_t n) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) acc[l] += x[i + l];
  for (int l = 0; i < n; i++, l++) acc[l] += x[i];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// p (L): softmax over the n >= 1 visible scores, zeros after them.
static void causal_softmax_row(float *p, int64_t n, int64_t L) {
  float m = p[0];
  for (int64_t i = 1; i < n; i++) m = p[i] > m ? p[i] : m;
  for (int64_t i = 0; i < n; i++) p[i] = expf(p[i] - m);
  const float inv = 1.0f / sum_f32(p, n);  // sum >= 1: the max gives exp(0)
  for (int64_t i = 0; i < n; i++) p[i] *= inv;
  for (int64_t i = n; i < L; i++) p[i] = 0.0f;
}

// q (T, Hq, D), k_cache/v_cache (S, Hkv, D), start (1); out (T, Hq, D)
// contiguous. attrs->f[0] = scale.
TPR_CPU_KERNEL(attention) {
  if (n_in != 4) return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention (cpu): expected 4 inputs, got %d", n_in);
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
  const int64_t start = load_index(st);
  TPR_CHECK(check_start("attention", "queries", start, T, S));
  float *o = tpr_tensor_data(out);
  if (T == 0 || Hq == 0) return TPR_OK;
  const int64_t L = start + T, group = Hq / Hkv;  // keys read: rows [0, L)
  if (D == 0) return TPR_OK;
  if (!fits_blasint(L) || !fits_blasint(Hq * D))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "attention (cpu): sizes exceed the BLAS integer range");
  const float scale = attrs->f[0];

  heads_view qv, kv, vv;
  tpr_status rc = TPR_OK;
  float *p = NULL;
  memset(&kv, 0, sizeof kv), memset(&vv, 0, sizeof vv);
  TPR_CHECK(heads_view_init("q", q, T, &qv));
  TPR_CHECK_GOTO(heads_view_init("k_cache", k, L, &kv), rc, done);
  TPR_CHECK_GOTO(heads_view_init("v_cache", v, L, &vv), rc, done);
  const int64_t tb_max = T < QBLOCK ? T : QBLOCK;
  p = malloc((size_t)(tb_max * L) * sizeof *p);  // (tb, Lb) scores, then probabilities
  if (!p) {
    rc = TPR_FAIL(TPR_ERR_OOM, "attention (cpu): %lld x %lld scores", (long long)tb_max, (long long)L);
    goto done;
  }
  for (int64_t h = 0; h < Hq; h++) {
    const int64_t g = h / group;  // GQA: consecutive query heads share a KV head
    const float *qh = qv.base + h * qv.hstride, *kg = kv.base + g * kv.hstride, *vg = vv.base + g * vv.hstride;
    for (int64_t t0 = 0; t0 < T; t0 += QBLOCK) {
      const int64_t tb = T - t0 < QBLOCK ? T - t0 : QBLOCK;
      const int64_t Lb = start + t0 + tb;  // the block's last query sees rows [0, Lb)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)tb, (blasint)Lb, (blasint)D, scale,
                  qh + t0 * qv.ld, (blasint)qv.ld, kg, (blasint)kv.ld, 0.0f, p, (blasint)Lb);
      for (int64_t i = 0; i < tb; i++) causal_softmax_row(p + i * Lb, start + t0 + i + 1, Lb);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)tb, (blasint)D, (blasint)Lb, 1.0f, p,
                  (blasint)Lb, vg, (blasint)vv.ld, 0.0f, o + (t0 * Hq + h) * D, (blasint)(Hq * D));
    }
  }
done:
  free(p);
  free(qv.scratch), free(kv.scratch), free(vv.scratch);
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
  const int64_t T = nw->shape[0], S = cache->shape[0], start = load_index(st);
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
