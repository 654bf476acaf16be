// Shape rule of InfLLM-v2 sparse attention (ops.h; semantics at
// tpr_pb_sparse_attention_paged in program.h). Its operands are
// paged_attention's, checked by that op's own rule so the two never disagree;
// this adds the sparse_config attributes. Index values are run-time data: the
// kernel checks them.
#include <stdio.h>

#include "runtime/ops/registry.h"
#include "runtime/ops/rule_checks.h"

// i[0] kernel_size, i[1] kernel_stride, i[2] block_size, i[3] topk,
// i[4] init_blocks, i[5] window_size, i[6] dense_len, optional i[7] = 1:
// the prefill-length form (a 7th input); f[0] scale.
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
  if (attrs->n_i > 7 && attrs->i[7] != 0 && attrs->i[7] != 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: i[7] = %lld; the prefill-length flag is 0 or 1", op,
                    (long long)attrs->i[7]);
  const tpr_status rc = tpr__op_infer(TPR_OP_PAGED_ATTENTION, in, 6, attrs, out);
  if (rc == TPR_OK) {
    if (tpr__row_input_attr(TPR_OP_SPARSE_ATTENTION_PAGED, attrs)) {  // (T) i32, values are data
      const tpr_tensor *pl = in[6];
      TPR_CHECK(tpr__need_dtype(op, pl, TPR_I32, "prefill_len"));
      if (pl->ndim != 1 || pl->shape[0] != in[0]->shape[0]) {
        char got[128];
        return TPR_FAIL(TPR_ERR_SHAPE, "%s: prefill_len must be (T = %lld) i32, got %s", op,
                        (long long)in[0]->shape[0], tpr_tensor_describe(pl, got, sizeof got));
      }
    }
    return TPR_OK;
  }
  char why[512];
  snprintf(why, sizeof why, "%s", tpr_last_error());
  return TPR_FAIL(rc, "%s: its operands are paged_attention's: %s", op, why);
}

const tpr__op_def tpr__sparse_attention_ops[] = {
    {TPR_OP_SPARSE_ATTENTION_PAGED, "sparse_attention_paged", 6, false, infer_sparse_attention_paged},
    {0},
};
