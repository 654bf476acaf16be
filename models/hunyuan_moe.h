// Hunyuan-MoE (transformers' HunYuanMoEV1ForCausalLM), tensor-parallel
// inference: one rank-agnostic SPMD step program (models/family.h's interface),
// built by models/qk_head_decoder.h from this family's descriptor:
//
//   x = vocab-parallel embedding (all-reduce over tp)
//   per layer L (every layer is an MoE layer):
//     h = rms_norm(x, input_layernorm)
//     q, k, v = h Wq_r^T, h Wk_r^T, h Wv_r^T            column-parallel heads
//     q, k = NeoX RoPE over the whole head
//     q = rms_norm(q.view(T, qr, D), query_layernorm)   per head, over head_dim,
//     k likewise with key_layernorm                     AFTER RoPE (transformers'
//                                                       current code); rank-local
//     x += allreduce_tp(paged_attention(q, k, v) Wo_r^T)
//     h = rms_norm(x, post_attention_layernorm)
//     p = softmax(h Wg^T) (Wg = mlp.gate.wg, f32), g = top-k of p renormalised
//     x += moe(h, g)                                    routed experts (models/layers/moe.h)
//        + allreduce_tp(down_r(silu(gate_r h) * up_r h)) the shared MLP, column/row-parallel
//   logits^T = allgather_tp(lm_head_r x_final^T) at the sampled rows
//
// Capacity mode (--capacity-factor, --reroute-dropped) follows Hunyuan's original code's
// top-1 gating for a re-routed token: its gate is its new expert's own
// router probability (tpr_moe_opts.reroute_own_prob). docs/families.md says
// where the capacity path differs from the seed's code.
//
// Not built: RoPE scaling, attention biases, cross-layer attention (the
// config parser refuses them by name), FSDP training (tpr train --fsdp refuses
// the family; plain data parallelism trains it through qk_head_decoder.h),
// the capacity path in training (no backward for the own-probability rule).
#ifndef TPR_HUNYUAN_MOE_H
#define TPR_HUNYUAN_MOE_H

#include "models/qk_head_decoder.h"

// The engine's entry (models/family.c). Its build_step maps the session's
// per_rank_qk_norm control to TPR_QK_CONTROL_SWAP_ORDER
// (models/qk_head_decoder.h: normalise q/k, then rotate -- Qwen3's order).
extern const tpr_family tpr_family_hunyuan_v1_moe;

// The family's descriptor (models/qk_head_decoder.h), for tpr_qkhd_build.
extern const tpr_qkhd_desc tpr_hunyuan_moe_desc;

#endif
