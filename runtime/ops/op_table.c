// The op table: names, arities and shape rules, plus the eager entry point.
// Programs call the same shape rules, so eager and program semantics agree.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/backend.h"
#include "rule_checks.h"
#include "runtime/ops/rope/rope.h"
#include "runtime/ops.h"

typedef tpr_status (*infer_fn)(const tpr_tensor *const *in, const tpr_op_attrs *attrs, tpr_tensor *out);

typedef struct op_info {
  const char *name;
  int n_inputs;
  bool is_view;
  infer_fn infer;
} op_info;

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

// out := contiguous tensor of dtype and shape.
void tpr__set_contiguous(tpr_tensor *out, tpr_dtype dt, int ndim, const int64_t *shape) {
  memset(out, 0, sizeof *out);
  out->dtype = dt;
  out->ndim = ndim;
  if (ndim > 0) memcpy(out->shape, shape, (size_t)ndim * sizeof *shape);
  tpr_shape_contiguous_strides(ndim, shape, out->stride);
}

static tpr_status infer_matmul(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *a = in[0], *b = in[1];
  int block = tpr__fp8_block_attr(TPR_OP_MATMUL, at);
  if (block > 0) {  // a @ (w * scale)^T: the weight is b, read transposed
    TPR_CHECK(tpr__need_dtype("matmul", a, TPR_F32, "a"));
    TPR_CHECK(tpr__need_fp8_weight("matmul", b, in[2], block, "b"));
    if (b->ndim != 2 || !(at->n_i > 1 && at->i[1]) || (at->n_i > 0 && at->i[0]))
      return TPR_FAIL(TPR_ERR_SHAPE, "matmul: an FP8 b must be a 2-D weight read transposed (trans_b), a untransposed");
  } else {
    TPR_CHECK(tpr__need_weight_dtype("matmul", a, "a"));
    TPR_CHECK(tpr__need_weight_dtype("matmul", b, "b"));
  }
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
  tpr__set_contiguous(out, TPR_F32, na, shape);
  return TPR_OK;
}

static tpr_status infer_broadcast(const char *op, const tpr_tensor *const *in, tpr_tensor *out) {
  const tpr_tensor *a = in[0], *b = in[1];
  TPR_CHECK(tpr__need_dtype(op, a, TPR_F32, "a"));
  TPR_CHECK(tpr__need_dtype(op, b, TPR_F32, "b"));
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
  tpr__set_contiguous(out, TPR_F32, nd, shape);
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
  TPR_CHECK(tpr__need_dtype("rms_norm", x, TPR_F32, "x"));
  TPR_CHECK(tpr__need_dtype("rms_norm", w, TPR_F32, "weight"));
  if (x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1])
    return TPR_FAIL(TPR_ERR_SHAPE, "rms_norm: weight must be 1-D of x's last dim");
  if (at->n_f < 1 || !(at->f[0] >= 0))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "rms_norm: eps attribute missing or negative");
  tpr__set_contiguous(out, TPR_F32, x->ndim, x->shape);
  return TPR_OK;
}

static tpr_status infer_swiglu(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  TPR_CHECK(tpr__need_dtype("swiglu", in[0], TPR_F32, "gate"));
  TPR_CHECK(tpr__need_dtype("swiglu", in[1], TPR_F32, "up"));
  if (!tpr_tensor_same_shape(in[0], in[1])) return TPR_FAIL(TPR_ERR_SHAPE, "swiglu: gate and up differ in shape");
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

static tpr_status infer_softmax(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  TPR_CHECK(tpr__need_dtype("softmax", in[0], TPR_F32, "x"));
  if (in[0]->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "softmax: x needs >= 1 dim");
  tpr__set_contiguous(out, TPR_F32, in[0]->ndim, in[0]->shape);
  return TPR_OK;
}

static tpr_status infer_embedding(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *table = in[0], *ids = in[1];
  TPR_CHECK(tpr__need_index_dtype("embedding", ids));
  if (table->ndim != 2) return TPR_FAIL(TPR_ERR_SHAPE, "embedding: table must be 2-D (V, H), got %d-D", table->ndim);
  if (ids->ndim + 1 > TPR_MAX_DIMS) return TPR_FAIL(TPR_ERR_SHAPE, "embedding: ids have too many dims");
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
  shape[ids->ndim] = table->shape[1];
  tpr__set_contiguous(out, table->dtype, ids->ndim + 1, shape);
  return TPR_OK;
}

static tpr_status infer_index_select(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0], *idx = in[1];
  TPR_CHECK(tpr__need_index_dtype("index_select", idx));
  if (idx->ndim != 1) return TPR_FAIL(TPR_ERR_SHAPE, "index_select: index must be 1-D, got %d-D", idx->ndim);
  int64_t dim = at->n_i > 0 ? at->i[0] : -1;
  if (dim < 0 || dim >= x->ndim) return TPR_FAIL(TPR_ERR_SHAPE, "index_select: dim %lld outside a %d-d tensor", (long long)dim, x->ndim);
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[dim] = idx->shape[0];
  tpr__set_contiguous(out, x->dtype, x->ndim, shape);
  return TPR_OK;
}

