// The op set: one enum shared by the eager API, programs and backends.
//
// Every op has a shape rule (tpr__op_infer, through ops/op_table.c) used both
// to check eager calls and to infer program values, so a shape is decided in
// one place. An op's pieces sit in its family's folder, runtime/ops/<family>/
// (shape rules, CPU kernels, CUDA twins), its backward rule in
// runtime/grad/<family>.c; runtime/README.md has the map.
#ifndef TPR_OPS_H
#define TPR_OPS_H

#include <stdbool.h>

#include "tensor.h"

// Values are part of the serialized program format: append, never reorder.
typedef enum tpr_op_kind {
  TPR_OP_MATMUL = 0,        // in (a, b); i[0] trans_a, i[1] trans_b; FP8 form (i[2] = scale block > 0):
                            // in (a, w (N, K) f8e4m3, scale (N, S) f32), trans_b, out = a @ (w * scale)^T
  TPR_OP_ADD = 1,           // in (a, b), numpy broadcasting
  TPR_OP_MUL = 2,           // in (a, b), numpy broadcasting
  TPR_OP_RMS_NORM = 3,      // in (x, weight); f[0] eps
  TPR_OP_SWIGLU = 4,        // in (gate, up): silu(gate) * up
  TPR_OP_SOFTMAX = 5,       // in (x): over the last dim
  TPR_OP_EMBEDDING = 6,     // in (table, ids)
  TPR_OP_INDEX_SELECT = 7,  // in (x, index); i[0] dim
  TPR_OP_CAST = 8,          // in (x); i[0] destination dtype; also a strided copy
  TPR_OP_RESHAPE = 9,       // view; in (x); i[0..n) new shape
  TPR_OP_PERMUTE = 10,      // view; in (x); i[0..n) permutation
  TPR_OP_SLICE = 11,        // view; in (x); i[0] dim, i[1] start, i[2] len
  // Collectives over one mesh axis (i[0] a tpr_mesh_axis, i[1] the group's
  // size n, part of the static shape and the same on every rank). The exec
  // runs them through the communicators it was given (tpr_exec_set_collectives).
  TPR_OP_ALL_REDUCE = 12,      // in (x (...)) contiguous; i[2] tpr_red_op; out (...)
  TPR_OP_ALL_GATHER = 13,      // in (x (m, ...)); out (n*m, ...): rank r's x is block r
  TPR_OP_REDUCE_SCATTER = 14,  // in (x (n*m, ...)); i[2] red op; out (m, ...): reduced block r
  TPR_OP_ALL_TO_ALL = 15,      // in (x (n*m, ...)); out (n*m, ...): block j goes to rank j as block r
  // Model ops (MiniMax-M2 tensor-parallel forward); shapes and exact numerics
  // at the typed wrappers below. All f32 unless said.
  TPR_OP_SUM_SQUARES = 16,      // in (x (..., N)); out (..., 1) = sum x^2, double accumulation
  TPR_OP_RMS_SCALE = 17,        // in (x (..., N), sumsq (..., 1), weight (N)); f[0] divisor, f[1] eps
  TPR_OP_EMBEDDING_SHARD = 18,  // in (table (Vl, H), ids (...) i32/i64, shard (1) i32/i64); out (..., H)
  TPR_OP_ROPE = 19,             // in (x (T, heads, D), pos (T) i32/i64); i[0] rotary_dim; f[0] theta;
                                // variants (pairing, MRoPE pos (3, T)): i[1..5], ops/rope/rope.h
  TPR_OP_ATTENTION = 20,        // in (q (T, Hq, D), k (S, Hkv, D), v (S, Hkv, D), start (1) i32/i64); f[0] scale;
                                // document form (i[0] = 1, packed training sequences): + lo (T) i32 last,
                                // query t sees keys [lo[t], start + t] (0 <= lo[t] <= start + t)
  TPR_OP_CACHE_WRITE = 21,      // in (cache (S, Hkv, D), new (T, Hkv, D), start (1)); writes cache IN PLACE; out (1) i32
  TPR_OP_ROUTER_SIGMOID_TOPK = 22,  // in (logits (T, E), bias (E)); i[0] k; out (T, E) dense weights
  TPR_OP_MOE_EXPERTS = 23,      // in (x (T, H), gates (T, E), w13 (E, 2F, H), w2 (E, H, F)); out (T, H);
                                // FP8 form (i[0] = scale block > 0): + s13 (E, 2F, S13), s2 (E, H, S2) f32
  // Expert parallelism (the alltoall dispatcher and capacity mode); shapes
  // and exact semantics at the typed wrappers below.
  TPR_OP_MOE_CAPACITY = 24,     // in (gates (T, E)); i[0] top_k, i[1] reroute, i[2] seed; f[0] factor; out (T, E)
  TPR_OP_ROW_SLICE = 25,        // in (x (T, C), part (1) i32/i64); i[0] parts n; out (ceil(T/n), C)
  TPR_OP_MOE_COUNTS = 26,       // in (gates (N, E)); out (E) i32
  TPR_OP_MOE_PERMUTE = 27,      // in (x (N, H), gates (N, E)); i[0] rows R; out (R, H)
  TPR_OP_ALL_TO_ALLV = 28,      // collective; in (x (Ri, C), send_counts (n*m) i32, recv_counts (n*m) i32);
                                // i[0] axis, i[1] n, i[2] rows Ro; out (Ro, C)
  TPR_OP_MOE_GROUPED_FFN = 29,  // in (x (R, H), counts (n*Er) i32, w13 (Er, 2F, H), w2 (Er, H, F)); out (R, H);
                                // FP8 form as moe_experts'
  TPR_OP_MOE_UNPERMUTE = 30,    // in (y (R, H), gates (N, E)); out (N, H)
  // Training (runtime/program/autodiff.h). A backward op with several results
  // returns them packed into one 1-D f32 tensor in the order listed ("packed
  // (a | b)"); the rule takes each back out as a view (tpr_grad_unpack).
  TPR_OP_GRAD_ALL_REDUCE = 31,  // view; in (x); i[0] axis, i[1] n: identity forward, the gradient is
                                // all-reduced (sum) over the axis (Megatron's f: a replicated value
                                // entering rank-local compute)
  TPR_OP_SUM_TO = 32,           // in (x); i[0..n) shape x broadcasts to; out: x summed down to that shape
  TPR_OP_SCALE = 33,            // in (x); f[0] alpha; out = alpha * x
  TPR_OP_FILL = 34,             // in (x) (only its shape is read); f[0] value; out: x's shape, all value
  TPR_OP_RMS_NORM_BWD = 35,     // in (x (..., H), w (H), dy); f[0] eps; out packed (dx | dw)
  TPR_OP_SWIGLU_BWD = 36,       // in (gate, up, dy); out packed (dgate | dup)
  TPR_OP_SOFTMAX_BWD = 37,      // in (y = softmax(x), dy); out dx
  TPR_OP_EMBEDDING_BWD = 38,    // in (dy (..., H), ids (...)); i[0] V; out (V, H) rows scatter-added
  TPR_OP_EMBEDDING_SHARD_BWD = 39,  // in (dy (..., H), ids, shard (1)); i[0] Vl; out (Vl, H)
  TPR_OP_INDEX_SELECT_BWD = 40,  // in (dy, index (k)); i[0] dim, i[1] n; out: dy's shape with n at dim,
                                 // slices of dy added at their index
  TPR_OP_SLICE_BWD = 41,        // in (dy); i[0] dim, i[1] start, i[2] full len; out: zeros, dy placed
  TPR_OP_RMS_SCALE_BWD = 42,    // in (x, sumsq, w, dy); f[0] divisor, f[1] eps; out packed (dx | dsumsq | dw)
  TPR_OP_ROPE_BWD = 43,         // in (dy (T, heads, D), pos (T)); rope's attrs; out dx (inverse rotation)
  TPR_OP_ATTENTION_BWD = 44,    // in (q, k, v, start, dout); f[0] scale; out packed (dq | dk | dv);
                                // document form as attention's: i[0] = 1, + lo (T) i32 after dout
  TPR_OP_ROUTER_SIGMOID_TOPK_BWD = 45,  // in (logits, bias, dy); i[0] k; out dlogits (T, E)
  TPR_OP_MOE_EXPERTS_BWD = 46,  // in (x, gates, w13, w2, dy); out packed (dx | dgates | dw13 | dw2)
  TPR_OP_MOE_GROUPED_FFN_BWD = 47,  // in (x, counts, w13, w2, dy); out packed (dx | dw13 | dw2)
  TPR_OP_MOE_PERMUTE_BWD = 48,  // in (dy (R, H), gates (N, E)); out (N, H) = sum of the token's rows
  TPR_OP_MOE_UNPERMUTE_BWD = 49,  // in (y (R, H), gates (N, E), dout (N, H)); out packed (dy | dgates)
  TPR_OP_ROW_SLICE_BWD = 50,    // in (dy (Ts, C), part (1)); i[0] n, i[1] T; out (T, C), zeros elsewhere
  TPR_OP_MOE_CAPACITY_BWD = 51,  // in (gates_in (T, E), dout (T, E)); moe_capacity's attrs; out dgates_in
  // Vocab-parallel cross-entropy (Megatron's): logits (T, Vl) are this rank's
  // vocab shard, shard (1) i32/i64 its index; i[0] V the real vocabulary, so
  // padded columns (shard*Vl + j >= V) never count.
  TPR_OP_XENT_MAX = 52,           // in (logits, shard); i[0] V; out (T, 1) max over valid local columns
  TPR_OP_XENT_SUMEXP = 53,      // in (logits, max (T, 1), shard); i[0] V; out (T, 1) sum exp(l - max)
  TPR_OP_XENT_SUMEXP_BWD = 54,  // in (logits, max, shard, dy (T, 1)); i[0] V; out (T, Vl)
  TPR_OP_XENT_TARGET = 55,      // in (logits, targets (T) i32, shard); i[0] V; out (T, 1) the target's logit
                                // here, else 0
  TPR_OP_XENT_TARGET_BWD = 56,  // in (dy (T, 1), targets, shard); i[0] Vl; out (T, Vl)
  TPR_OP_XENT_LOSS = 57,        // in (sumexp, max, target (T, 1) each, targets (T) i32); out (1): mean over
                                // targets != -100 of log(sumexp) + max - target (0 when none)
  TPR_OP_XENT_LOSS_BWD = 58,    // in (sumexp, targets, dloss (1)); out packed (dsumexp (T) | dtarget (T))
  // The MoE auxiliary load-balancing loss (transformers' load_balancing_loss_func, no attention mask):
  // p = softmax(raw router logits), top-k of p per row (no correction bias, ties: lower index).
  TPR_OP_MOE_AUX_STATS = 59,    // in (router logits (T, E)); i[0] k; out (2, E): [top-k counts; sum_t p]
  TPR_OP_MOE_AUX_STATS_BWD = 60,  // in (logits, dstats (2, E)); i[0] k; out dlogits (T, E) via p only
  TPR_OP_MOE_AUX_LOSS = 61,     // in (stats (2, E) summed over layers); i[0] rows N; out (1) E*sum c*s/N^2
  TPR_OP_MOE_AUX_LOSS_BWD = 62,  // in (stats, dloss (1)); i[0] N; out (2, E) = dloss*E/N^2 * [s; c]
  // Batched inference (engine/): one pool of KV blocks shared by many
  // sequences, a block table per sequence (vLLM's PagedAttention layout);
  // exact semantics at tpr_pb_paged_cache_write / tpr_pb_paged_attention.
  TPR_OP_PAGED_CACHE_WRITE = 63,  // in (pool (NB, bs, Hkv, D), new (T, Hkv, D), slot_mapping (T) i32);
                                  // writes pool IN PLACE; out (1) i32
  TPR_OP_PAGED_ATTENTION = 64,    // in (q (T, Hq, D), k_pool, v_pool (NB, bs, Hkv, D), block_tables (B, MB) i32,
                                  // seq (T) i32, positions (T) i32); f[0] scale; out (T, Hq, D)
  // FSDP (train/, docs/training.md "FSDP"): a parameter lives sharded over a
  // data-parallel axis and is gathered just before its layer runs.
  TPR_OP_PARAM_GATHER = 65,  // collective; in (shard (c) f32 or bf16); i[0] axis, i[1] n, i[2] prefetch group
                             // (-1: none), i[3] prefetch (0/1), i[4] reshard (0/1); f[0] grad scale; out (n*c) f32: every rank's
                             // shard in rank order, widened to f32. Backward: the f32 cotangent is
                             // reduce-scattered (sum) over the axis, times f[0] (1/dp: the replicas' mean).
  // Lightning attention (MiniMax-Text-01's linear layers; runtime/ops/linear_attention/, exact semantics at
  // tpr_lightning_attention): per head h with decay lambda_h = exp(-slopes[h]) and a (D, D) f32 state S,
  // S_t = lambda_h S_{t-1} + k_t^T v_t, o_t = q_t S_t, computed in blocks of i[0] tokens as transformers does.
  TPR_OP_LIGHTNING_ATTENTION = 66,  // in (q, k, v (T, H, D), state (H, D, D), slopes (H)) f32; i[0] block size;
                                    // out packed (o (T*H*D) | final state (H*D*D)) f32; document form
                                    // (tpr_lightning_attention_docs): i[1] = 1, + lo (T) i32 after slopes
  TPR_OP_LIGHTNING_ATTENTION_BWD = 67,  // in (q, k, v, state, slopes, dout packed like the forward's out);
                                        // i[0] block; out packed (dq | dk | dv | dstate (H*D*D)); no dslopes;
                                        // document form as the forward's: i[1] = 1, + lo (T) i32 after dout
  TPR_OP_LIGHTNING_DECODE = 68,  // in (q, k, v (B, H, D), state (B, H, D, D), slopes (H)) f32: one token of each
                                 // of B sequences; out packed (o (B*H*D) | new states (B*H*D*D)) f32
  // The engine's form (tpr_pb_lightning_paged): the rows of many sequences, each sequence's state in a slot
  // of a pool, read and written IN PLACE.
  TPR_OP_LIGHTNING_PAGED = 69,  // in (q, k, v (T, H, D), pool (NS, H, D, D), slopes (H) f32, state_slot (T) i32,
                                // positions (T) i32); i[0] block size; out o (T, H, D) f32
  // InfLLM-v2 block-sparse attention (MiniCPM-SALA's sparse layers; runtime/ops/sparse_attention/, exact
  // semantics at tpr_pb_sparse_attention_paged): paged_attention's operands, each query attending only the
  // key blocks it selects from compressed keys (init and local blocks always; the rest by top-k).
  TPR_OP_SPARSE_ATTENTION_PAGED = 70,  // in as paged_attention's; i[0] kernel_size, i[1] kernel_stride,
                                       // i[2] block_size, i[3] topk, i[4] init_blocks, i[5] window_size,
                                       // i[6] dense_len; f[0] scale; out (T, Hq, D) f32;
                                       // i[7] a bit set of optional inputs after the six, in this
                                       // order: 1 (TPR_SPARSE_CK_POOL) the compressed-key pool
                                       // (NB, ceil(bs/kernel_stride), Hkv, D) f32, read and written
                                       // IN PLACE; 2 (TPR_SPARSE_PREFILL_LEN) prefill_len (T) i32,
                                       // deciding dense or sparse per row (program.h)
  // The logistic function (minimax's output gate), from exp(-|x|) so that no x overflows (x = +-100 gives 1 and
  // 3.7e-44, not inf / inf).
  TPR_OP_SIGMOID = 71,      // in (x) f32, any strides; out (same shape) 1 / (1 + exp(-x))
  TPR_OP_SIGMOID_BWD = 72,  // in (x, dy) same shape; out dx (same shape) = dy * s (1 - s), s = sigmoid(x), as
                            // dy * e / (1 + e)^2 with e = exp(-|x|): no 1 - s cancelling to 0 for large x
  // InfLLM-v2 sparse attention of one whole sequence from position 0 (training: tpr_pb_sparse_attention), the
  // selection recomputed by its backward and carrying no gradient.
  TPR_OP_SPARSE_ATTENTION = 73,      // in (q (T, Hq, D), k, v (T, Hkv, D)) f32; attrs as sparse_attention_paged's;
                                     // out (T, Hq, D) f32
  TPR_OP_SPARSE_ATTENTION_BWD = 74,  // in (q, k, v, dout (T, Hq, D)); attrs as the forward's; out packed
                                     // (dq | dk | dv) f32
  TPR_OP_KIND_COUNT
} tpr_op_kind;

