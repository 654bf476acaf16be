// SPMD programs: a static DAG of ops over tensors with static shapes, built
// once by model code and executed many times.
//
// Every rank builds the same program (rank-dependence enters only through the
// rank tensor, bound as a param at run time), so the serialized bytes are
// identical across ranks; tpr_program_hash makes that checkable. Programs
// serialize to bytes with protobuf-c (runtime/program/program.proto) and back;
// deserialization re-runs every shape rule, so corrupt bytes give
// TPR_ERR_FORMAT instead of a crash.
#ifndef TPR_PROGRAM_H
#define TPR_PROGRAM_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "runtime/backend.h"
#include "runtime/ops.h"
#include "runtime/ops/rope/rope.h"
#include "runtime/tensor.h"

typedef struct tpr_program tpr_program;
typedef int32_t tpr_value_id;  // index of a value in its program

// Values are part of the serialized program format: append, never reorder.
typedef enum tpr_value_kind {
  TPR_VALUE_INPUT = 0,  // bound per run (tokens, positions)
  TPR_VALUE_PARAM = 1,  // bound once (weights, the rank tensor)
  TPR_VALUE_NODE = 2,   // produced by an op
} tpr_value_kind;

tpr_status tpr_program_new(tpr_program **out);
void tpr_program_free(tpr_program *p);

// Declares a named input or param. Names are unique within a program.
tpr_status tpr_program_input(tpr_program *p, const char *name, tpr_dtype dtype, int ndim,
                             const int64_t *shape, tpr_value_id *out);
tpr_status tpr_program_param(tpr_program *p, const char *name, tpr_dtype dtype, int ndim,
                             const int64_t *shape, tpr_value_id *out);
// Appends an op; its output's shape comes from the op's shape rule.
tpr_status tpr_program_op(tpr_program *p, tpr_op_kind op, const tpr_value_id *in, int n_in,
                          const tpr_op_attrs *attrs, tpr_value_id *out);
// Marks a value as a named output (kept alive to the end of a run).
tpr_status tpr_program_output(tpr_program *p, tpr_value_id v, const char *name);

int tpr_program_num_values(const tpr_program *p);
int tpr_program_num_nodes(const tpr_program *p);
// A value's kind and its name (NULL for an unnamed op output); -1 / NULL for
// an unknown id.
int tpr_program_value_kind(const tpr_program *p, tpr_value_id v);
const char *tpr_program_value_name(const tpr_program *p, tpr_value_id v);
// Descriptor (dtype, shape, strides; no storage) of a value.
tpr_status tpr_program_value(const tpr_program *p, tpr_value_id v, tpr_tensor *desc);

// Builder shorthands over tpr_program_op (same shapes as the eager ops).
tpr_status tpr_pb_matmul(tpr_program *p, tpr_value_id a, tpr_value_id b, bool trans_a, bool trans_b,
                         tpr_value_id *out);
// matmul's FP8 form: out (..., M, N) = a (..., M, K) @ (w (N, K) f8e4m3 *
// scale (N, ceil(K/block)) f32)^T, each scale covering `block` columns.
tpr_status tpr_pb_matmul_fp8(tpr_program *p, tpr_value_id a, tpr_value_id w, tpr_value_id scale, int block,
                             tpr_value_id *out);
