// Backward rule of lightning attention's prefill (ops.h). The decode step
// has none: training runs the prefill (a decode step equals a one-token
// prefill to rounding, so a graph that needs gradients uses that).
#include "grad.h"

// One LIGHTNING_ATTENTION_BWD takes the cotangent of the packed output (d o
// and d final state together) and gives dq | dk | dv | d initial state, each
// unpacked only where wanted. The slopes are constants, as transformers
// keeps them (buffers): a graph asking for their gradient is refused. The
// document form's lo (integers, no cotangent) goes after dout.
TPR__BWD_RULE(lightning_attention) {
  if (tpr_grad_wanted(g, n->in[4]))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "lightning_attention: the slopes are constants; their gradient is not "
                    "implemented");
  bool any = false;
  for (int i = 0; i < 4; i++) any = any || tpr_grad_wanted(g, n->in[i]);
  if (!any) return TPR_OK;
  const bool docs = n->n_in == 6;
  const tpr_value_id in[7] = {n->in[0], n->in[1], n->in[2], n->in[3], n->in[4], n->dout, docs ? n->in[5] : 0};
  tpr_value_id packed;
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_LIGHTNING_ATTENTION_BWD, in, 6 + docs, &n->attrs, &packed));
  int64_t offset = 0;
  for (int i = 0; i < 4; i++) TPR_CHECK(tpr__grad_take(g, packed, &offset, n->in[i]));
  return TPR_OK;
}

const tpr__grad_def tpr__lightning_grad[] = {
    {TPR_OP_LIGHTNING_ATTENTION, bwd_lightning_attention},
    {0},
};
