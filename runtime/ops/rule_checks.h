// Shape rules that live outside op_table.c, one file per op family; the op
// table points at them. Each has op_table.c's infer signature: in[] holds
// exactly the op's arity of non-NULL descriptors, attrs is never NULL (its
// counts are in range), and on success out is filled as a contiguous tensor.
#ifndef TPR_OPS_OP_RULES_H
#define TPR_OPS_OP_RULES_H

#include "runtime/ops.h"

// Checks the rules share (op_table.c): each fails naming op and `which`.
tpr_status tpr__need_dtype(const char *op, const tpr_tensor *t, tpr_dtype dt, const char *which);
// A weight operand: f32, or bf16 kept as the checkpoint holds it (the CPU
// kernels widen it as they read; the other backends take f32 only).
tpr_status tpr__need_weight_dtype(const char *op, const tpr_tensor *t, const char *which);
// The FP8 form of matmul / moe_experts / moe_grouped_ffn (ops.h): the
// scale block its attrs give, 0 for the plain form.
int tpr__fp8_block_attr(tpr_op_kind op, const tpr_op_attrs *at);
int tpr__fp8_extra_inputs(tpr_op_kind op);  // inputs the FP8 form adds: the weights' scales
// An FP8 weight (..., N, K) with f32 scales (..., N, ceil(K / block)).
tpr_status tpr__need_fp8_weight(const char *op, const tpr_tensor *w, const tpr_tensor *scale, int block,
                                const char *which);
// The expert ops' scales (in[4], in[5]) in their FP8 form; FP8 weights
// without it are TPR_ERR_DTYPE.
tpr_status tpr__need_expert_scales(const char *op, const tpr_tensor *const *in, const tpr_op_attrs *at);
// The experts' w13 and w2: one weight dtype (or both FP8).
tpr_status tpr__need_expert_dtypes(const char *op, const tpr_tensor *w13, const tpr_tensor *w2);
tpr_status tpr__need_index_dtype(const char *op, const tpr_tensor *t);  // i32 or i64
tpr_status tpr__need_ndim(const char *op, const tpr_tensor *t, int nd, const char *which, const char *dims);
// A run-time scalar operand (start, shard, part): shape (1), i32 or i64.
tpr_status tpr__need_scalar_index(const char *op, const tpr_tensor *t, const char *which);
// Collective attributes: at least n_attrs ints (named in `names`), i[0] a
// mesh axis, i[1] a group size in [1, 2^24].
tpr_status tpr__need_collective_attrs(const char *op, const tpr_op_attrs *at, int n_attrs, const char *names);
// out := contiguous tensor of dtype and shape.
void tpr__set_contiguous(tpr_tensor *out, tpr_dtype dt, int ndim, const int64_t *shape);

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

// grad_rules_basic.c (op_table.c's neighbour): the training ops' basics.
TPR__OP_RULE(grad_all_reduce);  // view: x -> x
TPR__OP_RULE(sum_to);           // x f32 -> attrs' shape, x broadcasts to it
TPR__OP_RULE(scale);            // x f32 -> x's shape
TPR__OP_RULE(fill);             // x any -> x's shape, f32

// -- dense backward
// dense_rules.c: backward ops of the dense family (ops.h, "Training").
TPR__OP_RULE(rms_norm_bwd);         // x (..., H), w (H), dy (..., H) f32 -> packed (dx | dw)
TPR__OP_RULE(swiglu_bwd);           // gate, up, dy f32 same shape -> packed (dgate | dup)
TPR__OP_RULE(softmax_bwd);          // y, dy (..., N) f32 -> (..., N)
TPR__OP_RULE(embedding_bwd);        // dy (..., H) f32, ids (...) i32/i64; i[0] V -> (V, H)
TPR__OP_RULE(embedding_shard_bwd);  // dy (..., H), ids (...), shard (1); i[0] Vl -> (Vl, H)
TPR__OP_RULE(index_select_bwd);     // dy f32, index (k); i[0] dim, i[1] n -> dy's shape, n at dim
TPR__OP_RULE(slice_bwd);            // dy f32; i[0] dim, i[1] start, i[2] full -> dy's shape, full at dim
TPR__OP_RULE(rms_scale_bwd);        // x (..., N), sumsq (..., 1), w (N), dy -> packed (dx | dsumsq | dw)

// -- attention backward (rope, attention)
// attention_rules.c
TPR__OP_RULE(rope_bwd);       // dy (T, heads, D) f32, positions (T) i32/i64 -> (T, heads, D)
TPR__OP_RULE(attention_bwd);  // q, k, v, start, dout -> packed (dq | dk | dv) f32

// -- MoE backward
// moe_grad_rules.c: the MoE ops' backward (ops.h, "Training").
TPR__OP_RULE(router_sigmoid_topk_bwd);  // logits (T, E), bias (E), dy (T, E) -> (T, E)
TPR__OP_RULE(moe_experts_bwd);          // moe_experts' inputs, dy (T, H) -> packed (dx | dgates | dw13 | dw2)
TPR__OP_RULE(moe_grouped_ffn_bwd);      // moe_grouped_ffn's inputs, dy (R, H) -> packed (dx | dw13 | dw2)
TPR__OP_RULE(moe_permute_bwd);          // dy (R, H), gates (N, E) -> (N, H)
TPR__OP_RULE(moe_unpermute_bwd);        // y (R, H), gates (N, E), dout (N, H) -> packed (dy | dgates)
TPR__OP_RULE(row_slice_bwd);            // dy (Ts, C), part (1); i[0] n, i[1] T -> (T, C)
TPR__OP_RULE(moe_capacity_bwd);         // gates_in (T, E), dout (T, E); capacity's attrs -> (T, E)

// -- losses
// loss_rules.c: vocab-parallel cross-entropy and the MoE auxiliary loss.
TPR__OP_RULE(xent_max);           // logits (T, Vl) f32, shard (1) -> (T, 1)
TPR__OP_RULE(xent_sumexp);        // logits, max (T, 1), shard -> (T, 1)
TPR__OP_RULE(xent_sumexp_bwd);    // logits, max, shard, dy (T, 1) -> (T, Vl)
TPR__OP_RULE(xent_target);        // logits, targets (T) i32/i64, shard -> (T, 1)
TPR__OP_RULE(xent_target_bwd);    // dy (T, 1), targets, shard -> (T, Vl = i[0])
TPR__OP_RULE(xent_loss);          // sumexp, max, target (T, 1), targets (T) -> (1)
TPR__OP_RULE(xent_loss_bwd);      // sumexp, targets, dloss (1) -> (2T)
TPR__OP_RULE(moe_aux_stats);      // router logits (T, E) f32 -> (2, E)
TPR__OP_RULE(moe_aux_stats_bwd);  // logits (T, E), dstats (2, E) -> (T, E)
TPR__OP_RULE(moe_aux_loss);       // stats (2, E) -> (1)
TPR__OP_RULE(moe_aux_loss_bwd);   // stats (2, E), dloss (1) -> (2, E)

// -- paged attention
// paged_rules.c: the paged KV cache (ops.h, "Batched inference").
TPR__OP_RULE(paged_cache_write);  // pool (NB, bs, Hkv, D), new (T, Hkv, D) f32, slot_mapping (T) i32 -> (1) i32
TPR__OP_RULE(paged_attention);    // q (T, Hq, D), k/v pools, block_tables (B, MB), seq, positions (T) -> (T, Hq, D)

#endif
