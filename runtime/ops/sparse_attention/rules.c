// Shape rule of InfLLM-v2 sparse attention (ops.h; semantics at
// tpr_pb_sparse_attention_paged in program.h). Its operands are
// paged_attention's, checked by that op's own rule so the two never disagree;
// this adds the sparse_config attributes. Index values are run-time data: the
// kernel checks them.
#include <math.h>
#include <stdio.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// i[0] kernel_size, i[1] kernel_stride, i[2] block_size, i[3] topk,
// i[4] init_blocks, i[5] window_size, i[6] dense_len; f[0] scale.
// The sparse_config attributes every form takes.
static tpr_status check_attrs(const char *op, const tpr_op_attrs *attrs) {
  if (attrs->n_i < 7)
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "%s: needs 7 integer attributes (kernel_size, kernel_stride, block_size, topk, init_blocks, "
                    "window_size, dense_len), got %d",
                    op, attrs->n_i);
  const int64_t ks = attrs->i[0], st = attrs->i[1], bs = attrs->i[2];
  if (ks < 1 || st < 1 || bs < 1 || ks % st || bs % st)
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "%s: kernel_size %lld, kernel_stride %lld, block_size %lld: each must be >= 1, and kernel_size "
                    "and block_size multiples of kernel_stride",
                    op, (long long)ks, (long long)st, (long long)bs);
  static const char *const names[] = {"topk", "init_blocks", "window_size", "dense_len"};
  for (int a = 3; a < 7; a++)
    if (attrs->i[a] < 0)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: %s = %lld must be >= 0", op, names[a - 3], (long long)attrs->i[a]);
  if (attrs->n_f < 1 || !isfinite(attrs->f[0]))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: needs a finite f[0] scale", op);
  return TPR_OK;
}

// The paged form: i[7], when given, a bit set of optional inputs after the
// six (ops.h): the compressed-key pool, then the prefill lengths.
TPR__OP_RULE(sparse_attention_paged) {
  const char *op = "sparse_attention_paged";
  TPR_CHECK(check_attrs(op, attrs));
  const int64_t opt = attrs->n_i > 7 ? attrs->i[7] : 0;
  if (opt & ~(int64_t)(TPR_SPARSE_CK_POOL | TPR_SPARSE_PREFILL_LEN))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: i[7] = %lld; the optional inputs are a bit set of 1 (compressed-key "
                    "pool) and 2 (prefill lengths)", op, (long long)opt);
  const tpr_status rc = tpr__op_infer(TPR_OP_PAGED_ATTENTION, in, 6, attrs, out);
  if (rc != TPR_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tpr_last_error());
    return TPR_FAIL(rc, "%s: its operands are paged_attention's: %s", op, why);
  }
  int at = 6;
  if (opt & TPR_SPARSE_CK_POOL) {
    // The compressed-key pool (NB, ceil(bs/stride), Hkv, D) f32 beside the KV
    // pool, written in place: contiguous, so the kernel's writes land where
    // its reads (and the next call's) look.
    const int64_t st = attrs->i[1];
    const tpr_tensor *kp = in[1], *ck = in[at++];
    const int64_t want[4] = {kp->shape[0], tpr_sparse_ck_rows(kp->shape[1], st), kp->shape[2], kp->shape[3]};
    if (ck->dtype != TPR_F32 || ck->ndim != 4 || ck->shape[0] != want[0] || ck->shape[1] != want[1] ||
        ck->shape[2] != want[2] || ck->shape[3] != want[3] || !tpr_tensor_is_contiguous(ck))
      return TPR_FAIL(TPR_ERR_INVALID_ARG,
                      "%s: the compressed-key pool must be contiguous f32 (NB %lld, ceil(bs %lld / kernel_stride "
                      "%lld) = %lld, Hkv %lld, D %lld)",
                      op, (long long)want[0], (long long)kp->shape[1], (long long)st, (long long)want[1],
                      (long long)want[2], (long long)want[3]);
  }
  if (opt & TPR_SPARSE_PREFILL_LEN) {  // (T) i32, values are data
    const tpr_tensor *pl = in[at++];
    TPR_CHECK(tpr__need_dtype(op, pl, TPR_I32, "prefill_len"));
    if (pl->ndim != 1 || pl->shape[0] != in[0]->shape[0]) {
      char got[128];
      return TPR_FAIL(TPR_ERR_SHAPE, "%s: prefill_len must be (T = %lld) i32, got %s", op,
                      (long long)in[0]->shape[0], tpr_tensor_describe(pl, got, sizeof got));
    }
  }
  return TPR_OK;
}

// The training form: q (T, Hq, D), k and v (T, Hkv, D) f32, one whole
// sequence (its keys are this call's rows) -> (T, Hq, D).
static tpr_status check_whole(const char *op, const tpr_tensor *const *in, const tpr_op_attrs *attrs) {
  TPR_CHECK(check_attrs(op, attrs));
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2];
  TPR_CHECK(tpr__need_dtype(op, q, TPR_F32, "q"));
  TPR_CHECK(tpr__need_dtype(op, k, TPR_F32, "k"));
  TPR_CHECK(tpr__need_dtype(op, v, TPR_F32, "v"));
  TPR_CHECK(tpr__need_ndim(op, q, 3, "q", "(T, Hq, D)"));
  TPR_CHECK(tpr__need_ndim(op, k, 3, "k", "(T, Hkv, D)"));
  TPR_CHECK(tpr__need_same_shape(op, k, "k", v, "v"));
  const int64_t T = q->shape[0], hq = q->shape[1], D = q->shape[2], hkv = k->shape[1];
  if (k->shape[0] != T || k->shape[2] != D)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: k (%lld, %lld, %lld) must be (T = %lld, Hkv, D = %lld): one whole sequence",
                    op, (long long)k->shape[0], (long long)hkv, (long long)k->shape[2], (long long)T, (long long)D);
  if (hkv < 1 || hq % hkv)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: Hq = %lld query heads is not a multiple of Hkv = %lld", op, (long long)hq,
                    (long long)hkv);
  return TPR_OK;
}

TPR__OP_RULE(sparse_attention) {
  TPR_CHECK(check_whole("sparse_attention", in, attrs));
  tpr__set_contiguous(out, TPR_F32, 3, in[0]->shape);
  return TPR_OK;
}

// + dout (T, Hq, D) -> packed (dq | dk | dv).
TPR__OP_RULE(sparse_attention_bwd) {
  const char *op = "sparse_attention_bwd";
  TPR_CHECK(check_whole(op, in, attrs));
  TPR_CHECK(tpr__need_like(op, in[3], in[0], "dout"));
  const int64_t *qs = in[0]->shape, *ks = in[1]->shape;
  tpr__set_packed(out, qs[0] * qs[1] * qs[2] + 2 * ks[0] * ks[1] * ks[2]);
  return TPR_OK;
}

const tpr__op_def tpr__sparse_attention_ops[] = {
    {TPR_OP_SPARSE_ATTENTION_PAGED, "sparse_attention_paged", 6, false, infer_sparse_attention_paged},
    {TPR_OP_SPARSE_ATTENTION, "sparse_attention", 3, false, infer_sparse_attention},
    {TPR_OP_SPARSE_ATTENTION_BWD, "sparse_attention_bwd", 4, false, infer_sparse_attention_bwd},
    {0},
};
