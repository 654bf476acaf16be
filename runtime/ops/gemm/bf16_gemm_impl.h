// Internals of the bf16 GEMM (bf16_gemm.c and its AVX512_BF16 kernel).
#ifndef TPR_BF16_GEMM_IMPL_H
#define TPR_BF16_GEMM_IMPL_H

#include <stdint.h>

// One block of rows: out (M, N) = a (M, K) @ W^T, both bf16.
typedef struct tpr__bf16_args {
  const uint16_t *a;  // (M, K) bf16, row stride lda
  int64_t lda, M, K;
  const uint16_t *w;  // (N, K) bf16, row stride ldw
  int64_t ldw;
  float *out;         // (M, N), row stride ldo
  int64_t ldo;
} tpr__bf16_args;

#if defined(__x86_64__)
// Output columns [n0, n1) for all M rows (bf16_gemm_avx512.c).
void tpr__bf16_rows_avx512(const tpr__bf16_args *p, int64_t n0, int64_t n1);
#endif

#endif
