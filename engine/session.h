// A MiniMax-M2 model loaded on this rank and ready to run: its weight
// slices, KV caches, the mesh communicators, and one program + exec per
// token count T (built on first use: a prompt length, or 1 for decode).
// Every rank of the world must make the same calls in the same order (each
// forward runs collectives).
#ifndef TPR_ENGINE_SESSION_H
#define TPR_ENGINE_SESSION_H

#include <stdbool.h>

#include "collectives/tpr_comm.h"
#include "models/layers/moe.h"
#include "models/moe_stats.h"
#include "shard/mesh.h"
#include "shard/model_config.h"

typedef struct tpr_session_opts {
  const char *model_dir;   // HF checkpoint or converted directory
  int64_t max_seq;         // KV cache rows: the longest prompt + generation
  // The mesh (shard/mesh.h); 0 picks: dp 1, tp = world / dp, ep 1,
  // etp = world / ep. world = dp*tp = edp*ep*etp.
  int tp, dp, ep, etp;
  tpr_moe_opts moe;        // dispatcher and capacity mode
  bool moe_stats;          // count routing statistics (tpr_session_moe_stats)
  // Rank 0 builds each program and sends its bytes to the others ("compile
  // once, run on every rank"); otherwise every rank builds its own and the
  // hashes are compared.
  bool broadcast_program;
  // Opened for training (models/minimax_m2_train.h): no KV caches, no
  // inference programs; max_seq is ignored.
  bool training;
  // Negative controls for the parity tests (never in real runs):
  bool per_rank_qk_norm;   // normalise q/k per rank (no all-reduce, local divisor)
  int skip_grad_marks;     // training without some grad_all_reduce marks (tpr_m2_build_opts)
  int force_tp_rank;       // >= 0: every rank's rank tensor claims this tp rank
} tpr_session_opts;

typedef struct tpr_session tpr_session;

typedef struct tpr_session_info {
  double load_s;             // config, plan, weights, caches
  uint64_t weight_bytes;     // this rank's weights as held (f32)
  uint64_t bytes_read;       // checkpoint bytes this rank read
  uint64_t program_hash;     // of the last program built
} tpr_session_info;

// Collective over `world` (a host-buffer communicator of every rank). Errors (bad checkpoint, heads or experts that cannot be laid
// out on the mesh, ...) are returned on every rank.
tpr_status tpr_session_open(const tpr_session_opts *o, tpr_comm_t world, tpr_backend *be,
                               tpr_session **out);
void tpr_session_close(tpr_session *s);

const tpr_model_config *tpr_session_config(const tpr_session *s);
const tpr_shard_plan *tpr_session_plan(const tpr_session *s);
const tpr_mesh *tpr_session_mesh(const tpr_session *s);
const char *tpr_session_model_dir(const tpr_session *s);
const tpr_session_info *tpr_session_stats(const tpr_session *s);
int64_t tpr_session_max_seq(const tpr_session *s);

// Runs tokens (T) at positions start..start+T-1; the caches must hold the
// sequence's positions < start (start 0 begins a new sequence). logits
// (T, vocab) f32 receives every position's logits, the same on every rank of
// a tp group (dp replicas may be given different tokens; every rank must
// give the same T and start).
// Token ids outside [0, vocab) or start + T > max_seq: TPR_ERR_INVALID_ARG.
tpr_status tpr_session_forward(tpr_session *s, const int32_t *tokens, int64_t T, int64_t start,
                                  float *logits);

// Collective: the routing statistics of every forward so far, summed over
// the dp replicas, into *out (the caller frees it with tpr_moe_stats_free).
// Needs opts.moe_stats.
tpr_status tpr_session_moe_stats(tpr_session *s, tpr_moe_stats *out);

#endif
