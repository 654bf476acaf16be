// Shape rules of softmax and softmax_bwd (ops.h).
#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

static tpr_status infer_softmax(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  TPR_CHECK(tpr__need_dtype("softmax", in[0], TPR_F32, "x"));
  if (in[0]->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "softmax: x needs >= 1 dim");
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

// in (y (..., N), dy (..., N)); out dx (..., N).
TPR__OP_RULE(softmax_bwd) {
  TPR_CHECK(tpr__need_dtype("softmax_bwd", in[0], TPR_F32, "y"));
  TPR_CHECK(tpr__need_dtype("softmax_bwd", in[1], TPR_F32, "dy"));
  if (in[0]->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "softmax_bwd: y needs >= 1 dim");
  TPR_CHECK(tpr__need_same_shape("softmax_bwd", in[0], "y", in[1], "dy"));
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

const tpr__op_def tpr__softmax_ops[] = {
    {TPR_OP_SOFTMAX, "softmax", 1, false, infer_softmax},
    {TPR_OP_SOFTMAX_BWD, "softmax_bwd", 2, false, infer_softmax_bwd},
    {0},
};