// The mesh axes a collective op runs over (shard/mesh.h defines the mesh).
// Values are serialized: append only.
typedef enum tpr_mesh_axis {
  TPR_AXIS_WORLD = 0,
  TPR_AXIS_TP = 1,
  TPR_AXIS_DP = 2,
  TPR_AXIS_EP = 3,
  TPR_AXIS_ETP = 4,
  TPR_AXIS_EDP = 5,
  TPR_AXIS_COUNT
} tpr_mesh_axis;

const char *tpr_mesh_axis_name(tpr_mesh_axis a);  // "world", "tp", ...

#define TPR_OP_MAX_INPUTS 8
// sparse_attention_paged's compressed-key rows per pool block of bs rows:
// ceil(bs / kernel_stride) (chunk ends in one block differ by multiples of the stride).
static inline int64_t tpr_sparse_ck_rows(int64_t bs, int64_t kernel_stride) {
  return (bs + kernel_stride - 1) / kernel_stride;
}

#define TPR_OP_MAX_IATTRS 8
// sparse_attention_paged's i[7]: the optional inputs after its six, in this order.
enum { TPR_SPARSE_CK_POOL = 1, TPR_SPARSE_PREFILL_LEN = 2 };
#define TPR_OP_MAX_FATTRS 4

// Attributes are plain numbers so programs serialize without per-op schemas.
// They may never hold a rank number (see docs/architecture.md section 1).
typedef struct tpr_op_attrs {
  int n_i;
  int64_t i[TPR_OP_MAX_IATTRS];
  int n_f;
  float f[TPR_OP_MAX_FATTRS];
} tpr_op_attrs;

