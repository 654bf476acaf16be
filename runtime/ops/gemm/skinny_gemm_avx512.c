// Skinny GEMM, AVX-512 variant (avx512f+bw+vl). Compiled for that target per
// function (the pragma below), so the library keeps the baseline -march and
// this code runs only where runtime/cpu_isa.c found the instructions.
//
// Register tile: RR weight rows x MR activation rows, one zmm accumulator per
// pair. Each 16-column weight vector is loaded and converted once and used by
// MR FMAs; each activation vector by RR FMAs. Every accumulator sees the same
// FMA sequence whatever RR, MR or the thread split, so results are bitwise
// reproducible. FP8: the exponent rebias 2^8 of the bit trick below is
// folded into the block scale, so a weight costs one multiply either way and
// the dequantised value is fp8 * scale rounded once, as in
// tpr_weight_dequant_rows.
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif
#include <immintrin.h>
#include <math.h>

#include "skinny_gemm_impl.h"

#define VL 16
#define AI static inline __attribute__((always_inline))

enum { DT_F32, DT_BF16, DT_FP8 };

// 16 weights from p (element pointer of its dtype), lanes outside `k` zero.
// FP8: sign-extending the byte to 16 bits and shifting by 7 puts the 4
// exponent and 3 mantissa bits where an IEEE half's go (the sign lands in bit
// 15; the and clears its copy in bit 14); that half is the E4M3 value times
// 2^-8 exactly, subnormals included, and vcvtph2ps widens it exactly, so
// multiplying by scale * 2^8 gives the dequantised weight rounded once. NaN
// bytes (S.1111.111) are caught separately.
AI __m512 load_w(int dt, const void *p, __mmask16 k, int full, __m512 s, __m128i *nanacc) {
  if (dt == DT_F32) return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p);
  if (dt == DT_BF16) {
    __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(k, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  __m128i b = full ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(k, p);
  *nanacc = _mm_max_epu8(*nanacc, _mm_and_si128(b, _mm_set1_epi8(0x7f)));
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
  h = _mm256_and_si256(h, _mm256_set1_epi16((short)0xBF80));
  return _mm512_mul_ps(_mm512_cvtph_ps(h), s);
}

// Output columns n..n+RR-1, activation rows m0..m0+MR-1. Returns a bit per
// weight row that the fast FP8 path cannot do exactly (a NaN byte, or a
// scale too large to carry the 2^120), for the caller to redo portably.
AI unsigned tile(const tpr__sg_args *p, int64_t n, int64_t m0, const int RR, const int MR, const int dt) {
  const tpr_weight_view *w = p->w;
  const int64_t K = p->K, esz = dt == DT_F32 ? 4 : dt == DT_BF16 ? 2 : 1;
  const char *wrow[4];
  const float *srow[4];
  for (int r = 0; r < RR; r++) {
    wrow[r] = (const char *)w->data + (n + r) * w->ld * esz;
    srow[r] = dt == DT_FP8 ? w->scale + (n + r) * w->scale_ld : 0;
  }
  const float *arow[8];
  for (int m = 0; m < MR; m++) arow[m] = p->a + (m0 + m) * p->lda;
  __m512 acc[8][4];
  for (int m = 0; m < MR; m++)
    for (int r = 0; r < RR; r++) acc[m][r] = _mm512_setzero_ps();
  __m128i nanacc[4];
  for (int r = 0; r < RR; r++) nanacc[r] = _mm_setzero_si128();
  unsigned bad = 0;
  for (int64_t k0 = 0; k0 < K;) {
    int64_t k1 = K;
    __m512 s[4];
    for (int r = 0; r < RR; r++) s[r] = _mm512_setzero_ps();
    if (dt == DT_FP8) {  // one segment per scale block
      const int64_t B = tpr__fp8_block(w);
      int64_t blk = (k0 + w->k_phase) / B;
      k1 = blk * B + B - w->k_phase;
      if (k1 > K) k1 = K;
      for (int r = 0; r < RR; r++) {
        float sc = srow[r][blk];
        if (!(fabsf(sc) < TPR__FP8_SCALE_FAST_MAX)) bad |= 1u << r;
        s[r] = _mm512_set1_ps(sc * 0x1p8f);
      }
    }
    int64_t k = k0;
    for (; k + VL <= k1; k += VL) {
      __m512 wv[4];
      for (int r = 0; r < RR; r++) wv[r] = load_w(dt, wrow[r] + k * esz, 0, 1, s[r], &nanacc[r]);
      for (int m = 0; m < MR; m++) {
        __m512 x = _mm512_loadu_ps(arow[m] + k);
        for (int r = 0; r < RR; r++) acc[m][r] = _mm512_fmadd_ps(x, wv[r], acc[m][r]);
      }
    }
    if (k < k1) {
      __mmask16 km = (__mmask16)((1u << (k1 - k)) - 1);
      __m512 wv[4];
      for (int r = 0; r < RR; r++) wv[r] = load_w(dt, wrow[r] + k * esz, km, 0, s[r], &nanacc[r]);
      for (int m = 0; m < MR; m++) {
        __m512 x = _mm512_maskz_loadu_ps(km, arow[m] + k);
        for (int r = 0; r < RR; r++) acc[m][r] = _mm512_fmadd_ps(x, wv[r], acc[m][r]);
      }
    }
    k0 = k1;
  }
  for (int m = 0; m < MR; m++)
    for (int r = 0; r < RR; r++) p->out[(m0 + m) * p->ldo + n + r] = _mm512_reduce_add_ps(acc[m][r]);
  if (dt == DT_FP8)
    for (int r = 0; r < RR; r++) {
      __m128i hit = _mm_cmpeq_epi8(nanacc[r], _mm_set1_epi8(0x7f));
      if (_mm_movemask_epi8(hit)) bad |= 1u << r;
    }
  return bad;
}

// One activation row against weight row n (f32 or bf16): four accumulators
// over the row so the FMA chain does not bound it, one row at a time so the
// weights stream in address order. Decode's matmuls have short rows (K of
// about a thousand): there, four interleaved row streams (the 4 x MR tile)
// stay below the bandwidth one sequential stream reaches.
AI void row_dot1(const tpr__sg_args *p, int64_t n, const int dt) {
  const int64_t K = p->K, esz = dt == DT_F32 ? 4 : 2;
  const char *wr = (const char *)p->w->data + n * p->w->ld * esz;
  const float *x = p->a;
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  __m512 s = _mm512_setzero_ps();
  __m128i nan;
  int64_t k = 0;
  for (; k + 4 * VL <= K; k += 4 * VL)
    for (int u = 0; u < 4; u++)
      acc[u] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + u * VL), load_w(dt, wr + (k + u * VL) * esz, 0, 1, s, &nan),
                               acc[u]);
  for (; k + VL <= K; k += VL)
    acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), load_w(dt, wr + k * esz, 0, 1, s, &nan), acc[0]);
  if (k < K) {
    __mmask16 km = (__mmask16)((1u << (K - k)) - 1);
    acc[1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(km, x + k), load_w(dt, wr + k * esz, km, 0, s, &nan), acc[1]);
  }
  __m512 t = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  p->out[n] = _mm512_reduce_add_ps(t);
}

