// Elementwise CPU kernels: add, mul (numpy broadcasting), swiglu and sigmoid.
//
// Every input is read through strides (a broadcast dim reads with stride 0),
// and the strided iterator merges dims so contiguous operands run one long
// unit-stride row; the row loops below are written so the compiler can
// vectorise the common stride patterns.
//
// The forward kernels split the flat element range over threads
// (cpu_threads.h, tpr__par_pieces); every element is a pure
// function of its inputs, so results do not depend on the thread count.
#include <math.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"
#include "runtime/ops/strided.h"

static tpr_status check_f32(const char *op, const tpr_tensor *const *in, int n_in,
                            const tpr_tensor *out) {
  for (int k = 0; k < n_in; k++)
    if (in[k]->dtype != TPR_F32)
      return TPR_FAIL(TPR_ERR_DTYPE, "%s (cpu): input %d is %s, only f32 is supported", op, k,
                      tpr_dtype_name(in[k]->dtype));
  if (out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s (cpu): output is %s, only f32 is supported", op,
                    tpr_dtype_name(out->dtype));
  return TPR_OK;
}

// One row of out[i] = a[i*sa] OP b[i*sb]. The branches give the vectoriser
// the unit-stride and scalar-broadcast cases as separate loops. No restrict:
// out may share the buffer of a same-shaped input (in-place), read before written.
#define BINARY_ROW(name, OP)                                                               \
  static void name(float *o, const float *a, int64_t sa, const float *b, int64_t sb,      \
                   int64_t n) {                                                            \
    if (sa == 1 && sb == 1) {                                                              \
      for (int64_t i = 0; i < n; i++) o[i] = a[i] OP b[i];                                 \
    } else if (sa == 1 && sb == 0) {                                                       \
      const float bv = b[0];                                                               \
      for (int64_t i = 0; i < n; i++) o[i] = a[i] OP bv;                                   \
    } else if (sa == 0 && sb == 1) {                                                       \
      const float av = a[0];                                                               \
      for (int64_t i = 0; i < n; i++) o[i] = av OP b[i];                                   \
    } else {                                                                               \
      for (int64_t i = 0; i < n; i++) o[i] = a[i * sa] OP b[i * sb];                       \
    }                                                                                      \
  }

BINARY_ROW(add_row, +)
BINARY_ROW(mul_row, *)

typedef void (*binary_row_fn)(float *, const float *, int64_t, const float *, int64_t,
                              int64_t);

typedef struct binary_arg {
  binary_row_fn row;
  float *o;
  const float *a, *b;
} binary_arg;

static void binary_piece(const tpr__iter *it, int64_t col, int64_t len, int64_t q, void *arg) {
  const binary_arg *p = arg;
  // out is contiguous, so its merged inner stride is 1 (or n == 1).
  p->row(p->o + it->off[0] + col * it->inner[0], p->a + it->off[1] + col * it->inner[1], it->inner[1],
         p->b + it->off[2] + col * it->inner[2], it->inner[2], len);
}

// a (...), b (...) broadcastable to out (...); out contiguous.
static tpr_status run_binary(const void *ctx, const char *op, binary_row_fn row, const tpr_tensor *const *in,
                             int n_in, tpr_tensor *out) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s (cpu): expected 2 inputs, got %d", op, n_in);
  TPR_CHECK(check_f32(op, in, n_in, out));
  int64_t so[TPR_MAX_DIMS], sa[TPR_MAX_DIMS], sb[TPR_MAX_DIMS];
  tpr__contig_strides(out->ndim, out->shape, so);
  tpr__broadcast_strides(in[0], out->ndim, out->shape, sa);
  tpr__broadcast_strides(in[1], out->ndim, out->shape, sb);
  const int64_t *st[3] = {so, sa, sb};
  tpr__iter it;
  if (!tpr__iter_init(&it, out->ndim, out->shape, 3, st)) return TPR_OK;
  binary_arg arg = {row, tpr_tensor_data(out), tpr_tensor_data(in[0]), tpr_tensor_data(in[1])};
  tpr__par_pieces(ctx, &it, binary_piece, &arg);
  return TPR_OK;
}

