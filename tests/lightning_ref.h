// Double-precision references of lightning attention (ops.h,
// tpr_lightning_attention) for the op tests: the plain per-token recurrence,
// which shares nothing with the kernels' block decomposition, and its
// backward by reverse-mode through the same recurrence.
//   S_t = exp(-s_h) S_{t-1} + k_t^T v_t,   o_t = q_t S_t   per head h.
// Per-token tensors (T, H, D) and states (H, D, D), row-major, contiguous.
#ifndef TPR_TESTS_LIGHTNING_REF_H
#define TPR_TESTS_LIGHTNING_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// S (H, D, D) in/out: the state before the T tokens, then after; o (T, H, D).
static inline void lref_forward(int64_t T, int64_t H, int64_t D, const float *q, const float *k, const float *v,
                                const float *slopes, double *S, double *o) {
  for (int64_t h = 0; h < H; h++) {
    const double lam = exp(-(double)slopes[h]);
    double *Sh = S + h * D * D;
    for (int64_t t = 0; t < T; t++) {
      const float *qt = q + (t * H + h) * D, *kt = k + (t * H + h) * D, *vt = v + (t * H + h) * D;
      for (int64_t a = 0; a < D; a++)
        for (int64_t c = 0; c < D; c++) Sh[a * D + c] = lam * Sh[a * D + c] + (double)kt[a] * vt[c];
      for (int64_t c = 0; c < D; c++) {
        double acc = 0;
        for (int64_t a = 0; a < D; a++) acc += (double)qt[a] * Sh[a * D + c];
        o[(t * H + h) * D + c] = acc;
      }
    }
  }
}

// From S0 (H, D, D), dO (T, H, D) and dS_T (H, D, D): dq, dk, dv (T, H, D)
// and dS0 (H, D, D). G = dL/dS_t runs backwards: G_T = dS_T + q_T^T do_T,
// G_{t-1} = lam G_t + q_{t-1}^T do_{t-1}; dq_t = do_t S_t^T, dk_t = v_t G_t^T,
// dv_t = k_t G_t, dS0 = lam G_1.
static inline void lref_backward(int64_t T, int64_t H, int64_t D, const float *q, const float *k, const float *v,
                                 const float *slopes, const float *S0, const float *dO, const float *dST, double *dq,
                                 double *dk, double *dv, double *dS0) {
  double *Ss = malloc((size_t)((T + 1) * D * D) * sizeof *Ss), *G = malloc((size_t)(D * D) * sizeof *G);
  for (int64_t h = 0; h < H; h++) {
    const double lam = exp(-(double)slopes[h]);
    for (int64_t e = 0; e < D * D; e++) Ss[e] = S0[h * D * D + e];
    for (int64_t t = 0; t < T; t++) {  // Ss[t + 1] = S after token t
      const float *kt = k + (t * H + h) * D, *vt = v + (t * H + h) * D;
      for (int64_t a = 0; a < D; a++)
        for (int64_t c = 0; c < D; c++)
          Ss[(t + 1) * D * D + a * D + c] = lam * Ss[t * D * D + a * D + c] + (double)kt[a] * vt[c];
    }
    for (int64_t e = 0; e < D * D; e++) G[e] = dST[h * D * D + e];
    for (int64_t t = T - 1; t >= 0; t--) {
      const int64_t r = (t * H + h) * D;
      const double *St = Ss + (t + 1) * D * D;
      for (int64_t a = 0; a < D; a++)
        for (int64_t c = 0; c < D; c++) G[a * D + c] += (double)q[r + a] * dO[r + c];
      for (int64_t a = 0; a < D; a++) {
        double gq = 0, gk = 0, gv = 0;
        for (int64_t c = 0; c < D; c++) {
          gq += (double)dO[r + c] * St[a * D + c];
          gk += G[a * D + c] * v[r + c];
          gv += (double)k[r + c] * G[c * D + a];
        }
        dq[r + a] = gq, dk[r + a] = gk, dv[r + a] = gv;
      }
      for (int64_t e = 0; e < D * D; e++) G[e] *= lam;
    }
    memcpy(dS0 + h * D * D, G, (size_t)(D * D) * sizeof *G);
  }
  free(Ss), free(G);
}

#endif
