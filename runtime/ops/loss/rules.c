// Shape rules of the training losses (ops.h, "Vocab-parallel cross-entropy"
// and "MoE auxiliary"); their program builders are runtime/program/loss.c.
// Rules check what the descriptors and attributes tell; target values and
// the shard index are checked by the kernels at run time.
#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// logits (T, Vl) f32, this rank's vocab shard (or router logits (T, E)).
static tpr_status need_logits(const char *op, const tpr_tensor *t, const char *dims) {
  TPR_CHECK(tpr__need_dtype(op, t, TPR_F32, "logits"));
  TPR_CHECK(tpr__need_ndim(op, t, 2, "logits", dims));
  if (t->shape[1] < 1) return TPR_FAIL(TPR_ERR_SHAPE, "%s: logits %s have no columns", op, dims);
  return TPR_OK;
}

// A per-token column (T, 1) f32: max, sumexp, target logit or their cotangent.
static tpr_status need_col(const char *op, const tpr_tensor *t, int64_t T, const char *which) {
  TPR_CHECK(tpr__need_dtype(op, t, TPR_F32, which));
  if (t->ndim != 2 || t->shape[0] != T || t->shape[1] != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must be (T, 1) = (%lld, 1), got %d-D (%lld, %lld)", op, which,
                    (long long)T, t->ndim, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : -1));
  return TPR_OK;
}

// targets (T) i32/i64: token ids, -100 for ignored positions.
static tpr_status need_targets(const char *op, const tpr_tensor *t, int64_t T) {
  if (t->dtype != TPR_I32 && t->dtype != TPR_I64)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: targets must be i32 or i64, got %s", op, tpr_dtype_name(t->dtype));
  if (t->ndim != 1 || t->shape[0] != T)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: targets must be (T) = (%lld), got %d-D with %lld elements", op, (long long)T,
                    t->ndim, (long long)tpr_tensor_numel(t));
  return TPR_OK;
}

// i[0] = a positive size attribute (V, Vl, k or N), named `what`.
static tpr_status need_size_attr(const char *op, const tpr_op_attrs *at, const char *what) {
  if (at->n_i < 1 || at->i[0] < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: i[0] %s = %lld must be given and >= 1", op, what,
                    (long long)(at->n_i < 1 ? 0 : at->i[0]));
  return TPR_OK;
}

static void set_col(tpr_tensor *out, int64_t T) { tpr__set_contiguous(out, TPR_F32, 2, (const int64_t[]){T, 1}); }

TPR__OP_RULE(xent_max) {
  const char *op = "xent_max";
  TPR_CHECK(need_logits(op, in[0], "(T, Vl)"));
  TPR_CHECK(tpr__need_scalar_index(op, in[1], "shard"));
  TPR_CHECK(need_size_attr(op, attrs, "V (real vocabulary)"));
  set_col(out, in[0]->shape[0]);
  return TPR_OK;
}

TPR__OP_RULE(xent_sumexp) {
  const char *op = "xent_sumexp";
  TPR_CHECK(need_logits(op, in[0], "(T, Vl)"));
  TPR_CHECK(need_col(op, in[1], in[0]->shape[0], "max"));
  TPR_CHECK(tpr__need_scalar_index(op, in[2], "shard"));
  TPR_CHECK(need_size_attr(op, attrs, "V (real vocabulary)"));
  set_col(out, in[0]->shape[0]);
  return TPR_OK;
}

TPR__OP_RULE(xent_sumexp_bwd) {
  const char *op = "xent_sumexp_bwd";
  TPR_CHECK(need_logits(op, in[0], "(T, Vl)"));
  TPR_CHECK(need_col(op, in[1], in[0]->shape[0], "max"));
  TPR_CHECK(tpr__need_scalar_index(op, in[2], "shard"));
  TPR_CHECK(need_col(op, in[3], in[0]->shape[0], "dy"));
  TPR_CHECK(need_size_attr(op, attrs, "V (real vocabulary)"));
  tpr__set_contiguous(out, TPR_F32, 2, in[0]->shape);
  return TPR_OK;
}

TPR__OP_RULE(xent_target) {
  const char *op = "xent_target";
  TPR_CHECK(need_logits(op, in[0], "(T, Vl)"));
  TPR_CHECK(need_targets(op, in[1], in[0]->shape[0]));
  TPR_CHECK(tpr__need_scalar_index(op, in[2], "shard"));
  TPR_CHECK(need_size_attr(op, attrs, "V (real vocabulary)"));
  set_col(out, in[0]->shape[0]);
  return TPR_OK;
}

TPR__OP_RULE(xent_target_bwd) {
  const char *op = "xent_target_bwd";
  TPR_CHECK(tpr__need_dtype(op, in[0], TPR_F32, "dy"));
  TPR_CHECK(tpr__need_ndim(op, in[0], 2, "dy", "(T, 1)"));
  int64_t T = in[0]->shape[0];
  TPR_CHECK(need_col(op, in[0], T, "dy"));
  TPR_CHECK(need_targets(op, in[1], T));
  TPR_CHECK(tpr__need_scalar_index(op, in[2], "shard"));
  TPR_CHECK(need_size_attr(op, attrs, "Vl (local vocabulary columns)"));
  tpr__set_contiguous(out, TPR_F32, 2, (const int64_t[]){T, attrs->i[0]});
  return TPR_OK;
}

