// Shape rules of cast (a converting strided copy), the view ops reshape,
// permute and slice (no kernel: their geometry is the tensor views', in
// runtime/tensor.c), and slice's backward (ops.h).
#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

static tpr_status infer_cast(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  if (at->n_i < 1 || !tpr_dtype_valid((tpr_dtype)at->i[0]))
    return TPR_FAIL(TPR_ERR_DTYPE, "cast: missing or invalid destination dtype");
  tpr__set_contiguous(out, (tpr_dtype)at->i[0], in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

static tpr_status infer_reshape(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return tpr__view_reshape(in[0], at->n_i, at->i, out);
}

static tpr_status infer_permute(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  if (at->n_i != in[0]->ndim)
    return TPR_FAIL(TPR_ERR_SHAPE, "permute: %d axes given for a %d-d tensor", at->n_i, in[0]->ndim);
  int perm[TPR_MAX_DIMS];
  for (int i = 0; i < at->n_i; i++) perm[i] = (int)at->i[i];
  return tpr__view_permute(in[0], perm, out);
}

static tpr_status infer_slice(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  if (at->n_i != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "slice: needs (dim, start, len)");
  return tpr__view_slice(in[0], (int)at->i[0], at->i[1], at->i[2], out);
}

// in (dy); i[0] dim, i[1] start, i[2] full len; out dy's shape with the full len at dim.
TPR__OP_RULE(slice_bwd) {
  const tpr_tensor *dy = in[0];
  TPR_CHECK(tpr__need_dtype("slice_bwd", dy, TPR_F32, "dy"));
  if (attrs->n_i < 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "slice_bwd: needs (dim, start, full len) attributes");
  int64_t dim = attrs->i[0], start = attrs->i[1], full = attrs->i[2];
  if (dim < 0 || dim >= dy->ndim)
    return TPR_FAIL(TPR_ERR_SHAPE, "slice_bwd: dim %lld outside a %d-d dy", (long long)dim, dy->ndim);
  if (start < 0 || full < 0 || start > full - dy->shape[dim])
    return TPR_FAIL(TPR_ERR_SHAPE, "slice_bwd: dy's %lld rows at start %lld do not fit in the full length %lld",
                    (long long)dy->shape[dim], (long long)start, (long long)full);
  tpr__set_dim(out, TPR_F32, dy, (int)dim, full);
  return TPR_OK;
}

const tpr__op_def tpr__copy_ops[] = {
    {TPR_OP_CAST, "cast", 1, false, infer_cast},
    {TPR_OP_RESHAPE, "reshape", 1, true, infer_reshape},
    {TPR_OP_PERMUTE, "permute", 1, true, infer_permute},
    {TPR_OP_SLICE, "slice", 1, true, infer_slice},
    {TPR_OP_SLICE_BWD, "slice_bwd", 1, false, infer_slice_bwd},
    {0},
};
