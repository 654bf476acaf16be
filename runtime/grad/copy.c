// Backward rules of cast and of the view ops (reshape, permute, slice;
// ops.h): the views copy nothing forward, and their backward moves the
// cotangent back into the input's geometry -- a view again where it can be
// (reshape, permute), a zero-padded copy for slice (slice_bwd).
#include "grad.h"

// Backward of cast. Cotangents are f32 whatever the value's dtype (autodiff.h),
// so a cast between float types hands its cotangent straight on: for an
// f32 -> f32 cast (a strided copy) that is the exact gradient, for a
// narrowing one the straight-through estimate. Integer sources have none.

TPR__BWD_RULE(cast) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_tensor x;
  TPR_CHECK(tpr_program_value(tpr_grad_program(g), n->in[0], &x));
  if (x.dtype != TPR_F32 && x.dtype != TPR_BF16 && x.dtype != TPR_F16)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backward: cast from %s has no gradient (only f32, bf16, f16 sources)",
                    tpr_dtype_name(x.dtype));
  return tpr_grad_add(g, n->in[0], n->dout);
}

// A view of a contiguous cotangent with the input's shape.
TPR__BWD_RULE(reshape) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_program *p = tpr_grad_program(g);
  tpr_tensor x;
  TPR_CHECK(tpr_program_value(p, n->in[0], &x));
  tpr_value_id d, dx;
  TPR_CHECK(tpr_grad_contiguous(g, n->dout, &d));
  TPR_CHECK(tpr_pb_reshape(p, d, x.ndim, x.shape, &dx));
  return tpr_grad_add(g, n->in[0], dx);
}

// out dim i is x dim perm[i]: the inverse permutation (a view) puts it back.
TPR__BWD_RULE(permute) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  int inv[TPR_MAX_DIMS];
  for (int i = 0; i < n->attrs.n_i; i++) inv[n->attrs.i[i]] = i;
  tpr_value_id dx;
  TPR_CHECK(tpr_pb_permute(tpr_grad_program(g), n->dout, inv, &dx));
  return tpr_grad_add(g, n->in[0], dx);
}

TPR__BWD_RULE(slice) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_program *p = tpr_grad_program(g);
  tpr_tensor x;
  TPR_CHECK(tpr_program_value(p, n->in[0], &x));
  int64_t dim = n->attrs.i[0];
  tpr_op_attrs at = {.n_i = 3, .i = {dim, n->attrs.i[1], x.shape[dim]}};
  tpr_value_id dx;
  TPR_CHECK(tpr_program_op(p, TPR_OP_SLICE_BWD, (const tpr_value_id[]){n->dout}, 1, &at, &dx));
  return tpr_grad_add(g, n->in[0], dx);
}

const tpr__grad_def tpr__copy_grad[] = {
    {TPR_OP_CAST, bwd_cast},
    {TPR_OP_RESHAPE, bwd_reshape},
    {TPR_OP_PERMUTE, bwd_permute},
    {TPR_OP_SLICE, bwd_slice},
    {0},
};
