// MiniCPM-SALA (openbmb/MiniCPM-SALA; model_type "minicpm_sala";
// docs/minicpm-sala.md names the published sources of every formula): a
// hybrid of lightning attention layers and InfLLM-v2 block-sparse attention
// layers (config mixer_types), a dense SwiGLU MLP in every layer, muP
// scaling. Inference step program and training program (below), both
// tensor-parallel over heads.
//
//   x = embed(tokens) * scale_emb                       (vocab-parallel, all-reduced)
//   per layer L:
//     h = rms_norm(x, input_layernorm)
//     lightning layer (nh % tp == 0; rank r holds q heads [r*nh/tp, (r+1)*nh/tp)):
//       q = h Wq_r^T (T, nh/tp, D); k, v = h Wk^T, h Wv^T (the rank's kv heads,
//           or all nkv when nkv % tp != 0), each q and k head RMS-normed
//           (q_norm, k_norm), RoPE (lightning_use_rope), k and v repeated to
//           the rank's q heads (q head i reads kv head i / (nh/nkv))
//       o = lightning_paged(q / sqrt(D), k, v, the layer's state slots, ALiBi
//           slopes of the rank's heads)                  (T, nh/tp*D)
//       o = o * rsqrt(allreduce_tp(sum o^2) / (nh*D) + eps) * o_norm[rank's slice]
//                                       (use_output_norm: over all heads: all-reduce)
//       o = o * sigmoid(h Wz_r^T)       (use_output_gate)
//       a = allreduce_tp(o Wo_r^T)
//     sparse layer (minicpm4): q, k, v = h Wq_r^T, ... (heads padded / KV
//       replicated as every softmax layer), no position encoding; k, v written
//       to the layer's paged KV pool; o = sparse_attention_paged(q, pools)
//       with the config's sparse_config, its compressed keys kept in a
//       third pool beside K and V ("ck", tpr_minicpm_sala_ck_pool), each
//       row deciding dense or sparse by its prompt's length in the engine
//       ("prefill_len"); a layer that cannot turn sparse (dense_len past
//       max_seq, or forced dense) runs paged_attention (training:
//       sparse_attention over the run's k and v, its backward through the
//       selected keys only). The block selection of a KV head sums
//       the scores of its whole query group: when the group's q heads are
//       split over ranks (KV heads replicated, tp > nkv) each rank all-gathers
//       q over tp, attends with the group's heads and keeps its own.
//       o = o * sigmoid(h Wog_r^T)      (attn_use_output_gate)
//       a = allreduce_tp(o Wo_r^T)
//     x = x + residual_scale * a        (scale_depth / sqrt(num_hidden_layers))
//     x = x + residual_scale * allreduce_tp(down_r(silu(gate_r h') * up_r h')),
//         h' = rms_norm(x, post_attention_layernorm)
//   logits^T = allgather_tp(lm_head_r (rms_norm(x, norm) / (hidden / dim_model_base))^T)
//
// The engine keeps each sequence's lightning states in a slot per lightning
// layer (tpr_family.state_shape: (nh/tp, D, D)) beside the sparse layers'
// paged KV, as minimax's. The slopes and the head-index tables are the
// family's constants (names "const:..."), with the zero state training
// starts its lightning layers from.
#ifndef TPR_MINICPM_SALA_H
#define TPR_MINICPM_SALA_H

#include "models/family.h"
#include "shard/fsdp.h"

// Negative controls of the parity tests (tpr_session_opts.family_control;
// never in real runs).
typedef enum tpr_sala_control {
  TPR_SALA_CONTROL_NONE = 0,
  TPR_SALA_CONTROL_LOCAL_NORM = 1,   // the lightning output norm over the rank's heads only (no all-reduce)
  TPR_SALA_CONTROL_NO_MUP = 2,       // muP's residual scale dropped (branches added at 1)
  TPR_SALA_CONTROL_SPARSE_ROPE = 3,  // RoPE applied to the sparse layers' q and k
  TPR_SALA_CONTROL_LOCAL_GROUP = 4,  // sparse layers select blocks with the rank's q heads only (no gather)
  TPR_SALA_CONTROL_RECOMPUTE_CK = 5,  // not a fault: the sparse op's plain form (compressed keys recomputed
                                      // every call, the "ck" pools unread), what the pools must reproduce
  TPR_SALA_CONTROL_COUNT
} tpr_sala_control;

// The step program (models/family.h's interface); o->family_control a
// tpr_sala_control, o->dense_sparse_layers runs the sparse layers dense.
tpr_status tpr_minicpm_sala_build(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out);

// Negative controls of training (the forward is unchanged; the values are
// the trainer's --debug-skip-grad-marks bits, TPR_M2_MARKS_*): leave out the
// grad_all_reduce of the column-parallel inputs (the layer inputs of q/k/v,
// the gates and the MLP, the lm head's; bit 1, `column`), or of the lightning
// layers' replicated norm weights and the output norm's all-reduced sum of
// squares (bit 2, `qk-norm`).
enum { TPR_SALA_MARKS_COLUMN = 1, TPR_SALA_MARKS_NORM = 2 };

// The training program (run by the trainer; docs/minicpm-sala.md
// "Training"): inputs "tokens", "positions" (T) i32, "targets",
// "loss_scale" (every run is one whole sequence from position 0); the lightning layers run lightning_attention from the zero
// state (the constant "const:minicpm_sala.state0"), the sparse layers
// sparse_attention over this run's k and v (dense when T < dense_len, as the
// published forward decides per call); outputs "loss", "ce", "aux" (0: no
// experts) and "grad:<param>" for every trained param (models/train_loss.h).
// Under FSDP every trained param is this rank's chunk, gathered before its
// layer part (prefetch group 0 the embedding, 1 + 2L layer L's mixer and its
// input norm, 2 + 2L its MLP, 1 + 2*layers the final norm and lm head), as
// minimax's. --pack is refused by the trainer.
typedef struct tpr_sala_train_opts {
  int64_t tokens;       // T
  int family_control;   // a tpr_sala_control (the parity controls apply to training too)
  int skip_grad_marks;  // TPR_SALA_MARKS_*
  bool dense;           // the sparse layers run dense (--dense-sparse-layers: every block attended)
  tpr_fsdp_opts fsdp;   // params sharded over dp (shard/fsdp.h)
} tpr_sala_train_opts;
tpr_status tpr_minicpm_sala_build_training(const tpr_shard_plan *plan, const tpr_sala_train_opts *o,
                                           tpr_program **out);

// Whether the sparse layers run sparse_attention_paged with a compressed-key
// pool per layer beside the KV pool (tpr_family_pool_name(L, "ck"): (NB,
// tpr_sparse_ck_rows(bs, kernel_stride), kv_per_rank, D) f32, which the
// session allocates and counts in its block bytes). False when no sequence
// of at most max_seq tokens can turn sparse (dense_len > max_seq) or the
// layers are forced dense: they are then plain causal attention and run
// paged_attention, holding no such pool.
bool tpr_minicpm_sala_ck_pool(const tpr_model_config *cfg, int64_t max_seq, bool dense_sparse_layers);

// The engine's entry (models/family.c). The session's per_rank_qk_norm
// control maps to TPR_SALA_CONTROL_LOCAL_NORM.
extern const tpr_family tpr_family_minicpm_sala;

#endif
