// Pieces shared by the model commands (run, forward, bench model): token
// lists, the --tp check, and opening a MiniMax-M2 session on every rank.
#ifndef TPR_MODEL_CLI_H
#define TPR_MODEL_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "launch/world.h"
#include "engine/session.h"
#include "engine/speculative.h"

// "1,2,3" -> ids (malloc'ed, *n entries). Empty lists, non-numbers, negative
// ids and ids beyond int32 are TPR_ERR_INVALID_ARG naming the flag and item.
tpr_status tpr_cli_token_list(const char *flag, const char *text, int32_t **ids, int64_t *n);

// Debug flags of the model commands: the negative controls of the parity
// tests. Hidden from nobody: --help lists them as "test only".
typedef struct tpr_model_debug {
  int64_t force_tp_rank;  // -1: off
  bool per_rank_qk_norm, broadcast_program;
} tpr_model_debug;
#define TPR_MODEL_DEBUG_DEFAULT {.force_tp_rank = -1}
#define TPR_MODEL_DEBUG_ARGS(d)                                                                              \
  {"broadcast-program", TPR_ARG_FLAG, &(d).broadcast_program,                                              \
   "rank 0 builds each program and sends its bytes to the others (compile once, run everywhere)"},        \
  {"debug-force-tp-rank", TPR_ARG_INT, &(d).force_tp_rank,                                                 \
   "test only: every rank's rank tensor claims this tp rank (a negative control)"},                         \
  {"debug-per-rank-qk-norm", TPR_ARG_FLAG, &(d).per_rank_qk_norm,                                          \
   "test only: normalise q/k per rank without the all-reduce (a negative control)"}

// The mesh and MoE flags of run, forward and bench model.
typedef struct tpr_model_mesh {
  int64_t tp, dp, ep, etp;      // 0: defaults (see tpr_session_opts)
  const char *moe_dispatch;     // auto | alltoall | allreduce
  double capacity_factor;       // 0: dropless
  bool reroute_dropped;
  int64_t reroute_seed;
  bool moe_stats;               // set by the commands that print them
  const char *weight_dtype;     // auto | f32 | bf16 (engine/weight_dtype.h)
  const char *activation_dtype; // f32 | bf16: activations of matmuls against bf16 weights (tpr_session_opts)
  bool dense_sparse_layers;     // minicpm_sala: the sparse layers run dense (tpr_session_opts)
} tpr_model_mesh;
#define TPR_MODEL_MESH_DEFAULT {.moe_dispatch = "auto", .weight_dtype = "auto", .activation_dtype = "f32"}
#define TPR_MODEL_MESH_ARGS(m)                                                                                   \
  {"tp", TPR_ARG_INT, &(m).tp, "tensor-parallel degree of attention (default: world / dp)"},                   \
  {"dp", TPR_ARG_INT, &(m).dp, "data-parallel replicas of attention; world = dp*tp (default 1)"},               \
  {"ep", TPR_ARG_INT, &(m).ep, "expert-parallel degree: experts in contiguous blocks (default 1)"},             \
  {"etp", TPR_ARG_INT, &(m).etp, "expert tensor-parallel degree: each expert's width split (default world/ep)"}, \
  {"moe-dispatch", TPR_ARG_STR, &(m).moe_dispatch,                                                              \
   "auto | alltoall | allreduce (default auto: alltoall when ep or dp > 1)"},                                        \
  {"capacity-factor", TPR_ARG_FLOAT, &(m).capacity_factor,                                                      \
   "expert capacity ceil(tokens*top_k*F/experts); lowest-weight assignments past it are dropped (default: dropless)"}, \
  {"reroute-dropped", TPR_ARG_FLAG, &(m).reroute_dropped,                                                       \
   "send dropped assignments to random experts with spare capacity (needs --capacity-factor)"},                  \
  {"reroute-seed", TPR_ARG_INT, &(m).reroute_seed, "seed of the re-routing draw (default 0)"},                  \
  {"weight-dtype", TPR_ARG_STR, &(m).weight_dtype,                                                              \
   "auto | f32 | bf16: the dtype weight matrices are held in (default auto: bf16 and block-scaled FP8 stay as the checkpoint has them, on the cpu)"}, \
  {"activation-dtype", TPR_ARG_STR, &(m).activation_dtype,                                                      \
   "f32 | bf16: activations entering a matmul against bf16 weights (default f32: exact products; bf16: rounded to bf16 and multiplied with AVX512_BF16 dot products where the CPU has them, as llama.cpp and PyTorch's bf16 path do: about 1.8x the prefill GEMM rate; cpu only, needs bf16 weights, not for training)"}, \
  {"dense-sparse-layers", TPR_ARG_FLAG, &(m).dense_sparse_layers,                                               \
   "minicpm_sala: run the InfLLM-v2 sparse attention layers dense (every key attended), for comparison (train: their forward and gradients too); refused for other models"}

