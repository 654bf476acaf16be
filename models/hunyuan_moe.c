#include "models/hunyuan_moe.h"

static tpr_status build_step(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out) {
  return tpr_qkhd_build_step(&tpr_hunyuan_moe_desc, plan, o, out);
}

const tpr_family tpr_family_hunyuan_v1_moe = {
    .name = "hunyuan_v1_moe",
    .family = TPR_FAMILY_HUNYUAN_V1_MOE,
    .build_step = build_step,
    .expert_gate = "experts.{E}.gate_proj.weight",
    .expert_up = "experts.{E}.up_proj.weight",
    .expert_down = "experts.{E}.down_proj.weight",
};

const tpr_qkhd_desc tpr_hunyuan_moe_desc = {
    .family = &tpr_family_hunyuan_v1_moe,
    .q_norm = "model.layers.{L}.self_attn.query_layernorm.weight",
    .k_norm = "model.layers.{L}.self_attn.key_layernorm.weight",
    .router = "model.layers.{L}.mlp.gate.wg.weight",
    .shared_mlp = "model.layers.{L}.mlp.shared_mlp.",
    .qk_norm_after_rope = true,  // transformers' current code
    .reroute_own_prob = true,
    .session_control = TPR_QK_CONTROL_SWAP_ORDER,  // Qwen3's order: normalise, then rotate
};
