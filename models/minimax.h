// MiniMax (MiniMax-Text-01; transformers' MiniMaxForCausalLM, model_type
// "minimax"): a hybrid of lightning attention layers and softmax attention
// layers (config.layer_types), every layer MoE. Inference step program,
// tensor-parallel over heads (docs/lightning-attention.md, docs/families.md).
//
//   x = vocab-parallel embedding (all-reduce over tp)
//   per layer L:
//     h = rms_norm(x, input_layernorm)
//     lightning layer (nh % tp == 0; rank r holds heads [r*nh/tp, (r+1)*nh/tp)):
//       qkv = silu(h Wqkv_r^T) (T, nh/tp, 3D), per head [q | k | v]
//       o = lightning_paged(q, k, v, the layer's state slots, the rank's slopes)  (T, nh/tp*D)
//           each sequence's chunk from its slot's state (zeros at position 0), the
//           state after it written back to the slot (training: lightning_attention
//           from the zero state; packed documents: from zeros at each document's start)
//       o = o * rsqrt(allreduce_tp(sum o^2) / (nh*D) + 1e-6) * norm_w[rank's slice]
//                                       the RMSNorm is over all heads: all-reduce
//       a = allreduce_tp((sigmoid(h Wgate_r^T) * o) Wout_r^T)
//     softmax layer: q, k, v = h Wq_r^T, ...; NeoX RoPE; paged GQA attention
//       (scale D^-0.5); a = allreduce_tp(att Wo_r^T)     (heads padded as today)
//     x = alpha_attn[type] * h + beta_attn[type] * a      (the residual is h, normed)
//     h = rms_norm(x, post_attention_layernorm)
//     x = mlp_alpha * h + mlp_beta * moe(h)               softmax top-k, renormalised
//   logits^T = allgather_tp(lm_head_r x_final^T) at the sampled rows
//
// The engine keeps each sequence's lightning states in a slot of a pool per
// lightning layer (tpr_family.state_shape: (nh/tp, D, D) per slot, input
// "state_slot"), so steps mix sequences at any position (docs/engine.md).
// The slopes, the zero state and a [1, 0] pair for the gate's sigmoid are the
// family's constants (tpr_family.constants), bound by the session; their
// names start with "const:" (TPR_FAMILY_CONST_PREFIX), so training leaves
// them alone.
#ifndef TPR_MINIMAX_H
#define TPR_MINIMAX_H

#include "models/family.h"
#include "shard/fsdp.h"

// Negative controls of the parity tests (never in real runs).
typedef enum tpr_minimax_control {
  TPR_MINIMAX_CONTROL_NONE = 0,
  TPR_MINIMAX_CONTROL_LOCAL_NORM,  // the lightning norm over the rank's heads only (no all-reduce)
} tpr_minimax_control;

// Negative controls of training (the forward is unchanged): leave out the
// grad_all_reduce of the column-parallel and expert inputs and the lm head's
// (bit 1, `--debug-skip-grad-marks column`), or of the lightning norm's
// all-reduced sum of squares and whole weight (bit 2, `qk-norm`).
enum { TPR_MINIMAX_MARKS_COLUMN = 1, TPR_MINIMAX_MARKS_NORM = 2 };

typedef struct tpr_minimax_opts {
  tpr_step_build_opts step;  // inference: the step; training: the moe options (step.shape unused)
  tpr_minimax_control control;
  // Training program (run by the trainer): inputs "tokens", "positions"
  // (T) i32, "start" (1) i32 (0), "targets"; the softmax layers attend this
  // run's k and v, the lightning layers start from the zero state; outputs
  // "loss", "ce", "aux", per layer "moe_load.L" (E) i32 and "grad:<param>"
  // for every trained param (models/train_loss.h) -- not the family's
  // constants, which are named "const:..." and never trained.
  bool training;
  int64_t tokens;       // T, training
  double aux_coef;      // the load-balancing loss's weight, training
  int skip_grad_marks;  // TPR_MINIMAX_MARKS_* negative controls, training
  // Training on packed sequences (docs/training.md "Packed sequences"): one
  // more input "attn_lo" (T) i32, each token's document start; the softmax
  // layers never attend across a document's start (attention's document
  // form) and the lightning layers restart from the zero state at each one
  // (lightning attention's document form, ops.h).
  bool pack;
  // Packed training's negative control (never in real runs): the lightning
  // layers' plain form, their state carried across documents (the softmax
  // layers' mask kept).
  bool debug_carry_state;
  // Training: params sharded over dp, experts over edp (shard/fsdp.h): each
  // trained param is declared as this rank's chunk "<name>" and gathered
  // before its layer part (prefetch group 0 the embedding, 1 + 2L layer L's
  // attention, lightning or softmax, 2 + 2L its MoE, 1 + 2*layers the final
  // norm and lm head). The family's constants are never chunked.
  tpr_fsdp_opts fsdp;
} tpr_minimax_opts;

// The step program (models/family.h's interface) or the training program.
tpr_status tpr_minimax_build(const tpr_shard_plan *plan, const tpr_minimax_opts *o, tpr_program **out);

// The engine's entry (models/family.c). Its build_step maps the session's
// per_rank_qk_norm control to TPR_MINIMAX_CONTROL_LOCAL_NORM.
extern const tpr_family tpr_family_minimax;

#endif
