// Softmax CUDA kernel over the last dim (cpu.c's twin), in f32: one
// block per row, the row max subtracted before expf, the sum (fixed block
// order) divided out. The CPU's conventions for degenerate rows hold:
//   - a row whose entries are all -inf gives zeros, not NaN;
//   - a row with a NaN or a +inf gives NaN.
// The max ignores NaN exactly as the CPU's `v > m ? v : m` from -inf does;
// a NaN then propagates through expf into the sum and every entry.
#include <math.h>

#include "runtime/ops/cuda_kernels.h"

enum { ROW_THREADS = 256 };

struct max_op {  // never lets a NaN in: both operands are numbers or -inf
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};
struct sum_op {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct or_op {
  __device__ int operator()(int a, int b) const { return a | b; }
};

// x (rows, N) through lead (leading dims) and xs; out (rows, N) contiguous.
static __global__ void softmax_kernel(float *o, const float *x, tpr__cuda_desc lead, int64_t xs, int64_t rows,
                                      int64_t N) {
  __shared__ float fshm[32];
  __shared__ int ishm[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *xr = x + tpr__cuda_offset(lead, r);
    float *orow = o + r * N;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      const float v = xr[i * xs];
      m = v > m ? v : m;
    }
    m = tpr__cuda_block_reduce(m, max_op(), fshm);
    if (m == -INFINITY) {  // all -inf (or NaN): zeros, or NaN if any NaN
      int nan = 0;
      for (int64_t i = threadIdx.x; i < N; i += blockDim.x) nan |= isnan(xr[i * xs]) ? 1 : 0;
      nan = tpr__cuda_block_reduce(nan, or_op(), ishm);
      for (int64_t i = threadIdx.x; i < N; i += blockDim.x) orow[i] = nan ? NAN : 0.0f;
      continue;
    }
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      const float e = expf(xr[i * xs] - m);
      orow[i] = e;
      acc += e;
    }
    const float sum = tpr__cuda_block_reduce(acc, sum_op(), fshm);  // >= 1: the max gives exp(0)
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) orow[i] /= sum;  // each thread rereads its own entries
  }
}

// x (..., N); out (..., N) contiguous.
TPR_CUDA_KERNEL(softmax) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "softmax (cuda): expected 1 input, got %d", n_in);
  const tpr_tensor *x = in[0];
  if (x->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "softmax (cuda): x %s, out %s; only f32 is supported", tpr_dtype_name(x->dtype),
                    tpr_dtype_name(out->dtype));
  if (x->ndim < 1 || !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "softmax (cuda): x and out shapes differ or x is 0-d");
  const int64_t N = x->shape[x->ndim - 1];
  if (tpr_tensor_numel(x) == 0) return TPR_OK;
  const int64_t rows = tpr_tensor_numel(x) / N;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "softmax", "set device");
  softmax_kernel<<<tpr__cuda_blocks(rows, 1), ROW_THREADS, 0, c->stream>>>(
      (float *)tpr_tensor_data(out), (const float *)tpr_tensor_data(x),
      tpr__cuda_make_desc(x->ndim - 1, x->shape, x->stride), x->stride[x->ndim - 1], rows, N);
  TPR_CUDA_LAUNCHED("softmax", "softmax kernel");
  return TPR_OK;
}

const tpr__kernel_def tpr__softmax_cuda[] = {
    {TPR_OP_SOFTMAX, cuda_softmax},
    {},
};