static tpr_status infer_cast(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  if (at->n_i < 1 || !tpr_dtype_valid((tpr_dtype)at->i[0]))
    return TPR_FAIL(TPR_ERR_DTYPE, "cast: missing or invalid destination dtype");
  tpr__set_contiguous(out, (tpr_dtype)at->i[0], in[0]->ndim, in[0]->shape);
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

static const char *const axis_names[TPR_AXIS_COUNT] = {"world", "tp", "dp", "ep", "etp", "edp"};

const char *tpr_mesh_axis_name(tpr_mesh_axis a) { return (unsigned)a < TPR_AXIS_COUNT ? axis_names[a] : "?"; }

// What a collective does to the leading dim of its input.
typedef enum lead_rule { LEAD_SAME, LEAD_TIMES_N, LEAD_DIV_N, LEAD_DIVISIBLE } lead_rule;

tpr_status tpr__need_collective_attrs(const char *op, const tpr_op_attrs *at, int n_attrs, const char *names) {
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
  TPR_CHECK(tpr__need_collective_attrs(op, at, reduces ? 3 : 2, reduces ? "axis, group size, red op"
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
  TPR_CHECK(tpr__need_collective_attrs("param_gather", at, 5, "axis, group size, prefetch group, prefetch, reshard"));
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

// ---- Model ops (see ops.h for the exact semantics).

// A run-time scalar operand (start, shard): shape (1), i32 or i64.
tpr_status tpr__need_scalar_index(const char *op, const tpr_tensor *t, const char *which) {
  if (t->dtype != TPR_I32 && t->dtype != TPR_I64)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: %s must be i32 or i64, got %s", op, which, tpr_dtype_name(t->dtype));
  if (t->ndim != 1 || t->shape[0] != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must have shape (1), got %d-D with %lld elements", op, which, t->ndim,
                    (long long)tpr_tensor_numel(t));
  return TPR_OK;
}

tpr_status tpr__need_ndim(const char *op, const tpr_tensor *t, int nd, const char *which, const char *dims) {
  if (t->ndim != nd) return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must be %d-D %s, got %d-D", op, which, nd, dims, t->ndim);
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

static tpr_status infer_embedding_shard(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *table = in[0], *ids = in[1];
  TPR_CHECK(tpr__need_index_dtype("embedding_shard", ids));
  TPR_CHECK(tpr__need_scalar_index("embedding_shard", in[2], "shard"));
  if (table->ndim != 2)
    return TPR_FAIL(TPR_ERR_SHAPE, "embedding_shard: table must be 2-D (Vl, H), got %d-D", table->ndim);
  if (ids->ndim + 1 > TPR_MAX_DIMS) return TPR_FAIL(TPR_ERR_SHAPE, "embedding_shard: ids have too many dims");
  int64_t shape[TPR_MAX_DIMS];
  memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
  shape[ids->ndim] = table->shape[1];
  tpr__set_contiguous(out, table->dtype, ids->ndim + 1, shape);
  return TPR_OK;
}

static tpr_status infer_rope(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return tpr__rope_check("rope", in[0], in[1], at, out);
}

// Shared by attention (k, v) and cache_write (cache, new): a (rows, Hkv, D) tensor.
static tpr_status need_heads(const char *op, const tpr_tensor *t, const char *which, int64_t hkv, int64_t D) {
  TPR_CHECK(tpr__need_ndim(op, t, 3, which, "(rows, Hkv, D)"));
  if (t->shape[1] != hkv || t->shape[2] != D)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s is (%lld, %lld, %lld); expected (rows, Hkv = %lld, D = %lld)", op, which,
                    (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2], (long long)hkv,
                    (long long)D);
  return TPR_OK;
}

static tpr_status infer_attention(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2];
  TPR_CHECK(tpr__need_dtype("attention", q, TPR_F32, "q"));
  TPR_CHECK(tpr__need_dtype("attention", k, TPR_F32, "k_cache"));
  TPR_CHECK(tpr__need_dtype("attention", v, TPR_F32, "v_cache"));
  TPR_CHECK(tpr__need_scalar_index("attention", in[3], "start"));
  TPR_CHECK(tpr__need_ndim("attention", q, 3, "q", "(T, Hq, D)"));
  TPR_CHECK(tpr__need_ndim("attention", k, 3, "k_cache", "(S, Hkv, D)"));
  int64_t hq = q->shape[1], hkv = k->shape[1], D = q->shape[2];
  TPR_CHECK(need_heads("attention", k, "k_cache", hkv, D));
  TPR_CHECK(need_heads("attention", v, "v_cache", hkv, D));
  if (v->shape[0] != k->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "attention: k_cache has %lld rows, v_cache %lld", (long long)k->shape[0],
                    (long long)v->shape[0]);
  if (hkv < 1 || hq % hkv)
    return TPR_FAIL(TPR_ERR_SHAPE, "attention: Hq = %lld query heads is not a multiple of Hkv = %lld", (long long)hq,
                    (long long)hkv);
  if (q->shape[0] > k->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "attention: T = %lld queries exceed the cache's S = %lld rows",
                    (long long)q->shape[0], (long long)k->shape[0]);
  if (at->n_f < 1 || !isfinite(at->f[0]))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention: needs a finite f[0] scale");
  tpr__set_contiguous(out, TPR_F32, 3, q->shape);
  return TPR_OK;
}

static tpr_status infer_cache_write(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *cache = in[0], *nw = in[1];
  TPR_CHECK(tpr__need_scalar_index("cache_write", in[2], "start"));
  TPR_CHECK(tpr__need_ndim("cache_write", cache, 3, "cache", "(S, Hkv, D)"));
  TPR_CHECK(need_heads("cache_write", nw, "new", cache->shape[1], cache->shape[2]));
  if (nw->dtype != cache->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "cache_write: new is %s but the cache is %s", tpr_dtype_name(nw->dtype),
                    tpr_dtype_name(cache->dtype));
  if (nw->shape[0] > cache->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "cache_write: T = %lld new rows exceed the cache's S = %lld rows",
                    (long long)nw->shape[0], (long long)cache->shape[0]);
  tpr__set_contiguous(out, TPR_I32, 1, (const int64_t[]){1});
  return TPR_OK;
}

static tpr_status infer_router_sigmoid_topk(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *lg = in[0], *bias = in[1];
  TPR_CHECK(tpr__need_dtype("router_sigmoid_topk", lg, TPR_F32, "logits"));
  TPR_CHECK(tpr__need_dtype("router_sigmoid_topk", bias, TPR_F32, "bias"));
  TPR_CHECK(tpr__need_ndim("router_sigmoid_topk", lg, 2, "logits", "(T, E)"));
  int64_t E = lg->shape[1];
  if (bias->ndim != 1 || bias->shape[0] != E)
    return TPR_FAIL(TPR_ERR_SHAPE, "router_sigmoid_topk: bias must be (E) = (%lld), got %d-D with first dim %lld",
                    (long long)E, bias->ndim, (long long)(bias->ndim ? bias->shape[0] : 0));
  if (at->n_i < 1 || at->i[0] < 1 || at->i[0] > E)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "router_sigmoid_topk: k = %lld must be in [1, E = %lld]",
                    (long long)(at->n_i < 1 ? 0 : at->i[0]), (long long)E);
  tpr__set_contiguous(out, TPR_F32, 2, lg->shape);
  return TPR_OK;
}

static tpr_status infer_moe_experts(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  const tpr_tensor *x = in[0], *g = in[1], *w13 = in[2], *w2 = in[3];
  const char *op = "moe_experts";
  TPR_CHECK(tpr__need_dtype(op, x, TPR_F32, "x"));
  TPR_CHECK(tpr__need_dtype(op, g, TPR_F32, "gates"));
  TPR_CHECK(tpr__need_expert_dtypes(op, w13, w2));
  TPR_CHECK(tpr__need_expert_scales(op, in, at));
  TPR_CHECK(tpr__need_ndim(op, x, 2, "x", "(T, H)"));
  TPR_CHECK(tpr__need_ndim(op, g, 2, "gates", "(T, E)"));
  TPR_CHECK(tpr__need_ndim(op, w13, 3, "w13", "(E, 2F, H)"));
  TPR_CHECK(tpr__need_ndim(op, w2, 3, "w2", "(E, H, F)"));
  int64_t T = x->shape[0], H = x->shape[1], E = g->shape[1], F2 = w13->shape[1];
  if (g->shape[0] != T)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: gates have %lld rows, x has T = %lld", op, (long long)g->shape[0],
                    (long long)T);
  if (w13->shape[0] != E || F2 % 2 || w13->shape[2] != H)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: w13 is (%lld, %lld, %lld); expected (E = %lld, 2F even, H = %lld)", op,
                    (long long)w13->shape[0], (long long)F2, (long long)w13->shape[2], (long long)E, (long long)H);
  if (w2->shape[0] != E || w2->shape[1] != H || w2->shape[2] != F2 / 2)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: w2 is (%lld, %lld, %lld); expected (E = %lld, H = %lld, F = %lld)", op,
                    (long long)w2->shape[0], (long long)w2->shape[1], (long long)w2->shape[2], (long long)E,
                    (long long)H, (long long)(F2 / 2));
  tpr__set_contiguous(out, TPR_F32, 2, x->shape);
  return TPR_OK;
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
    [TPR_OP_ALL_REDUCE] = {"all_reduce", 1, false, infer_all_reduce},
    [TPR_OP_ALL_GATHER] = {"all_gather", 1, false, infer_all_gather},
    [TPR_OP_REDUCE_SCATTER] = {"reduce_scatter", 1, false, infer_reduce_scatter},
    [TPR_OP_ALL_TO_ALL] = {"all_to_all", 1, false, infer_all_to_all},
    [TPR_OP_SUM_SQUARES] = {"sum_squares", 1, false, infer_sum_squares},
    [TPR_OP_RMS_SCALE] = {"rms_scale", 3, false, infer_rms_scale},
    [TPR_OP_EMBEDDING_SHARD] = {"embedding_shard", 3, false, infer_embedding_shard},
    [TPR_OP_ROPE] = {"rope", 2, false, infer_rope},
    [TPR_OP_ATTENTION] = {"attention", 4, false, infer_attention},
    [TPR_OP_CACHE_WRITE] = {"cache_write", 3, false, infer_cache_write},
    [TPR_OP_ROUTER_SIGMOID_TOPK] = {"router_sigmoid_topk", 2, false, infer_router_sigmoid_topk},
    [TPR_OP_MOE_EXPERTS] = {"moe_experts", 4, false, infer_moe_experts},
    // Expert parallelism: rules in moe_rules.c.
    [TPR_OP_MOE_CAPACITY] = {"moe_capacity", 1, false, tpr__infer_moe_capacity},
    [TPR_OP_ROW_SLICE] = {"row_slice", 2, false, tpr__infer_row_slice},
    [TPR_OP_MOE_COUNTS] = {"moe_counts", 1, false, tpr__infer_moe_counts},
    [TPR_OP_MOE_PERMUTE] = {"moe_permute", 2, false, tpr__infer_moe_permute},
    [TPR_OP_ALL_TO_ALLV] = {"all_to_allv", 3, false, tpr__infer_all_to_allv},
    [TPR_OP_MOE_GROUPED_FFN] = {"moe_grouped_ffn", 4, false, tpr__infer_moe_grouped_ffn},
    [TPR_OP_MOE_UNPERMUTE] = {"moe_unpermute", 2, false, tpr__infer_moe_unpermute},
    // Training: rules in grad_rules_basic.c and beside each family's.
    [TPR_OP_GRAD_ALL_REDUCE] = {"grad_all_reduce", 1, true, tpr__infer_grad_all_reduce},
    [TPR_OP_SUM_TO] = {"sum_to", 1, false, tpr__infer_sum_to},
    [TPR_OP_SCALE] = {"scale", 1, false, tpr__infer_scale},
    [TPR_OP_FILL] = {"fill", 1, false, tpr__infer_fill},

    // -- dense backward
    [TPR_OP_RMS_NORM_BWD] = {"rms_norm_bwd", 3, false, tpr__infer_rms_norm_bwd},
    [TPR_OP_SWIGLU_BWD] = {"swiglu_bwd", 3, false, tpr__infer_swiglu_bwd},
    [TPR_OP_SOFTMAX_BWD] = {"softmax_bwd", 2, false, tpr__infer_softmax_bwd},
    [TPR_OP_EMBEDDING_BWD] = {"embedding_bwd", 2, false, tpr__infer_embedding_bwd},
    [TPR_OP_EMBEDDING_SHARD_BWD] = {"embedding_shard_bwd", 3, false, tpr__infer_embedding_shard_bwd},
    [TPR_OP_INDEX_SELECT_BWD] = {"index_select_bwd", 2, false, tpr__infer_index_select_bwd},
    [TPR_OP_SLICE_BWD] = {"slice_bwd", 1, false, tpr__infer_slice_bwd},
    [TPR_OP_RMS_SCALE_BWD] = {"rms_scale_bwd", 4, false, tpr__infer_rms_scale_bwd},

    // -- attention backward (rope, attention)
    [TPR_OP_ROPE_BWD] = {"rope_bwd", 2, false, tpr__infer_rope_bwd},
    [TPR_OP_ATTENTION_BWD] = {"attention_bwd", 5, false, tpr__infer_attention_bwd},

    // -- MoE backward
    [TPR_OP_ROUTER_SIGMOID_TOPK_BWD] = {"router_sigmoid_topk_bwd", 3, false, tpr__infer_router_sigmoid_topk_bwd},
    [TPR_OP_MOE_EXPERTS_BWD] = {"moe_experts_bwd", 5, false, tpr__infer_moe_experts_bwd},
    [TPR_OP_MOE_GROUPED_FFN_BWD] = {"moe_grouped_ffn_bwd", 5, false, tpr__infer_moe_grouped_ffn_bwd},
    [TPR_OP_MOE_PERMUTE_BWD] = {"moe_permute_bwd", 2, false, tpr__infer_moe_permute_bwd},
    [TPR_OP_MOE_UNPERMUTE_BWD] = {"moe_unpermute_bwd", 3, false, tpr__infer_moe_unpermute_bwd},
    [TPR_OP_ROW_SLICE_BWD] = {"row_slice_bwd", 2, false, tpr__infer_row_slice_bwd},
    [TPR_OP_MOE_CAPACITY_BWD] = {"moe_capacity_bwd", 2, false, tpr__infer_moe_capacity_bwd},

    // -- losses
    [TPR_OP_XENT_MAX] = {"xent_max", 2, false, tpr__infer_xent_max},
    [TPR_OP_XENT_SUMEXP] = {"xent_sumexp", 3, false, tpr__infer_xent_sumexp},
    [TPR_OP_XENT_SUMEXP_BWD] = {"xent_sumexp_bwd", 4, false, tpr__infer_xent_sumexp_bwd},
    [TPR_OP_XENT_TARGET] = {"xent_target", 3, false, tpr__infer_xent_target},
    [TPR_OP_XENT_TARGET_BWD] = {"xent_target_bwd", 3, false, tpr__infer_xent_target_bwd},
    [TPR_OP_XENT_LOSS] = {"xent_loss", 4, false, tpr__infer_xent_loss},
    [TPR_OP_XENT_LOSS_BWD] = {"xent_loss_bwd", 3, false, tpr__infer_xent_loss_bwd},
    [TPR_OP_MOE_AUX_STATS] = {"moe_aux_stats", 1, false, tpr__infer_moe_aux_stats},
    [TPR_OP_MOE_AUX_STATS_BWD] = {"moe_aux_stats_bwd", 2, false, tpr__infer_moe_aux_stats_bwd},
    [TPR_OP_MOE_AUX_LOSS] = {"moe_aux_loss", 1, false, tpr__infer_moe_aux_loss},
    [TPR_OP_MOE_AUX_LOSS_BWD] = {"moe_aux_loss_bwd", 2, false, tpr__infer_moe_aux_loss_bwd},

    [TPR_OP_PARAM_GATHER] = {"param_gather", 1, false, infer_param_gather},
    // -- paged attention
    [TPR_OP_PAGED_CACHE_WRITE] = {"paged_cache_write", 3, false, tpr__infer_paged_cache_write},
    [TPR_OP_PAGED_ATTENTION] = {"paged_attention", 6, false, tpr__infer_paged_attention},

};

