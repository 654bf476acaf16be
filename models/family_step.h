// Pieces of an inference step program (models/family.h's interface) that
// every family builds the same way: the step inputs, params in the dtype the
// session holds them, linear layers over f32/bf16/FP8 weights, the
// vocab-parallel embedding, paged attention with its row-parallel o_proj,
// the MoE block on stacked experts, and the sampled-rows lm head. A family
// file (models/qwen3_moe.c, ...) adds only what differs: its norms, its
// router, its layer order.
#ifndef TPR_FAMILY_STEP_H
#define TPR_FAMILY_STEP_H

#include "models/family.h"
#include "runtime/program/tpr_runtime.h"
#include "shard/fsdp.h"
#include "shard/shard_plan.h"

typedef struct tpr_fstep {
  tpr_program *p;
  const tpr_shard_plan *plan;
  const tpr_step_build_opts *o;
  const tpr_family *family;  // names in messages, the expert kinds
  tpr_value_id rank;         // the rank tensor param
  tpr_value_id rank_tp;      // (1) i32 this rank's tp coordinate
  tpr_value_id tokens;       // (T) i32
  tpr_value_id positions;    // (T) i32
  tpr_value_id positions_3d; // (3, T) i32 the rope's positions, MRoPE families only
  tpr_value_id slots;        // (T) i32 pool row of each token (-1 padded)
  tpr_value_id seq;          // (T) i32 block-table row (-1 padded)
  tpr_value_id blocks;       // (B, MB) i32 block tables
  int64_t T;
  // Training programs: every param f32 (the trainer's masters); with
  // fsdp->on the trained ones are declared as chunks and gathered
  // (tpr_fstep_gather_param) in prefetch group `group`, which the builder
  // moves on per layer part. Inference: training false, fsdp NULL.
  bool training;
  const tpr_fsdp_opts *fsdp;
  int group;
} tpr_fstep;

// A weight matrix as the program reads it: the param and, FP8, its scales.
typedef struct tpr_fweight {
  tpr_value_id w, scale;
  int block;  // 0: f32 or bf16
} tpr_fweight;

// Checks the step shape and declares the rank tensor and the step inputs.
tpr_status tpr_fstep_begin(tpr_fstep *c);
// What every program of a family starts with (begin's first part, and the
// training programs' whole start): the MoE options checked, the rank
// tensor and its tp index, inputs "tokens" and "positions" (T), and
// "positions_3d" (3, T) for an MRoPE config.
tpr_status tpr_fstep_begin_tokens(tpr_fstep *c, int64_t T);

// FSDP (shard/fsdp.h): declares param `name` as this rank's flat f32|bf16
// chunk over dp (experts: edp) and gathers it, in prefetch group `group`,
// into `out` (the rank's `shape`, f32). The gather's backward
// reduce-scatters the gradient with the replicas' mean as scale: 1/dp, or
// 1/edp for experts under the allreduce dispatcher (every edp copy saw every
// token). Shared by models/minimax_m2.c and the tpr_fstep params.
tpr_status tpr_fstep_gather_param(tpr_program *p, const tpr_shard_plan *plan, const tpr_moe_opts *moe,
                                  const tpr_fsdp_opts *f, int group, const char *name, int ndim,
                                  const int64_t *shape, bool expert, tpr_value_id *out);

// The plan kind named exactly `pattern`.
tpr_status tpr_fstep_kind(const tpr_fstep *c, const char *pattern, int *kind);
// The param of plan kind `pattern` for `layer` (rank shape, held dtype).
tpr_status tpr_fstep_param(tpr_fstep *c, const char *pattern, int64_t layer, tpr_value_id *out);
// The same for a matrix the program multiplies by, with its FP8 scales.
tpr_status tpr_fstep_weight(tpr_fstep *c, const char *pattern, int64_t layer, tpr_fweight *out);
// Hybrids whose layer sets share a checkpoint name with different shapes
// (minicpm_sala's q/k/v/o_proj): the kind named `pattern` in layer set
// `layers`, and the param / weight of plan kind `kind` for `layer`.
tpr_status tpr_fstep_kind_in(const tpr_fstep *c, const char *pattern, tpr_attn_layers layers, int *kind);
tpr_status tpr_fstep_param_of(tpr_fstep *c, int kind, int64_t layer, tpr_value_id *out);
tpr_status tpr_fstep_weight_of(tpr_fstep *c, int kind, int64_t layer, tpr_fweight *out);
// (Also used by models/minimax_m2.c, whose params differ in training.)
// name's FP8 scales "<name>.scale": shape with its last dim in blocks.
tpr_status tpr_fstep_scales(tpr_program *p, const char *name, int ndim, const int64_t *shape, int block,
                            tpr_value_id *out);
// x (T, K) @ W^T -> (T, N), W (N, K) in whatever dtype it is held.
tpr_status tpr_fstep_linear(tpr_program *p, tpr_value_id x, const tpr_fweight *w, tpr_value_id *out);

// tokens -> x (T, H) f32 replicated over tp (vocab-parallel rows, all-reduced).
// embed: the table param (the lm head when tied).
tpr_status tpr_fstep_embed(tpr_fstep *c, tpr_value_id *embed, tpr_value_id *x);

// q (T, qr, D) roped, k (T, kr, D) roped, v (T, kr, D): writes k, v into
// layer L's pools, attends (scale D^-0.5), projects by the row-parallel o_proj
// `wo` and all-reduces over tp. out (T, H): x + attention.
tpr_status tpr_fstep_attend(tpr_fstep *c, int64_t L, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                            const tpr_fweight *wo, tpr_value_id x, tpr_value_id *out);
// The same without the residual: o (T, H), the all-reduced attention output.
tpr_status tpr_fstep_attend_out(tpr_fstep *c, int64_t L, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                const tpr_fweight *wo, tpr_value_id *o);

// Layer L's routed experts on h (T, H) with the router's dense gates (T, E)
// (models/layers/moe.h), plus the moe_stats outputs. y (T, H) replicated.
tpr_status tpr_fstep_moe(tpr_fstep *c, int64_t L, tpr_value_id h, tpr_value_id gates, tpr_value_id *y);

// x (T, H) final-normed, head (V'/tp, H): the "sample_rows" input and the
// "logits_t" (V', N) output.
tpr_status tpr_fstep_logits(tpr_fstep *c, tpr_value_id x, tpr_value_id head);

// The decoder's end on x (T, H): model.norm, then the lm head (tied: the
// embedding `embed`): the logits of tpr_fstep_logits, or with lo the
// training loss of models/train_loss.h over the MoE layers' router logits.
struct tpr_train_loss_opts;
tpr_status tpr_fstep_finish(tpr_fstep *c, tpr_value_id x, tpr_value_id embed, const struct tpr_train_loss_opts *lo,
                            const tpr_value_id *router_logits, int n_router);

// q or k (T, heads, D) rotated over the config's rotary dims: NeoX RoPE at
// "positions", or MRoPE at "positions_3d" in the config's layout.
tpr_status tpr_fstep_rope(tpr_fstep *c, tpr_value_id x, tpr_value_id *out);

#endif
