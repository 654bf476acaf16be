#include "train/eval_windows.h"

#include <stdlib.h>
#include <string.h>

tpr_status tpr_eval_window_count(const tpr_tokens *data, int64_t T, int64_t max_windows, int64_t *nw) {
  const char *path = tpr_tokens_spec(data);
  *nw = T >= 1 ? (tpr_tokens_len(data) - 1) / T : 0;
  if (max_windows > 0 && max_windows < *nw) *nw = max_windows;
  if (*nw < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "eval: %s holds %lld tokens, fewer than one window of %lld + 1", path,
                    (long long)tpr_tokens_len(data), (long long)T);
  return TPR_OK;
}

tpr_status tpr_eval_windows(tpr_comm_t world, int tp, int dp, int replica, const tpr_tokens *data, int64_t T,
                            int64_t nw, tpr_window_score_fn fn, void *ctx, tpr_eval_result *out) {
  *out = (tpr_eval_result){0};
  int32_t *ids = malloc((size_t)(T + 1) * sizeof *ids);  // (T + 1)
  tpr_status rc = ids ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "eval: a window of %lld ids", (long long)T);
  double sums[3] = {0, 0, 0};  // cross-entropy sum, windows counted, positions scored (this replica)
  for (int64_t round = 0; rc == TPR_OK && round * dp < nw; round++) {
    int64_t win = round * dp + replica;
    bool mine = win < nw;
    double ce = 0;
    int64_t scored = 0;
    rc = tpr_tokens_read_i32(data, (mine ? win : 0) * T, T + 1, ids);
    if (rc == TPR_OK) rc = fn(ctx, ids, (mine ? win : 0) * T, mine, &ce, &scored);
    if (rc == TPR_OK && mine) sums[0] += ce, sums[1] += 1, sums[2] += (double)scored;
  }
  free(ids);
  rc = tpr_comm_agree(world, rc);
  // Each replica's sums once (its first tp rank's), added in rank order:
  // the doubles travel as their bits (tpr_comm has no f64 reduction).
  int size = tpr_comm_size(world);
  int64_t mine[3], *all = rc == TPR_OK ? malloc((size_t)(3 * size) * sizeof *all) : NULL;
  memcpy(mine, sums, sizeof mine);
  if (rc == TPR_OK && !all) rc = TPR_FAIL(TPR_ERR_OOM, "eval: gather of %d ranks' sums", size);
  if (rc == TPR_OK) rc = tpr_comm_all_gather(world, mine, all, 3, TPR_I64);
  sums[0] = sums[1] = sums[2] = 0;
  for (int r = 0; rc == TPR_OK && r < size; r += tp) {
    double v[3];
    memcpy(v, all + 3 * r, sizeof v);
    sums[0] += v[0], sums[1] += v[1], sums[2] += v[2];
  }
  free(all);
  *out = (tpr_eval_result){.windows = (int64_t)sums[1], .tokens = (int64_t)sums[2], .ce_sum = sums[0]};
  if (rc == TPR_OK && out->windows != nw)
    rc = TPR_FAIL(TPR_ERR_INTERNAL, "eval: %lld windows scored, expected %lld", (long long)out->windows,
                  (long long)nw);
  return rc;
}