const char *tpr_op_name(tpr_op_kind op);  // "matmul", ... ; "?" if invalid
int tpr_op_num_inputs(tpr_op_kind op);
bool tpr_op_is_view(tpr_op_kind op);      // reshape/permute/slice: no kernel, no copy
bool tpr_op_is_collective(tpr_op_kind op);  // all_reduce, ...: run by the exec through a communicator

// Runs one op eagerly on `backend`. `out` must already exist with the shape
// and dtype the op's shape rule gives (a clear TPR_ERR_SHAPE otherwise) and be
// contiguous; every tensor must live on `backend`. View ops are not run here:
// use tpr_tensor_reshape/permute/slice.
tpr_status tpr_op_run(tpr_backend *backend, tpr_op_kind op, const tpr_tensor *const *in, int n_in,
                      const tpr_op_attrs *attrs, tpr_tensor *out);

// Typed wrappers over tpr_op_run. Shapes (f32 unless said otherwise):
// a (..., M, K) [(..., K, M) if trans_a], b (..., K, N) [(..., N, K) if trans_b]
// or b 2-D shared by every batch; out (..., M, N).
tpr_status tpr_matmul(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, bool trans_a,
                      bool trans_b, tpr_tensor *out);
// out = a + b / a * b, a and b broadcast to out's shape numpy-style.
tpr_status tpr_add(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, tpr_tensor *out);
tpr_status tpr_mul(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, tpr_tensor *out);
// x (..., H), weight (H); out (..., H) = x / sqrt(mean(x^2) + eps) * weight.
tpr_status tpr_rms_norm(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *weight, float eps,
                        tpr_tensor *out);