// The same for an FP8 row: block by block, each block's scale folded into
// the widening multiply as in tile(). Returns 1 when the row needs the
// portable path (a NaN byte, a scale too large for the bit trick).
static unsigned row_dot1_fp8(const tpr__sg_args *p, int64_t n) {
  const tpr_weight_view *w = p->w;
  const int64_t K = p->K, B = tpr__fp8_block(w);
  const char *wr = (const char *)w->data + n * w->ld;
  const float *sr = w->scale + n * w->scale_ld, *x = p->a;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m128i nan = _mm_setzero_si128();
  unsigned bad = 0;
  for (int64_t k0 = 0; k0 < K;) {
    int64_t blk = (k0 + w->k_phase) / B, k1 = blk * B + B - w->k_phase, k = k0;
    if (k1 > K) k1 = K;
    float sc = sr[blk];
    if (!(fabsf(sc) < TPR__FP8_SCALE_FAST_MAX)) bad = 1;
    __m512 s = _mm512_set1_ps(sc * 0x1p8f);
    for (; k + 2 * VL <= k1; k += 2 * VL) {
      acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), load_w(DT_FP8, wr + k, 0, 1, s, &nan), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + VL), load_w(DT_FP8, wr + k + VL, 0, 1, s, &nan), acc1);
    }
    for (; k + VL <= k1; k += VL)
      acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), load_w(DT_FP8, wr + k, 0, 1, s, &nan), acc0);
    if (k < k1) {
      __mmask16 km = (__mmask16)((1u << (k1 - k)) - 1);
      acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(km, x + k), load_w(DT_FP8, wr + k, km, 0, s, &nan), acc1);
    }
    k0 = k1;
  }
  if (_mm_movemask_epi8(_mm_cmpeq_epi8(nan, _mm_set1_epi8(0x7f)))) bad = 1;
  p->out[n] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  return bad;
}

// Tiles of 4 weight rows by 1..MRMAX activation rows.
#define MRMAX 6
#include "skinny_gemm_tiles.h"

void tpr__sg_rows_avx512(const tpr__sg_args *p, int64_t n0, int64_t n1) {
  const int dt = weight_dt(p);
  if (p->M == 1 && dt == DT_FP8) {
    for (int64_t n = n0; n < n1; n++)
      if (row_dot1_fp8(p, n)) tpr__sg_rows_portable(p, n, n + 1);
    return;
  }
  if (p->M == 1) {
    (dt == DT_F32 ? rows_dot1_f32 : rows_dot1_bf16)(p, n0, n1);
    return;
  }
  rows_tiled(p, n0, n1, dt);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
