// AdamW as torch.optim.AdamW's single-tensor path computes it
// (torch/optim/adam.py, _single_tensor_adam with decoupled_weight_decay=True,
// capturable=False, differentiable=False), checked against torch 2.15 on CPU
// by tests/test_train_host.c with the fixture from
// scripts/reference/make_adamw_fixture.py. Per element, in f32:
//
//   param.mul_(1 - lr * weight_decay)        p = p * f32(1 - lr*wd)      [skipped when wd == 0]
//   exp_avg.lerp_(grad, 1 - beta1)           m = fma(w, g - m, m), w = f32(1 - b1)
//   exp_avg_sq.mul_(beta2)                   v = v * f32(b2)
//     .addcmul_(grad, grad, value=1 - beta2)   v = fma(f32(1 - b2) * g, g, v)
//   bias_correction1 = 1 - beta1 ** step     double (Python floats)
//   bias_correction2 = 1 - beta2 ** step     double
//   step_size = lr / bias_correction1        double
//   bias_correction2_sqrt = bc2 ** 0.5       double
//   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
//                                            d = sqrt(v) / f32(bc2_sqrt) + f32(eps)
//   param.addcdiv_(exp_avg, denom, value=-step_size)
//                                            p = p + (f32(-step_size) * m) / d
//
// Why each detail:
// - torch's scalars are Python doubles; a CPU kernel on an f32 tensor rounds
//   a Scalar argument to f32 once (Scalar::to<float>) and then computes in
//   f32, so the coefficients are formed in double here and rounded at the
//   same points.
// - lerp with weight < 0.5 is `self + weight * (end - self)`; ATen's CPU
//   kernel evaluates it as one fused multiply-add (lerp_vec's vec::fmadd), so
//   fmaf here. Writing m = b1*m + (1-b1)*g instead differs in the last bit.
// - addcmul rounds value*t1, then multiplies by t2 and adds in one fused
//   step: torch's AVX2/AVX-512 CPU kernels (the ones every x86 server
//   runs) are built with FMA, and the measured results equal
//   fma(value*g, g, v) on every element, while the unfused v + (value*g)*g
//   differs in the last bit for ~5% of elements. addcdiv rounds value*t1,
//   divides by t2, then adds (no FMA possible: the last product is a
//   division). Everything else is one rounding per operation, so each is a
//   statement of its own and contraction is off (below).
// - The division by bias_correction2_sqrt is a true f32 division, not a
//   multiplication by the reciprocal (div_true_kernel for f32).
#include "adamw.h"

#include <math.h>

// GCC in GNU mode contracts a*b + c into an FMA across statements when the
// target has one (-march=native); torch's kernels round the product first,
// so contraction is switched off for this file. The one FMA torch does use
// (lerp) is written as fmaf. Clang contracts only within one expression.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <stdlib.h>

tpr_adamw_hparams tpr_adamw_default_hparams(void) {
  return (tpr_adamw_hparams){.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
}

tpr_status tpr_adamw_state_init(tpr_adamw_state *st, int64_t n) {
  st->m = st->v = NULL;
  st->n = 0;
  if (n < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "adamw: negative tensor size %lld", (long long)n);
  size_t cnt = n > 0 ? (size_t)n : 1;
  st->m = calloc(cnt, sizeof(float));
  st->v = calloc(cnt, sizeof(float));
  if (!st->m || !st->v) {
    tpr_adamw_state_free(st);
    return TPR_FAIL(TPR_ERR_OOM, "adamw: cannot allocate moments for %lld elements", (long long)n);
  }
  st->n = n;
  return TPR_OK;
}

void tpr_adamw_state_free(tpr_adamw_state *st) {
  free(st->m);
  free(st->v);
  st->m = st->v = NULL;
  st->n = 0;
}

typedef struct adamw_coefs {
  float decay, w1, b2, c2, neg_step_size, bc2_sqrt, eps, gscale;
} adamw_coefs;

// The element loop, one rounding per statement as above. p * 1.0f and
// g * 1.0f are exact, so an undecayed or unclipped tensor takes the same path. Split over the OpenMP threads
// (each element is independent, so the result does not depend on them).
#define ADAMW_LOOP                                                                  \
  const float decay = c->decay, w1 = c->w1, b2 = c->b2, c2 = c->c2, nss = c->neg_step_size; \
  const float bc2s = c->bc2_sqrt, eps = c->eps, gscale = c->gscale;                 \
  _Pragma("omp parallel for simd schedule(static)")                                 \
  for (int64_t i = 0; i < n; i++) {                                                 \
    float p = param[i] * decay, g = grad[i] * gscale;                               \
    float mi = fmaf(w1, g - m[i], m[i]);                                            \
    float vs = v[i] * b2;                                                           \
    float vi = fmaf(c2 * g, g, vs);                                                 \
    float denom = sqrtf(vi) / bc2s;                                                 \
    denom = denom + eps;                                                            \
    float num = nss * mi;                                                           \
    m[i] = mi, v[i] = vi;                                                           \
    param[i] = p + num / denom;                                                     \
  }

static void update_portable(float *restrict param, const float *restrict grad, float *restrict m, float *restrict v,
                            int64_t n, const adamw_coefs *c) {
  ADAMW_LOOP
}

// With hardware FMA fmaf is one instruction and the loop vectorizes (this
// file is built with -fno-math-errno: sqrtf of v >= 0 never sets errno, and
// vsqrtps is as exact as sqrtf); the
// arithmetic is the same IEEE operations, so the results are identical.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void update_fma(float *restrict param, const float *restrict grad,
                                                           float *restrict m, float *restrict v, int64_t n,
                                                           const adamw_coefs *c) {
  ADAMW_LOOP
}

