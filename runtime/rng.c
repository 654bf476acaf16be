#include "rng.h"

#include <math.h>

void tpr_rng_fill_normal(tpr_rng *r, float *x, size_t n, double scale) {
  for (size_t i = 0; i < n; i += 2) {
    double u1 = tpr_rng_uniform(r), u2 = tpr_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1 > 1e-300 ? u1 : 1e-300)) * scale;
    x[i] = (float)(rad * cos(6.283185307179586 * u2));
    if (i + 1 < n) x[i + 1] = (float)(rad * sin(6.283185307179586 * u2));
  }
}