// gate (..., F), up (..., F); out (..., F) = gate * sigmoid(gate) * up.
tpr_status tpr_swiglu(tpr_backend *be, const tpr_tensor *gate, const tpr_tensor *up, tpr_tensor *out);
// x (..., N); out (..., N) softmax over the last dim.
tpr_status tpr_softmax(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out);
// table (V, H) any dtype, ids (...) i32/i64 in [0, V); out (..., H) table's dtype.
tpr_status tpr_embedding(tpr_backend *be, const tpr_tensor *table, const tpr_tensor *ids,
                         tpr_tensor *out);
// x any dtype; index (n) i32/i64 in [0, x.shape[dim]); out = x with shape[dim] = n.
tpr_status tpr_index_select(tpr_backend *be, const tpr_tensor *x, int dim, const tpr_tensor *index,
                            tpr_tensor *out);
// Copies x (any strides) into contiguous out of the same shape, converting
// dtype to out's dtype.
tpr_status tpr_cast(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out);

// ---- Model ops (MiniMax-M2 under tensor parallelism). The CPU kernels run
// plain loops on one thread; only their GEMMs (OpenBLAS) use the backend's
// threads.
//
// x (..., N) f32; out (..., 1) f32 = sum over the last dim of x^2, accumulated
// in double in a fixed order (4 interleaved lanes, combined (0+2)+(1+3)) and
// rounded once to f32. The local half of a distributed RMS norm: all-reduce
// out over tp, then tpr_rms_scale.
tpr_status tpr_sum_squares(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out);
// x (..., N), sumsq (..., 1) (x's leading dims), weight (N), all f32;
// out (..., N) = (x * r) * weight with, in f32, r = 1 / sqrtf(sumsq / divisor
// + eps) -- torch's f32 RMSNorm (variance, rsqrt, x * rsqrt, then weight).
// divisor > 0 is the global element count (docs/architecture.md section 5), eps >= 0.
tpr_status tpr_rms_scale(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *sumsq,
                         const tpr_tensor *weight, float divisor, float eps, tpr_tensor *out);
