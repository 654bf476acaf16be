// Shape rules of the collective ops (ops.h): the exec runs them through
// the communicators it was given (no kernel), and grad_all_reduce, the
// identity view whose backward is an all-reduce.
#include <string.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// What a collective does to the leading dim of its input.
typedef enum lead_rule { LEAD_SAME, LEAD_TIMES_N, LEAD_DIV_N, LEAD_DIVISIBLE } lead_rule;

static tpr_status need_collective_attrs(const char *op, const tpr_op_attrs *at, int n_attrs, const char *names) {
  if (at->n_i < n_attrs) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs (%s) attributes, got %d", op, names, at->n_i);
  if ((uint64_t)at->i[0] >= TPR_AXIS_COUNT)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: unknown mesh axis %lld", op, (long long)at->i[0]);
  if (at->i[1] < 1 || at->i[1] > (1 << 24))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: group size %lld out of range", op, (long long)at->i[1]);
  return TPR_OK;
}

// Shared rule of the collective ops: axis, group size, optional reduction,
// a contiguous input, and for gather/scatter a leading dim that fits.
static tpr_status infer_collective(const char *op, const tpr_tensor *x, const tpr_op_attrs *at, bool reduces,
                                   lead_rule lead, tpr_tensor *out) {
  TPR_CHECK(need_collective_attrs(op, at, reduces ? 3 : 2, reduces ? "axis, group size, red op"
                                                                       : "axis, group size"));
  int64_t n = at->i[1];
  if (reduces) {
    if (at->i[2] < 0 || at->i[2] > 2)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: unknown red op %lld", op, (long long)at->i[2]);
    if (x->dtype == TPR_U8 || x->dtype == TPR_F8E4M3)
      return TPR_FAIL(TPR_ERR_DTYPE, "%s: %s is not reducible", op, tpr_dtype_name(x->dtype));
  }
  if (!tpr_tensor_is_contiguous(x))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: input must be contiguous (cast it to a contiguous copy first)", op);
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  if (lead != LEAD_SAME && x->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "%s: input needs a leading dim", op);
  if ((lead == LEAD_DIV_N || lead == LEAD_DIVISIBLE) && x->shape[0] % n)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: leading dim %lld is not divisible by the group size %lld", op,
                    (long long)x->shape[0], (long long)n);
  if (lead == LEAD_TIMES_N) shape[0] = x->shape[0] * n;
  if (lead == LEAD_DIV_N) shape[0] = x->shape[0] / n;
  tpr__set_contiguous(out, x->dtype, x->ndim, shape);
  return TPR_OK;
}

static tpr_status infer_all_reduce(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return infer_collective("all_reduce", in[0], at, true, LEAD_SAME, out);
}

static tpr_status infer_all_gather(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return infer_collective("all_gather", in[0], at, false, LEAD_TIMES_N, out);
}

static tpr_status infer_reduce_scatter(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return infer_collective("reduce_scatter", in[0], at, true, LEAD_DIV_N, out);
}

// The shard (c) of every rank, widened: (n*c) f32.
static tpr_status infer_param_gather(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0];
  TPR_CHECK(need_collective_attrs("param_gather", at, 5, "axis, group size, prefetch group, prefetch, reshard"));
  if (at->n_f < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "param_gather: needs f[0], the gradient scale");
  if (x->dtype != TPR_F32 && x->dtype != TPR_BF16)
    return TPR_FAIL(TPR_ERR_DTYPE, "param_gather: the shard must be f32 or bf16, got %s", tpr_dtype_name(x->dtype));
  if (x->ndim != 1 || !tpr_tensor_is_contiguous(x))
    return TPR_FAIL(TPR_ERR_SHAPE, "param_gather: the shard must be 1-D and contiguous");
  tpr__set_contiguous(out, TPR_F32, 1, (const int64_t[]){x->shape[0] * at->i[1]});
  return TPR_OK;
}

static tpr_status infer_all_to_all(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return infer_collective("all_to_all", in[0], at, false, LEAD_DIVISIBLE, out);
}

// The collective rule (axis, group size, contiguous input, as the other
// collectives) plus the two count vectors of the same (n*m) layout.
TPR__OP_RULE(all_to_allv) {
  const char *op = "all_to_allv";
  const tpr_tensor *x = in[0];
  TPR_CHECK(need_collective_attrs(op, attrs, 3, "axis, group size, rows"));
  int64_t n = attrs->i[1], rows = attrs->i[2];
  if (rows < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: rows = %lld must be >= 0", op, (long long)rows);
  if (x->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "%s: x needs a leading (row) dim", op);
  if (!tpr_tensor_is_contiguous(x))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: x must be contiguous (cast it to a contiguous copy first)", op);
  TPR_CHECK(tpr__need_counts(op, in[1], "send_counts", n, "the group size"));
  TPR_CHECK(tpr__need_counts(op, in[2], "recv_counts", n, "the group size"));
  if (in[1]->shape[0] != in[2]->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: send_counts has %lld entries, recv_counts %lld", op,
                    (long long)in[1]->shape[0], (long long)in[2]->shape[0]);
  // The hook copies the counts to the host as whole tensors.
  if (!tpr_tensor_is_contiguous(in[1]) || !tpr_tensor_is_contiguous(in[2]))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: send_counts and recv_counts must be contiguous", op);
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[0] = rows;
  TPR_CHECK(tpr_shape_check(x->ndim, shape));
  tpr__set_contiguous(out, x->dtype, x->ndim, shape);
  return TPR_OK;
}

TPR__OP_RULE(grad_all_reduce) {
  TPR_CHECK(need_collective_attrs("grad_all_reduce", attrs, 2, "axis, group size"));
  *out = *in[0];  // an identity view: same geometry over the same memory
  out->storage = NULL;
  return TPR_OK;
}

const tpr__op_def tpr__collective_ops[] = {
    {TPR_OP_ALL_REDUCE, "all_reduce", 1, false, infer_all_reduce},
    {TPR_OP_ALL_GATHER, "all_gather", 1, false, infer_all_gather},
    {TPR_OP_REDUCE_SCATTER, "reduce_scatter", 1, false, infer_reduce_scatter},
    {TPR_OP_ALL_TO_ALL, "all_to_all", 1, false, infer_all_to_all},
    {TPR_OP_ALL_TO_ALLV, "all_to_allv", 3, false, infer_all_to_allv},
    {TPR_OP_PARAM_GATHER, "param_gather", 1, false, infer_param_gather},
    {TPR_OP_GRAD_ALL_REDUCE, "grad_all_reduce", 1, true, infer_grad_all_reduce},
    {0},
};
