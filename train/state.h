// The training state of a session opened with opts.training, for every
// family that trains: one program of forward + backward per sequence length
// (the family's builder in training mode: models/minimax_m2.h, or
// models/qk_head_decoder.h for the per-head QK-norm families), the gradient
// accumulators, and the collective steps that turn each rank's gradients
// into the true ones of its slices. The optimizer (train/adamw.h) updates
// the params this API lists, in place. train/ owns the state: it is opened
// on a session and freed before the session is closed.
//
// A step: tpr_train_zero_grads; tpr_train_sequence for each of the rank's
// sequences (weight = 1 / sequences per replica); then
// tpr_train_reduce_grads (replicated heads folded, mean over dp replicas);
// tpr_train_grad_sumsq for clipping. Every rank must make the same calls.
#ifndef TPR_TRAIN_STATE_H
#define TPR_TRAIN_STATE_H

#include "engine/session.h"
#include "shard/fsdp.h"

typedef struct tpr_train_state tpr_train_state;

typedef struct tpr_train_state_opts {
  int64_t seq_len;  // tokens per sequence (the program's T)
  double aux_coef;  // weight of the aux loss; < 0: the config's router_aux_loss_coef
  bool profile;     // time every node of every run (tpr_train_profile)
  tpr_fsdp_opts fsdp;  // shard params, gradients and moments over dp / edp (shard/fsdp.h)
  // MRoPE families (qwen3_vl_moe): the rope's positions (3, seq_len) rows
  // temporal, height, width, the same for every sequence; NULL: the text
  // rule (transformers' get_rope_index without images: every row 0..T-1).
  const int32_t *positions_3d;
  // Packed sequences (docs/training.md "Packed sequences", Megatron-LM's
  // reset_position_ids + reset_attention_mask + eod_mask_loss): a sequence
  // holds documents each ended by eos_id; a new one starts after every EOS.
  // Positions restart at 0 at each document start (every MRoPE row alike),
  // attention never crosses a document start, and the loss skips positions
  // whose input is EOS. eos_id in [0, vocab); positions_3d must be NULL.
  bool pack;
  int32_t eos_id;
  int pack_debug;  // negative controls only: TPR_PACK_DEBUG_* bits, a piece of packing left out
} tpr_train_state_opts;

// Tests' negative controls of packing: attention left plain causal across
// documents, or positions left 0..T-1, or (families with lightning attention
// layers) their state carried across documents with the softmax layers'
// mask kept (the rest of packing kept).
enum { TPR_PACK_DEBUG_NO_MASK = 1, TPR_PACK_DEBUG_NO_POSITIONS = 2, TPR_PACK_DEBUG_NO_STATE_RESET = 4 };

// One trained tensor of this rank, in the rank's layout (host f32).
typedef struct tpr_train_param {
  const char *name;  // the program param's name
  float *data;       // (numel) weights, updated in place by the optimizer
  float *grad;       // (numel) gradient accumulated since the last zero_grads; after a step's first sequence
                     // it may point into the program's outputs, valid until the next sequence or eval run
  int64_t numel;
  bool decay;        // the checkpoint tensor has >= 2 dims (norms get no weight decay)
  bool expert;       // sharded over edp under FSDP (else over dp)
  // Under FSDP (shard/fsdp.h) data and grad hold chunk shard_index of
  // shards: elements [offset, offset + numel) of the rank-layout tensor of
  // full_numel elements, zero past full_numel. Without: the whole tensor
  // (offset 0, shards 1).
  int64_t full_numel, offset;
  int shards, shard_index;
} tpr_train_param;

// Bytes this rank holds for training, tallied from its live allocations.
typedef struct tpr_train_memory {
  uint64_t params;       // weights: f32 (master) tensors, bf16 copies, frozen params
  uint64_t grads;        // gradient accumulators
  uint64_t arena;        // the program's arena: activations, gathered params, backward values
} tpr_train_memory;
void tpr_train_memory_info(const tpr_train_state *t, tpr_train_memory *out);

// FSDP's communication in the sequences run since the last zero_grads, on
// this rank: bytes all-gathered (param gathers, in the params' dtype) and
// reduce-scattered (f32 gradients), their seconds from start to completion,
// and the seconds the runs were blocked on them (the rest overlapped compute).
typedef struct tpr_train_comm {
  double gather_bytes, gather_s, scatter_bytes, scatter_s, exposed_s;
} tpr_train_comm;
void tpr_train_comm_info(const tpr_train_state *t, tpr_train_comm *out);

typedef struct tpr_losses {
  double loss, ce, aux;  // of one sequence (identical on every rank of a tp group)
} tpr_losses;

