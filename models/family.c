#include "models/family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/hunyuan_moe.h"
#include "models/minicpm_sala.h"
#include "models/minimax.h"
#include "models/minimax_m2.h"
#include "models/qwen2_vl.h"
#include "models/qwen3_moe.h"
#include "models/qwen3_vl_moe.h"

// Every family the engine can run; a new family adds its entry here.
static const tpr_family *const families[] = {
    &tpr_family_minimax_m2, &tpr_family_qwen3_moe, &tpr_family_hunyuan_v1_moe,
    &tpr_family_qwen3_vl_moe, &tpr_family_qwen2_vl, &tpr_family_minimax, &tpr_family_minicpm_sala,
};

void tpr_family_consts_free(tpr_family_consts *c) {
  for (int i = 0; c->t && i < c->n; i++) tpr_tensor_free(c->t[i]);
  free(c->t), free(c->names);
  *c = (tpr_family_consts){0};
}

tpr_status tpr_family_consts_add(tpr_family_consts *k, tpr_backend *be, const char *name, tpr_dtype dt, int ndim,
                                 const int64_t *shape, const void *data) {
  tpr_tensor *t = NULL;
  TPR_CHECK(tpr_tensor_new(be, dt, ndim, shape, &t));
  const size_t bytes = (size_t)tpr_tensor_numel(t) * tpr_dtype_size(dt);
  tpr_status rc = data ? tpr_tensor_from_host(t, data, bytes) : tpr_tensor_fill_zero(t);
  if (rc != TPR_OK) {
    tpr_tensor_free(t);
    return rc;
  }
  snprintf(k->names[k->n], sizeof k->names[k->n], "%s", name);
  k->t[k->n++] = t;
  return TPR_OK;
}

int tpr_family_lightning_state_shape(const tpr_shard_plan *plan, int64_t L, int64_t shape[TPR_MAX_DIMS]) {
  const tpr_model_config *cfg = &plan->config;
  if (!tpr_model_config_layer_is_linear(cfg, L)) return 0;
  shape[0] = cfg->num_heads / plan->tp, shape[1] = cfg->head_dim, shape[2] = cfg->head_dim;
  return 3;
}

tpr_status tpr_family_find(tpr_model_family family, const tpr_family **out) {
  *out = NULL;
  for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
    if (families[i]->family == family) {
      *out = families[i];
      return TPR_OK;
    }
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "the engine has no model family %s yet", tpr_model_family_name(family));
}

void tpr_family_param_name(const char *pattern, int64_t layer, char *buf, size_t cap) {
  const char *at = strstr(pattern, "{L}");
  if (!at) {
    snprintf(buf, cap, "%s", pattern);
    return;
  }
  snprintf(buf, cap, "%.*s%lld%s", (int)(at - pattern), pattern, (long long)layer, at + 3);
}

void tpr_family_expert_name(int64_t layer, const char *which, char *buf, size_t cap) {
  snprintf(buf, cap, "model.layers.%lld.experts.%s", (long long)layer, which);
}

void tpr_family_pool_name(int64_t layer, const char *which, char *buf, size_t cap) {
  snprintf(buf, cap, "model.layers.%lld.%s_pool", (long long)layer, which);
}

void tpr_family_state_name(int64_t layer, char *buf, size_t cap) {
  snprintf(buf, cap, "model.layers.%lld.state_pool", (long long)layer);
}
