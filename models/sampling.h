// Choosing the next token from a row of logits: greedy, temperature, top-k,
// top-p. Every rank holds the same logits (all-gathered) and the same RNG
// state (seeded alike, advanced alike), so every rank picks the same token
// without another collective.
#ifndef TPR_SAMPLING_H
#define TPR_SAMPLING_H

#include <stdint.h>

#include "runtime/rng.h"
#include "runtime/status.h"

typedef struct tpr_sampling {
  double temperature;  // 0: greedy (argmax, lowest id on ties)
  int64_t top_k;       // 0: no limit
  double top_p;        // 1: no limit; keep the smallest most-likely set with mass >= top_p
  uint64_t seed;
} tpr_sampling;

// Checks ranges: temperature >= 0, top_k >= 0, 0 < top_p <= 1.
tpr_status tpr_sampling_check(const tpr_sampling *s);

// logits (vocab) f32. scratch needs 2 * vocab entries (ids and probabilities).
// Draws one uniform number from rng when temperature > 0.
int64_t tpr_sample(const float *logits, int64_t vocab, const tpr_sampling *s, tpr_rng *rng, void *scratch);
#define TPR_SAMPLE_SCRATCH_BYTES(vocab) ((size_t)(vocab) * (sizeof(int64_t) + sizeof(double)))

#endif
