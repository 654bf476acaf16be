// Skinny GEMM: argument checks, the run-time dispatch and OpenMP split, the
// portable variant (also the ARM path) and the dequantisation to f32 panels.
// The AVX2 and AVX-512 variants live in skinny_gemm_avx2.c / _avx512.c.
#include "skinny_gemm.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "runtime/cpu_isa.h"
#include "skinny_gemm_impl.h"

static float g_fp8[256];
static void build_fp8(void) {
  for (int b = 0; b < 256; b++) g_fp8[b] = tpr_f8e4m3_to_f32((uint8_t)b);
}
const float *tpr__fp8_table(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, build_fp8);
  return g_fp8;
}

static tpr_status check_view(const char *fn, const tpr_weight_view *w, int64_t N, int64_t K) {
  if (!w) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: weight view is NULL", fn);
  if (w->dtype != TPR_F32 && w->dtype != TPR_BF16 && w->dtype != TPR_F8E4M3)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: weight dtype %s (want f32, bf16 or f8e4m3)", fn, tpr_dtype_name(w->dtype));
  if (N < 0 || K < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: negative size N=%lld K=%lld", fn, (long long)N, (long long)K);
  if (w->ld < K) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: weight ld %lld < K %lld", fn, (long long)w->ld, (long long)K);
  if (N > 0 && K > 0 && !w->data) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: weight data is NULL", fn);
  if (w->dtype == TPR_F8E4M3) {
    const int64_t B = tpr__fp8_block(w);
    if (w->block < 0 || w->block > TPR_FP8_BLOCK)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: scale block %d outside [1, %d]", fn, w->block, TPR_FP8_BLOCK);
    if (w->k_phase < 0 || w->k_phase >= B)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: k_phase %d outside [0, %lld)", fn, w->k_phase, (long long)B);
    int64_t blocks = (K + w->k_phase + B - 1) / B;
    if (w->scale_ld < blocks)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: scale_ld %lld < %lld blocks of K=%lld at k_phase %d", fn,
                      (long long)w->scale_ld, (long long)blocks, (long long)K, w->k_phase);
    if (N > 0 && K > 0 && !w->scale) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: FP8 weight without scales", fn);
  }
  return TPR_OK;
}

// ---------------------------------------------------------------------------
// Portable variant: per weight row, dequantise a block of columns into a small
// f32 buffer, then dot it with up to 16 activation rows in 8 lanes (a shape
// compilers vectorise for SSE2/NEON without reassociating anything).

#define P_SEG TPR_FP8_BLOCK  // columns per dequantised segment; FP8 segments follow its blocks
#define P_MB 16              // activation rows per pass
#define P_LANES 8

// Columns [k0, k1) of row n as f32 into dst.
static void dequant_seg(const tpr_weight_view *w, int64_t n, int64_t k0, int64_t k1, float *dst) {
  int64_t len = k1 - k0;
  switch (w->dtype) {
    case TPR_F32: memcpy(dst, (const float *)w->data + n * w->ld + k0, (size_t)len * sizeof(float)); break;
    case TPR_BF16: {
      const uint16_t *src = (const uint16_t *)w->data + n * w->ld + k0;
      for (int64_t j = 0; j < len; j++) {
        uint32_t u = (uint32_t)src[j] << 16;
        memcpy(&dst[j], &u, 4);
      }
      break;
    }
    case TPR_F8E4M3: {
      const uint8_t *src = (const uint8_t *)w->data + n * w->ld + k0;
      const float *tab = tpr__fp8_table();
      const float *srow = w->scale + n * w->scale_ld;
      for (int64_t j = 0; j < len; j++) dst[j] = tab[src[j]] * srow[(k0 + j + w->k_phase) / tpr__fp8_block(w)];
      break;
    }
    default: break;
  }
}

// End of the segment that starts at column k0: the next FP8 block boundary.
static int64_t seg_end(const tpr_weight_view *w, int64_t k0, int64_t K) {
  int64_t e = k0 + P_SEG;
  if (w->dtype == TPR_F8E4M3) e = k0 + tpr__fp8_block(w) - (k0 + w->k_phase) % tpr__fp8_block(w);
  return e < K ? e : K;
}

