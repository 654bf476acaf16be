// Shape rules of lightning attention (ops.h, tpr_lightning_attention): the
// blocked prefill, its backward and the one-token decode step. The backward
// checks what the forward checks, naming itself, plus the cotangent's shape.
#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// q, k, v: one (N, H, D) shape, f32; state (lead..., H, D, D) f32 with the
// lead dims given (prefill: none, decode: (B)); slopes (H) f32.
static tpr_status need_qkv_state(const char *op, const tpr_tensor *const *in, int state_ndim, int64_t *H,
                                 int64_t *D) {
  const tpr_tensor *q = in[0], *st = in[3], *sl = in[4];
  TPR_CHECK(tpr__need_dtype(op, q, TPR_F32, "q"));
  TPR_CHECK(tpr__need_dtype(op, in[1], TPR_F32, "k"));
  TPR_CHECK(tpr__need_dtype(op, in[2], TPR_F32, "v"));
  TPR_CHECK(tpr__need_dtype(op, st, TPR_F32, "state"));
  TPR_CHECK(tpr__need_dtype(op, sl, TPR_F32, "slopes"));
  TPR_CHECK(tpr__need_ndim(op, q, 3, "q", state_ndim == 3 ? "(T, H, D)" : "(B, H, D)"));
  TPR_CHECK(tpr__need_same_shape(op, in[1], "k", q, "q"));
  TPR_CHECK(tpr__need_same_shape(op, in[2], "v", q, "q"));
  const int64_t n = q->shape[0], h = q->shape[1], d = q->shape[2];
  TPR_CHECK(tpr__need_ndim(op, st, state_ndim, "state", state_ndim == 3 ? "(H, D, D)" : "(B, H, D, D)"));
  const int lead = state_ndim - 3;
  if ((lead && st->shape[0] != n) || st->shape[lead] != h || st->shape[lead + 1] != d || st->shape[lead + 2] != d) {
    char got[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: state must be (%s%lld, %lld, %lld) for q (%lld, %lld, %lld), got %s", op,
                    lead ? "B, " : "", (long long)h, (long long)d, (long long)d, (long long)n, (long long)h,
                    (long long)d, tpr_tensor_describe(st, got, sizeof got));
  }
  if (sl->ndim != 1 || sl->shape[0] != h) {
    char got[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: slopes must be (H = %lld), got %s", op, (long long)h,
                    tpr_tensor_describe(sl, got, sizeof got));
  }
  *H = h, *D = d;
  return TPR_OK;
}

static tpr_status need_block(const char *op, const tpr_op_attrs *at) {
  if (at->n_i < 1 || at->i[0] < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs i[0] = block size >= 1, got %lld", op,
                    at->n_i < 1 ? 0LL : (long long)at->i[0]);
  return TPR_OK;
}

