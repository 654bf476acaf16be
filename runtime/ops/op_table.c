// The op table: names, arities and shape rules, plus the eager entry point.
// Programs call the same shape rules, so eager and program semantics agree.
#include <stdio.h>
#include <string.h>

#include "../backend.h"
#include "ops.h"

typedef tpr_status (*infer_fn)(const tpr_tensor *const *in, const tpr_op_attrs *attrs, tpr_tensor *out);

typedef struct op_info {
  const char *name;
  int n_inputs;
  bool is_view;
  infer_fn infer;
} op_info;

static tpr_status need_dtype(const char *op, const tpr_tensor *t, tpr_dtype dt, const char *which) {
  if (t->dtype != dt)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: %s must be %s, got %s", op, which, tpr_dtype_name(dt),
                    tpr_dtype_name(t->dtype));
  return TPR_OK;
}

static tpr_status need_index_dtype(const char *op, const tpr_tensor *t) {
  if (t->dtype != TPR_I32 && t->dtype != TPR_I64)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: indices must be i32 or i64, got %s", op, tpr_dtype_name(t->dtype));
  return TPR_OK;
}

// out := contiguous tensor of dtype and shape.
static void set_contiguous(tpr_tensor *out, tpr_dtype dt, int ndim, const int64_t *shape) {
  memset(out, 0, sizeof *out);
  out->dtype = dt;
  out->ndim = ndim;
  if (ndim > 0) memcpy(out->shape, shape, (size_t)ndim * sizeof *shape);
  tpr_shape_contiguous_strides(ndim, shape, out->stride);
}

static tpr_status infer_matmul(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *a = in[0], *b = in[1];
  TPR_CHECK(need_dtype("matmul", a, TPR_F32, "a"));
  TPR_CHECK(need_dtype("matmul", b, TPR_F32, "b"));
  if (a->ndim < 2 || b->ndim < 2)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul: a and b need >= 2 dims, got %d and %d", a->ndim, b->ndim);
  if (b->ndim != 2 && b->ndim != a->ndim)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul: b must be 2-D or have a's %d dims, got %d", a->ndim, b->ndim);
  bool ta = at->n_i > 0 && at->i[0], tb = at->n_i > 1 && at->i[1];
  int na = a->ndim, nb = b->ndim;
  int64_t m = ta ? a->shape[na - 1] : a->shape[na - 2], k = ta ? a->shape[na - 2] : a->shape[na - 1];
  int64_t kb = tb ? b->shape[nb - 1] : b->shape[nb - 2], n = tb ? b->shape[nb - 2] : b->shape[nb - 1];
  if (k != kb)
    return TPR_FAIL(TPR_ERR_SHAPE, "matmul: inner dims differ (a gives K=%lld, b gives K=%lld; trans_a=%d trans_b=%d)",
                    (long long)k, (long long)kb, ta, tb);
  for (int i = 0; nb > 2 && i < na - 2; i++)
    if (a->shape[i] != b->shape[i])
      return TPR_FAIL(TPR_ERR_SHAPE, "matmul: batch dim %d differs (%lld vs %lld)", i, (long long)a->shape[i],
                      (long long)b->shape[i]);
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, a->shape, sizeof shape);
  shape[na - 2] = m;
  shape[na - 1] = n;
  set_contiguous(out, TPR_F32, na, shape);
  return TPR_OK;
}

static tpr_status infer_broadcast(const char *op, const tpr_tensor *const *in, tpr_tensor *out) {
  const tpr_tensor *a = in[0], *b = in[1];
  TPR_CHECK(need_dtype(op, a, TPR_F32, "a"));
  TPR_CHECK(need_dtype(op, b, TPR_F32, "b"));
  int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
  int64_t shape[TPR_MAX_DIMS];
  for (int i = 0; i < nd; i++) {
    int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return TPR_FAIL(TPR_ERR_SHAPE, "%s: dims %lld and %lld do not broadcast (output dim %d)", op, (long long)da,
                      (long long)db, i);
    shape[i] = da == 1 ? db : da;
  }
  set_contiguous(out, TPR_F32, nd, shape);
  return TPR_OK;
}

static tpr_status infer_add(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return infer_broadcast("add", in, out);
}

static tpr_status infer_mul(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return infer_broadcast("mul", in, out);
}

static tpr_status infer_rms_norm(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0], *w = in[1];
  TPR_CHECK(need_dtype("rms_norm", x, TPR_F32, "x"));
  TPR_CHECK(need_dtype("rms_norm", w, TPR_F32, "weight"));
  if (x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1])
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_norm: weight must be 1-D of x's last dim");
  if (at->n_f < 1 || !(at->f[0] >= 0))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm: eps attribute missing or negative");
  set_contiguous(out, TPR_F32, x->ndim, x->shape);
  return TPR_OK;
}

