#include "models/qwen2_vl.h"

#include "models/qk_head_decoder.h"

static tpr_status build_step(const tpr_shard_plan *plan, const tpr_step_build_opts *o, tpr_program **out) {
  return tpr_qkhd_build_step(&tpr_qwen2_vl_desc, plan, o, out);
}

// The expert names match no plan tensor of this dense family (the session
// looks them up only on MoE layers, of which there are none).
const tpr_family tpr_family_qwen2_vl = {
    .name = "qwen2_vl",
    .family = TPR_FAMILY_QWEN2_VL,
    .build_step = build_step,
    .expert_gate = "experts.{E}.gate_proj.weight",
    .expert_up = "experts.{E}.up_proj.weight",
    .expert_down = "experts.{E}.down_proj.weight",
};

const tpr_qkhd_desc tpr_qwen2_vl_desc = {
    .family = &tpr_family_qwen2_vl,
    .q_norm = NULL,  // no QK-norm
    .k_norm = NULL,
    .qkv_bias = true,
    .router = NULL,                        // no MoE layers
    .dense_mlp = "model.layers.{L}.mlp.",  // Qwen2MLP in every layer
    .mrope = true,                         // sectioned: the config's layout
    // The session's per_rank_qk_norm debug control builds the biases-left-out
    // model (the family has no QK-norm to break).
    .session_control = TPR_QK_CONTROL_NO_BIAS,
};
