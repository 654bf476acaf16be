// Skinny GEMM (runtime/ops/gemm/skinny_gemm.h) on every weight dtype and every ISA
// level this CPU runs, against a double-precision reference that dequantises
// with runtime/dtype.h's scalar conversions (no code shared with the kernels'
// vector paths or their FP8 table). Sizes are odd on purpose: K not a
// multiple of any vector width, N not a multiple of the register tile, FP8
// shards starting mid-block, strided a/out/W.
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu_isa.h"
#include "runtime/dtype.h"
#include "runtime/ops/gemm/skinny_gemm.h"

static const tpr_dtype dtypes[] = {TPR_F32, TPR_BF16, TPR_F8E4M3};

// A random (N, K) weight with row stride ld in dtype dt (FP8: non-NaN bytes,
// random signed scales over a wide range, k_phase and scale_ld as given).
typedef struct wbuf {
  tpr_weight_view v;
  void *data;
  float *scale;
} wbuf;

static void wbuf_make(wbuf *b, tpr_dtype dt, int64_t N, int64_t K, int64_t ld, int k_phase) {
  memset(b, 0, sizeof *b);
  size_t es = tpr_dtype_size(dt);
  b->data = calloc((size_t)(N * ld + 1), es);
  for (int64_t i = 0; i < N * ld; i++) {
    float f = (float)tt_normal();
    if (dt == TPR_F32) ((float *)b->data)[i] = f;
    else if (dt == TPR_BF16) ((uint16_t *)b->data)[i] = tpr_f32_to_bf16(f);
    else {
      uint8_t x;
      do x = (uint8_t)tt_randint(0, 255); while ((x & 0x7f) == 0x7f);
      ((uint8_t *)b->data)[i] = x;
    }
  }
  b->v = (tpr_weight_view){.data = b->data, .dtype = dt, .ld = ld};
  if (dt == TPR_F8E4M3) {
    // Scale blocks of 128 columns as checkpoints have them, or the finer
    // per-rank blocks the loader keeps for a shard that starts mid-block.
    static const int blocks[3] = {128, 64, 32};
    int B = blocks[tt_randint(0, 2)];
    k_phase %= B;
    b->v.block = B == 128 ? 0 : B;
    int64_t sld = (K + k_phase + B - 1) / B + tt_randint(0, 2);
    b->scale = malloc((size_t)(N * sld) * sizeof(float));
    for (int64_t i = 0; i < N * sld; i++)
      b->scale[i] = (float)(ldexp(tt_uniform(0.5, 1.0), (int)tt_randint(-12, 2)) * (tt_randint(0, 3) ? 1 : -1));
    b->v.scale = b->scale;
    b->v.scale_ld = sld;
    b->v.k_phase = k_phase;
  }
}

static void wbuf_free(wbuf *b) {
  free(b->data);
  free(b->scale);
}

// Reference dequantised weight; `wrong` selects a deliberately broken formula
// for the negative controls: 1 = block index ignores k_phase (the bug of a
// shard that starts mid-block), 2 = the last column dropped.
static double ref_w(const tpr_weight_view *v, int64_t n, int64_t k, int wrong) {
  size_t i = (size_t)(n * v->ld + k);
  if (v->dtype == TPR_F32) return ((const float *)v->data)[i];
  if (v->dtype == TPR_BF16) return tpr_bf16_to_f32(((const uint16_t *)v->data)[i]);
  int64_t blk = (k + (wrong == 1 ? 0 : v->k_phase)) / tpr__fp8_block(v);
  return (double)tpr_f8e4m3_to_f32(((const uint8_t *)v->data)[i]) * (double)v->scale[n * v->scale_ld + blk];
}

