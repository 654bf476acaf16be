// Shape rules of the attention family's backward ops (ops.h, "Training"):
// rope_bwd and attention_bwd. They check what their forwards check, naming
// the backward op, plus the cotangent's shape.
#include <math.h>

#include "runtime/ops/rule_checks.h"
#include "runtime/ops/rope/rope.h"

// x (T, heads, D) f32, positions (T) or, MRoPE, (3, T) i32/i64; rope's
// attributes (rope_layout.h) -> x's shape. rope and rope_bwd share it.
tpr_status tpr__rope_check(const char *op, const tpr_tensor *x, const tpr_tensor *pos, const tpr_op_attrs *attrs,
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

// dy (T, heads, D) f32, positions as rope's; rope's attrs -> dx, dy's shape.
TPR__OP_RULE(rope_bwd) { return tpr__rope_check("rope_bwd", in[0], in[1], attrs, out); }

// q (T, Hq, D), k/v (S, Hkv, D) f32, start (1) i32/i64, dout (T, Hq, D) f32;
// f[0] scale -> packed (T*Hq*D + 2*S*Hkv*D) f32.
TPR__OP_RULE(attention_bwd) {
  const char *op = "attention_bwd";
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2], *dy = in[4];
  TPR_CHECK(tpr__need_dtype(op, q, TPR_F32, "q"));
  TPR_CHECK(tpr__need_dtype(op, k, TPR_F32, "k"));
  TPR_CHECK(tpr__need_dtype(op, v, TPR_F32, "v"));
  TPR_CHECK(tpr__need_dtype(op, dy, TPR_F32, "dout"));
  TPR_CHECK(tpr__need_scalar_index(op, in[3], "start"));
  TPR_CHECK(tpr__need_ndim(op, q, 3, "q", "(T, Hq, D)"));
  TPR_CHECK(tpr__need_ndim(op, k, 3, "k", "(S, Hkv, D)"));
  TPR_CHECK(tpr__need_ndim(op, v, 3, "v", "(S, Hkv, D)"));
  const int64_t T = q->shape[0], hq = q->shape[1], D = q->shape[2], S = k->shape[0], hkv = k->shape[1];
  if (k->shape[2] != D || !tpr_tensor_same_shape(k, v))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: k (%lld, %lld, %lld) and v (%lld, %lld, %lld) must both be (S, Hkv, D = %lld)",
                    op, (long long)S, (long long)hkv, (long long)k->shape[2], (long long)v->shape[0],
                    (long long)v->shape[1], (long long)v->shape[2], (long long)D);
  if (hkv < 1 || hq % hkv)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: Hq = %lld query heads is not a multiple of Hkv = %lld", op, (long long)hq,
                    (long long)hkv);
  if (T > S)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: T = %lld queries exceed the S = %lld key rows", op, (long long)T,
                    (long long)S);
  if (!tpr_tensor_same_shape(dy, q)) {
    char got[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: dout must have q's shape (%lld, %lld, %lld), got %s", op, (long long)T,
                    (long long)hq, (long long)D, tpr_tensor_describe(dy, got, sizeof got));
  }
  if (attrs->n_f < 1 || !isfinite(attrs->f[0]))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs a finite f[0] scale", op);
  const int64_t n = T * hq * D + 2 * S * hkv * D;  // dq | dk | dv
  tpr__set_contiguous(out, TPR_F32, 1, &n);
  return TPR_OK;
}
