// Gradient clipping by global L2 norm, torch.nn.utils.clip_grad_norm_'s
// rule: coef = max_norm / (norm + 1e-6), clamped to at most 1, and every
// gradient multiplied by it (also when it is 1, as torch does).
//
// The norm is global: each rank sums the squares of its gradient shards
// (tpr_clip_sumsq), the caller all-reduces those sums (replicated tensors
// counted once), and tpr_clip_coef turns the total into the coefficient.
#ifndef TPR_TRAIN_CLIP_H
#define TPR_TRAIN_CLIP_H

#include <stdint.h>

#include "runtime/status.h"

// sum g[i]^2 accumulated in double in index order (deterministic).
double tpr_clip_sumsq(const float *g, int64_t n);

// norm = sqrt(sumsq); coef = min(1, max_norm / (norm + 1e-6)) computed in
// double and rounded to f32. A non-finite or negative sumsq (a NaN/Inf
// gradient) fails with TPR_ERR_INVALID_ARG naming `step`, so the caller can
// stop before the optimizer spreads it into the weights; *norm is still set
// (to the non-finite value) for logging. max_norm must be finite and > 0
// (callers skip clipping when it is disabled).
tpr_status tpr_clip_coef(double sumsq, double max_norm, int64_t step, double *norm, float *coef);

// g[i] *= coef.
void tpr_clip_scale(float *g, int64_t n, float coef);

#endif
