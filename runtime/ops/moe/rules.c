// Shape rules and eager wrappers of the expert-parallel ops (ops.h,
// "Expert parallelism"): capacity mode, row_slice, the alltoall dispatcher
// (moe_counts, moe_permute, all_to_allv, moe_grouped_ffn, moe_unpermute).
// Rules check everything the descriptors and attributes tell; what depends
// on tensor contents (counts, part) is checked by the kernels.
#include <math.h>
#include <string.h>

#include "runtime/ops/rule_checks.h"

// A 2-D f32 routing tensor: gates (N, E).
static tpr_status need_gates(const char *op, const tpr_tensor *g) {
  TPR_CHECK(tpr__need_dtype(op, g, TPR_F32, "gates"));
  return tpr__need_ndim(op, g, 2, "gates", "(N, E)");
}

// A 1-D i32 counts vector whose length is a positive multiple of
// `group` (n peers or sources, each with the same number of entries).
static tpr_status need_counts(const char *op, const tpr_tensor *c, const char *which, int64_t group,
                              const char *group_name) {
  TPR_CHECK(tpr__need_dtype(op, c, TPR_I32, which));
  TPR_CHECK(tpr__need_ndim(op, c, 1, which, "(n*m)"));
  int64_t len = c->shape[0];
  if (group < 1 || len < group || len % group)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s has %lld entries; need a positive multiple of %s = %lld", op, which,
                    (long long)len, group_name, (long long)group);
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

// The collective rule (axis, group size, contiguous input, as the other
// collectives) plus the two count vectors of the same (n*m) layout.
TPR__OP_RULE(all_to_allv) {
  const char *op = "all_to_allv";
  const tpr_tensor *x = in[0];
  TPR_CHECK(tpr__need_collective_attrs(op, attrs, 3, "axis, group size, rows"));
  int64_t n = attrs->i[1], rows = attrs->i[2];
  if (rows < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: rows = %lld must be >= 0", op, (long long)rows);
  if (x->ndim < 1) return TPR_FAIL(TPR_ERR_SHAPE, "%s: x needs a leading (row) dim", op);
  if (!tpr_tensor_is_contiguous(x))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: x must be contiguous (cast it to a contiguous copy first)", op);
  TPR_CHECK(need_counts(op, in[1], "send_counts", n, "the group size"));
  TPR_CHECK(need_counts(op, in[2], "recv_counts", n, "the group size"));
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

TPR__OP_RULE(moe_grouped_ffn) {
  const char *op = "moe_grouped_ffn";
  const tpr_tensor *x = in[0], *c = in[1], *w13 = in[2], *w2 = in[3];
  TPR_CHECK(tpr__need_dtype(op, x, TPR_F32, "x"));
  TPR_CHECK(tpr__need_expert_dtypes(op, w13, w2));
  TPR_CHECK(tpr__need_expert_scales(op, in, attrs));
  TPR_CHECK(tpr__need_ndim(op, x, 2, "x", "(R, H)"));
  TPR_CHECK(tpr__need_ndim(op, w13, 3, "w13", "(Er, 2F, H)"));
  TPR_CHECK(tpr__need_ndim(op, w2, 3, "w2", "(Er, H, F)"));
  int64_t H = x->shape[1], Er = w13->shape[0], F2 = w13->shape[1];
  if (Er < 1 || F2 % 2 || w13->shape[2] != H)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: w13 is (%lld, %lld, %lld); expected (Er >= 1, 2F even, H = %lld)", op,
                    (long long)Er, (long long)F2, (long long)w13->shape[2], (long long)H);
  if (w2->shape[0] != Er || w2->shape[1] != H || w2->shape[2] != F2 / 2)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: w2 is (%lld, %lld, %lld); expected (Er = %lld, H = %lld, F = %lld)", op,
                    (long long)w2->shape[0], (long long)w2->shape[1], (long long)w2->shape[2], (long long)Er,
                    (long long)H, (long long)(F2 / 2));
  // counts (n*Er): n source blocks, one count per local expert each.
  TPR_CHECK(need_counts(op, c, "counts", Er, "w13's expert count Er"));
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

// ---- Eager wrappers.
#define RUN(op, at, n, ...) tpr_op_run(be, op, (const tpr_tensor *const[]){__VA_ARGS__}, n, at, out)

tpr_status tpr_moe_capacity(tpr_backend *be, const tpr_tensor *gates, int64_t top_k, float factor, bool reroute,
                            uint64_t seed, tpr_tensor *out) {
  // The seed travels as an int64 attribute; the kernel reads the bits back.
  tpr_op_attrs at = {.n_i = 3, .i = {top_k, reroute, (int64_t)seed}, .n_f = 1, .f = {factor}};
  return RUN(TPR_OP_MOE_CAPACITY, &at, 1, gates);
}

tpr_status tpr_row_slice(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *part, int64_t n, tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {n}};
  return RUN(TPR_OP_ROW_SLICE, &at, 2, x, part);
}

tpr_status tpr_moe_counts(tpr_backend *be, const tpr_tensor *gates, tpr_tensor *out) {
  return RUN(TPR_OP_MOE_COUNTS, NULL, 1, gates);
}

tpr_status tpr_moe_permute(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *gates, tpr_tensor *out) {
  if (!out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_permute: NULL output");
  // R is out's row count; a non-2-D out fails the shape comparison in tpr_op_run.
  tpr_op_attrs at = {.n_i = 1, .i = {out->ndim > 0 ? out->shape[0] : 0}};
  return RUN(TPR_OP_MOE_PERMUTE, &at, 2, x, gates);
}

tpr_status tpr_moe_grouped_ffn(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *counts, const tpr_tensor *w13,
                               const tpr_tensor *w2, tpr_tensor *out) {
  return RUN(TPR_OP_MOE_GROUPED_FFN, NULL, 4, x, counts, w13, w2);
}

tpr_status tpr_moe_unpermute(tpr_backend *be, const tpr_tensor *y, const tpr_tensor *gates, tpr_tensor *out) {
  return RUN(TPR_OP_MOE_UNPERMUTE, NULL, 2, y, gates);
}
