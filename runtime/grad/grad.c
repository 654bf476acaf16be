// Which backward rule each op kind has (the rules live beside their forwards).
#include "grad.h"

static const tpr_backward_rule rules[TPR_OP_KIND_COUNT] = {
    [TPR_OP_SUM_TO] = tpr__bwd_sum_to,
    [TPR_OP_SCALE] = tpr__bwd_scale,
    [TPR_OP_FILL] = tpr__bwd_fill,
    [TPR_OP_GRAD_ALL_REDUCE] = tpr__bwd_grad_all_reduce,
    [TPR_OP_ALL_REDUCE] = tpr__bwd_all_reduce,
    [TPR_OP_ALL_GATHER] = tpr__bwd_all_gather,
    [TPR_OP_REDUCE_SCATTER] = tpr__bwd_reduce_scatter,
    [TPR_OP_ALL_TO_ALL] = tpr__bwd_all_to_all,
    [TPR_OP_ALL_TO_ALLV] = tpr__bwd_all_to_allv,
    [TPR_OP_PARAM_GATHER] = tpr__bwd_param_gather,

    // ---- dense ops
    [TPR_OP_MATMUL] = tpr__bwd_matmul,
    [TPR_OP_ADD] = tpr__bwd_add,
    [TPR_OP_MUL] = tpr__bwd_mul,
    [TPR_OP_RMS_NORM] = tpr__bwd_rms_norm,
    [TPR_OP_SUM_SQUARES] = tpr__bwd_sum_squares,
    [TPR_OP_RMS_SCALE] = tpr__bwd_rms_scale,
    [TPR_OP_SWIGLU] = tpr__bwd_swiglu,
    [TPR_OP_SOFTMAX] = tpr__bwd_softmax,
    [TPR_OP_EMBEDDING] = tpr__bwd_embedding,
    [TPR_OP_EMBEDDING_SHARD] = tpr__bwd_embedding_shard,
    [TPR_OP_INDEX_SELECT] = tpr__bwd_index_select,
    [TPR_OP_CAST] = tpr__bwd_cast,
    [TPR_OP_RESHAPE] = tpr__bwd_reshape,
    [TPR_OP_PERMUTE] = tpr__bwd_permute,
    [TPR_OP_SLICE] = tpr__bwd_slice,

    // ---- attention
    [TPR_OP_ROPE] = tpr__bwd_rope,
    [TPR_OP_ATTENTION] = tpr__bwd_attention,

    // ---- MoE ops
    [TPR_OP_ROUTER_SIGMOID_TOPK] = tpr__bwd_router_sigmoid_topk,
    [TPR_OP_MOE_EXPERTS] = tpr__bwd_moe_experts,
    [TPR_OP_MOE_GROUPED_FFN] = tpr__bwd_moe_grouped_ffn,
    [TPR_OP_MOE_CAPACITY] = tpr__bwd_moe_capacity,
    [TPR_OP_ROW_SLICE] = tpr__bwd_row_slice,
    [TPR_OP_MOE_PERMUTE] = tpr__bwd_moe_permute,
    [TPR_OP_MOE_UNPERMUTE] = tpr__bwd_moe_unpermute,

    // ---- losses
    [TPR_OP_XENT_SUMEXP] = tpr__bwd_xent_sumexp,
    [TPR_OP_XENT_TARGET] = tpr__bwd_xent_target,
    [TPR_OP_XENT_LOSS] = tpr__bwd_xent_loss,
    [TPR_OP_MOE_AUX_STATS] = tpr__bwd_moe_aux_stats,
    [TPR_OP_MOE_AUX_LOSS] = tpr__bwd_moe_aux_loss,

};

tpr_backward_rule tpr__backward_rule(tpr_op_kind op) {
  return (unsigned)op < TPR_OP_KIND_COUNT ? rules[op] : NULL;
}