// The document form's lo (T) i32 (ops.h), when i[1] asks for it. Its values
// (document starts) are data: the kernels check them at run time.
static tpr_status need_docs_lo(const char *op, const tpr_tensor *const *in, int at_index, const tpr_op_attrs *at,
                               int64_t T) {
  if (at->n_i > 1 && at->i[1] != 0 && at->i[1] != 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: i[1] = %lld; the document flag is 0 or 1", op, (long long)at->i[1]);
  if (at->n_i < 2 || at->i[1] == 0) return TPR_OK;
  const tpr_tensor *lo = in[at_index];  // present: tpr__op_infer counted the form's inputs
  TPR_CHECK(tpr__need_dtype(op, lo, TPR_I32, "lo"));
  if (lo->ndim != 1 || lo->shape[0] != T) {
    char got[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: lo must be (T = %lld) i32, got %s", op, (long long)T,
                    tpr_tensor_describe(lo, got, sizeof got));
  }
  return TPR_OK;
}

// q, k, v (T, H, D), state (H, D, D), slopes (H) [, lo (T) i32 with i[1] = 1];
// i[0] block -> (T*H*D + H*D*D).
TPR__OP_RULE(lightning_attention) {
  int64_t H, D;
  TPR_CHECK(need_qkv_state("lightning_attention", in, 3, &H, &D));
  TPR_CHECK(need_block("lightning_attention", attrs));
  TPR_CHECK(need_docs_lo("lightning_attention", in, 5, attrs, in[0]->shape[0]));
  const int64_t n = in[0]->shape[0] * H * D + H * D * D;
  tpr__set_contiguous(out, TPR_F32, 1, &n);
  return TPR_OK;
}

// The forward's inputs, then dout packed like its output [, then the
// document form's lo] -> (3*T*H*D + H*D*D).
TPR__OP_RULE(lightning_attention_bwd) {
  const char *op = "lightning_attention_bwd";
  tpr_tensor y;
  const bool docs = tpr__optional_inputs(TPR_OP_LIGHTNING_ATTENTION_BWD, attrs) > 0;
  const tpr_tensor *fwd[6] = {in[0], in[1], in[2], in[3], in[4], docs ? in[6] : NULL};
  TPR_CHECK(tpr__need_forward(op, TPR_OP_LIGHTNING_ATTENTION, fwd, 5 + docs, attrs, &y));
  TPR_CHECK(tpr__need_like(op, in[5], &y, "dout (d o | d final state)"));
  const int64_t n = 3 * tpr_tensor_numel(in[0]) + tpr_tensor_numel(in[3]);  // dq | dk | dv | dstate
  tpr__set_contiguous(out, TPR_F32, 1, &n);
  return TPR_OK;
}

// q, k, v (B, H, D), state (B, H, D, D), slopes (H) -> (B*H*D + B*H*D*D).
TPR__OP_RULE(lightning_decode) {
  int64_t H, D;
  TPR_CHECK(need_qkv_state("lightning_decode", in, 4, &H, &D));
  const int64_t n = tpr_tensor_numel(in[0]) + tpr_tensor_numel(in[3]);
  tpr__set_contiguous(out, TPR_F32, 1, &n);
  return TPR_OK;
}

// q, k, v (T, H, D), pool (NS, H, D, D), slopes (H) f32, state_slot (T) i32,
// positions (T) i32; i[0] block -> o (T, H, D). The slot and position values
// are run-time data: the kernel checks them.
TPR__OP_RULE(lightning_paged) {
  const char *op = "lightning_paged";
  const tpr_tensor *pool = in[3];
  TPR_CHECK(tpr__need_dtype(op, pool, TPR_F32, "pool"));
  TPR_CHECK(tpr__need_ndim(op, pool, 4, "pool", "(NS, H, D, D)"));
  // The state rule on one slot's (H, D, D) view.
  tpr_tensor one = *pool;
  one.ndim = 3;
  for (int d = 0; d < 3; d++) one.shape[d] = pool->shape[d + 1], one.stride[d] = pool->stride[d + 1];
  const tpr_tensor *sub[5] = {in[0], in[1], in[2], &one, in[4]};
  int64_t H, D;
  TPR_CHECK(need_qkv_state(op, sub, 3, &H, &D));
  TPR_CHECK(need_block(op, attrs));
  const int64_t T = in[0]->shape[0];
  for (int i = 5; i < 7; i++) {
    const char *which = i == 5 ? "state_slot" : "positions";
    TPR_CHECK(tpr__need_dtype(op, in[i], TPR_I32, which));
    if (in[i]->ndim != 1 || in[i]->shape[0] != T)
      return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s must be (T) = (%lld), one per token", op, which, (long long)T);
  }
  tpr__set_contiguous(out, TPR_F32, 3, in[0]->shape);
  return TPR_OK;
}

const tpr__op_def tpr__lightning_ops[] = {
    {TPR_OP_LIGHTNING_ATTENTION, "lightning_attention", 5, false, infer_lightning_attention},
    {TPR_OP_LIGHTNING_ATTENTION_BWD, "lightning_attention_bwd", 6, false, infer_lightning_attention_bwd},
    {TPR_OP_LIGHTNING_DECODE, "lightning_decode", 5, false, infer_lightning_decode},
    {TPR_OP_LIGHTNING_PAGED, "lightning_paged", 7, false, infer_lightning_paged},
    {0},
};
