// RoPE CPU kernel: NeoX rotate-half pairing (d, d + rotary_dim/2) or GPT-J
// pairing (2d, 2d + 1) on the first rotary_dim dims of every head, with 1-D
// positions or MRoPE's (3, T) laid out sectioned or interleaved
// (rope.h); the rest of the head is copied.
//
// The angles follow transformers' float32 path step by step so the rotation
// matches the reference model to the last bit where libm allows:
//   inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim))   (f32)
//   freqs = inv_freq * position.float()                            (f32 product)
//   cos = freqs.cos(), sin = freqs.sin()                           (f32)
//   out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)
// cos/sin are computed once per token and reused by every head. Tokens are
// split over threads (cpu_threads.h); every token's values come from the
// same code whichever thread runs it. rope_bwd is the same loop with the
// angles negated.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"

#include "rope.h"

// x (T, heads, D), positions (T) or (3, T) i32/i64; out (T, heads, D)
// contiguous. attrs: rope.h. With `inverse`, the rotation by -angle
// (rope_bwd: the rotation is orthogonal, so its transpose is its inverse):
// the same cos and sin, computed by the same code, with sin negated -- exact in
// f32, so the forward and the backward use bit-identical angles.
static tpr_status rope_run(void *ctx, const char *op, const tpr_tensor *const *in, int n_in, const tpr_op_attrs *attrs,
                           tpr_tensor *out, bool inverse) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s (cpu): expected 2 inputs, got %d", op, n_in);
  const tpr_tensor *x = in[0], *pos = in[1];
  if (x->dtype != TPR_F32 || out->dtype != TPR_F32 || (pos->dtype != TPR_I32 && pos->dtype != TPR_I64))
    return TPR_FAIL(TPR_ERR_DTYPE, "%s (cpu): x %s, positions %s, out %s; need f32, i32/i64, f32", op,
                    tpr_dtype_name(x->dtype), tpr_dtype_name(pos->dtype), tpr_dtype_name(out->dtype));
  if (!attrs || attrs->n_i < 1 || attrs->n_f < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s (cpu): missing rotary_dim i[0] or theta f[0]", op);
  tpr_rope_opts v;
  TPR_CHECK(tpr__rope_variant(op, attrs, &v));
  const int pnd = v.layout == TPR_MROPE_NONE ? 1 : 2;
  if (x->ndim != 3 || pos->ndim != pnd || pos->shape[pnd - 1] != x->shape[0] || (pnd == 2 && pos->shape[0] != 3) ||
      !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s (cpu): x, positions and out shapes do not fit", op);
  const int64_t T = x->shape[0], NH = x->shape[1], D = x->shape[2], rd = attrs->i[0];
  if (rd <= 0 || rd % 2 || rd > D)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s (cpu): rotary_dim %lld must be even and in (0, %lld]", op, (long long)rd,
                    (long long)D);
  if (tpr_tensor_numel(x) == 0) return TPR_OK;
  const int64_t half = rd / 2;
  const float theta = attrs->f[0];
  const int nt = tpr__cpu_nt(ctx, T * NH * D);
  // inv_freq, then cos and sin of one token per thread.
  float *inv = malloc((1 + 2 * (size_t)nt) * (size_t)half * sizeof *inv);
  if (!inv) return TPR_FAIL(TPR_ERR_OOM, "%s (cpu): %lld floats of scratch", op, (long long)((1 + 2 * nt) * half));
  for (int64_t d = 0; d < half; d++) inv[d] = 1.0f / powf(theta, (float)(2 * d) / (float)rd);
  // Pair k rotates dims (i1, i2): (k, k + half) NeoX, (2k, 2k + 1) GPT-J.
  const int64_t p1 = v.pairing == TPR_ROPE_PAIR_HALF ? 1 : 2, p2 = v.pairing == TPR_ROPE_PAIR_HALF ? half : 1;
  // Position of token t on axis a: row a of (3, T), or the (T) vector.
  const int64_t ps_axis = pnd == 2 ? pos->stride[0] : 0, ps_tok = pos->stride[pnd - 1];

  const float *xd = tpr_tensor_data(x);
  const int64_t s0 = x->stride[0], s1 = x->stride[1], s2 = x->stride[2];
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float *cs = inv + half * (1 + 2 * (int64_t)omp_get_thread_num()), *sn = cs + half;
    float *o = (float *)tpr_tensor_data(out) + t * NH * D;
    for (int64_t d = 0; d < half; d++) {
      const int axis = tpr__mrope_axis(v.layout, v.section, d);
      const float a = (float)tpr__index_at(pos, axis * ps_axis + t * ps_tok) * inv[d];
      cs[d] = cosf(a);
      sn[d] = inverse ? -sinf(a) : sinf(a);
    }
    for (int64_t h = 0; h < NH; h++, o += D) {
      const float *xr = xd + t * s0 + h * s1;
      for (int64_t d = 0; d < half; d++) {
        const int64_t i1 = d * p1, i2 = d * p1 + p2;
        const float x1 = xr[i1 * s2], x2 = xr[i2 * s2];
        o[i1] = x1 * cs[d] - x2 * sn[d];
        o[i2] = x2 * cs[d] + x1 * sn[d];
      }
      for (int64_t d = rd; d < D; d++) o[d] = xr[d * s2];
    }
  }
  free(inv);
  return TPR_OK;
}

TPR_CPU_KERNEL(rope) { return rope_run(ctx, "rope", in, n_in, attrs, out, false); }

// dy (T, heads, D), positions as rope's; rope's attrs; out dx (T, heads, D):
//   dx[i1] = dy[i1]*c + dy[i2]*s,  dx[i2] = dy[i2]*c - dy[i1]*s,
// dims past rotary_dim copied (their forward is the identity).
TPR_CPU_KERNEL(rope_bwd) { return rope_run(ctx, "rope_bwd", in, n_in, attrs, out, true); }

const tpr__kernel_def tpr__rope_cpu[] = {
    {TPR_OP_ROPE, cpu_rope},
    {TPR_OP_ROPE_BWD, cpu_rope_bwd},
    {0},
};
