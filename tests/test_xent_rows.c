// The cross-entropy's row kernels (runtime/ops/loss/xent_rows.h): their
// double exp against glibc's exp on random arguments over the whole range
// the kernels see (l - max <= 0) and on the edges; the row sums against
// long-double sums of expl; and the same bits for every row on every ISA
// level this CPU runs. Negative control: exp evaluated in float (expf,
// above -80 where it does not underflow) misses the exp bound by orders of
// magnitude.
#include "test_util.h"
#include "runtime/cpu_isa.h"
#include "runtime/ops/loss/xent_rows.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXP_BOUND 4e-16  // relative: under 2 ulp of a double (glibc's exp is within 1)

static double rel(double got, double want) { return want == 0 ? fabs(got) : fabs(got - want) / fabs(want); }

static void test_exp_accuracy(void **state) {
  (void)state;
  double worst = 0, worst_x = 0, control = 0;
  for (int i = 0; i < 1000000; i++) {
    // Uniform over [-708, 0], and densely near 0 where the logits' mass is.
    double x = i % 2 ? tt_uniform(-708.0, 0.0) : -tt_uniform(0.0, 1.0) * tt_uniform(0.0, 30.0);
    double r = rel(tpr_xent_exp(x), exp(x));
    if (r > worst) worst = r, worst_x = x;
    if (x > -80.0) control = fmax(control, rel((double)expf((float)x), exp(x)));  // where float does not underflow
  }
  printf("exp on 1M arguments in [-708, 0]: worst relative error %.3g at %.17g (bound %.0e); in float (above -80): %.3g\n", worst,
         worst_x, EXP_BOUND, control);
  assert_true(worst <= EXP_BOUND);
  assert_true(control > 100 * EXP_BOUND);
  // The edges: exact at 0, 0 below -708 and at -inf, inf above 709, NaN kept.
  assert_true(tpr_xent_exp(0.0) == 1.0);
  assert_true(tpr_xent_exp(-0.0) == 1.0);
  assert_true(rel(tpr_xent_exp(-708.0), exp(-708.0)) <= EXP_BOUND);
  assert_true(tpr_xent_exp(-708.5) == 0.0 && tpr_xent_exp(-1e300) == 0.0 && tpr_xent_exp(-INFINITY) == 0.0);
  assert_true(rel(tpr_xent_exp(709.0), exp(709.0)) <= EXP_BOUND);
  assert_true(isinf(tpr_xent_exp(709.5)) && isinf(tpr_xent_exp(INFINITY)));
  assert_true(isnan(tpr_xent_exp(NAN)));
}

// Rows of n random logits (scale 4, with one far below the max so the
// underflow path runs); m their max.
static float *random_row(int64_t n, double *m) {
  float *row = malloc((size_t)n * sizeof *row);
  tt_fill_normal(row, (size_t)n, 4.0);
  if (n > 3) row[n / 2] = -1e4f;
  *m = -INFINITY;
  for (int64_t j = 0; j < n; j++) *m = fmax(*m, row[j]);
  return row;
}

static void test_rows_every_level(void **state) {
  (void)state;
  static const int64_t ns[] = {1, 7, 8, 9, 255, 256, 257, 1000, 32000};
  const int levels = (int)tpr_cpu_isa_detect() + 1;
  double worst_sum = 0, worst_grad = 0;
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    const int64_t n = ns[k];
    double m;
    float *row = random_row(n, &m), *grad[3], g = (float)tt_uniform(0.1, 2.0);
    double sum[3];
    for (int lv = 0; lv < levels; lv++) {
      tpr_cpu_isa_force((tpr_cpu_isa)lv);
      grad[lv] = malloc((size_t)n * sizeof *grad[lv]);
      sum[lv] = tpr_xent_row_sumexp(row, n, m);
      tpr_xent_row_grad(row, n, m, g, grad[lv]);
    }
    tpr_cpu_isa_force(tpr_cpu_isa_detect());
    long double want = 0;
    for (int64_t j = 0; j < n; j++) want += expl((long double)row[j] - (long double)m);
    worst_sum = fmax(worst_sum, rel(sum[0], (double)want));
    for (int64_t j = 0; j < n; j++) {
      double w = (double)g * exp((double)row[j] - m);  // then rounded to float, as the kernel does
      worst_grad = fmax(worst_grad, rel(grad[0][j], (float)w) / (double)FLT_EPSILON);
    }
    for (int lv = 1; lv < levels; lv++) {
      assert_memory_equal(&sum[lv], &sum[0], sizeof sum[0]);
      assert_memory_equal(grad[lv], grad[0], (size_t)n * sizeof *grad[0]);
    }
    for (int lv = 0; lv < levels; lv++) free(grad[lv]);
    free(row);
  }
  printf("rows of 1 to 32000 logits: sums vs long double %.3g (bound 1e-14); gradients within %.2g float ulp of "
         "glibc's exp; %d ISA levels give the same bits\n", worst_sum, worst_grad, levels);
  assert_true(worst_sum <= 1e-14);
  assert_true(worst_grad <= 1.0);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exp_accuracy),
      cmocka_unit_test(test_rows_every_level),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
