// Qwen3-VL-MoE's text decoder (transformers' Qwen3VLMoeForConditionalGeneration,
// its language_model): Qwen3-MoE (models/qwen3_moe.h; the same step program,
// models/qk_head_decoder.h, from its own descriptor) with MRoPE -- rope
// positions (3, T) (temporal, height, width) laid out
// INTERLEAVED by mrope_section (runtime/ops/rope/rope.h), NeoX pairing.
// The step takes them as the "positions_3d" input (models/family.h); for
// text, all three rows are the sequence position.
//
// Not run: the vision tower and DeepStack's visual features added to the
// first layers' hidden states (image/video tokens are text tokens here),
// dense mlp_only layers, FSDP training. Training (tpr train) binds
// positions_3d from --positions-3d, or the text rule (every axis the position).
#ifndef TPR_QWEN3_VL_MOE_H
#define TPR_QWEN3_VL_MOE_H

#include "models/qk_head_decoder.h"

extern const tpr_family tpr_family_qwen3_vl_moe;

// The family's descriptor (models/qk_head_decoder.h), for tpr_qkhd_build.
extern const tpr_qkhd_desc tpr_qwen3_vl_moe_desc;

#endif
