// Each layer's local experts stacked into one tensor per projection, as
// the MoE op reads them: w13 (E_r, 2F_r, H) = [gate; up] and w2
// (E_r, H, F_r), and for FP8 experts their scales stacked the same way.
#include <stdlib.h>
#include <string.h>

#include "engine/session_impl.h"

// The weights' indices of layer L's local expert e in the kinds k (gate, up,
// down).
static tpr_status expert_items(tpr_session *s, int64_t L, int64_t e, const int *k, int64_t *idx) {
  const tpr_load_item *base = tpr_loader_item(s->loader, 0);
  for (int j = 0; j < 3; j++) {
    const tpr_load_item *it;
    TPR_CHECK(tpr_loader_find(s->loader, k[j], L, e, &it));
    idx[j] = it - base;
  }
  return TPR_OK;
}

// FP8 experts: their scales stacked like the weights, s13 (E_r, 2F_r,
// ceil(H / block)) = [s1; s3], s2 (E_r, H, ceil(F_r / block)).
static tpr_status stack_expert_scales(tpr_session *s, int64_t L, int k1, int k3, int k2) {
  const int64_t Er = s->plan.experts_per_rank, Fr = s->plan.expert_inter_per_rank, H = s->cfg.hidden_size;
  const int block = s->kind_block[k1];
  const int64_t n13 = (H + block - 1) / block, n2 = (Fr + block - 1) / block;
  const size_t b1 = (size_t)(Fr * n13) * sizeof(float), b2 = (size_t)(H * n2) * sizeof(float);
  tpr_tensor **sc = s->experts + 2 * s->cfg.num_layers + 2 * L;
  TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){Er, 2 * Fr, n13}, &sc[0]));
  TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){Er, H, n2}, &sc[1]));
  char *h13 = malloc((size_t)Er * 2 * b1 + 1), *h2 = malloc((size_t)Er * b2 + 1);
  tpr_status rc = h13 && h2 ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "session: expert scale staging");
  int64_t idx[3];
  for (int64_t e = 0; rc == TPR_OK && e < Er; e++) {
    if ((rc = expert_items(s, L, e, (const int[]){k1, k3, k2}, idx)) != TPR_OK) break;
    memcpy(h13 + (size_t)e * 2 * b1, s->weights.scales[idx[0]], b1);
    memcpy(h13 + (size_t)e * 2 * b1 + b1, s->weights.scales[idx[1]], b1);
    memcpy(h2 + (size_t)e * b2, s->weights.scales[idx[2]], b2);
  }
  if (rc == TPR_OK) rc = tpr_tensor_from_host(sc[0], h13, (size_t)Er * 2 * b1);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(sc[1], h2, (size_t)Er * b2);
  free(h13), free(h2);
  return rc;
}

// Stacks a layer's local experts: w13 (E_r, 2F_r, H) = [w1; w3], w2 (E_r, H, F_r),
// built in host memory and copied to the backend.
tpr_status tpr__session_stack_experts(tpr_session *s, int64_t L) {
  const tpr_shard_plan *p = &s->plan;
  int64_t Er = p->experts_per_rank, Fr = p->expert_inter_per_rank, H = s->cfg.hidden_size;
  int k1 = -1, k3 = -1, k2 = -1;
  for (int i = 0; i < p->n_tensors; i++) {
    const char *n = p->tensors[i].name;
    if (strstr(n, s->family->expert_gate)) k1 = i;
    if (strstr(n, s->family->expert_up)) k3 = i;
    if (strstr(n, s->family->expert_down)) k2 = i;
  }
  if (k1 < 0 || k3 < 0 || k2 < 0) return TPR_FAIL(TPR_ERR_INTERNAL, "%s: plan without expert weights", s->family->name);
  tpr_dtype dt = s->kind_dtype[k1];  // weight_dtype.c: one dtype for the three kinds
  size_t blk = (size_t)(Fr * H) * tpr_dtype_size(dt);
  char *h13 = malloc((size_t)Er * 2 * blk + 1), *h2 = malloc((size_t)Er * blk + 1);
  tpr_status rc = h13 && h2 ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "session: expert staging");
  int64_t idx[3];
  for (int64_t e = 0; rc == TPR_OK && e < Er; e++) {
    if ((rc = expert_items(s, L, e, (const int[]){k1, k3, k2}, idx)) != TPR_OK) break;
    memcpy(h13 + (size_t)e * 2 * blk, tpr_rank_weights_data(&s->weights, idx[0]), blk);
    memcpy(h13 + (size_t)e * 2 * blk + blk, tpr_rank_weights_data(&s->weights, idx[1]), blk);
    memcpy(h2 + (size_t)e * blk, tpr_rank_weights_data(&s->weights, idx[2]), blk);
  }
  tpr_tensor **w13 = &s->experts[2 * L], **w2 = &s->experts[2 * L + 1];
  if (rc == TPR_OK) rc = tpr_tensor_new(s->be, dt, 3, (const int64_t[]){Er, 2 * Fr, H}, w13);
  if (rc == TPR_OK) rc = tpr_tensor_new(s->be, dt, 3, (const int64_t[]){Er, H, Fr}, w2);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(*w13, h13, (size_t)Er * 2 * blk);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(*w2, h2, (size_t)Er * blk);
  free(h13), free(h2);
  if (rc == TPR_OK && s->kind_block[k1] > 0) rc = stack_expert_scales(s, L, k1, k3, k2);
  return rc;
}
