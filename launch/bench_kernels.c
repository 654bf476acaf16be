// tpr bench kernels: how close the skinny GEMM (runtime/ops/gemm/skinny_gemm.h)
// comes to streaming its weights at memory speed, per weight dtype.
//
// 1. Read probe: every thread sums its slice of a 512 MiB buffer with AVX2
//    loads (SSE-width scalar code off x86), best of 3 passes: the bandwidth a
//    decode step can hope for.
// 2. Skinny GEMM at M = 1, 4, 16 on an 8192 x 8192 weight (f32 256 MiB, bf16
//    128 MiB, FP8 64 MiB: all past the last-level cache): GB/s of weight (and
//    scale) bytes read, and its ratio to the probe.
// 3. Large M (64, 512): dequantise 256-row panels to f32 and call
//    cblas_sgemm on each, against one cblas_sgemm on f32 weights (GFLOP/s).
// 4. Large M on the bf16 weight: prefill's default path (the skinny tiles
//    in blocks of 64 rows, f32 activations) against the bf16-activation
//    GEMM (runtime/ops/gemm/bf16_gemm.h, --activation-dtype bf16), GFLOP/s.
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>
#include <cjson/cJSON.h>

#include "launch/args.h"
#include "launch/bench_kernels.h"
#include "launch/cli_util.h"
#include "runtime/cpu_isa.h"
#include "runtime/dtype.h"
#include "runtime/ops/gemm/bf16_gemm.h"
#include "runtime/ops/gemm/skinny_gemm.h"

#define BK_N 8192
#define BK_K 8192
#define BK_PROBE_BYTES ((size_t)512 << 20)
#define BK_PANEL 256

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static double sum_avx2(const float *x, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(x + i));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(x + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_loadu_ps(x + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_loadu_ps(x + i + 24));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  return (double)t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

static double sum_slice(const float *x, size_t n) {
#if defined(__x86_64__)
  if (tpr_cpu_isa_detect() >= TPR_ISA_AVX2) return sum_avx2(x, n);
#endif
  float s[8] = {0};
  for (size_t i = 0; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) s[l] += x[i + l];
  return (double)s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

// Read GB/s with all threads, best of 3 (pages touched first by their reader).
static double read_probe(int threads) {
  size_t n = BK_PROBE_BYTES / sizeof(float);
  float *x = malloc(BK_PROBE_BYTES);
  if (!x) return 0;
  double best = 0, sink = 0;
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t lo = n / (size_t)nt * (size_t)t, hi = t == nt - 1 ? n : n / (size_t)nt * (size_t)(t + 1);
    for (size_t i = lo; i < hi; i++) x[i] = (float)(i & 7);
  }
  for (int r = 0; r < 3; r++) {
    double t0 = tpr_cli_now(), s = 0;
#pragma omp parallel num_threads(threads) reduction(+ : s)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      size_t lo = n / (size_t)nt * (size_t)t, hi = t == nt - 1 ? n : n / (size_t)nt * (size_t)(t + 1);
      s += sum_slice(x + lo, hi - lo);
    }
    double g = (double)BK_PROBE_BYTES / (tpr_cli_now() - t0) * 1e-9;
    sink += s;
    if (g > best) best = g;
  }
  if (sink == 12345.0) fprintf(stderr, "#");  // keeps the sums alive
  free(x);
  return best;
}

typedef struct bk_weight {
  tpr_weight_view v;
  void *data;
  float *scale;
  double bytes;  // weight + scale bytes one pass reads
} bk_weight;

static bool make_weight(bk_weight *w, tpr_dtype dt, const float *f32) {
  memset(w, 0, sizeof *w);
  size_t n = (size_t)BK_N * BK_K;
  w->v = (tpr_weight_view){.dtype = dt, .ld = BK_K};
  if (dt == TPR_F32) {
    w->v.data = f32;
    w->bytes = (double)n * 4;
    return true;
  }
  w->data = malloc(n * tpr_dtype_size(dt));
  if (!w->data) return false;
  if (dt == TPR_BF16) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) ((uint16_t *)w->data)[i] = tpr_f32_to_bf16(f32[i]);
    w->bytes = (double)n * 2;
  } else {
    int64_t sld = BK_K / TPR_FP8_BLOCK;
    w->scale = malloc((size_t)(BK_N * sld) * sizeof(float));
    if (!w->scale) return false;
    for (int64_t i = 0; i < BK_N * sld; i++) w->scale[i] = 1.0f / 64;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) ((uint8_t *)w->data)[i] = tpr_f32_to_f8e4m3(f32[i] * 64);
    w->v.scale = w->scale;
    w->v.scale_ld = sld;
    w->bytes = (double)n + (double)(BK_N * sld) * 4;
  }
  w->v.data = w->data;
  return true;
}

