// Backward rule of the router: only the logits get a cotangent.
#include "grad.h"

TPR__BWD_RULE(router_sigmoid_topk) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_value_id dl;
  const tpr_value_id in[3] = {n->in[0], n->in[1], n->dout};
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_ROUTER_SIGMOID_TOPK_BWD, in, 3, &n->attrs, &dl));
  return tpr_grad_add(g, n->in[0], dl);
}

const tpr__grad_def tpr__router_grad[] = {
    {TPR_OP_ROUTER_SIGMOID_TOPK, bwd_router_sigmoid_topk},
    {0},
};
