// The CUDA helpers kernels of several families call (cuda_kernels.h): the
// strided copy behind every scratch copy, cuBLAS sgemm in row-major terms,
// and the read of a run-time scalar index.
#include "cuda_kernels.h"

// dst[offset_d(i)] = src[offset_s(i)] over a shared shape; E is the element
// as an unsigned integer of its size (bytes move unchanged).
template <typename E>
static __global__ void strided_copy_kernel(E *dst, tpr__cuda_desc dd, const E *src, tpr__cuda_desc sd, int64_t n) {
  TPR_CUDA_GRID_STRIDE(i, n) dst[tpr__cuda_offset(dd, i)] = src[tpr__cuda_offset(sd, i)];
}

tpr_status tpr__cuda_strided_copy(tpr_cuda_ctx *c, const char *op, void *dst, const int64_t *dst_stride,
                                  const void *src, const int64_t *src_stride, int ndim, const int64_t *shape,
                                  size_t esz) {
  const int64_t n = tpr_shape_numel(ndim, shape);
  if (n == 0) return TPR_OK;
  const tpr__cuda_desc dd = tpr__cuda_make_desc(ndim, shape, dst_stride),
                       sd = tpr__cuda_make_desc(ndim, shape, src_stride);
  const int th = 256;
  const unsigned nb = tpr__cuda_blocks(n, th);
  const bool ok = tpr__cuda_by_size(esz, [&](auto e) {
    using E = decltype(e);
    strided_copy_kernel<<<nb, th, 0, c->stream>>>((E *)dst, dd, (const E *)src, sd, n);
  });
  if (!ok) return TPR_FAIL(TPR_ERR_DTYPE, "%s (cuda): no strided copy for %zu-byte elements", op, esz);
  TPR_CUDA_LAUNCHED(op, "strided copy");
  return TPR_OK;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }

tpr_status tpr__cuda_sgemm(tpr_cuda_ctx *c, const char *op, bool trans_a, bool trans_b, int64_t M, int64_t N,
                           int64_t K, const float *A, int64_t lda, int64_t stride_a, const float *B, int64_t ldb,
                           int64_t stride_b, float *C, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return TPR_OK;
  if (!fits_int(M) || !fits_int(N) || !fits_int(K) || !fits_int(lda) || !fits_int(ldb) || !fits_int(ldc) ||
      !fits_int(batch))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s (cuda): GEMM dims or strides exceed cuBLAS's int range", op);
  if (K == 0) {  // an empty sum; cuBLAS would reject lda = 0 on some paths
    for (int64_t b = 0; b < batch; b++)
      TPR_CUDA_TRY(cudaMemset2DAsync(C + b * stride_c, (size_t)ldc * sizeof(float), 0, (size_t)N * sizeof(float),
                                     (size_t)M, c->stream), op, "zero GEMM output");
    return TPR_OK;
  }
  const float one = 1.0f, zero = 0.0f;
  const cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap
  // the operands (and M, N); each keeps its own op flag and leading dim.
  if (batch == 1) {
    TPR_CUBLAS_TRY(cublasSgemm(c->blas, ob, oa, (int)N, (int)M, (int)K, &one, B, (int)ldb, A, (int)lda, &zero, C,
                               (int)ldc), op, "cublasSgemm");
  } else {
    TPR_CUBLAS_TRY(cublasSgemmStridedBatched(c->blas, ob, oa, (int)N, (int)M, (int)K, &one, B, (int)ldb,
                                             (long long)stride_b, A, (int)lda, (long long)stride_a, &zero, C,
                                             (int)ldc, (long long)stride_c, (int)batch),
                   op, "cublasSgemmStridedBatched");
  }
  return TPR_OK;
}

tpr_status tpr__cuda_read_index(tpr_cuda_ctx *c, const char *op, const tpr_tensor *t, int64_t *v) {
  *v = 0;
  if (t->dtype == TPR_I32) {
    int32_t v32;
    TPR_CHECK(tpr__cuda_read(c, op, &v32, tpr_tensor_data(t), sizeof v32));
    *v = v32;
    return TPR_OK;
  }
  if (t->dtype == TPR_I64) return tpr__cuda_read(c, op, v, tpr_tensor_data(t), sizeof *v);
  return TPR_FAIL(TPR_ERR_DTYPE, "%s (cuda): index is %s, expected i32 or i64", op, tpr_dtype_name(t->dtype));
}
