// Shape rules' checks of weight operands: f32, bf16 kept as the checkpoint
// holds it, and the FP8 forms of matmul and the expert ops (op_rules.h).
#include "rule_checks.h"

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

tpr_status tpr__need_expert_dtypes(const char *op, const tpr_tensor *w13, const tpr_tensor *w2) {
  if (w13->dtype == TPR_F8E4M3 && w2->dtype == TPR_F8E4M3) return TPR_OK;  // the FP8 form checks the scales
  TPR_CHECK(tpr__need_weight_dtype(op, w13, "w13"));
  if (w2->dtype != w13->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: w2 is %s, w13 %s; the experts need one dtype", op, tpr_dtype_name(w2->dtype),
                    tpr_dtype_name(w13->dtype));
  return TPR_OK;
}

tpr_status tpr__need_expert_scales(const char *op, const tpr_tensor *const *in, const tpr_op_attrs *at) {
  int block = tpr__fp8_block_attr(TPR_OP_MOE_EXPERTS, at);  // both expert ops keep it in i[0]
  if (block <= 0) {
    if (in[2]->dtype == TPR_F8E4M3 || in[3]->dtype == TPR_F8E4M3)
      return TPR_FAIL(TPR_ERR_DTYPE, "%s: FP8 experts need the FP8 form (a scale block and the scales)", op);
    return TPR_OK;
  }
  TPR_CHECK(tpr__need_fp8_weight(op, in[2], in[4], block, "w13"));
  return tpr__need_fp8_weight(op, in[3], in[5], block, "w2");
}

