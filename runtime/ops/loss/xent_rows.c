// xent_rows.h: one body per ISA level (AVX-512, AVX2, the baseline), the
// level chosen at run time by tpr_cpu_isa_active(). Contraction is off so
// no level fuses a multiply and an add the others do not: the bits match.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "xent_rows.h"

#include <math.h>
#include <string.h>

#include "runtime/cpu_isa.h"

#define AI static inline __attribute__((always_inline))
#define LANES 8

// x = k ln2 + r with k = round(x / ln2) (the 1.5 * 2^52 shift rounds to
// nearest), ln2 split in two so k * LN2_HI is exact for |k| < 2^11 and
// |r| <= ln2 / 2; exp(r) by its Taylor series to r^13 / 13! (truncation
// below 5e-18 relative), times 2^k built in the exponent bits.
AI double xexp(double x) {
  const double shift = 0x1.8p52, inv_ln2 = 0x1.71547652b82fep0;
  const double ln2_hi = 0x1.62e42fee00000p-1, ln2_lo = 0x1.a39ef35793c76p-33;
  const double t = x * inv_ln2 + shift, k = t - shift;
  const double r = (x - k * ln2_hi) - k * ln2_lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // k + 1023 into the exponent field; unsigned, so the lanes whose result
  // is replaced below (x far out of range, NaN) wrap instead of overflowing.
  uint64_t tb, sb;
  memcpy(&tb, &t, sizeof tb);
  sb = (tb - UINT64_C(0x4338000000000000) + 1023u) << 52;
  double scale;
  memcpy(&scale, &sb, sizeof scale);
  const double e = p * scale;
  const double low = x < -708.0 ? 0.0 : e;  // NaN: both tests false, e is NaN
  return x > 709.0 ? INFINITY : low;
}

// The exps of a chunk first (a loop the compiler vectorizes), then added
// into the lanes: CHUNK is a multiple of LANES, so column j lands in lane
// j % LANES in every chunk, the last one's tail too.
#define CHUNK 256
AI double row_sumexp(const float *row, int64_t n, double m) {
  double acc[LANES] = {0}, e[CHUNK];
  for (int64_t j0 = 0; j0 < n; j0 += CHUNK) {
    const int c = n - j0 < CHUNK ? (int)(n - j0) : CHUNK;
    for (int i = 0; i < c; i++) e[i] = xexp((double)row[j0 + i] - m);
    int i = 0;
    for (; i + LANES <= c; i += LANES)
      for (int l = 0; l < LANES; l++) acc[l] += e[i + l];
    for (int l = 0; i + l < c; l++) acc[l] += e[i + l];
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

AI void row_grad(const float *row, int64_t n, double m, double g, float *out) {
  for (int64_t j = 0; j < n; j++) out[j] = (float)(g * xexp((double)row[j] - m));
}

#define LEVEL(name, attr)                                                                                \
  attr static double sumexp_##name(const float *row, int64_t n, double m) { return row_sumexp(row, n, m); } \
  attr static void grad_##name(const float *row, int64_t n, double m, double g, float *out) {            \
    row_grad(row, n, m, g, out);                                                                          \
  }
LEVEL(portable, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
LEVEL(avx2, __attribute__((target("avx2"))))
LEVEL(avx512, __attribute__((target("avx512f,avx512dq"))))
#define HAVE_LEVELS 1
#endif

double tpr_xent_exp(double x) { return xexp(x); }

double tpr_xent_row_sumexp(const float *row, int64_t n, double m) {
#ifdef HAVE_LEVELS
  switch (tpr_cpu_isa_active()) {
    case TPR_ISA_AVX512: return sumexp_avx512(row, n, m);
    case TPR_ISA_AVX2: return sumexp_avx2(row, n, m);
    default: break;
  }
#endif
  return sumexp_portable(row, n, m);
}

void tpr_xent_row_grad(const float *row, int64_t n, double m, double g, float *out) {
#ifdef HAVE_LEVELS
  switch (tpr_cpu_isa_active()) {
    case TPR_ISA_AVX512: grad_avx512(row, n, m, g, out); return;
    case TPR_ISA_AVX2: grad_avx2(row, n, m, g, out); return;
    default: break;
  }
#endif
  grad_portable(row, n, m, g, out);
}
