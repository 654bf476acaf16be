// Learning-rate schedule: linear warmup then cosine decay to min_lr (the
// nanoGPT / Megatron "cosine" schedule).
#ifndef TPR_TRAIN_SCHEDULE_H
#define TPR_TRAIN_SCHEDULE_H

#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr_lr_schedule {
  double lr_max, min_lr;
  int64_t warmup;  // steps of linear warmup (0: none)
  int64_t total;   // step at which the cosine reaches min_lr (stays there after)
} tpr_lr_schedule;

// Rejects negative or non-finite rates, min_lr > lr_max, warmup < 0 or
// total < warmup, naming the field.
tpr_status tpr_lr_schedule_check(const tpr_lr_schedule *s);

// lr for 0-based step s, computed in double and rounded to f32:
//   s < warmup:  lr_max * (s + 1) / warmup            (step 0 already trains)
//   otherwise:   p = clamp((s - warmup) / max(1, total - warmup), 0, 1)
//                min_lr + 0.5 * (lr_max - min_lr) * (1 + cos(pi * p))
float tpr_lr_at(const tpr_lr_schedule *s, int64_t step);

#endif
