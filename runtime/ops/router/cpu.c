// MiniMax-M2 router CPU kernel: sigmoid scores, top-k on score + bias,
// weights = the chosen sigmoid scores renormalised (the bias only selects).
//
// In f32 throughout (docs/architecture.md section 3), with a deterministic selection:
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

// A kernel's logits (T, E) and bias (E), and select_row's scratch for nt
// threads (per thread: sigmoids and scores, 2E floats; chosen flags, E bytes).
typedef struct selection {
  const float *ld, *bd;
  int64_t ls0, ls1, bs, E, k;
  float *s_all;
  unsigned char *chosen_all;
} selection;

static tpr_status selection_new(const char *op, const tpr_tensor *lg, const tpr_tensor *bias, int64_t k, int nt,
                                selection *x) {
  const int64_t E = lg->shape[1];
  *x = (selection){.ld = tpr_tensor_data(lg), .bd = tpr_tensor_data(bias), .ls0 = lg->stride[0],
                   .ls1 = lg->stride[1], .bs = bias->stride[0], .E = E, .k = k};
  x->s_all = malloc(2 * (size_t)(nt * E) * sizeof *x->s_all);
  x->chosen_all = malloc((size_t)(nt * E));
  if (x->s_all && x->chosen_all) return TPR_OK;
  free(x->s_all), free(x->chosen_all);
  return TPR_FAIL(TPR_ERR_OOM, "%s (cpu): %lld experts of scratch", op, (long long)E);
}

static void selection_free(selection *x) { free(x->s_all), free(x->chosen_all); }

// Row t's selection in the calling thread's scratch: *s (E) the sigmoids,
// *chosen (E) the picks; returns the sum of the chosen s.
static float select_t(const selection *x, int64_t t, float **s, unsigned char **chosen) {
  const int64_t th = omp_get_thread_num(), E = x->E;
  *s = x->s_all + 2 * th * E;
  *chosen = x->chosen_all + th * E;
  return select_row(x->ld + t * x->ls0, x->ls1, x->bd, x->bs, E, x->k, *s, *s + E, *chosen);
}

// logits (T, E), bias (E); out (T, E) contiguous. attrs->i[0] = k.
TPR_CPU_KERNEL(router_sigmoid_topk) {
  const tpr_tensor *lg = in[0], *bias = in[1];
  const int64_t T = lg->shape[0], E = lg->shape[1], k = attrs->i[0];  // the shape rule checked 1 <= k <= E
  if (T == 0) return TPR_OK;
  const int nt = tpr__cpu_nt(ctx, T * E * (k + 2));  // k argmax passes plus the sigmoids and the writes
  selection x;
  TPR_CHECK(selection_new("router_sigmoid_topk", lg, bias, k, nt, &x));
  float *out_d = tpr_tensor_data(out);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float *s, *o = out_d + t * E;
    unsigned char *chosen;
    const float sum = select_t(&x, t, &s, &chosen);
    for (int64_t e = 0; e < E; e++) o[e] = chosen[e] ? s[e] / sum : 0.0f;
  }
  selection_free(&x);
  return TPR_OK;
}

// logits (T, E), bias (E), dy (T, E); out dlogits (T, E) contiguous.
// attrs->i[0] = k. The selection is piecewise constant (no gradient to the
// bias, none through the choice); on the chosen set out_i = s_i / S, so
// ds_i = (dy_i - sum_j w_j dy_j) / S with w = out, and dlogit_i = ds_i *
// s_i (1 - s_i). The dot is accumulated in double in ascending expert order.
TPR_CPU_KERNEL(router_sigmoid_topk_bwd) {
  const tpr_tensor *lg = in[0], *bias = in[1], *dy = in[2];
  const int64_t T = lg->shape[0], E = lg->shape[1], k = attrs->i[0];  // the shape rule checked 1 <= k <= E
  if (T == 0) return TPR_OK;
  const int nt = tpr__cpu_nt(ctx, T * E * (k + 3));
  selection x;
  TPR_CHECK(selection_new("router_sigmoid_topk_bwd", lg, bias, k, nt, &x));
  const float *dd = tpr_tensor_data(dy);
  const int64_t ds0 = dy->stride[0], ds1 = dy->stride[1];
  float *out_d = tpr_tensor_data(out);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float *s, *o = out_d + t * E;
    unsigned char *chosen;
    const float sum = select_t(&x, t, &s, &chosen);
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
  selection_free(&x);
  return TPR_OK;
}

const tpr__kernel_def tpr__router_cpu[] = {
    {TPR_OP_ROUTER_SIGMOID_TOPK, cpu_router_sigmoid_topk},
    {TPR_OP_ROUTER_SIGMOID_TOPK_BWD, cpu_router_sigmoid_topk_bwd},
    {0},
};
