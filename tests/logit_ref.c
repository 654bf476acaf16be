#include "logit_ref.h"

#include <math.h>
#include <stdlib.h>

const int logit_ref_order[4] = {REF_BIAS, REF_MIN_NEW, REF_REPETITION, REF_FREQUENCY_PRESENCE};

static int64_t count_in(const int32_t *t, int64_t n, int64_t v) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; i++) c += t[i] == v;
  return c;
}

static float step(int which, float x, int64_t v, const tpr_gen_params *g, const int32_t *tokens, int64_t prompt_len,
                  int64_t len) {
  const int64_t generated = len - prompt_len;
  switch (which) {
    case REF_BIAS:
      for (int64_t i = 0; i < g->n_logit_bias; i++)
        if (g->logit_bias[i].id == v) x = (float)((double)x + g->logit_bias[i].bias);
      return x;
    case REF_MIN_NEW:
      return g->stop_token == v && generated < g->min_new ? -INFINITY : x;
    case REF_REPETITION: {
      const double r = g->repetition_penalty;
      if (r == 0 || r == 1 || count_in(tokens, len, v) == 0) return x;
      return (float)(x > 0 ? (double)x / r : (double)x * r);
    }
    default: {
      const int64_t c = count_in(tokens + prompt_len, generated, v);
      return c > 0 ? (float)((double)x - (g->frequency_penalty * (double)c + g->presence_penalty)) : x;
    }
  }
}

void logit_ref_row(const float *raw, int64_t vocab, const tpr_gen_params *g, const int32_t *tokens,
                   int64_t prompt_len, int64_t len, const int order[4], float *out) {
  for (int64_t v = 0; v < vocab; v++) {
    float x = raw[v];
    for (int s = 0; s < 4; s++) x = step(order[s], x, v, g, tokens, prompt_len, len);
    out[v] = x;
  }
}

int64_t logit_ref_argmax(const float *row, int64_t vocab) {
  int64_t best = 0;
  for (int64_t v = 1; v < vocab; v++)
    if (row[v] > row[best]) best = v;
  return best;
}

static const double *sort_by;  // qsort has no context argument
static int by_value_then_id(const void *a, const void *b) {
  int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  if (sort_by[i] != sort_by[j]) return sort_by[i] > sort_by[j] ? -1 : 1;
  return (i > j) - (i < j);
}

void logit_ref_sorted_ids(const double *x, int64_t vocab, int32_t *ids) {
  for (int64_t v = 0; v < vocab; v++) ids[v] = (int32_t)v;
  sort_by = x;
  qsort(ids, (size_t)vocab, sizeof *ids, by_value_then_id);
}
