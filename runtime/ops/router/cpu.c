// MiniMax-M2 router CPU kernel: sigmoid scores, top-k on score + bias,
// weights = the chosen sigmoid scores renormalised (the bias only selects).
//
// In f32 throughout (DESIGN.md section 3), with a deterministic selection:
// k passes of an argmax that keeps the first (lowest-index) maximum, so ties
// go to the lower expert index, and a NaN score ranks below every number.
// The chosen scores are summed in ascending expert order, not in selection
// order, so the weights do not depend on how ties were broken among equals.
// O(k * E) per token; tokens are split over threads (cpu_threads.h), each
// token's selection and weights computed by one thread as above.
#include <math.h>
#include <stdlib.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"

// a ranks above b: a larger number; any number beats NaN.
static inline bool ranks_above(float a, float b) { return !isnan(a) && (isnan(b) || a > b); }

// One row's selection, shared by the forward and the backward so both see
// the same choice: s (E) = sigmoid(logits), score (E) = s + bias scratch,
// chosen (E) = the k experts picked. Returns the sum of the chosen s, added
// in f32 in ascending expert order.
static float select_row(const float *lrow, int64_t ls1, const float *bd, int64_t bs, int64_t E, int64_t k, float *s,
                        float *score, unsigned char *chosen) {
  for (int64_t e = 0; e < E; e++) {
    s[e] = 1.0f / (1.0f + expf(-lrow[e * ls1]));  // torch's sigmoid; exp overflow gives 0, not NaN
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
  return sum;
}

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
  const int nt = tpr__cpu_nt(ctx, T * E * (k + 2));  // k argmax passes plus the sigmoids and the writes
  float *s_all = malloc(2 * (size_t)(nt * E) * sizeof *s_all);  // per thread: sigmoid, then sigmoid + bias
  unsigned char *chosen_all = malloc((size_t)(nt * E));
  if (!s_all || !chosen_all) {
    free(s_all), free(chosen_all);
    return TPR_FAIL(TPR_ERR_OOM, "router_sigmoid_topk (cpu): %lld experts of scratch", (long long)E);
  }
  const float *ld = tpr_tensor_data(lg), *bd = tpr_tensor_data(bias);
  const int64_t ls0 = lg->stride[0], ls1 = lg->stride[1], bs = bias->stride[0];
  float *out_d = tpr_tensor_data(out);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const int64_t th = omp_get_thread_num();
    float *s = s_all + 2 * th * E, *score = s + E, *o = out_d + t * E;
    unsigned char *chosen = chosen_all + th * E;
    const float sum = select_row(ld + t * ls0, ls1, bd, bs, E, k, s, score, chosen);
    for (int64_t e = 0; e < E; e++) o[e] = chosen[e] ? s[e] / sum : 0.0f;
  }
  free(s_all), free(chosen_all);
  return TPR_OK;
}

// logits (T, E), bias (E), dy (T, E); out dlogits (T, E) contiguous.
// attrs->i[0] = k. The selection is piecewise constant (no gradient to the
// bias, none through the choice); on the chosen set out_i = s_i / S, so
// ds_i = (dy_i - sum_j w_j dy_j) / S with w = out, and dlogit_i = ds_i *
// s_i (1 - s_i). The dot is accumulated in double in ascending expert order.
TPR_CPU_KERNEL(router_sigmoid_topk_bwd) {
  if (n_in != 3)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "router_sigmoid_topk_bwd (cpu): expected 3 inputs, got %d", n_in);
  const tpr_tensor *lg = in[0], *bias = in[1], *dy = in[2];
  if (lg->dtype != TPR_F32 || bias->dtype != TPR_F32 || dy->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "router_sigmoid_topk_bwd (cpu): only f32 is supported");
  if (lg->ndim != 2 || bias->ndim != 1 || bias->shape[0] != lg->shape[1] || !tpr_tensor_same_shape(lg, dy) ||
      !tpr_tensor_same_shape(lg, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "router_sigmoid_topk_bwd (cpu): logits, bias, dy and out shapes do not fit");
  const int64_t T = lg->shape[0], E = lg->shape[1];
  const int64_t k = attrs && attrs->n_i > 0 ? attrs->i[0] : 0;
  if (k < 1 || k > E)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "router_sigmoid_topk_bwd (cpu): k = %lld outside [1, E = %lld]",
                    (long long)k, (long long)E);
  if (T == 0) return TPR_OK;
  const int nt = tpr__cpu_nt(ctx, T * E * (k + 3));
  float *s_all = malloc(2 * (size_t)(nt * E) * sizeof *s_all);
  unsigned char *chosen_all = malloc((size_t)(nt * E));
  if (!s_all || !chosen_all) {
    free(s_all), free(chosen_all);
    return TPR_FAIL(TPR_ERR_OOM, "router_sigmoid_topk_bwd (cpu): %lld experts of scratch", (long long)E);
  }
  const float *ld = tpr_tensor_data(lg), *bd = tpr_tensor_data(bias), *dd = tpr_tensor_data(dy);
  const int64_t ls0 = lg->stride[0], ls1 = lg->stride[1], bs = bias->stride[0];
  const int64_t ds0 = dy->stride[0], ds1 = dy->stride[1];
  float *out_d = tpr_tensor_data(out);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const int64_t th = omp_get_thread_num();
    float *s = s_all + 2 * th * E, *score = s + E, *o = out_d + t * E;
    unsigned char *chosen = chosen_all + th * E;
    const float sum = select_row(ld + t * ls0, ls1, bd, bs, E, k, s, score, chosen);
    double dot = 0;  // sum_j w_j dy_j over the chosen j
    for (int64_t e = 0; e < E; e++)
      if (chosen[e]) dot += (double)(s[e] / sum) * (double)dd[t * ds0 + e * ds1];
    for (int64_t e = 0; e < E; e++) {
      if (!chosen[e]) {
        o[e] = 0.0f;
        continue;
      }
      const double ds = ((double)dd[t * ds0 + e * ds1] - dot) / (double)sum;
      o[e] = (float)(ds * (double)s[e] * (1.0 - (double)s[e]));
    }
  }
  free(s_all), free(chosen_all);
  return TPR_OK;
}

const tpr__kernel_def tpr__router_cpu[] = {
    {TPR_OP_ROUTER_SIGMOID_TOPK, cpu_router_sigmoid_topk},
    {TPR_OP_ROUTER_SIGMOID_TOPK_BWD, cpu_router_sigmoid_topk_bwd},
    {0},
};
