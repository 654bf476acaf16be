// Shape rules that live outside op_table.c, one file per op family; the op
// table points at them. Each has op_table.c's infer signature: in[] holds
// exactly the op's arity of non-NULL descriptors, attrs is never NULL (its
// counts are in range), and on success out is filled as a contiguous tensor.
#ifndef TPR_OPS_OP_RULES_H
#define TPR_OPS_OP_RULES_H

#include "ops.h"

#define TPR__OP_RULE(name) \
  tpr_status tpr__infer_##name(const tpr_tensor *const *in, const tpr_op_attrs *attrs, tpr_tensor *out)

// moe_rules.c: expert parallelism (ops.h, "Expert parallelism").
TPR__OP_RULE(moe_capacity);     // gates (T, E) f32 -> (T, E) f32
TPR__OP_RULE(row_slice);        // x (T, C) any, part (1) i32/i64 -> (ceil(T/n), C)
TPR__OP_RULE(moe_counts);       // gates (N, E) f32 -> (E) i32
TPR__OP_RULE(moe_permute);      // x (N, H), gates (N, E) f32 -> (R, H)
TPR__OP_RULE(all_to_allv);      // x (Ri, ...) any, counts (n*m) i32 x2 -> (Ro, ...)
TPR__OP_RULE(moe_grouped_ffn);  // x (R, H), counts (n*Er) i32, w13 (Er, 2F, H), w2 (Er, H, F) -> (R, H)
TPR__OP_RULE(moe_unpermute);    // y (R, H), gates (N, E) f32 -> (N, H)

#endif
