#include "schedule.h"

#include <math.h>

tpr_status tpr_lr_schedule_check(const tpr_lr_schedule *s) {
  if (!isfinite(s->lr_max) || s->lr_max < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "lr schedule: lr %g must be finite and >= 0", s->lr_max);
  if (!isfinite(s->min_lr) || s->min_lr < 0 || s->min_lr > s->lr_max)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "lr schedule: min_lr %g must lie in [0, lr %g]", s->min_lr, s->lr_max);
  if (s->warmup < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "lr schedule: warmup %lld must be >= 0", (long long)s->warmup);
  if (s->total < s->warmup)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "lr schedule: total steps %lld shorter than warmup %lld",
                    (long long)s->total, (long long)s->warmup);
  return TPR_OK;
}

float tpr_lr_at(const tpr_lr_schedule *s, int64_t step) {
  if (step < s->warmup) return (float)(s->lr_max * (double)(step + 1) / (double)s->warmup);
  int64_t span = s->total - s->warmup;
  double p = (double)(step - s->warmup) / (double)(span > 1 ? span : 1);
  if (p < 0) p = 0;
  if (p > 1) p = 1;
  return (float)(s->min_lr + 0.5 * (s->lr_max - s->min_lr) * (1.0 + cos(M_PI * p)));
}