TPR_CPU_KERNEL(add) { return run_binary(ctx, "add", add_row, in, n_in, out); }
TPR_CPU_KERNEL(mul) { return run_binary(ctx, "mul", mul_row, in, n_in, out); }

// sigmoid(g) from e = exp(-|g|), which never overflows: for g >= 0 it is
// 1 / (1 + e), for g < 0 it is e / (1 + e).
static inline float sigmoid1(float g) {
  float e = expf(-fabsf(g));
  return (g >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// sigmoid'(x) = s (1 - s) = e / (1 + e)^2 with e = exp(-|x|) (it is even):
// no 1 - s, which would cancel to 0 for x > 17 where the true value is e.
static inline float dsigmoid1(float x) {
  float e = expf(-fabsf(x)), d = 1.0f + e;
  return e / (d * d);
}

// silu(g) * u with sigmoid1. (g = -inf gives NaN from -inf * 0.)
static inline float swiglu1(float g, float u) { return g * sigmoid1(g) * u; }

typedef struct swiglu_arg {
  float *o;
  const float *g, *u;
} swiglu_arg;

static void swiglu_piece(const tpr__iter *it, int64_t col, int64_t len, int64_t q, void *arg) {
  const swiglu_arg *p = arg;
  float *orow = p->o + it->off[0] + col * it->inner[0];
  const int64_t sg = it->inner[1], su = it->inner[2];
  const float *grow = p->g + it->off[1] + col * sg, *urow = p->u + it->off[2] + col * su;
  if (sg == 1 && su == 1) {
    for (int64_t i = 0; i < len; i++) orow[i] = swiglu1(grow[i], urow[i]);
  } else {
    for (int64_t i = 0; i < len; i++) orow[i] = swiglu1(grow[i * sg], urow[i * su]);
  }
}

// gate (..., F), up (..., F), out (..., F); same shapes, inputs strided.
TPR_CPU_KERNEL(swiglu) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "swiglu (cpu): expected 2 inputs, got %d", n_in);
  TPR_CHECK(check_f32("swiglu", in, n_in, out));
  for (int k = 0; k < 2; k++)
    if (!tpr_tensor_same_shape(in[k], out))
      return TPR_FAIL(TPR_ERR_SHAPE, "swiglu (cpu): input %d shape differs from the output", k);
  int64_t so[TPR_MAX_DIMS];
  tpr__contig_strides(out->ndim, out->shape, so);
  const int64_t *st[3] = {so, in[0]->stride, in[1]->stride};
  tpr__iter it;
  if (!tpr__iter_init(&it, out->ndim, out->shape, 3, st)) return TPR_OK;
  swiglu_arg arg = {tpr_tensor_data(out), tpr_tensor_data(in[0]), tpr_tensor_data(in[1])};
  tpr__par_pieces(ctx, &it, swiglu_piece, &arg);
  return TPR_OK;
}

typedef struct swiglu_bwd_arg {
  float *dg, *du;  // (n) each, row-major
  const float *g, *u, *d;
} swiglu_bwd_arg;

static void swiglu_bwd_piece(const tpr__iter *it, int64_t col, int64_t len, int64_t q, void *arg) {
  const swiglu_bwd_arg *p = arg;
  for (int64_t i = col, k = q; i < col + len; i++, k++) {  // the iterator keeps row-major order: k is the packed index
    float gv = p->g[it->off[0] + i * it->inner[0]], uv = p->u[it->off[1] + i * it->inner[1]];
    float dv = p->d[it->off[2] + i * it->inner[2]];
    float s = sigmoid1(gv);
    p->dg[k] = dv * uv * s * (1.0f + gv * (1.0f - s));
    p->du[k] = dv * gv * s;
  }
}

