// The double-precision backward of softmax attention that the attention
// tests check the kernels against, one query row at a time (the tests
// compute the row's probabilities their own way: causal, document-masked,
// wrong-head controls).
#ifndef TPR_TESTS_ATTENTION_REF_H
#define TPR_TESTS_ATTENTION_REF_H

#include <stdint.h>

// Query row q (D) with probabilities p[0, n) over keys j of kv head g
// (K, V: (S, Hkv, D)) and output cotangent dO (D): adds the row's
// gradients into dq (D), dK and dV (S, Hkv, D). dp: scratch of n doubles.
static inline void ref_attention_row_backward(int64_t n, int64_t D, int64_t Hkv, int64_t g, double scale,
                                              const double *p, const float *q, const float *K, const float *V,
                                              const float *dO, double *dq, double *dK, double *dV, double *dp) {
  double pdp = 0;
  for (int64_t j = 0; j < n; j++) {
    dp[j] = 0;
    for (int64_t d = 0; d < D; d++) {
      dp[j] += (double)dO[d] * V[(j * Hkv + g) * D + d];
      dV[(j * Hkv + g) * D + d] += p[j] * dO[d];
    }
    pdp += p[j] * dp[j];
  }
  for (int64_t j = 0; j < n; j++) {
    const double ds = p[j] * (dp[j] - pdp) * scale;  // softmax's backward, then the score scale
    for (int64_t d = 0; d < D; d++) {
      dq[d] += ds * K[(j * Hkv + g) * D + d];
      dK[(j * Hkv + g) * D + d] += ds * q[d];
    }
  }
}

#endif
