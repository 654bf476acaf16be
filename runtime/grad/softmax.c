// Backward rule of softmax: one softmax_bwd from the output and its
// cotangent.
#include "grad.h"

TPR__BWD_RULE(softmax) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_value_id dx;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_SOFTMAX_BWD, (const tpr_value_id[]){n->out, n->dout}, 2,
                           NULL, &dx));
  return tpr_grad_add(g, n->in[0], dx);
}

const tpr__grad_def tpr__softmax_grad[] = {
    {TPR_OP_SOFTMAX, bwd_softmax},
    {0},
};
