// The rope op's attributes (rope.h: pairing, MRoPE layout and sections)
// and the shape rule rope and rope_bwd share.
#include <math.h>

#include "rope.h"
#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

tpr_op_attrs tpr_rope_attrs(const tpr_rope_opts *o) {
  return (tpr_op_attrs){.n_i = 6,
                        .i = {o->rotary_dim, o->pairing, o->layout, o->section[0], o->section[1], o->section[2]},
                        .n_f = 1,
                        .f = {o->theta}};
}

tpr_status tpr__rope_variant(const char *op, const tpr_op_attrs *at, tpr_rope_opts *o) {
  *o = (tpr_rope_opts){.rotary_dim = at->n_i > 0 ? at->i[0] : 0, .theta = at->n_f > 0 ? at->f[0] : 0};
  int64_t pair = at->n_i > 1 ? at->i[1] : 0, layout = at->n_i > 2 ? at->i[2] : 0;
  if (pair != TPR_ROPE_PAIR_HALF && pair != TPR_ROPE_PAIR_INTERLEAVE)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: pairing i[1] = %lld; 0 (NeoX half) or 1 (GPT-J interleave)", op,
                    (long long)pair);
  if (layout < TPR_MROPE_NONE || layout > TPR_MROPE_INTERLEAVED)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: MRoPE layout i[2] = %lld; 0 none, 1 sectioned, 2 interleaved", op,
                    (long long)layout);
  o->pairing = (tpr_rope_pairing)pair, o->layout = (tpr_mrope_layout)layout;
  if (layout == TPR_MROPE_NONE) return TPR_OK;
  if (at->n_i < 6) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: MRoPE needs mrope_section in i[3..5]", op);
  int64_t sum = 0;
  for (int a = 0; a < 3; a++) {
    o->section[a] = at->i[3 + a];
    if (o->section[a] < 0 || o->section[a] > (1 << 20))
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: mrope_section[%d] = %lld out of range", op, a,
                      (long long)o->section[a]);
    sum += o->section[a];
  }
  if (sum * 2 != o->rotary_dim)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: mrope_section [%lld, %lld, %lld] sums to %lld, not rotary_dim/2 = %lld",
                    op, (long long)o->section[0], (long long)o->section[1], (long long)o->section[2],
                    (long long)sum, (long long)(o->rotary_dim / 2));
  return TPR_OK;
}

// x (T, heads, D) f32, positions (T) or, MRoPE, (3, T) i32/i64; rope's
// attributes (rope.h) -> x's shape. rope and rope_bwd share it.
static tpr_status rope_check(const char *op, const tpr_tensor *x, const tpr_tensor *pos, const tpr_op_attrs *attrs,
                             tpr_tensor *out) {
  TPR_CHECK(tpr__need_dtype(op, x, TPR_F32, "x"));
  TPR_CHECK(tpr__need_index_dtype(op, pos));
  TPR_CHECK(tpr__need_ndim(op, x, 3, "x", "(T, heads, D)"));
  if (attrs->n_i < 1 || attrs->n_f < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs i[0] rotary_dim and f[0] theta", op);
  tpr_rope_opts v;
  TPR_CHECK(tpr__rope_variant(op, attrs, &v));
  if (v.layout == TPR_MROPE_NONE && (pos->ndim != 1 || pos->shape[0] != x->shape[0]))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: positions must be (T) = (%lld), got %d-D with first dim %lld", op,
                    (long long)x->shape[0], pos->ndim, (long long)(pos->ndim ? pos->shape[0] : 0));
  if (v.layout != TPR_MROPE_NONE && (pos->ndim != 2 || pos->shape[0] != 3 || pos->shape[1] != x->shape[0]))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: MRoPE positions must be (3, T) = (3, %lld), got %d-D (%lld, %lld)", op,
                    (long long)x->shape[0], pos->ndim, (long long)(pos->ndim ? pos->shape[0] : 0),
                    (long long)(pos->ndim > 1 ? pos->shape[1] : 0));
  int64_t rd = attrs->i[0], D = x->shape[2];
  if (rd <= 0 || rd % 2 || rd > D)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: rotary_dim %lld must be even and in (0, D = %lld]", op, (long long)rd,
                    (long long)D);
  if (!(attrs->f[0] > 0) || isinf(attrs->f[0]))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: theta %g must be finite and > 0", op, (double)attrs->f[0]);
  tpr__set_contiguous(out, TPR_F32, 3, x->shape);
  return TPR_OK;
}

static tpr_status infer_rope(const tpr_tensor *const *in, const tpr_op_attrs *at, tpr_tensor *out) {
  return rope_check("rope", in[0], in[1], at, out);
}

// dy (T, heads, D) f32, positions as rope's; rope's attrs -> dx, dy's shape.
TPR__OP_RULE(rope_bwd) { return rope_check("rope_bwd", in[0], in[1], attrs, out); }

tpr_status tpr_rope_ex(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *positions, const tpr_rope_opts *o,
                       tpr_tensor *out) {
  tpr_op_attrs at = tpr_rope_attrs(o);
  return tpr_op_run(be, TPR_OP_ROPE, (const tpr_tensor *const[]){x, positions}, 2, &at, out);
}

const tpr__op_def tpr__rope_ops[] = {
    {TPR_OP_ROPE, "rope", 2, false, infer_rope},
    {TPR_OP_ROPE_BWD, "rope_bwd", 2, false, infer_rope_bwd},
    {0},
};
