#include "sampling.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

tpr_status tpr_sampling_check(const tpr_sampling *s) {
  if (!(s->temperature >= 0) || !isfinite(s->temperature))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--temperature %g: must be >= 0 (0 = greedy)", s->temperature);
  if (s->top_k < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "--top-k %lld: must be >= 0 (0 = off)", (long long)s->top_k);
  if (!(s->top_p > 0 && s->top_p <= 1))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--top-p %g: must be in (0, 1] (1 = off)", s->top_p);
  return TPR_OK;
}

int64_t tpr_sample_argmax(const float *x, int64_t n) {
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

// The distribution tpr_sample draws from: ids[0..*keep) in descending
// logit order with weights p (unnormalised; they sum to *total).
static void kept_distribution(const float *logits, int64_t vocab, const tpr_sampling *s, void *scratch,
                              int64_t **ids_out, double **p_out, int64_t *keep_out, double *total_out) {
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
  *ids_out = ids, *p_out = p, *keep_out = keep, *total_out = total;
}

// A draw from the kept distribution, without `skip` (-1: none) whose
// weight is skip_w.
static int64_t draw(const int64_t *ids, const double *p, int64_t keep, double total, int64_t skip, double skip_w,
                    tpr_rng *rng) {
  double u = tpr_rng_uniform(rng) * (total - skip_w), acc = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < keep; i++) {
    if (ids[i] == skip) continue;
    acc += p[i];
    last = ids[i];
    if (u < acc) return ids[i];
  }
  return last;
}

int64_t tpr_sample(const float *logits, int64_t vocab, const tpr_sampling *s, tpr_rng *rng, void *scratch) {
  if (s->temperature == 0 || s->top_k == 1) return tpr_sample_argmax(logits, vocab);
  int64_t *ids, keep;
  double *p, total;
  kept_distribution(logits, vocab, s, scratch, &ids, &p, &keep, &total);
  return draw(ids, p, keep, total, -1, 0, rng);
}

int64_t tpr_sample_verify(const float *logits, int64_t vocab, const tpr_sampling *s, tpr_rng *rng, void *scratch,
                          int64_t draft, bool *accepted) {
  if (s->temperature == 0 || s->top_k == 1) {
    int64_t t = tpr_sample_argmax(logits, vocab);
    *accepted = t == draft;
    return t;
  }
  int64_t *ids, keep;
  double *p, total, pd = 0;
  kept_distribution(logits, vocab, s, scratch, &ids, &p, &keep, &total);
  for (int64_t i = 0; i < keep; i++)
    if (ids[i] == draft) pd = p[i];
  // The draft distribution q is all on the draft: accept with
  // min(1, p(d) / q(d)) = p(d); else draw from max(0, p - q) normalised,
  // which is p without d.
  *accepted = tpr_rng_uniform(rng) * total < pd;
  if (*accepted) return draft;
  return draw(ids, p, keep, total, draft, pd, rng);
}
