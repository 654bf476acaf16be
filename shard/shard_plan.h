// The sharding planner: which slice of every checkpoint tensor each rank
// holds, as a pure function of (model config, tp, ep, etp, dp, dtype). No
// I/O; the loader and the model builders both read it, so what is loaded and
// what the program expects cannot drift apart.
//
// Attention follows docs/architecture.md section 5 exactly (NxDI-compatible):
// Q heads padded to a multiple of tp; KV heads sharded, replicated, or
// converted to MHA; QK-norm divisors that make the all-reduced sums of
// squares match the unsharded model. Every shape here is the same on every
// rank (ranks differ only in buffer contents and the rank tensor), so a
// rank's local Q head i always reads local KV head i / (q_per_rank /
// kv_per_rank); the planner checks for every rank that this is the head the
// unsharded model would use.
#ifndef TPR_SHARD_PLAN_H
#define TPR_SHARD_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/dtype.h"
#include "shard/model_config.h"

// ---------------------------------------------------------------- attention

typedef enum tpr_kv_strategy {
  TPR_KV_SHARD = 0,           // nkv % tp == 0: rank r holds KV heads block r
  TPR_KV_REPLICATE = 1,       // tp % nkv == 0: each KV head copied tp/nkv times back to back
  TPR_KV_CONVERT_TO_MHA = 2,  // otherwise: KV repeated to nq heads, Q and KV padded at the tail
} tpr_kv_strategy;

typedef struct tpr_attn_plan {
  int tp;
  int64_t nq, nkv, head_dim;  // as in the checkpoint
  tpr_kv_strategy strategy;
  int64_t nq_padded;          // nq': nq rounded up to a multiple of tp
  int64_t nkv_eff;            // nkv': KV heads after replication / conversion / padding
  int64_t q_per_rank;         // nq' / tp
  int64_t kv_per_rank;        // nkv' / tp
  // Full-projection QK-norm (MiniMax-M2): the all-reduced sum of squares is
  // divided by these. q: nq*D (padded heads are zeros). k: the non-padding
  // KV heads after replication times D (replication multiplies the sum).
  int64_t q_norm_divisor, k_norm_divisor;
  int32_t *q_head_map;        // (nq') original Q head of each padded head, -1 for padding
  int32_t *kv_head_map;       // (nkv') original KV head of each effective head, -1 for padding
} tpr_attn_plan;

// Plans attention for nq query heads over nkv KV heads of head_dim D at
// tensor-parallel degree tp. Bad numbers are TPR_ERR_INVALID_ARG; a plan
// that fails its own consistency check is TPR_ERR_INTERNAL. Free with
// tpr_attn_plan_free.
tpr_status tpr_attn_plan_build(int64_t nq, int64_t nkv, int64_t head_dim, int tp, tpr_attn_plan *out);
void tpr_attn_plan_free(tpr_attn_plan *a);

// "shard", "replicate_kv", "convert_to_mha".
const char *tpr_kv_strategy_name(tpr_kv_strategy s);

// The local KV head that local Q head `local_q` of rank `rank` attends to.
// The answer does not depend on the rank (programs may not); the argument is
// there so callers say which rank they mean and tests can check every one.
int64_t tpr_attn_plan_local_kv(const tpr_attn_plan *a, int rank, int64_t local_q);

// ---------------------------------------------------------------- tensors

