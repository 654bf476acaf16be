// MiniMax-M2 router CUDA kernel (cpu.c's twin): sigmoid scores, top-k on
// score + bias, weights = the chosen sigmoid scores renormalised.
//
// One thread per token runs the CPU's loops unchanged (the router is O(T k E)
// and tiny next to the GEMMs): k passes of an argmax that keeps the first
// maximum, so ties go to the lower expert index and a NaN score ranks below
// every number; the chosen scores are summed in ascending expert order in
// f32. The token's out row holds the sigmoids while it selects, and a byte
// per expert in scratch marks the chosen.
#include <math.h>

#include "runtime/ops/cuda_kernels.h"

// a ranks above b: a larger number; any number beats NaN.
static __device__ __forceinline__ bool ranks_above(float a, float b) { return !isnan(a) && (isnan(b) || a > b); }

// logits (T, E) strides (ls0, ls1), bias (E) stride bs; out (T, E)
// contiguous; chosen (T, E) scratch.
static __global__ void router_kernel(float *o, const float *lg, int64_t ls0, int64_t ls1, const float *bias,
                                     int64_t bs, uint8_t *chosen, int64_t T, int64_t E, int64_t k) {
  TPR_CUDA_GRID_STRIDE(t, T) {
    float *s = o + t * E;  // sigmoids until the weights overwrite them
    uint8_t *ch = chosen + t * E;
    for (int64_t e = 0; e < E; e++) {
      s[e] = 1.0f / (1.0f + expf(-lg[t * ls0 + e * ls1]));  // torch's sigmoid; exp overflow gives 0, not NaN
      ch[e] = 0;
    }
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      float best_score = 0.0f;
      for (int64_t e = 0; e < E; e++) {
        if (ch[e]) continue;
        const float sc = s[e] + bias[e * bs];
        if (best < 0 || ranks_above(sc, best_score)) best = e, best_score = sc;
      }
      if (best < 0) break;  // k <= E: never taken
      ch[best] = 1;
    }
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++)
      if (ch[e]) sum += s[e];
    for (int64_t e = 0; e < E; e++) s[e] = ch[e] ? s[e] / sum : 0.0f;
  }
}

// logits (T, E), bias (E); out (T, E) contiguous. attrs->i[0] = k.
TPR_CUDA_KERNEL(router_sigmoid_topk) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "router_sigmoid_topk (cuda): expected 2 inputs, got %d", n_in);
  const tpr_tensor *lg = in[0], *bias = in[1];
  if (lg->dtype != TPR_F32 || bias->dtype != TPR_F32 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "router_sigmoid_topk (cuda): logits %s, bias %s, out %s; only f32 is supported",
                    tpr_dtype_name(lg->dtype), tpr_dtype_name(bias->dtype), tpr_dtype_name(out->dtype));
  if (lg->ndim != 2 || bias->ndim != 1 || bias->shape[0] != lg->shape[1] || !tpr_tensor_same_shape(lg, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "router_sigmoid_topk (cuda): logits, bias and out shapes do not fit");
  const int64_t T = lg->shape[0], E = lg->shape[1];
  const int64_t k = attrs && attrs->n_i > 0 ? attrs->i[0] : 0;
  if (k < 1 || k > E)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "router_sigmoid_topk (cuda): k = %lld outside [1, E = %lld]", (long long)k,
                    (long long)E);
  if (T == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "router_sigmoid_topk", "set device");
  tpr__cuda_scratch chosen(c);
  TPR_CHECK(chosen.alloc((size_t)(T * E)));
  const int th = 64;
  router_kernel<<<tpr__cuda_blocks(T, th), th, 0, c->stream>>>(
      (float *)tpr_tensor_data(out), (const float *)tpr_tensor_data(lg), lg->stride[0], lg->stride[1],
      (const float *)tpr_tensor_data(bias), bias->stride[0], (uint8_t *)chosen.p, T, E, k);
  TPR_CUDA_LAUNCHED("router_sigmoid_topk", "router kernel");
  return TPR_OK;
}

const tpr__kernel_def tpr__router_cuda[] = {
    {TPR_OP_ROUTER_SIGMOID_TOPK, cuda_router_sigmoid_topk},
    {},
};
