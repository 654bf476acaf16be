// Backward rules of the collective ops and of grad_all_reduce: the f/g pair
// of runtime/program/autodiff.h ("replicated vs partial values").
#include "grad.h"

// Megatron's f: identity forward; the cotangents of the rank-local branches
// are partial, so they are summed over the group.
TPR__BWD_RULE(grad_all_reduce) {
  tpr_program *p = tpr_grad_program(g);
  tpr_value_id d, s;
  TPR_CHECK(tpr_grad_contiguous(g, n->dout, &d));
  TPR_CHECK(tpr_pb_all_reduce(p, d, (tpr_mesh_axis)n->attrs.i[0], (int)n->attrs.i[1], 0 /* sum */, &s));
  return tpr_grad_add(g, n->in[0], s);
}

// Megatron's g: a sum of partials is replicated, and the cotangent of a
// replicated value is already the full gradient on every rank.
TPR__BWD_RULE(all_reduce) {
  if (n->attrs.i[2] != 0)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backward: all_reduce with red op %lld has no gradient (only sum)",
                    (long long)n->attrs.i[2]);
  return tpr_grad_add(g, n->in[0], n->dout);
}

// out (n*m, ...) replicated; this rank's input was block r: its cotangent is
// block r of the (full, replicated) cotangent.
TPR__BWD_RULE(all_gather) {
  tpr_program *p = tpr_grad_program(g);
  tpr_tensor x;
  TPR_CHECK(tpr_program_value(p, n->in[0], &x));
  int64_t parts = n->attrs.i[1], block = tpr_tensor_numel(&x);
  tpr_value_id rank, d, rows, mine;
  TPR_CHECK(tpr_grad_axis_rank(g, (tpr_mesh_axis)n->attrs.i[0], &rank));
  TPR_CHECK(tpr_grad_contiguous(g, n->dout, &d));
  TPR_CHECK(tpr_pb_reshape(p, d, 2, (const int64_t[]){parts, block}, &rows));  // (n, block)
  TPR_CHECK(tpr_pb_row_slice(p, rows, rank, parts, &mine));                    // (1, block)
  TPR_CHECK(tpr_pb_reshape(p, mine, x.ndim, x.shape, &mine));
  return tpr_grad_add(g, n->in[0], mine);
}

// Block r of the sum went to rank r: every rank's input block j gets rank
// j's cotangent.
TPR__BWD_RULE(reduce_scatter) {
  if (n->attrs.i[2] != 0)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backward: reduce_scatter with red op %lld has no gradient (only sum)",
                    (long long)n->attrs.i[2]);
  tpr_value_id d, all;
  TPR_CHECK(tpr_grad_contiguous(g, n->dout, &d));
  TPR_CHECK(tpr_pb_all_gather(tpr_grad_program(g), d, (tpr_mesh_axis)n->attrs.i[0], (int)n->attrs.i[1], &all));
  return tpr_grad_add(g, n->in[0], all);
}

// FSDP: every rank used the whole parameter on its own data, so the
// cotangents differ; each rank's shard gets the sum over ranks of its block
// (a reduce-scatter in f32, whatever the shard's dtype), times the scale.
TPR__BWD_RULE(param_gather) {
  tpr_program *p = tpr_grad_program(g);
  tpr_value_id d, mine;
  TPR_CHECK(tpr_grad_contiguous(g, n->dout, &d));
  TPR_CHECK(tpr_pb_reduce_scatter(p, d, (tpr_mesh_axis)n->attrs.i[0], (int)n->attrs.i[1], 0 /* sum */, &mine));
  if (n->attrs.f[0] != 1.0f) TPR_CHECK(tpr_pb_scale(p, mine, n->attrs.f[0], &mine));
  return tpr_grad_add(g, n->in[0], mine);
}

// A block permutation that is its own inverse.
TPR__BWD_RULE(all_to_all) {
  tpr_value_id d, back;
  TPR_CHECK(tpr_grad_contiguous(g, n->dout, &d));
  TPR_CHECK(tpr_pb_all_to_all(tpr_grad_program(g), d, (tpr_mesh_axis)n->attrs.i[0], (int)n->attrs.i[1], &back));
  return tpr_grad_add(g, n->in[0], back);
}

// The reverse exchange: rows go back with send and receive counts swapped.
TPR__BWD_RULE(all_to_allv) {
  tpr_program *p = tpr_grad_program(g);
  tpr_tensor x;
  TPR_CHECK(tpr_program_value(p, n->in[0], &x));
  tpr_value_id d, back;
  TPR_CHECK(tpr_grad_contiguous(g, n->dout, &d));
  TPR_CHECK(tpr_pb_all_to_allv(p, d, n->in[2], n->in[1], (tpr_mesh_axis)n->attrs.i[0], (int)n->attrs.i[1],
                               x.shape[0], &back));
  return tpr_grad_add(g, n->in[0], back);
}

const tpr__grad_def tpr__collective_grad[] = {
    {TPR_OP_GRAD_ALL_REDUCE, bwd_grad_all_reduce},
    {TPR_OP_ALL_REDUCE, bwd_all_reduce},
    {TPR_OP_ALL_GATHER, bwd_all_gather},
    {TPR_OP_REDUCE_SCATTER, bwd_reduce_scatter},
    {TPR_OP_ALL_TO_ALL, bwd_all_to_all},
    {TPR_OP_ALL_TO_ALLV, bwd_all_to_allv},
    {TPR_OP_PARAM_GATHER, bwd_param_gather},
    {0},
};