// Vocab-parallel embedding. table (Vl, H) any dtype, ids (...) i32/i64,
// shard (1) i32/i64 read at run time (e.g. a slice of the rank tensor);
// out (..., H) table's dtype: row id - shard*Vl when that is in [0, Vl),
// else zeros (so summing over the shards gives the full embedding). Ids past
// the vocabulary are not checked (they give zeros on every shard); a negative
// id or a negative shard is TPR_ERR_INVALID_ARG naming its position, and
// nothing is written.
tpr_status tpr_embedding_shard(tpr_backend *be, const tpr_tensor *table, const tpr_tensor *ids,
                               const tpr_tensor *shard, tpr_tensor *out);
// NeoX (rotate-half) RoPE on the first rotary_dim dims of each head.
// x (T, heads, D) f32, positions (T) i32/i64; rotary_dim even, 0 < rotary_dim
// <= D; out (T, heads, D). With half = rotary_dim/2 and d < half, in f32 as
// transformers computes it: inv_freq[d] = 1 / powf(theta, (float)(2d) /
// rotary_dim); a = (float)pos * inv_freq[d]; c = cosf(a), s = sinf(a);
//   out[d] = x[d]*c - x[d+half]*s,  out[d+half] = x[d+half]*c + x[d]*s;
// dims [rotary_dim, D) are copied unchanged.
tpr_status tpr_rope(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *positions, int64_t rotary_dim,
                    float theta, tpr_tensor *out);
