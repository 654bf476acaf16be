// The dtype a session holds each weight in: f32, or the checkpoint's bf16 or
// block-scaled FP8 kept as it is for the matrices (engine/weight_dtype.c says which).
#ifndef TPR_ENGINE_WEIGHT_DTYPE_H
#define TPR_ENGINE_WEIGHT_DTYPE_H

#include <stdbool.h>

#include "shard/loader.h"
#include "shard/shard_plan.h"

// "auto" (or NULL) -> TPR_LOAD_SOURCE_DTYPE, "f32", "bf16"; anything else is
// TPR_ERR_INVALID_ARG naming the flag.
tpr_status tpr_weight_dtype_parse(const char *name, tpr_dtype *out);
const char *tpr_weight_dtype_name(tpr_dtype dt);  // "auto" for TPR_LOAD_SOURCE_DTYPE

// kind_dt (plan->n_tensors): the dtype of each plan kind. want: TPR_F32 (all
// f32), TPR_BF16 (every matrix bf16, rounding f32 and FP8 checkpoints), or
// TPR_LOAD_SOURCE_DTYPE (auto: a matrix stays bf16 when the checkpoint holds
// it in bf16, FP8 when it holds it block-scaled FP8 at a block in
// kind_block; f16, FP8 that cannot be kept and f32 matrices are held in
// f32). kind_block: in, tpr_loader_fp8_block of each kind agreed over the
// ranks (the minimum); out, the scale block of the kinds held FP8, else 0.
// host_kernels: the backend runs the CPU kernels (the others take f32 only;
// auto gives f32 there, bf16 is TPR_ERR_UNSUPPORTED). expert_kinds: the
// three substrings of the expert gate, up and down kinds
// (models/family.h), held in one dtype.
tpr_status tpr_weight_dtypes(const tpr_loader *l, const tpr_shard_plan *plan, tpr_dtype want, bool host_kernels,
                             const char *const *expert_kinds, tpr_dtype *kind_dt, int *kind_block);

#endif
