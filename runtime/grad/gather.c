// Backward rules of the gathers: their cotangents scatter-add back; ids and
// indices get none.
#include "grad.h"

// The table (in[0]) gets dout's rows scatter-added at the ids (in[1]; and
// in[2], the shard, for the vocab-parallel embedding, whose table gets only
// its own ids' rows) by op `bwd`, which is told the table's row count.
static tpr_status table_rule(tpr_grad_ctx *g, const tpr_grad_node *n, tpr_op_kind bwd) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_program *p = tpr_grad_program(g);
  tpr_tensor t;
  TPR_CHECK(tpr_program_value(p, n->in[0], &t));
  tpr_op_attrs at = {.n_i = 1, .i = {t.shape[0]}};
  const tpr_value_id in[3] = {n->dout, n->in[1], n->in[2]};
  tpr_value_id d;
  TPR_CHECK(tpr_program_op(p, bwd, in, n->n_in, &at, &d));
  return tpr_grad_add(g, n->in[0], d);
}

TPR__BWD_RULE(embedding) { return table_rule(g, n, TPR_OP_EMBEDDING_BWD); }

TPR__BWD_RULE(embedding_shard) { return table_rule(g, n, TPR_OP_EMBEDDING_SHARD_BWD); }

// Selecting a rank's slice with the rank tensor (the QK-norm weight): the
// cotangent lands only in the selected slices of the full tensor.
TPR__BWD_RULE(index_select) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_program *p = tpr_grad_program(g);
  tpr_tensor x;
  TPR_CHECK(tpr_program_value(p, n->in[0], &x));
  int64_t dim = n->attrs.i[0];
  tpr_op_attrs at = {.n_i = 2, .i = {dim, x.shape[dim]}};
  tpr_value_id d;
  TPR_CHECK(tpr_program_op(p, TPR_OP_INDEX_SELECT_BWD, (const tpr_value_id[]){n->dout, n->in[1]}, 2, &at, &d));
  return tpr_grad_add(g, n->in[0], d);
}

const tpr__grad_def tpr__gather_grad[] = {
    {TPR_OP_EMBEDDING, bwd_embedding},
    {TPR_OP_EMBEDDING_SHARD, bwd_embedding_shard},
    {TPR_OP_INDEX_SELECT, bwd_index_select},
    {0},
};