// gate, up, dy (...) same shape, any strides; out packed (dgate | dup), each
// in row-major order. With s = sigmoid(g) (swiglu1's stable form):
//   dgate = dy * u * s * (1 + g * (1 - s)),  dup = dy * g * s.
TPR_CPU_KERNEL(swiglu_bwd) {
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "swiglu_bwd (cpu): expected 3 inputs, got %d", n_in);
  const int64_t n = tpr_tensor_numel(in[0]);
  if (out->dtype != TPR_F32 || tpr_tensor_numel(out) != 2 * n)
    return TPR_FAIL(TPR_ERR_SHAPE, "swiglu_bwd (cpu): out must be f32 (%lld)", (long long)(2 * n));
  const int64_t *st[3] = {in[0]->stride, in[1]->stride, in[2]->stride};
  tpr__iter it;
  if (!tpr__iter_init(&it, in[0]->ndim, in[0]->shape, 3, st)) return TPR_OK;
  float *dg = tpr_tensor_data(out);
  swiglu_bwd_arg arg = {dg, dg + n, tpr_tensor_data(in[0]), tpr_tensor_data(in[1]), tpr_tensor_data(in[2])};
  tpr__par_pieces(ctx, &it, swiglu_bwd_piece, &arg);
  return TPR_OK;
}

typedef struct sigmoid_arg {
  float *o;  // out (n) row-major
  const float *x, *dy;  // dy: NULL for the forward
} sigmoid_arg;

static void sigmoid_piece(const tpr__iter *it, int64_t col, int64_t len, int64_t q, void *arg) {
  const sigmoid_arg *p = arg;
  float *orow = p->o + it->off[0] + col * it->inner[0];
  const int64_t sx = it->inner[1];
  const float *xrow = p->x + it->off[1] + col * sx;
  if (!p->dy) {
    for (int64_t i = 0; i < len; i++) orow[i] = sigmoid1(xrow[i * sx]);
    return;
  }
  const int64_t sd = it->inner[2];
  const float *drow = p->dy + it->off[2] + col * sd;
  for (int64_t i = 0; i < len; i++) orow[i] = drow[i * sd] * dsigmoid1(xrow[i * sx]);
}

// x (...) and, for the backward, dy (...) of x's shape, any strides; out
// (...) contiguous: sigmoid(x), or dy * sigmoid'(x).
static tpr_status run_sigmoid(const void *ctx, const char *op, const tpr_tensor *const *in, int n_in, int want,
                              tpr_tensor *out) {
  if (n_in != want) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s (cpu): expected %d inputs, got %d", op, want, n_in);
  TPR_CHECK(check_f32(op, in, n_in, out));
  for (int k = 0; k < n_in; k++)
    if (!tpr_tensor_same_shape(in[k], out))
      return TPR_FAIL(TPR_ERR_SHAPE, "%s (cpu): input %d shape differs from the output", op, k);
  int64_t so[TPR_MAX_DIMS];
  tpr__contig_strides(out->ndim, out->shape, so);
  const int64_t *st[3] = {so, in[0]->stride, n_in > 1 ? in[1]->stride : so};
  tpr__iter it;
  if (!tpr__iter_init(&it, out->ndim, out->shape, n_in + 1, st)) return TPR_OK;
  sigmoid_arg arg = {tpr_tensor_data(out), tpr_tensor_data(in[0]), n_in > 1 ? tpr_tensor_data(in[1]) : NULL};
  tpr__par_pieces(ctx, &it, sigmoid_piece, &arg);
  return TPR_OK;
}

TPR_CPU_KERNEL(sigmoid) { return run_sigmoid(ctx, "sigmoid", in, n_in, 1, out); }
TPR_CPU_KERNEL(sigmoid_bwd) { return run_sigmoid(ctx, "sigmoid_bwd", in, n_in, 2, out); }

const tpr__kernel_def tpr__elementwise_cpu[] = {
    {TPR_OP_ADD, cpu_add},
    {TPR_OP_MUL, cpu_mul},
    {TPR_OP_SWIGLU, cpu_swiglu},
    {TPR_OP_SWIGLU_BWD, cpu_swiglu_bwd},
    {TPR_OP_SIGMOID, cpu_sigmoid},
    {TPR_OP_SIGMOID_BWD, cpu_sigmoid_bwd},
    {0},
};
