#include "engine/logit_proc.h"

#include <math.h>
#include <string.h>

bool tpr_logit_proc_active(const tpr_logit_proc *p) {
  return p->allow || p->n_bias > 0 || p->masked_stop >= 0 || (tpr_repetition_on(p->repetition_penalty) && p->n_seen > 0) ||
         ((p->frequency_penalty != 0 || p->presence_penalty != 0) && p->n_gen > 0);
}

void tpr_logit_proc_apply(const tpr_logit_proc *p, float *logits, int64_t vocab) {
  for (int64_t id = 0; p->allow && id < vocab; id++)
    if (!(p->allow[id / 64] >> (id % 64) & 1)) logits[id] = -INFINITY;
  for (int64_t i = 0; i < p->n_bias; i++) {
    float *x = &logits[p->bias[i].id];
    *x = (float)((double)*x + (double)p->bias[i].bias);
  }
  if (p->masked_stop >= 0) logits[p->masked_stop] = -INFINITY;
  const double r = p->repetition_penalty;
  if (tpr_repetition_on(r))
    for (int64_t i = 0; i < p->n_seen; i++) {
      float *x = &logits[p->seen[i]];
      *x = (float)(*x > 0 ? (double)*x / r : (double)*x * r);
    }
  if (p->frequency_penalty != 0 || p->presence_penalty != 0)
    for (int64_t i = 0; i < p->n_gen; i++) {
      float *x = &logits[p->gen_ids[i]];
      *x = (float)((double)*x - (p->frequency_penalty * p->gen_counts[i] + p->presence_penalty));
    }
}

int64_t tpr_logit_tally(const int32_t *tokens, int64_t n, int32_t *tally, int32_t *ids, int32_t *counts) {
  int64_t distinct = 0;
  for (int64_t i = 0; i < n; i++)
    if (tally[tokens[i]]++ == 0) ids[distinct++] = tokens[i];
  for (int64_t i = 0; i < distinct; i++) {
    if (counts) counts[i] = tally[ids[i]];
    tally[ids[i]] = 0;
  }
  return distinct;
}

// x ranks before (y, its logit) in the top list: higher logit, then lower id.
static bool ranks_before(int64_t x, float lx, int64_t y, float ly) { return lx > ly || (lx == ly && x < y); }

void tpr_logprobs_of(const float *logits, int64_t vocab, int32_t token, int32_t n_top, tpr_token_logprob *out) {
  double top = logits[0];
  for (int64_t v = 1; v < vocab; v++)
    if (logits[v] > top) top = logits[v];
  double sum = 0;
  for (int64_t v = 0; v < vocab; v++) sum += exp((double)logits[v] - top);
  const double lse = top + log(sum);
  memset(out, 0, sizeof *out);
  out->token = token;
  out->logprob = (float)((double)logits[token] - lse);
  out->n_top = n_top < vocab ? n_top : (int32_t)vocab;
  // Insertion into a sorted list of n_top: a scan in id order, so a tie
  // with a listed id never displaces it (the lower id came first).
  int32_t n = 0;
  for (int64_t v = 0; v < vocab && out->n_top > 0; v++) {
    if (n == out->n_top && !ranks_before(v, logits[v], out->top_ids[n - 1], logits[out->top_ids[n - 1]])) continue;
    int32_t at = n < out->n_top ? n++ : n - 1;
    while (at > 0 && ranks_before(v, logits[v], out->top_ids[at - 1], logits[out->top_ids[at - 1]])) {
      out->top_ids[at] = out->top_ids[at - 1];
      at--;
    }
    out->top_ids[at] = (int32_t)v;
  }
  for (int32_t i = 0; i < out->n_top; i++) out->top_logprobs[i] = (float)((double)logits[out->top_ids[i]] - lse);
}
