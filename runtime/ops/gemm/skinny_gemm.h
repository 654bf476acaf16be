// Skinny GEMM (GEMV) over weights kept in their checkpoint dtype: the decode
// path's matmuls, where a few activation rows meet a large weight matrix and
// the time is the time to stream the weights from memory. The weights are
// dequantised in the inner loop (f32, bf16, FP8-E4M3 with 128-column block
// scales); activations and accumulation are f32. The vector variant is chosen
// at run time by runtime/cpu_isa.h.
#ifndef TPR_SKINNY_GEMM_H
#define TPR_SKINNY_GEMM_H

#include <stdint.h>

#include "runtime/dtype.h"
#include "runtime/status.h"

typedef struct tpr_weight_view {  // W (N, K) row-major, row stride ld elements
  const void *data;
  tpr_dtype dtype;                // TPR_F32, TPR_BF16 or TPR_F8E4M3
  int64_t ld;                     // >= K
  const float *scale;             // FP8 only: (N, scale_ld) f32, the multiplier of each row's 128-column block; NULL otherwise
  int64_t scale_ld;               // >= ceil((K + k_phase) / 128)
  int k_phase;                    // FP8: local column j lies in block (j + k_phase) / block (a shard that starts mid-block)
  int block;                      // FP8: columns per scale block; 0 means TPR_FP8_BLOCK (128). A shard's scales
                                  // may be kept per row at a finer block that divides every rank's first column.
} tpr_weight_view;

// FP8 block width of the scales (DeepSeek/MiniMax "weight_block_size" 128).
#define TPR_FP8_BLOCK 128
static inline int64_t tpr__fp8_block(const tpr_weight_view *w) { return w->block > 0 ? w->block : TPR_FP8_BLOCK; }

// out (M, N), row stride ldo = a (M, K) (row stride lda) @ W^T, any M >= 0
// (fast for M <= 16). The dequantised weight is fp8(w[n,k]) * scale[n, (k +
// k_phase) / 128] rounded to f32 once, exactly tpr_weight_dequant_rows's
// value. Threads split N with OpenMP (n_threads >= 1; small problems run on
// the calling thread); each output element is reduced by one thread in a
// fixed order, so results are bitwise identical for any n_threads (they may
// differ between ISA levels). Errors: unsupported dtype -> TPR_ERR_DTYPE;
// negative sizes, short strides, missing scales, k_phase outside [0, 128),
// n_threads < 1 -> TPR_ERR_INVALID_ARG.
tpr_status tpr_skinny_gemm(const float *a, int64_t lda, int64_t M, int64_t K, const tpr_weight_view *w, int64_t N,
                           float *out, int64_t ldo, int n_threads);

// Rows [n0, n1) of W dequantised to f32 into dst ((n1-n0), K) row-major:
// panels for sgemm at large M. Exact: bf16 and FP8 values are f32 values,
// FP8 times its block scale is rounded once.
tpr_status tpr_weight_dequant_rows(const tpr_weight_view *w, int64_t n0, int64_t n1, int64_t K, float *dst);

#endif
