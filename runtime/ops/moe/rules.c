// Shape rules of the MoE ops (ops.h): the SwiGLU experts with dense gates
// (moe_experts), and expert parallelism: capacity mode, row_slice, the
// alltoall dispatcher's local ops (moe_counts, moe_permute, moe_grouped_ffn,
// moe_unpermute; all_to_allv is a collective). Rules check everything the
// descriptors and attributes tell; what depends on tensor contents (counts,
// part) is checked by the kernels.
#include <math.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// A 2-D f32 routing tensor: gates (N, E).
static tpr_status need_gates(const char *op, const tpr_tensor *g) {
  TPR_CHECK(tpr__need_dtype(op, g, TPR_F32, "gates"));
  return tpr__need_ndim(op, g, 2, "gates", "(N, E)");
}

// The experts' w13 and w2: one weight dtype (or both FP8).
static tpr_status need_expert_dtypes(const char *op, const tpr_tensor *w13, const tpr_tensor *w2) {
  if (w13->dtype == TPR_F8E4M3 && w2->dtype == TPR_F8E4M3) return TPR_OK;  // the FP8 form checks the scales
  TPR_CHECK(tpr__need_weight_dtype(op, w13, "w13"));
  if (w2->dtype != w13->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: w2 is %s, w13 %s; the experts need one dtype", op, tpr_dtype_name(w2->dtype),
                    tpr_dtype_name(w13->dtype));
  return TPR_OK;
}

// The expert ops' scales (in[4], in[5]) in their FP8 form; FP8 weights
// without it are TPR_ERR_DTYPE.
static tpr_status need_expert_scales(const char *op, const tpr_tensor *const *in, const tpr_op_attrs *at) {
  int block = tpr__fp8_block_attr(TPR_OP_MOE_EXPERTS, at);  // both expert ops keep it in i[0]
  if (block <= 0) {
    if (in[2]->dtype == TPR_F8E4M3 || in[3]->dtype == TPR_F8E4M3)
      return TPR_FAIL(TPR_ERR_DTYPE, "%s: FP8 experts need the FP8 form (a scale block and the scales)", op);
    return TPR_OK;
  }
  TPR_CHECK(tpr__need_fp8_weight(op, in[2], in[4], block, "w13"));
  return tpr__need_fp8_weight(op, in[3], in[5], block, "w2");
}

// w13 (E, 2F, H) and w2 (E, H, F) of the 3-D weights: E experts, the
// gates' count for moe_experts; for moe_grouped_ffn (E < 0) the local
// experts Er w13 holds, at least one.
static tpr_status need_expert_shapes(const char *op, const tpr_tensor *w13, const tpr_tensor *w2, int64_t E,
                                     int64_t H) {
  const bool local = E < 0;
  const int64_t F2 = w13->shape[1];
  if (local) {
    E = w13->shape[0];
    if (E < 1 || F2 % 2 || w13->shape[2] != H)
      return TPR_FAIL(TPR_ERR_SHAPE, "%s: w13 is (%lld, %lld, %lld); expected (Er >= 1, 2F even, H = %lld)", op,
                      (long long)E, (long long)F2, (long long)w13->shape[2], (long long)H);
  } else if (w13->shape[0] != E || F2 % 2 || w13->shape[2] != H) {
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: w13 is (%lld, %lld, %lld); expected (E = %lld, 2F even, H = %lld)", op,
                    (long long)w13->shape[0], (long long)F2, (long long)w13->shape[2], (long long)E, (long long)H);
  }
  if (w2->shape[0] != E || w2->shape[1] != H || w2->shape[2] != F2 / 2)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: w2 is (%lld, %lld, %lld); expected (%s = %lld, H = %lld, F = %lld)", op,
                    (long long)w2->shape[0], (long long)w2->shape[1], (long long)w2->shape[2], local ? "Er" : "E",
                    (long long)E, (long long)H, (long long)(F2 / 2));
  return TPR_OK;
}

static tpr_status infer_moe_experts(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0], *g = in[1], *w13 = in[2], *w2 = in[3];
  const char *op = "moe_experts";
  TPR_CHECK(tpr__need_dtype(op, x, TPR_F32, "x"));
  TPR_CHECK(tpr__need_dtype(op, g, TPR_F32, "gates"));
  TPR_CHECK(need_expert_dtypes(op, w13, w2));
  TPR_CHECK(need_expert_scales(op, in, at));
  TPR_CHECK(tpr__need_ndim(op, x, 2, "x", "(T, H)"));
  TPR_CHECK(tpr__need_ndim(op, g, 2, "gates", "(T, E)"));
  TPR_CHECK(tpr__need_ndim(op, w13, 3, "w13", "(E, 2F, H)"));
  TPR_CHECK(tpr__need_ndim(op, w2, 3, "w2", "(E, H, F)"));
  if (g->shape[0] != x->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: gates have %lld rows, x has T = %lld", op, (long long)g->shape[0],
                    (long long)x->shape[0]);
  TPR_CHECK(need_expert_shapes(op, w13, w2, g->shape[1], x->shape[1]));
  tpr__set_contiguous(out, TPR_F32, 2, x->shape);
  return TPR_OK;
}