// Causal GQA attention over a KV cache. q (T, Hq, D), k_cache/v_cache
// (S, Hkv, D) f32, start (1) i32/i64 read at run time: the absolute position
// of q's first token. Query t attends cache rows [0, start + t]; query head h
// reads KV head h / (Hq / Hkv) (Hq a multiple of Hkv). Scores (q . k) * scale
// via sgemm, softmax in f32 after subtracting the row max; out (T, Hq, D).
// start < 0 or start + T > S is TPR_ERR_INVALID_ARG. In a program, append the
// CACHE_WRITE that fills rows [start, start+T) BEFORE this op: nodes run in
// program order, and nothing else orders the two.
tpr_status tpr_attention(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k_cache,
                         const tpr_tensor *v_cache, const tpr_tensor *start, float scale, tpr_tensor *out);
// The document form (packed training sequences): query t attends rows
// [lo[t], start + t] only; lo (T) i32, each 0 <= lo[t] <= start + t, else
// TPR_ERR_INVALID_ARG at run time.
tpr_status tpr_attention_docs(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k_cache,
                              const tpr_tensor *v_cache, const tpr_tensor *start, const tpr_tensor *lo, float scale,
                              tpr_tensor *out);
// Writes new_rows (T, Hkv, D) into cache (S, Hkv, D) rows [start, start+T)
// IN PLACE -- the one op that writes an input; same dtype for both, any
// dtype. start (1) i32/i64. out (1) i32 = start + T, a token nothing needs to
// read (ordering is by program order, see tpr_attention). In a program the
// cache should be a param (or a view of one): params live outside the arena,
// keep their bytes across runs, and the exec hands the bound tensor's memory
// to the kernel. start < 0 or start + T > S is TPR_ERR_INVALID_ARG and
// writes nothing. A program must never drop this node as dead code.
// (tpr_op_run passes inputs as const tensor handles; the handle is const,
// the storage is not: the kernel writes through tpr_tensor_data.)
tpr_status tpr_cache_write(tpr_backend *be, tpr_tensor *cache, const tpr_tensor *new_rows,
                           const tpr_tensor *start, tpr_tensor *out);