// Compares out against the reference; returns the worst |err| / bound over
// all elements (<= 1 passes), bound = 1e-5 * sum_k |a||w| + 1e-30.
static double compare(const float *a, int64_t lda, int64_t M, int64_t K, const tpr_weight_view *v, int64_t N,
                      const float *out, int64_t ldo, int wrong) {
  double worst = 0;
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; k++) {
        if (wrong == 2 && k == K - 1) break;
        double w = ref_w(v, n, k, wrong);
        s += (double)a[m * lda + k] * w;
        mag += fabs((double)a[m * lda + k] * w);
      }
      double r = fabs((double)out[m * ldo + n] - s) / (1e-5 * mag + 1e-30);
      if (!(r <= worst)) worst = r;  // NaN counts as worst
    }
  return worst;
}

static int n_levels(void) { return (int)tpr_cpu_isa_detect() + 1; }

static void test_reference_all_isas(void **state) {
  (void)state;
  static const int64_t Ks[] = {1, 7, 129, 300, 1031};
  for (int lv = 0; lv < n_levels(); lv++) {
    tpr_cpu_isa_force((tpr_cpu_isa)lv);
    assert_int_equal(tpr_cpu_isa_active(), lv);
    for (size_t d = 0; d < 3; d++) {
      double worst = 0;
      int cases = 0;
      for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (int64_t M = 1; M <= 17; M++) {
          int64_t K = Ks[ki], N = 2 * tt_randint(0, 9) + 1;
          int64_t lda = K + tt_randint(0, 5), ldo = N + tt_randint(0, 3), ld = K + tt_randint(0, 3);
          wbuf wb;
          wbuf_make(&wb, dtypes[d], N, K, ld, (int)tt_randint(0, 127));
          float *a = malloc((size_t)(M * lda) * sizeof(float)), *out = malloc((size_t)(M * ldo) * sizeof(float));
          tt_fill_normal(a, (size_t)(M * lda), 1.0);
          for (int64_t i = 0; i < M * ldo; i++) out[i] = -7.0f;
          TT_OK(tpr_skinny_gemm(a, lda, M, K, &wb.v, N, out, ldo, 1));
          double r = compare(a, lda, M, K, &wb.v, N, out, ldo, 0);
          if (!(r <= 1.0))
            fail_msg("%s %s M=%lld K=%lld N=%lld lda=%lld ldo=%lld ld=%lld phase=%d: err/bound %.3g",
                     tpr_cpu_isa_name((tpr_cpu_isa)lv), tpr_dtype_name(dtypes[d]), (long long)M, (long long)K,
                     (long long)N, (long long)lda, (long long)ldo, (long long)ld, wb.v.k_phase, r);
          for (int64_t m = 0; m < M; m++)  // the padding between rows is untouched
            for (int64_t n = N; n < ldo; n++) assert_true(out[m * ldo + n] == -7.0f);
          if (r > worst) worst = r;
          cases++;
          free(a);
          free(out);
          wbuf_free(&wb);
        }
      printf("%-8s %-6s %3d cases (M 1..17, K 1..1031, odd N, strided): worst err / (1e-5 sum|a||w|) = %.3g\n",
             tpr_cpu_isa_name((tpr_cpu_isa)lv), tpr_dtype_name(dtypes[d]), cases, worst);
    }
  }
  tpr_cpu_isa_force(tpr_cpu_isa_detect());
}