// The batched engine's flags of run and bench model.
typedef struct tpr_model_engine {
  int64_t max_batch;            // sequences per step per replica (0: the command's default)
  int64_t max_tokens_per_step;  // tokens per step per replica (0: 256)
  int64_t block_size;           // KV rows per block (0: 16)
  int64_t kv_cache_bytes;       // KV pool per rank (0: see tpr_session_opts)
  double kv_cache_fraction;     // of the memory left after the weights (0: unused)
  bool no_prefix_cache;         // automatic prefix caching off (tpr_engine_opts)
  const char *speculative;      // speculative decoding's drafter (engine/speculative.h); NULL: off
} tpr_model_engine;
#define TPR_MODEL_ENGINE_ARGS(g)                                                                                  \
  {"max-batch", TPR_ARG_SIZE, &(g).max_batch, "sequences a replica runs per step (default: all the prompts)"},      \
  {"max-tokens-per-step", TPR_ARG_SIZE, &(g).max_tokens_per_step,                                                  \
   "token budget of a step per replica: decodes first, then prefill chunks (default 256)"},                       \
  {"block-size", TPR_ARG_SIZE, &(g).block_size, "KV cache rows per block (default 16)"},                          \
  {"kv-cache-bytes", TPR_ARG_SIZE, &(g).kv_cache_bytes,                                                           \
   "KV pool per rank, all layers (default: room for --max-batch full-length sequences)"},                         \
  {"kv-cache-fraction", TPR_ARG_FLOAT, &(g).kv_cache_fraction,                                                   \
   "KV pool as this fraction of the memory free after loading (instead of --kv-cache-bytes)"},                   \
  {"no-prefix-cache", TPR_ARG_FLAG, &(g).no_prefix_cache,                                                        \
   "turn automatic prefix caching off (default on: full KV blocks of earlier prompts are reused, so a shared prefix is prefilled once)"}, \
  {"speculative", TPR_ARG_STR, &(g).speculative,                                                                 \
   "lookup:n:k | self:N:k | off: speculative decoding: up to k draft tokens per step, from prompt lookup (the last n or fewer tokens matched earlier in the prompt and output) or from the model's own first N layers, verified by the whole model in one step; greedy output is unchanged, sampling keeps its distribution (default off)"}

// The session options the flags give (sizes checked against the world; an
// unknown --moe-dispatch is TPR_ERR_INVALID_ARG).
tpr_status tpr_cli_session_opts(const tpr_world *w, const char *model, const tpr_model_mesh *m, int64_t max_seq,
                                const tpr_model_debug *d, tpr_session_opts *out);
// Opens the model for the batched engine (g's pool and batch sizes).

// Opens the model on every rank with the given mesh (sizes that do not fit
// the world, or an unknown --moe-dispatch, are TPR_ERR_INVALID_ARG).
tpr_status tpr_cli_open_model(tpr_world *w, const char *model, const tpr_model_mesh *m, int64_t max_seq,
                              const tpr_model_debug *d, tpr_session **out);
// "KV pool: N blocks x B tokens = ... per replica, X MiB per rank; max batch M" (stdout).
void tpr_cli_print_kv_pool(const tpr_session *s);
// --speculative as a drafter (off when not given); a bad value is
// TPR_ERR_INVALID_ARG (TPR_ERR_UNSUPPORTED for a drafter not built).
tpr_status tpr_cli_speculative(const tpr_model_engine *g, tpr_spec *out);
tpr_status tpr_cli_open_engine_model(tpr_world *w, const char *model, const tpr_model_mesh *m, int64_t max_seq,
                                     const tpr_model_engine *g, const tpr_model_debug *d, tpr_session **out);

#endif
