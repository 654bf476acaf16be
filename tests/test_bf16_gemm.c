// The bf16-activation GEMM (runtime/ops/gemm/bf16_gemm.h) against a double
// reference that rounds the activations with runtime/dtype.h's scalar
// tpr_f32_to_bf16 (no code shared with the kernel's rounding loop), on the
// AVX512_BF16 kernel where this CPU has it (skipped, and said so, where it
// does not) and on the widening fallback at every lower ISA level. Sizes are
// odd on purpose: K not a multiple of 32 (and odd, so the last bf16 pair is
// half padding), N not a multiple of the 4-row tile, M across the 6-row tile
// and the 64-row block, strided a, out and W.
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu_isa.h"
#include "runtime/dtype.h"
#include "runtime/ops/gemm/bf16_gemm.h"

typedef struct problem {
  int64_t M, K, N, lda, ldo, ld;
  float *a, *out;  // (M, lda), (M, ldo)
  uint16_t *w;     // (N, ld) bf16
  tpr_weight_view v;
} problem;

static void problem_make(problem *p, int64_t M, int64_t K, int64_t N) {
  *p = (problem){.M = M, .K = K, .N = N};
  p->lda = K + tt_randint(0, 5), p->ldo = N + tt_randint(0, 3), p->ld = K + tt_randint(0, 3);
  p->a = malloc((size_t)(M * p->lda + 1) * sizeof(float));
  p->out = malloc((size_t)(M * p->ldo + 1) * sizeof(float));
  p->w = malloc((size_t)(N * p->ld + 1) * sizeof(uint16_t));
  tt_fill_normal(p->a, (size_t)(M * p->lda), 1.0);
  for (int64_t i = 0; i < N * p->ld; i++) p->w[i] = tpr_f32_to_bf16((float)tt_normal());
  for (int64_t i = 0; i < M * p->ldo; i++) p->out[i] = -7.0f;
  p->v = (tpr_weight_view){.data = p->w, .dtype = TPR_BF16, .ld = p->ld};
}

static void problem_free(problem *p) { free(p->a), free(p->out), free(p->w); }

// Worst |out - ref| / (1e-6 sum_k |a||w| + 1e-30) over all outputs, the
// reference taking the activations rounded to bf16 (round = 1) or as they
// are (round = 0, the negative control: the f32 path's answer).
static double compare(const problem *p, int round) {
  double worst = 0;
  for (int64_t m = 0; m < p->M; m++)
    for (int64_t n = 0; n < p->N; n++) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < p->K; k++) {
        float x = p->a[m * p->lda + k];
        double xa = round ? (double)tpr_bf16_to_f32(tpr_f32_to_bf16(x)) : (double)x;
        double wk = tpr_bf16_to_f32(p->w[n * p->ld + k]);
        s += xa * wk, mag += fabs(xa * wk);
      }
      double r = fabs((double)p->out[m * p->ldo + n] - s) / (1e-6 * mag + 1e-30);
      if (!(r <= worst)) worst = r;  // NaN-safe: a NaN output becomes the worst
    }
  return worst;
}

// Levels to run: the bf16-dot kernel (avx512 with avx512_bf16) and the
// widening fallback below it.
static int n_levels(void) { return (int)tpr_cpu_isa_detect() + 1; }

