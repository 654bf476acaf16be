// Validation windows, shared by `tpr eval` (an inference session) and
// `tpr train --eval-data` (the training program): the mean next-token
// cross-entropy over a token stream (train/tokens.h) cut into the windows `tpr train` reads
// (window w: inputs [w*T, w*T + T), targets shifted by one), every window
// starting a fresh sequence.
//
// Each data-parallel replica takes windows r, r + dp, ...; a replica with
// none left in the last round scores window 0 again and drops it, because
// every rank must make the same program runs (MoE exchanges span the
// replicas). Sums are kept in double in window order on each replica and
// added over replicas in rank order at the end, so the result does not
// depend on the thread count.
#ifndef TPR_TRAIN_EVAL_WINDOWS_H
#define TPR_TRAIN_EVAL_WINDOWS_H

#include <stdbool.h>
#include <stdint.h>

#include "collectives/tpr_comm.h"
#include "train/tokens.h"

// Scores one window: ids (T + 1) -- inputs ids[0..T), targets ids[1..T]; the
// stream's tokens from `offset` --
// into *ce_sum, the sum over its scored positions of -log p(target), and
// *scored, how many there are (T, or fewer where the scorer ignores some:
// tpr train --pack skips EOS inputs). Called on every rank of the replica;
// keep false: the window is a filler whose score is dropped (the call must
// still run the same collectives).
typedef tpr_status (*tpr_window_score_fn)(void *ctx, const int32_t *ids, int64_t offset, bool keep,
                                          double *ce_sum, int64_t *scored);

typedef struct tpr_eval_result {
  int64_t windows, tokens;  // tokens: the scored positions
  double ce_sum;  // over every window's scored positions: loss = ce_sum / tokens
} tpr_eval_result;

// The number of whole windows of T + 1 ids in data, at most max_windows
// (0: all); TPR_ERR_INVALID_ARG naming the data when there is none. Every
// token counts: validation ignores loss masks.
tpr_status tpr_eval_window_count(const tpr_tokens *data, int64_t T, int64_t max_windows, int64_t *nw);

// Collective over world (tp ranks per replica, dp replicas, this rank's
// replica): windows 0 .. nw-1 scored by fn.
tpr_status tpr_eval_windows(tpr_comm_t world, int tp, int dp, int replica, const tpr_tokens *data, int64_t T,
                            int64_t nw, tpr_window_score_fn fn, void *ctx, tpr_eval_result *out);

#endif
