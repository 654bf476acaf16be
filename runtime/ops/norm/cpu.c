// RMS norm CPU kernels: rms_norm, out = x / sqrt(mean(x^2) + eps) * weight
// per row, and its distributed halves sum_squares (local sum of x^2, to be
// all-reduced) and rms_scale (x * rsqrt(sumsq / divisor + eps) * weight).
//
// rms_norm's sum of squares is accumulated in f32 (docs/architecture.md section 3) over
// eight interleaved partial sums: a fixed, deterministic order that the
// compiler can vectorise, with an error that grows with H/8 instead of H.
// sum_squares accumulates in double (four interleaved lanes, also a fixed
// order) and rounds once to f32, so each rank's partial carries one rounding
// before the tp all-reduce adds them, whatever the slice length.
//
// The forward kernels split rows over threads (cpu_threads.h); a row is
// always summed by one thread in the order above, so results do not depend
// on the thread count.
#include <math.h>
#include <stdlib.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"
#include "runtime/ops/strided.h"

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

  // Row r (row-major over the leading dims) goes to out's row r.
  const int64_t *st[1] = {x->stride};
  tpr__row_iter R;
  tpr__row_iter_init(&R, ctx, x->ndim, x->shape, 1, st, H);  // not empty: numel > 0
  const int nt = R.nt;

  // Scratch for a strided x row per thread and a strided weight.
  float *buf = malloc((size_t)(nt + 1) * (size_t)H * sizeof *buf);
  if (!buf) return TPR_FAIL(TPR_ERR_OOM, "rms_norm (cpu): %lld floats of scratch", (long long)((nt + 1) * H));
  const float *wv = unit_row(tpr_tensor_data(w), w->stride[0], H, buf + (int64_t)nt * H);

  const float *xd = tpr_tensor_data(x);
  float *o = tpr_tensor_data(out);
  const int64_t xs = x->stride[x->ndim - 1];
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < R.rows; r++) {
    float *orow = o + r * H;
    const float *xr = unit_row(xd + tpr__iter_offset_at(&R.it, 0, r), xs, H, buf + omp_get_thread_num() * H);
    float inv = 1.0f / sqrtf(sum_squares(xr, H) / (float)H + eps);
    for (int64_t i = 0; i < H; i++) orow[i] = xr[i] * inv * wv[i];
  }
  free(buf);
  return TPR_OK;
}

