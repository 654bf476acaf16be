#include "data.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/rng.h"

// Two cached epochs, so rows of one step that straddle an epoch boundary
// (and ranks reading the boundary in either order) do not reshuffle on
// every call.
typedef struct perm_cache {
  int64_t epoch[2];  // -1: empty
  int64_t *perm[2];  // (windows,)
  int next;          // slot to evict
} perm_cache;

struct tpr_data {
  const tpr_tokens *tokens;
  int32_t *mask;  // (T) scratch of the masked order
  tpr_data_config cfg;
  int64_t windows;
  perm_cache *cache;  // behind a pointer: filled through a const tpr_data *
};

tpr_status tpr_data_order_parse(const char *s, tpr_data_order *order) {
  if (!strcmp(s, "sequential")) *order = TPR_DATA_SEQUENTIAL;
  else if (!strcmp(s, "random")) *order = TPR_DATA_RANDOM;
  else return TPR_FAIL(TPR_ERR_INVALID_ARG, "data order '%s': want 'sequential' or 'random'", s);
  return TPR_OK;
}

tpr_status tpr_data_create(const tpr_tokens *tokens, const tpr_data_config *cfg, int64_t vocab, tpr_data **out) {
  *out = NULL;
  const char *path = tpr_tokens_spec(tokens);
  if (cfg->seq_len < 1 || cfg->micro_batch < 1 || cfg->accum < 1 || cfg->dp < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: seq_len %lld, micro_batch %d, accum %d, dp %d must all be >= 1", path,
                    (long long)cfg->seq_len, cfg->micro_batch, cfg->accum, cfg->dp);
  if (cfg->order != TPR_DATA_SEQUENTIAL && cfg->order != TPR_DATA_RANDOM)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: unknown data order %d", path, (int)cfg->order);
  if (cfg->masked && !tpr_tokens_has_masks(tokens))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "data %s: the loss mask is asked for, but it was opened without masks", path);
  int64_t n = tpr_tokens_len(tokens);
  if (n < 1 || (n - 1) / cfg->seq_len < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "data %s has %lld tokens, shorter than one sequence of T+1 = %lld",
                    path, (long long)n, (long long)cfg->seq_len + 1);
  if (vocab > 0) TPR_CHECK(tpr_tokens_check_range(tokens, vocab));
  tpr_data *d = calloc(1, sizeof *d);
  perm_cache *c = calloc(1, sizeof *c);
  int32_t *mask = cfg->masked ? malloc((size_t)cfg->seq_len * sizeof *mask) : NULL;
  if (!d || !c || (cfg->masked && !mask)) {
    free(d);
    free(c);
    free(mask);
    return TPR_FAIL(TPR_ERR_OOM, "%s: out of memory", path);
  }
  c->epoch[0] = c->epoch[1] = -1;
  d->tokens = tokens;
  d->cfg = *cfg;
  d->windows = (n - 1) / cfg->seq_len;
  d->cache = c;
  d->mask = mask;
  *out = d;
  return TPR_OK;
}

void tpr_data_free(tpr_data *d) {
  if (!d) return;
  free(d->cache->perm[0]);
  free(d->cache->perm[1]);
  free(d->cache);
  free(d->mask);
  free(d);
}

int64_t tpr_data_windows(const tpr_data *d) { return d->windows; }

// perm (W,) = Fisher-Yates shuffle of 0..W-1. The stream for (seed, epoch)
// starts from one splitmix64 output of the seed xor'ed with the epoch, so
// neighbouring seeds and epochs give unrelated streams. j is drawn in
// [0, k] by Lemire's multiply-shift (bias below 2^-40 for any W that fits
// in memory), fixed so every rank and machine draws the same permutation.
static void shuffle(int64_t *perm, int64_t w, uint64_t seed, int64_t epoch) {
  tpr_rng r = {.state = seed};
  r.state = tpr_rng_next(&r) ^ (uint64_t)epoch;
  for (int64_t k = 0; k < w; k++) perm[k] = k;
  for (int64_t k = w - 1; k > 0; k--) {
    int64_t j = (int64_t)(((unsigned __int128)tpr_rng_next(&r) * (uint64_t)(k + 1)) >> 64);
    int64_t t = perm[k];
    perm[k] = perm[j];
    perm[j] = t;
  }
}

static const int64_t *epoch_perm(const tpr_data *d, int64_t epoch) {
  perm_cache *c = d->cache;
  for (int s = 0; s < 2; s++)
    if (c->epoch[s] == epoch) return c->perm[s];
  int s = c->next;
  if (!c->perm[s] && !(c->perm[s] = malloc((size_t)d->windows * sizeof(int64_t)))) return NULL;
  shuffle(c->perm[s], d->windows, d->cfg.seed, epoch);
  c->epoch[s] = epoch;
  c->next = 1 - s;
  return c->perm[s];
}

int64_t tpr_data_window_of(const tpr_data *d, int64_t i) {
  if (d->cfg.order == TPR_DATA_SEQUENTIAL) return i % d->windows;
  const int64_t *perm = epoch_perm(d, i / d->windows);
  return perm ? perm[i % d->windows] : -1;
}

// The window of row b of micro-step m of replica dpr at `step` (data.h).
static tpr_status window_index(const tpr_data *d, int64_t step, int m, int dpr, int b, int64_t *out) {
  const tpr_data_config *c = &d->cfg;
  if (m < 0 || m >= c->accum || dpr < 0 || dpr >= c->dp || b < 0 || b >= c->micro_batch)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "data: micro-step %d, dp rank %d, row %d outside accum %d, dp %d, micro_batch %d",
                    m, dpr, b, c->accum, c->dp, c->micro_batch);
  int64_t per_step = (int64_t)c->accum * c->dp * c->micro_batch;
  if (step < 0 || step > (INT64_MAX - per_step) / per_step)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "data: step %lld out of range", (long long)step);
  int64_t i = (((step * c->accum + m) * c->dp + dpr) * c->micro_batch) + b;
  *out = tpr_data_window_of(d, i);
  if (*out < 0)
    return TPR_FAIL(TPR_ERR_OOM, "data: cannot allocate the shuffle of %lld windows", (long long)d->windows);
  return TPR_OK;
}

tpr_status tpr_data_window(const tpr_data *d, int64_t step, int m, int dpr, int b, int32_t *inputs,
                           int32_t *targets) {
  const tpr_data_config *c = &d->cfg;
  int64_t w = 0, T = c->seq_len;
  TPR_CHECK(window_index(d, step, m, dpr, b, &w));
  TPR_CHECK(tpr_tokens_read_i32(d->tokens, w * T, T, inputs));
  // The targets are the inputs shifted by one plus the window's last token.
  memcpy(targets, inputs + 1, (size_t)(T - 1) * sizeof(int32_t));
  TPR_CHECK(tpr_tokens_read_i32(d->tokens, w * T + T, 1, targets + T - 1));
  if (c->masked) {  // target t predicts token w*T + t + 1: kept iff its mask is 1
    TPR_CHECK(tpr_tokens_read_mask(d->tokens, w * T + 1, T, d->mask));
    for (int64_t t = 0; t < T; t++)
      if (!d->mask[t]) targets[t] = -100;
  }
  return TPR_OK;
}

tpr_status tpr_data_window_starts(const tpr_data *d, int64_t step, int m, int dpr, int b, uint8_t *starts) {
  int64_t w = 0, T = d->cfg.seq_len;
  TPR_CHECK(window_index(d, step, m, dpr, b, &w));
  return tpr_tokens_doc_starts(d->tokens, w * T, T + 1, starts);
}
