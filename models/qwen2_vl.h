// Qwen2-VL / Qwen2.5-VL's text decoder (transformers' Qwen2VLForConditionalGeneration
// and Qwen2_5_VLForConditionalGeneration, their language_model; the two are
// the same code in transformers 5.23): a dense Qwen2 built by the shared
// step builder (models/qk_head_decoder.h) from this family's descriptor:
//
//   x = vocab-parallel embedding (all-reduce over tp)
//   per layer L:
//     h = rms_norm(x, input_layernorm)
//     q, k, v = h Wq_r^T + bq_r, h Wk_r^T + bk_r, h Wv_r^T + bv_r
//               column-parallel heads; each bias sliced exactly like its
//               weight's rows (Q padded interleaved, KV replicated at tp > nkv)
//     q, k = NeoX MRoPE at the (3, T) "positions_3d", SECTIONED layout
//            (contiguous t / h / w blocks of the half dimension, mrope_section);
//            no QK-norm
//     x += allreduce_tp(paged_attention(q, k, v) Wo_r^T)   (o_proj: no bias)
//     h = rms_norm(x, post_attention_layernorm)
//     x += allreduce_tp(down_r(silu(gate_r h) * up_r h))   every layer dense
//   logits^T = allgather_tp(lm_head_r x_final^T) at the sampled rows
//
// No experts: the session stacks none and ep must be 1 (the plan refuses
// more). Not run: the vision tower (model.visual.* is never read; image and
// video tokens are plain tokens, their positions given as positions_3d),
// sliding-window attention and RoPE scaling (the config parser refuses
// both by name).
//
// Training (tpr train, qk_head_decoder's training mode): the loss is
// cross-entropy alone (no router, no aux loss: Qwen2VLForConditionalGeneration's
// loss); the biases' gradients are rank-local (each rank's slice of the
// same heads as its weight rows, the replicated KV heads' copies summed by
// the gradient fold like their weights'), so they need no backward mark:
// the mark is on h, the replicated input of the column-parallel q/k/v.
#ifndef TPR_QWEN2_VL_H
#define TPR_QWEN2_VL_H

#include "models/family.h"
#include "models/qk_head_decoder.h"

extern const tpr_family tpr_family_qwen2_vl;
// The family's descriptor (models/qk_head_decoder.h), for tpr_qkhd_build.
extern const tpr_qkhd_desc tpr_qwen2_vl_desc;

#endif
