// Internals of a MiniMax-M2 training session shared by minimax_m2_train.c
// (the program, the steps on gradients and weights) and minimax_m2_fsdp.c
// (the FSDP chunks).
#ifndef TPR_MINIMAX_M2_TRAIN_IMPL_H
#define TPR_MINIMAX_M2_TRAIN_IMPL_H

#include "engine/session_impl.h"
#include "models/minimax_m2_train.h"

// A checkpoint tensor inside a param's buffer: plan kind, layer, local
// expert (-1 if none) and its element offset (rank_shape elements follow).
typedef struct piece {
  int kind;
  int64_t layer, local_expert, offset;
} piece;

typedef struct train_param {
  tpr_m2_param pub;
  float *full;       // the rank-layout tensor (pub.full_numel) the loader filled; NULL once FSDP freed it
  tpr_tensor *bound;  // what the program binds under FSDP: the f32 chunk (pub.data) or its bf16 copy
  tpr_tensor *master;  // FSDP: the f32 chunk (pub.data lives here); frozen params: their own copy
  char name[TPR_LOAD_NAME_MAX];  // pub.name points here
  bool trained;      // the routing bias is carried (saved) but never trained
  bool expert;       // replicated over edp (else over dp)
  int n_pieces;
  piece *pieces;
} train_param;

struct tpr_m2_train {
  tpr_m2_train_opts o;
  tpr_program *program;
  tpr_exec *exec;
  tpr_tensor *tokens, *targets, *positions, *start;  // (T) (T) (T) (1) i32
  tpr_tensor *pos3;  // (3, T) i32 "positions_3d", MRoPE families only
  train_param *params;
  int n_params, n_trained;  // trained params first
  int32_t *host_i32;        // (T) staging
  float *gather;            // (max(world, tp) * largest piece) collective staging
  int64_t gather_cap;
  int64_t runs;             // sequences run (profiling)
  int64_t *load;            // (layers, E) tokens routed per expert since the last bias update
  bool fresh;               // the accumulators hold nothing yet this step (zero_grads was called)
  double heads_sumsq;       // FSDP: this step's folded heads-layout gradients' sum of squares
};


static inline int64_t tpr__kind_numel(const tpr_shard_tensor *k) {
  return k->ndim == 2 ? k->rank_shape[0] * k->rank_shape[1] : k->rank_shape[0];
}

// FSDP (minimax_m2_fsdp.c). Cuts every trained param into its chunk, frees
// the full tensors and binds the chunks to the program.
tpr_status tpr__m2_fsdp_shard(tpr_session *s, struct tpr_m2_train *t);
// Collective over the param's group: the whole rank-layout tensor of the
// weights (or gradients) into `full` (pub.shards * pub.numel elements).
tpr_status tpr__m2_fsdp_unshard(tpr_session *s, const train_param *p, bool grads, float *full);
// Copies the f32 masters into the bf16 chunks the program gathers.
void tpr__m2_fsdp_refresh(struct tpr_m2_train *t);
// Folds copied heads (over tp, on the gathered tensor) and fills
// t->heads_sumsq; the mean over dp happened in the program.
tpr_status tpr__m2_fsdp_reduce(tpr_session *s, struct tpr_m2_train *t);
// This rank's chunks' share of the global sum of squares (heads included).
double tpr__m2_fsdp_sumsq(tpr_session *s, struct tpr_m2_train *t);
// Folds param i's gradient laid out in `g` (its whole rank-layout tensor).
tpr_status tpr__m2_fold_param(tpr_session *s, struct tpr_m2_train *t, int i, float *g);

#endif
