// Backward rules of rms_norm and of the distributed RMS norm's halves,
// sum_squares and rms_scale.
#include "grad.h"

TPR__BWD_RULE(rms_norm) {
  tpr_op_attrs at = {.n_f = 1, .f = {n->attrs.f[0]}};
  tpr_value_id packed;
  int64_t off = 0;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_RMS_NORM_BWD,
                           (const tpr_value_id[]){n->in[0], n->in[1], n->dout}, 3, &at, &packed));
  TPR_CHECK(tpr__grad_take(g, packed, &off, n->in[0]));
  return tpr__grad_take(g, packed, &off, n->in[1]);
}

// out = sum x^2 over the last dim: dx = 2 x dout (dout (..., 1) broadcasts).
TPR__BWD_RULE(sum_squares) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_program *p = tpr_grad_program(g);
  tpr_value_id t, dx;
  TPR_CHECK(tpr_pb_mul(p, n->in[0], n->dout, &t));
  TPR_CHECK(tpr_pb_scale(p, t, 2.0f, &dx));
  return tpr_grad_add(g, n->in[0], dx);
}

TPR__BWD_RULE(rms_scale) {
  tpr_op_attrs at = {.n_f = 2, .f = {n->attrs.f[0], n->attrs.f[1]}};
  tpr_value_id packed;
  int64_t off = 0;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_RMS_SCALE_BWD,
                           (const tpr_value_id[]){n->in[0], n->in[1], n->in[2], n->dout}, 4, &at, &packed));
  for (int i = 0; i < 3; i++) TPR_CHECK(tpr__grad_take(g, packed, &off, n->in[i]));
  return TPR_OK;
}

const tpr__grad_def tpr__norm_grad[] = {
    {TPR_OP_RMS_NORM, bwd_rms_norm},
    {TPR_OP_SUM_SQUARES, bwd_sum_squares},
    {TPR_OP_RMS_SCALE, bwd_rms_scale},
    {0},
};
