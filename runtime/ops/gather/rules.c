// Shape rules of the gathers (ops.h): embedding, the vocab-parallel
// embedding_shard and index_select, and their backward ops (scatter-adds).
#include <string.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// out (..., H) in the table's dtype: the table's (rows, H) row of each id (...).
static tpr_status set_rows(const char *op, const tpr_tensor *table, const char *dims, const tpr_tensor *ids,
                           tpr_tensor *out) {
  if (table->ndim != 2) return TPR_FAIL(TPR_ERR_SHAPE, "%s: table must be 2-D %s, got %d-D", op, dims, table->ndim);
  if (ids->ndim + 1 > TPR_MAX_DIMS) return TPR_FAIL(TPR_ERR_SHAPE, "%s: ids have too many dims", op);
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
  shape[ids->ndim] = table->shape[1];
  tpr__set_contiguous(out, table->dtype, ids->ndim + 1, shape);
  return TPR_OK;
}

static tpr_status infer_embedding(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  TPR_CHECK(tpr__need_index_dtype("embedding", in[1]));
  return set_rows("embedding", in[0], "(V, H)", in[1], out);
}

static tpr_status infer_index_select(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0], *idx = in[1];
  TPR_CHECK(tpr__need_index_dtype("index_select", idx));
  if (idx->ndim != 1) return TPR_FAIL(TPR_ERR_SHAPE, "index_select: index must be 1-D, got %d-D", idx->ndim);
  int64_t dim = at->n_i > 0 ? at->i[0] : -1;
  if (dim < 0 || dim >= x->ndim) return TPR_FAIL(TPR_ERR_SHAPE, "index_select: dim %lld outside a %d-d tensor", (long long)dim, x->ndim);
  tpr__set_dim(out, x->dtype, x, (int)dim, idx->shape[0]);
  return TPR_OK;
}

static tpr_status infer_embedding_shard(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  TPR_CHECK(tpr__need_index_dtype("embedding_shard", in[1]));
  TPR_CHECK(tpr__need_scalar_index("embedding_shard", in[2], "shard"));
  return set_rows("embedding_shard", in[0], "(Vl, H)", in[1], out);
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
  tpr__set_dim(out, TPR_F32, dy, (int)dim, n);
  return TPR_OK;
}

const tpr__op_def tpr__gather_ops[] = {
    {TPR_OP_EMBEDDING, "embedding", 2, false, infer_embedding},
    {TPR_OP_INDEX_SELECT, "index_select", 2, false, infer_index_select},
    {TPR_OP_EMBEDDING_SHARD, "embedding_shard", 3, false, infer_embedding_shard},
    {TPR_OP_EMBEDDING_BWD, "embedding_bwd", 2, false, infer_embedding_bwd},
    {TPR_OP_EMBEDDING_SHARD_BWD, "embedding_shard_bwd", 3, false, infer_embedding_shard_bwd},
    {TPR_OP_INDEX_SELECT_BWD, "index_select_bwd", 2, false, infer_index_select_bwd},
    {0},
};
