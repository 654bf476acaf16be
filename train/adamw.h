// AdamW on host f32 arrays, matching torch.optim.AdamW (foreach=False,
// fused=False, amsgrad=False, maximize=False) operation for operation, so a
// run can be compared with a PyTorch run bit for bit (see adamw.c).
#ifndef TPR_TRAIN_ADAMW_H
#define TPR_TRAIN_ADAMW_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/status.h"

// Kept in double because torch keeps them as Python floats: the scalar
// coefficients (1 - b1, b1^t, ...) are formed in double and only rounded to
// f32 where a tensor kernel takes them.
typedef struct tpr_adamw_hparams {
  double beta1, beta2, eps;
} tpr_adamw_hparams;

// beta1 0.9, beta2 0.95, eps 1e-8.
tpr_adamw_hparams tpr_adamw_default_hparams(void);

// The two moments of one parameter tensor of n f32 elements.
typedef struct tpr_adamw_state {
  float *m, *v;  // (n,) exp_avg, exp_avg_sq; zero before the first step
  int64_t n;
} tpr_adamw_state;

// Allocates zeroed moments for n elements (st->m/v NULL on failure).
tpr_status tpr_adamw_state_init(tpr_adamw_state *st, int64_t n);
void tpr_adamw_state_free(tpr_adamw_state *st);

// One AdamW update of param (n,) with grad (n,); `step` is 1-based (the
// value torch's state["step"] has after its increment). lr and
// weight_decay are this step's values for this tensor (weight_decay 0 for
// tensors tpr_adamw_decays says no to). Fails on a size mismatch, step < 1
// or hyperparameters outside torch's accepted ranges.
tpr_status tpr_adamw_step(float *param, const float *grad, tpr_adamw_state *st, int64_t n,
                          const tpr_adamw_hparams *h, int64_t step, float lr, float weight_decay);
// The same step on the gradient grad * grad_scale, each product rounded to
// f32 as torch's clip_grad_norm_ leaves it in the gradient before its step
// (so the result is identical to scaling first), without a pass of its own.
tpr_status tpr_adamw_step_scaled(float *param, const float *grad, tpr_adamw_state *st, int64_t n,
                                 const tpr_adamw_hparams *h, int64_t step, float lr, float weight_decay,
                                 float grad_scale);

// Whether a parameter gets weight decay: only matrices and higher (ndim >=
// 2: projections, experts, embeddings); norm gains and biases (ndim 1) get
// none, the nanoGPT / Megatron convention. The name is taken so the rule can
// grow exceptions by name without changing callers; today it is unused.
bool tpr_adamw_decays(const char *hf_name, int ndim);

#endif
