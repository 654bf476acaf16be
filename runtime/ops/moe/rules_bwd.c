// Shape rules of the MoE backward ops (ops.h, "Training"). Each checks the
// forward's inputs with the forward's own rule (so the two can never
// disagree on what a valid forward is), then the cotangent against the
// forward's output, and gives the packed or plain result's shape. What
// depends on tensor contents (counts, part) is checked by the kernels.
#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

static int64_t numel(const tpr_tensor *t) { return tpr_tensor_numel(t); }

TPR__OP_RULE(moe_experts_bwd) {
  const char *op = "moe_experts_bwd";
  tpr_tensor y;
  TPR_CHECK(tpr__need_forward(op, TPR_OP_MOE_EXPERTS, in, 4, attrs, &y));
  TPR_CHECK(tpr__need_like(op, in[4], &y, "dy"));
  tpr__set_packed(out, numel(in[0]) + numel(in[1]) + numel(in[2]) + numel(in[3]));  // dx | dgates | dw13 | dw2
  return TPR_OK;
}

TPR__OP_RULE(moe_grouped_ffn_bwd) {
  const char *op = "moe_grouped_ffn_bwd";
  tpr_tensor y;
  TPR_CHECK(tpr__need_forward(op, TPR_OP_MOE_GROUPED_FFN, in, 4, attrs, &y));
  TPR_CHECK(tpr__need_like(op, in[4], &y, "dy"));
  tpr__set_packed(out, numel(in[0]) + numel(in[2]) + numel(in[3]));  // dx | dw13 | dw2
  return TPR_OK;
}

TPR__OP_RULE(moe_permute_bwd) {
  const char *op = "moe_permute_bwd";
  const tpr_tensor *dy = in[0], *g = in[1];
  TPR_CHECK(tpr__need_dtype(op, dy, TPR_F32, "dy"));
  TPR_CHECK(tpr__need_ndim(op, dy, 2, "dy", "(R, H)"));
  TPR_CHECK(tpr__need_dtype(op, g, TPR_F32, "gates"));
  TPR_CHECK(tpr__need_ndim(op, g, 2, "gates", "(N, E)"));
  const int64_t shape[2] = {g->shape[0], dy->shape[1]};
  tpr__set_contiguous(out, TPR_F32, 2, shape);
  return TPR_OK;
}

TPR__OP_RULE(moe_unpermute_bwd) {
  const char *op = "moe_unpermute_bwd";
  tpr_tensor y;
  TPR_CHECK(tpr__need_forward(op, TPR_OP_MOE_UNPERMUTE, in, 2, attrs, &y));
  TPR_CHECK(tpr__need_like(op, in[2], &y, "dout"));
  tpr__set_packed(out, numel(in[0]) + numel(in[1]));  // dy | dgates
  return TPR_OK;
}

TPR__OP_RULE(row_slice_bwd) {
  const char *op = "row_slice_bwd";
  const tpr_tensor *dy = in[0];
  TPR_CHECK(tpr__need_dtype(op, dy, TPR_F32, "dy"));
  TPR_CHECK(tpr__need_ndim(op, dy, 2, "dy", "(Ts, C)"));
  TPR_CHECK(tpr__need_scalar_index(op, in[1], "part"));
  if (attrs->n_i < 2 || attrs->i[0] < 1 || attrs->i[1] < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs i[0] parts n >= 1 and i[1] rows T >= 0 (got %d int attrs)", op,
                    attrs->n_i);
  const int64_t n = attrs->i[0], T = attrs->i[1], Ts = T / n + (T % n != 0);
  if (dy->shape[0] != Ts)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: dy has %lld rows; row_slice of T = %lld rows in n = %lld parts gives "
                    "ceil(T/n) = %lld", op, (long long)dy->shape[0], (long long)T, (long long)n, (long long)Ts);
  const int64_t shape[2] = {T, dy->shape[1]};
  TPR_CHECK(tpr_shape_check(2, shape));
  tpr__set_contiguous(out, TPR_F32, 2, shape);
  return TPR_OK;
}

TPR__OP_RULE(moe_capacity_bwd) {
  const char *op = "moe_capacity_bwd";
  tpr_tensor y;
  TPR_CHECK(tpr__need_forward(op, TPR_OP_MOE_CAPACITY, in, 1, attrs, &y));
  TPR_CHECK(tpr__need_like(op, in[1], &y, "dout"));
  tpr__set_contiguous(out, TPR_F32, 2, y.shape);
  return TPR_OK;
}

const tpr__op_def tpr__moe_bwd_ops[] = {
    {TPR_OP_MOE_EXPERTS_BWD, "moe_experts_bwd", 5, false, infer_moe_experts_bwd},
    {TPR_OP_MOE_GROUPED_FFN_BWD, "moe_grouped_ffn_bwd", 5, false, infer_moe_grouped_ffn_bwd},
    {TPR_OP_MOE_PERMUTE_BWD, "moe_permute_bwd", 2, false, infer_moe_permute_bwd},
    {TPR_OP_MOE_UNPERMUTE_BWD, "moe_unpermute_bwd", 3, false, infer_moe_unpermute_bwd},
    {TPR_OP_ROW_SLICE_BWD, "row_slice_bwd", 2, false, infer_row_slice_bwd},
    {TPR_OP_MOE_CAPACITY_BWD, "moe_capacity_bwd", 2, false, infer_moe_capacity_bwd},
    {0},
};