// Collective: builds the program and takes the session's weights as its
// params (under FSDP the session's full tensors are released). Errors are
// returned on every rank, *out NULL.
tpr_status tpr_train_state_open(tpr_session *s, const tpr_train_state_opts *o, tpr_train_state **out);
// Frees the program, the accumulators and the chunks; call it before
// closing the session. NULL is ignored.
void tpr_train_state_free(tpr_train_state *t);
tpr_session *tpr_train_state_session(const tpr_train_state *t);
// Whether tpr can train the family, and whether its training program shards
// its params under FSDP (the families tested under it; the others are
// refused with --fsdp). One table in state.c answers both.
bool tpr_train_supported(tpr_model_family f);
bool tpr_train_fsdp_built(tpr_model_family f);
// "minimax_m2, qwen3_moe, ..." for messages that list them.
const char *tpr_train_supported_list(void);
// The trained params, the same list on every rank.
int tpr_train_num_params(const tpr_train_state *t);
const tpr_train_param *tpr_train_param_at(const tpr_train_state *t, int i);
void tpr_train_zero_grads(tpr_train_state *t);
// After the optimizer changed the params: refreshes what the program reads
// (under FSDP with bf16 params, the bf16 copies of the f32 masters).
void tpr_train_params_updated(tpr_train_state *t);

// Forward + backward of one sequence: inputs and targets (seq_len) i32
// (targets -100 are ignored); grad += weight * d loss / d param.
// Token ids outside the vocabulary: TPR_ERR_INVALID_ARG naming the position.
tpr_status tpr_train_sequence(tpr_train_state *t, const int32_t *inputs, const int32_t *targets, double weight,
                              tpr_losses *out);
// The same with the backward seeded by loss_scale on this rank alone:
// grad += weight * reduce(loss_scale * d loss / d param), where reduce is
// the FSDP reduce-scatter inside the program (the identity without FSDP).
// A weight that differs between dp ranks must go here, not in weight (under
// FSDP the program has already mixed the ranks' gradients). *out unscaled.
tpr_status tpr_train_sequence_scaled(tpr_train_state *t, const int32_t *inputs, const int32_t *targets,
                                     double loss_scale, double weight, tpr_losses *out);
// The losses of one sequence with the trained params as they are, leaving
// the gradients and the expert-load counts alone: validation (the program
// still runs its backward, whose outputs are dropped). Collective like
// tpr_train_sequence.
tpr_status tpr_train_eval_sequence(tpr_train_state *t, const int32_t *inputs, const int32_t *targets,
                                   tpr_losses *out);
// The positions of a sequence its cross-entropy averages over: targets other
// than -100 and, packed (o.pack), those not predicting the next document's
// first token.
int64_t tpr_train_scored(const tpr_train_state *t, const int32_t *inputs, const int32_t *targets);
// Packed sequences: where the next sequences' documents start, when the data
// records it (tpr data prepare's document offsets; train/data.h
// tpr_data_window_starts): starts (T + 1), 1 where a document begins at that
// position (position T: the token the last target predicts). Borrowed until
// the next call; NULL (the default) returns to the EOS rule.
void tpr_train_set_doc_starts(tpr_train_state *t, const uint8_t *starts);
bool tpr_train_packed(const tpr_train_state *t);  // opened with o.pack

// Collective. Folds copies of replicated heads (sum) and zeroes padding,
// then averages over the dp replicas (experts: sums over edp, divided by dp).
tpr_status tpr_train_reduce_grads(tpr_train_state *t);
// Collective: the gradient's global sum of squares (the norm squared), each
// checkpoint element counted once; the same double on every rank.
tpr_status tpr_train_grad_sumsq(tpr_train_state *t, double *out);

// Aux-loss-free balancing (DeepSeek-V3's rule, which MiniMax-M2's routing
// bias exists for), collective: with load_e the tokens routed to expert e
// in the sequences run since the last call (all replicas), every layer's
// e_score_correction_bias moves by rate * sign(mean_e load_e - load_e),
// identically on every rank; the counts are then cleared.
tpr_status tpr_train_update_bias(tpr_train_state *t, double rate);

// With opts.profile: seconds spent in each op kind over all runs so far
// (seconds[TPR_OP_KIND_COUNT]), the runs, and the matmul FLOPs of one run.
void tpr_train_profile(const tpr_train_state *t, double *seconds, int64_t *runs, double *gemm_flops_per_run);

// Collective: every trained checkpoint tensor reassembled from the ranks'
// slices (padding removed, experts split back into w1/w3/w2), handed to
// fn on world rank 0 only, under transformers' names. grads: the gradient
// accumulators instead of the weights.
typedef tpr_status (*tpr_train_export_fn)(void *ctx, const char *name, int ndim, const int64_t *shape,
                                          const float *data);
tpr_status tpr_train_export(tpr_train_state *t, bool grads, tpr_train_export_fn fn, void *ctx);

#endif
