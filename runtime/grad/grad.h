// Backward rules (runtime/program/autodiff.h), one file per op family
// (runtime/grad/<family>.c, named as runtime/ops/<family>/), each ending with
// the list of the rules it defines. grad.c assembles the lists into the
// table the autodiff engine looks rules up in (tpr__backward_rule).
//
// The rules build program nodes, so they live here, above the program
// builder, and the kernels below it never see the builder.
#ifndef TPR_GRAD_GRAD_H
#define TPR_GRAD_GRAD_H

#include "runtime/program/autodiff.h"

#define TPR__BWD_RULE(name) static tpr_status bwd_##name(tpr_grad_ctx *g, const tpr_grad_node *n)

typedef struct tpr__grad_def {
  tpr_op_kind op;
  tpr_backward_rule rule;
} tpr__grad_def;

// Every list ends with {0}.
extern const tpr__grad_def tpr__attention_grad[], tpr__collective_grad[], tpr__copy_grad[], tpr__elementwise_grad[],
    tpr__gather_grad[], tpr__loss_grad[], tpr__matmul_grad[], tpr__moe_grad[], tpr__norm_grad[], tpr__reduce_grad[],
    tpr__rope_grad[], tpr__router_grad[], tpr__softmax_grad[],
    tpr__lightning_grad[], tpr__sparse_attention_grad[];

// Hands the next result of a packed backward op (like's shape, at *off) to
// like's cotangent, or skips it without a view when like wants none; *off
// advances past it either way.
tpr_status tpr__grad_take(tpr_grad_ctx *g, tpr_value_id packed, int64_t *off, tpr_value_id like);

#endif
