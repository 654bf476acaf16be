// RMS norm CUDA kernels (cpu.c's twin): rms_norm, and the distributed
// halves sum_squares and rms_scale.
//
// One block per row for the reductions. rms_norm sums x^2 in f32 (docs/architecture.md
// section 3) like the CPU, sum_squares in double rounded once to f32; both
// in a fixed order (per-thread strided partial sums, then the block's fixed
// tree), so results are deterministic. The order differs from the CPU's
// interleaved lanes, which changes an f32 sum by a few ulps (a double sum by
// far less than its final f32 rounding). The formulas after the sum are the
// CPU's, operation for operation.
#include <math.h>

#include "runtime/ops/cuda_kernels.h"

enum { ROW_THREADS = 256 };

struct sum_op {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

// Row r of the leading dims of x (all dims but the last): offset of its
// first element.
static __device__ __forceinline__ int64_t row_offset(const tpr__cuda_desc &lead, int64_t r) {
  return tpr__cuda_offset(lead, r);
}

// x (rows, H) through lead (leading dims) and xs (last-dim stride); weight
// (H) stride ws; out (rows, H) contiguous.
static __global__ void rms_norm_kernel(float *o, const float *x, tpr__cuda_desc lead, int64_t xs, const float *w,
                                       int64_t ws, int64_t rows, int64_t H, float eps) {
  __shared__ float shm[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *xr = x + row_offset(lead, r);
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) acc += xr[i * xs] * xr[i * xs];
    const float ss = tpr__cuda_block_reduce(acc, sum_op(), shm);
    const float inv = 1.0f / sqrtf(ss / (float)H + eps);
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) o[r * H + i] = xr[i * xs] * inv * w[i * ws];
  }
}

// x (..., H), weight (H); out (..., H) contiguous. attrs->f[0] = eps.
TPR_CUDA_KERNEL(rms_norm) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm (cuda): expected 2 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *w = in[1];
  if (x->dtype != TPR_F32 || w->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "rms_norm (cuda): x %s, weight %s, out %s; only f32 is supported",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(w->dtype), tpr_dtype_name(out->dtype));
  if (!attrs || attrs->n_f < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm (cuda): missing eps attribute f[0]");
  if (x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1] || !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_norm (cuda): x, weight and out shapes do not fit");
  const int64_t H = x->shape[x->ndim - 1];
  if (tpr_tensor_numel(x) == 0) return TPR_OK;
  const int64_t rows = tpr_tensor_numel(x) / H;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "rms_norm", "set device");
  rms_norm_kernel<<<tpr__cuda_blocks(rows, 1), ROW_THREADS, 0, c->stream>>>(
      (float *)tpr_tensor_data(out), (const float *)tpr_tensor_data(x),
      tpr__cuda_make_desc(x->ndim - 1, x->shape, x->stride), x->stride[x->ndim - 1],
      (const float *)tpr_tensor_data(w), w->stride[0], rows, H, attrs->f[0]);
  TPR_CUDA_LAUNCHED("rms_norm", "rms_norm kernel");
  return TPR_OK;
}

// x (rows, N) through lead and xs; out (rows) = sum x^2 in double, rounded once.
static __global__ void sum_squares_kernel(float *o, const float *x, tpr__cuda_desc lead, int64_t xs, int64_t rows,
                                          int64_t N) {
  __shared__ double shm[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *xr = x + row_offset(lead, r);
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += (double)xr[i * xs] * (double)xr[i * xs];
    const double s = tpr__cuda_block_reduce(acc, sum_op(), shm);
    if (threadIdx.x == 0) o[r] = (float)s;
  }
}