// The comparison must catch a wrong block scale and a dropped tail column.
static void test_negative_controls(void **state) {
  (void)state;
  for (int lv = 0; lv < n_levels(); lv++) {
    tpr_cpu_isa_force((tpr_cpu_isa)lv);
    int64_t M = 3, K = 300, N = 5;
    wbuf wb;
    wbuf_make(&wb, TPR_F8E4M3, N, K, K, 37);
    // Scales of one magnitude, so a dropped column or a swapped block is never
    // hidden by a block that happens to be 2^-12 times smaller than the rest.
    for (int64_t i = 0; i < N * wb.v.scale_ld; i++) wb.scale[i] = (float)tt_uniform(0.5, 1.0);
    float a[3 * 300], out[3 * 5];
    tt_fill_normal(a, (size_t)(M * K), 1.0);
    // The last column carries weight: w = +-1.0 (E4M3 0x38 / 0xB8) times
    // a = +-16, so dropping it always moves each output by 16 x a scale (>= 0.5),
    // not by a random byte that may be 2^-9.
    for (int64_t n = 0; n < N; n++) ((uint8_t *)wb.data)[n * K + K - 1] = tt_randint(0, 1) ? 0x38 : 0xB8;
    for (int64_t m = 0; m < M; m++) a[m * K + K - 1] = tt_randint(0, 1) ? 16.0f : -16.0f;
    TT_OK(tpr_skinny_gemm(a, K, M, K, &wb.v, N, out, N, 1));
    double ok = compare(a, K, M, K, &wb.v, N, out, N, 0);
    double scale_bad = compare(a, K, M, K, &wb.v, N, out, N, 1);
    double tail_bad = compare(a, K, M, K, &wb.v, N, out, N, 2);
    printf("%-8s negative controls: right %.3g, wrong block scale %.3g, dropped last column %.3g (err/bound)\n",
           tpr_cpu_isa_name((tpr_cpu_isa)lv), ok, scale_bad, tail_bad);
    assert_true(ok <= 1.0);
    assert_true(scale_bad > 1.0);
    assert_true(tail_bad > 1.0);
    wbuf_free(&wb);
  }
  tpr_cpu_isa_force(tpr_cpu_isa_detect());
}

static void test_threads_bitwise(void **state) {
  (void)state;
  for (int lv = 0; lv < n_levels(); lv++) {
    tpr_cpu_isa_force((tpr_cpu_isa)lv);
    for (size_t d = 0; d < 3; d++) {
      int64_t M = tt_randint(1, 16), K = 1031, N = 2 * tt_randint(150, 300) + 1;
      wbuf wb;
      wbuf_make(&wb, dtypes[d], N, K, K, (int)tt_randint(0, 127));
      float *a = malloc((size_t)(M * K) * sizeof(float));
      float *o1 = malloc((size_t)(M * N) * sizeof(float)), *o2 = malloc((size_t)(M * N) * sizeof(float));
      tt_fill_normal(a, (size_t)(M * K), 1.0);
      TT_OK(tpr_skinny_gemm(a, K, M, K, &wb.v, N, o1, N, 1));
      TT_OK(tpr_skinny_gemm(a, K, M, K, &wb.v, N, o2, N, 2));
      assert_memory_equal(o1, o2, (size_t)(M * N) * sizeof(float));
      printf("%-8s %-6s M=%lld N=%lld K=%lld: 1 and 2 threads bitwise equal\n", tpr_cpu_isa_name((tpr_cpu_isa)lv),
             tpr_dtype_name(dtypes[d]), (long long)M, (long long)N, (long long)K);
      free(a);
      free(o1);
      free(o2);
      wbuf_free(&wb);
    }
  }
  tpr_cpu_isa_force(tpr_cpu_isa_detect());
}

static void test_dequant_rows_exact(void **state) {
  (void)state;
  for (size_t d = 0; d < 3; d++) {
    int64_t N = 9, K = 1031, ld = K + 3, n0 = tt_randint(0, 4), n1 = tt_randint(n0, N);
    wbuf wb;
    wbuf_make(&wb, dtypes[d], N, K, ld, (int)tt_randint(0, 127));
    float *dst = malloc((size_t)((n1 - n0) * K + 1) * sizeof(float));
    TT_OK(tpr_weight_dequant_rows(&wb.v, n0, n1, K, dst));
    int64_t bad = 0;
    for (int64_t n = n0; n < n1; n++)
      for (int64_t k = 0; k < K; k++) {
        size_t i = (size_t)(n * ld + k);
        float want;
        if (dtypes[d] == TPR_F32) want = ((float *)wb.data)[i];
        else if (dtypes[d] == TPR_BF16) want = tpr_bf16_to_f32(((uint16_t *)wb.data)[i]);
        else
          want = tpr_f8e4m3_to_f32(((uint8_t *)wb.data)[i]) *
                 wb.scale[n * wb.v.scale_ld + (k + wb.v.k_phase) / tpr__fp8_block(&wb.v)];
        if (memcmp(&want, &dst[(n - n0) * K + k], 4) != 0) bad++;
      }
    printf("dequant %-6s rows [%lld, %lld) K=%lld: %lld of %lld values differ from the scalar conversion\n",
           tpr_dtype_name(dtypes[d]), (long long)n0, (long long)n1, (long long)K, (long long)bad,
           (long long)((n1 - n0) * K));
    assert_int_equal(bad, 0);
    free(dst);
    wbuf_free(&wb);
  }
}

