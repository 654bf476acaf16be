// RoPE CUDA kernel (cpu.c's twin): NeoX (d, d + half) or GPT-J (2d, 2d + 1)
// pairing, 1-D or MRoPE (3, T) positions (rope.h), on the first
// rotary_dim dims of every head; the rest of the head is copied.
//
// One thread per output element, computing transformers' float32 path as the
// CPU does: inv_freq = 1 / powf(theta, (float)(2d) / rd); a = (float)pos *
// inv_freq; cos/sin of a in f32; then the rotation. Positions are read on
// device. The rotation is written with explicitly rounded operations so the
// compiler cannot fuse it into FMAs (the CPU rounds each product); cosf,
// sinf and powf differ from glibc's by at most a couple of ulps.
#include <math.h>

#include "runtime/ops/cuda_kernels.h"
extern "C" {
#include "rope.h"
}

// x (T, NH, D) strides xs; positions (T) stride pt, or (3, T) strides (pa, pt);
// out (T, NH, D) contiguous. Pair k rotates dims (k*p1, k*p1 + p2).
static __global__ void rope_kernel(float *o, const float *x, int64_t xs0, int64_t xs1, int64_t xs2, const void *pos,
                                   bool pos64, int64_t pa, int64_t pt, int64_t NH, int64_t D, int64_t rd, float theta,
                                   int64_t p1, int64_t p2, int layout, int64_t s0, int64_t s1, int64_t s2,
                                   int64_t total) {
  const int64_t half = rd / 2, sec[3] = {s0, s1, s2};
  TPR_CUDA_GRID_STRIDE(i, total) {
    const int64_t d = i % D, h = (i / D) % NH, t = i / (D * NH);
    const float *xr = x + t * xs0 + h * xs1;
    if (d >= rd) {
      o[i] = xr[d * xs2];
      continue;
    }
    // The pair this dim belongs to and whether it is the first of the two.
    const bool first = p1 == 1 ? d < half : d % 2 == 0;
    const int64_t k = p1 == 1 ? (first ? d : d - half) : d / 2;
    const float inv = 1.0f / powf(theta, (float)(2 * k) / (float)rd);
    const int axis = tpr__mrope_axis(layout, sec, k);
    const float a = __fmul_rn((float)tpr__cuda_load_index(pos, pos64, axis * pa + t * pt), inv);
    const float cs = cosf(a), sn = sinf(a);
    const float x1 = xr[k * p1 * xs2], x2 = xr[(k * p1 + p2) * xs2];
    o[i] = first ? __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn))   // x1 c - x2 s
                 : __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));  // x2 c + x1 s
  }
}

// x (T, heads, D), positions (T) or (3, T) i32/i64; out (T, heads, D)
// contiguous. attrs: rope.h.
TPR_CUDA_KERNEL(rope) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "rope (cuda): expected 2 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *pos = in[1];
  if (x->dtype != TPR_F32 || out->dtype != TPR_F32 || (pos->dtype != TPR_I32 && pos->dtype != TPR_I64))
    return TPR_FAIL(TPR_ERR_DTYPE, "rope (cuda): x %s, positions %s, out %s; need f32, i32/i64, f32",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(pos->dtype), tpr_dtype_name(out->dtype));
  if (!attrs || attrs->n_i < 1 || attrs->n_f < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rope (cuda): missing rotary_dim i[0] or theta f[0]");
  tpr_rope_opts v;
  TPR_CHECK(tpr__rope_variant("rope (cuda)", attrs, &v));
  const int pnd = v.layout == TPR_MROPE_NONE ? 1 : 2;
  if (x->ndim != 3 || pos->ndim != pnd || pos->shape[pnd - 1] != x->shape[0] || (pnd == 2 && pos->shape[0] != 3) ||
      !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "rope (cuda): x, positions and out shapes do not fit");
  const int64_t NH = x->shape[1], D = x->shape[2], rd = attrs->i[0];
  if (rd <= 0 || rd % 2 || rd > D)
    return TPR_FAIL(TPR_ERR_SHAPE, "rope (cuda): rotary_dim %lld must be even and in (0, %lld]", (long long)rd,
                    (long long)D);
  const int64_t total = tpr_tensor_numel(x);
  if (total == 0) return TPR_OK;
  const int64_t p1 = v.pairing == TPR_ROPE_PAIR_HALF ? 1 : 2, p2 = v.pairing == TPR_ROPE_PAIR_HALF ? rd / 2 : 1;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "rope", "set device");
  const int th = 256;
  rope_kernel<<<tpr__cuda_blocks(total, th), th, 0, c->stream>>>(
      (float *)tpr_tensor_data(out), (const float *)tpr_tensor_data(x), x->stride[0], x->stride[1], x->stride[2],
      tpr_tensor_data(pos), pos->dtype == TPR_I64, pnd == 2 ? pos->stride[0] : 0, pos->stride[pnd - 1], NH, D, rd,
      attrs->f[0], p1, p2, (int)v.layout, v.section[0], v.section[1], v.section[2], total);
  TPR_CUDA_LAUNCHED("rope", "rope kernel");
  return TPR_OK;
}

const tpr__kernel_def tpr__rope_cuda[] = {
    {TPR_OP_ROPE, cuda_rope},
    {},
};
