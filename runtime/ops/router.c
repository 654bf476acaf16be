// MiniMax-M2 router CPU kernel: sigmoid scores, top-k on score + bias,
// weights = the chosen sigmoid scores renormalised (the bias only selects).
//
// In f32 throughout (DESIGN.md section 3), with a deterministic selection:
// k passes of an argmax that keeps the first (lowest-index) maximum, so ties
// go to the lower expert index, and a NaN score ranks below every number.
// The chosen scores are summed in ascending expert order, not in selection
// order, so the weights do not depend on how ties were broken among equals.
// O(k * E) per token, plain loops on one thread.
#include <math.h>
#include <stdlib.h>

#include "cpu_kernels.h"

// a ranks above b: a larger number; any number beats NaN.
static inline bool ranks_above(float a, float b) { return !isnan(a) && (isnan(b) || a > b); }

// logits (T, E), bias (E); out (T, E) contiguous. attrs->i[0] = k.
TPR_CPU_KERNEL(router_sigmoid_topk) {
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "router_sigmoid_topk (cpu): expected 2 inputs, got %d", n_in);
  const tpr_tensor *lg = in[0], *bias = in[1];
  if (lg->dtype != TPR_F32 || bias->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "router_sigmoid_topk (cpu): logits %s, bias %s, out %s; only f32 is supported",
                    tpr_dtype_name(lg->dtype), tpr_dtype_name(bias->dtype), tpr_dtype_name(out->dtype));
  if (lg->ndim != 2 || bias->ndim != 1 || bias->shape[0] != lg->shape[1] || !tpr_tensor_same_shape(lg, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "router_sigmoid_topk (cpu): logits, bias and out shapes do not fit");
  const int64_t T = lg->shape[0], E = lg->shape[1];
  const int64_t k = attrs && attrs->n_i > 0 ? attrs->i[0] : 0;
  if (k < 1 || k > E)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "router_sigmoid_topk (cpu): k = %lld outside [1, E = %lld]", (long long)k,
                    (long long)E);
  if (T == 0) return TPR_OK;
  float *s = malloc(2 * (size_t)E * sizeof *s);  // sigmoid, then sigmoid + bias
  unsigned char *chosen = malloc((size_t)E);
  if (!s || !chosen) {
    free(s), free(chosen);
    return TPR_FAIL(TPR_ERR_OOM, "router_sigmoid_topk (cpu): %lld experts of scratch", (long long)E);
  }
  float *score = s + E;
  const float *ld = tpr_tensor_data(lg), *bd = tpr_tensor_data(bias);
  const int64_t ls0 = lg->stride[0], ls1 = lg->stride[1], bs = bias->stride[0];
  float *o = tpr_tensor_data(out);
  for (int64_t t = 0; t < T; t++, o += E) {
    for (int64_t e = 0; e < E; e++) {
      s[e] = 1.0f / (1.0f + expf(-ld[t * ls0 + e * ls1]));  // torch's sigmoid; exp overflow gives 0, not NaN
      score[e] = s[e] + bd[e * bs];
      chosen[e] = 0;
    }
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++)
        if (!chosen[e] && (best < 0 || ranks_above(score[e], score[best]))) best = e;
      if (best < 0) break;  // k <= E (the shape rule checks it): never taken
      chosen[best] = 1;
    }
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++)
      if (chosen[e]) sum += s[e];
    for (int64_t e = 0; e < E; e++) o[e] = chosen[e] ? s[e] / sum : 0.0f;
  }
  free(s), free(chosen);
  return TPR_OK;
}
