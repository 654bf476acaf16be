// Matmul CPU kernel: OpenBLAS sgemm, one call per batch or one for all.
//
// sgemm (row-major) reads a matrix with one unit stride: a row-major view
// (unit column stride, ld = row stride) is passed as is, a column-major view
// (unit row stride) is passed as its transpose with the other flag, so
// transposed and permuted views need no copy. Only a matrix with neither unit
// stride goes through a contiguous scratch copy.
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/strided.h"
#include "runtime/ops/gemm/weight_gemm.h"

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static bool fits_blasint(int64_t v) { return (int64_t)(blasint)v == v; }

// How sgemm reads one operand. The stored matrix is (r, c) with strides
// (s0, s1); the logical operand is stored^T when trans is set.
typedef struct operand {
  enum CBLAS_TRANSPOSE op;
  int64_t ld;
  bool copy;  // neither stride is unit: read from a contiguous scratch copy
} operand;

static operand layout(int64_t r, int64_t c, int64_t s0, int64_t s1, bool trans) {
  operand o = {trans ? CblasTrans : CblasNoTrans, max64(c, 1), false};
  if ((c <= 1 || s1 == 1) && (r <= 1 || s0 >= max64(c, 1))) {  // row-major
    if (r > 1) o.ld = s0;
  } else if ((r <= 1 || s0 == 1) && (c <= 1 || s1 >= max64(r, 1))) {  // column-major
    o.op = trans ? CblasNoTrans : CblasTrans;
    o.ld = c > 1 ? s1 : max64(r, 1);
  } else {
    o.copy = true;  // scratch is row-major (r, c): the defaults above
  }
  return o;
}

// One operand as f32: a bf16 one widened into a contiguous scratch copy
// (*buf, freed by the caller), described by *view; an f32 one as it is.
static tpr_status widen(const char *name, const tpr_tensor *t, tpr_tensor *view, const float **data, float **buf) {
  *view = *t;
  *buf = NULL;
  *data = tpr_tensor_data(t);
  if (t->dtype == TPR_F32) return TPR_OK;
  size_t n = (size_t)tpr_tensor_numel(t), es = tpr_dtype_size(t->dtype);
  void *packed = malloc(n * es + 1);
  *buf = malloc(n * sizeof **buf + 1);
  if (!packed || !*buf) {
    free(packed);
    free(*buf);
    *buf = NULL;
    return TPR_FAIL(TPR_ERR_OOM, "matmul (cpu): an f32 copy of %s (%zu elements)", name, n);
  }
  tpr_shape_contiguous_strides(t->ndim, t->shape, view->stride);
  tpr__strided_copy(packed, view->stride, tpr_tensor_data(t), t->stride, t->ndim, t->shape, es);
  tpr_dtype_convert(packed, t->dtype, *buf, TPR_F32, n);
  free(packed);
  view->dtype = TPR_F32;
  *data = *buf;
  return TPR_OK;
}

// The rows of logical A (..., M, K) over every batch as one strided
// row-major (R, K) matrix, when the batch dims chain (the iterator merges
// them into M exactly then) and A's columns have unit stride: *lda its row
// step. sa: a's batch strides (nb), so: out's contiguous strides.
static bool rows_of(const tpr_tensor *a, bool ta, int nb, const int64_t *sa, const int64_t *so,
                    const int64_t *out_shape, int64_t K, int64_t *rows, int64_t *lda) {
  const int64_t *as = a->stride + a->ndim - 2;
  operand la = layout(a->shape[a->ndim - 2], a->shape[a->ndim - 1], as[0], as[1], ta);
  if (la.copy || la.op != CblasNoTrans) return false;
  int64_t ss[TPR_MAX_DIMS];
  memcpy(ss, sa, (size_t)nb * sizeof *ss);
  ss[nb] = ta ? as[1] : as[0];  // step between rows of logical A
  const int64_t *st[2] = {so, ss};
  tpr__iter it = {0};
  tpr__iter_init(&it, nb + 1, out_shape, 2, st);
  *rows = it.n;
  *lda = it.n > 1 ? it.inner[1] : la.ld;
  return it.ndim == 1 && *lda >= K;
}

// W (rows, K) row-major from a 2-D operand read transposed (b with trans_b,
// or a without trans_a: the lm head's (V, H) @ x^T).
static bool weight_of(const tpr_tensor *t, tpr_weight_view *w) {
  int64_t r = t->shape[0], c = t->shape[1];
  if (t->ndim != 2 || !((c <= 1 || t->stride[1] == 1) && (r <= 1 || t->stride[0] >= c))) return false;
  *w = tpr__weight_view(tpr_tensor_data(t), t->dtype, r > 1 ? t->stride[0] : (c > 0 ? c : 1));
  return true;
}