// Best seconds of `reps` runs of the skinny GEMM (after one warm-up).
static double time_skinny(const float *a, int64_t M, const bk_weight *w, float *out, int threads, int reps) {
  double best = 1e30;
  for (int r = 0; r <= reps; r++) {
    double t0 = tpr_cli_now();
    if (tpr_skinny_gemm(a, BK_K, M, BK_K, &w->v, BK_N, out, BK_N, threads) != TPR_OK) return -1;
    double t = tpr_cli_now() - t0;
    if (r > 0 && t < best) best = t;
  }
  return best;
}

// out (M, N) through 256-row f32 panels: dequantise (threads split the
// panel's rows), then cblas_sgemm on BLAS threads. Best of 2 after a warm-up.
static double time_dequant_sgemm(const float *a, int64_t M, const bk_weight *w, float *panel, float *out,
                                 int threads) {
  double best = 1e30;
  for (int r = 0; r < 3; r++) {
    double t0 = tpr_cli_now();
    for (int64_t n0 = 0; n0 < BK_N; n0 += BK_PANEL) {
      int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : failed)
      for (int64_t q = 0; q < BK_PANEL; q += 32)
        failed |= tpr_weight_dequant_rows(&w->v, n0 + q, n0 + q + 32, BK_K, panel + q * BK_K) != TPR_OK;
      if (failed) return -1;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, BK_PANEL, BK_K, 1.0f, a, BK_K, panel, BK_K, 0.0f,
                  out + n0, BK_N);
    }
    double t = tpr_cli_now() - t0;
    if (r > 0 && t < best) best = t;
  }
  return best;
}

// Best of 2 after a warm-up: the bf16 weight through the skinny tiles in
// 64-row blocks (act_bf16 0), as tpr__weight_gemm runs prefill by default, or
// through the bf16-activation GEMM (act_bf16 1).
static double time_bf16_big(const float *a, int64_t M, const bk_weight *w, float *out, int threads, int act_bf16) {
  double best = 1e30;
  for (int r = 0; r < 3; r++) {
    double t0 = tpr_cli_now();
    if (act_bf16) {
      if (tpr_bf16_gemm(a, BK_K, M, BK_K, &w->v, BK_N, out, BK_N, threads) != TPR_OK) return -1;
    } else
      for (int64_t m0 = 0; m0 < M; m0 += 64)
        if (tpr_skinny_gemm(a + m0 * BK_K, BK_K, M - m0 < 64 ? M - m0 : 64, BK_K, &w->v, BK_N, out + m0 * BK_N,
                            BK_N, threads) != TPR_OK)
          return -1;
    double t = tpr_cli_now() - t0;
    if (r > 0 && t < best) best = t;
  }
  return best;
}

static double time_sgemm(const float *a, int64_t M, const float *w, float *out) {
  double best = 1e30;
  for (int r = 0; r < 3; r++) {
    double t0 = tpr_cli_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, BK_N, BK_K, 1.0f, a, BK_K, w, BK_K, 0.0f, out,
                BK_N);
    double t = tpr_cli_now() - t0;
    if (r > 0 && t < best) best = t;
  }
  return best;
}

static const tpr_dtype bk_dtypes[] = {TPR_F32, TPR_BF16, TPR_F8E4M3};
static const int64_t skinny_ms[] = {1, 4, 16};
static const int64_t big_ms[] = {64, 512};
#define N_DT 3
#define N_SM 3
#define N_BM 2

typedef struct bk_result {
  double read_gbs;
  double skinny_s[N_DT][N_SM], bytes[N_DT];
  double deq_s[N_DT][N_BM], f32_s[N_BM];
  double bf16_tiles_s[N_BM], bf16_act_s[N_BM];  // the bf16 weight: f32 activations, bf16 activations
} bk_result;

