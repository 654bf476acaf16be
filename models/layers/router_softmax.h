// The softmax top-k router (Qwen3-MoE, Mixtral, Hunyuan): p = softmax(logits)
// over the experts in f32, the k largest p chosen, and the combine weights
// either those p (renormalise false) or p / sum of the chosen p (true:
// Qwen3's norm_topk_prob). Built from existing ops, no kernel of its own:
//   p      = softmax(logits)                          (T, E)
//   w      = router_sigmoid_topk(p, 0, k)              selection only: sigmoid
//            is increasing, so its top-k of p is the top-k of p (ties: lower
//            expert index); w > 0 exactly on the chosen experts
//   mask   = w * rsqrt(w^2 + 1e-30)                    1 on the chosen, 0 else
//   g      = p * mask;  renormalise: g * rsqrt((g 1)^2) = g / sum g
// Selection on sigmoid(p) rather than the logits keeps it exact where the
// logits saturate sigmoid (|l| > 17); p values closer than ~3e-7 may tie.
// Backward (training, qwen3_moe): through softmax, g = p * mask and the
// renormalisation, as torch's through topk's values and their sum; the
// selection is piecewise constant: the fills get no cotangent (fill's rule),
// mask's derivative is 0 up to rounding (~1e-7 of the chosen entries'), and
// router_sigmoid_topk_bwd drops the non-chosen entries.
#ifndef TPR_ROUTER_SOFTMAX_H
#define TPR_ROUTER_SOFTMAX_H

#include <stdbool.h>

#include "runtime/program/tpr_runtime.h"

// logits (T, E) f32 -> gates (T, E) dense combine weights (0 off the top k).
tpr_status tpr_router_softmax_topk(tpr_program *p, tpr_value_id logits, int64_t k, bool renormalise,
                                   tpr_value_id *gates);

// The same, with the values capacity mode's own-probability re-routing reads
// (moe.h, reroute_own_prob): probs (T, E) the softmax, chosen (T, E) 1 on the
// top k, else 0.
typedef struct tpr_router_softmax_values {
  tpr_value_id gates, probs, chosen;
} tpr_router_softmax_values;
tpr_status tpr_router_softmax_topk_values(tpr_program *p, tpr_value_id logits, int64_t k, bool renormalise,
                                          tpr_router_softmax_values *out);

#endif