tpr_status tpr_pb_add(tpr_program *p, tpr_value_id a, tpr_value_id b, tpr_value_id *out);
tpr_status tpr_pb_mul(tpr_program *p, tpr_value_id a, tpr_value_id b, tpr_value_id *out);
tpr_status tpr_pb_rms_norm(tpr_program *p, tpr_value_id x, tpr_value_id weight, float eps, tpr_value_id *out);
tpr_status tpr_pb_swiglu(tpr_program *p, tpr_value_id gate, tpr_value_id up, tpr_value_id *out);
// sigmoid(x) elementwise, stable for any x (ops.h TPR_OP_SIGMOID).
tpr_status tpr_pb_sigmoid(tpr_program *p, tpr_value_id x, tpr_value_id *out);
tpr_status tpr_pb_softmax(tpr_program *p, tpr_value_id x, tpr_value_id *out);
tpr_status tpr_pb_embedding(tpr_program *p, tpr_value_id table, tpr_value_id ids, tpr_value_id *out);
tpr_status tpr_pb_index_select(tpr_program *p, tpr_value_id x, int dim, tpr_value_id index, tpr_value_id *out);
tpr_status tpr_pb_cast(tpr_program *p, tpr_value_id x, tpr_dtype dtype, tpr_value_id *out);
tpr_status tpr_pb_reshape(tpr_program *p, tpr_value_id x, int ndim, const int64_t *shape, tpr_value_id *out);
tpr_status tpr_pb_permute(tpr_program *p, tpr_value_id x, const int *perm, tpr_value_id *out);
tpr_status tpr_pb_slice(tpr_program *p, tpr_value_id x, int dim, int64_t start, int64_t len, tpr_value_id *out);
// Collectives over the group on mesh axis `axis` of n ranks (see ops.h for
// the shapes); red_op is a tpr_red_op (0 sum, 1 max, 2 min).
tpr_status tpr_pb_all_reduce(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, int red_op,
                             tpr_value_id *out);
tpr_status tpr_pb_all_gather(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, tpr_value_id *out);
tpr_status tpr_pb_reduce_scatter(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, int red_op,
                                 tpr_value_id *out);
// FSDP's unshard: the (c) shard of a parameter on each of the n ranks of
// `axis` (f32, or bf16 for mixed precision) gathered into (n*c) f32 in rank
// order. Its backward reduce-scatters the f32 cotangent over the axis and
// scales it by grad_scale. reshard: the gathered value (and every view,
// index_select or cast of it) is not kept for the backward but gathered
// again where the backward first needs it (FSDP2's reshard_after_forward).
// prefetch: the exec starts the gathers of one group while the previous
// group's layer computes (groups in program order; -1: no group).
typedef struct tpr_param_gather_opts {
  tpr_mesh_axis axis;
  int n;
  int group;
  bool prefetch, reshard;
  float grad_scale;
} tpr_param_gather_opts;
tpr_status tpr_pb_param_gather(tpr_program *p, tpr_value_id shard, const tpr_param_gather_opts *o,
                               tpr_value_id *out);
tpr_status tpr_pb_all_to_all(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, tpr_value_id *out);
// Model ops (ops.h gives shapes and exact semantics). cache_write writes its
// cache input in place: append it BEFORE the attention that reads the rows.
tpr_status tpr_pb_sum_squares(tpr_program *p, tpr_value_id x, tpr_value_id *out);
tpr_status tpr_pb_rms_scale(tpr_program *p, tpr_value_id x, tpr_value_id sumsq, tpr_value_id weight, float divisor,
                            float eps, tpr_value_id *out);
tpr_status tpr_pb_embedding_shard(tpr_program *p, tpr_value_id table, tpr_value_id ids, tpr_value_id shard,
                                  tpr_value_id *out);
tpr_status tpr_pb_rope(tpr_program *p, tpr_value_id x, tpr_value_id positions, int64_t rotary_dim, float theta,
                       tpr_value_id *out);
// A rope variant (runtime/ops/rope/rope.h: pairing, MRoPE).
tpr_status tpr_pb_rope_ex(tpr_program *p, tpr_value_id x, tpr_value_id positions, const tpr_rope_opts *o,
                          tpr_value_id *out);
// Lightning attention (ops.h, tpr_lightning_attention): one op, its packed
// output taken apart as views: o (T, H, D) and the state after the call
// (H, D, D). A graph that uses only one of them gives the other a zero
// cotangent through the views' backward.
tpr_status tpr_pb_lightning_attention(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                      tpr_value_id state, tpr_value_id slopes, int64_t block_size, tpr_value_id *o,
                                      tpr_value_id *state_out);
// Its document form (tpr_lightning_attention_docs; packed training
// sequences): lo (T) i32 each token's document start, where the state
// restarts from zero (the first document from `state`).
tpr_status tpr_pb_lightning_attention_docs(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                           tpr_value_id state, tpr_value_id slopes, tpr_value_id lo,
                                           int64_t block_size, tpr_value_id *o, tpr_value_id *state_out);
