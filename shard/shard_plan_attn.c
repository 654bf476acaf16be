// Attention head layout under tensor parallelism (docs/architecture.md section 5).
#include <stdlib.h>
#include <string.h>

#include "shard_plan.h"

// Far beyond any model; keeps nq' * D and the map allocations small numbers.
#define HEADS_CAP ((int64_t)1 << 20)

const char *tpr_kv_strategy_name(tpr_kv_strategy s) {
  switch (s) {
    case TPR_KV_SHARD: return "shard";
    case TPR_KV_REPLICATE: return "replicate_kv";
    case TPR_KV_CONVERT_TO_MHA: return "convert_to_mha";
  }
  return "?";
}

void tpr_attn_plan_free(tpr_attn_plan *a) {
  if (!a) return;
  free(a->q_head_map);
  free(a->kv_head_map);
  memset(a, 0, sizeof *a);
}

int64_t tpr_attn_plan_local_kv(const tpr_attn_plan *a, int rank, int64_t local_q) {
  (void)rank;  // by construction the same for every rank: checked in check_plan()
  return local_q / (a->q_per_rank / a->kv_per_rank);
}

// The planner's own proof obligation: every rank's every real Q head reaches,
// through the rank-independent local mapping, a KV head that is a copy of
// the KV head the unsharded model gives it (original head h -> h / (nq/nkv)).
static tpr_status check_plan(const tpr_attn_plan *a) {
  int64_t group = a->nq / a->nkv, next_q = 0, real_kv = 0;
  if (a->nq_padded % a->tp || a->nkv_eff % a->tp || a->q_per_rank % a->kv_per_rank)
    return TPR_FAIL(TPR_ERR_INTERNAL, "attention plan nq=%lld nkv=%lld tp=%d: %lld Q / %lld KV heads do not split evenly",
                    (long long)a->nq, (long long)a->nkv, a->tp, (long long)a->nq_padded, (long long)a->nkv_eff);
  // Real Q heads appear once each, in order, so o_proj columns follow the same map.
  for (int64_t j = 0; j < a->nq_padded; j++) {
    int32_t h = a->q_head_map[j];
    if (h >= 0 && h != next_q++)
      return TPR_FAIL(TPR_ERR_INTERNAL, "attention plan tp=%d: padded Q head %lld holds Q%d, expected Q%lld", a->tp,
                      (long long)j, h, (long long)next_q - 1);
  }
  if (next_q != a->nq)
    return TPR_FAIL(TPR_ERR_INTERNAL, "attention plan tp=%d: %lld of %lld Q heads placed", a->tp, (long long)next_q,
                    (long long)a->nq);
  for (int64_t j = 0; j < a->nkv_eff; j++) {
    if (a->kv_head_map[j] < -1 || a->kv_head_map[j] >= a->nkv)
      return TPR_FAIL(TPR_ERR_INTERNAL, "attention plan tp=%d: effective KV head %lld maps to %d", a->tp, (long long)j,
                      a->kv_head_map[j]);
    real_kv += a->kv_head_map[j] >= 0;
  }
  if (real_kv * a->head_dim != a->k_norm_divisor)
    return TPR_FAIL(TPR_ERR_INTERNAL, "attention plan tp=%d: k-norm divisor %lld but %lld real KV heads", a->tp,
                    (long long)a->k_norm_divisor, (long long)real_kv);
  for (int r = 0; r < a->tp; r++) {
    for (int64_t i = 0; i < a->q_per_rank; i++) {
      int32_t q = a->q_head_map[r * a->q_per_rank + i];
      if (q < 0) continue;  // a zero head; o_proj's zero columns cancel whatever it reads
      int64_t lk = tpr_attn_plan_local_kv(a, r, i);
      int32_t kv = lk >= 0 && lk < a->kv_per_rank ? a->kv_head_map[r * a->kv_per_rank + lk] : -2;
      if (kv != q / group)
        return TPR_FAIL(TPR_ERR_INTERNAL,
                        "attention plan nq=%lld nkv=%lld tp=%d (%s): rank %d local Q head %lld (Q%d) reads local KV "
                        "head %lld = KV%d, but the model gives it KV%lld",
                        (long long)a->nq, (long long)a->nkv, a->tp, tpr_kv_strategy_name(a->strategy), r,
                        (long long)i, q, (long long)lk, kv, (long long)(q / group));
    }
  }
  return TPR_OK;
}

