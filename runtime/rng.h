// A small deterministic RNG (splitmix64) for random weights and sampling:
// the same seed gives the same stream on every rank and every machine.
#ifndef TPR_RNG_H
#define TPR_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct tpr_rng {
  uint64_t state;
} tpr_rng;

static inline uint64_t tpr_rng_next(tpr_rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
static inline double tpr_rng_uniform(tpr_rng *r) { return (double)(tpr_rng_next(r) >> 11) * 0x1.0p-53; }

// n values from N(0, scale^2) (Box-Muller).
void tpr_rng_fill_normal(tpr_rng *r, float *x, size_t n, double scale);

#endif
