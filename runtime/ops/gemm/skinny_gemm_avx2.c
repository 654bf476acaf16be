// Skinny GEMM, AVX2+FMA variant: the same tiling as skinny_gemm_avx512.c
// (see there for the FP8 bit trick and the determinism argument) with 8-lane
// vectors and 16 registers, so the register tile is smaller. AVX2 has no
// masked byte loads: a segment's tail of bf16/FP8 weights is copied into a
// zeroed buffer; f32 tails use vmaskmov.
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "skinny_gemm_impl.h"

#define VL 8
#define RR_MAX 4
#define MRMAX 2
#define AI static inline __attribute__((always_inline))

enum { DT_F32, DT_BF16, DT_FP8 };

// Lane mask with the first t (0..8) lanes set.
AI __m256i lanes(int64_t t) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)t), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 weights at p (element pointer of its dtype). t < 8: only t valid, the rest zero.
AI __m256 load_w(int dt, const void *p, int64_t t, __m256 s, __m128i *nanacc) {
  if (dt == DT_F32) return t == VL ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes(t));
  if (dt == DT_BF16) {
    __m128i h;
    if (t == VL) h = _mm_loadu_si128((const __m128i *)p);
    else {
      uint16_t buf[VL] = {0};
      memcpy(buf, p, (size_t)t * 2);
      h = _mm_loadu_si128((const __m128i *)buf);
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  __m128i b;
  if (t == VL) b = _mm_loadl_epi64((const __m128i *)p);
  else {
    uint8_t buf[16] = {0};
    memcpy(buf, p, (size_t)t);
    b = _mm_loadl_epi64((const __m128i *)buf);
  }
  *nanacc = _mm_max_epu8(*nanacc, _mm_and_si128(b, _mm_set1_epi8(0x7f)));
  __m256i x = _mm256_slli_epi32(_mm256_cvtepi8_epi32(b), 20);
  x = _mm256_and_si256(x, _mm256_set1_epi32((int)0x87F00000u));
  return _mm256_mul_ps(_mm256_castsi256_ps(x), s);
}

// Fixed-order horizontal sum.
AI float hsum(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

AI unsigned tile(const tpr__sg_args *p, int64_t n, int64_t m0, const int RR, const int MR, const int dt) {
  const tpr_weight_view *w = p->w;
  const int64_t K = p->K, esz = dt == DT_F32 ? 4 : dt == DT_BF16 ? 2 : 1;
  const char *wrow[RR_MAX];
  const float *srow[RR_MAX];
  for (int r = 0; r < RR; r++) {
    wrow[r] = (const char *)w->data + (n + r) * w->ld * esz;
    srow[r] = dt == DT_FP8 ? w->scale + (n + r) * w->scale_ld : 0;
  }
  const float *arow[MRMAX];
  for (int m = 0; m < MR; m++) arow[m] = p->a + (m0 + m) * p->lda;
  __m256 acc[MRMAX][RR_MAX];
  for (int m = 0; m < MR; m++)
    for (int r = 0; r < RR; r++) acc[m][r] = _mm256_setzero_ps();
  __m128i nanacc[RR_MAX];
  for (int r = 0; r < RR; r++) nanacc[r] = _mm_setzero_si128();
  unsigned bad = 0;
  for (int64_t k0 = 0; k0 < K;) {
    int64_t k1 = K;
    __m256 s[RR_MAX];
    for (int r = 0; r < RR; r++) s[r] = _mm256_setzero_ps();
    if (dt == DT_FP8) {
      const int64_t B = tpr__fp8_block(w);
      int64_t blk = (k0 + w->k_phase) / B;
      k1 = blk * B + B - w->k_phase;
      if (k1 > K) k1 = K;
      for (int r = 0; r < RR; r++) {
        float sc = srow[r][blk];
        if (!(fabsf(sc) < TPR__FP8_SCALE_FAST_MAX)) bad |= 1u << r;
        s[r] = _mm256_set1_ps(sc * 0x1p120f);
      }
    }
    int64_t k = k0;
    for (; k + VL <= k1; k += VL) {
      __m256 wv[RR_MAX];
      for (int r = 0; r < RR; r++) wv[r] = load_w(dt, wrow[r] + k * esz, VL, s[r], &nanacc[r]);
      for (int m = 0; m < MR; m++) {
        __m256 x = _mm256_loadu_ps(arow[m] + k);
        for (int r = 0; r < RR; r++) acc[m][r] = _mm256_fmadd_ps(x, wv[r], acc[m][r]);
      }
    }
    if (k < k1) {
      int64_t t = k1 - k;
      __m256 wv[RR_MAX];
      for (int r = 0; r < RR; r++) wv[r] = load_w(dt, wrow[r] + k * esz, t, s[r], &nanacc[r]);
      for (int m = 0; m < MR; m++) {
        __m256 x = _mm256_maskload_ps(arow[m] + k, lanes(t));
        for (int r = 0; r < RR; r++) acc[m][r] = _mm256_fmadd_ps(x, wv[r], acc[m][r]);
      }
    }
    k0 = k1;
  }
  for (int m = 0; m < MR; m++)
    for (int r = 0; r < RR; r++) p->out[(m0 + m) * p->ldo + n + r] = hsum(acc[m][r]);
  if (dt == DT_FP8)
    for (int r = 0; r < RR; r++)
      if (_mm_movemask_epi8(_mm_cmpeq_epi8(nanacc[r], _mm_set1_epi8(0x7f)))) bad |= 1u << r;
  return bad;
}

// One activation row against weight row n (f32 or bf16), four accumulators,
// one weight row at a time: the single-row path of skinny_gemm_avx512.c
// (short decode rows stream faster in address order than as a 4-row tile).
AI void row_dot1(const tpr__sg_args *p, int64_t n, const int dt) {
  const int64_t K = p->K, esz = dt == DT_F32 ? 4 : 2;
  const char *wr = (const char *)p->w->data + n * p->w->ld * esz;
  const float *x = p->a;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 s = _mm256_setzero_ps();
  __m128i nan;
  int64_t k = 0;
  for (; k + 4 * VL <= K; k += 4 * VL)
    for (int u = 0; u < 4; u++)
      acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + u * VL), load_w(dt, wr + (k + u * VL) * esz, VL, s, &nan),
                               acc[u]);
  for (; k + VL <= K; k += VL)
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load_w(dt, wr + k * esz, VL, s, &nan), acc[0]);
  if (k < K)
    acc[1] = _mm256_fmadd_ps(_mm256_maskload_ps(x + k, lanes(K - k)), load_w(dt, wr + k * esz, K - k, s, &nan),
                             acc[1]);
  p->out[n] = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

