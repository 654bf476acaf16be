// A model loaded on this rank and ready to run, for every family the engine
// knows (models/family.h): its weight slices, the paged KV pool, the mesh
// communicators, and one program + exec per step shape (built on first use).
// Every rank of the world must make the same calls in the same order (each
// step runs collectives). The batched engine (engine/engine.h) schedules
// steps over it; tpr_session_forward runs one sequence directly.
#ifndef TPR_ENGINE_SESSION_H
#define TPR_ENGINE_SESSION_H

#include <stdbool.h>

#include "collectives/tpr_comm.h"
#include "models/family.h"
#include "models/layers/moe.h"
#include "models/moe_stats.h"
#include "shard/mesh.h"
#include "shard/model_config.h"

typedef struct tpr_session_opts {
  const char *model_dir;   // HF checkpoint or converted directory
  int64_t max_seq;         // the longest sequence (prompt + generation) a block table holds
  int64_t max_batch;       // sequences per step: block-table rows (0: 1)
  int64_t block_size;      // KV token rows per block (0: 16)
  // The KV pool per rank, all layers: kv_cache_bytes if > 0, else this
  // fraction of the memory available after loading if > 0, else room for
  // max_batch sequences of max_seq tokens. Every rank takes the smallest
  // block count any rank can afford.
  int64_t kv_cache_bytes;
  double kv_cache_fraction;
  // The mesh (shard/mesh.h); 0 picks: dp 1, tp = world / dp, ep 1,
  // etp = world / ep. world = dp*tp = edp*ep*etp.
  int tp, dp, ep, etp;
  tpr_moe_opts moe;        // dispatcher and capacity mode
  // The dtype the weight matrices are held in (engine/weight_dtype.h):
  // TPR_F32 (0, the default), TPR_BF16, or TPR_LOAD_SOURCE_DTYPE (auto:
  // bf16 matrices of the checkpoint stay bf16). Training holds f32.
  tpr_dtype weight_dtype;
  // Matmuls against bf16 weight matrices round their activations to bf16
  // and use bf16 dot products (runtime/ops/gemm/bf16_gemm.h); off: exact f32
  // products. The cpu backend only, and only with bf16 matrices held: the
  // session refuses it otherwise (and for training), so it is never ignored.
  bool bf16_activations;
  bool moe_stats;          // count routing statistics (tpr_session_moe_stats)
  // Rank 0 builds each program and sends its bytes to the others ("compile
  // once, run on every rank"); otherwise every rank builds its own and the
  // hashes are compared.
  bool broadcast_program;
  // Opened for training: f32 weights, no KV pool, no step programs;
  // max_seq is ignored. Code above the engine builds its own programs over
  // the weights (engine/session_parts.h).
  bool training;
  // Negative controls for the parity tests (never in real runs):
  bool per_rank_qk_norm;   // normalise q/k per rank (no all-reduce, local divisor)
  int mrope_layout_control;  // MRoPE families: > 0 rotates in this tpr_mrope_layout, not the config's
  int skip_grad_marks;     // training without some grad_all_reduce marks (the builders' skip_grad_marks)
  int force_tp_rank;       // >= 0: every rank's rank tensor claims this tp rank
  int family_control;      // a family's own negative control (minicpm_sala: tpr_sala_control); 0 none
  // minicpm_sala: run the InfLLM-v2 sparse layers dense (causal attention
  // over every key; `--dense-sparse-layers`), for comparison.
  bool dense_sparse_layers;
} tpr_session_opts;

typedef struct tpr_session tpr_session;

// Bytes a weight element of the first plan kind whose name contains `kind`
// takes as held (its dtype, plus an FP8 kind's share of its scales); 4 when
// no kind matches.
double tpr_session_weight_element_bytes(const tpr_session *s, const char *kind);

typedef struct tpr_session_info {
  double load_s;             // config, plan, weights, caches
  uint64_t weight_bytes;     // this rank's weights as held (opts.weight_dtype)
  tpr_dtype matrix_dtype;    // the weight matrices' dtype as held: bf16 if any is, else f32
  bool bf16_activations;     // their matmuls round activations to bf16 (opts.bf16_activations)
  uint64_t bytes_read;       // checkpoint bytes this rank read
  uint64_t program_hash;     // of the last program built
} tpr_session_info;

// Collective over `world` (a host-buffer communicator of every rank). Errors (bad checkpoint, heads or experts that cannot be laid
// out on the mesh, ...) are returned on every rank.
tpr_status tpr_session_open(const tpr_session_opts *o, tpr_comm_t world, tpr_backend *be,
                               tpr_session **out);
void tpr_session_close(tpr_session *s);

const tpr_model_config *tpr_session_config(const tpr_session *s);
const tpr_shard_plan *tpr_session_plan(const tpr_session *s);
const tpr_mesh *tpr_session_mesh(const tpr_session *s);
const char *tpr_session_model_dir(const tpr_session *s);
const tpr_session_info *tpr_session_stats(const tpr_session *s);
int64_t tpr_session_max_seq(const tpr_session *s);