// FP8 rows the vector trick cannot carry: a NaN byte (the row's outputs are
// NaN, the others stay right) and a scale >= 2^7 (exact through the fallback).
static void test_fp8_specials(void **state) {
  (void)state;
  for (int lv = 0; lv < n_levels(); lv++) {
    tpr_cpu_isa_force((tpr_cpu_isa)lv);
    int64_t M = 2, K = 300, N = 7;
    wbuf wb;
    wbuf_make(&wb, TPR_F8E4M3, N, K, K, 5);
    ((uint8_t *)wb.data)[2 * K + 250] = 0xff;  // row 2: NaN
    for (int64_t j = 0; j < wb.v.scale_ld; j++) wb.scale[4 * wb.v.scale_ld + j] = 3000.0f;  // row 4: big scales
    float a[2 * 300], out[2 * 7];
    tt_fill_normal(a, (size_t)(M * K), 1.0);
    TT_OK(tpr_skinny_gemm(a, K, M, K, &wb.v, N, out, N, 1));
    for (int64_t m = 0; m < M; m++) assert_true(isnan(out[m * N + 2]));
    ((uint8_t *)wb.data)[2 * K + 250] = 0;  // compare the rest with the NaN removed from the reference
    float keep[2] = {out[2], out[N + 2]};
    out[2] = out[N + 2] = 0;
    double r = 0;
    for (int64_t n = 0; n < N; n++) {
      if (n == 2) continue;
      tpr_weight_view one = wb.v;
      one.data = (uint8_t *)wb.data + n * K;
      one.scale = wb.scale + n * wb.v.scale_ld;
      float o[2] = {out[n], out[N + n]};
      double e = compare(a, K, M, K, &one, 1, o, 1, 0);
      if (e > r) r = e;
    }
    printf("%-8s fp8 NaN byte -> row NaN (%g, %g); scale 3000 and the rest: err/bound %.3g\n",
           tpr_cpu_isa_name((tpr_cpu_isa)lv), keep[0], keep[1], r);
    assert_true(r <= 1.0);
    wbuf_free(&wb);
  }
  tpr_cpu_isa_force(tpr_cpu_isa_detect());
}

// K = 1 makes each output a single rounded product, so every FP8 byte (and
// the vector paths' bit tricks for subnormals, signs, zeros, NaN) is checked
// bit for bit against a * (fp8 * scale).
static void test_fp8_every_byte_exact(void **state) {
  (void)state;
  uint8_t wd[256];
  float sc[256], out[256];
  for (int i = 0; i < 256; i++) {
    wd[i] = (uint8_t)i;
    sc[i] = (float)ldexp(tt_uniform(0.5, 1.0), (int)tt_randint(-10, 3));
  }
  float a = (float)tt_uniform(0.5, 2.0);
  for (int lv = 0; lv < n_levels(); lv++) {
    tpr_cpu_isa_force((tpr_cpu_isa)lv);
    for (int phase = 0; phase < 128; phase += 127) {
      tpr_weight_view v = {.data = wd, .dtype = TPR_F8E4M3, .ld = 1, .scale = sc, .scale_ld = 1, .k_phase = phase};
      TT_OK(tpr_skinny_gemm(&a, 1, 1, 1, &v, 256, out, 256, 1));
      int bad = 0;
      for (int i = 0; i < 256; i++) {
        float want = a * (tpr_f8e4m3_to_f32((uint8_t)i) * sc[i]);
        // == : equal bits for nonzero values; a sum's zero may be +0 where the product is -0.
        if (isnan(want) ? !isnan(out[i]) : !(want == out[i])) {
          if (bad++ < 4) printf("  byte 0x%02x: got %a want %a\n", i, out[i], want);
        }
      }
      printf("%-8s fp8 all 256 bytes, K=1, k_phase %3d: %d differ from a * (fp8 * scale)\n",
             tpr_cpu_isa_name((tpr_cpu_isa)lv), phase, bad);
      assert_int_equal(bad, 0);
    }
  }
  tpr_cpu_isa_force(tpr_cpu_isa_detect());
}

