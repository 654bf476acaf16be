// torch computes the norm in the gradients' dtype (f32 per-tensor norms,
// then the norm of those) and the coefficient as f32 tensor ops; here the
// sum of squares arrives all-reduced in double, so the norm and coefficient
// are formed in double and rounded once. The clipped gradients agree with
// torch's to about one f32 rounding of the coefficient, not bit for bit.
#include "clip.h"

#include <math.h>

double tpr_clip_sumsq(const float *g, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
  return s;
}

tpr_status tpr_clip_coef(double sumsq, double max_norm, int64_t step, double *norm, float *coef) {
  *coef = 1.0f;
  *norm = sumsq >= 0 ? sqrt(sumsq) : sumsq;  // NaN and +Inf pass through sqrt unchanged
  if (!isfinite(max_norm) || max_norm <= 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "step %lld: grad clip max_norm %g must be finite and > 0",
                    (long long)step, max_norm);
  if (!isfinite(sumsq) || sumsq < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "step %lld: gradient norm is %g (non-finite gradients)",
                    (long long)step, *norm);
  double c = max_norm / (*norm + 1e-6);
  *coef = (float)(c < 1.0 ? c : 1.0);
  return TPR_OK;
}

void tpr_clip_scale(float *g, int64_t n, float coef) {
  for (int64_t i = 0; i < n; i++) g[i] *= coef;
}