// One decode step of B sequences (tpr_lightning_decode): o (B, H, D) and the
// new states (B, H, D, D) as views.
tpr_status tpr_pb_lightning_decode(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                   tpr_value_id state, tpr_value_id slopes, tpr_value_id *o, tpr_value_id *state_out);
// The engine's lightning attention (TPR_OP_LIGHTNING_PAGED): q, k, v
// (T, H, D) rows of many sequences; pool (NS, H, D, D) f32 one state per
// slot, read and written IN PLACE (as paged_cache_write's pool);
// state_slot (T) i32 each row's slot (-1: padding, output 0); positions (T)
// i32. A slot's rows are one contiguous run of consecutive positions: a
// prefill (in blocks of block_size) from the slot's state, or from zeros when
// the run starts at position 0, leaving the state after its last row in the
// slot. o (T, H, D). No backward (training runs tpr_pb_lightning_attention).
tpr_status tpr_pb_lightning_paged(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v, tpr_value_id pool,
                                  tpr_value_id slopes, tpr_value_id state_slot, tpr_value_id positions,
                                  int64_t block_size, tpr_value_id *o);
tpr_status tpr_pb_attention(tpr_program *p, tpr_value_id q, tpr_value_id k_cache, tpr_value_id v_cache,
                            tpr_value_id start, float scale, tpr_value_id *out);
// Attention's document form (packed training sequences): as tpr_pb_attention,
// but query t sees keys [lo[t], start + t] only, lo (T) i32 with
// 0 <= lo[t] <= start + t (checked at run time): a block-diagonal causal mask
// when lo[t] is the first position of t's document.
tpr_status tpr_pb_attention_docs(tpr_program *p, tpr_value_id q, tpr_value_id k_cache, tpr_value_id v_cache,
                                 tpr_value_id start, tpr_value_id lo, float scale, tpr_value_id *out);
tpr_status tpr_pb_cache_write(tpr_program *p, tpr_value_id cache, tpr_value_id new_rows, tpr_value_id start,
                              tpr_value_id *out);
tpr_status tpr_pb_router_sigmoid_topk(tpr_program *p, tpr_value_id logits, tpr_value_id bias, int k,
                                      tpr_value_id *out);
tpr_status tpr_pb_moe_experts(tpr_program *p, tpr_value_id x, tpr_value_id gates, tpr_value_id w13, tpr_value_id w2,
                              tpr_value_id *out);
// FP8 experts: w13 (E, 2F, H), w2 (E, H, F) f8e4m3 with per-row scales s13
// (E, 2F, ceil(H/block)), s2 (E, H, ceil(F/block)) f32.
typedef struct tpr_fp8_experts {
  tpr_value_id w13, w2, s13, s2;
  int block;
} tpr_fp8_experts;
tpr_status tpr_pb_moe_experts_fp8(tpr_program *p, tpr_value_id x, tpr_value_id gates, const tpr_fp8_experts *f,
                                  tpr_value_id *out);
tpr_status tpr_pb_moe_grouped_ffn_fp8(tpr_program *p, tpr_value_id x, tpr_value_id counts, const tpr_fp8_experts *f,
                                      tpr_value_id *out);
// Expert parallelism (ops.h gives shapes and exact semantics).
tpr_status tpr_pb_moe_capacity(tpr_program *p, tpr_value_id gates, int64_t top_k, float factor, bool reroute,
                               uint64_t seed, tpr_value_id *out);
tpr_status tpr_pb_row_slice(tpr_program *p, tpr_value_id x, tpr_value_id part, int64_t n, tpr_value_id *out);
tpr_status tpr_pb_moe_counts(tpr_program *p, tpr_value_id gates, tpr_value_id *out);
tpr_status tpr_pb_moe_permute(tpr_program *p, tpr_value_id x, tpr_value_id gates, int64_t rows, tpr_value_id *out);
// Collective: x's rows go to the n peers of `axis` in blocks of
// sum(send_counts[j*m .. j*m+m)) rows for peer j, m = len(send_counts)/n; out
// (rows, C) receives peer j's rows as block j, blocks packed in peer order,
// recv_counts being what each peer sends here in the same (peer, m) layout.
tpr_status tpr_pb_all_to_allv(tpr_program *p, tpr_value_id x, tpr_value_id send_counts, tpr_value_id recv_counts,
                              tpr_mesh_axis axis, int n, int64_t rows, tpr_value_id *out);