// Lightning attention: MiniMax-Text-01's linear attention (transformers'
// MiniMaxLightningAttention, docs/lightning-attention.md), the core
// between its qkv projection (with its activation) and its output RMSNorm and
// sigmoid gate, which stay outside. Per head h, slope s = slopes[h] > 0, and a
// (D, D) f32 state S that a sequence carries between calls:
//   S_t = exp(-s) S_{t-1} + k_t^T v_t,   o_t = q_t S_t   (q_t, k_t, v_t rows (D)).
// No softmax, no scale. The prefill computes this in blocks of block_size
// tokens from the sequence's first token of the call, as transformers does:
// for a block of b tokens (local i, j in 1..b) starting from state S,
//   o_i = exp(-s i) q_i S + sum_{j <= i} exp(-s (i - j)) (q_i . k_j) v_j,
//   S' = exp(-s b) S + sum_j exp(-s (b - j)) k_j^T v_j.
// q, k, v (T, H, D) f32 (any strides), state (H, D, D) f32: the state before
// the call (zeros for a new sequence), slopes (H) f32, block_size >= 1;
// out (T*H*D + H*D*D) f32 packed: o (T, H, D) then the state after the call
// (H, D, D). A prefill split into calls that carry the state equals one call
// to rounding.
tpr_status tpr_lightning_attention(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k, const tpr_tensor *v,
                                   const tpr_tensor *state, const tpr_tensor *slopes, int64_t block_size,
                                   tpr_tensor *out);
// The document form (packed training sequences): lo (T) i32, each token's
// document start, as attention's document form takes it: lo[0] = 0, and
// lo[t] = lo[t-1] (the same document) or lo[t] = t (a new one), else
// TPR_ERR_INVALID_ARG at run time. The first document starts from `state`,
// every later one from the zero state, so no token's output depends on an
// earlier document; each document runs the block loop from its own first
// token. The state out is the one after the last document. (CPU only: the
// CUDA kernels refuse the form.)
tpr_status tpr_lightning_attention_docs(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k,
                                        const tpr_tensor *v, const tpr_tensor *state, const tpr_tensor *slopes,
                                        const tpr_tensor *lo, int64_t block_size, tpr_tensor *out);
// One decode step of B sequences (transformers' cached path): q, k, v
// (B, H, D), state (B, H, D, D) f32, slopes (H); per sequence and head
// S' = exp(-s) S + k^T v, o = q S'; out (B*H*D + B*H*D*D) packed: o (B, H, D)
// then the new states (B, H, D, D).
tpr_status tpr_lightning_decode(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k, const tpr_tensor *v,
                                const tpr_tensor *state, const tpr_tensor *slopes, tpr_tensor *out);
// transformers' slope rates (MiniMaxLightningAttention.get_slope_rate) for
// heads [0, heads) of layer `layer` of n_layers: base = 2^(-8 / heads),
// slope[h] = base^(h + 1) * (1 - layer / (n_layers - 1 + 1e-5) + 1e-5),
// computed in double, rounded to f32. A tensor-parallel rank takes its slice.
void tpr_lightning_slopes(int64_t heads, int64_t layer, int64_t n_layers, float *out);
// MiniCPM-SALA's lightning slopes (its modeling code's _build_slope_tensor,
// docs/minicpm-sala.md): ALiBi's, the same in every layer. For n a power of
// two, start = 2^(-8/n) and slope[h] = start * start^h; otherwise the slopes
// of the largest power of two c < n, then every other slope of 2c's up to n
// heads. Computed in double, rounded to f32. The linear layers then run
// tpr_lightning_attention with q scaled by 1/sqrt(D) (that op has no scale).
void tpr_alibi_slopes(int64_t heads, float *out);
// MiniMax-M2 router. logits (T, E), bias (E) f32; 1 <= k <= E; out (T, E) f32
// dense combine weights: s = 1 / (1 + expf(-logit)); per row the k experts
// with the largest s + bias are chosen (ties: the lower expert index wins; a
// NaN score ranks below every number); chosen entries get s / (sum of the
// chosen s, added in f32 in ascending expert order) -- the bias only selects;
// every other entry is exactly 0.
tpr_status tpr_router_sigmoid_topk(tpr_backend *be, const tpr_tensor *logits, const tpr_tensor *bias, int k,
                                   tpr_tensor *out);
