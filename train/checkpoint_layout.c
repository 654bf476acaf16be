// A training save in the layout the family's transformers class loads.
// tpr's plan names are Qwen3-MoE's for the Qwen3-VL-MoE text decoder
// (shard/loader_hf.c maps them onto the checkpoint when loading); what
// transformers 5.23's Qwen3VLMoeForConditionalGeneration.save_pretrained
// writes, and its from_pretrained reads, is:
//   - model.language_model.X for the decoder's model.X (lm_head.weight
//     stays at the top);
//   - each MoE layer's experts fused: mlp.experts.gate_up_proj (E, 2F, H),
//     gate rows then up rows (the modeling code's chunk(2)), and
//     mlp.experts.down_proj (E, H, F) -- the module's parameter layout;
//   - the vision tower, model.visual.*, which tpr does not run: copied from
//     the checkpoint the run started from, byte for byte, so the saved
//     directory is a whole model again.
// qwen2_vl: the decoder's names are already what save_pretrained writes
// for Qwen2VLForConditionalGeneration (the hub's model.layers.*); its
// vision tower (visual.*) is copied the same way.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"
#include "shard/model_config.h"
#include "train/checkpoint_impl.h"

#define LM_PREFIX "model.language_model."

static char *str_cat(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *s = malloc(la + lb + 1);
  if (s) memcpy(s, a, la), memcpy(s + la, b, lb + 1);
  return s;
}

static int64_t *shape3(int64_t a, int64_t b, int64_t c) {
  int64_t *s = malloc(3 * sizeof *s);
  if (s) s[0] = a, s[1] = b, s[2] = c;
  return s;
}

// Expert e of layer L's w ("gate", "up", "down") when `name` is one, else false.
static bool expert_piece(const char *name, int *L, int *e, int *w) {
  char which[8];
  int end = 0;
  if (sscanf(name, "model.layers.%d.mlp.experts.%d.%7[a-z]_proj.weight%n", L, e, which, &end) != 3 || name[end])
    return false;
  *w = !strcmp(which, "gate") ? 0 : !strcmp(which, "up") ? 1 : !strcmp(which, "down") ? 2 : -1;
  return *w >= 0;
}

// Layer L's experts from the collected pieces into the two fused tensors,
// pushed onto out. Every piece must be there with its shape.
static tpr_status fuse_layer(const tpr_model_config *cfg, const tpr__collect *in, int L, tpr__collect *out) {
  int64_t E = cfg->num_experts, F = cfg->moe_intermediate_size, H = cfg->hidden_size;
  float *gate_up = malloc((size_t)(E * 2 * F * H) * sizeof *gate_up);  // (E, 2F, H)
  float *down = malloc((size_t)(E * H * F) * sizeof *down);            // (E, H, F)
  char *found = calloc((size_t)(3 * E), 1);
  tpr_status rc = gate_up && down && found ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "save: fused experts");
  for (int i = 0; i < in->n && rc == TPR_OK; i++) {
    int l, e, w;
    if (!in->e[i].name || !expert_piece(in->e[i].name, &l, &e, &w) || l != L) continue;  // NULL: moved out
    const tpr_st_write_entry *p = &in->e[i];
    int64_t rows = w == 2 ? H : F, cols = w == 2 ? F : H;
    if (e < 0 || e >= E || p->ndim != 2 || p->shape[0] != rows || p->shape[1] != cols) {
      rc = TPR_FAIL(TPR_ERR_INTERNAL, "save: %s is not expert %d of %lld with shape (%lld, %lld)", p->name, e,
                    (long long)E, (long long)rows, (long long)cols);
      break;
    }
    float *dst = w == 2 ? down + e * H * F : gate_up + (e * 2 + w) * F * H;
    memcpy(dst, p->data, (size_t)(rows * cols) * sizeof *dst);
    found[3 * e + w] = 1;
  }
  for (int64_t k = 0; k < 3 * E && rc == TPR_OK; k++)
    if (!found[k])
      rc = TPR_FAIL(TPR_ERR_INTERNAL, "save: layer %d: expert %lld's %s_proj was not exported", L, (long long)(k / 3),
                    k % 3 == 0 ? "gate" : k % 3 == 1 ? "up" : "down");
  free(found);
  if (rc != TPR_OK) return free(gate_up), free(down), rc;
  char name[160];
  snprintf(name, sizeof name, LM_PREFIX "layers.%d.mlp.experts.gate_up_proj", L);
  rc = tpr__collect_push(out, strdup(name), TPR_F32, 3, shape3(E, 2 * F, H), gate_up);
  snprintf(name, sizeof name, LM_PREFIX "layers.%d.mlp.experts.down_proj", L);
  if (rc == TPR_OK) rc = tpr__collect_push(out, strdup(name), TPR_F32, 3, shape3(E, H, F), down);
  else free(down);
  for (int i = out->n - 2; rc == TPR_OK && i < out->n; i++)
    if (!out->e[i].name || !out->e[i].shape) rc = TPR_FAIL(TPR_ERR_OOM, "save: fused experts");
  return rc;
}