tpr_status tpr_pb_moe_grouped_ffn(tpr_program *p, tpr_value_id x, tpr_value_id counts, tpr_value_id w13,
                                  tpr_value_id w2, tpr_value_id *out);
tpr_status tpr_pb_moe_unpermute(tpr_program *p, tpr_value_id y, tpr_value_id gates, tpr_value_id *out);
// Paged KV cache (engine/). A pool (NB, bs, Hkv, D) holds NB blocks of bs
// token rows; pool row r is block r / bs, offset r % bs.
// paged_cache_write: token t of new_rows (T, Hkv, D) goes to pool row
// slot_mapping[t] (T) i32, IN PLACE; slot_mapping[t] < 0 (a padded token)
// writes nothing; a row >= NB*bs is TPR_ERR_INVALID_ARG and nothing is
// written. Out (1) i32, a token nothing reads: append it BEFORE the
// paged_attention that reads the rows (program order, as cache_write).
// paged_attention: q (T, Hq, D); token t of sequence s = seq[t] (T) i32
// attends the keys/values at its sequence's positions 0..positions[t]
// (causal), position j living in pool row block_tables[s][j / bs] * bs +
// j % bs (block_tables (B, MB) i32). Query head h reads KV head h / (Hq/Hkv).
// Numerics as tpr_attention: (q . k) * scale, softmax in f32 with the row max
// subtracted and the sum's reciprocal multiplied in, then p @ v. seq[t] < 0
// (a padded token): out row t is 0. seq[t] >= B, positions[t] outside
// [0, MB*bs), or a block id read outside [0, NB): TPR_ERR_INVALID_ARG.
tpr_status tpr_pb_paged_cache_write(tpr_program *p, tpr_value_id pool, tpr_value_id new_rows,
                                    tpr_value_id slot_mapping, tpr_value_id *out);
tpr_status tpr_pb_paged_attention(tpr_program *p, tpr_value_id q, tpr_value_id k_pool, tpr_value_id v_pool,
                                  tpr_value_id block_tables, tpr_value_id seq, tpr_value_id positions, float scale,
                                  tpr_value_id *out);
// InfLLM-v2 sparse attention (MiniCPM-SALA's "minicpm4" layers; docs/minicpm-sala.md has the published
// sources of every rule below). Operands, pools, padded tokens and index checks as paged_attention's; the
// numbers of the model's sparse_config in `sa`. Per sequence s of the call, L_s = 1 + the largest position
// of its tokens here (the cache and this call's rows: the published forward decides per call). With
// L_s < dense_len every query attends causally to all keys (paged_attention's result up to rounding).
// Otherwise, for the query at position p, KV head g (query heads G = Hq/Hkv of the group), B = block_size,
// qb = p / B, and compressed keys c_j = mean(k[j*stride .. j*stride + kernel_size)) of head g:
//   the chunks it may see: j with j*stride + kernel_size <= p + 1;
//   S_j = sum over the group's heads h of softmax_j(q_h . c_j * scale) over those chunks;
//   score of block b = max of S_j over the seen chunks overlapping it (j in
//     [b*B/stride - kernel_size/stride + 1, (b+1)*B/stride)), 0 when none;
//   always attended: init blocks b < init_blocks and local blocks qb - window_size/B < b <= qb;
//   of the other blocks b <= qb, the topk - init_blocks highest scores (ties: the lower block index);
// then softmax(q_h . k_r * scale) over the attended keys r <= p, times v. Scores and the softmax are
// computed in double from the f32 operands, so the selection is that of a float64 reference away from
// exact ties (which both break by index). kernel_size and block_size must be multiples of kernel_stride.
// prefill_len (T) i32, or < 0 for none: the prefill-length form, where each row decides dense or sparse by
// its own length, max(p + 1, prefill_len[t]) < dense_len (a value <= 0: the call's L_s as above). Given
// each sequence's prompt length, every row is computed as a one-call prefill of the prompt followed by
// one-token decode calls computes it, however the prompt is split into calls: an engine's chunked
// prefill and batching then do not change a sequence's result.
typedef struct tpr_sparse_attn {
  int64_t kernel_size, kernel_stride, block_size, topk, init_blocks, window_size, dense_len;
  float scale;
} tpr_sparse_attn;
// ck_pool, or < 0 for none: the sequences' compressed keys kept in ck_pool (NB, R, Hkv, D) f32, R =
// tpr_sparse_ck_rows(bs, kernel_stride), paged like the KV pool through the same block tables: chunk j
// (keys [j*stride, j*stride + kernel_size)) ends at position e = j*stride + kernel_size - 1 and lives in
// the block holding e, row (e % bs) / stride. The op first writes, IN PLACE, every chunk that ends at a
// position of this call (from the k_pool rows, which a paged_cache_write before it has written), dense
// calls included, then scores from ck_pool: a decode step reads L/stride compressed keys instead of L
// keys. Chunks that end before the call are read as an earlier call left them, so every position of a
// sequence must go through the op once (as every KV row goes through paged_cache_write); a prefix-cached
// block's rows are its own tokens'. Results equal those without the pool (both round each mean to f32).
tpr_status tpr_pb_sparse_attention_paged(tpr_program *p, tpr_value_id q, tpr_value_id k_pool, tpr_value_id v_pool,
                                         tpr_value_id ck_pool, tpr_value_id block_tables, tpr_value_id seq,
                                         tpr_value_id positions, tpr_value_id prefill_len, const tpr_sparse_attn *sa,
                                         tpr_value_id *out);
