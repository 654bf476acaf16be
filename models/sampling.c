#include "sampling.h"

#include <math.h>
#include <stdlib.h>

tpr_status tpr_sampling_check(const tpr_sampling *s) {
  if (!(s->temperature >= 0) || !isfinite(s->temperature))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--temperature %g: must be >= 0 (0 = greedy)", s->temperature);
  if (s->top_k < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "--top-k %lld: must be >= 0 (0 = off)", (long long)s->top_k);
  if (!(s->top_p > 0 && s->top_p <= 1))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--top-p %g: must be in (0, 1] (1 = off)", s->top_p);
  return TPR_OK;
}

static int64_t argmax(const float *x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

static const float *sort_logits;
// Descending logit, then ascending id: a total order, so every rank sorts alike.
static int by_logit_desc(const void *a, const void *b) {
  int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
  if (sort_logits[i] != sort_logits[j]) return sort_logits[i] > sort_logits[j] ? -1 : 1;
  return (i > j) - (i < j);
}

int64_t tpr_sample(const float *logits, int64_t vocab, const tpr_sampling *s, tpr_rng *rng, void *scratch) {
  if (s->temperature == 0 || s->top_k == 1) return argmax(logits, vocab);
  int64_t *ids = scratch;
  double *p = (double *)(ids + vocab);
  for (int64_t i = 0; i < vocab; i++) ids[i] = i;
  sort_logits = logits;
  qsort(ids, (size_t)vocab, sizeof *ids, by_logit_desc);
  int64_t n = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab;
  // Softmax over the kept candidates at this temperature, in double.
  double sum = 0, top = logits[ids[0]];
  for (int64_t i = 0; i < n; i++) sum += p[i] = exp(((double)logits[ids[i]] - top) / s->temperature);
  double mass = 0;
  int64_t keep = n;
  for (int64_t i = 0; i < n; i++) {
    p[i] /= sum;
    mass += p[i];
    if (mass >= s->top_p) {
      keep = i + 1;
      break;
    }
  }
  double total = 0;
  for (int64_t i = 0; i < keep; i++) total += p[i];
  double u = tpr_rng_uniform(rng) * total, acc = 0;
  for (int64_t i = 0; i < keep; i++) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}
