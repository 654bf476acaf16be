// Backward rule of attention over a KV cache (the cache write has none:
// the cache is state, not a value on the loss's path).
#include "grad.h"

// One ATTENTION_BWD gives all three cotangents; each is unpacked (a view)
// only where wanted. start (and the document form's lo, which the backward
// takes after dout) are integers: no cotangent.
TPR__BWD_RULE(attention) {
  const bool want[3] = {tpr_grad_wanted(g, n->in[0]), tpr_grad_wanted(g, n->in[1]), tpr_grad_wanted(g, n->in[2])};
  if (!want[0] && !want[1] && !want[2]) return TPR_OK;
  tpr_value_id packed;
  const bool docs = n->n_in == 5;
  const tpr_value_id in[6] = {n->in[0], n->in[1], n->in[2], n->in[3], n->dout, docs ? n->in[4] : 0};
  TPR_CHECK(tpr_program_op(tpr_grad_program(g), TPR_OP_ATTENTION_BWD, in, 5 + docs, &n->attrs, &packed));
  int64_t offset = 0;
  for (int i = 0; i < 3; i++) TPR_CHECK(tpr__grad_take(g, packed, &offset, n->in[i]));
  return TPR_OK;
}

const tpr__grad_def tpr__attention_grad[] = {
    {TPR_OP_ATTENTION, bwd_attention},
    {0},
};
