// Shape rules of the norms (ops.h): rms_norm, and the distributed RMS
// norm's halves sum_squares and rms_scale, with their backward ops.
#include <string.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

static tpr_status infer_rms_norm(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0], *w = in[1];
  TPR_CHECK(tpr__need_dtype("rms_norm", x, TPR_F32, "x"));
  TPR_CHECK(tpr__need_dtype("rms_norm", w, TPR_F32, "weight"));
  if (x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1])
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_norm: weight must be 1-D of x's last dim");
  if (at->n_f < 1 || !(at->f[0] >= 0))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm: eps attribute missing or negative");
  tpr__set_contiguous(out, TPR_F32, x->ndim, x->shape);
  return TPR_OK;
}

static tpr_status infer_sum_squares(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0];
  TPR_CHECK(tpr__need_dtype("sum_squares", x, TPR_F32, "x"));
  if (x->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "sum_squares: x needs >= 1 dim");
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = 1;
  tpr__set_contiguous(out, TPR_F32, x->ndim, shape);
  return TPR_OK;
}

static tpr_status infer_rms_scale(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0], *ss = in[1], *w = in[2];
  TPR_CHECK(tpr__need_dtype("rms_scale", x, TPR_F32, "x"));
  TPR_CHECK(tpr__need_dtype("rms_scale", ss, TPR_F32, "sumsq"));
  TPR_CHECK(tpr__need_dtype("rms_scale", w, TPR_F32, "weight"));
  if (x->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "rms_scale: x needs >= 1 dim");
  int nd = x->ndim;
  int64_t N = x->shape[nd - 1];
  if (w->ndim != 1 || w->shape[0] != N)
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_scale: weight must be (%lld), x's last dim; got %d-D with first dim %lld",
                    (long long)N, w->ndim, (long long)(w->ndim ? w->shape[0] : 0));
  if (ss->ndim != nd || ss->shape[nd - 1] != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_scale: sumsq must be x's shape with last dim 1 (%d-D, last 1), got %d-D with "
                    "last dim %lld", nd, ss->ndim, (long long)(ss->ndim ? ss->shape[ss->ndim - 1] : 0));
  for (int d = 0; d < nd - 1; d++)
    if (ss->shape[d] != x->shape[d])
      return TPR_FAIL(TPR_ERR_SHAPE, "rms_scale: sumsq dim %d is %lld, x has %lld", d, (long long)ss->shape[d],
                      (long long)x->shape[d]);
  if (at->n_f < 2 || !(at->f[0] > 0) || !(at->f[1] >= 0))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_scale: needs f[0] divisor > 0 and f[1] eps >= 0 (got %d float attrs)",
                    at->n_f);
  tpr__set_contiguous(out, TPR_F32, nd, x->shape);
  return TPR_OK;
}

// in (x (..., H), w (H), dy (..., H)); f[0] eps; out packed (dx | dw).
TPR__OP_RULE(rms_norm_bwd) {
  const char *op = "rms_norm_bwd";
  const tpr_tensor *x = in[0], *w = in[1], *dy = in[2];
  TPR_CHECK(tpr__need_dtype(op, x, TPR_F32, "x"));
  TPR_CHECK(tpr__need_dtype(op, w, TPR_F32, "weight"));
  TPR_CHECK(tpr__need_dtype(op, dy, TPR_F32, "dy"));
  if (x->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "rms_norm_bwd: x needs >= 1 dim");
  int64_t H = x->shape[x->ndim - 1];
  if (w->ndim != 1 || w->shape[0] != H)
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_norm_bwd: weight must be (%lld), x's last dim; got %d-D with first dim %lld",
                    (long long)H, w->ndim, (long long)(w->ndim ? w->shape[0] : 0));
  TPR_CHECK(tpr__need_same_shape(op, x, "x", dy, "dy"));
  if (attrs->n_f < 1 || !(attrs->f[0] >= 0))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm_bwd: eps attribute f[0] missing or negative");
  tpr__set_packed(out, tpr_tensor_numel(x) + H);
  return TPR_OK;
}

// in (x (..., N), sumsq (..., 1), w (N), dy (..., N)); f[0] divisor, f[1] eps;
// out packed (dx | dsumsq | dw).
TPR__OP_RULE(rms_scale_bwd) {
  const char *op = "rms_scale_bwd";
  const tpr_tensor *x = in[0], *ss = in[1], *w = in[2], *dy = in[3];
  // The forward's rule checks x, sumsq, weight and the attributes.
  TPR_CHECK(tpr__op_infer(TPR_OP_RMS_SCALE, in, 3, attrs, out));
  TPR_CHECK(tpr__need_dtype(op, dy, TPR_F32, "dy"));
  TPR_CHECK(tpr__need_same_shape(op, x, "x", dy, "dy"));
  tpr__set_packed(out, tpr_tensor_numel(x) + tpr_tensor_numel(ss) + w->shape[0]);
  return TPR_OK;
}

const tpr__op_def tpr__norm_ops[] = {
    {TPR_OP_RMS_NORM, "rms_norm", 2, false, infer_rms_norm},
    {TPR_OP_SUM_SQUARES, "sum_squares", 1, false, infer_sum_squares},
    {TPR_OP_RMS_SCALE, "rms_scale", 3, false, infer_rms_scale},
    {TPR_OP_RMS_NORM_BWD, "rms_norm_bwd", 3, false, infer_rms_norm_bwd},
    {TPR_OP_RMS_SCALE_BWD, "rms_scale_bwd", 4, false, infer_rms_scale_bwd},
    {0},
};