static void run_reference(int lv, bool want_dot) {
  tpr_cpu_isa_force((tpr_cpu_isa)lv);
  assert_int_equal(tpr_cpu_has_bf16_dot(), want_dot);
  static const int64_t Ks[] = {1, 31, 33, 129, 300, 1031};
  // Rows: the streaming forms (one weight row per pass up to 4, two up to 12,
  // in groups of 8) and the tile above 12, with partial groups and tiles.
  static const int64_t Ms[] = {1, 2, 4, 5, 7, 9, 12, 13, 17, 64, 65, 131};
  double worst = 0, control = INFINITY;
  int cases = 0;
  for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
      problem p;
      problem_make(&p, Ms[mi], Ks[ki], tt_randint(1, 23));
      TT_OK(tpr_bf16_gemm(p.a, p.lda, p.M, p.K, &p.v, p.N, p.out, p.ldo, (int)tt_randint(1, 3)));
      double r = compare(&p, 1);
      if (!(r <= 1.0))
        fail_msg("%s M=%lld K=%lld N=%lld lda=%lld ldo=%lld ld=%lld: err/bound %.3g", tpr_cpu_isa_name(lv),
                 (long long)p.M, (long long)p.K, (long long)p.N, (long long)p.lda, (long long)p.ldo,
                 (long long)p.ld, r);
      for (int64_t m = 0; m < p.M; m++)  // the padding between rows is untouched
        for (int64_t n = p.N; n < p.ldo; n++) assert_true(p.out[m * p.ldo + n] == -7.0f);
      if (r > worst) worst = r;
      // The control: unrounded activations must be told apart, so the
      // rounding cannot have been skipped (K >= 31: enough terms).
      if (p.K >= 31) {
        double c = compare(&p, 0);
        if (c < control) control = c;
      }
      cases++;
      problem_free(&p);
    }
  printf("%-8s %-9s %3d cases: worst err / (1e-6 sum|a||w|) = %.3g; against unrounded activations >= %.3g\n",
         tpr_cpu_isa_name(lv), want_dot ? "bf16-dot" : "widening", cases, worst, control);
  assert_true(control > 5.0);
}

static void test_bf16_dot_kernel(void **state) {
  (void)state;
  tpr_cpu_isa_force(TPR_ISA_AVX512);
  if (!tpr_cpu_has_bf16_dot()) {
    printf("skipped: this CPU has no AVX512_BF16 (isa %s)\n", tpr_cpu_isa_name(tpr_cpu_isa_detect()));
    tpr_cpu_isa_force(tpr_cpu_isa_detect());
    skip();
  }
  run_reference(TPR_ISA_AVX512, true);
  tpr_cpu_isa_force(tpr_cpu_isa_detect());
}

static void test_widening_fallback(void **state) {
  (void)state;
  for (int lv = 0; lv < n_levels(); lv++) {
    tpr_cpu_isa_force((tpr_cpu_isa)lv);
    if (!tpr_cpu_has_bf16_dot()) run_reference(lv, false);  // avx512 too on a CPU without avx512_bf16
  }
  tpr_cpu_isa_force(tpr_cpu_isa_detect());
}

// A row's result is the same alone, anywhere in a batch, and for any thread
// count, on every level: the engine's answers must not depend on batching.
static void test_batch_and_thread_invariance(void **state) {
  (void)state;
  for (int lv = 0; lv < n_levels(); lv++) {
    tpr_cpu_isa_force((tpr_cpu_isa)lv);
    problem p;
    problem_make(&p, 131, 257, 37);
    TT_OK(tpr_bf16_gemm(p.a, p.lda, p.M, p.K, &p.v, p.N, p.out, p.ldo, 1));
    float *other = malloc((size_t)(p.M * p.ldo) * sizeof(float));
    TT_OK(tpr_bf16_gemm(p.a, p.lda, p.M, p.K, &p.v, p.N, other, p.ldo, 3));
    for (int64_t m = 0; m < p.M; m++) assert_memory_equal(other + m * p.ldo, p.out + m * p.ldo, p.N * sizeof(float));
    // Sub-batch lengths across every switch of the kernel: one or two weight
    // rows per pass (4 | 5), groups of 8 (8 | 9), streaming or tile (12 | 13).
    static const int64_t starts[] = {0, 5, 63, 64, 130}, lens[] = {1, 4, 5, 8, 9, 12, 13, 17};
    for (size_t s = 0; s < sizeof starts / sizeof starts[0]; s++)
      for (size_t li = 0; li < sizeof lens / sizeof lens[0] && starts[s] + lens[li] <= p.M; li++) {
        int64_t m0 = starts[s], len = lens[li];
        TT_OK(tpr_bf16_gemm(p.a + m0 * p.lda, p.lda, len, p.K, &p.v, p.N, other, p.ldo, 2));
        for (int64_t m = 0; m < len; m++)
          assert_memory_equal(other + m * p.ldo, p.out + (m0 + m) * p.ldo, p.N * sizeof(float));
      }
    printf("%-8s rows alone, in sub-batches and on 1 or 3 threads: same bits\n", tpr_cpu_isa_name(lv));
    free(other);
    problem_free(&p);
  }
  tpr_cpu_isa_force(tpr_cpu_isa_detect());
}

