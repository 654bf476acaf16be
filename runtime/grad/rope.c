// Backward rule of rope: the inverse rotation (rope_bwd).
#include "grad.h"

// Positions are integers: only x gets a cotangent.
TPR__BWD_RULE(rope) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_value_id dx;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_ROPE_BWD, (const tpr_value_id[]){n->dout, n->in[1]}, 2,
                           &n->attrs, &dx));
  return tpr_grad_add(g, n->in[0], dx);
}

const tpr__grad_def tpr__rope_grad[] = {
    {TPR_OP_ROPE, bwd_rope},
    {0},
};
