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

#include "cpu_kernels.h"
#include "strided.h"

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

// Batch strides of t (..., r, c) read broadcast to the batch dims bshape (nb).
static tpr_status batch_strides(const char *name, const tpr_tensor *t, int nb, const int64_t *bshape,
                                int64_t *stride) {
  int tb = t->ndim - 2;
  if (tb > nb) return TPR_FAIL(TPR_ERR_SHAPE, "matmul (cpu): %s has more batch dims than out", name);
  for (int d = 0; d < nb; d++) {
    int td = d - (nb - tb);
    if (td >= 0 && t->shape[td] != bshape[d] && t->shape[td] != 1)
      return TPR_FAIL(TPR_ERR_SHAPE, "matmul (cpu): %s batch dim %d is %lld, out has %lld", name, td,
                      (long long)t->shape[td], (long long)bshape[d]);
    stride[d] = (td < 0 || t->shape[td] == 1) ? 0 : t->stride[td];
  }
  return TPR_OK;
}

// a (..., M, K) [(..., K, M) if i[0]], b (..., K, N) [(..., N, K) if i[1]] or
// 2-D; out (..., M, N) contiguous.
TPR_CPU_KERNEL(matmul) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "matmul (cpu): expected 2 inputs, got %d", n_in);
  const tpr_tensor *a = in[0], *b = in[1];
  if (a->dtype != TPR_F32 || b->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "matmul (cpu): a %s, b %s, out %s; only f32 is supported",
                    tpr_dtype_name(a->dtype), tpr_dtype_name(b->dtype), tpr_dtype_name(out->dtype));
  if (a->ndim < 2 || b->ndim < 2 || out->ndim < 2)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul (cpu): a, b and out need at least 2 dims");
  const bool ta = attrs && attrs->n_i > 0 && attrs->i[0];
  const bool tb = attrs && attrs->n_i > 1 && attrs->i[1];
  const int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
  const int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
  const int64_t M = ta ? ac : ar, K = ta ? ar : ac, N = tb ? br : bc;
  const int nb = out->ndim - 2;
  if ((tb ? bc : br) != K || out->shape[nb] != M || out->shape[nb + 1] != N)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul (cpu): (%lld x %lld) @ (%lld x %lld) does not give out (%lld x %lld)",
                    (long long)M, (long long)K, (long long)(tb ? bc : br), (long long)N,
                    (long long)out->shape[nb], (long long)out->shape[nb + 1]);
  int64_t sa[TPR_MAX_DIMS], sb[TPR_MAX_DIMS], so[TPR_MAX_DIMS];
  TPR_CHECK(batch_strides("a", a, nb, out->shape, sa));
  TPR_CHECK(batch_strides("b", b, nb, out->shape, sb));
  tpr__contig_strides(out->ndim, out->shape, so);

  float *o = tpr_tensor_data(out);
  if (tpr_tensor_numel(out) == 0) return TPR_OK;
  if (K == 0) {  // an empty sum: sgemm would reject lda = 0 on some paths
    memset(o, 0, tpr_tensor_nbytes(out));
    return TPR_OK;
  }
  const int64_t *as = a->stride + a->ndim - 2, *bs = b->stride + b->ndim - 2;
  operand la = layout(ar, ac, as[0], as[1], ta), lb = layout(br, bc, bs[0], bs[1], tb);
  const float *ad = tpr_tensor_data(a), *bd = tpr_tensor_data(b);

  // One big GEMM when b is shared and logical A's rows over every batch form
  // a single strided row-major (batch * M, K) matrix: the iterator merges the
  // batch dims into M exactly when their strides chain.
  bool b_shared = true;
  for (int d = 0; d < nb; d++) b_shared &= sb[d] == 0;
  if (b_shared && !la.copy && la.op == CblasNoTrans && !lb.copy) {
    int64_t ss[TPR_MAX_DIMS];
    memcpy(ss, sa, (size_t)nb * sizeof *ss);
    ss[nb] = ta ? as[1] : as[0];  // step between rows of logical A
    const int64_t *st[2] = {so, ss};
    tpr__iter it;
    tpr__iter_init(&it, nb + 1, out->shape, 2, st);
    int64_t lda = it.n > 1 ? it.inner[1] : la.ld;
    if (it.ndim == 1 && lda >= K && fits_blasint(it.n) && fits_blasint(lda) && fits_blasint(N) &&
        fits_blasint(K) && fits_blasint(lb.ld)) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, lb.op, (blasint)it.n, (blasint)N, (blasint)K, 1.0f, ad,
                  (blasint)lda, bd, (blasint)lb.ld, 0.0f, o, (blasint)N);
      return TPR_OK;
    }
  }

  if (!fits_blasint(M) || !fits_blasint(N) || !fits_blasint(K) || !fits_blasint(la.ld) ||
      !fits_blasint(lb.ld))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "matmul (cpu): dims or strides exceed the BLAS integer range");
  float *abuf = NULL, *bbuf = NULL;
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
  tpr__iter it;
  tpr__iter_init(&it, nb, out->shape, 3, st);  // nb == 0 gives one batch
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

// ---- Backward. out = op(a) @ op(b) with op = transpose when the flag says:
//   da = dout @ op(b)^T, db = op(a)^T @ dout, each written back through its
// own transpose flag so no operand is copied. A 2-D b shared by a batched a
// gets the sum over the batch: a and dout are seen as one (batch*M) matrix.
#include "grad_rules.h"

TPR__BWD_RULE(matmul) {
  tpr_program *p = tpr_grad_program(g);
  bool ta = n->attrs.n_i > 0 && n->attrs.i[0], tb = n->attrs.n_i > 1 && n->attrs.i[1];
  tpr_value_id a = n->in[0], b = n->in[1], d = n->dout, da, db;
  tpr_tensor ad, bd, dd;
  TPR_CHECK(tpr_program_value(p, a, &ad));
  TPR_CHECK(tpr_program_value(p, b, &bd));
  if (tpr_grad_wanted(g, a)) {
    if (!ta)
      TPR_CHECK(tpr_pb_matmul(p, d, b, false, !tb, &da));  // (.., M, K)
    else
      TPR_CHECK(tpr_pb_matmul(p, b, d, tb, true, &da));    // (.., K, M)
    TPR_CHECK(tpr_grad_add(g, a, da));
  }
  if (!tpr_grad_wanted(g, b)) return TPR_OK;
  if (bd.ndim == 2 && ad.ndim > 2) {  // shared b: flatten the batch into rows
    if (ta)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backward: matmul with a batched transposed a and a shared 2-D b");
    TPR_CHECK(tpr_grad_contiguous(g, a, &a));
    TPR_CHECK(tpr_grad_contiguous(g, d, &d));
    TPR_CHECK(tpr_program_value(p, d, &dd));
    int64_t K = ad.shape[ad.ndim - 1], N = dd.shape[dd.ndim - 1];
    TPR_CHECK(tpr_pb_reshape(p, a, 2, (const int64_t[]){tpr_tensor_numel(&ad) / K, K}, &a));
    TPR_CHECK(tpr_pb_reshape(p, d, 2, (const int64_t[]){tpr_tensor_numel(&dd) / N, N}, &d));
  }
  if (!tb)
    TPR_CHECK(tpr_pb_matmul(p, a, d, !ta, false, &db));  // (.., K, N)
  else
    TPR_CHECK(tpr_pb_matmul(p, d, a, true, ta, &db));    // (.., N, K)
  return tpr_grad_add(g, b, db);
}
