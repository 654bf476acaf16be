// Internals shared by the MiniMax-M2 builder's files.
#ifndef TPR_MINIMAX_M2_IMPL_H
#define TPR_MINIMAX_M2_IMPL_H

#include "models/minimax_m2.h"

#include "models/train_loss.h"

// Training: the loss head after the final norm. x (T, H) replicated over tp,
// head (V'/tp, H) this rank's vocab shard, router_logits (layers) each (T, E).
// Adds input "targets", outputs "loss", "ce", "aux", then the backward with
// a "grad:<name>" output for every trained param (every f32 param but the
// routing bias, which only selects).
tpr_status tpr__m2_build_loss(tpr_program *p, const tpr_shard_plan *plan, const tpr_m2_build_opts *o,
                              tpr_value_id rank, tpr_value_id rank_tp, tpr_value_id x, tpr_value_id head,
                              const tpr_value_id *router_logits);

#endif
