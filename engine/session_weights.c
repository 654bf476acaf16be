// The weights as this rank holds them: each plan kind's dtype (f32, bf16 or
// FP8 with its scale block, agreed over the ranks), the loaded slices
// wrapped as tensors, the experts stacked (session_experts.c).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/session_impl.h"
#include "engine/weight_dtype.h"

double tpr_session_weight_element_bytes(const tpr_session *s, const char *kind) {
  for (int k = 0; s->kind_dtype && k < s->plan.n_tensors; k++)
    if (strstr(s->plan.tensors[k].name, kind))
      return (double)tpr_dtype_size(s->kind_dtype[k]) + (s->kind_block[k] > 0 ? 4.0 / s->kind_block[k] : 0.0);
  return 4.0;
}

// A weight slice as a tensor on the backend: the loaded host bytes wrapped
// in place on the CPU, copied to a device otherwise.
static tpr_status weight_tensor(tpr_session *s, const tpr_shard_tensor *t, tpr_dtype dt, const void *host,
                                tpr_tensor **out) {
  if (s->be->vt->host_addressable) return tpr_tensor_wrap(s->be, dt, t->ndim, t->rank_shape, (void *)host, out);
  TPR_CHECK(tpr_tensor_new(s->be, dt, t->ndim, t->rank_shape, out));
  return tpr_tensor_from_host(*out, host, tpr_tensor_nbytes(*out));
}

// The FP8 scale block each plan kind can be held at, agreed over the ranks
// (the smallest; collective: every rank reaches it once the open agreed).
static tpr_status agree_fp8_blocks(tpr_session *s) {
  int n = s->plan.n_tensors;
  int64_t *b = calloc((size_t)(n + 1), sizeof *b);  // zeroed: n may be 0
  if (!b) return TPR_FAIL(TPR_ERR_OOM, "session: FP8 blocks");
  for (int k = 0; k < n; k++) b[k] = tpr_loader_fp8_block(s->loader, k);
  tpr_status rc = tpr_comm_all_reduce(s->world, b, b, (size_t)n, TPR_I64, TPR_MIN);
  for (int k = 0; rc == TPR_OK && k < n; k++) s->kind_block[k] = (int)b[k];
  free(b);
  return rc;
}

// The scales of FP8 weights, as tensors: item i's (R, ceil(C / block)).
static tpr_status scale_tensor(tpr_session *s, const tpr_shard_tensor *t, int64_t i, tpr_tensor **out) {
  int block = s->weights.block[i];
  const int64_t shape[2] = {t->rank_shape[0], (t->rank_shape[1] + block - 1) / block};
  if (s->be->vt->host_addressable) return tpr_tensor_wrap(s->be, TPR_F32, 2, shape, s->weights.scales[i], out);
  TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 2, shape, out));
  return tpr_tensor_from_host(*out, s->weights.scales[i], tpr_tensor_nbytes(*out));
}

// The dtype each plan kind is held in (no collective).
static tpr_status weight_dtypes(tpr_session *s) {
  const char *const expert_kinds[3] = {s->family->expert_gate, s->family->expert_up, s->family->expert_down};
  return tpr_weight_dtypes(s->loader, &s->plan, s->o.training ? TPR_F32 : s->o.weight_dtype,
                           s->be->vt->host_addressable, expert_kinds, s->kind_dtype, s->kind_block);
}

static tpr_status check_weights_memory(tpr_session *s) {
  char what[96];
  snprintf(what, sizeof what, "rank %d: loading its weights%s", s->mesh.world_rank,
           s->mesh.world_size > 1 ? " (the largest share of any rank)" : "");
  return tpr__session_check_node_memory(s, tpr_loader_arena_bytes(s->loader, TPR_F32, s->kind_dtype), what);
}

static tpr_status load_weights(tpr_session *s) {
  TPR_CHECK(tpr_loader_load_all_as(s->loader, TPR_F32, s->kind_dtype, s->kind_block, &s->weights));
  s->stats.weight_bytes = s->weights.bytes_held;
  s->stats.matrix_dtype = TPR_F32;
  for (int k = 0; k < s->plan.n_tensors; k++)
    if (s->kind_dtype[k] == TPR_F8E4M3 || (s->kind_dtype[k] == TPR_BF16 && s->stats.matrix_dtype == TPR_F32))
      s->stats.matrix_dtype = s->kind_dtype[k];
  s->stats.bytes_read = s->weights.bytes_read;
  int64_t n = s->weights.n, layers = s->cfg.num_layers;
  s->item_tensors = calloc((size_t)n, sizeof *s->item_tensors);
  s->item_scales = calloc((size_t)n, sizeof *s->item_scales);
  s->experts = calloc((size_t)(4 * layers), sizeof *s->experts);  // w13, w2, then their FP8 scales
  if (!s->item_tensors || !s->item_scales || !s->experts)
    return TPR_FAIL(TPR_ERR_OOM, "session: weight handles");
  for (int64_t i = 0; i < n; i++) {
    const tpr_load_item *it = &s->weights.items[i];
    if (it->local_expert >= 0) continue;  // stacked per layer below
    const tpr_shard_tensor *t = &s->plan.tensors[it->kind];
    TPR_CHECK(weight_tensor(s, t, s->weights.dtype[i], tpr_rank_weights_data(&s->weights, i), &s->item_tensors[i]));
    if (s->weights.scales[i]) TPR_CHECK(scale_tensor(s, t, i, &s->item_scales[i]));
  }
  for (int64_t L = 0; L < layers; L++)  // dense-MLP layers (qwen3_moe) hold no experts
    if (tpr_model_config_layer_is_moe(&s->cfg, L)) TPR_CHECK(tpr__session_stack_experts(s, L));
  return TPR_OK;
}

tpr_status tpr__session_load_weights(tpr_session *s) {
  tpr_status rc = tpr_comm_agree(s->world, agree_fp8_blocks(s));  // collective inside
  if (rc == TPR_OK) rc = tpr_comm_agree(s->world, weight_dtypes(s));
  if (rc == TPR_OK) rc = tpr_comm_agree(s->world, check_weights_memory(s));  // collective inside
  if (rc == TPR_OK) rc = tpr_comm_agree(s->world, load_weights(s));
  return rc;
}

const tpr_rank_weights *tpr__session_weights(const tpr_session *s) { return &s->weights; }
tpr_tensor *tpr__session_item_tensor(const tpr_session *s, int64_t i) { return s->item_tensors[i]; }
tpr_tensor *tpr__session_expert(const tpr_session *s, int64_t L, int which) { return s->experts[2 * L + which]; }

void tpr__session_release_weights(tpr_session *s) {
  for (int64_t i = 0; i < s->weights.n; i++) tpr_tensor_free(s->item_tensors[i]), s->item_tensors[i] = NULL;
  for (int64_t i = 0; i < 2 * s->cfg.num_layers; i++) tpr_tensor_free(s->experts[i]), s->experts[i] = NULL;
  free(s->weights.arena);
  s->weights.arena = NULL;
}
