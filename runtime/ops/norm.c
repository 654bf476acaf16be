// RMS norm CPU kernel: out = x / sqrt(mean(x^2) + eps) * weight per row.
//
// The sum of squares is accumulated in f32 (DESIGN.md section 3) over eight
// interleaved partial sums: a fixed, deterministic order that the compiler
// can vectorise, with an error that grows with H/8 instead of H.
#include <math.h>
#include <stdlib.h>

#include "cpu_kernels.h"
#include "strided.h"

static float sum_squares(const float *x, int64_t n) {  // x (n)
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) acc[l] += x[i + l] * x[i + l];
  for (int l = 0; i < n; i++, l++) acc[l] += x[i] * x[i];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// Gives a unit-stride view of n floats at p (stride s), copying into buf only
// when the row is strided.
static const float *unit_row(const float *p, int64_t s, int64_t n, float *buf) {
  if (s == 1 || n <= 1) return p;
  for (int64_t i = 0; i < n; i++) buf[i] = p[i * s];
  return buf;
}

// x (..., H), weight (H); out (..., H) contiguous. attrs->f[0] = eps.
TPR_CPU_KERNEL(rms_norm) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm (cpu): expected 2 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *w = in[1];
  if (x->dtype != TPR_F32 || w->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "rms_norm (cpu): x %s, weight %s, out %s; only f32 is supported",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(w->dtype), tpr_dtype_name(out->dtype));
  if (!attrs || attrs->n_f < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm (cpu): missing eps attribute f[0]");
  if (x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1] ||
      !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_norm (cpu): x, weight and out shapes do not fit");
  const int64_t H = x->shape[x->ndim - 1];
  if (tpr_tensor_numel(x) == 0) return TPR_OK;
  const float eps = attrs->f[0];

  // Scratch for a strided x row and a strided weight.
  float *buf = malloc(2 * (size_t)H * sizeof *buf);
  if (!buf) return TPR_FAIL(TPR_ERR_OOM, "rms_norm (cpu): %lld floats of scratch", (long long)(2 * H));
  const float *wv = unit_row(tpr_tensor_data(w), w->stride[0], H, buf + H);

  // Rows are visited in row-major order of the leading dims, as out stores them.
  const float *xd = tpr_tensor_data(x);
  float *o = tpr_tensor_data(out);
  const int64_t *st[1] = {x->stride};
  const int64_t xs = x->stride[x->ndim - 1];
  tpr__iter it;
  if (tpr__iter_init(&it, x->ndim - 1, x->shape, 1, st)) {
    do {
      for (int64_t r = 0; r < it.n; r++, o += H) {
        const float *xr = unit_row(xd + it.off[0] + r * it.inner[0], xs, H, buf);
        float inv = 1.0f / sqrtf(sum_squares(xr, H) / (float)H + eps);
        for (int64_t i = 0; i < H; i++) o[i] = xr[i] * inv * wv[i];
      }
    } while (tpr__iter_next(&it));
  }
  free(buf);
  return TPR_OK;
}
