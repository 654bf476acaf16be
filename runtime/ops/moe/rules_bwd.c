// Shape rules of the MoE backward ops (ops.h, "Training"). Each checks the
// forward's inputs with the forward's own rule (so the two can never
// disagree on what a valid forward is), then the cotangent against the
// forward's output, and gives the packed or plain result's shape. What
// depends on tensor contents (counts, part) is checked by the kernels.
#include <stdio.h>
#include <string.h>

#include "runtime/ops/rule_checks.h"

// Runs forward op `fwd`'s rule on in[0..n) into *y; a failure is re-raised
// naming the backward op too.
static tpr_status forward_rule(const char *op, tpr_op_kind fwd, const tpr_tensor *const *in, int n,
                               const tpr_op_attrs *attrs, tpr_tensor *y) {
  tpr_status rc = tpr__op_infer(fwd, in, n, attrs, y);
  if (rc == TPR_OK) return TPR_OK;
  char why[512];
  snprintf(why, sizeof why, "%s", tpr_last_error());
  return TPR_FAIL(rc, "%s: the forward's inputs do not fit: %s", op, why);
}

// A cotangent: f32 with exactly `like`'s shape.
static tpr_status need_like(const char *op, const tpr_tensor *d, const tpr_tensor *like, const char *which) {
  TPR_CHECK(tpr__need_dtype(op, d, TPR_F32, which));
  if (!tpr_tensor_same_shape(d, like)) {
    char w[128], g[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must be %s, got %s", op, which, tpr_tensor_describe(like, w, sizeof w),
                    tpr_tensor_describe(d, g, sizeof g));
  }
  return TPR_OK;
}

static void set_packed(tpr_tensor *out, int64_t n) { tpr__set_contiguous(out, TPR_F32, 1, &n); }

static int64_t numel(const tpr_tensor *t) { return tpr_tensor_numel(t); }

TPR__OP_RULE(router_sigmoid_topk_bwd) {
  const char *op = "router_sigmoid_topk_bwd";
  tpr_tensor y;
  TPR_CHECK(forward_rule(op, TPR_OP_ROUTER_SIGMOID_TOPK, in, 2, attrs, &y));
  TPR_CHECK(need_like(op, in[2], &y, "dy"));
  tpr__set_contiguous(out, TPR_F32, 2, y.shape);
  return TPR_OK;
}

TPR__OP_RULE(moe_experts_bwd) {
  const char *op = "moe_experts_bwd";
  tpr_tensor y;
  TPR_CHECK(forward_rule(op, TPR_OP_MOE_EXPERTS, in, 4, attrs, &y));
  TPR_CHECK(need_like(op, in[4], &y, "dy"));
  set_packed(out, numel(in[0]) + numel(in[1]) + numel(in[2]) + numel(in[3]));  // dx | dgates | dw13 | dw2
  return TPR_OK;
}

TPR__OP_RULE(moe_grouped_ffn_bwd) {
  const char *op = "moe_grouped_ffn_bwd";
  tpr_tensor y;
  TPR_CHECK(forward_rule(op, TPR_OP_MOE_GROUPED_FFN, in, 4, attrs, &y));
  TPR_CHECK(need_like(op, in[4], &y, "dy"));
  set_packed(out, numel(in[0]) + numel(in[2]) + numel(in[3]));  // dx | dw13 | dw2
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
  TPR_CHECK(forward_rule(op, TPR_OP_MOE_UNPERMUTE, in, 2, attrs, &y));
  TPR_CHECK(need_like(op, in[2], &y, "dout"));
  set_packed(out, numel(in[0]) + numel(in[1]));  // dy | dgates
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
  TPR_CHECK(forward_rule(op, TPR_OP_MOE_CAPACITY, in, 1, attrs, &y));
  TPR_CHECK(need_like(op, in[1], &y, "dout"));
  tpr__set_contiguous(out, TPR_F32, 2, y.shape);
  return TPR_OK;
}