// The paths that read a 2-D operand as a weight matrix W (rows, K): few
// rows against it take the skinny kernel (no packing, W read once), and a
// bf16 W is read as it is. Returns false when the layout does not fit
// (the general path below then runs).
static bool weight_path(const tpr_cpu_ctx *ctx, const tpr_tensor *a, const tpr_tensor *b, bool ta, bool tb,
                        int64_t M, int64_t N, int64_t K, int nb, const int64_t *sa, const int64_t *sb,
                        const int64_t *so, const tpr_tensor *out, tpr_status *rc) {
  float *o = tpr_tensor_data(out);
  tpr_weight_view w;
  bool b_shared = true;
  for (int d = 0; d < nb; d++) b_shared &= sb[d] == 0;
  int64_t rows, lda;
  // out (R, N) = A (R, K) @ W^T, W = b (N, K).
  if (b_shared && tb && a->dtype == TPR_F32 && weight_of(b, &w) && rows_of(a, ta, nb, sa, so, out->shape, K, &rows, &lda) &&
      (rows <= TPR_SKINNY_MAX_ROWS || b->dtype != TPR_F32)) {
    *rc = tpr__weight_gemm(ctx, tpr_tensor_data(a), lda, rows, K, &w, N, o, N);
    return true;
  }
  // out (M, N) = W @ X^T with W = a (M, K), X = b (N, K): computed as
  // out^T (N, M) = X @ W^T, then transposed (in place of nothing at N = 1).
  if (nb == 0 && !ta && tb && b->dtype == TPR_F32 && weight_of(a, &w) && (N <= TPR_SKINNY_MAX_ROWS || a->dtype != TPR_F32)) {
    int64_t ldx = b->shape[0] > 1 ? b->stride[0] : K;
    if (b->shape[1] > 1 && b->stride[1] != 1) return false;
    if (N == 1) {
      *rc = tpr__weight_gemm(ctx, tpr_tensor_data(b), ldx, N, K, &w, M, o, M);
      return true;
    }
    float *t = malloc((size_t)(M * N) * sizeof *t);
    if (!t) {
      *rc = TPR_FAIL(TPR_ERR_OOM, "matmul (cpu): (%lld, %lld) scratch", (long long)N, (long long)M);
      return true;
    }
    *rc = tpr__weight_gemm(ctx, tpr_tensor_data(b), ldx, N, K, &w, M, t, M);  // (N, M)
    for (int64_t m = 0; *rc == TPR_OK && m < M; m++)
      for (int64_t n = 0; n < N; n++) o[m * N + n] = t[n * M + m];
    free(t);
    return true;
  }
  return false;
}

// The f32 path: a, b described by their tensors (shape, strides) with data
// at ad, bd.
static tpr_status matmul_f32(const tpr_tensor *a, const float *ad, const tpr_tensor *b, const float *bd, bool ta,
                             bool tb, int64_t M, int64_t N, int64_t K, int nb, const int64_t *sa, const int64_t *sb,
                             const int64_t *so, tpr_tensor *out) {
  float *o = tpr_tensor_data(out);
  const int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
  const int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
  const int64_t *as = a->stride + a->ndim - 2, *bs = b->stride + b->ndim - 2;
  operand la = layout(ar, ac, as[0], as[1], ta), lb = layout(br, bc, bs[0], bs[1], tb);

  // One big GEMM when b is shared and logical A's rows over every batch form
  // a single strided row-major (batch * M, K) matrix.
  bool b_shared = true;
  for (int d = 0; d < nb; d++) b_shared &= sb[d] == 0;
  int64_t rows, lda;
  if (b_shared && !lb.copy && rows_of(a, ta, nb, sa, so, out->shape, K, &rows, &lda) && fits_blasint(rows) &&
      fits_blasint(lda) && fits_blasint(N) && fits_blasint(K) && fits_blasint(lb.ld)) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, lb.op, (blasint)rows, (blasint)N, (blasint)K, 1.0f, ad,
                (blasint)lda, bd, (blasint)lb.ld, 0.0f, o, (blasint)N);
    return TPR_OK;
  }
  if (!fits_blasint(M) || !fits_blasint(N) || !fits_blasint(K) || !fits_blasint(la.ld) ||
      !fits_blasint(lb.ld))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "matmul (cpu): dims or strides exceed the BLAS integer range");
  float *abuf = NULL, *bbuf = NULL;  // strided operands' scratch copies
  if (la.copy) abuf = malloc((size_t)(ar * ac) * sizeof *abuf);
  if (lb.copy) bbuf = malloc((size_t)(br * bc) * sizeof *bbuf);
  if ((la.copy && !abuf) || (lb.copy && !bbuf)) {
    free(abuf);
    free(bbuf);
    return TPR_FAIL(TPR_ERR_OOM, "matmul (cpu): scratch copy of a strided operand");
  }
  const int64_t ash[2] = {ar, ac}, bsh[2] = {br, bc}, acs[2] = {ac, 1}, bcs[2] = {bc, 1};
  bool b_held = false;  // bbuf holds b's matrix at offset b_copied
  int64_t b_copied = 0;
  const int64_t *st[3] = {so, sa, sb};
  tpr__iter it = {0};  // out is not empty, so init finds a batch (nb == 0 gives one)
  tpr__iter_init(&it, nb, out->shape, 3, st);
  do {
    for (int64_t i = 0; i < it.n; i++) {
      const float *pa = ad + it.off[1] + i * it.inner[1];
      const float *pb = bd + it.off[2] + i * it.inner[2];
      if (la.copy) {
        tpr__strided_copy(abuf, acs, pa, as, 2, ash, sizeof(float));
        pa = abuf;
      }
      if (lb.copy) {
        int64_t boff = it.off[2] + i * it.inner[2];
        if (!b_held || boff != b_copied) tpr__strided_copy(bbuf, bcs, pb, bs, 2, bsh, sizeof(float));
        b_held = true;
        b_copied = boff;
        pb = bbuf;
      }
      cblas_sgemm(CblasRowMajor, la.op, lb.op, (blasint)M, (blasint)N, (blasint)K, 1.0f, pa,
                  (blasint)la.ld, pb, (blasint)lb.ld, 0.0f, o + it.off[0] + i * it.inner[0], (blasint)N);
    }
  } while (tpr__iter_next(&it));
  free(abuf);
  free(bbuf);
  return TPR_OK;
}