static void test_errors(void **state) {
  (void)state;
  float a[8] = {0}, out[8];
  uint8_t wd[8] = {0};
  float sc[1] = {1};
  tpr_weight_view v = {.data = wd, .dtype = TPR_F16, .ld = 4};
  assert_int_equal(tpr_skinny_gemm(a, 4, 1, 4, &v, 2, out, 2, 1), TPR_ERR_DTYPE);
  v.dtype = TPR_F32;
  assert_int_equal(tpr_skinny_gemm(a, 3, 2, 4, &v, 1, out, 2, 1), TPR_ERR_INVALID_ARG);  // lda < K
  assert_int_equal(tpr_skinny_gemm(a, 4, 2, 4, &v, 2, out, 1, 1), TPR_ERR_INVALID_ARG);  // ldo < N
  assert_int_equal(tpr_skinny_gemm(a, 4, 1, 4, &v, 1, out, 1, 0), TPR_ERR_INVALID_ARG);  // threads
  assert_int_equal(tpr_skinny_gemm(a, 4, -1, 4, &v, 1, out, 1, 1), TPR_ERR_INVALID_ARG);
  v.ld = 3;
  assert_int_equal(tpr_skinny_gemm(a, 4, 1, 4, &v, 1, out, 1, 1), TPR_ERR_INVALID_ARG);  // ld < K
  v = (tpr_weight_view){.data = wd, .dtype = TPR_F8E4M3, .ld = 4, .scale = sc, .scale_ld = 1, .k_phase = 128};
  assert_int_equal(tpr_skinny_gemm(a, 4, 1, 4, &v, 1, out, 1, 1), TPR_ERR_INVALID_ARG);
  v.k_phase = 126;  // columns 0..3 span two blocks
  assert_int_equal(tpr_skinny_gemm(a, 4, 1, 4, &v, 1, out, 1, 1), TPR_ERR_INVALID_ARG);
  v.k_phase = 0;
  v.scale = NULL;
  assert_int_equal(tpr_skinny_gemm(a, 4, 1, 4, &v, 1, out, 1, 1), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_weight_dequant_rows(&v, 0, 1, 4, out), TPR_ERR_INVALID_ARG);
  v.scale = sc;
  assert_int_equal(tpr_weight_dequant_rows(&v, 2, 1, 4, out), TPR_ERR_INVALID_ARG);
  // K = 0 is an empty sum; M = 0 or N = 0 write nothing.
  out[0] = out[1] = 5;
  TT_OK(tpr_skinny_gemm(a, 0, 1, 0, &v, 2, out, 2, 1));
  assert_true(out[0] == 0 && out[1] == 0);
  TT_OK(tpr_skinny_gemm(NULL, 0, 0, 4, &v, 2, NULL, 0, 1));
  printf("errors: bad dtype, strides, threads, k_phase, scales rejected; K=0 gives zeros\n");
}

int main(void) {
  tt_seed_from_env();
  printf("# cpu isa: detected %s, active %s\n", tpr_cpu_isa_name(tpr_cpu_isa_detect()),
         tpr_cpu_isa_name(tpr_cpu_isa_active()));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_all_isas), cmocka_unit_test(test_negative_controls),
      cmocka_unit_test(test_threads_bitwise),    cmocka_unit_test(test_dequant_rows_exact),
      cmocka_unit_test(test_fp8_specials),       cmocka_unit_test(test_fp8_every_byte_exact),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
