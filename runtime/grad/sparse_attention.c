// Backward rule of InfLLM-v2 sparse attention's training form
// (tpr_pb_sparse_attention): one SPARSE_ATTENTION_BWD gives dq, dk and dv,
// each unpacked (a view) only where wanted. The block selection is
// recomputed by the backward kernel and has no cotangent (program.h).
#include "grad.h"

TPR__BWD_RULE(sparse_attention) {
  const bool want[3] = {tpr_grad_wanted(g, n->in[0]), tpr_grad_wanted(g, n->in[1]), tpr_grad_wanted(g, n->in[2])};
  if (!want[0] && !want[1] && !want[2]) return TPR_OK;
  tpr_value_id packed;
  const tpr_value_id in[4] = {n->in[0], n->in[1], n->in[2], n->dout};
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_SPARSE_ATTENTION_BWD, in, 4, &n->attrs, &packed));
  int64_t offset = 0;
  for (int i = 0; i < 3; i++) TPR_CHECK(tpr__grad_take(g, packed, &offset, n->in[i]));
  return TPR_OK;
}

const tpr__grad_def tpr__sparse_attention_grad[] = {
    {TPR_OP_SPARSE_ATTENTION, bwd_sparse_attention},
    {0},
};
