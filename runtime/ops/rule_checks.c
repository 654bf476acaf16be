// Checks the shape rules share (rule_checks.h): operand dtypes and ranks,
// cotangents against their forward, weight operands (f32, bf16 kept as the
// checkpoint holds it, the FP8 forms of matmul and the expert ops), and the
// descriptors rules fill.
#include "rule_checks.h"

#include <stdio.h>
#include <string.h>

tpr_status tpr__need_dtype(const char *op, const tpr_tensor *t, tpr_dtype dt, const char *which) {
  if (t->dtype != dt)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: %s must be %s, got %s", op, which, tpr_dtype_name(dt),
                    tpr_dtype_name(t->dtype));
  return TPR_OK;
}

tpr_status tpr__need_index_dtype(const char *op, const tpr_tensor *t) {
  if (t->dtype != TPR_I32 && t->dtype != TPR_I64)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: indices must be i32 or i64, got %s", op, tpr_dtype_name(t->dtype));
  return TPR_OK;
}

tpr_status tpr__need_ndim(const char *op, const tpr_tensor *t, int nd, const char *which, const char *dims) {
  if (t->ndim != nd) return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must be %d-D %s, got %d-D", op, which, nd, dims, t->ndim);
  return TPR_OK;
}

tpr_status tpr__need_scalar_index(const char *op, const tpr_tensor *t, const char *which) {
  if (t->dtype != TPR_I32 && t->dtype != TPR_I64)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: %s must be i32 or i64, got %s", op, which, tpr_dtype_name(t->dtype));
  if (t->ndim != 1 || t->shape[0] != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must have shape (1), got %d-D with %lld elements", op, which, t->ndim,
                    (long long)tpr_tensor_numel(t));
  return TPR_OK;
}

tpr_status tpr__need_same_shape(const char *op, const tpr_tensor *a, const char *an, const tpr_tensor *b,
                                const char *bn) {
  if (tpr_tensor_same_shape(a, b)) return TPR_OK;
  char sa[128], sb[128];
  return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s %s and %s %s must have the same shape", op, an,
                  tpr_tensor_describe(a, sa, sizeof sa), bn, tpr_tensor_describe(b, sb, sizeof sb));
}

tpr_status tpr__need_like(const char *op, const tpr_tensor *d, const tpr_tensor *like, const char *which) {
  TPR_CHECK(tpr__need_dtype(op, d, TPR_F32, which));
  if (!tpr_tensor_same_shape(d, like)) {
    char w[128], g[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must be %s, got %s", op, which, tpr_tensor_describe(like, w, sizeof w),
                    tpr_tensor_describe(d, g, sizeof g));
  }
  return TPR_OK;
}

tpr_status tpr__need_forward(const char *op, tpr_op_kind fwd, const tpr_tensor *const *in, int n,
                             const tpr_op_attrs *attrs, tpr_tensor *y) {
  tpr_status rc = tpr__op_infer(fwd, in, n, attrs, y);
  if (rc == TPR_OK) return TPR_OK;
  char why[512];
  snprintf(why, sizeof why, "%s", tpr_last_error());
  return TPR_FAIL(rc, "%s: the forward's inputs do not fit: %s", op, why);
}


tpr_status tpr__need_counts(const char *op, const tpr_tensor *c, const char *which, int64_t group,
                            const char *group_name) {
  TPR_CHECK(tpr__need_dtype(op, c, TPR_I32, which));
  TPR_CHECK(tpr__need_ndim(op, c, 1, which, "(n*m)"));
  int64_t len = c->shape[0];
  if (group < 1 || len < group || len % group)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s has %lld entries; need a positive multiple of %s = %lld", op, which,
                    (long long)len, group_name, (long long)group);
  return TPR_OK;
}

tpr_status tpr__need_weight_dtype(const char *op, const tpr_tensor *t, const char *which) {
  if (t->dtype != TPR_F32 && t->dtype != TPR_BF16)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: %s must be f32 or bf16, got %s", op, which, tpr_dtype_name(t->dtype));
  return TPR_OK;
}

int tpr__fp8_block_attr(tpr_op_kind op, const tpr_op_attrs *at) {
  if (!at) return 0;
  if (op == TPR_OP_MATMUL) return at->n_i > 2 ? (int)at->i[2] : 0;
  if (op == TPR_OP_MOE_EXPERTS || op == TPR_OP_MOE_GROUPED_FFN) return at->n_i > 0 ? (int)at->i[0] : 0;
  return 0;
}

// Inputs the FP8 form adds: the weights' scales.
int tpr__fp8_extra_inputs(tpr_op_kind op) {
  return op == TPR_OP_MATMUL ? 1 : (op == TPR_OP_MOE_EXPERTS || op == TPR_OP_MOE_GROUPED_FFN) ? 2 : 0;
}

int tpr__optional_inputs(tpr_op_kind op, const tpr_op_attrs *at) {
  if (!at) return 0;
  if (op == TPR_OP_ATTENTION || op == TPR_OP_ATTENTION_BWD) return at->n_i > 0 && at->i[0] != 0;
  // Lightning attention's prefill: i[0] is the block size, i[1] the flag.
  if (op == TPR_OP_LIGHTNING_ATTENTION || op == TPR_OP_LIGHTNING_ATTENTION_BWD) return at->n_i > 1 && at->i[1] != 0;
  // Sparse attention: i[0..6] are its sparse_config, i[7] a bit set of
  // optional inputs (ops.h): the compressed-key pool, the prefill lengths.
  if (op == TPR_OP_SPARSE_ATTENTION_PAGED)
    return at->n_i > 7 ? (int)(at->i[7] & TPR_SPARSE_CK_POOL) + (int)((at->i[7] & TPR_SPARSE_PREFILL_LEN) >> 1) : 0;
  return 0;
}

tpr_status tpr__need_fp8_weight(const char *op, const tpr_tensor *w, const tpr_tensor *scale, int block,
                                const char *which) {
  if (block < 1 || block > 128)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: FP8 scale block %d outside [1, 128]", op, block);
  if (w->dtype != TPR_F8E4M3 || scale->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: FP8 %s is %s with %s scales; need f8e4m3 with f32 scales", op, which,
                    tpr_dtype_name(w->dtype), tpr_dtype_name(scale->dtype));
  int nd = w->ndim;
  bool ok = scale->ndim == nd && nd >= 2;
  for (int d = 0; ok && d < nd - 1; d++) ok = scale->shape[d] == w->shape[d];
  int64_t need = nd >= 2 ? (w->shape[nd - 1] + block - 1) / block : 0;
  if (!ok || scale->shape[nd - 1] != need)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: the scales of FP8 %s need its leading dims and %lld blocks of %d columns", op,
                    which, (long long)need, block);
  return TPR_OK;
}

void tpr__set_contiguous(tpr_tensor *out, tpr_dtype dt, int ndim, const int64_t *shape) {
  memset(out, 0, sizeof *out);
  out->dtype = dt;
  out->ndim = ndim;
  if (ndim > 0) memcpy(out->shape, shape, (size_t)ndim * sizeof *shape);
  tpr_shape_contiguous_strides(ndim, shape, out->stride);
}

void tpr__set_packed(tpr_tensor *out, int64_t n) { tpr__set_contiguous(out, TPR_F32, 1, &n); }

void tpr__set_dim(tpr_tensor *out, tpr_dtype dt, const tpr_tensor *x, int dim, int64_t n) {
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[dim] = n;
  tpr__set_contiguous(out, dt, x->ndim, shape);
}