tpr_status tpr_attn_plan_build(int64_t nq, int64_t nkv, int64_t head_dim, int tp, tpr_attn_plan *out) {
  memset(out, 0, sizeof *out);
  if (tp < 1 || tp > HEADS_CAP)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention plan: tp=%d must be in [1, %lld]", tp, (long long)HEADS_CAP);
  if (nq < 1 || nkv < 1 || head_dim < 1 || nq > HEADS_CAP || head_dim > HEADS_CAP)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention plan: nq=%lld nkv=%lld head_dim=%lld must be positive (at most %lld)",
                    (long long)nq, (long long)nkv, (long long)head_dim, (long long)HEADS_CAP);
  if (nq % nkv)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention plan: nkv=%lld does not divide nq=%lld", (long long)nkv,
                    (long long)nq);
  tpr_attn_plan a = {.tp = tp, .nq = nq, .nkv = nkv, .head_dim = head_dim};
  int64_t group = nq / nkv;  // Q heads per KV head in the model
  a.nq_padded = (nq + tp - 1) / tp * tp;
  if (nkv % tp == 0) {
    // nq = group*nkv is then a multiple of tp too: sharding never pads Q.
    a.strategy = TPR_KV_SHARD;
    a.nkv_eff = nkv;
  } else if (tp % nkv == 0) {
    a.strategy = TPR_KV_REPLICATE;
    a.nkv_eff = tp;
  } else {
    a.strategy = TPR_KV_CONVERT_TO_MHA;
    a.nkv_eff = a.nq_padded;
  }
  a.q_per_rank = a.nq_padded / tp;
  a.kv_per_rank = a.nkv_eff / tp;
  a.q_head_map = malloc((size_t)a.nq_padded * sizeof *a.q_head_map);
  a.kv_head_map = malloc((size_t)a.nkv_eff * sizeof *a.kv_head_map);
  if (!a.q_head_map || !a.kv_head_map) {
    tpr_attn_plan_free(&a);
    return TPR_FAIL(TPR_ERR_OOM, "attention plan: head maps");
  }
  int64_t real_kv = 0;  // non-padding effective KV heads: the k-norm divisor / D
  switch (a.strategy) {
    case TPR_KV_SHARD:
      for (int64_t j = 0; j < a.nq_padded; j++) a.q_head_map[j] = (int32_t)j;
      for (int64_t j = 0; j < a.nkv_eff; j++) a.kv_head_map[j] = (int32_t)j;
      real_kv = nkv;
      break;
    case TPR_KV_REPLICATE: {
      // KV: K0..K0 K1..K1 ... (tp/nkv copies each), one head per rank. Q: each
      // group of `group` real heads followed by its share of zero heads, so a
      // padded group of nq'/nkv heads lands on exactly the ranks holding its KV.
      int64_t copies = tp / nkv, padded_group = a.nq_padded / nkv;
      for (int64_t j = 0; j < a.nkv_eff; j++) a.kv_head_map[j] = (int32_t)(j / copies);
      for (int64_t j = 0; j < a.nq_padded; j++) {
        int64_t g = j / padded_group, pos = j % padded_group;
        a.q_head_map[j] = pos < group ? (int32_t)(g * group + pos) : -1;
      }
      real_kv = tp;
      break;
    }
    case TPR_KV_CONVERT_TO_MHA:
      // KV head h repeated `group` times gives one KV head per Q head; both
      // then pad at the tail, and local Q head i reads local KV head i.
      for (int64_t j = 0; j < a.nq_padded; j++) {
        a.q_head_map[j] = j < nq ? (int32_t)j : -1;
        a.kv_head_map[j] = j < nq ? (int32_t)(j / group) : -1;
      }
      real_kv = nq;
      break;
  }
  a.q_norm_divisor = nq * head_dim;
  a.k_norm_divisor = real_kv * head_dim;
  tpr_status rc = check_plan(&a);
  if (rc != TPR_OK) {
    tpr_attn_plan_free(&a);
    return rc;
  }
  *out = a;
  return TPR_OK;
}
