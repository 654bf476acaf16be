// FSDP-style sharded data parallelism (docs/training.md, "FSDP"): every
// trained tensor of a rank's layout is cut into n equal flat chunks over its
// data-parallel group -- dense params over dp, experts over edp (docs/architecture.md
// section 4, "MoE parallel folding") -- and rank r of the group keeps chunk r:
// elements [r*chunk, min(numel, (r+1)*chunk)), zero-padded to chunk (FSDP2's
// per-parameter dim-0 sharding, on the flattened tensor). The program gathers
// a layer's chunks just before the layer runs (param_gather) and
// reduce-scatters their gradients in f32.
#ifndef TPR_FSDP_H
#define TPR_FSDP_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/dtype.h"
#include "shard/mesh.h"

typedef struct tpr_fsdp_opts {
  bool on;
  tpr_dtype param_dtype;  // what the program gathers and computes with: TPR_F32 or TPR_BF16
                          // (master weights, gradients and moments stay f32)
  bool prefetch;          // start the next layer's gathers while this layer computes
  bool reshard;           // reshard_after_forward: gather again for the backward
  // Negative controls only: gradients summed over the replicas instead of
  // averaged; each rank keeping (and so updating) the next rank's chunk.
  bool debug_sum_grads, debug_wrong_shard;
} tpr_fsdp_opts;

// Elements per rank: ceil(numel / n).
static inline int64_t tpr_fsdp_chunk(int64_t numel, int n) { return (numel + n - 1) / n; }

// The group a trained tensor is sharded over and this rank's place in it:
// experts over edp, everything else over dp.
static inline void tpr_fsdp_group(const tpr_mesh *m, bool expert, int *n, int *r) {
  *n = expert ? m->edp : m->dp;
  *r = expert ? m->edp_rank : m->dp_rank;
}

#endif
