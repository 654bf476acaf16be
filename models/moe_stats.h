// Routing statistics of MoE layers, from the gates each layer used: tokens
// per expert and per expert-parallel rank, imbalance (max / mean), and the
// assignments capacity mode dropped and re-routed. Counted on the host from
// dense gates (T, E), so both dispatchers report the same numbers.
#ifndef TPR_MOE_STATS_H
#define TPR_MOE_STATS_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/status.h"

typedef struct tpr_moe_stats {
  int64_t layers, experts;
  int ep;                  // expert-parallel ranks: expert e lives on rank e / (experts / ep)
  int64_t *expert_tokens;  // (layers, experts) assignments each expert ran
  int64_t *routed;         // (layers) assignments the router made
  int64_t *dropped;        // (layers) router assignments capacity mode removed
  int64_t *rerouted;       // (layers) assignments re-routing added (a dropped one moved elsewhere)
  int64_t tokens;          // tokens seen per layer
} tpr_moe_stats;

tpr_status tpr_moe_stats_init(tpr_moe_stats *s, int64_t layers, int64_t experts, int ep);
void tpr_moe_stats_free(tpr_moe_stats *s);

// Adds T tokens of layer L: used (T, E) the gates the experts ran, router
// (T, E) the router's own (NULL: the same as used, nothing dropped).
void tpr_moe_stats_add(tpr_moe_stats *s, int64_t layer, const float *router, const float *used, int64_t T);

// Of layer L: the busiest expert's tokens over the mean, and the same over
// expert-parallel ranks (1 = balanced; 0 when nothing was routed).
double tpr_moe_stats_expert_imbalance(const tpr_moe_stats *s, int64_t layer);
double tpr_moe_stats_rank_imbalance(const tpr_moe_stats *s, int64_t layer);
int64_t tpr_moe_stats_rank_tokens(const tpr_moe_stats *s, int64_t layer, int rank);

// A table, one row per layer, to f.
void tpr_moe_stats_print(const tpr_moe_stats *s, FILE *f);
// {"layers":[{"layer":0,"tokens_per_expert":[...],"tokens_per_rank":[...],
//  "expert_imbalance":x,"rank_imbalance":x,"routed":n,"dropped":n,
//  "rerouted":n}, ...]} to f (no newline).
void tpr_moe_stats_json(const tpr_moe_stats *s, FILE *f);

#endif