// The paged KV pool (the same on every rank).
typedef struct tpr_session_pool {
  int64_t blocks, block_size;  // NB, bs
  int64_t max_blocks;          // MB = ceil(max_seq / bs): a block table's length
  int64_t batch;               // B: block-table rows
  uint64_t bytes;              // this rank's pool, all layers, K and V
  // Recurrent state (families with tpr_family.state_shape; else all 0): NS
  // slots of one sequence's state each, on every recurrent layer; a running
  // sequence holds one slot (the scheduler's state slots).
  int64_t state_slots;         // NS = B
  uint64_t state_slot_bytes;   // one slot, every recurrent layer, this rank
  uint64_t state_bytes;        // the whole state pool on this rank
} tpr_session_pool;
tpr_session_pool tpr_session_pool_info(const tpr_session *s);

// One step: n_tokens real tokens of up to B sequences (models/family.h),
// run by the program of static shape (T, N); rows n_tokens..T-1 are padded
// (n_tokens may be 0: a replica with nothing to do in a dp step).
// Collective: every rank gives the same T and N (dp replicas may give
// different tokens). Token ids outside [0, vocab), positions outside
// [0, MB*bs), pool rows outside [0, NB*bs), sequence rows outside [0, B),
// block ids outside [0, NB), sample rows outside [0, n_tokens), n_tokens > T
// or n_samples > N: TPR_ERR_INVALID_ARG.
typedef struct tpr_step {
  int64_t T, N;                          // the program's shape (>= n_tokens, >= n_samples)
  int64_t n_tokens;
  const int32_t *tokens, *positions;     // (n_tokens)
  // MRoPE families (config.mrope_layout): the rope's positions (3, n_tokens)
  // row-major, rows temporal, height, width, each in [0, 2^24); NULL: every
  // row is `positions` (text). Ignored by other families.
  const int32_t *positions_3d;
  const int32_t *slots;                  // (n_tokens) pool rows: block * bs + offset
  const int32_t *seq;                    // (n_tokens) block-table rows
  const int32_t *block_tables;           // (B * MB) row-major
  // Families with a recurrent state: (n_tokens) each row's state slot in
  // [0, NS); one slot's rows contiguous and consecutive positions, the
  // state read at the first (zeros when it is position 0) and written after
  // the last. Ignored by other families; NULL there.
  const int32_t *state_slots;
  // (n_tokens) each row's sequence's prompt length, in [0, max_seq], or
  // NULL. Read by families whose result depends on how a prompt is split
  // into calls (minicpm_sala: a sparse layer is dense or sparse by the
  // call's length): given, a row is computed as a one-call prefill of the
  // prompt and one-token decodes compute it, however the engine chunks and
  // batches; 0 or NULL: as this call computes it. Ignored by other families.
  const int32_t *prefill_lens;
  int64_t n_samples;
  const int32_t *sample_rows;            // (n_samples) token rows whose logits come out
  // The first `layers` decoder layers only, then the final norm and lm head
  // (0: every layer): a self-speculative draft. Only those layers' KV rows
  // are written. Not for families with a recurrent state.
  int64_t layers;
} tpr_step;
// logits (n_samples, vocab) f32 (NULL: not copied out).
tpr_status tpr_session_step(tpr_session *s, const tpr_step *st, float *logits);

// One sequence held in blocks 0..MB-1 (block-table row 0) and state slot 0: runs tokens (T)
// at positions start..start+T-1 after the positions < start written by
// earlier calls (start 0 begins the sequence); logits (T, vocab) receives
// every position's. Needs a pool of at least MB blocks and no engine using
// the pool at the same time. Token ids outside [0, vocab) or start + T >
// max_seq: TPR_ERR_INVALID_ARG.
tpr_status tpr_session_forward(tpr_session *s, const int32_t *tokens, int64_t T, int64_t start, float *logits);

// tpr_session_forward with MRoPE positions: pos3 (3, T) row-major (rows
// temporal, height, width) for the rope, while the KV cache and the causal
// mask still use start..start+T-1. pos3 NULL: tpr_session_forward. A family
// without MRoPE refuses pos3 (TPR_ERR_INVALID_ARG).
tpr_status tpr_session_forward_3d(tpr_session *s, const int32_t *tokens, int64_t T, int64_t start,
                                  const int32_t *pos3, float *logits);

// The MRoPE position text continues from after pos3 (3, T): max over all of
// it + 1 (transformers' rope_deltas: decode token j after the prompt sits at
// next + j on every axis, i.e. cache position + (next - T)).
int64_t tpr_mrope_next_position(const int32_t *pos3, int64_t T);

// Collective: the routing statistics of every forward so far, summed over
// the dp replicas, into *out (the caller frees it with tpr_moe_stats_free).
// Needs opts.moe_stats.
tpr_status tpr_session_moe_stats(tpr_session *s, tpr_moe_stats *out);

#endif
