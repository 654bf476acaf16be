// GEMMs against a weight matrix held in its checkpoint dtype, for the CPU
// kernels (matmul/cpu.c, moe/cpu.c): out = a @ W^T, W (N, K) row-major, f32 or bf16.
#ifndef TPR_WEIGHT_GEMM_H
#define TPR_WEIGHT_GEMM_H

#include "runtime/ops/cpu_kernels.h"
#include "skinny_gemm.h"

// A weight view of W (N, K) row-major of dtype dt with row stride ld.
static inline tpr_weight_view tpr__weight_view(const void *data, tpr_dtype dt, int64_t ld) {
  return (tpr_weight_view){.data = data, .dtype = dt, .ld = ld};
}

// out (M, N), row stride ldo = a (M, K), row stride lda @ W^T. At M <= 16
// rows (decode, small batches) the skinny kernel reads W once at memory
// speed; above, an f32 W goes to sgemm as it is and a bf16 W stays with the
// skinny kernel in blocks of 64 rows (it runs near the sgemm rate there).
// TPR_WEIGHT_PANELS=1 instead widens a bf16 W in panels of rows into
// scratch, each panel one sgemm (the comparison tpr bench model can make).
tpr_status tpr__weight_gemm(const tpr_cpu_ctx *ctx, const float *a, int64_t lda, int64_t M, int64_t K,
                            const tpr_weight_view *w, int64_t N, float *out, int64_t ldo);

// Rows at or below which tpr__weight_gemm takes the skinny kernel.
enum { TPR_SKINNY_MAX_ROWS = 16 };

#endif
