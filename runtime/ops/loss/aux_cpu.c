// The MoE auxiliary load-balancing loss exactly as transformers computes it
// for MiniMaxM2ForCausalLM (load_balancing_loss_func, no attention mask):
// for every layer's raw router logits (T_l, E), p = softmax(logits) (a
// softmax, although the M2 router itself routes with sigmoid + correction
// bias), the top-k of p per row (no bias) gives one count per chosen
// expert; counts and probability sums are added over the layers, N = sum
// T_l, and
//   loss = E * sum_e (count_e / N) * (probsum_e / N).
// Kernels of moe_aux_stats(_bwd) and moe_aux_loss(_bwd).
// Softmax, sums and products are evaluated in double in a fixed order and
// rounded once to f32.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"

// p (E) = softmax of logits row t (any strides), in double.
static void softmax_row(const tpr_tensor *l, int64_t t, double *p) {
  const float *ld = tpr_tensor_data(l);
  int64_t E = l->shape[1];
  double m = -INFINITY, s = 0;
  for (int64_t e = 0; e < E; e++) {
    double v = ld[t * l->stride[0] + e * l->stride[1]];
    p[e] = v;
    if (v > m) m = v;
  }
  for (int64_t e = 0; e < E; e++) s += (p[e] = exp(p[e] - m));
  for (int64_t e = 0; e < E; e++) p[e] /= s;
}

// Whether a ranks above b: larger first, NaN below every number, ties to the
// lower index (torch.topk leaves ties unspecified).
static bool ranks_above(double a, int64_t ia, double b, int64_t ib) {
  bool na = isnan(a), nb = isnan(b);
  if (na || nb) return na == nb ? ia < ib : nb;
  return a > b || (a == b && ia < ib);
}

// out (2, E): row 0 = number of rows whose top-k holds e, row 1 = sum over
// rows of p[t, e]. The top-k is taken on the logits, which order the experts
// exactly as their softmax does.
TPR_CPU_KERNEL(moe_aux_stats) {
  const tpr_tensor *l = in[0];
  int64_t T = l->shape[0], E = l->shape[1], k = attrs->i[0];
  // (E) probabilities, (E) their sums, (E) chosen flags
  double *p = malloc((size_t)E * 3 * sizeof *p);
  if (!p) return TPR_FAIL(TPR_ERR_OOM, "moe_aux_stats (cpu): %lld experts of scratch", (long long)E);
  double *acc = p + E, *chosen = p + 2 * E;
  float *o = tpr_tensor_data(out);
  memset(o, 0, (size_t)(2 * E) * sizeof *o);
  for (int64_t e = 0; e < E; e++) acc[e] = 0;
  const float *ld = tpr_tensor_data(l);
  for (int64_t t = 0; t < T; t++) {
    softmax_row(l, t, p);
    for (int64_t e = 0; e < E; e++) {
      acc[e] += p[e];
      chosen[e] = 0;
    }
    // k rounds of "best expert not yet chosen": O(k E) per row.
    for (int64_t r = 0; r < k; r++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++) {
        if (chosen[e]) continue;
        if (best < 0 || ranks_above(ld[t * l->stride[0] + e * l->stride[1]], e,
                                    ld[t * l->stride[0] + best * l->stride[1]], best))
          best = e;
      }
      chosen[best] = 1;
      o[best] += 1.0f;  // counts stay exact in f32 up to 2^24 rows
    }
  }
  for (int64_t e = 0; e < E; e++) o[E + e] = (float)acc[e];
  free(p);
  return TPR_OK;
}

// dlogits (T, E) = softmax's Jacobian applied to the probability-sum
// cotangent g = dstats[1, :]: p_e * (g_e - sum_f p_f g_f). dstats[0, :] (the
// counts) is ignored: the top-k mask is piecewise constant, its gradient 0.
TPR_CPU_KERNEL(moe_aux_stats_bwd) {
  const tpr_tensor *l = in[0], *ds = in[1];
  int64_t T = l->shape[0], E = l->shape[1];
  double *p = malloc((size_t)E * 2 * sizeof *p);
  if (!p) return TPR_FAIL(TPR_ERR_OOM, "moe_aux_stats_bwd (cpu): %lld experts of scratch", (long long)E);
  double *gv = p + E;
  const float *dd = tpr_tensor_data(ds);
  for (int64_t e = 0; e < E; e++) gv[e] = dd[ds->stride[0] + e * ds->stride[1]];
  float *o = tpr_tensor_data(out);
  for (int64_t t = 0; t < T; t++) {
    softmax_row(l, t, p);
    double dot = 0;
    for (int64_t e = 0; e < E; e++) dot += p[e] * gv[e];
    for (int64_t e = 0; e < E; e++) o[t * E + e] = (float)(p[e] * (gv[e] - dot));
  }
  free(p);
  return TPR_OK;
}

static double stat_at(const tpr_tensor *s, int64_t r, int64_t e) {
  return ((const float *)tpr_tensor_data(s))[r * s->stride[0] + e * s->stride[1]];
}

// out (1) = E * sum_e counts_e * probsum_e / N^2.
TPR_CPU_KERNEL(moe_aux_loss) {
  const tpr_tensor *s = in[0];
  int64_t E = s->shape[1];
  double N = (double)attrs->i[0], acc = 0;
  for (int64_t e = 0; e < E; e++) acc += stat_at(s, 0, e) * stat_at(s, 1, e);
  ((float *)tpr_tensor_data(out))[0] = (float)((double)E * acc / (N * N));
  return TPR_OK;
}

// out (2, E): the loss's full derivative, dloss * E / N^2 * [probsum; counts].
// The counts row is honest here; moe_aux_stats' rule is what drops it.
TPR_CPU_KERNEL(moe_aux_loss_bwd) {
  const tpr_tensor *s = in[0];
  int64_t E = s->shape[1];
  double N = (double)attrs->i[0];
  double c = ((const float *)tpr_tensor_data(in[1]))[0] * (double)E / (N * N);
  float *o = tpr_tensor_data(out);
  for (int64_t e = 0; e < E; e++) {
    o[e] = (float)(c * stat_at(s, 1, e));
    o[E + e] = (float)(c * stat_at(s, 0, e));
  }
  return TPR_OK;
}

const tpr__kernel_def tpr__moe_aux_cpu[] = {
    {TPR_OP_MOE_AUX_STATS, cpu_moe_aux_stats},
    {TPR_OP_MOE_AUX_STATS_BWD, cpu_moe_aux_stats_bwd},
    {TPR_OP_MOE_AUX_LOSS, cpu_moe_aux_loss},
    {TPR_OP_MOE_AUX_LOSS_BWD, cpu_moe_aux_loss_bwd},
    {0},
};
