// Backward rules (runtime/autodiff.h), one per op kind, each defined in its
// op's family file beside the forward; autodiff_rules.c lists them.
#ifndef TPR_OPS_GRAD_RULES_H
#define TPR_OPS_GRAD_RULES_H

#include "runtime/program/autodiff.h"

// The rule of op kind `op`, NULL when it has none.
tpr_backward_rule tpr__backward_rule(tpr_op_kind op);

#define TPR__BWD_RULE(name) tpr_status tpr__bwd_##name(tpr_grad_ctx *g, const tpr_grad_node *n)

// reduce.c: sum_to, scale, fill
TPR__BWD_RULE(sum_to);
TPR__BWD_RULE(scale);
TPR__BWD_RULE(fill);
// collective_grad.c: the collectives and grad_all_reduce (the f/g pair)
TPR__BWD_RULE(grad_all_reduce);
TPR__BWD_RULE(all_reduce);
TPR__BWD_RULE(all_gather);
TPR__BWD_RULE(reduce_scatter);
TPR__BWD_RULE(all_to_all);
TPR__BWD_RULE(all_to_allv);
TPR__BWD_RULE(param_gather);

// ---- dense ops (matmul.c, elementwise.c, norm.c, softmax.c, gather.c, copy.c,
// views.c)
TPR__BWD_RULE(matmul);
TPR__BWD_RULE(add);
TPR__BWD_RULE(mul);
// Hands the next result of a packed backward op (like's shape, at *off) to
// like's cotangent, or skips it when like wants none; *off advances (norm.c).
tpr_status tpr__grad_take(tpr_grad_ctx *g, tpr_value_id packed, int64_t *off, tpr_value_id like);
TPR__BWD_RULE(rms_norm);         // norm.c
TPR__BWD_RULE(sum_squares);      // norm.c: mul + scale
TPR__BWD_RULE(rms_scale);        // norm.c
TPR__BWD_RULE(swiglu);           // elementwise.c
TPR__BWD_RULE(softmax);          // softmax.c
TPR__BWD_RULE(embedding);        // gather.c
TPR__BWD_RULE(embedding_shard);  // gather.c
TPR__BWD_RULE(index_select);     // gather.c
TPR__BWD_RULE(cast);             // copy.c
TPR__BWD_RULE(reshape);          // views.c
TPR__BWD_RULE(permute);          // views.c
TPR__BWD_RULE(slice);            // views.c

// ---- attention (rope.c, attention.c)
TPR__BWD_RULE(rope);
TPR__BWD_RULE(attention);

// ---- MoE ops (router.c, moe.c, moe_dispatch.c)
TPR__BWD_RULE(router_sigmoid_topk);
TPR__BWD_RULE(moe_experts);
TPR__BWD_RULE(moe_grouped_ffn);
TPR__BWD_RULE(moe_capacity);
TPR__BWD_RULE(row_slice);
TPR__BWD_RULE(moe_permute);
TPR__BWD_RULE(moe_unpermute);

// ---- losses (xent.c, moe_aux.c)
TPR__BWD_RULE(xent_sumexp);  // xent.c (xent_max needs none: nothing gives the max a cotangent)
TPR__BWD_RULE(xent_target);
TPR__BWD_RULE(xent_loss);
TPR__BWD_RULE(moe_aux_stats);  // moe_aux.c
TPR__BWD_RULE(moe_aux_loss);

#endif
