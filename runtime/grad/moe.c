// Backward rules of the MoE ops. The expert FFNs: one fused op each, its
// packed results taken apart.
#include "grad.h"

// in[0..3] of the forward plus dout; results after dx (and dgates) are
// w13's and w2's cotangents, handed to whichever inputs want them.
static tpr_status ffn_rule(tpr_grad_ctx *g, const tpr_grad_node *n, tpr_op_kind bwd, bool has_gates) {
  bool any = false;
  for (int i = 0; i < 4; i++) any = any || (tpr_grad_wanted(g, n->in[i]) && (i != 1 || has_gates));
  if (!any) return TPR_OK;
  const tpr_value_id in[5] = {n->in[0], n->in[1], n->in[2], n->in[3], n->dout};
  tpr_value_id packed;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), bwd, in, 5, NULL, &packed));
  int64_t off = 0;
  for (int i = 0; i < 4; i++)
    if (i != 1 || has_gates) TPR_CHECK(tpr__grad_take(g, packed, &off, n->in[i]));  // counts: no cotangent
  return TPR_OK;
}

TPR__BWD_RULE(moe_experts) { return ffn_rule(g, n, TPR_OP_MOE_EXPERTS_BWD, true); }

TPR__BWD_RULE(moe_grouped_ffn) { return ffn_rule(g, n, TPR_OP_MOE_GROUPED_FFN_BWD, false); }

// Expert parallelism.

// Only the gates' values flow on: the decision is piecewise constant.
TPR__BWD_RULE(moe_capacity) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  const tpr_value_id in[2] = {n->in[0], n->dout};
  tpr_value_id d;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_MOE_CAPACITY_BWD, in, 2, &n->attrs, &d));
  return tpr_grad_add(g, n->in[0], d);
}

// part is an integer: only x gets a cotangent, its T rows given explicitly
// (Ts = ceil(T/n) does not determine T).
TPR__BWD_RULE(row_slice) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_program *p = tpr_grad_program(g);
  tpr_tensor x;
  TPR_CHECK(tpr_program_value(p, n->in[0], &x));
  const tpr_op_attrs at = {.n_i = 2, .i = {n->attrs.i[0], x.shape[0]}};
  const tpr_value_id in[2] = {n->dout, n->in[1]};
  tpr_value_id d;
  TPR_CHECK(tpr_program_op(p, TPR_OP_ROW_SLICE_BWD, in, 2, &at, &d));
  return tpr_grad_add(g, n->in[0], d);
}

// The gates only choose rows here: x alone gets a cotangent.
TPR__BWD_RULE(moe_permute) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  const tpr_value_id in[2] = {n->dout, n->in[1]};
  tpr_value_id d;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_MOE_PERMUTE_BWD, in, 2, NULL, &d));
  return tpr_grad_add(g, n->in[0], d);
}

TPR__BWD_RULE(moe_unpermute) {
  const bool want_y = tpr_grad_wanted(g, n->in[0]), want_g = tpr_grad_wanted(g, n->in[1]);
  if (!want_y && !want_g) return TPR_OK;
  tpr_program *p = tpr_grad_program(g);
  const tpr_value_id in[3] = {n->in[0], n->in[1], n->dout};
  tpr_value_id packed, dy, dg;
  TPR_CHECK(tpr_program_op(p, TPR_OP_MOE_UNPERMUTE_BWD, in, 3, NULL, &packed));
  int64_t off = 0;
  TPR_CHECK(tpr_grad_unpack(g, packed, &off, n->in[0], &dy));
  if (want_y) TPR_CHECK(tpr_grad_add(g, n->in[0], dy));
  if (!want_g) return TPR_OK;
  TPR_CHECK(tpr_grad_unpack(g, packed, &off, n->in[1], &dg));
  return tpr_grad_add(g, n->in[1], dg);
}

const tpr__grad_def tpr__moe_grad[] = {
    {TPR_OP_MOE_EXPERTS, bwd_moe_experts},
    {TPR_OP_MOE_GROUPED_FFN, bwd_moe_grouped_ffn},
    {TPR_OP_MOE_CAPACITY, bwd_moe_capacity},
    {TPR_OP_ROW_SLICE, bwd_row_slice},
    {TPR_OP_MOE_PERMUTE, bwd_moe_permute},
    {TPR_OP_MOE_UNPERMUTE, bwd_moe_unpermute},
    {0},
};