void tpr__sg_rows_portable(const tpr__sg_args *p, int64_t n0, int64_t n1) {
  float wbuf[P_SEG];
  float acc[P_MB][P_LANES];
  for (int64_t n = n0; n < n1; n++) {
    for (int64_t m0 = 0; m0 < p->M; m0 += P_MB) {
      int64_t mb = p->M - m0 < P_MB ? p->M - m0 : P_MB;
      memset(acc, 0, sizeof acc);
      for (int64_t k0 = 0; k0 < p->K; ) {
        int64_t k1 = seg_end(p->w, k0, p->K), len = k1 - k0;
        dequant_seg(p->w, n, k0, k1, wbuf);
        for (int64_t m = 0; m < mb; m++) {
          const float *x = p->a + (m0 + m) * p->lda + k0;
          float *s = acc[m];
          int64_t j = 0;
          for (; j + P_LANES <= len; j += P_LANES)
            for (int l = 0; l < P_LANES; l++) s[l] += x[j + l] * wbuf[j + l];
          for (int l = 0; j < len; j++, l++) s[l] += x[j] * wbuf[j];
        }
        k0 = k1;
      }
      for (int64_t m = 0; m < mb; m++) {
        const float *s = acc[m];
        p->out[(m0 + m) * p->ldo + n] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      }
    }
  }
}

// ---------------------------------------------------------------------------

tpr_status tpr_weight_dequant_rows(const tpr_weight_view *w, int64_t n0, int64_t n1, int64_t K, float *dst) {
  TPR_CHECK(check_view("tpr_weight_dequant_rows", w, n1, K));
  if (n0 < 0 || n1 < n0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_weight_dequant_rows: bad row range [%lld, %lld)", (long long)n0,
                    (long long)n1);
  if (n1 > n0 && K > 0 && !dst) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_weight_dequant_rows: dst is NULL");
  for (int64_t n = n0; n < n1; n++)
    for (int64_t k0 = 0; k0 < K;) {
      int64_t k1 = seg_end(w, k0, K);
      dequant_seg(w, n, k0, k1, dst + (n - n0) * K + k0);
      k0 = k1;
    }
  return TPR_OK;
}

#define SG_ROWS_PER_TASK 16  // rows of W per OpenMP iteration: whole register tiles, enough to stream

typedef void (*sg_rows_fn)(const tpr__sg_args *, int64_t, int64_t);

tpr_status tpr_skinny_gemm(const float *a, int64_t lda, int64_t M, int64_t K, const tpr_weight_view *w, int64_t N,
                           float *out, int64_t ldo, int n_threads) {
  TPR_CHECK(check_view("tpr_skinny_gemm", w, N, K));
  if (M < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_skinny_gemm: negative M=%lld", (long long)M);
  if (n_threads < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_skinny_gemm: n_threads %d < 1", n_threads);
  if (M > 0 && lda < K)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_skinny_gemm: lda %lld < K %lld", (long long)lda, (long long)K);
  if (M > 0 && ldo < N)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_skinny_gemm: ldo %lld < N %lld", (long long)ldo, (long long)N);
  if (M == 0 || N == 0) return TPR_OK;
  if (!out || (K > 0 && !a)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_skinny_gemm: NULL a or out");
  if (K == 0) {  // an empty sum
    for (int64_t m = 0; m < M; m++) memset(out + m * ldo, 0, (size_t)N * sizeof(float));
    return TPR_OK;
  }
  tpr__sg_args p = {.a = a, .lda = lda, .M = M, .K = K, .w = w, .out = out, .ldo = ldo};
  sg_rows_fn fn = tpr__sg_rows_portable;
#if defined(__x86_64__)
  switch (tpr_cpu_isa_active()) {
    case TPR_ISA_AVX512: fn = tpr__sg_rows_avx512; break;
    case TPR_ISA_AVX2: fn = tpr__sg_rows_avx2; break;
    default: break;
  }
#endif
  if (w->dtype == TPR_F8E4M3) (void)tpr__fp8_table();  // built before the threads need it
  int64_t tasks = (N + SG_ROWS_PER_TASK - 1) / SG_ROWS_PER_TASK;
  // Below ~64K multiply-adds a fork/join costs about as much as the work.
  if (n_threads == 1 || tasks == 1 || (double)M * (double)N * (double)K < 65536.0) {
    fn(&p, 0, N);
    return TPR_OK;
  }
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (int64_t t = 0; t < tasks; t++) {
    int64_t n0 = t * SG_ROWS_PER_TASK, n1 = n0 + SG_ROWS_PER_TASK < N ? n0 + SG_ROWS_PER_TASK : N;
    fn(&p, n0, n1);
  }
  return TPR_OK;
}
