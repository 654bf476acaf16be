// The bf16 GEMM's kernel (bf16_gemm.h) for AVX512_BF16, compiled for that
// target per function so the library keeps the baseline -march; called only
// where tpr_cpu_has_bf16_dot() said the CPU has it.
//
// Register tile: 4 weight rows x MR activation rows (MR <= 6), one zmm
// accumulator per pair, as the f32 skinny kernel's tile: each 32-element
// slice of a weight row is loaded once and used by MR vdpbf16ps, each
// slice of an activation row by 4. Lanes run along K (lane i sums the
// products of elements 2i and 2i+1 of every slice), so the weights are read
// in their checkpoint layout, and the four accumulators of an activation row
// are reduced together at the end (reduce4) into four adjacent outputs. A
// column's accumulator sees the same instruction sequence whatever MR, the
// tile's width at N's end, or the thread split: one result per column.
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")
#endif
#include <immintrin.h>

#include "bf16_gemm_impl.h"

#define AI static inline __attribute__((always_inline))
#define KV 32  // bf16 elements per zmm
#define RR 4   // weight rows per tile
#define MRMAX 6
#define SG 8             // activation rows sharing one pass over the weight rows (rows_stream)
#define STREAM_MAX_M 12  // up to this many rows the weights stream (rows_stream), above it tile()
#define PREFETCH 1024    // bf16 elements ahead of the stream (2 KiB)

// The four sums of a0..a3 as one vector [s0, s1, s2, s3]: pairs of lanes
// interleaved and added, then the four 128-bit quarters added. Each sum
// combines only its own accumulator's lanes, in a tree that does not depend
// on the other three, so a tile at N's end (zeros in place of missing rows)
// gives a column the same bits as a full one.
AI __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));  // per quarter: a0 a1 a0 a1
  __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));  // per quarter: a2 a3 a2 a3
  __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23));
  __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23));
  __m512 s = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));  // per quarter: a0 a1 a2 a3
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

AI __m512i load_bf16(const uint16_t *p, __mmask32 k, int full) {
  return full ? _mm512_loadu_si512((const void *)p) : _mm512_maskz_loadu_epi16(k, p);
}

// Columns n..n+rr-1 (rr <= 4), activation rows m0..m0+MR-1.
AI void tile(const tpr__bf16_args *p, int64_t n, int rr, int64_t m0, const int MR) {
  const int64_t K = p->K;
  const uint16_t *wrow[RR];
  for (int r = 0; r < RR; r++) wrow[r] = p->w + (n + (r < rr ? r : 0)) * p->ldw;
  const uint16_t *arow[MRMAX];
  for (int m = 0; m < MR; m++) arow[m] = p->a + (m0 + m) * p->lda;
  __m512 acc[MRMAX][RR];
  for (int m = 0; m < MR; m++)
    for (int r = 0; r < RR; r++) acc[m][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + KV <= K; k += KV) {
    __m512i wv[RR];
    for (int r = 0; r < RR; r++) wv[r] = load_bf16(wrow[r] + k, 0, 1);
    for (int m = 0; m < MR; m++) {
      __m512bh x = (__m512bh)load_bf16(arow[m] + k, 0, 1);
      for (int r = 0; r < RR; r++) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], x, (__m512bh)wv[r]);
    }
  }
  if (k < K) {
    __mmask32 km = (__mmask32)((1ull << (K - k)) - 1);
    __m512i wv[RR];
    for (int r = 0; r < RR; r++) wv[r] = load_bf16(wrow[r] + k, km, 0);
    for (int m = 0; m < MR; m++) {
      __m512bh x = (__m512bh)load_bf16(arow[m] + k, km, 0);
      for (int r = 0; r < RR; r++) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], x, (__m512bh)wv[r]);
    }
  }
  const __mmask8 keep = (__mmask8)((1u << rr) - 1);
  for (int m = 0; m < MR; m++) {
    // Rows past rr were loaded from row n (any valid row) and are dropped here.
    __m128 s = reduce4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
    _mm_mask_storeu_ps(p->out + (m0 + m) * p->ldo + n, keep, s);
  }
}