TPR__OP_RULE(xent_loss) {
  const char *op = "xent_loss";
  TPR_CHECK(tpr__need_dtype(op, in[0], TPR_F32, "sumexp"));
  TPR_CHECK(tpr__need_ndim(op, in[0], 2, "sumexp", "(T, 1)"));
  int64_t T = in[0]->shape[0];
  TPR_CHECK(need_col(op, in[0], T, "sumexp"));
  TPR_CHECK(need_col(op, in[1], T, "max"));
  TPR_CHECK(need_col(op, in[2], T, "target"));
  TPR_CHECK(need_targets(op, in[3], T));
  tpr__set_contiguous(out, TPR_F32, 1, (const int64_t[]){1});
  return TPR_OK;
}

TPR__OP_RULE(xent_loss_bwd) {
  const char *op = "xent_loss_bwd";
  TPR_CHECK(tpr__need_dtype(op, in[0], TPR_F32, "sumexp"));
  TPR_CHECK(tpr__need_ndim(op, in[0], 2, "sumexp", "(T, 1)"));
  int64_t T = in[0]->shape[0];
  TPR_CHECK(need_col(op, in[0], T, "sumexp"));
  TPR_CHECK(need_targets(op, in[1], T));
  TPR_CHECK(tpr__need_dtype(op, in[2], TPR_F32, "dloss"));
  if (tpr_tensor_numel(in[2]) != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: dloss must hold one element, got %lld", op, (long long)tpr_tensor_numel(in[2]));
  tpr__set_contiguous(out, TPR_F32, 1, (const int64_t[]){2 * T});
  return TPR_OK;
}

// k in [1, E]: the top-k of each router row.
static tpr_status need_top_k(const char *op, const tpr_op_attrs *at, int64_t E) {
  TPR_CHECK(need_size_attr(op, at, "k (experts per token)"));
  if (at->i[0] > E)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: k = %lld exceeds E = %lld experts", op, (long long)at->i[0],
                    (long long)E);
  return TPR_OK;
}

// stats (2, E) f32: [top-k counts; summed probabilities].
static tpr_status need_stats(const char *op, const tpr_tensor *t, const char *which) {
  TPR_CHECK(tpr__need_dtype(op, t, TPR_F32, which));
  if (t->ndim != 2 || t->shape[0] != 2 || t->shape[1] < 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must be (2, E) [counts; probability sums], got %d-D with %lld elements", op,
                    which, t->ndim, (long long)tpr_tensor_numel(t));
  return TPR_OK;
}

TPR__OP_RULE(moe_aux_stats) {
  const char *op = "moe_aux_stats";
  TPR_CHECK(need_logits(op, in[0], "(T, E)"));
  TPR_CHECK(need_top_k(op, attrs, in[0]->shape[1]));
  tpr__set_contiguous(out, TPR_F32, 2, (const int64_t[]){2, in[0]->shape[1]});
  return TPR_OK;
}

TPR__OP_RULE(moe_aux_stats_bwd) {
  const char *op = "moe_aux_stats_bwd";
  TPR_CHECK(need_logits(op, in[0], "(T, E)"));
  TPR_CHECK(need_top_k(op, attrs, in[0]->shape[1]));
  TPR_CHECK(need_stats(op, in[1], "dstats"));
  if (in[1]->shape[1] != in[0]->shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: dstats have %lld experts, logits %lld", op, (long long)in[1]->shape[1],
                    (long long)in[0]->shape[1]);
  tpr__set_contiguous(out, TPR_F32, 2, in[0]->shape);
  return TPR_OK;
}

TPR__OP_RULE(moe_aux_loss) {
  const char *op = "moe_aux_loss";
  TPR_CHECK(need_stats(op, in[0], "stats"));
  TPR_CHECK(need_size_attr(op, attrs, "N (router rows over all layers)"));
  tpr__set_contiguous(out, TPR_F32, 1, (const int64_t[]){1});
  return TPR_OK;
}

TPR__OP_RULE(moe_aux_loss_bwd) {
  const char *op = "moe_aux_loss_bwd";
  TPR_CHECK(need_stats(op, in[0], "stats"));
  TPR_CHECK(tpr__need_dtype(op, in[1], TPR_F32, "dloss"));
  if (tpr_tensor_numel(in[1]) != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: dloss must hold one element, got %lld", op, (long long)tpr_tensor_numel(in[1]));
  TPR_CHECK(need_size_attr(op, attrs, "N (router rows over all layers)"));
  tpr__set_contiguous(out, TPR_F32, 2, in[0]->shape);
  return TPR_OK;
}

const tpr__op_def tpr__loss_ops[] = {
    {TPR_OP_XENT_MAX, "xent_max", 2, false, infer_xent_max},
    {TPR_OP_XENT_SUMEXP, "xent_sumexp", 3, false, infer_xent_sumexp},
    {TPR_OP_XENT_SUMEXP_BWD, "xent_sumexp_bwd", 4, false, infer_xent_sumexp_bwd},
    {TPR_OP_XENT_TARGET, "xent_target", 3, false, infer_xent_target},
    {TPR_OP_XENT_TARGET_BWD, "xent_target_bwd", 3, false, infer_xent_target_bwd},
    {TPR_OP_XENT_LOSS, "xent_loss", 4, false, infer_xent_loss},
    {TPR_OP_XENT_LOSS_BWD, "xent_loss_bwd", 3, false, infer_xent_loss_bwd},
    {TPR_OP_MOE_AUX_STATS, "moe_aux_stats", 1, false, infer_moe_aux_stats},
    {TPR_OP_MOE_AUX_STATS_BWD, "moe_aux_stats_bwd", 2, false, infer_moe_aux_stats_bwd},
    {TPR_OP_MOE_AUX_LOSS, "moe_aux_loss", 1, false, infer_moe_aux_loss},
    {TPR_OP_MOE_AUX_LOSS_BWD, "moe_aux_loss_bwd", 2, false, infer_moe_aux_loss_bwd},
    {0},
};
