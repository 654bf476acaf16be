// Shared helpers for the CMocka tests: a seeded RNG (fresh seed each run,
// printed, reproducible with TPR_TEST_SEED=...), random fills that never give
// all zeros, and error measures against double-precision references.
#ifndef TPR_TEST_UTIL_H
#define TPR_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka.h needs the three headers above first.
#include <cmocka.h>

#include "runtime/program/tpr_runtime.h"

// Seeds the RNG from TPR_TEST_SEED or the clock and prints the seed; call
// once at the start of main().
uint64_t tt_seed_from_env(void);
uint64_t tt_next_u64(void);
double tt_uniform(double lo, double hi);  // [lo, hi)
double tt_normal(void);                   // N(0, 1)
int64_t tt_randint(int64_t lo, int64_t hi);  // [lo, hi]

// Fills a host f32 buffer with N(0, scale^2) values.
void tt_fill_normal(float *x, size_t n, double scale);

// max_i |got_i - want_i| / max(max_i |want_i|, tiny): error relative to the
// reference's magnitude, the bound each kernel test states.
double tt_max_rel_err(const float *got, const double *want, size_t n);
// sum (got-want)^2 / sum want^2.
double tt_nmse(const float *got, const double *want, size_t n);

// A CPU backend with one thread (tests run side by side under ctest).
tpr_backend *tt_cpu(void);

// A new f32 tensor on `be` filled with N(0,1) values; also copied to *host if
// host != NULL (caller frees with free()).
tpr_tensor *tt_random_f32(tpr_backend *be, int ndim, const int64_t *shape, float **host);

// Fails the test with the library's last error message if rc != TPR_OK.
#define TT_OK(call)                                                              \
  do {                                                                           \
    tpr_status tt__rc = (call);                                                  \
    if (tt__rc != TPR_OK)                                                        \
      fail_msg("%s returned %s: %s", #call, tpr_status_name(tt__rc), tpr_last_error()); \
  } while (0)

#endif
