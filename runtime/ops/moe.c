// MoE expert CPU kernels: SwiGLU experts as a grouped GEMM, fed either by
// dense gate weights (moe_experts) or by dispatched rows (moe_grouped_ffn,
// the expert-parallel path). Both run each expert through expert_ffn below,
// so a row gets the same per-row math whichever dispatcher brought it.
//
// moe_experts:
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

// Scratch for expert_ffn over up to `rows` rows: X_e (rows, H), [w1 x | w3 x]
// (rows, 2F), act (rows, F), y (rows, H), and one expert weight matrix for
// when a weight needs a row-major copy.
typedef struct ffn_scratch {
  float *xe, *gu, *act, *y, *wbuf;
} ffn_scratch;

static tpr_status scratch_new(const char *op, int64_t rows, int64_t H, int64_t F, ffn_scratch *s) {
  const size_t wmax = (size_t)max64(2 * F * H, H * F);
  float *buf = malloc(((size_t)(rows * H) * 2 + (size_t)(rows * 2 * F) + (size_t)(rows * F) + wmax + 1) * sizeof *buf);
  if (!buf) return TPR_FAIL(TPR_ERR_OOM, "%s (cpu): scratch for %lld rows", op, (long long)rows);
  s->xe = buf, s->gu = s->xe + rows * H, s->act = s->gu + rows * 2 * F, s->y = s->act + rows * F;
  s->wbuf = s->y + rows * H;
  return TPR_OK;
}

// Shapes every expert kernel needs, in the BLAS integer range: rows (the
// most an expert gets), F2 = 2F, H, and the weights' inner strides.
static tpr_status check_blas_range(const char *op, int64_t rows, int64_t F2, int64_t H, const tpr_tensor *w13,
                                   const tpr_tensor *w2) {
  if (!fits_blasint(rows) || !fits_blasint(F2) || !fits_blasint(H) || !fits_blasint(w13->stride[1]) ||
      !fits_blasint(w13->stride[2]) || !fits_blasint(w2->stride[1]) || !fits_blasint(w2->stride[2]))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s (cpu): sizes or strides exceed the BLAS integer range", op);
  return TPR_OK;
}

// s->y (n, H) = w2[e] @ (silu(w1[e] x) * (w3[e] x)) for the n rows of s->xe
// (n, H): one sgemm with w13[e]^T -> (n, 2F), SwiGLU into (n, F), one sgemm
// with w2[e]^T. w13 (E, 2F, H), w2 (E, H, F), any strides.
static void expert_ffn(const tpr_tensor *w13, const tpr_tensor *w2, int64_t e, int64_t n, const ffn_scratch *s) {
  const int64_t F2 = w13->shape[1], F = F2 / 2, H = w13->shape[2];
  operand l13, l2;
  const float *w13e = weight(w13, e, s->wbuf, &l13);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, l13.op, (blasint)n, (blasint)F2, (blasint)H, 1.0f, s->xe, (blasint)H,
              w13e, (blasint)l13.ld, 0.0f, s->gu, (blasint)F2);
  for (int64_t i = 0; i < n; i++)
    for (int64_t f = 0; f < F; f++) s->act[i * F + f] = silu(s->gu[i * F2 + f]) * s->gu[i * F2 + F + f];
  const float *w2e = weight(w2, e, s->wbuf, &l2);  // w13e is no longer needed: wbuf may be reused
  cblas_sgemm(CblasRowMajor, CblasNoTrans, l2.op, (blasint)n, (blasint)H, (blasint)F, 1.0f, s->act, (blasint)F, w2e,
              (blasint)l2.ld, 0.0f, s->y, (blasint)H);
}

// Copies row r of x (rows, H) (any strides) to dst (H) contiguous.
static void load_row(float *dst, const tpr_tensor *x, int64_t r) {
  const int64_t one = 1, H = x->shape[1];
  tpr__strided_copy(dst, &one, (const float *)tpr_tensor_data(x) + r * x->stride[0], &x->stride[1], 1, &H,
                    sizeof(float));
}

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
  TPR_CHECK(check_blas_range("moe_experts", T, F2, H, w13, w2));
  int64_t *idx = malloc((size_t)T * sizeof *idx);  // the current expert's tokens
  ffn_scratch s = {0};
  if (!idx || scratch_new("moe_experts", T, H, F, &s) != TPR_OK) {
    free(idx), free(s.xe);
    return TPR_FAIL(TPR_ERR_OOM, "moe_experts (cpu): scratch for %lld tokens", (long long)T);
  }
  const float *gd = tpr_tensor_data(g);
  for (int64_t e = 0; e < E; e++) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++)
      if (gd[t * g->stride[0] + e * g->stride[1]] != 0.0f) idx[n++] = t;
    if (n == 0) continue;
    for (int64_t i = 0; i < n; i++) load_row(s.xe + i * H, x, idx[i]);
    expert_ffn(w13, w2, e, n, &s);
    for (int64_t i = 0; i < n; i++) {
      const float gate = gd[idx[i] * g->stride[0] + e * g->stride[1]];
      float *orow = o + idx[i] * H;
      for (int64_t j = 0; j < H; j++) orow[j] += gate * s.y[i * H + j];
    }
  }
  free(idx), free(s.xe);
  return TPR_OK;
}

