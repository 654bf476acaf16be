// The decoder step program shared by the families whose attention normalises
// q and k per head (RMS over head_dim, rank-local) around RoPE: qwen3_moe,
// qwen3_vl_moe, hunyuan_v1_moe -- and by qwen2_vl, whose attention has no
// QK-norm but q/k/v biases, and whose layers are all dense. One builder;
// what differs between them is data -- the config (MRoPE layout,
// shared-expert size, dense layers, experts or none) and the family's
// descriptor below (param names, QK-norm order, biases, router values).
//
//   x = vocab-parallel embedding (all-reduce over tp)
//   per layer L:
//     h = rms_norm(x, input_layernorm)
//     q, k, v = h Wq_r^T, h Wk_r^T, h Wv_r^T            column-parallel heads
//               (+ bq_r, bk_r, bv_r: the biases' slices of the same heads)
//     q, k = rms_norm per head (D) with q_norm / k_norm, before RoPE or
//            after it (qk_norm_after_rope), or none; RoPE is NeoX at "positions", or
//            MRoPE at "positions_3d" (mrope families)
//     x += allreduce_tp(paged_attention(q, k, v) Wo_r^T)
//     h = rms_norm(x, post_attention_layernorm)
//     MoE layer: x += moe(h, top-k of softmax(h Wg^T)) [+ the shared expert's
//                SwiGLU MLP, column/row-parallel, where the config has one]
//     dense layer: x += allreduce_tp(down_r(silu(gate_r h) * up_r h))
//   logits^T = allgather_tp(lm_head_r x_final^T) at the sampled rows
//
// Training mode (tpr_qkhd_opts.training): the same layers without KV cache
// (attention over this run's k and v from position 0), the edges where a
// replicated value enters rank-local compute marked with grad_all_reduce
// (q/k/v and dense/shared MLP inputs, the per-head norm weights, the experts'
// inputs, the lm head's), and the loss of models/train_loss.h in place of the
// logits: vocab-parallel cross-entropy + aux_coef * the load-balancing loss
// over the MoE layers' router logits, then the backward.
#ifndef TPR_QK_HEAD_DECODER_H
#define TPR_QK_HEAD_DECODER_H

#include <stdbool.h>

#include "models/family.h"
#include "shard/fsdp.h"

// Negative controls of the parity tests (never in real runs).
typedef enum tpr_qk_control {
  TPR_QK_CONTROL_NONE = 0,        // the model
  TPR_QK_CONTROL_FULL_LOCAL,      // RMS over the rank's whole q/k slice (the M2 norm without its all-reduce)
  TPR_QK_CONTROL_FULL_ALLREDUCE,  // RMS over the whole projection, sums all-reduced over tp (the M2 norm)
  TPR_QK_CONTROL_SWAP_ORDER,      // the per-head norm on the other side of RoPE
  TPR_QK_CONTROL_NO_BIAS,         // the q/k/v biases left out (families that have them)
} tpr_qk_control;

// A family's description. Patterns are plan tensor names ("{L}": the layer).
typedef struct tpr_qkhd_desc {
  const tpr_family *family;     // the engine entry: its name, model family, expert names
  const char *q_norm, *k_norm;  // (D) per-head norm weights; NULL: no QK-norm
  bool qkv_bias;                // q/k/v_proj.bias (plan kinds sliced like their weights' rows)
  const char *router;           // (E, H) router weight; NULL: no MoE layers (a dense model)
  const char *dense_mlp;        // prefix of a dense layer's {gate,up,down}_proj.weight; NULL: no dense layers
  const char *shared_mlp;       // prefix of the shared expert's; NULL: no shared expert
  bool qk_norm_after_rope;      // the model's order (the config must agree)
  bool mrope;                   // rope positions (3, T), the config's MRoPE layout
  // Capacity mode: a re-routed token's gate is its new expert's own router
  // probability (tpr_moe_opts.reroute_own_prob; Hunyuan's original rule).
  bool reroute_own_prob;
  // What the session's per_rank_qk_norm control builds for this family.
  tpr_qk_control session_control;
} tpr_qkhd_desc;

// Negative controls of training (the first two are TPR_M2_MARKS_*'s bits):
// leave out the grad_all_reduce of the column-parallel, expert and lm head
// inputs (the shared expert's included), of the per-head norm weights, or of
// the shared expert's input alone. The forward is unchanged.
// TPR_QKHD_MARKS_BIAS_WRONG adds a mark instead: the q/k/v biases treated as
// replicated (their cotangents summed over tp), which they are not -- each
// rank holds its own heads' slice, so the sum mixes heads.
enum { TPR_QKHD_MARKS_COLUMN = 1, TPR_QKHD_MARKS_QK_NORM = 2, TPR_QKHD_MARKS_SHARED = 4, TPR_QKHD_MARKS_BIAS_WRONG = 8 };

typedef struct tpr_qkhd_opts {
  tpr_step_build_opts step;  // inference: the step; training: moe options (step.shape unused)
  tpr_qk_control qk_control;
  // Training program: inputs "tokens", "positions" (T) i32 (plus
  // "positions_3d" (3, T) for MRoPE families), "start" (1) i32 (0),
  // "targets" (T) i32; outputs "loss", "ce", "aux", per MoE layer L
  // "moe_load.L" (E) i32 (tokens routed per expert) and "grad:<param>" for
  // every trained param (models/train_loss.h). Params are f32 (FSDP: the
  // chunks, in fsdp.param_dtype; their gradients f32). Dropless
  // only for a family with reroute_own_prob (its capacity rule has no
  // backward): step.moe.capacity_factor > 0 is refused naming the flag.
  bool training;
  int64_t tokens;       // T, training
  double aux_coef;      // weight of the load-balancing loss, training
  int skip_grad_marks;  // TPR_QKHD_MARKS_* negative controls, training
  // Training on packed sequences (docs/training.md "Packed sequences"): one
  // more input "attn_lo" (T) i32, each token's document start; attention
  // never crosses a document's start (attention's document form, ops.h).
  bool pack;
  // Training: params sharded over dp, experts over edp (shard/fsdp.h): each
  // is declared as this rank's chunk "<name>" and gathered before its layer
  // part (prefetch group 0 the embedding, 1 + 2L layer L's attention,
  // 2 + 2L its MLP, 1 + 2*layers the final norm and lm head).
  tpr_fsdp_opts fsdp;
} tpr_qkhd_opts;

// The step program of `d`'s family on `plan` (whose config must be d's).
tpr_status tpr_qkhd_build(const tpr_qkhd_desc *d, const tpr_shard_plan *plan, const tpr_qkhd_opts *o,
                          tpr_program **out);

// models/family.h's build_step for `d`: maps per_rank_qk_norm to d->session_control.
tpr_status tpr_qkhd_build_step(const tpr_qkhd_desc *d, const tpr_shard_plan *plan, const tpr_step_build_opts *o,
                               tpr_program **out);

#endif