// The tensors of src_dir tpr does not run (the vision tower: model.visual.*
// or visual.*), copied as they are, under their names.
static tpr_status copy_vision(const char *src_dir, tpr__collect *out, int *copied) {
  tpr_st_set *set = NULL;
  TPR_CHECK(tpr_st_open(src_dir, &set));
  tpr_status rc = TPR_OK;
  for (int i = 0; i < tpr_st_count(set) && rc == TPR_OK; i++) {
    const tpr_st_tensor *t = tpr_st_get(set, i);
    if (strncmp(t->name, "model.visual.", 13) && strncmp(t->name, "visual.", 7)) continue;
    char *name = strdup(t->name);
    int64_t *shape = malloc((size_t)(t->ndim ? t->ndim : 1) * sizeof *shape);
    void *data = malloc(t->nbytes ? t->nbytes : 1);
    if (!name || !shape || !data) {
      free(name), free(shape), free(data);
      rc = TPR_FAIL(TPR_ERR_OOM, "save: %s", t->name);
      break;
    }
    memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
    memcpy(data, t->data, t->nbytes);
    rc = tpr__collect_push(out, name, t->dtype, t->ndim, shape, data);
    (*copied)++;
  }
  tpr_st_close(set);
  return rc;
}

tpr_status tpr__train_hf_layout(const tpr_session *s, const char *src_dir, tpr__collect *c) {
  const tpr_model_config *cfg = tpr_session_config(s);
  int vision = 0;
  if (cfg->family == TPR_FAMILY_QWEN2_VL) {
    TPR_CHECK(copy_vision(src_dir, c, &vision));
    if (!vision) TPR_LOG_WRN("save: %s holds no vision tower (visual.*) to copy: the saved checkpoint has the text "
                             "decoder only", src_dir);
    return TPR_OK;
  }
  if (cfg->family != TPR_FAMILY_QWEN3_VL_MOE) return TPR_OK;
  tpr__collect out = {0};
  tpr_status rc = TPR_OK;
  for (int i = 0; i < c->n && rc == TPR_OK; i++) {
    int L, e, w;
    if (expert_piece(c->e[i].name, &L, &e, &w)) continue;  // fused below
    tpr_st_write_entry *p = &c->e[i];
    char *name = !strncmp(p->name, "model.", 6) ? str_cat(LM_PREFIX, p->name + 6) : strdup(p->name);
    if (!name) {
      rc = TPR_FAIL(TPR_ERR_OOM, "save: names");
      break;
    }
    // The entry's shape and data move to out.
    rc = tpr__collect_push(&out, name, p->dtype, p->ndim, (int64_t *)p->shape, (void *)p->data);
    free((void *)p->name);
    p->name = NULL, p->shape = NULL, p->data = NULL;
  }
  for (int L = 0; L < cfg->num_layers && rc == TPR_OK; L++)
    if (tpr_model_config_layer_is_moe(cfg, L)) rc = fuse_layer(cfg, c, L, &out);
  if (rc == TPR_OK) rc = copy_vision(src_dir, &out, &vision);
  if (rc == TPR_OK && !vision)
    TPR_LOG_WRN("save: %s holds no vision tower (model.visual.*) to copy: the saved checkpoint has the text decoder "
                "only", src_dir);
  tpr__collect_free(c);
  if (rc != TPR_OK) {
    tpr__collect_free(&out);
    return rc;
  }
  *c = out;
  return TPR_OK;
}
