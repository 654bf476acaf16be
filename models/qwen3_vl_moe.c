#include "models/qwen3_vl_moe.h"

#include "models/qwen3_moe.h"

// The checkpoint's text-decoder weights under the Qwen3-MoE names (shard
// plan); the build is qwen3_moe's, which reads the MRoPE layout from the
// config.
const tpr_family tpr_family_qwen3_vl_moe = {
    .name = "qwen3_vl_moe",
    .family = TPR_FAMILY_QWEN3_VL_MOE,
    .build_step = tpr__qwen3_build_step,
    .expert_gate = "experts.{E}.gate_proj.weight",
    .expert_up = "experts.{E}.up_proj.weight",
    .expert_down = "experts.{E}.down_proj.weight",
};
