// Backward of the view ops (reshape, permute, slice; ops.h): the views copy
// nothing forward, and their backward moves the cotangent back into the
// input's geometry -- a view again where it can be (reshape, permute), a
// zero-padded copy for slice (slice_bwd, the one kernel here).
#include <string.h>

#include "runtime/ops/cpu_kernels.h"
#include "grad.h"
#include "runtime/ops/strided.h"

// dy (..., len, ...) any strides; i[0] dim, i[1] start, i[2] full len;
// out (..., full, ...): zeros with dy at [start, start + len) along dim.
TPR_CPU_KERNEL(slice_bwd) {
  if (n_in != 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "slice_bwd (cpu): expected 1 input, got %d", n_in);
  const tpr_tensor *dy = in[0];
  const int dim = (int)attrs->i[0];
  const int64_t start = attrs->i[1];
  float *o = tpr_tensor_data(out);
  memset(o, 0, (size_t)tpr_tensor_numel(out) * sizeof *o);
  int64_t so[TPR_MAX_DIMS];
  tpr__contig_strides(out->ndim, out->shape, so);
  tpr__strided_copy(o + start * so[dim], so, tpr_tensor_data(dy), dy->stride, dy->ndim, dy->shape, sizeof *o);
  return TPR_OK;
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
