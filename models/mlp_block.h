// The demo model: one pre-norm SwiGLU MLP block, tensor-parallel.
//   partial (T, H) = MLP_r(rms_norm(x) * norm)   on rank r
//   y = sum over the tp group of partial
// It exercises everything below the model layer: config parsing, the rank
// tensor, rank-selected weight blocks, the program, its serialization and
// memory plan, and a collective. Config keys follow Hugging Face names.
#ifndef TPR_MLP_BLOCK_H
#define TPR_MLP_BLOCK_H

#include "models/layers/mlp.h"
#include "shard/mesh.h"

typedef struct tpr_block_config {
  int64_t hidden_size;        // H
  int64_t intermediate_size;  // F
  int64_t tokens;             // T, tokens per run
  float rms_norm_eps;
} tpr_block_config;

// The embedded default: H=256, F=1024, T=64, eps=1e-6.
tpr_block_config tpr_block_config_default(void);

// Reads a JSON config; a missing, mistyped or non-positive key is a
// TPR_ERR_FORMAT naming the key and the file.
tpr_status tpr_block_config_load(const char *path, tpr_block_config *out);

// Builds the block program for tensor-parallel degree tp. Inputs: "x"
// (T, H) f32. Params: "rank", "norm" (H), "mlp.w1" (F, H), "mlp.w3" (F, H),
// "mlp.w2" (H, F). Output: "partial" (T, H).
tpr_status tpr_block_build(const tpr_block_config *c, int64_t tp, tpr_program **out);

// Full random weights and input from `seed` (identical on every rank).
typedef struct tpr_block_tensors {
  tpr_tensor *x, *norm, *w1, *w3, *w2;
} tpr_block_tensors;
tpr_status tpr_block_random(const tpr_block_config *c, uint64_t seed, tpr_backend *be, tpr_block_tensors *out);
void tpr_block_tensors_free(tpr_block_tensors *t);
// Binds x, norm and the MLP weights, and the given rank tensor.
tpr_status tpr_block_bind(tpr_exec *e, const tpr_block_tensors *t, const tpr_tensor *rank);

#endif