// The attribute layout of sparse_attention_paged (ops.h) for sa.
tpr_op_attrs tpr_sparse_attn_attrs(const tpr_sparse_attn *sa);
// The training form: one whole sequence from position 0, q (T, Hq, D), k and v (T, Hkv, D) its keys and
// values (not a pool), out (T, Hq, D). The rules above with L = T (dense when T < dense_len), the same
// selection code as sparse_attention_paged's (so the same blocks). Differentiable in q, k and v through the
// attention over the selected keys; the selection (block indices from the compressed keys) has no gradient,
// as in the published forward, where the compressed keys only feed the top-k kernel.
tpr_status tpr_pb_sparse_attention(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                   const tpr_sparse_attn *sa, tpr_value_id *out);

// The op of node n (0 <= n < tpr_program_num_nodes), for reports.
tpr_op_kind tpr_program_node_op(const tpr_program *p, int n);
// Node n's inputs (*n_in of them, pointer owned by the program, valid until
// it changes) and output; TPR_ERR_INVALID_ARG for an unknown node.
tpr_status tpr_program_node_io(const tpr_program *p, int n, const tpr_value_id **in, int *n_in, tpr_value_id *out);
// Floating-point operations one run of node n does, for GEMM rates: 2*M*N*K
// per batch for matmul, 0 for every other op.
double tpr_program_node_flops(const tpr_program *p, int n);

// One line per value: id, kind, dtype and shape, producing op, name.
void tpr_program_dump(const tpr_program *p, FILE *f);

// Serialization. *bytes is malloc'ed; the caller frees it.
tpr_status tpr_program_serialize(const tpr_program *p, uint8_t **bytes, size_t *len);
tpr_status tpr_program_deserialize(const uint8_t *bytes, size_t len, tpr_program **out);
// FNV-1a 64 of the serialized bytes: equal programs, equal hashes.
tpr_status tpr_program_hash(const tpr_program *p, uint64_t *hash);

// The memory planner: every op output that is not a view gets a slice of
// one arena; slices are reused once their value (and every view of it) is
// dead. Lifetimes are inclusive node intervals, so an op's output never
// shares bytes with its own inputs.
typedef struct tpr_memory_plan {
  size_t arena_bytes;  // peak: bytes the arena needs
  size_t naive_bytes;  // sum of every planned buffer, as if none were reused
  int n_buffers;       // op outputs placed in the arena
} tpr_memory_plan;

#define TPR_PLAN_ALIGN 64
#define TPR_PLAN_NONE SIZE_MAX
// offsets (optional, num_values entries): arena offset per value, or
// TPR_PLAN_NONE for inputs, params and views.
tpr_status tpr_program_plan_memory(const tpr_program *p, tpr_memory_plan *plan, size_t *offsets);