static tpr_status infer_swiglu(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  TPR_CHECK(need_dtype("swiglu", in[0], TPR_F32, "gate"));
  TPR_CHECK(need_dtype("swiglu", in[1], TPR_F32, "up"));
  if (!tpr_tensor_same_shape(in[0], in[1])) return TPR_FAIL(TPR_ERR_SHAPE, "swiglu: gate and up differ in shape");
  set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

static tpr_status infer_softmax(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  TPR_CHECK(need_dtype("softmax", in[0], TPR_F32, "x"));
  if (in[0]->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "softmax: x needs >= 1 dim");
  set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

static tpr_status infer_embedding(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *table = in[0], *ids = in[1];
  TPR_CHECK(need_index_dtype("embedding", ids));
  if (table->ndim != 2) return TPR_FAIL(TPR_ERR_SHAPE, "embedding: table must be 2-D (V, H), got %d-D", table->ndim);
  if (ids->ndim + 1 > TPR_MAX_DIMS) return TPR_FAIL(TPR_ERR_SHAPE, "embedding: ids have too many dims");
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
  shape[ids->ndim] = table->shape[1];
  set_contiguous(out, table->dtype, ids->ndim + 1, shape);
  return TPR_OK;
}

static tpr_status infer_index_select(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0], *idx = in[1];
  TPR_CHECK(need_index_dtype("index_select", idx));
  if (idx->ndim != 1) return TPR_FAIL(TPR_ERR_SHAPE, "index_select: index must be 1-D, got %d-D", idx->ndim);
  int64_t dim = at->n_i > 0 ? at->i[0] : -1;
  if (dim < 0 || dim >= x->ndim) return TPR_FAIL(TPR_ERR_SHAPE, "index_select: dim %lld outside a %d-d tensor", (long long)dim, x->ndim);
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[dim] = idx->shape[0];
  set_contiguous(out, x->dtype, x->ndim, shape);
  return TPR_OK;
}

static tpr_status infer_cast(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  if (at->n_i < 1 || !tpr_dtype_valid((tpr_dtype)at->i[0]))
    return TPR_FAIL(TPR_ERR_DTYPE, "cast: missing or invalid destination dtype");
  set_contiguous(out, (tpr_dtype)at->i[0], in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

static tpr_status infer_reshape(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return tpr__view_reshape(in[0], at->n_i, at->i, out);
}

static tpr_status infer_permute(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  if (at->n_i != in[0]->ndim)
    return TPR_FAIL(TPR_ERR_SHAPE, "permute: %d axes given for a %d-d tensor", at->n_i, in[0]->ndim);
  int perm[TPR_MAX_DIMS];
  for (int i = 0; i < at->n_i; i++) perm[i] = (int)at->i[i];
  return tpr__view_permute(in[0], perm, out);
}

static tpr_status infer_slice(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  if (at->n_i != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "slice: needs (dim, start, len)");
  return tpr__view_slice(in[0], (int)at->i[0], at->i[1], at->i[2], out);
}

static const op_info ops[TPR_OP_KIND_COUNT] = {
    [TPR_OP_MATMUL] = {"matmul", 2, false, infer_matmul},
    [TPR_OP_ADD] = {"add", 2, false, infer_add},
    [TPR_OP_MUL] = {"mul", 2, false, infer_mul},
    [TPR_OP_RMS_NORM] = {"rms_norm", 2, false, infer_rms_norm},
    [TPR_OP_SWIGLU] = {"swiglu", 2, false, infer_swiglu},
    [TPR_OP_SOFTMAX] = {"softmax", 1, false, infer_softmax},
    [TPR_OP_EMBEDDING] = {"embedding", 2, false, infer_embedding},
    [TPR_OP_INDEX_SELECT] = {"index_select", 2, false, infer_index_select},
    [TPR_OP_CAST] = {"cast", 1, false, infer_cast},
    [TPR_OP_RESHAPE] = {"reshape", 1, true, infer_reshape},
    [TPR_OP_PERMUTE] = {"permute", 1, true, infer_permute},
    [TPR_OP_SLICE] = {"slice", 1, true, infer_slice},
};

static bool op_valid(tpr_op_kind op) { return (unsigned)op < TPR_OP_KIND_COUNT; }

const char *tpr_op_name(tpr_op_kind op) { return op_valid(op) ? ops[op].name : "?"; }
int tpr_op_num_inputs(tpr_op_kind op) { return op_valid(op) ? ops[op].n_inputs : -1; }
bool tpr_op_is_view(tpr_op_kind op) { return op_valid(op) && ops[op].is_view; }

tpr_status tpr__op_infer(tpr_op_kind op, const tpr_tensor *const *in, int n_in, const tpr_op_attrs *attrs,
                         tpr_tensor *out) {
  static const tpr_op_attrs no_attrs;
  if (!op_valid(op)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "unknown op kind %d", (int)op);
  if (n_in != ops[op].n_inputs)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s takes %d inputs, got %d", ops[op].name, ops[op].n_inputs, n_in);
  for (int i = 0; i < n_in; i++)
    if (!in[i]) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: input %d is NULL", ops[op].name, i);
  if (!attrs) attrs = &no_attrs;
  if (attrs->n_i < 0 || attrs->n_i > TPR_OP_MAX_IATTRS || attrs->n_f < 0 || attrs->n_f > TPR_OP_MAX_FATTRS)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: attribute counts out of range", ops[op].name);
  return ops[op].infer(in, attrs, out);
}

tpr_status tpr_op_run(tpr_backend *backend, tpr_op_kind op, const tpr_tensor *const *in, int n_in,
                      const tpr_op_attrs *attrs, tpr_tensor *out) {
  static const tpr_op_attrs no_attrs;
  if (!backend || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_op_run: NULL backend or out");
  if (!attrs) attrs = &no_attrs;
  tpr_tensor want;
  TPR_CHECK(tpr__op_infer(op, in, n_in, attrs, &want));
  if (ops[op].is_view)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s is a view: use tpr_tensor_%s", ops[op].name, ops[op].name);
  if (want.dtype != out->dtype || !tpr_tensor_same_shape(&want, out)) {
    char w[128], g[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: output must be %s, got %s", ops[op].name,
                    tpr_tensor_describe(&want, w, sizeof w), tpr_tensor_describe(out, g, sizeof g));
  }
  if (!tpr_tensor_is_contiguous(out)) return TPR_FAIL(TPR_ERR_SHAPE, "%s: output must be contiguous", ops[op].name);
  for (int i = 0; i < n_in; i++)
    if (tpr_tensor_backend(in[i]) != backend)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: input %d lives on another backend", ops[op].name, i);
  if (tpr_tensor_backend(out) != backend)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: output lives on another backend", ops[op].name);
  tpr_kernel_fn fn = backend->vt->kernels[op];
  if (!fn) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backend %s has no %s kernel", backend->vt->name, ops[op].name);
  return fn(backend->ctx, in, n_in, attrs, out);
}

// Typed wrappers.
#define RUN2(op, a, b, at) tpr_op_run(be, op, (const tpr_tensor *const[]){a, b}, 2, at, out)

tpr_status tpr_matmul(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, bool trans_a, bool trans_b,
                      tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 2, .i = {trans_a, trans_b}};
  return RUN2(TPR_OP_MATMUL, a, b, &at);
}

tpr_status tpr_add(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, tpr_tensor *out) {
  return RUN2(TPR_OP_ADD, a, b, NULL);
}

tpr_status tpr_mul(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, tpr_tensor *out) {
  return RUN2(TPR_OP_MUL, a, b, NULL);
}

tpr_status tpr_rms_norm(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *weight, float eps, tpr_tensor *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {eps}};
  return RUN2(TPR_OP_RMS_NORM, x, weight, &at);
}

tpr_status tpr_swiglu(tpr_backend *be, const tpr_tensor *gate, const tpr_tensor *up, tpr_tensor *out) {
  return RUN2(TPR_OP_SWIGLU, gate, up, NULL);
}

tpr_status tpr_softmax(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out) {
  return tpr_op_run(be, TPR_OP_SOFTMAX, (const tpr_tensor *const[]){x}, 1, NULL, out);
}

tpr_status tpr_embedding(tpr_backend *be, const tpr_tensor *table, const tpr_tensor *ids, tpr_tensor *out) {
  return RUN2(TPR_OP_EMBEDDING, table, ids, NULL);
}

tpr_status tpr_index_select(tpr_backend *be, const tpr_tensor *x, int dim, const tpr_tensor *index, tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {dim}};
  return RUN2(TPR_OP_INDEX_SELECT, x, index, &at);
}

tpr_status tpr_cast(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out) {
  if (!out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "cast: NULL output");
  tpr_op_attrs at = {.n_i = 1, .i = {out->dtype}};
  return tpr_op_run(be, TPR_OP_CAST, (const tpr_tensor *const[]){x}, 1, &at, out);
}
