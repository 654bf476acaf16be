// Shape rules of the MiniMax-M2 router (sigmoid scores, biased top-k,
// ops.h) and its backward.
#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

static tpr_status infer_router_sigmoid_topk(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *lg = in[0], *bias = in[1];
  TPR_CHECK(tpr__need_dtype("router_sigmoid_topk", lg, TPR_F32, "logits"));
  TPR_CHECK(tpr__need_dtype("router_sigmoid_topk", bias, TPR_F32, "bias"));
  TPR_CHECK(tpr__need_ndim("router_sigmoid_topk", lg, 2, "logits", "(T, E)"));
  int64_t E = lg->shape[1];
  if (bias->ndim != 1 || bias->shape[0] != E)
    return TPR_FAIL(TPR_ERR_SHAPE, "router_sigmoid_topk: bias must be (E) = (%lld), got %d-D with first dim %lld",
                    (long long)E, bias->ndim, (long long)(bias->ndim ? bias->shape[0] : 0));
  if (at->n_i < 1 || at->i[0] < 1 || at->i[0] > E)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "router_sigmoid_topk: k = %lld must be in [1, E = %lld]",
                    (long long)(at->n_i < 1 ? 0 : at->i[0]), (long long)E);
  tpr__set_contiguous(out, TPR_F32, 2, lg->shape);
  return TPR_OK;
}

TPR__OP_RULE(router_sigmoid_topk_bwd) {
  const char *op = "router_sigmoid_topk_bwd";
  tpr_tensor y;
  TPR_CHECK(tpr__need_forward(op, TPR_OP_ROUTER_SIGMOID_TOPK, in, 2, attrs, &y));
  TPR_CHECK(tpr__need_like(op, in[2], &y, "dy"));
  tpr__set_contiguous(out, TPR_F32, 2, y.shape);
  return TPR_OK;
}

const tpr__op_def tpr__router_ops[] = {
    {TPR_OP_ROUTER_SIGMOID_TOPK, "router_sigmoid_topk", 2, false, infer_router_sigmoid_topk},
    {TPR_OP_ROUTER_SIGMOID_TOPK_BWD, "router_sigmoid_topk_bwd", 3, false, infer_router_sigmoid_topk_bwd},
    {0},
};
