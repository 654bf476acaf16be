// Shape rules of the elementwise ops (ops.h): add and mul (numpy
// broadcasting), swiglu, sigmoid and their backwards.
#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

static tpr_status infer_broadcast(const char *op, const tpr_tensor *const *in, tpr_tensor *out) {
  const tpr_tensor *a = in[0], *b = in[1];
  TPR_CHECK(tpr__need_dtype(op, a, TPR_F32, "a"));
  TPR_CHECK(tpr__need_dtype(op, b, TPR_F32, "b"));
  int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
  int64_t shape[TPR_MAX_DIMS];
  for (int i = 0; i < nd; i++) {
    int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return TPR_FAIL(TPR_ERR_SHAPE, "%s: dims %lld and %lld do not broadcast (output dim %d)", op, (long long)da,
                      (long long)db, i);
    shape[i] = da == 1 ? db : da;
  }
  tpr__set_contiguous(out, TPR_F32, nd, shape);
  return TPR_OK;
}

static tpr_status infer_add(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return infer_broadcast("add", in, out);
}

static tpr_status infer_mul(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return infer_broadcast("mul", in, out);
}

static tpr_status infer_swiglu(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  TPR_CHECK(tpr__need_dtype("swiglu", in[0], TPR_F32, "gate"));
  TPR_CHECK(tpr__need_dtype("swiglu", in[1], TPR_F32, "up"));
  if (!tpr_tensor_same_shape(in[0], in[1])) return TPR_FAIL(TPR_ERR_SHAPE, "swiglu: gate and up differ in shape");
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

// in (gate, up, dy) same shape; out packed (dgate | dup).
TPR__OP_RULE(swiglu_bwd) {
  const char *op = "swiglu_bwd";
  TPR_CHECK(tpr__need_dtype(op, in[0], TPR_F32, "gate"));
  TPR_CHECK(tpr__need_dtype(op, in[1], TPR_F32, "up"));
  TPR_CHECK(tpr__need_dtype(op, in[2], TPR_F32, "dy"));
  TPR_CHECK(tpr__need_same_shape(op, in[0], "gate", in[1], "up"));
  TPR_CHECK(tpr__need_same_shape(op, in[0], "gate", in[2], "dy"));
  tpr__set_packed(out, 2 * tpr_tensor_numel(in[0]));
  return TPR_OK;
}

// x (...) f32 -> (...).
TPR__OP_RULE(sigmoid) {
  TPR_CHECK(tpr__need_dtype("sigmoid", in[0], TPR_F32, "x"));
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

// in (x, dy) same shape -> dx (...).
TPR__OP_RULE(sigmoid_bwd) {
  const char *op = "sigmoid_bwd";
  TPR_CHECK(tpr__need_dtype(op, in[0], TPR_F32, "x"));
  TPR_CHECK(tpr__need_dtype(op, in[1], TPR_F32, "dy"));
  TPR_CHECK(tpr__need_same_shape(op, in[0], "x", in[1], "dy"));
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

const tpr__op_def tpr__elementwise_ops[] = {
    {TPR_OP_ADD, "add", 2, false, infer_add},
    {TPR_OP_MUL, "mul", 2, false, infer_mul},
    {TPR_OP_SWIGLU, "swiglu", 2, false, infer_swiglu},
    {TPR_OP_SWIGLU_BWD, "swiglu_bwd", 3, false, infer_swiglu_bwd},
    {TPR_OP_SIGMOID, "sigmoid", 1, false, infer_sigmoid},
    {TPR_OP_SIGMOID_BWD, "sigmoid_bwd", 2, false, infer_sigmoid_bwd},
    {0},
};
