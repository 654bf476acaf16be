// Elementwise CUDA kernels (cpu.c's twin): add, mul (numpy
// broadcasting) and swiglu. One thread per output element; each input is
// read through its own strides over out's shape (a broadcast dim has stride
// 0), so any layout works without copies. An input sharing out's buffer
// (in place, same shape) is fine: each element is read before it is written
// by the same thread.
#include <math.h>

#include "runtime/ops/cuda_kernels.h"

// Both inputs' strides over out's shape.
struct binary_geom {
  tpr__cuda_desc a, b;  // a.shape == b.shape == out's shape
};

template <bool MUL>
static __global__ void binary_kernel(float *o, const float *a, const float *b, binary_geom g, int64_t n) {
  TPR_CUDA_GRID_STRIDE(i, n) {
    const float x = a[tpr__cuda_offset(g.a, i)], y = b[tpr__cuda_offset(g.b, i)];
    o[i] = MUL ? x * y : x + y;
  }
}

static tpr_status check_f32(const char *op, const tpr_tensor *const *in, int n_in, const tpr_tensor *out) {
  for (int k = 0; k < n_in; k++)
    if (in[k]->dtype != TPR_F32)
      return TPR_FAIL(TPR_ERR_DTYPE, "%s (cuda): input %d is %s, only f32 is supported", op, k,
                      tpr_dtype_name(in[k]->dtype));
  if (out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s (cuda): output is %s, only f32 is supported", op, tpr_dtype_name(out->dtype));
  return TPR_OK;
}

// a (...), b (...) broadcastable to out (...); out contiguous.
template <bool MUL>
static tpr_status run_binary(tpr_cuda_ctx *c, const char *op, const tpr_tensor *const *in, int n_in, tpr_tensor *out) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s (cuda): expected 2 inputs, got %d", op, n_in);
  TPR_CHECK(check_f32(op, in, n_in, out));
  for (int k = 0; k < 2; k++)
    if (in[k]->ndim > out->ndim) return TPR_FAIL(TPR_ERR_SHAPE, "%s (cuda): input %d has more dims than out", op, k);
  const int64_t n = tpr_tensor_numel(out);
  if (n == 0) return TPR_OK;
  binary_geom g;
  int64_t sa[TPR_MAX_DIMS], sb[TPR_MAX_DIMS];
  tpr__broadcast_strides(in[0], out->ndim, out->shape, sa);
  tpr__broadcast_strides(in[1], out->ndim, out->shape, sb);
  g.a = tpr__cuda_make_desc(out->ndim, out->shape, sa);
  g.b = tpr__cuda_make_desc(out->ndim, out->shape, sb);
  TPR_CUDA_TRY(cudaSetDevice(c->device), op, "set device");
  const int th = 256;
  binary_kernel<MUL><<<tpr__cuda_blocks(n, th), th, 0, c->stream>>>((float *)tpr_tensor_data(out),
                                                                    (const float *)tpr_tensor_data(in[0]),
                                                                    (const float *)tpr_tensor_data(in[1]), g, n);
  TPR_CUDA_LAUNCHED(op, "elementwise kernel");
  return TPR_OK;
}

TPR_CUDA_KERNEL(add) { return run_binary<false>((tpr_cuda_ctx *)ctx, "add", in, n_in, out); }
TPR_CUDA_KERNEL(mul) { return run_binary<true>((tpr_cuda_ctx *)ctx, "mul", in, n_in, out); }

// silu(g) * u exactly as cpu.c's swiglu1: sigmoid from exp(-|g|),
// which never overflows, then (g * s) * u.
static __device__ __forceinline__ float swiglu1(float g, float u) {
  float e = expf(-fabsf(g));
  float s = (g >= 0.0f ? 1.0f : e) / (1.0f + e);
  return g * s * u;
}

static __global__ void swiglu_kernel(float *o, const float *g, tpr__cuda_desc gd, const float *u, tpr__cuda_desc ud,
                                     int64_t n) {
  TPR_CUDA_GRID_STRIDE(i, n) o[i] = swiglu1(g[tpr__cuda_offset(gd, i)], u[tpr__cuda_offset(ud, i)]);
}

// gate (..., F), up (..., F), out (..., F); same shapes, inputs strided.
TPR_CUDA_KERNEL(swiglu) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "swiglu (cuda): expected 2 inputs, got %d", n_in);
  TPR_CHECK(check_f32("swiglu", in, n_in, out));
  for (int k = 0; k < 2; k++)
    if (!tpr_tensor_same_shape(in[k], out))
      return TPR_FAIL(TPR_ERR_SHAPE, "swiglu (cuda): input %d shape differs from the output", k);
  const int64_t n = tpr_tensor_numel(out);
  if (n == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "swiglu", "set device");
  const int th = 256;
  swiglu_kernel<<<tpr__cuda_blocks(n, th), th, 0, c->stream>>>(
      (float *)tpr_tensor_data(out), (const float *)tpr_tensor_data(in[0]), tpr__cuda_tensor_desc(in[0]),
      (const float *)tpr_tensor_data(in[1]), tpr__cuda_tensor_desc(in[1]), n);
  TPR_CUDA_LAUNCHED("swiglu", "swiglu kernel");
  return TPR_OK;
}

const tpr__kernel_def tpr__elementwise_cuda[] = {
    {TPR_OP_ADD, cuda_add},
    {TPR_OP_MUL, cuda_mul},
    {TPR_OP_SWIGLU, cuda_swiglu},
    {},
};
