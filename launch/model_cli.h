// Pieces shared by the model commands (run, forward, bench model): token
// lists, the --tp check, and opening a MiniMax-M2 session on every rank.
#ifndef TPR_MODEL_CLI_H
#define TPR_MODEL_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "launch/world.h"
#include "models/minimax_m2_session.h"

// "1,2,3" -> ids (malloc'ed, *n entries). Empty lists, non-numbers, negative
// ids and ids beyond int32 are TPR_ERR_INVALID_ARG naming the flag and item.
tpr_status tpr_cli_token_list(const char *flag, const char *text, int32_t **ids, int64_t *n);

// Debug flags of the model commands: the negative controls of the parity
// tests. Hidden from nobody: --help lists them as "test only".
typedef struct tpr_model_debug {
  int64_t force_tp_rank;  // -1: off
  bool per_rank_qk_norm, broadcast_program;
} tpr_model_debug;
#define TPR_MODEL_DEBUG_DEFAULT {.force_tp_rank = -1}
#define TPR_MODEL_DEBUG_ARGS(d)                                                                              \
  {"broadcast-program", TPR_ARG_FLAG, &(d).broadcast_program,                                              \
   "rank 0 builds each program and sends its bytes to the others (compile once, run everywhere)"},        \
  {"debug-force-tp-rank", TPR_ARG_INT, &(d).force_tp_rank,                                                 \
   "test only: every rank's rank tensor claims this tp rank (a negative control)"},                         \
  {"debug-per-rank-qk-norm", TPR_ARG_FLAG, &(d).per_rank_qk_norm,                                          \
   "test only: normalise q/k per rank without the all-reduce (a negative control)"}

// Opens the model on every rank: --tp (0 = world size) must equal the world.
tpr_status tpr_cli_open_model(tpr_world *w, const char *model, int64_t tp, int64_t max_seq,
                              const tpr_model_debug *d, tpr_m2_session **out);

#endif
