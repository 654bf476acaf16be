// The routing statistics of the steps a session ran (opts.moe_stats): each
// replica's counts per layer and expert, summed over the replicas on demand.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/session_impl.h"

// Reads every layer's gates of the step (and the router's own, in capacity
// mode) back from the program.
tpr_status tpr__session_count_routing(tpr_session *s, step_program *m, int64_t n) {
  const int64_t T = m->T;
  const int64_t E = s->cfg.num_experts;
  float *g = realloc(s->gates_host, (size_t)(2 * T * E) * sizeof *g);
  if (!g) return TPR_FAIL(TPR_ERR_OOM, "moe stats staging");
  s->gates_host = g;
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    char name[64];
    const tpr_tensor *used, *router;
    snprintf(name, sizeof name, "moe_gates.%lld", (long long)L);
    TPR_CHECK(tpr_exec_output(m->exec, name, &used));
    TPR_CHECK(tpr_tensor_to_host(used, g, (size_t)(T * E) * sizeof *g));
    bool capacity = s->o.moe.capacity_factor > 0;  // only then does the router's own output exist
    if (capacity) {
      snprintf(name, sizeof name, "moe_router.%lld", (long long)L);
      TPR_CHECK(tpr_exec_output(m->exec, name, &router));
      TPR_CHECK(tpr_tensor_to_host(router, g + T * E, (size_t)(T * E) * sizeof *g));
    }
    tpr_moe_stats_add(&s->moe_stats, L, capacity ? g + T * E : NULL, g, n);
  }
  return TPR_OK;
}

tpr_status tpr_session_moe_stats(tpr_session *s, tpr_moe_stats *out) {
  memset(out, 0, sizeof *out);
  if (!s->o.moe_stats) return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe stats: the session was opened without moe_stats");
  const tpr_moe_stats *a = &s->moe_stats;
  TPR_CHECK(tpr_moe_stats_init(out, a->layers, a->experts, a->ep));
  // Each replica counted once: its tp rank 0 contributes, the others add zeros.
  bool mine = s->mesh.tp_rank == 0;
  int64_t nE = a->layers * a->experts, nL = 3 * a->layers, tokens = mine ? a->tokens : 0;
  for (int64_t i = 0; i < nE; i++) out->expert_tokens[i] = mine ? a->expert_tokens[i] : 0;
  for (int64_t i = 0; i < nL; i++) out->routed[i] = mine ? a->routed[i] : 0;
  tpr_status rc = tpr_comm_all_reduce(s->world, out->expert_tokens, out->expert_tokens, (size_t)nE, TPR_I64, TPR_SUM);
  if (rc == TPR_OK) rc = tpr_comm_all_reduce(s->world, out->routed, out->routed, (size_t)nL, TPR_I64, TPR_SUM);
  if (rc == TPR_OK) rc = tpr_comm_all_reduce(s->world, &tokens, &out->tokens, 1, TPR_I64, TPR_SUM);
  if (rc != TPR_OK) tpr_moe_stats_free(out);
  return rc;
}
