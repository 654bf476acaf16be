// Deterministic training batches from a token stream (train/tokens.h: one
// file or several shards concatenated in order; windows may straddle the
// boundary of two shards, exactly as they would in the concatenated file).
//
// Window w is tokens [w*T, w*T + T + 1): inputs its first T, targets its
// last T (the next-token shift); consecutive windows share one token, so
// windows = (n - 1) / T and every token but the tail is used. The rows of
// a run are numbered globally:
//   i = ((step * accum + micro) * dp + dp_rank) * micro_batch + row
// so one optimizer step consumes accum * dp * micro_batch distinct
// consecutive indices, and the data a rank sees depends only on (step,
// micro, dp_rank, row), never on how many ranks share tp or ep, or on
// restarts: resuming at step s reads exactly what an unbroken run would.
// Index i maps to a window by
//   sequential: w = i mod windows;
//   random:     epoch e = i / windows, w = perm_e[i mod windows], perm_e a
//               Fisher-Yates shuffle driven by tpr_rng seeded from (seed, e).
// With the loss mask on (--sft), the target at window position t, which
// predicts stream token w*T + t + 1, is -100 (ignored) unless that token's
// mask value is 1.
#ifndef TPR_TRAIN_DATA_H
#define TPR_TRAIN_DATA_H

#include <stdint.h>

#include "runtime/status.h"
#include "train/tokens.h"

typedef enum tpr_data_order { TPR_DATA_SEQUENTIAL, TPR_DATA_RANDOM } tpr_data_order;

// "sequential" / "random"; anything else is TPR_ERR_INVALID_ARG.
tpr_status tpr_data_order_parse(const char *s, tpr_data_order *order);

typedef struct tpr_data_config {
  int64_t seq_len;  // T
  int micro_batch;  // rows per micro-step per dp replica
  int accum;        // micro-steps per optimizer step
  int dp;           // data-parallel replicas
  tpr_data_order order;
  uint64_t seed;    // random order only
  bool masked;      // apply the stream's loss mask to the targets (it must have masks)
} tpr_data_config;

typedef struct tpr_data tpr_data;

// Wraps an open token stream (borrowed: it must outlive the tpr_data). When
// vocab > 0 every id is checked to lie in [0, vocab) first. A stream with
// fewer than T + 1 tokens is TPR_ERR_INVALID_ARG.
tpr_status tpr_data_create(const tpr_tokens *tokens, const tpr_data_config *cfg, int64_t vocab, tpr_data **out);
void tpr_data_free(tpr_data *d);

int64_t tpr_data_windows(const tpr_data *d);

// The window index of global row i (see above); i >= 0.
int64_t tpr_data_window_of(const tpr_data *d, int64_t i);

// Fills inputs (T,) and targets (T,) (masked: -100 where not learned) for row b of micro-step m of dp replica
// dpr at 0-based optimizer step `step`. Arguments outside their ranges are
// TPR_ERR_INVALID_ARG. Not thread-safe: the random order caches the current
// epochs' permutations inside d.
tpr_status tpr_data_window(const tpr_data *d, int64_t step, int m, int dpr, int b, int32_t *inputs,
                           int32_t *targets);

// The document starts of the same window: starts[i] (T + 1 entries) = 1
// where a document begins at the window's position i (position T: the token
// its last target predicts). The stream must have document offsets
// (tpr_tokens_has_docs).
tpr_status tpr_data_window_starts(const tpr_data *d, int64_t step, int m, int dpr, int b, uint8_t *starts);

#endif
