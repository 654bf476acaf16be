// Shape rule of matmul (ops.h), plain and FP8 forms.
#include <string.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

static tpr_status infer_matmul(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *a = in[0], *b = in[1];
  int block = tpr__fp8_block_attr(TPR_OP_MATMUL, at);
  if (block > 0) {  // a @ (w * scale)^T: the weight is b, read transposed
    TPR_CHECK(tpr__need_dtype("matmul", a, TPR_F32, "a"));
    TPR_CHECK(tpr__need_fp8_weight("matmul", b, in[2], block, "b"));
    if (b->ndim != 2 || !(at->n_i > 1 && at->i[1]) || (at->n_i > 0 && at->i[0]))
      return TPR_FAIL(TPR_ERR_SHAPE, "matmul: an FP8 b must be a 2-D weight read transposed (trans_b), a untransposed");
  } else {
    TPR_CHECK(tpr__need_weight_dtype("matmul", a, "a"));
    TPR_CHECK(tpr__need_weight_dtype("matmul", b, "b"));
  }
  if (a->ndim < 2 || b->ndim < 2)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul: a and b need >= 2 dims, got %d and %d", a->ndim, b->ndim);
  if (b->ndim != 2 && b->ndim != a->ndim)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul: b must be 2-D or have a's %d dims, got %d", a->ndim, b->ndim);
  bool ta = at->n_i > 0 && at->i[0], tb = at->n_i > 1 && at->i[1];
  int na = a->ndim, nb = b->ndim;
  int64_t m = ta ? a->shape[na - 1] : a->shape[na - 2], k = ta ? a->shape[na - 2] : a->shape[na - 1];
  int64_t kb = tb ? b->shape[nb - 1] : b->shape[nb - 2], n = tb ? b->shape[nb - 2] : b->shape[nb - 1];
  if (k != kb)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul: inner dims differ (a gives K=%lld, b gives K=%lld; trans_a=%d trans_b=%d)",
                    (long long)k, (long long)kb, ta, tb);
  for (int i = 0; nb > 2 && i < na - 2; i++)
    if (a->shape[i] != b->shape[i])
      return TPR_FAIL(TPR_ERR_SHAPE, "matmul: batch dim %d differs (%lld vs %lld)", i, (long long)a->shape[i],
                      (long long)b->shape[i]);
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, a->shape, sizeof shape);
  shape[na - 2] = m;
  shape[na - 1] = n;
  tpr__set_contiguous(out, TPR_F32, na, shape);
  return TPR_OK;
}

const tpr__op_def tpr__matmul_ops[] = {
    {TPR_OP_MATMUL, "matmul", 2, false, infer_matmul},
    {0},
};
