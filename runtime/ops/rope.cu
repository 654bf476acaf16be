// RoPE CUDA kernel (rope.c's twin): NeoX rotate-half pairing (d, d + half)
// on the first rotary_dim dims of every head; the rest of the head is copied.
//
// One thread per output element, computing transformers' float32 path as the
// CPU does: inv_freq = 1 / powf(theta, (float)(2d) / rd); a = (float)pos *
// inv_freq; cos/sin of a in f32; then the rotation. Positions are read on
// device. The rotation is written with explicitly rounded operations so the
// compiler cannot fuse it into FMAs (the CPU rounds each product); cosf,
// sinf and powf differ from glibc's by at most a couple of ulps.
#include <math.h>

#include "cuda_kernels.h"

// x (T, NH, D) strides xs; positions (T) stride ps; out (T, NH, D) contiguous.
static __global__ void rope_kernel(float *o, const float *x, int64_t xs0, int64_t xs1, int64_t xs2, const void *pos,
                                   bool pos64, int64_t ps, int64_t NH, int64_t D, int64_t rd, float theta,
                                   int64_t total) {
  const int64_t half = rd / 2;
  TPR_CUDA_GRID_STRIDE(i, total) {
    const int64_t d = i % D, h = (i / D) % NH, t = i / (D * NH);
    const float *xr = x + t * xs0 + h * xs1;
    if (d >= rd) {
      o[i] = xr[d * xs2];
      continue;
    }
    const int64_t k = d < half ? d : d - half;  // the frequency index of the pair
    const float inv = 1.0f / powf(theta, (float)(2 * k) / (float)rd);
    const float a = __fmul_rn((float)tpr__cuda_load_index(pos, pos64, t * ps), inv);
    const float cs = cosf(a), sn = sinf(a);
    const float x1 = xr[k * xs2], x2 = xr[(k + half) * xs2];
    o[i] = d < half ? __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn))   // x1 c - x2 s
                    : __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));  // x2 c + x1 s
  }
}

// x (T, heads, D), positions (T) i32/i64; out (T, heads, D) contiguous.
// attrs: i[0] rotary_dim, f[0] theta.
TPR_CUDA_KERNEL(rope) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "rope (cuda): expected 2 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *pos = in[1];
  if (x->dtype != TPR_F32 || out->dtype != TPR_F32 || (pos->dtype != TPR_I32 && pos->dtype != TPR_I64))
    return TPR_FAIL(TPR_ERR_DTYPE, "rope (cuda): x %s, positions %s, out %s; need f32, i32/i64, f32",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(pos->dtype), tpr_dtype_name(out->dtype));
  if (!attrs || attrs->n_i < 1 || attrs->n_f < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rope (cuda): missing rotary_dim i[0] or theta f[0]");
  if (x->ndim != 3 || pos->ndim != 1 || pos->shape[0] != x->shape[0] || !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "rope (cuda): x, positions and out shapes do not fit");
  const int64_t NH = x->shape[1], D = x->shape[2], rd = attrs->i[0];
  if (rd <= 0 || rd % 2 || rd > D)
    return TPR_FAIL(TPR_ERR_SHAPE, "rope (cuda): rotary_dim %lld must be even and in (0, %lld]", (long long)rd,
                    (long long)D);
  const int64_t total = tpr_tensor_numel(x);
  if (total == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "rope", "set device");
  const int th = 256;
  rope_kernel<<<tpr__cuda_blocks(total, th), th, 0, c->stream>>>(
      (float *)tpr_tensor_data(out), (const float *)tpr_tensor_data(x), x->stride[0], x->stride[1], x->stride[2],
      tpr_tensor_data(pos), pos->dtype == TPR_I64, pos->stride[0], NH, D, rd, attrs->f[0], total);
  TPR_CUDA_LAUNCHED("rope", "rope kernel");
  return TPR_OK;
}
