#include "models/qwen3_vl_moe.h"

static tpr_status build_step(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out) {
  return tpr_qkhd_build_step(&tpr_qwen3_vl_moe_desc, plan, o, out);
}

// The checkpoint's text-decoder weights under the Qwen3-MoE names (shard
// plan); Qwen3-MoE's step with MRoPE in the config's layout.
const tpr_family tpr_family_qwen3_vl_moe = {
    .name = "qwen3_vl_moe",
    .family = TPR_FAMILY_QWEN3_VL_MOE,
    .build_step = build_step,
    .expert_gate = "experts.{E}.gate_proj.weight",
    .expert_up = "experts.{E}.up_proj.weight",
    .expert_down = "experts.{E}.down_proj.weight",
};

const tpr_qkhd_desc tpr_qwen3_vl_moe_desc = {
    .family = &tpr_family_qwen3_vl_moe,
    .q_norm = "model.layers.{L}.self_attn.q_norm.weight",
    .k_norm = "model.layers.{L}.self_attn.k_norm.weight",
    .router = "model.layers.{L}.mlp.gate.weight",
    .dense_mlp = NULL,  // the loader cannot see mlp_only layers in a nested text_config
    .qk_norm_after_rope = false,
    .mrope = true,
    .session_control = TPR_QK_CONTROL_FULL_LOCAL,
};
