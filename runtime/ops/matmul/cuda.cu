// Matmul CUDA kernel (cpu.c's twin): cuBLAS sgemm, strided-batched over
// the batch dims.
//
// Operands are read in place by the rule of cpu.c (tpr__cuda_layout): a
// row-major or column-major view of each matrix needs no copy, one with
// neither unit stride is first copied whole into contiguous scratch. The
// batch dims are walked with the CPU's strided iterator on the host (only
// strides and pointers, no device reads): each run of batches it can step
// with one stride per operand becomes one cublasSgemmStridedBatched call
// (stride 0 for a broadcast operand). As on the CPU, a shared 2-D b whose
// batches of logical A chain into one strided (batch * M, K) matrix becomes
// a single GEMM.
#include "runtime/ops/cuda_kernels.h"

// Batch strides of a matrix stack (nd dims: batch..., r, c) read broadcast to
// the batch dims bshape (nb); as cpu.c's batch_strides.
static tpr_status batch_strides(const char *name, int nd, const int64_t *shape, const int64_t *tstride, int nb,
                                const int64_t *bshape, int64_t *stride) {
  int tb = nd - 2;
  if (tb > nb) return TPR_FAIL(TPR_ERR_SHAPE, "matmul (cuda): %s has more batch dims than out", name);
  for (int d = 0; d < nb; d++) {
    int td = d - (nb - tb);
    if (td >= 0 && shape[td] != bshape[d] && shape[td] != 1)
      return TPR_FAIL(TPR_ERR_SHAPE, "matmul (cuda): %s batch dim %d is %lld, out has %lld", name, td,
                      (long long)shape[td], (long long)bshape[d]);
    stride[d] = (td < 0 || shape[td] == 1) ? 0 : tstride[td];
  }
  return TPR_OK;
}

// One operand as raw device data: its pointer and strides, replaced by a
// contiguous copy when its layout needs one.
struct matrix_stack {
  const float *data;
  int64_t stride[TPR_MAX_DIMS];  // (nd)
  tpr__cuda_operand l;
};

static tpr_status prepare(tpr_cuda_ctx *c, const tpr_tensor *t, bool trans, tpr__cuda_scratch *buf,
                          matrix_stack *m) {
  const int nd = t->ndim;
  const int64_t r = t->shape[nd - 2], cc = t->shape[nd - 1];
  m->data = (const float *)tpr_tensor_data(t);
  memcpy(m->stride, t->stride, sizeof m->stride);
  m->l = tpr__cuda_layout(r, cc, t->stride[nd - 2], t->stride[nd - 1], trans);
  if (!m->l.copy) return TPR_OK;
  // Neither stride is unit: copy every matrix of the stack, row-major.
  TPR_CHECK(buf->alloc(tpr_tensor_nbytes(t)));
  tpr__contig_strides(nd, t->shape, m->stride);
  TPR_CHECK(tpr__cuda_strided_copy(c, "matmul", buf->p, m->stride, m->data, t->stride, nd, t->shape, sizeof(float)));
  m->data = (const float *)buf->p;
  m->l = tpr__cuda_layout(r, cc, m->stride[nd - 2], m->stride[nd - 1], trans);
  return TPR_OK;
}

// a (..., M, K) [(..., K, M) if i[0]], b (..., K, N) [(..., N, K) if i[1]] or
// 2-D; out (..., M, N) contiguous.
TPR_CUDA_KERNEL(matmul) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "matmul (cuda): expected 2 inputs, got %d", n_in);
  const tpr_tensor *a = in[0], *b = in[1];
  if (a->dtype != TPR_F32 || b->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "matmul (cuda): a %s, b %s, out %s; only f32 is supported",
                    tpr_dtype_name(a->dtype), tpr_dtype_name(b->dtype), tpr_dtype_name(out->dtype));
  if (a->ndim < 2 || b->ndim < 2 || out->ndim < 2)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul (cuda): a, b and out need at least 2 dims");
  const bool ta = attrs && attrs->n_i > 0 && attrs->i[0];
  const bool tb = attrs && attrs->n_i > 1 && attrs->i[1];
  const int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
  const int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
  const int64_t M = ta ? ac : ar, K = ta ? ar : ac, N = tb ? br : bc;
  const int nb = out->ndim - 2;
  if ((tb ? bc : br) != K || out->shape[nb] != M || out->shape[nb + 1] != N)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul (cuda): (%lld x %lld) @ (%lld x %lld) does not give out (%lld x %lld)",
                    (long long)M, (long long)K, (long long)(tb ? bc : br), (long long)N,
                    (long long)out->shape[nb], (long long)out->shape[nb + 1]);
  int64_t so[TPR_MAX_DIMS], sa[TPR_MAX_DIMS], sb[TPR_MAX_DIMS];
  TPR_CHECK(batch_strides("a", a->ndim, a->shape, a->stride, nb, out->shape, sa));
  TPR_CHECK(batch_strides("b", b->ndim, b->shape, b->stride, nb, out->shape, sb));
  tpr__contig_strides(out->ndim, out->shape, so);
  float *o = (float *)tpr_tensor_data(out);
  if (tpr_tensor_numel(out) == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "matmul", "set device");
  if (K == 0) {
    TPR_CUDA_TRY(cudaMemsetAsync(o, 0, tpr_tensor_nbytes(out), c->stream), "matmul", "zero output");
    return TPR_OK;
  }
  tpr__cuda_scratch abuf(c), bbuf(c);
  matrix_stack A, B;
  TPR_CHECK(prepare(c, a, ta, &abuf, &A));
  TPR_CHECK(prepare(c, b, tb, &bbuf, &B));
  if (A.l.copy || B.l.copy) return TPR_FAIL(TPR_ERR_INTERNAL, "matmul (cuda): a copied operand is still strided");
  // Batch strides again: a copied operand has new (contiguous) strides.
  TPR_CHECK(batch_strides("a", a->ndim, a->shape, A.stride, nb, out->shape, sa));
  TPR_CHECK(batch_strides("b", b->ndim, b->shape, B.stride, nb, out->shape, sb));
  const int64_t *as = A.stride + a->ndim - 2;

  bool b_shared = true;
  for (int d = 0; d < nb; d++) b_shared &= sb[d] == 0;
  if (b_shared && !A.l.trans) {
    int64_t ss[TPR_MAX_DIMS];
    memcpy(ss, sa, (size_t)nb * sizeof *ss);
    ss[nb] = ta ? as[1] : as[0];  // step between rows of logical A
    const int64_t *st[2] = {so, ss};
    tpr__iter it;
    tpr__iter_init(&it, nb + 1, out->shape, 2, st);
    int64_t lda = it.n > 1 ? it.inner[1] : A.l.ld;
    if (it.ndim == 1 && lda >= K)
      return tpr__cuda_sgemm(c, "matmul", false, B.l.trans, it.n, N, K, A.data, lda, 0, B.data, B.l.ld, 0, o, N, 0, 1);
  }

  const int64_t *st[3] = {so, sa, sb};
  tpr__iter it;
  tpr__iter_init(&it, nb, out->shape, 3, st);  // nb == 0 gives one batch
  do {
    TPR_CHECK(tpr__cuda_sgemm(c, "matmul", A.l.trans, B.l.trans, M, N, K, A.data + it.off[1], A.l.ld, it.inner[1],
                              B.data + it.off[2], B.l.ld, it.inner[2], o + it.off[0], N, it.inner[0], it.n));
  } while (tpr__iter_next(&it));
  return TPR_OK;
}

const tpr__kernel_def tpr__matmul_cuda[] = {
    {TPR_OP_MATMUL, cuda_matmul},
    {},
};