static void print_table(const bk_result *r, int threads) {
  printf("tpr bench kernels: %d threads, isa %s (detected %s); weight %d x %d\n", threads,
         tpr_cpu_isa_name(tpr_cpu_isa_active()), tpr_cpu_isa_name(tpr_cpu_isa_detect()), BK_N, BK_K);
  printf("memory read probe (512 MiB, all threads): %.1f GB/s\n\n", r->read_gbs);
  printf("%-8s %4s %10s %10s %8s %10s\n", "dtype", "M", "ms", "weight GB/s", "of read", "GFLOP/s");
  for (int d = 0; d < N_DT; d++)
    for (int i = 0; i < N_SM; i++) {
      double s = r->skinny_s[d][i], g = r->bytes[d] / s * 1e-9;
      printf("%-8s %4lld %10.2f %10.1f %7.0f%% %10.1f\n", tpr_dtype_name(bk_dtypes[d]), (long long)skinny_ms[i],
             s * 1e3, g, 100 * g / r->read_gbs, 2.0 * (double)skinny_ms[i] * BK_N * BK_K / s * 1e-9);
    }
  printf("\n%-8s %4s %16s %16s %8s\n", "dtype", "M", "dequant+sgemm GF/s", "f32 sgemm GF/s", "ratio");
  for (int d = 0; d < N_DT; d++)
    for (int i = 0; i < N_BM; i++) {
      double fl = 2.0 * (double)big_ms[i] * BK_N * BK_K * 1e-9;
      printf("%-8s %4lld %18.1f %16.1f %7.2f\n", tpr_dtype_name(bk_dtypes[d]), (long long)big_ms[i],
             fl / r->deq_s[d][i], fl / r->f32_s[i], r->f32_s[i] / r->deq_s[d][i]);
    }
  printf("\nbf16 weight, activations f32 (skinny tiles) or bf16 (%s):\n",
         tpr_cpu_has_bf16_dot() ? "vdpbf16ps" : "no AVX512_BF16 here: rounded, widened, skinny tiles");
  printf("%4s %16s %16s %8s\n", "M", "f32 act GF/s", "bf16 act GF/s", "ratio");
  for (int i = 0; i < N_BM; i++) {
    double fl = 2.0 * (double)big_ms[i] * BK_N * BK_K * 1e-9;
    printf("%4lld %16.1f %16.1f %7.2f\n", (long long)big_ms[i], fl / r->bf16_tiles_s[i], fl / r->bf16_act_s[i],
           r->bf16_tiles_s[i] / r->bf16_act_s[i]);
  }
}

static bool print_json(const bk_result *r, int threads) {
  cJSON *j = cJSON_CreateObject(), *sk = cJSON_CreateArray(), *bg = cJSON_CreateArray();
  cJSON_AddStringToObject(j, "bench", "kernels");
  cJSON_AddNumberToObject(j, "threads", threads);
  cJSON_AddStringToObject(j, "isa", tpr_cpu_isa_name(tpr_cpu_isa_active()));
  cJSON_AddNumberToObject(j, "n", BK_N);
  cJSON_AddNumberToObject(j, "k", BK_K);
  cJSON_AddNumberToObject(j, "read_gbs", r->read_gbs);
  for (int d = 0; d < N_DT; d++) {
    for (int i = 0; i < N_SM; i++) {
      cJSON *e = cJSON_CreateObject();
      double s = r->skinny_s[d][i], g = r->bytes[d] / s * 1e-9;
      cJSON_AddStringToObject(e, "dtype", tpr_dtype_name(bk_dtypes[d]));
      cJSON_AddNumberToObject(e, "m", (double)skinny_ms[i]);
      cJSON_AddNumberToObject(e, "ms", s * 1e3);
      cJSON_AddNumberToObject(e, "weight_gbs", g);
      cJSON_AddNumberToObject(e, "read_ratio", g / r->read_gbs);
      cJSON_AddNumberToObject(e, "gflops", 2.0 * (double)skinny_ms[i] * BK_N * BK_K / s * 1e-9);
      cJSON_AddItemToArray(sk, e);
    }
    for (int i = 0; i < N_BM; i++) {
      cJSON *e = cJSON_CreateObject();
      double fl = 2.0 * (double)big_ms[i] * BK_N * BK_K * 1e-9;
      cJSON_AddStringToObject(e, "dtype", tpr_dtype_name(bk_dtypes[d]));
      cJSON_AddNumberToObject(e, "m", (double)big_ms[i]);
      cJSON_AddNumberToObject(e, "dequant_sgemm_gflops", fl / r->deq_s[d][i]);
      cJSON_AddNumberToObject(e, "f32_sgemm_gflops", fl / r->f32_s[i]);
      cJSON_AddItemToArray(bg, e);
    }
  }
  cJSON *ba = cJSON_CreateArray();
  for (int i = 0; i < N_BM; i++) {
    cJSON *e = cJSON_CreateObject();
    double fl = 2.0 * (double)big_ms[i] * BK_N * BK_K * 1e-9;
    cJSON_AddNumberToObject(e, "m", (double)big_ms[i]);
    cJSON_AddNumberToObject(e, "f32_act_gflops", fl / r->bf16_tiles_s[i]);
    cJSON_AddNumberToObject(e, "bf16_act_gflops", fl / r->bf16_act_s[i]);
    cJSON_AddItemToArray(ba, e);
  }
  cJSON_AddItemToObject(j, "bf16_weight_large_m", ba);
  cJSON_AddBoolToObject(j, "bf16_dot", tpr_cpu_has_bf16_dot());
  cJSON_AddItemToObject(j, "skinny", sk);
  cJSON_AddItemToObject(j, "dequant_sgemm", bg);
  return tpr_cli_print_json(j);
}

