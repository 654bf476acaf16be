// Shape rules of attention over a KV cache, the cache write that fills it,
// and attention's backward (ops.h). The backward checks what the forward
// checks, naming itself, plus the cotangent's shape.
#include <math.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// Shared by attention (k, v) and cache_write (cache, new): a (rows, Hkv, D) tensor.
static tpr_status need_heads(const char *op, const tpr_tensor *t, const char *which, int64_t hkv, int64_t D) {
  TPR_CHECK(tpr__need_ndim(op, t, 3, which, "(rows, Hkv, D)"));
  if (t->shape[1] != hkv || t->shape[2] != D)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s is (%lld, %lld, %lld); expected (rows, Hkv = %lld, D = %lld)", op, which,
                    (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2], (long long)hkv,
                    (long long)D);
  return TPR_OK;
}

// The document form's lo (T) i32 (ops.h), when i[0] asks for it. Its values
// (0 <= lo[t] <= start + t) are data: the kernels check them at run time.
static tpr_status need_docs_lo(const char *op, const tpr_tensor *const *in, int at, const tpr_op_attrs *attrs,
                               int64_t T) {
  if (attrs->n_i > 0 && attrs->i[0] != 0 && attrs->i[0] != 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: i[0] = %lld; the document flag is 0 or 1", op, (long long)attrs->i[0]);
  if (attrs->n_i < 1 || attrs->i[0] == 0) return TPR_OK;
  const tpr_tensor *lo = in[at];
  TPR_CHECK(tpr__need_dtype(op, lo, TPR_I32, "lo"));
  if (lo->ndim != 1 || lo->shape[0] != T) {
    char got[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: lo must be (T = %lld) i32, got %s", op, (long long)T,
                    tpr_tensor_describe(lo, got, sizeof got));
  }
  return TPR_OK;
}

static tpr_status infer_attention(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2];
  TPR_CHECK(tpr__need_dtype("attention", q, TPR_F32, "q"));
  TPR_CHECK(tpr__need_dtype("attention", k, TPR_F32, "k_cache"));
  TPR_CHECK(tpr__need_dtype("attention", v, TPR_F32, "v_cache"));
  TPR_CHECK(tpr__need_scalar_index("attention", in[3], "start"));
  TPR_CHECK(tpr__need_ndim("attention", q, 3, "q", "(T, Hq, D)"));
  TPR_CHECK(tpr__need_ndim("attention", k, 3, "k_cache", "(S, Hkv, D)"));
  int64_t hq = q->shape[1], hkv = k->shape[1], D = q->shape[2];
  TPR_CHECK(need_heads("attention", k, "k_cache", hkv, D));
  TPR_CHECK(need_heads("attention", v, "v_cache", hkv, D));
  if (v->shape[0] != k->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "attention: k_cache has %lld rows, v_cache %lld", (long long)k->shape[0],
                    (long long)v->shape[0]);
  if (hkv < 1 || hq % hkv)
    return TPR_FAIL(TPR_ERR_SHAPE, "attention: Hq = %lld query heads is not a multiple of Hkv = %lld", (long long)hq,
                    (long long)hkv);
  if (q->shape[0] > k->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "attention: T = %lld queries exceed the cache's S = %lld rows",
                    (long long)q->shape[0], (long long)k->shape[0]);
  if (at->n_f < 1 || !isfinite(at->f[0]))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention: needs a finite f[0] scale");
  TPR_CHECK(need_docs_lo("attention", in, 4, at, q->shape[0]));
  tpr__set_contiguous(out, TPR_F32, 3, q->shape);
  return TPR_OK;
}

static tpr_status infer_cache_write(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *cache = in[0], *nw = in[1];
  TPR_CHECK(tpr__need_scalar_index("cache_write", in[2], "start"));
  TPR_CHECK(tpr__need_ndim("cache_write", cache, 3, "cache", "(S, Hkv, D)"));
  TPR_CHECK(need_heads("cache_write", nw, "new", cache->shape[1], cache->shape[2]));
  if (nw->dtype != cache->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "cache_write: new is %s but the cache is %s", tpr_dtype_name(nw->dtype),
                    tpr_dtype_name(cache->dtype));
  if (nw->shape[0] > cache->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "cache_write: T = %lld new rows exceed the cache's S = %lld rows",
                    (long long)nw->shape[0], (long long)cache->shape[0]);
  tpr__set_contiguous(out, TPR_I32, 1, (const int64_t[]){1});
  return TPR_OK;
}

// q (T, Hq, D), k/v (S, Hkv, D) f32, start (1) i32/i64, dout (T, Hq, D) f32
// (document form: + lo (T) i32); f[0] scale -> packed (T*Hq*D + 2*S*Hkv*D) f32.
TPR__OP_RULE(attention_bwd) {
  const char *op = "attention_bwd";
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2], *dy = in[4];
  TPR_CHECK(tpr__need_dtype(op, q, TPR_F32, "q"));
  TPR_CHECK(tpr__need_dtype(op, k, TPR_F32, "k"));
  TPR_CHECK(tpr__need_dtype(op, v, TPR_F32, "v"));
  TPR_CHECK(tpr__need_dtype(op, dy, TPR_F32, "dout"));
  TPR_CHECK(tpr__need_scalar_index(op, in[3], "start"));
  TPR_CHECK(tpr__need_ndim(op, q, 3, "q", "(T, Hq, D)"));
  TPR_CHECK(tpr__need_ndim(op, k, 3, "k", "(S, Hkv, D)"));
  TPR_CHECK(tpr__need_ndim(op, v, 3, "v", "(S, Hkv, D)"));
  const int64_t T = q->shape[0], hq = q->shape[1], D = q->shape[2], S = k->shape[0], hkv = k->shape[1];
  if (k->shape[2] != D || !tpr_tensor_same_shape(k, v))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: k (%lld, %lld, %lld) and v (%lld, %lld, %lld) must both be (S, Hkv, D = %lld)",
                    op, (long long)S, (long long)hkv, (long long)k->shape[2], (long long)v->shape[0],
                    (long long)v->shape[1], (long long)v->shape[2], (long long)D);
  if (hkv < 1 || hq % hkv)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: Hq = %lld query heads is not a multiple of Hkv = %lld", op, (long long)hq,
                    (long long)hkv);
  if (T > S)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: T = %lld queries exceed the S = %lld key rows", op, (long long)T,
                    (long long)S);
  if (!tpr_tensor_same_shape(dy, q)) {
    char got[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: dout must have q's shape (%lld, %lld, %lld), got %s", op, (long long)T,
                    (long long)hq, (long long)D, tpr_tensor_describe(dy, got, sizeof got));
  }
  if (attrs->n_f < 1 || !isfinite(attrs->f[0]))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs a finite f[0] scale", op);
  TPR_CHECK(need_docs_lo(op, in, 5, attrs, T));
  const int64_t n = T * hq * D + 2 * S * hkv * D;  // dq | dk | dv
  tpr__set_contiguous(out, TPR_F32, 1, &n);
  return TPR_OK;
}

const tpr__op_def tpr__attention_ops[] = {
    {TPR_OP_ATTENTION, "attention", 4, false, infer_attention},
    {TPR_OP_CACHE_WRITE, "cache_write", 3, false, infer_cache_write},
    {TPR_OP_ATTENTION_BWD, "attention_bwd", 5, false, infer_attention_bwd},
    {0},
};