// Four interleaved double lanes combined as (0 + 2) + (1 + 3): a fixed order.
static double sum_squares_f64(const float *x, int64_t n, int64_t s) {  // x (n) stride s
  double acc[4] = {0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; l++) acc[l] += (double)x[(i + l) * s] * x[(i + l) * s];
  for (int l = 0; i < n; i++, l++) acc[l] += (double)x[i * s] * x[i * s];
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// x (..., N); out (..., 1) contiguous.
TPR_CPU_KERNEL(sum_squares) {
  if (n_in != 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "sum_squares (cpu): expected 1 input, got %d", n_in);
  const tpr_tensor *x = in[0];
  if (x->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "sum_squares (cpu): x %s, out %s; only f32 is supported",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(out->dtype));
  if (x->ndim < 1 || out->ndim != x->ndim || out->shape[x->ndim - 1] != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "sum_squares (cpu): out must be x's shape with last dim 1");
  const int64_t N = x->shape[x->ndim - 1], xs = x->stride[x->ndim - 1];
  float *o = tpr_tensor_data(out);
  const float *xd = tpr_tensor_data(x);
  const int64_t *st[1] = {x->stride};
  tpr__row_iter R;
  if (!tpr__row_iter_init(&R, ctx, x->ndim, x->shape, 1, st, N)) return TPR_OK;
#pragma omp parallel for num_threads(R.nt) if (R.nt > 1) schedule(static)
  for (int64_t r = 0; r < R.rows; r++) o[r] = (float)sum_squares_f64(xd + tpr__iter_offset_at(&R.it, 0, r), N, xs);
  return TPR_OK;
}

// x (..., N), sumsq (..., 1), weight (N); out (..., N) contiguous.
// attrs->f[0] = divisor, f[1] = eps.
TPR_CPU_KERNEL(rms_scale) {
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_scale (cpu): expected 3 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *ss = in[1], *w = in[2];
  if (x->dtype != TPR_F32 || ss->dtype != TPR_F32 || w->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "rms_scale (cpu): x %s, sumsq %s, weight %s, out %s; only f32 is supported",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(ss->dtype), tpr_dtype_name(w->dtype),
                    tpr_dtype_name(out->dtype));
  if (!attrs || attrs->n_f < 2)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_scale (cpu): missing divisor f[0] and eps f[1]");
  if (x->ndim < 1 || ss->ndim != x->ndim || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1] ||
      !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_scale (cpu): x, sumsq, weight and out shapes do not fit");
  const int64_t N = x->shape[x->ndim - 1], xs = x->stride[x->ndim - 1], ws = w->stride[0];
  const float divisor = attrs->f[0], eps = attrs->f[1];
  const float *xd = tpr_tensor_data(x), *sd = tpr_tensor_data(ss), *wd = tpr_tensor_data(w);
  float *o = tpr_tensor_data(out);
  const int64_t *st[2] = {x->stride, ss->stride};
  tpr__row_iter R;
  if (N == 0 || !tpr__row_iter_init(&R, ctx, x->ndim, x->shape, 2, st, N)) return TPR_OK;
#pragma omp parallel for num_threads(R.nt) if (R.nt > 1) schedule(static)
  for (int64_t r = 0; r < R.rows; r++) {
    const float *xr = xd + tpr__iter_offset_at(&R.it, 0, r);
    float *orow = o + r * N;
    // torch, in f32: variance = sumsq / divisor; x * rsqrt(variance + eps); * weight.
    const float variance = sd[tpr__iter_offset_at(&R.it, 1, r)] / divisor;
    const float inv = 1.0f / sqrtf(variance + eps);
    for (int64_t i = 0; i < N; i++) orow[i] = (xr[i * xs] * inv) * wd[i * ws];
  }
  return TPR_OK;
}

// ---- Backward. Row statistics and the weight gradient's sum over rows are
// accumulated in double (rows in row-major order, elements in order: a fixed
// order), each result rounded once to f32.

// Element offset of row r (row-major over the leading dims) of t (..., H).
static int64_t row_offset(const tpr_tensor *t, int64_t r) {
  int64_t off = 0;
  for (int d = t->ndim - 2; d >= 0; d--) {
    off += (r % t->shape[d]) * t->stride[d];
    r /= t->shape[d];
  }
  return off;
}

// x (..., H), w (H), dy (..., H); out packed (dx (..., H) | dw (H)). f[0] eps.
// y = x * r * w, r = 1 / sqrt(sum x^2 / H + eps):
//   dx = r * w * dy - x * r^3 / H * sum_j (dy_j w_j x_j),  dw = sum_rows dy * x * r.
TPR_CPU_KERNEL(rms_norm_bwd) {
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm_bwd (cpu): expected 3 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *w = in[1], *dy = in[2];
  const int64_t H = x->shape[x->ndim - 1], rows = H ? tpr_tensor_numel(x) / H : 0;
  if (out->dtype != TPR_F32 || tpr_tensor_numel(out) != rows * H + H)
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_norm_bwd (cpu): out must be f32 (%lld)", (long long)(rows * H + H));
  double *dw = calloc((size_t)(H ? H : 1), sizeof *dw);
  if (!dw) return TPR_FAIL(TPR_ERR_OOM, "rms_norm_bwd (cpu): %lld doubles of scratch", (long long)H);
  const double eps = attrs->f[0];
  const float *xd = tpr_tensor_data(x), *wd = tpr_tensor_data(w), *gd = tpr_tensor_data(dy);
  const int64_t xs = x->stride[x->ndim - 1], ws = w->stride[0], gs = dy->stride[dy->ndim - 1];
  float *dx = tpr_tensor_data(out);
  for (int64_t r = 0; r < rows; r++, dx += H) {
    const float *xr = xd + row_offset(x, r), *gr = gd + row_offset(dy, r);
    double ss = 0, dot = 0;
    for (int64_t i = 0; i < H; i++) {
      double xv = xr[i * xs];
      ss += xv * xv;
      dot += (double)gr[i * gs] * wd[i * ws] * xv;
    }
    const double inv = 1.0 / sqrt(ss / (double)H + eps), c = inv * inv * inv * dot / (double)H;
    for (int64_t i = 0; i < H; i++) {
      double xv = xr[i * xs], gv = gr[i * gs];
      dx[i] = (float)(inv * wd[i * ws] * gv - c * xv);
      dw[i] += gv * xv * inv;
    }
  }
  for (int64_t i = 0; i < H; i++) dx[i] = (float)dw[i];  // dx now points past the rows: the dw block
  free(dw);
  return TPR_OK;
}

// x (..., N), sumsq (..., 1), w (N), dy (..., N); f[0] divisor, f[1] eps;
// out packed (dx (..., N) | dsumsq (..., 1) | dw (N)). With r = 1 /
// sqrt(sumsq / divisor + eps) and sumsq an input (its own cotangent carries
// the path through the sum of squares):
//   dx = r * w * dy,  dsumsq = sum_n (dy x w) * (-0.5) r^3 / divisor,
//   dw = sum_rows dy * x * r.
TPR_CPU_KERNEL(rms_scale_bwd) {
  if (n_in != 4) return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_scale_bwd (cpu): expected 4 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *ss = in[1], *w = in[2], *dy = in[3];
  const int64_t N = x->shape[x->ndim - 1], rows = tpr_tensor_numel(ss);
  if (out->dtype != TPR_F32 || tpr_tensor_numel(out) != rows * N + rows + N)
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_scale_bwd (cpu): out must be f32 (%lld)", (long long)(rows * N + rows + N));
  double *dw = calloc((size_t)(N ? N : 1), sizeof *dw);
  if (!dw) return TPR_FAIL(TPR_ERR_OOM, "rms_scale_bwd (cpu): %lld doubles of scratch", (long long)N);
  const double divisor = attrs->f[0], eps = attrs->f[1];
  const float *xd = tpr_tensor_data(x), *sd = tpr_tensor_data(ss), *wd = tpr_tensor_data(w),
              *gd = tpr_tensor_data(dy);
  const int64_t xs = x->stride[x->ndim - 1], ws = w->stride[0], gs = dy->stride[dy->ndim - 1];
  float *dx = tpr_tensor_data(out), *dss = dx + rows * N;
  for (int64_t r = 0; r < rows; r++, dx += N) {
    const float *xr = xd + row_offset(x, r), *gr = gd + row_offset(dy, r);
    const double inv = 1.0 / sqrt((double)sd[row_offset(ss, r)] / divisor + eps);
    double dot = 0;
    for (int64_t i = 0; i < N; i++) {
      double xv = xr[i * xs], gv = gr[i * gs], wv = wd[i * ws];
      dot += gv * xv * wv;
      dx[i] = (float)(inv * wv * gv);
      dw[i] += gv * xv * inv;
    }
    dss[r] = (float)(dot * -0.5 * inv * inv * inv / divisor);
  }
  float *dwo = dss + rows;
  for (int64_t i = 0; i < N; i++) dwo[i] = (float)dw[i];
  free(dw);
  return TPR_OK;
}

const tpr__kernel_def tpr__norm_cpu[] = {
    {TPR_OP_RMS_NORM, cpu_rms_norm},
    {TPR_OP_SUM_SQUARES, cpu_sum_squares},
    {TPR_OP_RMS_SCALE, cpu_rms_scale},
    {TPR_OP_RMS_NORM_BWD, cpu_rms_norm_bwd},
    {TPR_OP_RMS_SCALE_BWD, cpu_rms_scale_bwd},
    {0},
};
