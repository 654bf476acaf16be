// The inverse of the loader's transforms (shard/loader.h), for training:
// folding a gradient held in a rank's layout so replicated copies of one
// checkpoint head agree and padding stays zero, counting each checkpoint
// element once in a global norm, and placing a rank's buffer back into the
// checkpoint tensor it came from (saving, and comparing with references).
#ifndef TPR_UNSHARD_H
#define TPR_UNSHARD_H

#include <stdbool.h>

#include "shard/mesh.h"
#include "shard/shard_plan.h"

// Whether folding kind k's gradient needs the other tp ranks' buffers: a
// KV-layout slice (q/k/v/o_proj) when KV heads are replicated or converted,
// so copies of a head live on other ranks.
bool tpr_unshard_fold_needs_gather(const tpr_shard_plan *p, const tpr_shard_tensor *k);

// Folds a gradient `buf` laid out as tp rank tp_rank's buffer of kind k (the
// *_HEADS transforms; other kinds are left as they are): slots of padding
// heads become 0, and every slot that copies a checkpoint head receives the
// sum over all of that head's slots (d F(W,...,W)/dW = sum of the copies'
// gradients). gathered: (tp, numel) every tp rank's buffer in rank order,
// required when tpr_unshard_fold_needs_gather, else NULL.
void tpr_unshard_fold_grad(const tpr_shard_plan *p, const tpr_shard_tensor *k, int tp_rank, float *buf,
                           const float *gathered);

// Sum of squares of the elements of `buf` (kind k, held by the rank at mesh
// coordinates m) that this rank counts, so that adding every rank's sum
// counts each checkpoint element exactly once: replicas over dp (edp for
// experts) count on replica 0, tp-replicated tensors on tp rank 0, copied
// heads at their first slot, padding never. In double.
double tpr_unshard_sumsq(const tpr_shard_plan *p, const tpr_shard_tensor *k, const tpr_mesh *m, const float *buf);

// Whether the loader laid kind k out by heads (q/k/v/o_proj, the QK-norm
// weights: padding and copies over tp), the kinds tpr_unshard_fold_grad folds.
bool tpr_unshard_heads_layout(const tpr_shard_tensor *k);

// tpr_unshard_sumsq's count over the elements [lo, hi) of the rank's buffer
// of kind k that `buf` holds (buf[0] is element lo), without the replica
// check: for chunks that are disjoint over dp / edp (shard/fsdp.h). Kinds
// laid out by heads are not supported (0): fold and count them whole.
double tpr_unshard_sumsq_range(const tpr_shard_tensor *k, const tpr_mesh *m, const float *buf, int64_t lo,
                               int64_t hi);

// Writes the elements of checkpoint tensor k that the rank at mesh
// coordinates m holds in `buf` into `hf` (k->global_shape, row-major f32).
// Padding is skipped; copies of a head write the same element again.
void tpr_unshard_place(const tpr_shard_plan *p, const tpr_shard_tensor *k, const tpr_mesh *m, const float *buf,
                       float *hf);

#endif
