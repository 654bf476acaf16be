// Backward rules of the losses. Cross-entropy: xent_max has none and needs
// none: its output feeds only xent_sumexp and xent_loss (through an
// all_reduce max under tp), whose rules never give the max a cotangent, so
// the autodiff never visits it.
#include "grad.h"

static tpr_op_attrs one_attr(int64_t v) { return (tpr_op_attrs){.n_i = 1, .i = {v}}; }

TPR__BWD_RULE(xent_sumexp) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_value_id dl;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_XENT_SUMEXP_BWD,
                           (const tpr_value_id[]){n->in[0], n->in[1], n->in[2], n->dout}, 4, &n->attrs, &dl));
  return tpr_grad_add(g, n->in[0], dl);
}

TPR__BWD_RULE(xent_target) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_program *p = tpr_grad_program(g);
  tpr_tensor l;
  TPR_CHECK(tpr_program_value(p, n->in[0], &l));
  tpr_op_attrs at = one_attr(l.shape[1]);
  tpr_value_id dl;
  TPR_CHECK(tpr_program_op(p, TPR_OP_XENT_TARGET_BWD, (const tpr_value_id[]){n->dout, n->in[1], n->in[2]}, 3, &at,
                           &dl));
  return tpr_grad_add(g, n->in[0], dl);
}

// in (sumexp, max, target, targets): cotangents for sumexp and target only.
TPR__BWD_RULE(xent_loss) {
  if (!tpr_grad_wanted(g, n->in[0]) && !tpr_grad_wanted(g, n->in[2])) return TPR_OK;
  tpr_value_id packed, dse, dtg;
  int64_t off = 0;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_XENT_LOSS_BWD,
                           (const tpr_value_id[]){n->in[0], n->in[3], n->dout}, 3, NULL, &packed));
  TPR_CHECK(tpr_grad_unpack(g, packed, &off, n->in[0], &dse));
  TPR_CHECK(tpr_grad_unpack(g, packed, &off, n->in[2], &dtg));
  TPR_CHECK(tpr_grad_add(g, n->in[0], dse));
  return tpr_grad_add(g, n->in[2], dtg);
}

// The MoE auxiliary loss.

TPR__BWD_RULE(moe_aux_stats) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_value_id dl;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_MOE_AUX_STATS_BWD, (const tpr_value_id[]){n->in[0], n->dout},
                           2, &n->attrs, &dl));
  return tpr_grad_add(g, n->in[0], dl);
}

TPR__BWD_RULE(moe_aux_loss) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_value_id ds;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_MOE_AUX_LOSS_BWD, (const tpr_value_id[]){n->in[0], n->dout},
                           2, &n->attrs, &ds));
  return tpr_grad_add(g, n->in[0], ds);
}

const tpr__grad_def tpr__loss_grad[] = {
    {TPR_OP_XENT_SUMEXP, bwd_xent_sumexp},
    {TPR_OP_XENT_TARGET, bwd_xent_target},
    {TPR_OP_XENT_LOSS, bwd_xent_loss},
    {TPR_OP_MOE_AUX_STATS, bwd_moe_aux_stats},
    {TPR_OP_MOE_AUX_LOSS, bwd_moe_aux_loss},
    {0},
};
