// tpr__weight_gemm (weight_gemm.h): the skinny kernel, sgemm, or widened
// panels and sgemm, by the row count and the weight's dtype.
#include "weight_gemm.h"

#include <cblas.h>

#include "bf16_gemm.h"
#include <stdlib.h>

enum { SKINNY_BLOCK_ROWS = 64 };

// TPR_WEIGHT_PANELS, read once: the environment is not scanned per matmul.
static bool panels_forced(void) {
  static int forced = -1;  // every thread that races here stores the same value
  if (forced < 0) forced = getenv("TPR_WEIGHT_PANELS") != NULL;
  return forced;
}

static bool fits_blasint(int64_t v) { return (int64_t)(blasint)v == v; }

// Rows of a widened bf16 panel: about 1 MiB of f32, so the panel stays in
// the L2 cache while sgemm packs it, and at least 64 rows so each sgemm
// call has work to amortise its packing.
static int64_t panel_rows(int64_t K) {
  int64_t r = ((int64_t)1 << 18) / (K > 0 ? K : 1);
  r = r < 64 ? 64 : r;
  return (r + 15) / 16 * 16;
}

tpr_status tpr__weight_gemm(const tpr_cpu_ctx *ctx, const float *a, int64_t lda, int64_t M, int64_t K,
                            const tpr_weight_view *w, int64_t N, float *out, int64_t ldo) {
  if (M == 0 || N == 0) return TPR_OK;
  int threads = ctx && ctx->n_threads > 0 ? ctx->n_threads : 1;
  // At every row count, so a row's result is the same alone or in a batch.
  if (w->dtype == TPR_BF16 && ctx && ctx->bf16_activations)
    return tpr_bf16_gemm(a, lda, M, K, w, N, out, ldo, threads);
  if (M <= TPR_SKINNY_MAX_ROWS || K == 0) return tpr_skinny_gemm(a, lda, M, K, w, N, out, ldo, threads);
  if (!fits_blasint(M) || !fits_blasint(N) || !fits_blasint(K) || !fits_blasint(lda) || !fits_blasint(ldo) ||
      !fits_blasint(w->ld))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "weight gemm (cpu): dims or strides exceed the BLAS integer range");
  if (w->dtype != TPR_F32 && !panels_forced()) {
    // The skinny kernel's register tiles run near the sgemm rate on a bf16
    // W (measured by tpr bench kernels: ~170 GF/s at 16 rows against ~100
    // for widened panels and sgemm at 512 rows on 2 Zen 4 threads), so a
    // bf16 W takes it at any row count, in blocks of rows whose
    // activations stay in the L2 cache while each weight tile passes them.
    const int64_t block = SKINNY_BLOCK_ROWS;
    for (int64_t m0 = 0; m0 < M; m0 += block)
      TPR_CHECK(tpr_skinny_gemm(a + m0 * lda, lda, M - m0 < block ? M - m0 : block, K, w, N, out + m0 * ldo, ldo,
                                threads));
    return TPR_OK;
  }
  if (w->dtype == TPR_F32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)N, (blasint)K, 1.0f, a, (blasint)lda,
                (const float *)w->data, (blasint)w->ld, 0.0f, out, (blasint)ldo);
    return TPR_OK;
  }
  int64_t P = panel_rows(K);
  if (P > N) P = N;
  float *panel = malloc((size_t)(P * K) * sizeof *panel);
  if (!panel) return TPR_FAIL(TPR_ERR_OOM, "weight gemm (cpu): a %lld x %lld panel", (long long)P, (long long)K);
  tpr_status rc = TPR_OK;
  for (int64_t n0 = 0; n0 < N && rc == TPR_OK; n0 += P) {
    int64_t n1 = n0 + P < N ? n0 + P : N;
    rc = tpr_weight_dequant_rows(w, n0, n1, K, panel);  // (n1 - n0, K)
    if (rc != TPR_OK) break;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)(n1 - n0), (blasint)K, 1.0f, a,
                (blasint)lda, panel, (blasint)K, 0.0f, out + n0, (blasint)ldo);
  }
  free(panel);
  return rc;
}