// A few activation rows (decode, batched decode): the same per-column
// chain as tile()'s, but one or two weight rows at a time, each read from
// start to end, so the weights stream nearly in address order: tile()'s
// four interleaved row streams reach about half the bandwidth (measured on
// the LM head at 2 to 8 rows), and from two rows on a software prefetch
// PREFETCH elements ahead keeps enough lines in flight while the dot
// products run (one row's light loop needs none: measured no faster). Each
// 32-element slice of a weight row is loaded once and used by up to SG
// activation rows, whose slices stay in the L1 cache; a later group of SG
// rows reads the weight rows again from the L1 cache. Two weight rows per
// pass halve the activation loads per dot product, which pays above four
// activation rows and costs a second stream below. Past 12 rows the
// activations no longer stay in the L1 cache beside the weights, and the
// tile's higher arithmetic rate wins (cold LM head, 2 threads: 12 rows
// 1.2-1.4x the tile's rate, 16 rows level). A column's finished
// accumulators wait in `sums` until its four columns are reduced together
// as tile() does.
AI void stream_pass(const tpr__bf16_args *p, const uint16_t *w0, int nw, int64_t m0, const int G, const int SW,
                    __m512 *sums) {
  const int64_t K = p->K, ldw = p->ldw;
  const __mmask32 km = (__mmask32)((1ull << (K % KV)) - 1);
  const uint16_t *wr[2] = {w0, w0 + (nw > 1 ? ldw : 0)};
  const uint16_t *arow[SG];
  __m512 acc[2][SG];
  for (int m = 0; m < G; m++) arow[m] = p->a + (m0 + m) * p->lda;
  for (int r = 0; r < SW; r++)
    for (int m = 0; m < G; m++) acc[r][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + KV <= K; k += KV) {
    __m512bh wv[2];
    for (int r = 0; r < SW; r++) {
      if (G > 1) _mm_prefetch((const char *)(wr[r] + k + PREFETCH), _MM_HINT_T0);
      wv[r] = (__m512bh)load_bf16(wr[r] + k, 0, 1);
    }
    for (int m = 0; m < G; m++) {
      __m512bh x = (__m512bh)load_bf16(arow[m] + k, 0, 1);
      for (int r = 0; r < SW; r++) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], x, wv[r]);
    }
  }
  if (k < K) {
    __m512bh wv[2];
    for (int r = 0; r < SW; r++) wv[r] = (__m512bh)load_bf16(wr[r] + k, km, 0);
    for (int m = 0; m < G; m++) {
      __m512bh x = (__m512bh)load_bf16(arow[m] + k, km, 0);
      for (int r = 0; r < SW; r++) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], x, wv[r]);
    }
  }
  for (int r = 0; r < SW && r < nw; r++)
    for (int m = 0; m < G; m++) sums[r * STREAM_MAX_M + m] = acc[r][m];
}

typedef void (*stream_fn)(const tpr__bf16_args *, const uint16_t *, int, int64_t, __m512 *);
#define STREAM_FN(SW, G)                                                                                   \
  static void stream_##SW##_##G(const tpr__bf16_args *p, const uint16_t *w0, int nw, int64_t m0, __m512 *s) { \
    stream_pass(p, w0, nw, m0, G, SW, s);                                                                  \
  }
#define STREAM_FNS(SW)                                                                                 \
  STREAM_FN(SW, 1) STREAM_FN(SW, 2) STREAM_FN(SW, 3) STREAM_FN(SW, 4) STREAM_FN(SW, 5) STREAM_FN(SW, 6) \
  STREAM_FN(SW, 7) STREAM_FN(SW, 8)                                                                    \
  static const stream_fn streams_##SW[SG] = {stream_##SW##_1, stream_##SW##_2, stream_##SW##_3, stream_##SW##_4, \
                                             stream_##SW##_5, stream_##SW##_6, stream_##SW##_7, stream_##SW##_8};
STREAM_FNS(1)
STREAM_FNS(2)

static void rows_stream(const tpr__bf16_args *p, int64_t n0, int64_t n1) {
  const int sw = p->M <= 4 ? 1 : 2;
  const stream_fn *fns = sw == 1 ? streams_1 : streams_2;
  __m512 sums[RR][STREAM_MAX_M];  // (4 columns, M rows) unreduced accumulators
  for (int64_t n = n0; n < n1; n += RR) {
    const int rr = n1 - n < RR ? (int)(n1 - n) : RR;
    for (int r = 0; r < RR; r += sw) {
      const int nw = rr - r < sw ? rr - r : sw;  // weight rows past N's end: zeros, dropped at the store
      for (int64_t m0 = 0; m0 < p->M; m0 += SG) {
        const int g = p->M - m0 < SG ? (int)(p->M - m0) : SG;
        if (nw > 0) fns[g - 1](p, p->w + (n + r) * p->ldw, nw, m0, sums[r] + m0);
        for (int q = nw > 0 ? nw : 0; q < sw; q++)
          for (int m = 0; m < g; m++) sums[r + q][m0 + m] = _mm512_setzero_ps();
      }
    }
    const __mmask8 keep = (__mmask8)((1u << rr) - 1);
    for (int64_t m = 0; m < p->M; m++)
      _mm_mask_storeu_ps(p->out + m * p->ldo + n, keep, reduce4(sums[0][m], sums[1][m], sums[2][m], sums[3][m]));
  }
}

#define TILE_MR(MR) \
  static void tile_##MR(const tpr__bf16_args *p, int64_t n, int rr, int64_t m0) { tile(p, n, rr, m0, MR); }
TILE_MR(1) TILE_MR(2) TILE_MR(3) TILE_MR(4) TILE_MR(5) TILE_MR(6)
typedef void (*tile_fn)(const tpr__bf16_args *, int64_t, int, int64_t);
static const tile_fn tiles[MRMAX] = {tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};

// Columns [n0, n1): weight tile outer, activation rows inner, so a tile's
// four weight rows stay in the L1 cache while every activation row passes.
void tpr__bf16_rows_avx512(const tpr__bf16_args *p, int64_t n0, int64_t n1) {
  if (p->M <= STREAM_MAX_M) {
    rows_stream(p, n0, n1);
    return;
  }
  for (int64_t n = n0; n < n1; n += RR) {
    int rr = n1 - n < RR ? (int)(n1 - n) : RR;
    for (int64_t m0 = 0; m0 < p->M; m0 += MRMAX) {
      int64_t mr = p->M - m0 < MRMAX ? p->M - m0 : MRMAX;
      tiles[mr - 1](p, n, rr, m0);
    }
  }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