// The FP8 form (ops.h): a (..., M, K) @ (w (N, K) * scale (N, S))^T, the
// scales per row and block of columns; the weight stays FP8 and is widened
// in registers by the skinny kernel.
static tpr_status matmul_fp8(const tpr_cpu_ctx *ctx, const tpr_tensor *a, const tpr_tensor *w,
                             const tpr_tensor *scale, int block, tpr_tensor *out) {
  const int64_t N = w->shape[0], K = w->shape[1], nb = out->ndim - 2;
  int64_t sa[TPR_MAX_DIMS], so[TPR_MAX_DIMS], rows, lda;
  tpr__matmul_batch_strides(a->ndim, a->shape, a->stride, (int)nb, sa);
  tpr__contig_strides(out->ndim, out->shape, so);
  tpr_weight_view v;
  if (!weight_of(w, &v) || (scale->shape[1] > 1 && scale->stride[1] != 1) ||
      !rows_of(a, false, (int)nb, sa, so, out->shape, K, &rows, &lda))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "matmul (cpu): an FP8 weight and its scales must be row-major, a's rows "
                    "strided by one step");
  v.scale = tpr_tensor_data(scale);
  v.scale_ld = scale->shape[0] > 1 ? scale->stride[0] : scale->shape[1];
  v.block = block;
  return tpr__weight_gemm(ctx, tpr_tensor_data(a), lda, rows, K, &v, N, tpr_tensor_data(out), N);
}

// a (..., M, K) [(..., K, M) if i[0]], b (..., K, N) [(..., N, K) if i[1]] or
// 2-D, f32 or bf16; out (..., M, N) contiguous f32. Or the FP8 form (i[2]
// the scale block). The shape rule has checked all of it.
TPR_CPU_KERNEL(matmul) {
  const int block = attrs->n_i > 2 ? (int)attrs->i[2] : 0;
  if (block > 0) return tpr_tensor_numel(out) ? matmul_fp8(ctx, in[0], in[1], in[2], block, out) : TPR_OK;
  const tpr_tensor *a = in[0], *b = in[1];
  const tpr__matmul_dims dims = tpr__matmul_dims_of(a, b, attrs, out);
  const bool ta = dims.ta, tb = dims.tb;
  const int64_t M = dims.M, N = dims.N, K = dims.K;
  const int nb = dims.nb;
  int64_t sa[TPR_MAX_DIMS], sb[TPR_MAX_DIMS], so[TPR_MAX_DIMS];
  tpr__matmul_batch_strides(a->ndim, a->shape, a->stride, nb, sa);
  tpr__matmul_batch_strides(b->ndim, b->shape, b->stride, nb, sb);
  tpr__contig_strides(out->ndim, out->shape, so);

  float *o = tpr_tensor_data(out);
  if (tpr_tensor_numel(out) == 0) return TPR_OK;
  if (K == 0) {  // an empty sum: sgemm would reject lda = 0 on some paths
    memset(o, 0, tpr_tensor_nbytes(out));
    return TPR_OK;
  }
  tpr_status rc;
  if (weight_path(ctx, a, b, ta, tb, M, N, K, nb, sa, sb, so, out, &rc)) return rc;
  tpr_tensor av, bv;  // f32 descriptions of a and b (bf16 ones widened)
  const float *ad, *bd;
  float *abuf = NULL, *bbuf = NULL;
  rc = widen("a", a, &av, &ad, &abuf);
  if (rc == TPR_OK) rc = widen("b", b, &bv, &bd, &bbuf);
  // A widened copy is contiguous: its batch strides are new.
  if (abuf) tpr__matmul_batch_strides(av.ndim, av.shape, av.stride, nb, sa);
  if (bbuf) tpr__matmul_batch_strides(bv.ndim, bv.shape, bv.stride, nb, sb);
  if (rc == TPR_OK) rc = matmul_f32(&av, ad, &bv, bd, ta, tb, M, N, K, nb, sa, sb, so, out);
  free(abuf);
  free(bbuf);
  return rc;
}

const tpr__kernel_def tpr__matmul_cpu[] = {
    {TPR_OP_MATMUL, cpu_matmul},
    {0},
};