// x (R, H), counts (n*Er) i32, w13 (Er, 2F, H), w2 (Er, H, F); out (R, H)
// contiguous. x holds n source blocks, each with counts[s*Er + e] rows for
// local expert e in ascending e: the layout all_to_allv gives when every
// peer sends its moe_permute rows. Each expert gathers its rows from every
// block (sources ascending) into one contiguous X_e, runs expert_ffn once,
// and its outputs go back to the same row positions of out; rows past the
// counted ones are not written.
TPR_CPU_KERNEL(moe_grouped_ffn) {
  if (n_in != 4) return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_grouped_ffn (cpu): expected 4 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *c = in[1], *w13 = in[2], *w2 = in[3];
  if (x->dtype != TPR_F32 || c->dtype != TPR_I32 || w13->dtype != TPR_F32 || w2->dtype != TPR_F32 ||
      out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "moe_grouped_ffn (cpu): x %s, counts %s, w13 %s, w2 %s, out %s; need f32 with "
                    "i32 counts", tpr_dtype_name(x->dtype), tpr_dtype_name(c->dtype), tpr_dtype_name(w13->dtype),
                    tpr_dtype_name(w2->dtype), tpr_dtype_name(out->dtype));
  if (x->ndim != 2 || c->ndim != 1 || w13->ndim != 3 || w2->ndim != 3 || !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_grouped_ffn (cpu): x, counts, w13, w2 and out shapes do not fit");
  const int64_t R = x->shape[0], H = x->shape[1], Er = w13->shape[0], F2 = w13->shape[1], F = F2 / 2;
  const int64_t L = c->shape[0];
  if (Er < 1 || L % Er || L < Er || w13->shape[2] != H || F2 % 2 || w2->shape[0] != Er || w2->shape[1] != H ||
      w2->shape[2] != F)
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_grouped_ffn (cpu): x, counts, w13, w2 and out shapes do not fit");
  const int64_t nsrc = L / Er;
  // start[i] / cnt[i]: first row and row count of (source s, expert e), i = s*Er + e.
  int64_t *start = malloc(2 * (size_t)L * sizeof *start), *cnt = start + L;
  if (!start) return TPR_FAIL(TPR_ERR_OOM, "moe_grouped_ffn (cpu): %lld counts", (long long)L);
  const int32_t *cd = tpr_tensor_data(c);
  int64_t total = 0, most = 0;
  for (int64_t i = 0; i < L; i++) {
    cnt[i] = cd[i * c->stride[0]];
    start[i] = total;
    total += cnt[i];
    if (cnt[i] < 0 || total > R) {
      const long long k = (long long)cnt[i], src = (long long)(i / Er), ex = (long long)(i % Er);
      free(start);  // cnt lives in the same block
      if (k < 0)
        return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_grouped_ffn: count %lld (source %lld, expert %lld) is negative: %lld",
                        (long long)i, src, ex, k);
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_grouped_ffn: counts add up to %lld rows by entry %lld (source %lld, "
                      "expert %lld), past x's R = %lld rows", (long long)total, (long long)i, src, ex, (long long)R);
    }
  }
  for (int64_t e = 0; e < Er; e++) {
    int64_t n = 0;
    for (int64_t s = 0; s < nsrc; s++) n += cnt[s * Er + e];
    most = max64(most, n);
  }
  float *o = tpr_tensor_data(out);
  tpr_status rc = TPR_OK;
  ffn_scratch s = {0};
  if (total == 0 || H == 0) goto done;
  if (F == 0) {  // an empty sum per row: zeros
    memset(o, 0, (size_t)(total * H) * sizeof *o);
    goto done;
  }
  if ((rc = check_blas_range("moe_grouped_ffn", most, F2, H, w13, w2)) != TPR_OK) goto done;
  if ((rc = scratch_new("moe_grouped_ffn", most, H, F, &s)) != TPR_OK) goto done;
  for (int64_t e = 0; e < Er; e++) {
    int64_t n = 0;
    for (int64_t src = 0; src < nsrc; src++)
      for (int64_t r = start[src * Er + e]; r < start[src * Er + e] + cnt[src * Er + e]; r++)
        load_row(s.xe + (n++) * H, x, r);
    if (n == 0) continue;
    expert_ffn(w13, w2, e, n, &s);
    n = 0;
    for (int64_t src = 0; src < nsrc; src++)
      for (int64_t r = start[src * Er + e]; r < start[src * Er + e] + cnt[src * Er + e]; r++)
        memcpy(o + r * H, s.y + (n++) * H, (size_t)H * sizeof *o);
  }
done:
  free(start), free(s.xe);
  return rc;
}
