// What a rank holds: the concrete tensors (layer, expert) behind every kind
// of the sharding plan, and their names in the checkpoint and in a
// converted rank file.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shard/loader_impl.h"

void tpr_loader_rank_file(int rank, int world, char *buf, size_t n) {
  snprintf(buf, n, "rank-%05d-of-%05d.safetensors", rank, world);
}

void tpr__drop_pages(const void *data, size_t nbytes) {
  if (!data || !nbytes) return;
  // The mapping starts page-aligned and spans whole pages, so widening the
  // range to page bounds stays inside it. A neighbouring tensor's page may be
  // dropped too: it is read-only and refaults from the page cache.
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)data & ~(page - 1), e = ((uintptr_t)data + nbytes + page - 1) & ~(page - 1);
  (void)madvise((void *)a, e - a, MADV_DONTNEED);  // advice only: failing changes no value read
}

tpr_status tpr__moe_layers(const char *json, size_t len, const char *origin, const tpr_model_config *c, bool **moe) {
  int64_t L = c->num_layers, count = 0;
  bool *m = malloc((size_t)(L ? L : 1) * sizeof *m);
  if (!m) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  for (int64_t l = 0; l < L; l++) m[l] = c->num_moe_layers == L;
  tpr_status rc = TPR_OK;
  if (c->num_moe_layers > 0 && c->num_moe_layers < L) {
    // qwen3_moe: layer l is dense when listed in mlp_only_layers or when
    // (l+1) is not a multiple of decoder_sparse_step (model_config.c).
    cJSON *root = json ? cJSON_ParseWithLength(json, len) : NULL;
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(root, "decoder_sparse_step");
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    int64_t s = cJSON_IsNumber(step) ? (int64_t)step->valuedouble : 1;
    for (int64_t l = 0; s >= 1 && l < L; l++) {
      bool dense = (l + 1) % s != 0;
      const cJSON *v;
      cJSON_ArrayForEach(v, only) dense |= cJSON_IsNumber(v) && (int64_t)v->valuedouble == l;
      m[l] = !dense;
    }
    cJSON_Delete(root);
  }
  for (int64_t l = 0; l < L; l++) count += m[l];
  if (count != c->num_moe_layers)
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: %lld of %lld layers are MoE layers by mlp_only_layers/decoder_sparse_step, "
                  "but the model config counts %lld", origin, (long long)count, (long long)L,
                  (long long)c->num_moe_layers);
  if (rc != TPR_OK) {
    free(m);
    return rc;
  }
  *moe = m;
  return TPR_OK;
}

typedef enum layer_set { LAYERS_NONE, LAYERS_ALL, LAYERS_MOE, LAYERS_DENSE, LAYERS_SOFTMAX, LAYERS_LINEAR } layer_set;

// Which layers a kind has: per-expert kinds, shared experts (flagged
// moe_layers) and the MoE router live in MoE layers (the router is the one
// replicated per-layer kind whose count is not num_layers), dense column/row
// MLPs in the others, the rest in every layer.
static layer_set kind_layers(const tpr_shard_plan *p, const tpr_shard_tensor *t) {
  if (!strstr(t->name, "{L}")) return LAYERS_NONE;
  // Hybrid attention (minimax): the layer_types of the config.
  if (t->attn_layers == TPR_ATTN_LAYERS_SOFTMAX) return LAYERS_SOFTMAX;
  if (t->attn_layers == TPR_ATTN_LAYERS_LINEAR) return LAYERS_LINEAR;
  if (strstr(t->name, "{E}") || t->moe_layers) return LAYERS_MOE;
  if (t->transform == TPR_XFORM_COLUMN || t->transform == TPR_XFORM_ROW) return LAYERS_DENSE;
  return t->count == p->config.num_layers ? LAYERS_ALL : LAYERS_MOE;
}

tpr_status tpr_loader_tensor_name(const char *pattern, int64_t layer, int64_t expert, char *buf) {
  size_t k = 0;
  for (const char *s = pattern; *s;) {
    char num[24] = "";
    if (!strncmp(s, "{L}", 3) || !strncmp(s, "{E}", 3)) {
      snprintf(num, sizeof num, "%lld", (long long)(s[1] == 'L' ? layer : expert));
      s += 3;
    } else {
      num[0] = *s++, num[1] = 0;
    }
    size_t m = strlen(num);
    if (k + m >= TPR_LOAD_NAME_MAX) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tensor name '%s' is too long", pattern);
    memcpy(buf + k, num, m + 1);
    k += m;
  }
  return TPR_OK;
}

tpr_status tpr__load_items(const tpr_shard_plan *p, const tpr_mesh *m, const bool *moe, tpr_load_item **items,
                           int64_t *n, int64_t **kind_start) {
  int64_t total = 0;
  for (int k = 0; k < p->n_tensors; k++) total += p->tensors[k].count;
  tpr_load_item *it = calloc((size_t)(total ? total : 1), sizeof *it);
  int64_t *ks = malloc((size_t)(p->n_tensors + 1) * sizeof *ks);
  tpr_status rc = TPR_OK;
  if (!it || !ks) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory listing %lld tensors", (long long)total);
    goto fail;
  }
  int64_t j = 0, L = p->config.num_layers;
  for (int k = 0; k < p->n_tensors; k++) {
    const tpr_shard_tensor *t = &p->tensors[k];
    layer_set ls = kind_layers(p, t);
    bool experts = strstr(t->name, "{E}") != NULL;
    int64_t numel = t->rank_shape[0] * (t->ndim == 2 ? t->rank_shape[1] : 1), nl = ls == LAYERS_NONE ? 1 : L;
    ks[k] = j;
    int64_t listed = 0;
    for (int64_t l = 0; l < nl; l++) {
      if ((ls == LAYERS_MOE && !moe[l]) || (ls == LAYERS_DENSE && moe[l])) continue;
      bool linear = tpr_model_config_layer_is_linear(&p->config, l);
      if ((ls == LAYERS_SOFTMAX && linear) || (ls == LAYERS_LINEAR && !linear)) continue;
      for (int64_t e = 0; e < (experts ? p->experts_per_rank : 1); e++) {
        if (listed++ >= t->count) continue;  // more than the plan counts: reported below
        tpr_load_item *x = &it[j++];
        x->kind = k;
        x->layer = ls == LAYERS_NONE ? -1 : l;
        x->local_expert = experts ? e : -1;
        x->expert = experts ? m->ep_rank * p->experts_per_rank + e : -1;
        x->numel = numel;
        TPR_CHECK_GOTO(tpr_loader_tensor_name(t->name, x->layer, x->expert, x->name), rc, fail);
        TPR_CHECK_GOTO(tpr_loader_tensor_name(t->name, x->layer, x->local_expert, x->rank_name), rc, fail);
      }
    }
    if (listed != t->count) {
      rc = TPR_FAIL(TPR_ERR_INTERNAL, "plan kind %s counts %lld tensors per rank, the layer list gives %lld",
                    t->name, (long long)t->count, (long long)listed);
      goto fail;
    }
  }
  ks[p->n_tensors] = j;
  *items = it, *n = j, *kind_start = ks;
  return TPR_OK;
fail:
  free(it);
  free(ks);
  return rc;
}
