// GEMM with bf16 activations against a bf16 weight matrix: the activations
// are rounded to bf16 (nearest even) and multiplied with AVX512_BF16 dot
// products (vdpbf16ps) where the CPU has them, as llama.cpp and PyTorch's
// bf16 path do. Each product of two bf16 values is exact in f32 and sums in
// f32, so the only rounding beyond the f32 path's is the activations' to 8
// mantissa bits. It halves the instructions per multiply-add of the f32 path
// (tpr_skinny_gemm), which widens every weight and multiplies in f32: the
// prefill GEMMs' arithmetic bound (launch/bench_peak.c measures both peaks).
#ifndef TPR_BF16_GEMM_H
#define TPR_BF16_GEMM_H

#include <stdint.h>

#include "runtime/status.h"
#include "skinny_gemm.h"

// out (M, N), row stride ldo = bf16(a) (M, K), row stride lda @ W^T for a
// bf16 W (N, K). Rows of a are rounded to bf16 in blocks of 64 (scratch of
// 64 x K bf16 per call). Threads split N as tpr_skinny_gemm does; each
// output is reduced in one fixed order that depends on neither M, the row's
// place in a block, nor the thread split, so a row's result is the same
// alone or in a batch, and for any n_threads. Without AVX512_BF16 (or with
// TPR_CPU_ISA below avx512) the rounded activations are widened and go
// through tpr_skinny_gemm: the same inputs, another summation order (and
// vdpbf16ps treats subnormal inputs, below 1.2e-38 in magnitude, as zero).
// Errors: W not bf16 -> TPR_ERR_DTYPE; else tpr_skinny_gemm's.
tpr_status tpr_bf16_gemm(const float *a, int64_t lda, int64_t M, int64_t K, const tpr_weight_view *w, int64_t N,
                         float *out, int64_t ldo, int n_threads);

// dst[i] = bf16 of x[i], rounded to nearest even (tpr_f32_to_bf16's value,
// NaN kept quiet), in a loop the compiler vectorises.
void tpr_round_to_bf16(const float *x, uint16_t *dst, int64_t n);

#endif
