// MRoPE settings of a Qwen-VL text config (model_config.h): mrope_section
// and mrope_interleaved, read where transformers reads them -- the
// "rope_parameters" object (transformers 5) or the legacy "rope_scaling"
// object hub configs still carry (transformers 5 folds it into
// rope_parameters). Both present with different values is an error rather
// than a guess.
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>
#include "shard/model_config.h"

static const cJSON *obj_item(const cJSON *obj, const char *key) {
  const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
  return cJSON_IsNull(v) ? NULL : v;
}

// The key from whichever of the two objects has it; both must agree.
static tpr_status pick(const cJSON *params, const cJSON *scaling, const char *origin, const char *key,
                       const cJSON **out) {
  const cJSON *a = obj_item(params, key), *b = obj_item(scaling, key);
  if (a && b) {
    char *sa = cJSON_PrintUnformatted(a), *sb = cJSON_PrintUnformatted(b);
    bool same = sa && sb && strcmp(sa, sb) == 0;
    cJSON_free(sa), cJSON_free(sb);
    if (!same)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"rope_parameters.%s\" disagrees with \"rope_scaling.%s\"", origin, key, key);
  }
  *out = a ? a : b;
  return TPR_OK;
}

tpr_status tpr__model_config_mrope(const void *text_config, const char *origin, int layout, tpr_model_config *c) {
  const cJSON *root = text_config, *params = obj_item(root, "rope_parameters"), *scaling = obj_item(root, "rope_scaling");
  if ((params && !cJSON_IsObject(params)) || (scaling && !cJSON_IsObject(scaling)))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"rope_parameters\" / \"rope_scaling\" must be objects", origin);
  const cJSON *type, *sec, *inter;
  TPR_CHECK(pick(params, scaling, origin, "rope_type", &type));
  if (!type) TPR_CHECK(pick(params, scaling, origin, "type", &type));
  if (type && (!cJSON_IsString(type) || (strcmp(type->valuestring, "default") && strcmp(type->valuestring, "mrope"))))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: rope_type \"%s\" is not supported with MRoPE (only \"default\")", origin,
                    cJSON_IsString(type) ? type->valuestring : "?");
  TPR_CHECK(pick(params, scaling, origin, "mrope_section", &sec));
  TPR_CHECK(pick(params, scaling, origin, "mrope_interleaved", &inter));
  // transformers' Qwen3-VL code always interleaves and Qwen2-VL's always
  // sections; a config that claims the other is refused, not followed.
  if (inter && (!cJSON_IsBool(inter) || cJSON_IsTrue(inter) != (layout == 2)))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: \"mrope_interleaved\" must be %s for this model type", origin,
                    layout == 2 ? "true" : "false");
  // The default when absent is the rotary embedding's: Qwen3-VL's
  // [24, 20, 20], Qwen2-VL's [16, 24, 24] (both for a head_dim of 128).
  int64_t s[3] = {24, 20, 20};
  if (layout != 2) s[0] = 16, s[1] = 24, s[2] = 24;
  if (sec) {
    if (!cJSON_IsArray(sec) || cJSON_GetArraySize(sec) != 3)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"mrope_section\" must be an array of 3 integers [t, h, w]", origin);
    for (int a = 0; a < 3; a++) {
      const cJSON *e = cJSON_GetArrayItem(sec, a);
      if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble > 1e6)
        return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"mrope_section\" entry %d must be an integer >= 0", origin, a);
      s[a] = (int64_t)e->valuedouble;
    }
  }
  c->mrope_layout = layout;
  memcpy(c->mrope_section, s, sizeof s);
  return TPR_OK;
}