// Kinds are numbered ahead of their rules while an op family is being added:
// a kind with no entry is unknown.
static bool op_valid(tpr_op_kind op) { return (unsigned)op < TPR_OP_KIND_COUNT && ops[op].infer; }

const char *tpr_op_name(tpr_op_kind op) { return op_valid(op) ? ops[op].name : "?"; }
int tpr_op_num_inputs(tpr_op_kind op) { return op_valid(op) ? ops[op].n_inputs : -1; }
bool tpr_op_is_view(tpr_op_kind op) { return op_valid(op) && ops[op].is_view; }
// all_to_allv came later than 12..15, so the collectives are not one range.
bool tpr_op_is_collective(tpr_op_kind op) {
  return (op >= TPR_OP_ALL_REDUCE && op <= TPR_OP_ALL_TO_ALL) || op == TPR_OP_ALL_TO_ALLV ||
         op == TPR_OP_PARAM_GATHER;
}

tpr_status tpr__op_infer(tpr_op_kind op, const tpr_tensor *const *in, int n_in, const tpr_op_attrs *attrs,
                         tpr_tensor *out) {
  static const tpr_op_attrs no_attrs;
  if (!op_valid(op)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "unknown op kind %d", (int)op);
  int block = tpr__fp8_block_attr(op, attrs), want = ops[op].n_inputs + (block > 0 ? tpr__fp8_extra_inputs(op) : 0);
  if (n_in != want)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s takes %d inputs%s, got %d", ops[op].name, want,
                    block > 0 ? " in its FP8 form (the weights' scales last)" : "", n_in);
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
  if (!op_valid(op)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "unknown op kind %d", (int)op);
  if (!attrs) attrs = &no_attrs;
  tpr_tensor want;
  TPR_CHECK(tpr__op_infer(op, in, n_in, attrs, &want));
  if (ops[op].is_view)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s is a view: use tpr_tensor_%s", ops[op].name, ops[op].name);
  if (tpr_op_is_collective(op))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s is a collective: call tpr_comm_%s, or run it in a program exec given "
                    "communicators (tpr_exec_set_collectives)", ops[op].name, ops[op].name);
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

