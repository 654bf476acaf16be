// Shape rule of InfLLM-v2 sparse attention (ops.h; semantics at
// tpr_pb_sparse_attention_paged in program.h). Its operands are
// paged_attention's, checked by that op's own rule so the two never disagree;
// this adds the sparse_config attributes. Index values are run-time data: the
// kernel checks them.
#include <stdio.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// i[0] kernel_size, i[1] kernel_stride, i[2] block_size, i[3] topk,
// i[4] init_blocks, i[5] window_size, i[6] dense_len; f[0] scale.
TPR__OP_RULE(sparse_attention_paged) {
  const char *op = "sparse_attention_paged";
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
  const tpr_status rc = tpr__op_infer(TPR_OP_PAGED_ATTENTION, in, 6, attrs, out);
  if (rc != TPR_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tpr_last_error());
    return TPR_FAIL(rc, "%s: its operands are paged_attention's: %s", op, why);
  }
  if (!tpr__attention_docs_attr(TPR_OP_SPARSE_ATTENTION_PAGED, attrs)) return TPR_OK;
  // The compressed-key pool (NB, ceil(bs/stride), Hkv, D) f32 beside the KV
  // pool, written in place: contiguous, so the kernel's writes land where
  // its reads (and the next call's) look.
  const tpr_tensor *kp = in[1], *ck = in[6];
  const int64_t want[4] = {kp->shape[0], tpr_sparse_ck_rows(kp->shape[1], st), kp->shape[2], kp->shape[3]};
  if (ck->dtype != TPR_F32 || ck->ndim != 4 || ck->shape[0] != want[0] || ck->shape[1] != want[1] ||
      ck->shape[2] != want[2] || ck->shape[3] != want[3] || !tpr_tensor_is_contiguous(ck))
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "%s: the compressed-key pool must be contiguous f32 (NB %lld, ceil(bs %lld / kernel_stride "
                    "%lld) = %lld, Hkv %lld, D %lld)",
                    op, (long long)want[0], (long long)kp->shape[1], (long long)st, (long long)want[1],
                    (long long)want[2], (long long)want[3]);
  return TPR_OK;
}

const tpr__op_def tpr__sparse_attention_ops[] = {
    {TPR_OP_SPARSE_ATTENTION_PAGED, "sparse_attention_paged", 6, false, infer_sparse_attention_paged},
    {0},
};
