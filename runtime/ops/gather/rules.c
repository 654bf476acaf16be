// Shape rules of the dense ops' backward ops (ops.h, "Training"): rms_norm,
// swiglu, softmax, embedding, embedding_shard, index_select, slice and
// rms_scale. Packed results are one 1-D f32 tensor (ops.h).
#include <string.h>

#include "runtime/ops/rule_checks.h"

static void set_packed(tpr_tensor *out, int64_t n) { tpr__set_contiguous(out, TPR_F32, 1, (const int64_t[]){n}); }

static tpr_status need_same_shape(const char *op, const tpr_tensor *a, const char *an, const tpr_tensor *b,
                                  const char *bn) {
  if (tpr_tensor_same_shape(a, b)) return TPR_OK;
  char sa[128], sb[128];
  return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s %s and %s %s must have the same shape", op, an,
                  tpr_tensor_describe(a, sa, sizeof sa), bn, tpr_tensor_describe(b, sb, sizeof sb));
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
  TPR_CHECK(need_same_shape(op, x, "x", dy, "dy"));
  if (attrs->n_f < 1 || !(attrs->f[0] >= 0))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm_bwd: eps attribute f[0] missing or negative");
  set_packed(out, tpr_tensor_numel(x) + H);
  return TPR_OK;
}

// in (gate, up, dy) same shape; out packed (dgate | dup).
TPR__OP_RULE(swiglu_bwd) {
  const char *op = "swiglu_bwd";
  TPR_CHECK(tpr__need_dtype(op, in[0], TPR_F32, "gate"));
  TPR_CHECK(tpr__need_dtype(op, in[1], TPR_F32, "up"));
  TPR_CHECK(tpr__need_dtype(op, in[2], TPR_F32, "dy"));
  TPR_CHECK(need_same_shape(op, in[0], "gate", in[1], "up"));
  TPR_CHECK(need_same_shape(op, in[0], "gate", in[2], "dy"));
  set_packed(out, 2 * tpr_tensor_numel(in[0]));
  return TPR_OK;
}

