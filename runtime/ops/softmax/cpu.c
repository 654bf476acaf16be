// Softmax CPU kernel over the last dim, in f32 (docs/architecture.md section 3).
//
// Each row subtracts its max before exp so large inputs cannot overflow;
// -inf entries give exactly 0. Conventions for degenerate rows:
//   - a row whose entries are all -inf (fully masked) gives all zeros, not
//     NaN, so a masked-out row contributes nothing downstream;
//   - a row with a NaN or a +inf gives NaN (the error stays visible).
//
// Rows are split over threads (cpu_threads.h), each row done by one thread
// in the order below, so results do not depend on the thread count. A
// single long row (decode's T = 1 over a vocabulary) is not split: its sum
// would then be combined in a thread-count-dependent order.
#include <math.h>
#include <stdlib.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"
#include "runtime/ops/strided.h"

// x (n) with stride s; o (n) contiguous.
static void softmax_row(const float *x, int64_t s, float *o, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    float v = x[i * s];
    m = v > m ? v : m;  // NaN never wins here; it propagates through exp below
  }
  if (m == -INFINITY) {
    int nan = 0;
    for (int64_t i = 0; i < n; i++) nan |= isnan(x[i * s]);
    for (int64_t i = 0; i < n; i++) o[i] = nan ? NAN : 0.0f;
    return;
  }
  for (int64_t i = 0; i < n; i++) o[i] = expf(x[i * s] - m);
  const float sum = tpr__sum8_f32(o, n);  // >= 1: the max entry gives exp(0)
  for (int64_t i = 0; i < n; i++) o[i] /= sum;
}

// x (..., N); out (..., N) contiguous.
TPR_CPU_KERNEL(softmax) {
  if (n_in != 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "softmax (cpu): expected 1 input, got %d", n_in);
  const tpr_tensor *x = in[0];
  if (x->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "softmax (cpu): x %s, out %s; only f32 is supported",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(out->dtype));
  if (x->ndim < 1 || !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "softmax (cpu): x and out shapes differ or x is 0-d");
  const int64_t N = x->shape[x->ndim - 1];
  if (tpr_tensor_numel(x) == 0) return TPR_OK;
  const float *xd = tpr_tensor_data(x);
  float *o = tpr_tensor_data(out);
  const int64_t xs = x->stride[x->ndim - 1];
  const int64_t *st[1] = {x->stride};
  tpr__row_iter R;
  if (!tpr__row_iter_init(&R, ctx, x->ndim, x->shape, 1, st, N)) return TPR_OK;
#pragma omp parallel for num_threads(R.nt) if (R.nt > 1) schedule(static)
  for (int64_t r = 0; r < R.rows; r++)
    softmax_row(xd + tpr__iter_offset_at(&R.it, 0, r), N == 1 ? 1 : xs, o + r * N, N);
  return TPR_OK;
}

// ---- Backward: dx = y * (dy - sum_j dy_j y_j) over the last dim, the row's
// dot product accumulated in double in element order.
// y (..., N), dy (..., N) any strides; out (..., N) contiguous.
TPR_CPU_KERNEL(softmax_bwd) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "softmax_bwd (cpu): expected 2 inputs, got %d", n_in);
  const tpr_tensor *y = in[0], *dy = in[1];
  if (out->dtype != TPR_F32 || !tpr_tensor_same_shape(y, out) || !tpr_tensor_same_shape(dy, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "softmax_bwd (cpu): y, dy and out must be f32 of one shape");
  const int64_t N = y->shape[y->ndim - 1];
  if (tpr_tensor_numel(y) == 0) return TPR_OK;
  const float *yd = tpr_tensor_data(y), *gd = tpr_tensor_data(dy);
  float *o = tpr_tensor_data(out);
  const int64_t ys = y->stride[y->ndim - 1], gs = dy->stride[dy->ndim - 1];
  const int64_t *st[2] = {y->stride, dy->stride};
  tpr__row_iter R;
  if (!tpr__row_iter_init(&R, ctx, y->ndim, y->shape, 2, st, N)) return TPR_OK;
#pragma omp parallel for num_threads(R.nt) if (R.nt > 1) schedule(static)
  for (int64_t r = 0; r < R.rows; r++) {
    const float *yr = yd + tpr__iter_offset_at(&R.it, 0, r), *gr = gd + tpr__iter_offset_at(&R.it, 1, r);
    float *orow = o + r * N;
    double dot = 0;
    for (int64_t i = 0; i < N; i++) dot += (double)gr[i * gs] * yr[i * ys];
    for (int64_t i = 0; i < N; i++) orow[i] = (float)(yr[i * ys] * (gr[i * gs] - dot));
  }
  return TPR_OK;
}

const tpr__kernel_def tpr__softmax_cpu[] = {
    {TPR_OP_SOFTMAX, cpu_softmax},
    {TPR_OP_SOFTMAX_BWD, cpu_softmax_bwd},
    {0},
};
