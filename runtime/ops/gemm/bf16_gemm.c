// tpr_bf16_gemm (bf16_gemm.h): the activations rounded to bf16 block by
// block, then the AVX512_BF16 kernel split over threads, or the rounded
// activations widened for tpr_skinny_gemm where the CPU lacks it.
#include "bf16_gemm.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_gemm_impl.h"
#include "runtime/cpu_isa.h"

enum {
  BLOCK_ROWS = 64,     // activation rows rounded at a time: 64 x K bf16 stays in the L2 cache
  ROWS_PER_TASK = 16,  // weight rows per OpenMP iteration, as tpr_skinny_gemm
};

void tpr_round_to_bf16(const float *x, uint16_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    uint16_t nan = (uint16_t)((u >> 16) | 0x0040);                      // a NaN stays a quiet NaN
    uint16_t rne = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // overflow carries into inf
    dst[i] = (u & 0x7fffffffu) > 0x7f800000u ? nan : rne;
  }
}

static void round_block(const float *a, int64_t lda, int64_t rows, int64_t K, uint16_t *dst) {
  for (int64_t m = 0; m < rows; m++) tpr_round_to_bf16(a + m * lda, dst + m * K, K);
}

#if defined(__x86_64__)
static void dot_block(const tpr__bf16_args *p, int64_t N, int n_threads) {
  int64_t tasks = (N + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
  // Below ~64K multiply-adds a fork/join costs about as much as the work.
  if (n_threads == 1 || tasks == 1 || (double)p->M * (double)N * (double)p->K < 65536.0) {
    tpr__bf16_rows_avx512(p, 0, N);
    return;
  }
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (int64_t t = 0; t < tasks; t++) {
    int64_t n0 = t * ROWS_PER_TASK, n1 = n0 + ROWS_PER_TASK < N ? n0 + ROWS_PER_TASK : N;
    tpr__bf16_rows_avx512(p, n0, n1);
  }
}
#endif

tpr_status tpr_bf16_gemm(const float *a, int64_t lda, int64_t M, int64_t K, const tpr_weight_view *w, int64_t N,
                         float *out, int64_t ldo, int n_threads) {
  if (!w) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_bf16_gemm: weight view is NULL");
  if (w->dtype != TPR_BF16)
    return TPR_FAIL(TPR_ERR_DTYPE, "tpr_bf16_gemm: weight dtype %s (want bf16)", tpr_dtype_name(w->dtype));
  // tpr_skinny_gemm's own checks (and its answer to an empty product).
  if (M <= 0 || N == 0 || K == 0 || lda < K || ldo < N || !a || !out)
    return tpr_skinny_gemm(a, lda, M, K, w, N, out, ldo, n_threads);
  TPR_CHECK(tpr_skinny_gemm(a, lda, 0, K, w, N, out, ldo, n_threads));  // W, N, K and n_threads
  const int64_t rows = M < BLOCK_ROWS ? M : BLOCK_ROWS;
  const bool dot = tpr_cpu_has_bf16_dot();
  uint16_t *ab = malloc((size_t)(rows * K) * sizeof *ab);  // (rows, K) bf16
  // The fallback's (max(rows, 2), K): ab widened. tpr_skinny_gemm sums a
  // lone row in another order than rows in a tile, so a lone row goes in
  // twice (and its out through `pair`): a row's result must not depend on
  // whether it came alone (a last block of one row, too).
  float *af = dot ? NULL : malloc((size_t)((rows < 2 ? 2 : rows) * K) * sizeof *af);
  float *pair = dot || M % BLOCK_ROWS != 1 ? NULL : malloc((size_t)(2 * N) * sizeof *pair);  // (2, N)
  if (!ab || (!dot && !af) || (!dot && M % BLOCK_ROWS == 1 && !pair)) {
    free(ab), free(af), free(pair);
    return TPR_FAIL(TPR_ERR_OOM, "tpr_bf16_gemm: %lld x %lld activations", (long long)rows, (long long)K);
  }
  tpr_status rc = TPR_OK;
  for (int64_t m0 = 0; m0 < M && rc == TPR_OK; m0 += BLOCK_ROWS) {
    int64_t mb = M - m0 < BLOCK_ROWS ? M - m0 : BLOCK_ROWS;
    round_block(a + m0 * lda, lda, mb, K, ab);
#if defined(__x86_64__)
    if (dot) {
      tpr__bf16_args p = {.a = ab, .lda = K, .M = mb, .K = K, .w = w->data, .ldw = w->ld, .out = out + m0 * ldo,
                          .ldo = ldo};
      dot_block(&p, N, n_threads);
      continue;
    }
#endif
    for (int64_t i = 0; i < mb * K; i++) af[i] = tpr_bf16_to_f32(ab[i]);
    if (mb == 1) {
      memcpy(af + K, af, (size_t)K * sizeof *af);
      rc = tpr_skinny_gemm(af, K, 2, K, w, N, pair, N, n_threads);
      memcpy(out + m0 * ldo, pair, (size_t)N * sizeof *pair);
      continue;
    }
    rc = tpr_skinny_gemm(af, K, mb, K, w, N, out + m0 * ldo, ldo, n_threads);
  }
  free(ab), free(af), free(pair);
  return rc;
}