TPR__OP_RULE(moe_capacity) {
  const char *op = "moe_capacity";
  const tpr_tensor *g = in[0];
  TPR_CHECK(need_gates(op, g));
  int64_t E = g->shape[1];
  if (attrs->n_i < 3 || attrs->n_f < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs i[0] top_k, i[1] reroute, i[2] seed and f[0] factor (got %d int "
                    "and %d float attrs)", op, attrs->n_i, attrs->n_f);
  if (attrs->i[0] < 1 || attrs->i[0] > E)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: top_k = %lld must be in [1, E = %lld]", op, (long long)attrs->i[0],
                    (long long)E);
  if (attrs->i[1] != 0 && attrs->i[1] != 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: reroute = %lld must be 0 or 1", op, (long long)attrs->i[1]);
  if (!(attrs->f[0] > 0) || !isfinite(attrs->f[0]))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: capacity factor %g must be finite and > 0", op, (double)attrs->f[0]);
  tpr__set_contiguous(out, TPR_F32, 2, g->shape);
  return TPR_OK;
}

TPR__OP_RULE(row_slice) {
  const char *op = "row_slice";
  const tpr_tensor *x = in[0], *part = in[1];
  TPR_CHECK(tpr__need_ndim(op, x, 2, "x", "(T, C)"));
  TPR_CHECK(tpr__need_scalar_index(op, part, "part"));
  if (attrs->n_i < 1 || attrs->i[0] < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: parts n = %lld must be >= 1", op,
                    (long long)(attrs->n_i < 1 ? 0 : attrs->i[0]));
  int64_t n = attrs->i[0], shape[2] = {x->shape[0] / n + (x->shape[0] % n != 0), x->shape[1]};
  tpr__set_contiguous(out, x->dtype, 2, shape);
  return TPR_OK;
}

TPR__OP_RULE(moe_counts) {
  TPR_CHECK(need_gates("moe_counts", in[0]));
  tpr__set_contiguous(out, TPR_I32, 1, &in[0]->shape[1]);
  return TPR_OK;
}

TPR__OP_RULE(moe_permute) {
  const char *op = "moe_permute";
  const tpr_tensor *x = in[0], *g = in[1];
  TPR_CHECK(tpr__need_dtype(op, x, TPR_F32, "x"));
  TPR_CHECK(tpr__need_ndim(op, x, 2, "x", "(N, H)"));
  TPR_CHECK(need_gates(op, g));
  if (g->shape[0] != x->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: gates have %lld rows, x has N = %lld", op, (long long)g->shape[0],
                    (long long)x->shape[0]);
  if (attrs->n_i < 1 || attrs->i[0] < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: rows R = %lld must be given and >= 0", op,
                    (long long)(attrs->n_i < 1 ? -1 : attrs->i[0]));
  const int64_t shape[2] = {attrs->i[0], x->shape[1]};
  TPR_CHECK(tpr_shape_check(2, shape));
  tpr__set_contiguous(out, TPR_F32, 2, shape);
  return TPR_OK;
}

TPR__OP_RULE(moe_grouped_ffn) {
  const char *op = "moe_grouped_ffn";
  const tpr_tensor *x = in[0], *c = in[1], *w13 = in[2], *w2 = in[3];
  TPR_CHECK(tpr__need_dtype(op, x, TPR_F32, "x"));
  TPR_CHECK(need_expert_dtypes(op, w13, w2));
  TPR_CHECK(need_expert_scales(op, in, attrs));
  TPR_CHECK(tpr__need_ndim(op, x, 2, "x", "(R, H)"));
  TPR_CHECK(tpr__need_ndim(op, w13, 3, "w13", "(Er, 2F, H)"));
  TPR_CHECK(tpr__need_ndim(op, w2, 3, "w2", "(Er, H, F)"));
  TPR_CHECK(need_expert_shapes(op, w13, w2, -1, x->shape[1]));
  // counts (n*Er): n source blocks, one count per local expert each.
  TPR_CHECK(tpr__need_counts(op, c, "counts", w13->shape[0], "w13's expert count Er"));
  tpr__set_contiguous(out, TPR_F32, 2, x->shape);
  return TPR_OK;
}

TPR__OP_RULE(moe_unpermute) {
  const char *op = "moe_unpermute";
  const tpr_tensor *y = in[0], *g = in[1];
  TPR_CHECK(tpr__need_dtype(op, y, TPR_F32, "y"));
  TPR_CHECK(tpr__need_ndim(op, y, 2, "y", "(R, H)"));
  TPR_CHECK(need_gates(op, g));
  const int64_t shape[2] = {g->shape[0], y->shape[1]};
  tpr__set_contiguous(out, TPR_F32, 2, shape);
  return TPR_OK;
}

const tpr__op_def tpr__moe_ops[] = {
    {TPR_OP_MOE_EXPERTS, "moe_experts", 4, false, infer_moe_experts},
    {TPR_OP_MOE_CAPACITY, "moe_capacity", 1, false, infer_moe_capacity},
    {TPR_OP_ROW_SLICE, "row_slice", 2, false, infer_row_slice},
    {TPR_OP_MOE_COUNTS, "moe_counts", 1, false, infer_moe_counts},
    {TPR_OP_MOE_PERMUTE, "moe_permute", 2, false, infer_moe_permute},
    {TPR_OP_MOE_GROUPED_FFN, "moe_grouped_ffn", 4, false, infer_moe_grouped_ffn},
    {TPR_OP_MOE_UNPERMUTE, "moe_unpermute", 2, false, infer_moe_unpermute},
    {0},
};
