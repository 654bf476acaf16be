// Internals of the MiniMax-M2 session shared by its inference
// (engine/session.c) and training (minimax_m2_train.c) files.
#ifndef TPR_ENGINE_SESSION_IMPL_H
#define TPR_ENGINE_SESSION_IMPL_H

#include "engine/session.h"
#include "shard/loader.h"
#include "shard/mesh_comms.h"

#define MAX_PROGRAMS 16  // step shapes kept built (decode's first, never evicted)

enum { STEP_TOKENS, STEP_POSITIONS, STEP_SLOTS, STEP_SEQ, STEP_BLOCKS, STEP_SAMPLES, STEP_INPUTS };

typedef struct step_program {
  int64_t T, N;
  tpr_program *program;
  tpr_exec *exec;
  tpr_tensor *in[STEP_INPUTS];  // i32: tokens, positions, slot_mapping, seq (T), block_tables (B, MB), sample_rows (N)
  tpr_tensor *pos3;             // (3, T) i32 "positions_3d", MRoPE families only
} step_program;

struct tpr_session {
  tpr_session_opts o;
  tpr_backend *be;
  tpr_comm_t world;
  tpr_model_config cfg;
  tpr_shard_plan plan;
  tpr_loader *loader;
  tpr_rank_weights weights;
  tpr_dtype *kind_dtype;               // (plan.n_tensors) the dtype each plan kind is held in (weight_dtype.h)
  int *kind_block;                     // (plan.n_tensors) FP8 kinds: their scale block; 0 otherwise
  tpr_tensor **item_tensors;           // (weights.n) wrapped slices; NULL for expert items
  tpr_tensor **item_scales;            // (weights.n) FP8 items' scales (R, ceil(C / block)); NULL otherwise
  tpr_tensor **experts;                // (4 * layers) stacked w13, w2 per layer, then FP8 scales s13, s2 per layer
  const tpr_family *family;
  tpr_session_pool pool;
  tpr_tensor **pools;                  // (2 * layers) k, v per layer: (NB, bs, kv_per_rank, D)
  int32_t *host_in;                    // staging of a step's inputs: 4*T + B*MB + N (+ 3*T MRoPE) entries
  int64_t host_in_cap;
  tpr_mesh mesh;
  tpr_mesh_comms comms;
  tpr_exec_collectives hook;
  tpr_tensor *rank;
  step_program programs[MAX_PROGRAMS];
  int n_programs;
  float *logits_t;                     // (V', N) staging of the gathered logits
  int64_t logits_cap;
  tpr_moe_stats moe_stats;             // this replica's counts (when opts.moe_stats)
  float *gates_host;                   // (2, T, E) staging of one layer's gates
  tpr_session_info stats;
  struct tpr_m2_train *train;          // training state (minimax_m2_train.c), NULL for inference
};

// Binds weights, stacked experts, caches (inference) and the rank tensor.
tpr_status tpr__session_bind_params(tpr_session *s, tpr_exec *e);
// Builds (or receives from rank 0) a program and checks its hash on every rank.
typedef tpr_status (*tpr__build_fn)(const tpr_shard_plan *plan, const void *opts, tpr_program **out);
tpr_status tpr__session_make_program(tpr_session *s, tpr__build_fn build, const void *opts, tpr_program **out);
void tpr__m2_train_free(struct tpr_m2_train *t);

#endif
