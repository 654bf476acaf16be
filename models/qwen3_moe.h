// Qwen3-MoE (transformers' Qwen3MoeForCausalLM), tensor-parallel inference:
// one rank-agnostic SPMD step program (models/family.h's interface), built
// by models/qk_head_decoder.h from this family's descriptor:
//
//   x = vocab-parallel embedding (all-reduce over tp)
//   per layer L:
//     h = rms_norm(x, input_layernorm)
//     q, k, v = h Wq_r^T, h Wk_r^T, h Wv_r^T            column-parallel heads
//     q = rms_norm(q.view(T, qr, D), q_norm (D))         per head, over head_dim,
//     k likewise with k_norm                            BEFORE RoPE; local to the
//                                                       rank: no collective
//     q, k = NeoX RoPE over the whole head (rotary_dim = D); qwen3_vl_moe
//            (models/qwen3_vl_moe.h): MRoPE at the (3, T) "positions_3d"
//     x += allreduce_tp(paged_attention(q, k, v) Wo_r^T)
//     h = rms_norm(x, post_attention_layernorm)
//     MoE layer (models/layers/moe.h): g = top-k of softmax(h Wg^T),
//       renormalised if norm_topk_prob; x += sum_e g_e down_e(silu(gate_e h) * up_e h)
//     dense layer (mlp_only_layers, decoder_sparse_step):
//       x += allreduce_tp(down_r(silu(gate_r h) * up_r h))  column/row-parallel
//   logits^T = allgather_tp(lm_head_r x_final^T) at the sampled rows
//
// Training: the same builder's training mode (qk_head_decoder.h), run by
// tpr train. Not built: attention biases and sliding-window attention (the
// config parser refuses both by name).
#ifndef TPR_QWEN3_MOE_H
#define TPR_QWEN3_MOE_H

#include "models/qk_head_decoder.h"

// The engine's entry (models/family.c). Its build_step maps the session's
// per_rank_qk_norm control to TPR_QK_CONTROL_FULL_LOCAL.
extern const tpr_family tpr_family_qwen3_moe;

// The family's descriptor (models/qk_head_decoder.h), for tpr_qkhd_build.
extern const tpr_qkhd_desc tpr_qwen3_moe_desc;

#endif
