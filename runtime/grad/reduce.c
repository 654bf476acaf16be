// Backward rules of sum_to, scale and fill.
#include "grad.h"

// d x = d out broadcast back to x's shape (added onto zeros, which broadcasts).
TPR__BWD_RULE(sum_to) {
  tpr_program *p = tpr_grad_program(g);
  tpr_value_id zeros, dx;
  TPR_CHECK(tpr_pb_fill(p, n->in[0], 0.0f, &zeros));
  TPR_CHECK(tpr_pb_add(p, zeros, n->dout, &dx));
  return tpr_grad_add(g, n->in[0], dx);
}

// fill reads only its input's shape: its output is a constant, and the input
// gets no cotangent (the softmax router's selection constants,
// models/layers/router_softmax.h, are filled from the logits' shape).
TPR__BWD_RULE(fill) {
  (void)g, (void)n;
  return TPR_OK;
}

TPR__BWD_RULE(scale) {
  tpr_value_id dx;
  TPR_CHECK(tpr_pb_scale(tpr_grad_program(g), n->dout, n->attrs.f[0], &dx));
  return tpr_grad_add(g, n->in[0], dx);
}

const tpr__grad_def tpr__reduce_grad[] = {
    {TPR_OP_SUM_TO, bwd_sum_to},
    {TPR_OP_SCALE, bwd_scale},
    {TPR_OP_FILL, bwd_fill},
    {0},
};