// x (..., N); out (..., 1) contiguous.
TPR_CUDA_KERNEL(sum_squares) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "sum_squares (cuda): expected 1 input, got %d", n_in);
  const tpr_tensor *x = in[0];
  if (x->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "sum_squares (cuda): x %s, out %s; only f32 is supported",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(out->dtype));
  if (x->ndim < 1 || out->ndim != x->ndim || out->shape[x->ndim - 1] != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "sum_squares (cuda): out must be x's shape with last dim 1");
  // Rows of an empty last dim still get their sum (0), as on the CPU.
  const int64_t rows = tpr_shape_numel(x->ndim - 1, x->shape), N = x->shape[x->ndim - 1];
  if (rows == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "sum_squares", "set device");
  sum_squares_kernel<<<tpr__cuda_blocks(rows, 1), ROW_THREADS, 0, c->stream>>>(
      (float *)tpr_tensor_data(out), (const float *)tpr_tensor_data(x),
      tpr__cuda_make_desc(x->ndim - 1, x->shape, x->stride), x->stride[x->ndim - 1], rows, N);
  TPR_CUDA_LAUNCHED("sum_squares", "sum_squares kernel");
  return TPR_OK;
}

// out (rows, N) contiguous = (x * r) * weight, r = 1 / sqrtf(sumsq / divisor
// + eps) for the row; one thread per element, each recomputing its row's r
// with the CPU's operations.
static __global__ void rms_scale_kernel(float *o, const float *x, tpr__cuda_desc xlead, int64_t xs, const float *ss,
                                        tpr__cuda_desc slead, const float *w, int64_t ws, int64_t N, int64_t n,
                                        float divisor, float eps) {
  TPR_CUDA_GRID_STRIDE(i, n) {
    const int64_t r = i / N, j = i % N;
    const float variance = ss[row_offset(slead, r)] / divisor;
    const float inv = 1.0f / sqrtf(variance + eps);
    o[i] = (x[row_offset(xlead, r) + j * xs] * inv) * w[j * ws];
  }
}

// x (..., N), sumsq (..., 1), weight (N); out (..., N) contiguous.
// attrs->f[0] = divisor, f[1] = eps.
TPR_CUDA_KERNEL(rms_scale) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_scale (cuda): expected 3 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *ss = in[1], *w = in[2];
  if (x->dtype != TPR_F32 || ss->dtype != TPR_F32 || w->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "rms_scale (cuda): x %s, sumsq %s, weight %s, out %s; only f32 is supported",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(ss->dtype), tpr_dtype_name(w->dtype),
                    tpr_dtype_name(out->dtype));
  if (!attrs || attrs->n_f < 2)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_scale (cuda): missing divisor f[0] and eps f[1]");
  if (x->ndim < 1 || ss->ndim != x->ndim || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1] ||
      !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_scale (cuda): x, sumsq, weight and out shapes do not fit");
  for (int d = 0; d < x->ndim - 1; d++)
    if (ss->shape[d] != x->shape[d])
      return TPR_FAIL(TPR_ERR_SHAPE, "rms_scale (cuda): sumsq dim %d is %lld, x has %lld", d, (long long)ss->shape[d],
                      (long long)x->shape[d]);
  const int64_t N = x->shape[x->ndim - 1], n = tpr_tensor_numel(x);
  if (n == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "rms_scale", "set device");
  const int th = 256;
  rms_scale_kernel<<<tpr__cuda_blocks(n, th), th, 0, c->stream>>>(
      (float *)tpr_tensor_data(out), (const float *)tpr_tensor_data(x),
      tpr__cuda_make_desc(x->ndim - 1, x->shape, x->stride), x->stride[x->ndim - 1],
      (const float *)tpr_tensor_data(ss), tpr__cuda_make_desc(x->ndim - 1, x->shape, ss->stride),
      (const float *)tpr_tensor_data(w), w->stride[0], N, n, attrs->f[0], attrs->f[1]);
  TPR_CUDA_LAUNCHED("rms_scale", "rms_scale kernel");
  return TPR_OK;
}

const tpr__kernel_def tpr__norm_cuda[] = {
    {TPR_OP_RMS_NORM, cuda_rms_norm},
    {TPR_OP_SUM_SQUARES, cuda_sum_squares},
    {TPR_OP_RMS_SCALE, cuda_rms_scale},
    {},
};
