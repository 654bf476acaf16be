// Elementwise CUDA kernels (cpu.c's twin): add, mul (numpy
// broadcasting), swiglu, sigmoid and its backward. One thread per output element; each input is
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

// sigmoid(g) exactly as cpu.c's sigmoid1: from exp(-|g|), which never overflows.
static __device__ __forceinline__ float sigmoid1(float g) {
  float e = expf(-fabsf(g));
  return (g >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// sigmoid'(x) as cpu.c's dsigmoid1: e / (1 + e)^2, no cancelling 1 - s.
static __device__ __forceinline__ float dsigmoid1(float x) {
  float e = expf(-fabsf(x)), d = 1.0f + e;
  return e / (d * d);
}

// silu(g) * u as cpu.c's swiglu1: (g * s) * u.
static __device__ __forceinline__ float swiglu1(float g, float u) { return g * sigmoid1(g) * u; }

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

// o = sigmoid(x), or (BWD) o = dy * sigmoid'(x); o contiguous.
template <bool BWD>
static __global__ void sigmoid_kernel(float *o, const float *x, tpr__cuda_desc xd, const float *dy,
                                      tpr__cuda_desc dd, int64_t n) {
  TPR_CUDA_GRID_STRIDE(i, n) {
    const float v = x[tpr__cuda_offset(xd, i)];
    o[i] = BWD ? dy[tpr__cuda_offset(dd, i)] * dsigmoid1(v) : sigmoid1(v);
  }
}

// x (...) [, dy (...)] any strides, out (...) contiguous, all one shape.
template <bool BWD>
static tpr_status run_sigmoid(tpr_cuda_ctx *c, const char *op, const tpr_tensor *const *in, int n_in,
                              tpr_tensor *out) {
  const int want = BWD ? 2 : 1;
  if (n_in != want) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s (cuda): expected %d inputs, got %d", op, want, n_in);
  TPR_CHECK(check_f32(op, in, n_in, out));
  for (int k = 0; k < n_in; k++)
    if (!tpr_tensor_same_shape(in[k], out))
      return TPR_FAIL(TPR_ERR_SHAPE, "%s (cuda): input %d shape differs from the output", op, k);
  const int64_t n = tpr_tensor_numel(out);
  if (n == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), op, "set device");
  const tpr__cuda_desc xd = tpr__cuda_tensor_desc(in[0]), dd = tpr__cuda_tensor_desc(in[n_in - 1]);
  const int th = 256;
  sigmoid_kernel<BWD><<<tpr__cuda_blocks(n, th), th, 0, c->stream>>>(
      (float *)tpr_tensor_data(out), (const float *)tpr_tensor_data(in[0]), xd,
      (const float *)tpr_tensor_data(in[n_in - 1]), dd, n);
  TPR_CUDA_LAUNCHED(op, "sigmoid kernel");
  return TPR_OK;
}

TPR_CUDA_KERNEL(sigmoid) { return run_sigmoid<false>((tpr_cuda_ctx *)ctx, "sigmoid", in, n_in, out); }
TPR_CUDA_KERNEL(sigmoid_bwd) { return run_sigmoid<true>((tpr_cuda_ctx *)ctx, "sigmoid_bwd", in, n_in, out); }

const tpr__kernel_def tpr__elementwise_cuda[] = {
    {TPR_OP_ADD, cuda_add},
    {TPR_OP_MUL, cuda_mul},
    {TPR_OP_SWIGLU, cuda_swiglu},
    {TPR_OP_SIGMOID, cuda_sigmoid},
    {TPR_OP_SIGMOID_BWD, cuda_sigmoid_bwd},
    {},
};
