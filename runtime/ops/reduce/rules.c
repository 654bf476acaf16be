// Shape rules of the small ops every backward needs (ops.h, "Training"):
// sum_to (the reverse of broadcasting), scale and fill.
#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

TPR__OP_RULE(sum_to) {
  const tpr_tensor *x = in[0];
  TPR_CHECK(tpr__need_dtype("sum_to", x, TPR_F32, "x"));
  int nd = attrs->n_i;
  if (nd > x->ndim) return TPR_FAIL(TPR_ERR_SHAPE, "sum_to: target has %d dims, x only %d", nd, x->ndim);
  int64_t shape[TPR_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    int64_t want = attrs->i[d], have = x->shape[d + x->ndim - nd];
    if (want != have && want != 1)
      return TPR_FAIL(TPR_ERR_SHAPE, "sum_to: dim %d of x is %lld, target %lld (x must broadcast to the target)",
                      d + x->ndim - nd, (long long)have, (long long)want);
    shape[d] = want;
  }
  tpr__set_contiguous(out, TPR_F32, nd, shape);
  return TPR_OK;
}

TPR__OP_RULE(scale) {
  TPR_CHECK(tpr__need_dtype("scale", in[0], TPR_F32, "x"));
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

TPR__OP_RULE(fill) {
  if (attrs->n_f < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "fill: needs the value attribute");
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

const tpr__op_def tpr__reduce_ops[] = {
    {TPR_OP_SUM_TO, "sum_to", 1, false, infer_sum_to},
    {TPR_OP_SCALE, "scale", 1, false, infer_scale},
    {TPR_OP_FILL, "fill", 1, false, infer_fill},
    {0},
};
