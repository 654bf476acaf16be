#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

// splitmix64: small, fast and good enough to drive tests.
uint64_t tt_next_u64(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t tt_seed_from_env(void) {
  const char *s = getenv("TPR_TEST_SEED");
  uint64_t seed = s ? strtoull(s, NULL, 0)
                    : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32) ^ (uint64_t)(uintptr_t)&seed;
  rng_state = seed;
  printf("# TPR_TEST_SEED=%llu\n", (unsigned long long)seed);
  fflush(stdout);
  return seed;
}

double tt_uniform(double lo, double hi) {
  return lo + (hi - lo) * ((double)(tt_next_u64() >> 11) * 0x1.0p-53);
}

double tt_normal(void) {
  double u1 = tt_uniform(0, 1), u2 = tt_uniform(0, 1);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t tt_randint(int64_t lo, int64_t hi) {
  return lo + (int64_t)(tt_next_u64() % (uint64_t)(hi - lo + 1));
}

void tt_fill_normal(float *x, size_t n, double scale) {
  for (size_t i = 0; i < n; i++) x[i] = (float)(scale * tt_normal());
}

double tt_max_rel_err(const float *got, const double *want, size_t n) {
  double max_ref = 1e-30, max_err = 0;
  for (size_t i = 0; i < n; i++) {
    if (fabs(want[i]) > max_ref) max_ref = fabs(want[i]);
    double e = fabs((double)got[i] - want[i]);
    if (!isfinite(e)) return INFINITY;  // a NaN anywhere fails, whatever follows it
    if (e > max_err) max_err = e;
  }
  return max_err / max_ref;
}

double tt_nmse(const float *got, const double *want, size_t n) {
  double num = 0, den = 1e-300;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return num / den;
}

tpr_backend *tt_cpu(void) {
  static tpr_backend *cpu;
  if (!cpu) {
    tpr_cpu_options opts = {.n_threads = 1};
    if (tpr_backend_cpu_new(&opts, &cpu) != TPR_OK) {
      fprintf(stderr, "cannot create CPU backend: %s\n", tpr_last_error());
      exit(1);
    }
  }
  return cpu;
}

tpr_tensor *tt_random_f32(tpr_backend *be, int ndim, const int64_t *shape, float **host) {
  tpr_tensor *t = NULL;
  TT_OK(tpr_tensor_new(be, TPR_F32, ndim, shape, &t));
  size_t n = (size_t)tpr_tensor_numel(t);
  float *h = malloc((n ? n : 1) * sizeof *h);
  tt_fill_normal(h, n, 1.0);
  TT_OK(tpr_tensor_from_host(t, h, n * sizeof *h));
  if (host) *host = h; else free(h);
  return t;
}
