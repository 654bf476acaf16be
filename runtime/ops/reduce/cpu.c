// sum_to (the reverse of broadcasting), scale and fill: the small ops every
// backward needs: their CPU kernels.
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"

#include "runtime/ops/strided.h"

// out (shape of attrs) = x summed over the dims x was broadcast along.
// Accumulates in double in x's row-major order, so results are deterministic.
TPR_CPU_KERNEL(sum_to) {
  const tpr_tensor *x = in[0];
  int nd = x->ndim, od = out->ndim;
  int64_t n = tpr_tensor_numel(x), on = tpr_tensor_numel(out);
  double *acc = calloc((size_t)(on ? on : 1), sizeof *acc);
  if (!acc) return TPR_FAIL(TPR_ERR_OOM, "sum_to");
  const float *xd = tpr_tensor_data(x);
  int64_t idx[TPR_MAX_DIMS] = {0};
  for (int64_t e = 0; e < n; e++) {
    int64_t xoff = 0, ooff = 0;  // tpr_tensor_data already points at the first element
    for (int d = 0; d < nd; d++) xoff += idx[d] * x->stride[d];
    for (int d = 0; d < od; d++) {
      int xd_ = d + nd - od;
      if (out->shape[d] != 1) ooff += idx[xd_] * out->stride[d];
    }
    acc[ooff] += xd[xoff];
    for (int d = nd - 1; d >= 0 && ++idx[d] == x->shape[d]; d--) idx[d] = 0;
  }
  float *o = tpr_tensor_data(out);
  for (int64_t i = 0; i < on; i++) o[i] = (float)acc[i];
  free(acc);
  return TPR_OK;
}

TPR_CPU_KERNEL(scale) {
  const tpr_tensor *x = in[0];
  float a = attrs->f[0], *o = tpr_tensor_data(out);
  const float *xd = tpr_tensor_data(x);
  int64_t n = tpr_tensor_numel(x), idx[TPR_MAX_DIMS] = {0};
  for (int64_t e = 0; e < n; e++) {
    int64_t off = 0;
    for (int d = 0; d < x->ndim; d++) off += idx[d] * x->stride[d];
    o[e] = a * xd[off];
    for (int d = x->ndim - 1; d >= 0 && ++idx[d] == x->shape[d]; d--) idx[d] = 0;
  }
  return TPR_OK;
}

TPR_CPU_KERNEL(fill) {
  float v = attrs->f[0], *o = tpr_tensor_data(out);
  int64_t n = tpr_tensor_numel(out);
  for (int64_t e = 0; e < n; e++) o[e] = v;
  return TPR_OK;
}

const tpr__kernel_def tpr__reduce_cpu[] = {
    {TPR_OP_SUM_TO, cpu_sum_to},
    {TPR_OP_SCALE, cpu_scale},
    {TPR_OP_FILL, cpu_fill},
    {0},
};