// The same for an FP8 row: block by block, each block's scale (with the
// bit trick's 2^120) folded into the widening multiply as in tile(); two
// accumulators. Returns 1 when the row needs the portable path (a NaN
// byte, a scale too large for the bit trick).
static unsigned row_dot1_fp8(const tpr__sg_args *p, int64_t n) {
  const tpr_weight_view *w = p->w;
  const int64_t K = p->K, B = tpr__fp8_block(w);
  const char *wr = (const char *)w->data + n * w->ld;
  const float *sr = w->scale + n * w->scale_ld, *x = p->a;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m128i nan = _mm_setzero_si128();
  unsigned bad = 0;
  for (int64_t k0 = 0; k0 < K;) {
    int64_t blk = (k0 + w->k_phase) / B, k1 = blk * B + B - w->k_phase, k = k0;
    if (k1 > K) k1 = K;
    float sc = sr[blk];
    if (!(fabsf(sc) < TPR__FP8_SCALE_FAST_MAX)) bad = 1;
    __m256 s = _mm256_set1_ps(sc * 0x1p120f);
    for (; k + 2 * VL <= k1; k += 2 * VL) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load_w(DT_FP8, wr + k, VL, s, &nan), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + VL), load_w(DT_FP8, wr + k + VL, VL, s, &nan), acc1);
    }
    for (; k + VL <= k1; k += VL) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load_w(DT_FP8, wr + k, VL, s, &nan), acc0);
    if (k < k1)
      acc1 = _mm256_fmadd_ps(_mm256_maskload_ps(x + k, lanes(k1 - k)), load_w(DT_FP8, wr + k, k1 - k, s, &nan), acc1);
    k0 = k1;
  }
  if (_mm_movemask_epi8(_mm_cmpeq_epi8(nan, _mm_set1_epi8(0x7f)))) bad = 1;
  p->out[n] = hsum(_mm256_add_ps(acc0, acc1));
  return bad;
}

#include "skinny_gemm_tiles.h"

void tpr__sg_rows_avx2(const tpr__sg_args *p, int64_t n0, int64_t n1) {
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
