// The training head every family's training program ends with: vocab-
// parallel cross-entropy, the MoE load-balancing loss (transformers'
// load_balancing_loss_func over the MoE layers' router logits) and the
// backward of the whole program, with a "grad:<param name>" output per
// trained param. Used by models/minimax_m2.c and models/qk_head_decoder.c.
#ifndef TPR_TRAIN_LOSS_H
#define TPR_TRAIN_LOSS_H

#include <stdbool.h>

#include "runtime/program/tpr_runtime.h"
#include "shard/shard_plan.h"

// Prefix of the gradient outputs of a training program: "grad:<param name>".
#define TPR_TRAIN_GRAD_PREFIX "grad:"

typedef struct tpr_train_loss_opts {
  int64_t tokens;        // T
  double aux_coef;       // weight of the aux loss (router_aux_loss_coef)
  bool skip_head_mark;   // negative control: leave out the lm head input's grad_all_reduce
  const char *family;    // names in messages
} tpr_train_loss_opts;

// x (T, H) final-normed, replicated over tp; head (V'/tp, H) this rank's
// vocab shard; router_logits (n_router) each (T, E), the MoE layers' raw
// gate outputs in layer order. Adds inputs "targets" (T) i32 (-100 ignored)
// and "loss_scale" (1) f32, outputs "loss" (1) = ce + aux_coef * aux, "ce",
// "aux", then the backward of loss * loss_scale:
// every f32 (or bf16 FSDP chunk) param but the routing bias (which only
// selects) is trained and gets "grad:<name>"; a trained param the loss does
// not reach is an error naming it.
tpr_status tpr_train_build_loss(tpr_program *p, const tpr_shard_plan *plan, const tpr_train_loss_opts *o,
                                tpr_value_id rank, tpr_value_id rank_tp, tpr_value_id x, tpr_value_id head,
                                const tpr_value_id *router_logits, int n_router);

#endif
