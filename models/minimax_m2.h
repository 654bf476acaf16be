// MiniMax-M2, tensor-parallel: one rank-agnostic SPMD program per token
// count T (docs/architecture.md sections 1, 5, 6; reference: transformers'
// modeling_minimax_m2.py).
//
//   x = vocab-parallel embedding (all-reduce over tp)
//   per layer:
//     h = rms_norm(x, input_layernorm)
//     q, k, v = h Wq_r^T, h Wk_r^T, h Wv_r^T          column-parallel heads
//     q = q * rsqrt(allreduce_tp(sum q^2) / (nq*D) + eps) * q_norm[rank block]
//     k likewise with the planner's K divisor           full-projection QK-norm
//     q, k = partial NeoX RoPE on the first rotary_dim dims of each head
//     cache[start:start+T] = k, v; a = causal GQA attention (scale D^-0.5)
//     x += allreduce_tp(a Wo_r^T)                       row-parallel o_proj
//     h = rms_norm(x, post_attention_layernorm)
//     g = topk_k(sigmoid(h Wg^T) + bias) weights, renormalised, without bias
//     x += sum_e g_e w2_e(silu(w1_e h) * w3_e h)          experts on (edp, ep, etp):
//                                                       models/layers/moe.h
//   logits^T = allgather_tp(lm_head_r x_final^T)         vocab-parallel
//
// The rank enters only through the rank tensor: the embedding shard and the
// QK-norm weight slices are selected at run time. Inference programs follow
// the engine's step interface (models/family.h): a ragged batch of tokens
// from many sequences over a paged KV cache, logits only at the sampled rows.
#ifndef TPR_MINIMAX_M2_H
#define TPR_MINIMAX_M2_H

#include "models/family.h"
#include "models/layers/moe.h"
#include "runtime/program/tpr_runtime.h"
#include "shard/fsdp.h"
#include "shard/shard_plan.h"

enum { TPR_M2_MARKS_COLUMN = 1, TPR_M2_MARKS_QK_NORM = 2 };

typedef struct tpr_m2_build_opts {
  int64_t tokens;       // T: tokens per run (static)
  tpr_step_shape step;  // inference: the step's shape (step.tokens == tokens)
  // Negative control only: normalise q/k over the rank's slice (no
  // all-reduce, per-rank divisor), the bug some later ports have.
  bool per_rank_qk_norm;
  tpr_moe_opts moe;     // dispatcher, capacity mode
  // Adds outputs for routing statistics: per layer L "moe_gates.L" (T, E),
  // the gates the experts used, and with capacity mode "moe_router.L" (T, E),
  // the router's own.
  bool moe_stats;
  // Training program (run by the trainer): no KV caches (attention
  // reads this run's k and v, start = 0), every edge where a replicated value
  // enters rank-local compute marked with grad_all_reduce, and instead of
  // logits the loss: input "targets" (T) i32 (-100 ignored), outputs "loss"
  // (1) = ce + aux_coef * aux, "ce" (1), "aux" (1), and per layer L
  // "moe_load.L" (E) i32, the tokens the router sent to each expert.
  bool training;
  double aux_coef;
  // Training on packed sequences (docs/training.md "Packed sequences"): one
  // more input "attn_lo" (T) i32, the first position of each token's
  // document; attention never crosses a document's start (attention's
  // document form, ops.h). The trainer gives positions restarting per document.
  bool pack;
  // Negative control only: training without some grad_all_reduce marks (the
  // forward is unchanged, those tp gradients come out partial): a mask of
  // TPR_M2_MARKS_COLUMN (column-parallel and expert inputs, the lm head's
  // input) and TPR_M2_MARKS_QK_NORM (the QK-norm's sum and weight).
  int skip_grad_marks;
  // Training: trained params sharded over dp / edp (shard/fsdp.h).
  tpr_fsdp_opts fsdp;
  // Inference: the dtype of each plan kind's param (tpr_step_build_opts).
  const tpr_dtype *kind_dtype;
  const int *kind_block;  // FP8 kinds' scale blocks (tpr_step_build_opts)
} tpr_m2_build_opts;

// Inference (models/family.h's step interface) or, with o->training, the
// training program (inputs "tokens", "positions", "start", "targets").
tpr_status tpr_m2_build(const tpr_shard_plan *plan, const tpr_m2_build_opts *o, tpr_program **out);

// The engine's entry for MiniMax-M2 (models/family.c).
extern const tpr_family tpr_family_minimax_m2;

#endif
