// Backward rules of add, mul, swiglu and sigmoid. The cotangent of a broadcast
// operand of add or mul is summed back down to its shape.
#include "grad.h"

static tpr_status add_reduced(tpr_grad_ctx *g, tpr_value_id x, tpr_value_id d) {
  if (!tpr_grad_wanted(g, x)) return TPR_OK;
  tpr_program *p = tpr_grad_program(g);
  tpr_tensor xd, dd;
  TPR_CHECK(tpr_program_value(p, x, &xd));
  TPR_CHECK(tpr_program_value(p, d, &dd));
  if (!tpr_tensor_same_shape(&xd, &dd)) TPR_CHECK(tpr_pb_sum_to(p, d, xd.ndim, xd.shape, &d));
  return tpr_grad_add(g, x, d);
}

TPR__BWD_RULE(add) {
  TPR_CHECK(add_reduced(g, n->in[0], n->dout));
  return add_reduced(g, n->in[1], n->dout);
}

TPR__BWD_RULE(mul) {
  tpr_program *p = tpr_grad_program(g);
  for (int i = 0; i < 2; i++) {
    if (!tpr_grad_wanted(g, n->in[i])) continue;
    tpr_value_id t;
    TPR_CHECK(tpr_pb_mul(p, n->dout, n->in[1 - i], &t));
    TPR_CHECK(add_reduced(g, n->in[i], t));
  }
  return TPR_OK;
}

TPR__BWD_RULE(swiglu) {
  tpr_value_id packed;
  int64_t off = 0;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_SWIGLU_BWD,
                           (const tpr_value_id[]){n->in[0], n->in[1], n->dout}, 3, NULL, &packed));
  TPR_CHECK(tpr__grad_take(g, packed, &off, n->in[0]));
  return tpr__grad_take(g, packed, &off, n->in[1]);
}

// dx = sigmoid_bwd(x, dy): the kernel recomputes s from x (no saved output).
TPR__BWD_RULE(sigmoid) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_value_id dx;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_SIGMOID_BWD, (const tpr_value_id[]){n->in[0], n->dout}, 2,
                           NULL, &dx));
  return tpr_grad_add(g, n->in[0], dx);
}

const tpr__grad_def tpr__elementwise_grad[] = {
    {TPR_OP_ADD, bwd_add},
    {TPR_OP_MUL, bwd_mul},
    {TPR_OP_SWIGLU, bwd_swiglu},
    {TPR_OP_SIGMOID, bwd_sigmoid},
    {0},
};