#define RUN3(op, a, b, c, at) tpr_op_run(be, op, (const tpr_tensor *const[]){a, b, c}, 3, at, out)
#define RUN4(op, a, b, c, d, at) tpr_op_run(be, op, (const tpr_tensor *const[]){a, b, c, d}, 4, at, out)

tpr_status tpr_sum_squares(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out) {
  return tpr_op_run(be, TPR_OP_SUM_SQUARES, (const tpr_tensor *const[]){x}, 1, NULL, out);
}

tpr_status tpr_rms_scale(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *sumsq, const tpr_tensor *weight,
                         float divisor, float eps, tpr_tensor *out) {
  tpr_op_attrs at = {.n_f = 2, .f = {divisor, eps}};
  return RUN3(TPR_OP_RMS_SCALE, x, sumsq, weight, &at);
}

tpr_status tpr_embedding_shard(tpr_backend *be, const tpr_tensor *table, const tpr_tensor *ids,
                               const tpr_tensor *shard, tpr_tensor *out) {
  return RUN3(TPR_OP_EMBEDDING_SHARD, table, ids, shard, NULL);
}

tpr_status tpr_rope(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *positions, int64_t rotary_dim,
                    float theta, tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {rotary_dim}, .n_f = 1, .f = {theta}};
  return RUN2(TPR_OP_ROPE, x, positions, &at);
}

tpr_status tpr_attention(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k_cache, const tpr_tensor *v_cache,
                         const tpr_tensor *start, float scale, tpr_tensor *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {scale}};
  return RUN4(TPR_OP_ATTENTION, q, k_cache, v_cache, start, &at);
}

tpr_status tpr_cache_write(tpr_backend *be, tpr_tensor *cache, const tpr_tensor *new_rows, const tpr_tensor *start,
                           tpr_tensor *out) {
  return RUN3(TPR_OP_CACHE_WRITE, cache, new_rows, start, NULL);
}

tpr_status tpr_router_sigmoid_topk(tpr_backend *be, const tpr_tensor *logits, const tpr_tensor *bias, int k,
                                   tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {k}};
  return RUN2(TPR_OP_ROUTER_SIGMOID_TOPK, logits, bias, &at);
}

tpr_status tpr_moe_experts(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *gates, const tpr_tensor *w13,
                           const tpr_tensor *w2, tpr_tensor *out) {
  return RUN4(TPR_OP_MOE_EXPERTS, x, gates, w13, w2, NULL);
}