int tpr_bench_kernels(int argc, char **argv) {
  int64_t threads = 0;
  bool json = false;
  const tpr_arg args[] = {
      {"threads", TPR_ARG_INT, &threads, "threads for the kernels and BLAS (default TPR_NUM_THREADS or all cores)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object"},
  };
  const char *usage = "usage: tpr bench kernels [--threads N] [--json]\n";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar == TPR_ARGS_HELP) return 0;
  if (ar == TPR_ARGS_ERROR) return 2;
  if (threads == 0) {
    const char *env = getenv("TPR_NUM_THREADS");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = env && atoi(env) > 0 ? atoi(env) : (cores > 0 ? cores : 1);
  }
  if (threads < 1 || threads > 4096) {
    fprintf(stderr, "tpr bench kernels: --threads %lld outside [1, 4096]\n%s", (long long)threads, usage);
    return 2;
  }
  int nt = (int)threads;
  openblas_set_num_threads(nt);
  bk_result r = {0};
  r.read_gbs = read_probe(nt);

  size_t n = (size_t)BK_N * BK_K;
  int64_t mmax = big_ms[N_BM - 1];
  float *f32 = malloc(n * sizeof(float)), *a = malloc((size_t)(mmax * BK_K) * sizeof(float));
  float *out = malloc((size_t)(mmax * BK_N) * sizeof(float));
  float *panel = malloc((size_t)BK_PANEL * BK_K * sizeof(float));
  bk_weight w[N_DT] = {0};
  int rc = 1;
  if (!f32 || !a || !out || !panel) {
    fprintf(stderr, "tpr bench kernels: out of memory\n");
    goto done;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (size_t i = 0; i < n; i++) f32[i] = (float)((int)((i * 2654435761u) >> 20 & 255) - 128) / 4096.0f;
  for (int64_t i = 0; i < mmax * BK_K; i++) a[i] = (float)((i * 40503u) % 97) / 97.0f - 0.5f;
  for (int d = 0; d < N_DT; d++) {
    if (!make_weight(&w[d], bk_dtypes[d], f32)) {
      fprintf(stderr, "tpr bench kernels: out of memory\n");
      goto done;
    }
    r.bytes[d] = w[d].bytes;
    for (int i = 0; i < N_SM; i++) {
      r.skinny_s[d][i] = time_skinny(a, skinny_ms[i], &w[d], out, nt, 5);
      if (r.skinny_s[d][i] < 0) {
        fprintf(stderr, "tpr bench kernels: %s\n", tpr_last_error());
        goto done;
      }
    }
    for (int i = 0; i < N_BM; i++) {
      r.deq_s[d][i] = time_dequant_sgemm(a, big_ms[i], &w[d], panel, out, nt);
      if (r.deq_s[d][i] < 0) {
        fprintf(stderr, "tpr bench kernels: %s\n", tpr_last_error());
        goto done;
      }
    }
  }
  for (int i = 0; i < N_BM; i++) r.f32_s[i] = time_sgemm(a, big_ms[i], f32, out);
  for (int i = 0; i < N_BM; i++) {
    r.bf16_tiles_s[i] = time_bf16_big(a, big_ms[i], &w[1], out, nt, 0);
    r.bf16_act_s[i] = time_bf16_big(a, big_ms[i], &w[1], out, nt, 1);
    if (r.bf16_tiles_s[i] < 0 || r.bf16_act_s[i] < 0) {
      fprintf(stderr, "tpr bench kernels: %s\n", tpr_last_error());
      goto done;
    }
  }
  if (json) rc = print_json(&r, nt) ? 0 : 1;
  else {
    print_table(&r, nt);
    rc = 0;
  }
done:
  for (int d = 0; d < N_DT; d++) {
    free(w[d].data);
    free(w[d].scale);
  }
  free(f32);
  free(a);
  free(out);
  free(panel);
  return rc;
}
