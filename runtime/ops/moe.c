// MoE experts CPU kernel: SwiGLU experts combined with dense gate weights,
// as a grouped GEMM.
//
// For each expert in ascending order: gather the tokens whose gate is
// nonzero (ascending) into a contiguous block X_e (n_e, H), one sgemm
// X_e @ w13[e]^T -> (n_e, 2F) = [w1 x | w3 x], SwiGLU into (n_e, F), one
// sgemm with w2[e]^T -> (n_e, H), then out[t] += gate * y. Experts without
// tokens are skipped. Every token's contributions are added in ascending
// expert order, so the result is deterministic. Matches transformers'
// MiniMax-M2 expert loop: act(w1 x) * (w3 x), w2, times the routing weight,
// index_add into the output. The loop over experts is single-threaded;
// OpenBLAS threads each GEMM.
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "strided.h"

static bool fits_blasint(int64_t v) { return (int64_t)(blasint)v == v; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// How sgemm reads a weight matrix stored (r, c) with strides (s0, s1), used
// transposed: the same rule as matmul.c. A row-major matrix is read as is
// (Trans), a column-major one as its transpose (NoTrans); one with neither
// unit stride is copied into row-major scratch first.
typedef struct operand {
  enum CBLAS_TRANSPOSE op;
  int64_t ld;
  bool copy;
} operand;

static operand layout_t(int64_t r, int64_t c, int64_t s0, int64_t s1) {
  operand o = {CblasTrans, max64(c, 1), false};
  if ((c <= 1 || s1 == 1) && (r <= 1 || s0 >= max64(c, 1))) {
    if (r > 1) o.ld = s0;
  } else if ((r <= 1 || s0 == 1) && (c <= 1 || s1 >= max64(r, 1))) {
    o.op = CblasNoTrans;
    o.ld = c > 1 ? s1 : max64(r, 1);
  } else {
    o.copy = true;
  }
  return o;
}

// Expert e's (r, c) matrix of w (E, r, c), ready for sgemm as its transpose.
static const float *weight(const tpr_tensor *w, int64_t e, float *scratch, operand *o) {
  const int64_t r = w->shape[1], c = w->shape[2];
  const float *m = (const float *)tpr_tensor_data(w) + e * w->stride[0];
  *o = layout_t(r, c, w->stride[1], w->stride[2]);
  if (!o->copy) return m;
  const int64_t shape[2] = {r, c}, cs[2] = {c, 1};
  tpr__strided_copy(scratch, cs, m, w->stride + 1, 2, shape, sizeof(float));
  return scratch;
}

// silu(g) = g / (1 + exp(-g)), torch's formula; g << 0 gives -0, not NaN.
static inline float silu(float g) { return g / (1.0f + expf(-g)); }

// x (T, H), gates (T, E), w13 (E, 2F, H), w2 (E, H, F); out (T, H) contiguous.
TPR_CPU_KERNEL(moe_experts) {
  if (n_in != 4) return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_experts (cpu): expected 4 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *g = in[1], *w13 = in[2], *w2 = in[3];
  if (x->dtype != TPR_F32 || g->dtype != TPR_F32 || w13->dtype != TPR_F32 || w2->dtype != TPR_F32 ||
      out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "moe_experts (cpu): x %s, gates %s, w13 %s, w2 %s, out %s; only f32 is supported",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(g->dtype), tpr_dtype_name(w13->dtype),
                    tpr_dtype_name(w2->dtype), tpr_dtype_name(out->dtype));
  if (x->ndim != 2 || g->ndim != 2 || w13->ndim != 3 || w2->ndim != 3 || !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_experts (cpu): x, gates, w13, w2 and out shapes do not fit");
  const int64_t T = x->shape[0], H = x->shape[1], E = g->shape[1], F2 = w13->shape[1], F = F2 / 2;
  if (g->shape[0] != T || w13->shape[0] != E || w13->shape[2] != H || F2 % 2 || w2->shape[0] != E ||
      w2->shape[1] != H || w2->shape[2] != F)
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_experts (cpu): x, gates, w13, w2 and out shapes do not fit");
  float *o = tpr_tensor_data(out);
  if (T == 0 || H == 0) return TPR_OK;
  memset(o, 0, (size_t)(T * H) * sizeof *o);
  if (F == 0 || E == 0) return TPR_OK;  // every expert output is an empty sum
  if (!fits_blasint(T) || !fits_blasint(F2) || !fits_blasint(H) || !fits_blasint(w13->stride[1]) ||
      !fits_blasint(w13->stride[2]) || !fits_blasint(w2->stride[1]) || !fits_blasint(w2->stride[2]))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "moe_experts (cpu): sizes or strides exceed the BLAS integer range");

  // Scratch: token list, X_e (T, H), [w1 x | w3 x] (T, 2F), act (T, F),
  // y (T, H), and one expert weight matrix when a weight needs a copy.
  const size_t wmax = (size_t)max64(F2 * H, H * F);
  int64_t *idx = malloc((size_t)T * sizeof *idx);
  float *buf = malloc(((size_t)(T * H) * 2 + (size_t)(T * F2) + (size_t)(T * F) + wmax) * sizeof *buf);
  if (!idx || !buf) {
    free(idx), free(buf);
    return TPR_FAIL(TPR_ERR_OOM, "moe_experts (cpu): scratch for %lld tokens", (long long)T);
  }
  float *xe = buf, *gu = xe + T * H, *act = gu + T * F2, *y = act + T * F, *wbuf = y + T * H;
  const float *xd = tpr_tensor_data(x), *gd = tpr_tensor_data(g);
  const int64_t one = 1, xs1 = x->stride[1];
  for (int64_t e = 0; e < E; e++) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++)
      if (gd[t * g->stride[0] + e * g->stride[1]] != 0.0f) idx[n++] = t;
    if (n == 0) continue;
    for (int64_t i = 0; i < n; i++)
      tpr__strided_copy(xe + i * H, &one, xd + idx[i] * x->stride[0], &xs1, 1, &H, sizeof(float));
    operand l13, l2;
    const float *w13e = weight(w13, e, wbuf, &l13);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, l13.op, (blasint)n, (blasint)F2, (blasint)H, 1.0f, xe, (blasint)H,
                w13e, (blasint)l13.ld, 0.0f, gu, (blasint)F2);
    for (int64_t i = 0; i < n; i++)
      for (int64_t f = 0; f < F; f++) act[i * F + f] = silu(gu[i * F2 + f]) * gu[i * F2 + F + f];
    const float *w2e = weight(w2, e, wbuf, &l2);  // w13e is no longer needed: wbuf may be reused
    cblas_sgemm(CblasRowMajor, CblasNoTrans, l2.op, (blasint)n, (blasint)H, (blasint)F, 1.0f, act, (blasint)F, w2e,
                (blasint)l2.ld, 0.0f, y, (blasint)H);
    for (int64_t i = 0; i < n; i++) {
      const float gate = gd[idx[i] * g->stride[0] + e * g->stride[1]];
      float *orow = o + idx[i] * H;
      for (int64_t j = 0; j < H; j++) orow[j] += gate * y[i * H + j];
    }
  }
  free(idx), free(buf);
  return TPR_OK;
}
