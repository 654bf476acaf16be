// CPU kernels, one per op kind, registered in backend_cpu.c. Each follows
// tpr_kernel_fn: inputs were checked against the op's shape rule by the
// caller, may be strided, and out is contiguous. f32 compute unless noted.
#ifndef TPR_CPU_KERNELS_H
#define TPR_CPU_KERNELS_H

#include "runtime/backend.h"

// Per-process CPU backend context.
typedef struct tpr_cpu_ctx {
  int n_threads;  // threads OpenBLAS and kernels may use
} tpr_cpu_ctx;

#define TPR_CPU_KERNEL(name)                                                             \
  tpr_status tpr__cpu_##name(void *ctx, const tpr_tensor *const *in, int n_in,           \
                             const tpr_op_attrs *attrs, tpr_tensor *out)

TPR_CPU_KERNEL(matmul);        // matmul.c: sgemm per batch; bf16 or few-row weights via weight_gemm.h
TPR_CPU_KERNEL(add);           // elementwise.c
TPR_CPU_KERNEL(mul);           // elementwise.c
TPR_CPU_KERNEL(swiglu);        // elementwise.c
TPR_CPU_KERNEL(rms_norm);      // norm.c
TPR_CPU_KERNEL(softmax);       // softmax.c
TPR_CPU_KERNEL(embedding);     // gather.c: any dtype table
TPR_CPU_KERNEL(index_select);  // gather.c: any dtype
TPR_CPU_KERNEL(cast);          // copy.c: any dtype to any dtype, strided source
TPR_CPU_KERNEL(sum_squares);          // norm.c: double accumulation
TPR_CPU_KERNEL(rms_scale);            // norm.c
TPR_CPU_KERNEL(embedding_shard);      // gather.c: any dtype table
TPR_CPU_KERNEL(rope);                 // rope.c
TPR_CPU_KERNEL(attention);            // attention.c: attention_flash.c's tiles, online softmax
TPR_CPU_KERNEL(cache_write);          // attention.c: writes its input 0 in place
TPR_CPU_KERNEL(router_sigmoid_topk);  // router.c
TPR_CPU_KERNEL(moe_experts);          // moe.c: per expert, weight_gemm.h (f32 or bf16 experts)
TPR_CPU_KERNEL(moe_grouped_ffn);      // moe.c: moe_experts' per-expert math on dispatched rows
TPR_CPU_KERNEL(moe_capacity);         // moe_dispatch.c: drop past capacity, seeded reroute
TPR_CPU_KERNEL(row_slice);            // moe_dispatch.c: any dtype
TPR_CPU_KERNEL(moe_counts);           // moe_dispatch.c
TPR_CPU_KERNEL(moe_permute);          // moe_dispatch.c
TPR_CPU_KERNEL(moe_unpermute);        // moe_dispatch.c
// Training (ops.h, "Training").
TPR_CPU_KERNEL(sum_to);               // reduce.c: double accumulation
TPR_CPU_KERNEL(scale);                // reduce.c
TPR_CPU_KERNEL(fill);                 // reduce.c

// -- dense backward
TPR_CPU_KERNEL(rms_norm_bwd);         // norm.c: double row statistics and dw
TPR_CPU_KERNEL(rms_scale_bwd);        // norm.c: double row statistics and dw
TPR_CPU_KERNEL(swiglu_bwd);           // elementwise.c
TPR_CPU_KERNEL(softmax_bwd);          // softmax.c: double row dot product
TPR_CPU_KERNEL(embedding_bwd);        // gather.c: f32 scatter-add in token order
TPR_CPU_KERNEL(embedding_shard_bwd);  // gather.c: f32 scatter-add in token order
TPR_CPU_KERNEL(index_select_bwd);     // gather.c: f32 scatter-add in index order
TPR_CPU_KERNEL(slice_bwd);            // views.c

// -- attention backward (rope, attention)
TPR_CPU_KERNEL(rope_bwd);             // rope.c: rope with the angles negated
TPR_CPU_KERNEL(attention_bwd);        // attention.c: recomputes P per query block, sgemm

// -- MoE backward
TPR_CPU_KERNEL(router_sigmoid_topk_bwd);  // router.c: recomputes the forward's selection
TPR_CPU_KERNEL(moe_experts_bwd);          // moe.c: grouped sgemm per expert, packed results
TPR_CPU_KERNEL(moe_grouped_ffn_bwd);      // moe.c: the same per-expert math on dispatched rows
TPR_CPU_KERNEL(moe_permute_bwd);          // moe_dispatch.c
TPR_CPU_KERNEL(moe_unpermute_bwd);        // moe_dispatch.c
TPR_CPU_KERNEL(row_slice_bwd);            // moe_dispatch.c
TPR_CPU_KERNEL(moe_capacity_bwd);         // moe_dispatch.c: recomputes the forward's decision

// -- losses
TPR_CPU_KERNEL(xent_max);           // xent.c: over the shard's real columns
TPR_CPU_KERNEL(xent_sumexp);        // xent.c: double accumulation
TPR_CPU_KERNEL(xent_sumexp_bwd);    // xent.c
TPR_CPU_KERNEL(xent_target);        // xent.c: checks targets
TPR_CPU_KERNEL(xent_target_bwd);    // xent.c
TPR_CPU_KERNEL(xent_loss);          // xent.c: double accumulation
TPR_CPU_KERNEL(xent_loss_bwd);      // xent.c
TPR_CPU_KERNEL(moe_aux_stats);      // moe_aux.c: softmax top-k counts, probability sums (double)
TPR_CPU_KERNEL(moe_aux_stats_bwd);  // moe_aux.c
TPR_CPU_KERNEL(moe_aux_loss);       // moe_aux.c
TPR_CPU_KERNEL(moe_aux_loss_bwd);   // moe_aux.c

// -- paged attention
TPR_CPU_KERNEL(paged_cache_write);  // paged_attention.c: writes its input 0 (the pool) in place
TPR_CPU_KERNEL(paged_attention);    // paged_attention.c: K/V read in place, attention_flash.c's tiles


#endif
