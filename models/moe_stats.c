#include "moe_stats.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

tpr_status tpr_moe_stats_init(tpr_moe_stats *s, int64_t layers, int64_t experts, int ep) {
  memset(s, 0, sizeof *s);
  if (layers < 1 || experts < 1 || ep < 1 || experts % ep)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe stats: %lld layers, %lld experts over %d ranks", (long long)layers,
                    (long long)experts, ep);
  s->layers = layers, s->experts = experts, s->ep = ep;
  s->expert_tokens = calloc((size_t)(layers * experts), sizeof *s->expert_tokens);
  s->routed = calloc((size_t)(3 * layers), sizeof *s->routed);
  if (!s->expert_tokens || !s->routed) {
    tpr_moe_stats_free(s);
    return TPR_FAIL(TPR_ERR_OOM, "moe stats");
  }
  s->dropped = s->routed + layers;
  s->rerouted = s->dropped + layers;
  return TPR_OK;
}

void tpr_moe_stats_free(tpr_moe_stats *s) {
  free(s->expert_tokens), free(s->routed);
  memset(s, 0, sizeof *s);
}

void tpr_moe_stats_add(tpr_moe_stats *s, int64_t L, const float *router, const float *used, int64_t T) {
  if (L < 0 || L >= s->layers) return;
  const int64_t E = s->experts;
  int64_t *per_expert = s->expert_tokens + L * E;
  if (L == 0) s->tokens += T;
  for (int64_t i = 0; i < T * E; i++) {
    bool r = (router ? router[i] : used[i]) != 0.0f, u = used[i] != 0.0f;
    per_expert[i % E] += u;
    s->routed[L] += r;
    s->dropped[L] += r && !u;
    s->rerouted[L] += u && !r;
  }
}

int64_t tpr_moe_stats_rank_tokens(const tpr_moe_stats *s, int64_t L, int rank) {
  const int64_t per = s->experts / s->ep, *e = s->expert_tokens + L * s->experts + rank * per;
  int64_t n = 0;
  for (int64_t i = 0; i < per; i++) n += e[i];
  return n;
}

static double imbalance(const int64_t *v, int64_t n, int64_t stride) {
  int64_t sum = 0, max = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t x = 0;
    for (int64_t j = 0; j < stride; j++) x += v[i * stride + j];
    sum += x;
    if (x > max) max = x;
  }
  return sum ? (double)max * (double)n / (double)sum : 0.0;
}

double tpr_moe_stats_expert_imbalance(const tpr_moe_stats *s, int64_t L) {
  return imbalance(s->expert_tokens + L * s->experts, s->experts, 1);
}

double tpr_moe_stats_rank_imbalance(const tpr_moe_stats *s, int64_t L) {
  return imbalance(s->expert_tokens + L * s->experts, s->ep, s->experts / s->ep);
}

void tpr_moe_stats_print(const tpr_moe_stats *s, FILE *f) {
  fprintf(f, "moe routing: %lld tokens per layer, %lld experts over %d expert-parallel ranks\n", (long long)s->tokens,
          (long long)s->experts, s->ep);
  fprintf(f, "  %5s %9s %8s %9s %10s %9s  %s\n", "layer", "routed", "dropped", "rerouted", "expert max", "rank max",
          "tokens per rank");
  for (int64_t L = 0; L < s->layers; L++) {
    fprintf(f, "  %5lld %9lld %8lld %9lld %9.2fx %8.2fx ", (long long)L, (long long)s->routed[L],
            (long long)s->dropped[L], (long long)s->rerouted[L], tpr_moe_stats_expert_imbalance(s, L),
            tpr_moe_stats_rank_imbalance(s, L));
    for (int r = 0; r < s->ep; r++) fprintf(f, " %lld", (long long)tpr_moe_stats_rank_tokens(s, L, r));
    fprintf(f, "\n");
  }
  fprintf(f, "  (imbalance = busiest / mean; dropped assignments that found a spare expert count as re-routed)\n");
}

void tpr_moe_stats_json(const tpr_moe_stats *s, FILE *f) {
  fprintf(f, "{\"tokens\":%lld,\"experts\":%lld,\"ep\":%d,\"layers\":[", (long long)s->tokens, (long long)s->experts,
          s->ep);
  for (int64_t L = 0; L < s->layers; L++) {
    fprintf(f, "%s{\"layer\":%lld,\"tokens_per_expert\":[", L ? "," : "", (long long)L);
    for (int64_t e = 0; e < s->experts; e++)
      fprintf(f, "%s%lld", e ? "," : "", (long long)s->expert_tokens[L * s->experts + e]);
    fprintf(f, "],\"tokens_per_rank\":[");
    for (int r = 0; r < s->ep; r++) fprintf(f, "%s%lld", r ? "," : "", (long long)tpr_moe_stats_rank_tokens(s, L, r));
    fprintf(f, "],\"expert_imbalance\":%.6g,\"rank_imbalance\":%.6g,\"routed\":%lld,\"dropped\":%lld,\"rerouted\":%lld}",
            tpr_moe_stats_expert_imbalance(s, L), tpr_moe_stats_rank_imbalance(s, L), (long long)s->routed[L],
            (long long)s->dropped[L], (long long)s->rerouted[L]);
  }
  fprintf(f, "]}");
}