// How a checkpoint tensor becomes each rank's buffer.
typedef enum tpr_shard_transform {
  TPR_XFORM_REPLICATE = 0,      // every rank holds the whole tensor
  TPR_XFORM_COLUMN_HEADS = 1,   // q/k/v_proj (heads*D, H), and their biases (heads*D): rows laid
                                // out as the padded / replicated heads, rank r takes row block r
  TPR_XFORM_ROW_HEADS = 2,      // o_proj (H, nq*D): input columns padded like Q, block r
  TPR_XFORM_NORM_HEADS = 3,     // full-projection q_norm / k_norm: padded like Q /
                                // replicated like K, held whole; the program selects the
                                // rank's (heads_per_rank*D) slice with the rank tensor
  TPR_XFORM_VOCAB = 4,          // embed_tokens / lm_head (V, H): V padded to a multiple of
                                // tp with zero rows, row block r
  TPR_XFORM_EXPERT_COLUMN = 5,  // expert w1/w3 (I, H): experts block ep_rank, rows block etp_rank
  TPR_XFORM_EXPERT_ROW = 6,     // expert w2 (H, I): experts block ep_rank, columns block etp_rank
  TPR_XFORM_COLUMN = 7,         // dense / shared MLP gate/up (I, H): row block tp_rank
  TPR_XFORM_ROW = 8,            // dense / shared MLP down (H, I): column block tp_rank
  TPR_XFORM_COUNT
} tpr_shard_transform;

const char *tpr_shard_transform_name(tpr_shard_transform t);

// Which layers of a hybrid model (minimax) hold a per-layer attention kind.
typedef enum tpr_attn_layers {
  TPR_ATTN_LAYERS_ANY = 0,      // not an attention-type kind: the other rules decide (loader_items.c)
  TPR_ATTN_LAYERS_SOFTMAX = 1,  // q/k/v/o_proj: the softmax-attention layers only
  TPR_ATTN_LAYERS_LINEAR = 2,   // qkv_proj, output_gate, out_proj, norm: the lightning layers only
} tpr_attn_layers;

#define TPR_SHARD_MAX_TENSORS 32

typedef struct tpr_shard_tensor {
  char name[96];              // HF name; {L} = layer index, {E} = expert index
  int ndim;                   // 1 or 2
  int64_t global_shape[2];    // as stored in the checkpoint
  int64_t rank_shape[2];      // the buffer every rank holds (identical on all ranks)
  tpr_shard_transform transform;
  bool kv_layout;             // *_HEADS transforms: laid out like the KV heads (else like Q)
  bool moe_layers;            // a per-layer kind of the MoE layers only, not an expert (a shared expert)
  tpr_attn_layers attn_layers;  // hybrid models: the kind lives in these layers only
  int64_t count;              // tensors of this kind one rank holds (layers x local experts)
  uint64_t rank_bytes;        // count * numel(rank_shape) * dtype size
} tpr_shard_tensor;

typedef struct tpr_shard_plan {
  tpr_model_config config;
  tpr_dtype dtype;            // checkpoint dtype the bytes are counted in
  int world, tp, dp, ep, etp, edp;
  tpr_attn_plan attn;
  int64_t vocab_padded;       // vocab rounded up to a multiple of tp
  int64_t experts_per_rank;   // num_experts / ep
  int64_t expert_inter_per_rank;  // moe_intermediate_size / etp
  int n_tensors;
  tpr_shard_tensor tensors[TPR_SHARD_MAX_TENSORS];
  uint64_t rank_bytes;        // sum of tensors[].rank_bytes: what each rank holds
} tpr_shard_plan;

// Plans every tensor of the model for a world of dp*tp ranks, factored by
// tpr_mesh_init (world = dp*tp = edp*ep*etp; an impossible factorisation is
// its TPR_ERR_INVALID_ARG). Experts not dividing over ep, or an expert width
// not dividing over etp, are TPR_ERR_INVALID_ARG naming the numbers. Free
// with tpr_shard_plan_free.
tpr_status tpr_shard_plan_build(const tpr_model_config *c, int tp, int ep, int etp, int dp, tpr_dtype dtype,
                                tpr_shard_plan *out);
void tpr_shard_plan_free(tpr_shard_plan *p);

// Bytes world rank `rank` holds, and how many of them are zero padding
// (padded Q heads and o_proj columns, padded vocab rows). Held bytes are the
// same on every rank; padding differs (the last ranks hold the vocab tail).
tpr_status tpr_shard_plan_rank_bytes(const tpr_shard_plan *p, int rank, uint64_t *held, uint64_t *padding);

#endif
