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

extern "C" {
#include "matmul.h"
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
// 2-D; out (..., M, N) contiguous. The shape rule has checked the shapes;
// what this kernel adds is its own limit: f32 operands only (the rule also
// admits bf16 operands and the FP8 form, which only the CPU reads).
TPR_CUDA_KERNEL(matmul) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 2)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "matmul (cuda): the FP8 form has no CUDA kernel (%d inputs)", n_in);
  const tpr_tensor *a = in[0], *b = in[1];
  if (a->dtype != TPR_F32 || b->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "matmul (cuda): a %s, b %s; only f32 is supported", tpr_dtype_name(a->dtype),
                    tpr_dtype_name(b->dtype));
  const tpr__matmul_dims dims = tpr__matmul_dims_of(a, b, attrs, out);
  const bool ta = dims.ta, tb = dims.tb;
  const int64_t M = dims.M, N = dims.N, K = dims.K;
  const int nb = dims.nb;
  int64_t so[TPR_MAX_DIMS], sa[TPR_MAX_DIMS], sb[TPR_MAX_DIMS];
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
  // Batch strides after prepare: a copied operand has new (contiguous) strides.
  tpr__matmul_batch_strides(a->ndim, a->shape, A.stride, nb, sa);
  tpr__matmul_batch_strides(b->ndim, b->shape, B.stride, nb, sb);
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
