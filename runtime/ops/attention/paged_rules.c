// Shape rules of the paged KV cache ops (ops.h, "Batched inference";
// semantics at tpr_pb_paged_cache_write / tpr_pb_paged_attention in
// program.h). Index values are run-time data: the kernels check them.
#include <math.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// A (T) i32 index vector matching the T tokens.
static tpr_status need_token_index(const char *op, const tpr_tensor *t, const char *which, int64_t T) {
  TPR_CHECK(tpr__need_dtype(op, t, TPR_I32, which));
  if (t->ndim != 1 || t->shape[0] != T)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must be (T) = (%lld), one per token, got %d-D with first dim %lld", op,
                    which, (long long)T, t->ndim, (long long)(t->ndim ? t->shape[0] : 0));
  return TPR_OK;
}

// A pool (NB, bs, Hkv, D) f32 with bs >= 1 and Hkv >= 1.
static tpr_status need_pool(const char *op, const tpr_tensor *pool, const char *which) {
  TPR_CHECK(tpr__need_dtype(op, pool, TPR_F32, which));
  TPR_CHECK(tpr__need_ndim(op, pool, 4, which, "(NB, bs, Hkv, D)"));
  if (pool->shape[1] < 1 || pool->shape[2] < 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s has block size bs = %lld and Hkv = %lld; both must be >= 1", op, which,
                    (long long)pool->shape[1], (long long)pool->shape[2]);
  return TPR_OK;
}

// pool (NB, bs, Hkv, D) f32, new (T, Hkv, D) f32, slot_mapping (T) i32 -> (1) i32.
TPR__OP_RULE(paged_cache_write) {
  const char *op = "paged_cache_write";
  const tpr_tensor *pool = in[0], *nw = in[1];
  (void)attrs;
  TPR_CHECK(need_pool(op, pool, "pool"));
  TPR_CHECK(tpr__need_dtype(op, nw, TPR_F32, "new"));
  TPR_CHECK(tpr__need_ndim(op, nw, 3, "new", "(T, Hkv, D)"));
  if (nw->shape[1] != pool->shape[2] || nw->shape[2] != pool->shape[3])
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: new is (%lld, %lld, %lld); expected (T, Hkv = %lld, D = %lld) as the pool",
                    op, (long long)nw->shape[0], (long long)nw->shape[1], (long long)nw->shape[2],
                    (long long)pool->shape[2], (long long)pool->shape[3]);
  TPR_CHECK(need_token_index(op, in[2], "slot_mapping", nw->shape[0]));
  tpr__set_contiguous(out, TPR_I32, 1, (const int64_t[]){1});
  return TPR_OK;
}

// q (T, Hq, D) f32, k_pool/v_pool (NB, bs, Hkv, D) f32, block_tables (B, MB)
// i32, seq (T) i32, positions (T) i32; f[0] scale -> (T, Hq, D) f32.
TPR__OP_RULE(paged_attention) {
  const char *op = "paged_attention";
  const tpr_tensor *q = in[0], *kp = in[1], *vp = in[2], *bt = in[3];
  TPR_CHECK(tpr__need_dtype(op, q, TPR_F32, "q"));
  TPR_CHECK(tpr__need_ndim(op, q, 3, "q", "(T, Hq, D)"));
  TPR_CHECK(need_pool(op, kp, "k_pool"));
  TPR_CHECK(need_pool(op, vp, "v_pool"));
  const int64_t T = q->shape[0], hq = q->shape[1], D = q->shape[2], hkv = kp->shape[2];
  if (!tpr_tensor_same_shape(kp, vp))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: k_pool (%lld, %lld, %lld, %lld) and v_pool (%lld, %lld, %lld, %lld) differ",
                    op, (long long)kp->shape[0], (long long)kp->shape[1], (long long)kp->shape[2],
                    (long long)kp->shape[3], (long long)vp->shape[0], (long long)vp->shape[1],
                    (long long)vp->shape[2], (long long)vp->shape[3]);
  if (kp->shape[3] != D)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: the pools' head dim %lld differs from q's D = %lld", op,
                    (long long)kp->shape[3], (long long)D);
  if (hq % hkv)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: Hq = %lld query heads is not a multiple of Hkv = %lld", op, (long long)hq,
                    (long long)hkv);
  TPR_CHECK(tpr__need_dtype(op, bt, TPR_I32, "block_tables"));
  TPR_CHECK(tpr__need_ndim(op, bt, 2, "block_tables", "(B, MB)"));
  TPR_CHECK(need_token_index(op, in[4], "seq", T));
  TPR_CHECK(need_token_index(op, in[5], "positions", T));
  if (attrs->n_f < 1 || !isfinite(attrs->f[0]))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs a finite f[0] scale", op);
  tpr__set_contiguous(out, TPR_F32, 3, q->shape);
  return TPR_OK;
}

const tpr__op_def tpr__paged_attention_ops[] = {
    {TPR_OP_PAGED_CACHE_WRITE, "paged_cache_write", 3, false, infer_paged_cache_write},
    {TPR_OP_PAGED_ATTENTION, "paged_attention", 6, false, infer_paged_attention},
    {0},
};
