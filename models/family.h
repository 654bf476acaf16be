// A model family as the engine sees it: how to build one inference step
// program for a loaded plan. This is the families' interface: it lives with
// them, and the engine above uses it. The session (engine/session.h) loads
// the weights, stacks the experts, holds the paged KV pool and runs the
// programs for every family; a new family adds an entry (models/family.c),
// not a session.
//
// The step program's interface, fixed by the engine for every family:
//   inputs  "tokens" (T) i32, "positions" (T) i32, "slot_mapping" (T) i32
//           (pool row of the token's KV; -1 for a padded token), "seq" (T)
//           i32 (block-table row; -1 padded), "block_tables" (B, MB) i32,
//           "sample_rows" (N) i32 (the token rows whose logits come out);
//           MRoPE families (config.mrope_layout != 0) also "positions_3d"
//           (3, T) i32, the rope's (temporal, height, width) positions --
//           "positions" stays the sequence index the KV cache and the causal
//           mask use; families with a recurrent state (state_shape below)
//           also "state_slot" (T) i32, each row's state slot (-1 padded)
//   params  the loader's items by checkpoint name, per layer L the stacked
//           experts tpr_family_expert_name(L, "w13"|"w2") (E_r, 2F_r, H) /
//           (E_r, H, F_r), the KV pools tpr_family_pool_name(L, "k"|"v")
//           (NB, bs, kv_per_rank, D), the state pools
//           tpr_family_state_name(L) (NS, state shape) of recurrent layers,
//           and the rank tensor "rank"
//   outputs "logits_t" (vocab_padded, N) f32, the same on every rank of a tp
//           group; with moe_stats per layer "moe_gates.L" (T, E) and, in
//           capacity mode, "moe_router.L" (T, E)
// Padded rows come last; they run through the model like any token but
// attend nothing and are never sampled.
#ifndef TPR_MODELS_FAMILY_H
#define TPR_MODELS_FAMILY_H

#include <stdbool.h>
#include <stddef.h>

#include "models/layers/moe.h"
#include "runtime/program/tpr_runtime.h"
#include "shard/shard_plan.h"

// The static shape of a step program.
typedef struct tpr_step_shape {
  int64_t tokens;       // T: token rows (real ones first, then padding)
  int64_t samples;      // N: rows whose logits come out
  int64_t batch;        // B: block-table rows (sequences in a step)
  int64_t max_blocks;   // MB: blocks a sequence may hold
  int64_t pool_blocks;  // NB: blocks in the pool
  int64_t block_size;   // bs: token rows per block
  int64_t state_slots;  // NS: recurrent state slots (families with tpr_family.state_shape; else 0)
  // The decoder layers run: the first `layers` (0: all), then the final norm
  // and lm head. Fewer: a self-speculative draft (engine/speculative.h),
  // writing the KV rows of those layers only.
  int64_t layers;
} tpr_step_shape;

// The layers a step of shape s runs, of a model's `all`.
static inline int64_t tpr_step_layers(const tpr_step_shape *s, int64_t all) {
  return s->layers > 0 && s->layers < all ? s->layers : all;
}

typedef struct tpr_step_build_opts {
  tpr_step_shape shape;
  tpr_moe_opts moe;       // dispatcher, capacity mode
  bool moe_stats;         // add the routing outputs
  bool per_rank_qk_norm;  // negative control of the parity tests (families that have a QK-norm)
  int mrope_layout_control;  // negative control (MRoPE families): > 0 forces this tpr_mrope_layout
  int family_control;        // a family's own negative control (minicpm_sala: tpr_sala_control); 0 none
  bool dense_sparse_layers;  // minicpm_sala: the sparse layers run dense (tpr_session_opts)
  // (plan->n_tensors) the dtype each plan kind's param is declared with
  // (engine/weight_dtype.h); NULL: all f32. A bf16 embedding table's rows are
  // widened to f32 as they are read.
  const tpr_dtype *kind_dtype;
  // (plan->n_tensors) FP8 kinds: the scale block; their params come with a
  // "<name>.scale" (R, ceil(C / block)) f32 param (experts: "...w13.scale",
  // "...w2.scale"). NULL: none.
  const int *kind_block;
} tpr_step_build_opts;

// Tensors a family's step programs read besides the weights, pools and
// experts (families.md): made once by the session (tpr_family.constants)
// and bound to every step program by name. minimax: each lightning layer's
// slopes and the zero initial state.
// The names of family constants start with this: never trained (train_loss.c).
#define TPR_FAMILY_CONST_PREFIX "const:"

typedef struct tpr_family_consts {
  int n;
  char (*names)[96];
  tpr_tensor **t;
} tpr_family_consts;
void tpr_family_consts_free(tpr_family_consts *c);
// Adds a constant named `name` of this dtype and shape, from data (NULL:
// zeros), to k (room for it is the caller's).
tpr_status tpr_family_consts_add(tpr_family_consts *k, tpr_backend *be, const char *name, tpr_dtype dt, int ndim,
                                 const int64_t *shape, const void *data);
// A lightning attention layer's state on this rank (tpr_family.state_shape
// of the lightning families): its heads' (nh / tp, D, D); 0 for any other layer.
int tpr_family_lightning_state_shape(const tpr_shard_plan *plan, int64_t layer, int64_t shape[TPR_MAX_DIMS]);

typedef struct tpr_family {
  const char *name;
  tpr_model_family family;
  tpr_status (*build_step)(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out);
  // Substrings naming the plan tensors of an expert's gate, up and down
  // projections, stacked by the session into w13 = [gate; up] and w2.
  const char *expert_gate, *expert_up, *expert_down;
  // NULL: none. Else the step programs' constants on backend be for this plan.
  tpr_status (*constants)(const tpr_shard_plan *plan, tpr_backend *be, tpr_family_consts *out);
  // NULL for a family whose whole per-sequence state is the paged KV cache.
  // Else the recurrent state of layer L (minimax: a lightning layer's
  // (heads/tp, D, D)) that one sequence carries on this rank: its ndim and
  // shape, 0 for a layer with none (a softmax layer). The session keeps a
  // pool of slots per such layer, tpr_family_state_name(L) (NS, shape...) f32,
  // and the step programs take one more input, "state_slot" (T) i32: each
  // row's slot (-1 padded), one slot per sequence shared by every recurrent
  // layer (vLLM's hybrid allocator: a KV block table for the softmax layers
  // beside one state slot for the others). A layer's op reads the slot's
  // state at a sequence's chunk, or zeros at position 0, and writes the
  // state after the chunk back in place. Mamba's or Gated DeltaNet's layers
  // plug in by giving their state's shape here (several tensors per layer:
  // concatenated into one shape).
  int (*state_shape)(const tpr_shard_plan *plan, int64_t layer, int64_t shape[TPR_MAX_DIMS]);
} tpr_family;

// The entry of a config's family; TPR_ERR_UNSUPPORTED naming it when none.
tpr_status tpr_family_find(tpr_model_family family, const tpr_family **out);

// Param names the engine binds (see above).
void tpr_family_expert_name(int64_t layer, const char *which, char *buf, size_t cap);  // which: "w13", "w2"
void tpr_family_pool_name(int64_t layer, const char *which, char *buf, size_t cap);    // which: "k", "v", "ck"
void tpr_family_state_name(int64_t layer, char *buf, size_t cap);  // layer L's state slots
// A plan tensor name with {L} replaced by the layer.
void tpr_family_param_name(const char *pattern, int64_t layer, char *buf, size_t cap);

#endif