// The rounding loop equals tpr_f32_to_bf16 on random bit patterns and on
// ties, NaNs, infinities, subnormals and the overflow edge.
static void test_rounding(void **state) {
  (void)state;
  enum { N = 1 << 20 };
  float *x = malloc(N * sizeof *x);
  uint16_t *got = malloc(N * sizeof *got);
  static const uint32_t special[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001,
                                     0xffbfffff, 0x00000001, 0x807fffff, 0x3f808000, 0x3f818000, 0x7f7fffff,
                                     0x7f7f8000, 0xff7f7fff, 0x00008000, 0x00018000};
  size_t ns = sizeof special / sizeof special[0];
  for (size_t i = 0; i < N; i++) {
    uint32_t u = i < ns ? special[i] : (uint32_t)tt_next_u64();
    if (i >= ns && i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    memcpy(&x[i], &u, 4);
  }
  tpr_round_to_bf16(x, got, N);
  for (size_t i = 0; i < N; i++)
    if (got[i] != tpr_f32_to_bf16(x[i])) {
      uint32_t u;
      memcpy(&u, &x[i], 4);
      fail_msg("0x%08x: rounded to 0x%04x, want 0x%04x", u, got[i], tpr_f32_to_bf16(x[i]));
    }
  printf("rounding: %d values (ties, NaN, inf, subnormal, overflow) as tpr_f32_to_bf16\n", N);
  free(x), free(got);
}

static void test_errors(void **state) {
  (void)state;
  float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[4];
  uint16_t w[8] = {0};
  tpr_weight_view v = {.data = w, .dtype = TPR_F32, .ld = 4};
  assert_int_equal(tpr_bf16_gemm(a, 4, 1, 4, &v, 1, out, 1, 1), TPR_ERR_DTYPE);
  v.dtype = TPR_BF16;
  assert_int_equal(tpr_bf16_gemm(a, 4, 1, 4, NULL, 1, out, 1, 1), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_bf16_gemm(a, 3, 1, 4, &v, 1, out, 1, 1), TPR_ERR_INVALID_ARG);  // lda < K
  assert_int_equal(tpr_bf16_gemm(a, 4, 2, 4, &v, 2, out, 1, 1), TPR_ERR_INVALID_ARG);  // ldo < N
  assert_int_equal(tpr_bf16_gemm(a, 4, 1, 4, &v, 1, out, 1, 0), TPR_ERR_INVALID_ARG);  // threads
  assert_int_equal(tpr_bf16_gemm(a, 4, -1, 4, &v, 1, out, 1, 1), TPR_ERR_INVALID_ARG);
  v.ld = 3;
  assert_int_equal(tpr_bf16_gemm(a, 4, 1, 4, &v, 1, out, 1, 1), TPR_ERR_INVALID_ARG);  // ld < K
  v.ld = 4;
  out[0] = out[1] = 5;  // K = 0: an empty sum
  TT_OK(tpr_bf16_gemm(a, 0, 1, 0, &v, 2, out, 2, 1));
  assert_true(out[0] == 0 && out[1] == 0);
  printf("errors: f32 weights, NULL view, short strides, 0 threads, negative M rejected; K=0 gives zeros\n");
}

int main(void) {
  tt_seed_from_env();
  printf("# cpu isa: detected %s, bf16 dot products: %s\n", tpr_cpu_isa_name(tpr_cpu_isa_detect()),
         tpr_cpu_has_bf16_dot() ? "yes" : "no");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_dot_kernel),
      cmocka_unit_test(test_widening_fallback),
      cmocka_unit_test(test_batch_and_thread_invariance),
      cmocka_unit_test(test_rounding),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
