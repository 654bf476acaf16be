// Choosing the next token from a row of logits: greedy, temperature, top-k,
// top-p. Every rank holds the same logits (all-gathered) and the same RNG
// state (seeded alike, advanced alike), so every rank picks the same token
// without another collective.
#ifndef TPR_SAMPLING_H
#define TPR_SAMPLING_H

#include <stdbool.h>
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

// The greedy choice: the largest logit, the lowest id on ties.
int64_t tpr_sample_argmax(const float *logits, int64_t vocab);

// logits (vocab) f32. scratch needs 2 * vocab entries (ids and probabilities).
// Draws one uniform number from rng when temperature > 0.
int64_t tpr_sample(const float *logits, int64_t vocab, const tpr_sampling *s, tpr_rng *rng, void *scratch);
// Speculative sampling with a draft token whose draft distribution is all
// on it (a deterministic drafter): the standard rule (accept with
// min(1, p/q), else draw from the normalised max(0, p - q)) is then: accept
// with probability p(draft), else draw from p without the draft. p is the
// distribution tpr_sample draws from. The token returned has p's
// distribution whatever the draft. Greedy: the argmax, accepted when it is
// the draft. *accepted tells which; draws one or two uniform numbers.
int64_t tpr_sample_verify(const float *logits, int64_t vocab, const tpr_sampling *s, tpr_rng *rng, void *scratch,
                          int64_t draft, bool *accepted);
#define TPR_SAMPLE_SCRATCH_BYTES(vocab) ((size_t)(vocab) * (sizeof(int64_t) + sizeof(double)))

#endif
