// Internals of a training state shared by its files: state.c (the params,
// the program), state_step.c (a sequence's forward + backward, the steps
// on gradients), state_export.c (the tensors reassembled) and fsdp.c (the
// FSDP chunks).
#ifndef TPR_TRAIN_STATE_IMPL_H
#define TPR_TRAIN_STATE_IMPL_H

#include "engine/session_parts.h"
#include "train/state.h"

// A checkpoint tensor inside a param's buffer: plan kind, layer, local
// expert (-1 if none) and its element offset (rank_shape elements follow).
typedef struct piece {
  int kind;
  int64_t layer, local_expert, offset;
} piece;

typedef struct train_param {
  tpr_train_param pub;
  float *grad_own;   // the gradient accumulator this param owns; pub.grad points into the program's outputs
                     // instead after a step's first sequence, until the next run (state_step.c)
  float *full;       // the rank-layout tensor (pub.full_numel) the loader filled; NULL once FSDP freed it
  tpr_tensor *bound;  // what the program binds under FSDP: the f32 chunk (pub.data) or its bf16 copy
  tpr_tensor *master;  // FSDP: the f32 chunk (pub.data lives here); frozen params: their own copy
  char name[TPR_LOAD_NAME_MAX];  // pub.name points here
  bool trained;      // the routing bias is carried (saved) but never trained
  bool expert;       // replicated over edp (else over dp)
  int n_pieces;
  piece *pieces;
} train_param;

struct tpr_train_state {
  tpr_train_state_opts o;
  // The session trained (it outlives the state) and what is read of it.
  tpr_session *s;
  const tpr_model_config *cfg;
  const tpr_shard_plan *plan;
  const tpr_mesh *mesh;
  tpr_backend *be;
  tpr_comm_t world;
  tpr_program *program;
  tpr_exec *exec;
  tpr_tensor *tokens, *targets, *positions, *start;  // (T) (T) (T) (1) i32
  tpr_tensor *loss_scale;                            // (1) f32: the backward's seed
  tpr_tensor *pos3;  // (3, T) i32 "positions_3d", MRoPE families only
  tpr_tensor *attn_lo;  // (T) i32 "attn_lo", packed sequences only: each token's document start
  int32_t *pack_host;   // packed sequences: (T) lo, (T) targets, (3T) positions staging
  const uint8_t *doc_starts;  // (T + 1) borrowed, tpr_train_set_doc_starts; NULL: the EOS rule
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

// Packed sequences (o.pack): the positions, document starts and masked
// targets of a sequence's inputs, into the program's inputs (state.c).
tpr_status tpr__train_bind_pack(tpr_train_state *t, const int32_t *inputs, const int32_t *targets,
                                const int32_t **targets_out);

// Folds param i's gradient laid out in `g` (its whole rank-layout tensor):
// copies of replicated heads summed, padding zeroed (state_step.c).
tpr_status tpr__train_fold_param(tpr_train_state *t, int i, float *g);

// FSDP (fsdp.c). Cuts every trained param into its chunk, releases the
// session's full tensors and binds the chunks to the program.
tpr_status tpr__train_fsdp_shard(tpr_train_state *t);
// Collective over the param's group: the whole rank-layout tensor of the
// weights (or gradients) into `full` (pub.shards * pub.numel elements).
tpr_status tpr__train_fsdp_unshard(const tpr_train_state *t, const train_param *p, bool grads, float *full);
// Copies the f32 masters into the bf16 chunks the program gathers.
void tpr__train_fsdp_refresh(tpr_train_state *t);
// Folds copied heads (over tp, on the gathered tensor) and fills
// t->heads_sumsq; the mean over dp happened in the program.
tpr_status tpr__train_fsdp_reduce(tpr_train_state *t);
// This rank's chunks' share of the global sum of squares (heads included).
double tpr__train_fsdp_sumsq(const tpr_train_state *t);

#endif
