// Checks the shape rules of every op family share (rule_checks.c). Each
// fails with a message naming the op and the operand (`which`).
#ifndef TPR_OPS_RULE_CHECKS_H
#define TPR_OPS_RULE_CHECKS_H

#include "runtime/ops.h"

tpr_status tpr__need_dtype(const char *op, const tpr_tensor *t, tpr_dtype dt, const char *which);
tpr_status tpr__need_index_dtype(const char *op, const tpr_tensor *t);  // i32 or i64
tpr_status tpr__need_ndim(const char *op, const tpr_tensor *t, int nd, const char *which, const char *dims);
// A run-time scalar operand (start, shard, part): shape (1), i32 or i64.
tpr_status tpr__need_scalar_index(const char *op, const tpr_tensor *t, const char *which);
// a and b (named an, bn) have one shape.
tpr_status tpr__need_same_shape(const char *op, const tpr_tensor *a, const char *an, const tpr_tensor *b,
                                const char *bn);
// A 1-D i32 counts vector whose length is a positive multiple of `group`
// (n peers or sources, each with the same number of entries).
tpr_status tpr__need_counts(const char *op, const tpr_tensor *c, const char *which, int64_t group,
                            const char *group_name);
// A cotangent: f32 with exactly `like`'s shape.
tpr_status tpr__need_like(const char *op, const tpr_tensor *d, const tpr_tensor *like, const char *which);
// Runs forward op `fwd`'s rule on in[0..n) into *y (a backward op checks the
// forward's inputs with the forward's own rule, so the two never disagree);
// a failure is re-raised naming the backward op `op` too.
tpr_status tpr__need_forward(const char *op, tpr_op_kind fwd, const tpr_tensor *const *in, int n,
                             const tpr_op_attrs *attrs, tpr_tensor *y);

// A weight operand: f32, or bf16 kept as the checkpoint holds it (the CPU
// kernels widen it as they read; the other backends take f32 only).
tpr_status tpr__need_weight_dtype(const char *op, const tpr_tensor *t, const char *which);
// The FP8 form of matmul / moe_experts / moe_grouped_ffn (ops.h): the
// scale block its attrs give, 0 for the plain form.
int tpr__fp8_block_attr(tpr_op_kind op, const tpr_op_attrs *at);
int tpr__fp8_extra_inputs(tpr_op_kind op);  // inputs the FP8 form adds: the weights' scales
// Inputs the op's attributes add after its plain form's. Attention's
// document form (ops.h: i[0] = 1): the (T) i32 lower bounds of the keys each
// query sees. Lightning attention's prefill and its backward (i[1] = 1): the
// same (T) i32 input, each token's document start, where the state restarts
// from zero. Sparse attention (i[7], a bit set): its compressed-key pool
// (TPR_SPARSE_CK_POOL), then each token's sequence's prefill length
// (TPR_SPARSE_PREFILL_LEN), which decides dense or sparse per row.
int tpr__optional_inputs(tpr_op_kind op, const tpr_op_attrs *at);
// An FP8 weight (..., N, K) with f32 scales (..., N, ceil(K / block)).
tpr_status tpr__need_fp8_weight(const char *op, const tpr_tensor *w, const tpr_tensor *scale, int block,
                                const char *which);

// out := contiguous tensor of dtype and shape.
void tpr__set_contiguous(tpr_tensor *out, tpr_dtype dt, int ndim, const int64_t *shape);
// out := the packed results of a backward op: (n) f32 (ops.h, "Training").
void tpr__set_packed(tpr_tensor *out, int64_t n);
// out := contiguous dt with x's shape but for dim `dim`, which is n.
void tpr__set_dim(tpr_tensor *out, tpr_dtype dt, const tpr_tensor *x, int dim, int64_t n);

#endif
