// Internals of the session (engine/session.h), shared by its files, one
// responsibility each:
//   session.c           open and close, the accessors
//   session_weights.c   the weights as loaded: dtypes, FP8 scales, memory check
//   session_experts.c   each layer's experts stacked into w13 / w2
//   session_pool.c      the paged KV pool
//   session_programs.c  the program cache: one step program per shape
//   session_step.c      a step's inputs checked and uploaded, its logits read
//   session_moe_stats.c the routing statistics of the steps run
// and by the batched engine (engine.c, engine_step.c). Code above the engine
// uses engine/session_parts.h instead.
#ifndef TPR_ENGINE_SESSION_IMPL_H
#define TPR_ENGINE_SESSION_IMPL_H

#include "engine/session.h"
#include "engine/session_parts.h"
#include "shard/loader.h"
#include "shard/mesh_comms.h"

#define MAX_PROGRAMS 16  // step shapes kept built (decode's first, never evicted)

enum { STEP_TOKENS, STEP_POSITIONS, STEP_SLOTS, STEP_SEQ, STEP_BLOCKS, STEP_SAMPLES, STEP_INPUTS };

typedef struct step_program {
  int64_t T, N, layers;  // layers: tpr_step.layers (0: all)
  tpr_program *program;
  tpr_exec *exec;
  tpr_tensor *in[STEP_INPUTS];  // i32: tokens, positions, slot_mapping, seq (T), block_tables (B, MB), sample_rows (N)
  tpr_tensor *pos3;             // (3, T) i32 "positions_3d", MRoPE families only
  tpr_tensor *state_slot;       // (T) i32 "state_slot", families with a recurrent state only
  tpr_tensor *prefill_len;      // (T) i32 "prefill_len", where the program reads it (tpr_step.prefill_lens)
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
  tpr_tensor **pools;                  // (2 * layers) k, v per layer: (NB, bs, kv_per_rank, D); NULL for a lightning layer
  tpr_tensor **ck_pools;               // (layers) minicpm_sala's compressed keys per sparse layer (NB, R, kv_per_rank, D); else NULL
  tpr_tensor **states;                 // (layers) recurrent layers' state slots (NS, state shape); NULL otherwise
  tpr_family_consts consts;            // the family's step-program constants (family.h), bound by name
  int32_t *host_in;  // staging of a step's inputs: 4*T + B*MB + N + 3*T (MRoPE) + T (state slots) + T (prefill lengths)
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
};

// session.c. The ranks of one node share its memory: `bytes` (this rank's
// ask) times the node's ranks against MemAvailable. Collective.
tpr_status tpr__session_check_node_memory(tpr_session *s, uint64_t bytes, const char *what);

// session_weights.c. Agrees the FP8 blocks and the dtypes each plan kind is
// held in, checks the node's memory and loads this rank's slices as
// tensors, the experts stacked. Collective; errors agreed on every rank.
tpr_status tpr__session_load_weights(tpr_session *s);

// session_experts.c. Stacks layer L's local experts (and their FP8 scales).
tpr_status tpr__session_stack_experts(tpr_session *s, int64_t L);

// session_pool.c. Sizes the KV pool (collective: the smallest block count
// any rank affords) and allocates it, zero-filled.
tpr_status tpr__session_alloc_pool(tpr_session *s);

// session_programs.c. The step program of shape (T, N), built on first use
// and kept (collective when built); all of them freed.
tpr_status tpr__session_program_for(tpr_session *s, int64_t T, int64_t N, int64_t layers, step_program **out);
void tpr__session_free_programs(tpr_session *s);

// session_moe_stats.c. Adds the routing of a step's n real tokens (rows past
// them are padding) to the statistics.
tpr_status tpr__session_count_routing(tpr_session *s, step_program *m, int64_t n);

#endif