// in (y (..., N), dy (..., N)); out dx (..., N).
TPR__OP_RULE(softmax_bwd) {
  TPR_CHECK(tpr__need_dtype("softmax_bwd", in[0], TPR_F32, "y"));
  TPR_CHECK(tpr__need_dtype("softmax_bwd", in[1], TPR_F32, "dy"));
  if (in[0]->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "softmax_bwd: y needs >= 1 dim");
  TPR_CHECK(need_same_shape("softmax_bwd", in[0], "y", in[1], "dy"));
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

// dy (..., H) f32 whose leading dims are ids' (...) shape; ids i32/i64.
static tpr_status need_rows_of_ids(const char *op, const tpr_tensor *dy, const tpr_tensor *ids) {
  TPR_CHECK(tpr__need_dtype(op, dy, TPR_F32, "dy"));
  TPR_CHECK(tpr__need_index_dtype(op, ids));
  if (dy->ndim != ids->ndim + 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: dy must be (..., H) with ids' %d dims in front, got %d-D dy", op, ids->ndim,
                    dy->ndim);
  for (int d = 0; d < ids->ndim; d++)
    if (dy->shape[d] != ids->shape[d])
      return TPR_FAIL(TPR_ERR_SHAPE, "%s: dy dim %d is %lld, ids have %lld", op, d, (long long)dy->shape[d],
                      (long long)ids->shape[d]);
  return TPR_OK;
}

static tpr_status need_rows_attr(const char *op, const tpr_op_attrs *attrs, const char *what) {
  if (attrs->n_i < 1 || attrs->i[0] < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs i[0] = %s >= 0 (got %s%lld)", op, what,
                    attrs->n_i < 1 ? "none, " : "", (long long)(attrs->n_i < 1 ? 0 : attrs->i[0]));
  return TPR_OK;
}

// in (dy (..., H), ids (...)); i[0] V; out (V, H).
TPR__OP_RULE(embedding_bwd) {
  TPR_CHECK(need_rows_of_ids("embedding_bwd", in[0], in[1]));
  TPR_CHECK(need_rows_attr("embedding_bwd", attrs, "vocabulary V"));
  tpr__set_contiguous(out, TPR_F32, 2, (const int64_t[]){attrs->i[0], in[0]->shape[in[0]->ndim - 1]});
  return TPR_OK;
}

// in (dy (..., H), ids (...), shard (1)); i[0] Vl; out (Vl, H).
TPR__OP_RULE(embedding_shard_bwd) {
  TPR_CHECK(need_rows_of_ids("embedding_shard_bwd", in[0], in[1]));
  TPR_CHECK(tpr__need_scalar_index("embedding_shard_bwd", in[2], "shard"));
  TPR_CHECK(need_rows_attr("embedding_shard_bwd", attrs, "local vocabulary Vl"));
  tpr__set_contiguous(out, TPR_F32, 2, (const int64_t[]){attrs->i[0], in[0]->shape[in[0]->ndim - 1]});
  return TPR_OK;
}

// in (dy, index (k)); i[0] dim, i[1] n; out dy's shape with n at dim.
TPR__OP_RULE(index_select_bwd) {
  const tpr_tensor *dy = in[0], *idx = in[1];
  TPR_CHECK(tpr__need_dtype("index_select_bwd", dy, TPR_F32, "dy"));
  TPR_CHECK(tpr__need_index_dtype("index_select_bwd", idx));
  if (idx->ndim != 1) return TPR_FAIL(TPR_ERR_SHAPE, "index_select_bwd: index must be 1-D, got %d-D", idx->ndim);
  if (attrs->n_i < 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "index_select_bwd: needs (dim, n) attributes");
  int64_t dim = attrs->i[0], n = attrs->i[1];
  if (dim < 0 || dim >= dy->ndim)
    return TPR_FAIL(TPR_ERR_SHAPE, "index_select_bwd: dim %lld outside a %d-d dy", (long long)dim, dy->ndim);
  if (dy->shape[dim] != idx->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "index_select_bwd: dy dim %lld is %lld, the index has %lld entries",
                    (long long)dim, (long long)dy->shape[dim], (long long)idx->shape[0]);
  if (n < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "index_select_bwd: n = %lld is negative", (long long)n);
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, dy->shape, sizeof shape);
  shape[dim] = n;
  tpr__set_contiguous(out, TPR_F32, dy->ndim, shape);
  return TPR_OK;
}

// in (dy); i[0] dim, i[1] start, i[2] full len; out dy's shape with the full len at dim.
TPR__OP_RULE(slice_bwd) {
  const tpr_tensor *dy = in[0];
  TPR_CHECK(tpr__need_dtype("slice_bwd", dy, TPR_F32, "dy"));
  if (attrs->n_i < 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "slice_bwd: needs (dim, start, full len) attributes");
  int64_t dim = attrs->i[0], start = attrs->i[1], full = attrs->i[2];
  if (dim < 0 || dim >= dy->ndim)
    return TPR_FAIL(TPR_ERR_SHAPE, "slice_bwd: dim %lld outside a %d-d dy", (long long)dim, dy->ndim);
  if (start < 0 || full < 0 || start > full - dy->shape[dim])
    return TPR_FAIL(TPR_ERR_SHAPE, "slice_bwd: dy's %lld rows at start %lld do not fit in the full length %lld",
                    (long long)dy->shape[dim], (long long)start, (long long)full);
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, dy->shape, sizeof shape);
  shape[dim] = full;
  tpr__set_contiguous(out, TPR_F32, dy->ndim, shape);
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
  TPR_CHECK(need_same_shape(op, x, "x", dy, "dy"));
  set_packed(out, tpr_tensor_numel(x) + tpr_tensor_numel(ss) + w->shape[0]);
  return TPR_OK;
}
