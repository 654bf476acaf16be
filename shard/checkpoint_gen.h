// Random Hugging Face checkpoints for any config: for measuring loads and
// converts (tpr make-checkpoint) without downloading a model.
#ifndef TPR_CHECKPOINT_GEN_H
#define TPR_CHECKPOINT_GEN_H

#include <stdint.h>

#include "runtime/dtype.h"
#include "runtime/status.h"

// Writes into out_dir (created if missing) every tensor the model of
// config_path has, under its Hugging Face name, with random values: weights
// N(0, 0.02^2), norm weights 1 + N(0, 0.1^2), the MiniMax-M2 routing bias
// N(0, 0.1^2) kept in F32 as in the release. Tensors are dealt in order
// over n_files files model-0000i-of-0000N.safetensors of about equal size,
// with model.safetensors.index.json; config.json is copied. Values depend on
// (seed, tensor name) only, not on n_files. *total_bytes (may be NULL): the
// tensor bytes written.
tpr_status tpr_checkpoint_generate(const char *config_path, const char *out_dir, uint64_t seed, tpr_dtype dt,
                                   int n_files, uint64_t *total_bytes);

#endif