// Execution of a program on a backend. The program must outlive the exec.
typedef struct tpr_exec tpr_exec;
tpr_status tpr_exec_new(const tpr_program *p, tpr_backend *backend, tpr_exec **out);
void tpr_exec_free(tpr_exec *e);
// Binds an input or param by name. t must be contiguous, on the exec's
// backend, with the declared dtype and shape; it must stay alive (tpr keeps
// no reference) while runs use it.
tpr_status tpr_exec_bind(tpr_exec *e, const char *name, const tpr_tensor *t);
// Whether the program has an input or param of this name (a program of part
// of a model declares only the weights it reads).
bool tpr_exec_has(const tpr_exec *e, const char *name);
tpr_status tpr_exec_run(tpr_exec *e);
// A named output of the last run; owned by the exec, valid until the next run.
tpr_status tpr_exec_output(tpr_exec *e, const char *name, const tpr_tensor **out);
const tpr_memory_plan *tpr_exec_plan(const tpr_exec *e);

// How a program's collective ops reach communicators: collectives/ sits above
// the runtime, so the exec calls through this table (shard/mesh_comms.h
// fills it from the mesh's communicators). `run` gets the op, its attributes
// and contiguous in[0..n_in)/out tensors whose shapes the op's rule has
// checked; the backend has been synchronised before the call.
typedef struct tpr_exec_collectives {
  void *ctx;
  tpr_status (*run)(void *ctx, tpr_op_kind op, const tpr_op_attrs *attrs, const tpr_tensor *const *in, int n_in,
                    tpr_tensor *out);
  // Optional, for prefetched param_gather nodes (NULL: they run through
  // `run` at their own node): start the collective and return a request;
  // poll it (MPI progresses only inside its calls); finish it (wait, then
  // whatever `run` does after the transfer).
  tpr_status (*start)(void *ctx, tpr_op_kind op, const tpr_op_attrs *attrs, const tpr_tensor *const *in, int n_in,
                      tpr_tensor *out, void **req);
  tpr_status (*test)(void *ctx, void *req, bool *done);
  tpr_status (*finish)(void *ctx, void *req, const tpr_tensor *const *in, tpr_tensor *out);
} tpr_exec_collectives;
// A program with collective ops fails to run until this is set.
void tpr_exec_set_collectives(tpr_exec *e, const tpr_exec_collectives *c);

// What the collectives of the runs since the last reset cost, per op kind:
// calls, bytes (nccl-tests' size: the gathered / reduced buffer), seconds
// from start to completion, and the seconds the run was blocked on them
// (exposed: equal to seconds unless prefetched gathers overlapped compute).
typedef struct tpr_exec_comm_stats {
  int64_t calls[TPR_OP_KIND_COUNT];
  double bytes[TPR_OP_KIND_COUNT];
  double seconds[TPR_OP_KIND_COUNT];
  double exposed[TPR_OP_KIND_COUNT];
} tpr_exec_comm_stats;
const tpr_exec_comm_stats *tpr_exec_comm(const tpr_exec *e);
void tpr_exec_comm_reset(tpr_exec *e);

// Per-node timing for benchmarks: while on, each run adds every node's wall
// time (the backend synchronised after the node) to seconds[node]; views
// take none. tpr_exec_node_seconds gives the (num_nodes) totals since
// profiling was switched on (NULL while off).
tpr_status tpr_exec_set_profiling(tpr_exec *e, bool on);
const double *tpr_exec_node_seconds(const tpr_exec *e);

// Per-op-kind timing of every exec run on the calling thread while a sink
// is set (one per thread, so an engine's execs, built lazily per step
// shape, need not be found one by one): each node's wall time (the backend
// synchronised after it) is added to seconds[op] and calls[op]; views take
// none. runs/run_seconds count whole tpr_exec_run calls, so run_seconds
// minus the op seconds is the exec's own overhead (binding views, syncs).
// The caller owns the struct and resets it with memset; NULL switches it
// off (then a run pays one branch per node).
typedef struct tpr_exec_op_profile {
  int64_t calls[TPR_OP_KIND_COUNT];
  double seconds[TPR_OP_KIND_COUNT];
  int64_t runs;
  double run_seconds;
} tpr_exec_op_profile;
void tpr_exec_set_op_profile(tpr_exec_op_profile *p);

#endif