// SwiGLU experts with dense combine weights. x (T, H), gates (T, E),
// w13 (E, 2F, H) = [w1; w3] along dim 1, w2 (E, H, F), all f32; out (T, H) =
// sum over e with gates[t,e] != 0 of gates[t,e] * (w2[e] @ (silu(w1[e] x_t) *
// (w3[e] x_t))), silu(g) = g / (1 + expf(-g)). A grouped GEMM: experts in
// ascending order each gather their tokens (ascending), run sgemm for w13 and
// w2, and add gate * y into out -- a fixed order, so results are
// deterministic. Under tensor parallelism (w13/w2 holding an F/tp slice) out
// is a partial sum to all-reduce.
tpr_status tpr_moe_experts(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *gates, const tpr_tensor *w13,
                           const tpr_tensor *w2, tpr_tensor *out);

// ---- Expert parallelism. Routing is carried by dense gates (T, E) f32: a
// nonzero entry is an assignment of token t to expert e with that combine
// weight. Rows of a dispatched buffer are ordered by expert (ascending), then
// token (ascending); rows past the counted ones are left unwritten by every
// op below and never read by the next.
//
// Capacity mode. gates (T, E) f32, 1 <= top_k <= E, factor > 0; out (T, E):
// capacity C = ceil(T * top_k * factor / E) computed in double. For each
// expert, its assignments are ranked by weight (descending; equal weights:
// the lower token index first) and all past the first C are dropped (set to
// exactly 0). With reroute, each dropped assignment (in token order, then
// expert order) moves, keeping its weight, to an expert with spare capacity
// that the token does not already use, drawn at random: the spare slots
// (expert e repeated C - load_e times, ascending e) are shuffled with
// Fisher-Yates driven by tpr_rng seeded with `seed`, and each dropped
// assignment takes the first remaining slot whose expert its token does not
// use; when none is left it stays dropped. Every rank given the same gates
// and seed computes the same result.
tpr_status tpr_moe_capacity(tpr_backend *be, const tpr_tensor *gates, int64_t top_k, float factor, bool reroute,
                            uint64_t seed, tpr_tensor *out);
// x (T, C) any dtype, part (1) i32/i64 in [0, n) read at run time; out
// (ceil(T/n), C) = rows [part*Ts, part*Ts + Ts) of x with Ts = ceil(T/n),
// rows past T zero. How tp peers holding the same tokens take disjoint
// slices. part outside [0, n) is TPR_ERR_INVALID_ARG.
tpr_status tpr_row_slice(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *part, int64_t n, tpr_tensor *out);
// gates (N, E) f32; out (E) i32: number of nonzero entries per expert.
tpr_status tpr_moe_counts(tpr_backend *be, const tpr_tensor *gates, tpr_tensor *out);
// x (N, H) f32, gates (N, E) f32; out (R, H): for e ascending, for each token
// t (ascending) with gates[t, e] != 0, the next row is x[t]. More than R
// assignments is TPR_ERR_INVALID_ARG.
tpr_status tpr_moe_permute(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *gates, tpr_tensor *out);
// The local experts on dispatched rows. x (R, H) holds n source blocks one
// after another; block s holds counts[s*Er + e] rows for local expert e, for e
// ascending. out (R, H): each counted row r of expert e gets
// w2[e] @ (silu(w1[e] x_r) * (w3[e] x_r)) -- unweighted, moe_experts' math --
// computed as one sgemm pair per expert over its rows from every source.
// Counts that are negative or add up past R: TPR_ERR_INVALID_ARG.
tpr_status tpr_moe_grouped_ffn(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *counts, const tpr_tensor *w13,
                               const tpr_tensor *w2, tpr_tensor *out);
// The inverse of moe_permute, weighted: y (R, H) in moe_permute's row order
// for gates (N, E); out (N, H): out[t] = sum over e ascending with
// gates[t, e] != 0 of gates[t, e] * y[row of (t, e)], in f32 starting from 0
// -- the order moe_experts adds in, so the two dispatchers agree.
tpr_status tpr_moe_unpermute(tpr_backend *be, const tpr_tensor *y, const tpr_tensor *gates, tpr_tensor *out);

// Shape rule: fills out's dtype, ndim, shape and strides from the inputs'
// descriptors (storage is ignored). For views the strides and offset are the
// view's own, relative to the input; for other ops out is contiguous.
tpr_status tpr__op_infer(tpr_op_kind op, const tpr_tensor *const *in, int n_in,
                         const tpr_op_attrs *attrs, tpr_tensor *out);

#endif
