// Internals of the MiniMax-M2 session shared by its inference
// (engine/session.c) and training (minimax_m2_train.c) files.
#ifndef TPR_ENGINE_SESSION_IMPL_H
#define TPR_ENGINE_SESSION_IMPL_H

#include "engine/session.h"
#include "shard/loader.h"
#include "shard/mesh_comms.h"

#define MAX_PROGRAMS 16  // distinct token counts kept built (prompt lengths + decode)

typedef struct step_program {
  int64_t T;
  tpr_program *program;
  tpr_exec *exec;
  tpr_tensor *tokens, *positions, *start;  // (T) (T) (1) i32 inputs
} step_program;

struct tpr_session {
  tpr_session_opts o;
  tpr_backend *be;
  tpr_comm_t world;
  tpr_model_config cfg;
  tpr_shard_plan plan;
  tpr_loader *loader;
  tpr_rank_weights weights;
  tpr_tensor **item_tensors;           // (weights.n) wrapped slices; NULL for expert items
  tpr_tensor **experts;                // (2 * layers) stacked w13, w2 per layer
  tpr_tensor **caches;                 // (2 * layers) k, v per layer: (S, kv_per_rank, D)
  tpr_mesh mesh;
  tpr_mesh_comms comms;
  tpr_exec_collectives hook;
  tpr_tensor *rank;
  step_program programs[MAX_PROGRAMS];
  int n_programs;
  float *logits_t;                     // (V', T) staging of the gathered logits
  int64_t logits_cap;
  tpr_moe_stats moe_stats;             // this replica's counts (when opts.moe_stats)
  float *gates_host;                   // (2, T, E) staging of one layer's gates
  tpr_session_info stats;
  struct tpr_m2_train *train;          // training state (minimax_m2_train.c), NULL for inference
};

// Binds weights, stacked experts, caches (inference) and the rank tensor.
tpr_status tpr__session_bind_params(tpr_session *s, tpr_exec *e);
// Builds (or receives from rank 0) a program and checks its hash on every rank.
tpr_status tpr__session_make_program(tpr_session *s, const tpr_m2_build_opts *bo, tpr_program **out);
void tpr__m2_train_free(struct tpr_m2_train *t);

#endif