static void update_fn(float *param, const float *grad, float *m, float *v, int64_t n, const adamw_coefs *c) {
  static int fma = -1;  // chosen once at run time, so one binary runs on any x86-64
  if (fma < 0) fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  (fma ? update_fma : update_portable)(param, grad, m, v, n, c);
}
#else
#define update_fn update_portable
#endif

tpr_status tpr_adamw_step(float *param, const float *grad, tpr_adamw_state *st, int64_t n,
                          const tpr_adamw_hparams *h, int64_t step, float lr, float weight_decay) {
  return tpr_adamw_step_scaled(param, grad, st, n, h, step, lr, weight_decay, 1.0f);
}

tpr_status tpr_adamw_step_scaled(float *param, const float *grad, tpr_adamw_state *st, int64_t n,
                                 const tpr_adamw_hparams *h, int64_t step, float lr, float weight_decay,
                                 float grad_scale) {
  if (!st || st->n != n || (n > 0 && (!st->m || !st->v || !param || !grad)))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "adamw: state holds %lld elements, tensor has %lld",
                    st ? (long long)st->n : -1LL, (long long)n);
  if (step < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "adamw: step %lld, must be >= 1", (long long)step);
  // The ranges torch.optim.Adam's constructor enforces.
  if (!(h->beta1 >= 0 && h->beta1 < 1) || !(h->beta2 >= 0 && h->beta2 < 1))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "adamw: betas (%g, %g) must lie in [0, 1)", h->beta1, h->beta2);
  if (!(h->eps >= 0)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "adamw: eps %g must be >= 0", h->eps);
  if (!(lr >= 0) || !isfinite(lr)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "adamw: lr %g must be finite and >= 0", lr);
  if (!(weight_decay >= 0) || !isfinite(weight_decay))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "adamw: weight_decay %g must be finite and >= 0", weight_decay);

  const double lr_d = lr, wd_d = weight_decay;
  const float decay = (float)(1.0 - lr_d * wd_d);
  const float w1 = (float)(1.0 - h->beta1);
  const float b2 = (float)h->beta2, c2 = (float)(1.0 - h->beta2);
  // Python's float ** float is C pow on doubles; torch's step is a float.
  const double bc1 = 1.0 - pow(h->beta1, (double)step);
  const double bc2 = 1.0 - pow(h->beta2, (double)step);
  const float neg_step_size = (float)(-(lr_d / bc1));
  const float bc2_sqrt = (float)pow(bc2, 0.5);
  const float eps = (float)h->eps;

  adamw_coefs c = {.decay = weight_decay != 0 ? decay : 1.0f, .w1 = w1, .b2 = b2, .c2 = c2,
                   .neg_step_size = neg_step_size, .bc2_sqrt = bc2_sqrt, .eps = eps, .gscale = grad_scale};
  update_fn(param, grad, st->m, st->v, n, &c);
  return TPR_OK;
}

bool tpr_adamw_decays(const char *hf_name, int ndim) {
  (void)hf_name;
  return ndim >= 2;
}
