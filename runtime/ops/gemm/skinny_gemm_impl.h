// Internals shared by the skinny GEMM variants (skinny_gemm*.c).
#ifndef TPR_SKINNY_GEMM_IMPL_H
#define TPR_SKINNY_GEMM_IMPL_H

#include <stdint.h>

#include "skinny_gemm.h"

// One validated call: out (M, N) = a (M, K) @ W^T.
typedef struct tpr__sg_args {
  const float *a;  // (M, K), row stride lda
  int64_t lda, M, K;
  const tpr_weight_view *w;
  float *out;      // (M, N), row stride ldo
  int64_t ldo;
} tpr__sg_args;

// Each variant computes output columns [n0, n1) for all M rows. A variant's
// result for a column depends only on the column (and M), never on n0/n1, so
// any split of N over threads gives the same bits.
void tpr__sg_rows_portable(const tpr__sg_args *p, int64_t n0, int64_t n1);
#if defined(__x86_64__)
void tpr__sg_rows_avx2(const tpr__sg_args *p, int64_t n0, int64_t n1);
void tpr__sg_rows_avx512(const tpr__sg_args *p, int64_t n0, int64_t n1);
#endif

// The f32 value of every FP8-E4M3 byte (tpr_f8e4m3_to_f32), built once.
const float *tpr__fp8_table(void);

// The vector variants fold FP8's exponent rebias (2^120) into the block
// scale; a scale this large or larger would overflow that product, so such
// rows (and rows holding an FP8 NaN byte) go through the portable code.
#define TPR__FP8_SCALE_FAST_MAX 0x1p7f

#endif
