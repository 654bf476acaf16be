// Qwen3-VL-MoE's text decoder (transformers' Qwen3VLMoeForConditionalGeneration,
// its language_model): Qwen3-MoE (models/qwen3_moe.h; the same step program,
// models/qk_head_decoder.h, from its own descriptor) with MRoPE -- rope
// positions (3, T) (temporal, height, width) laid out
// INTERLEAVED by mrope_section (runtime/ops/rope_layout.h), NeoX pairing.
// The step takes them as the "positions_3d" input (engine/family.h); for
// text, all three rows are the sequence position.
//
// Not run: the vision tower and DeepStack's visual features added to the
// first layers' hidden states (image/video tokens are text tokens here),
// training (tpr train refuses the family), dense mlp_only layers.
#ifndef TPR_QWEN3_VL_MOE_H
#define TPR_QWEN3_VL_MOE_H

#include "engine/family.h"

extern const tpr_family tpr_family_qwen3_vl_moe;

#endif
