// MiniCPM-SALA's config.json keys (model_config.h; docs/minicpm-sala.md
// names the published files). No transformers class exists, so the keys and
// their meaning are the published config's and modeling code's; where that
// code reads another key than the config suggests (its lightning layers use
// num_attention_heads and head_dim, not lightning_nh / lightning_head_dim)
// a config where the two disagree is refused rather than guessed. So is every
// option the reference (scripts/reference/minicpm_sala_ref.py) does not
// implement. mup_denominator is in the published config but unread by the
// modeling code: ignored.
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>
#include "shard/model_config.h"

#define MAX_MIXER_LAYERS 256  // linear_mask's bits

static const cJSON *at(const cJSON *obj, const char *key) {  // a JSON null counts as absent
  const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
  return cJSON_IsNull(v) ? NULL : v;
}

// An integer key of obj (named parent.key in messages), dflt when absent; required: no default.
static tpr_status int_key(const cJSON *obj, const char *origin, const char *parent, const char *key, bool required,
                          int64_t dflt, int64_t *out) {
  const cJSON *v = at(obj, key);
  if (!v) {
    if (required) return TPR_FAIL(TPR_ERR_FORMAT, "%s: missing required key \"%s%s%s\"", origin, parent, *parent ? "." : "", key);
    *out = dflt;
    return TPR_OK;
  }
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 1e15)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s%s%s\" must be an integer", origin, parent, *parent ? "." : "", key);
  *out = (int64_t)v->valuedouble;
  return TPR_OK;
}

static tpr_status num_key(const cJSON *obj, const char *origin, const char *key, double *out) {
  const cJSON *v = at(obj, key);
  if (!v) return TPR_FAIL(TPR_ERR_FORMAT, "%s: missing required key \"%s\" (muP)", origin, key);
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be a positive number", origin, key);
  *out = v->valuedouble;
  return TPR_OK;
}

static tpr_status bool_key(const cJSON *obj, const char *origin, const char *key, bool dflt, bool *out) {
  const cJSON *v = at(obj, key);
  if (!v) {
    *out = dflt;
    return TPR_OK;
  }
  if (!cJSON_IsBool(v)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be true or false", origin, key);
  *out = cJSON_IsTrue(v);
  return TPR_OK;
}

static bool is_lightning(const char *m) {
  return !strcmp(m, "lightning") || !strcmp(m, "lightning_attn") || !strcmp(m, "lightning-attn");
}

// sparse_config, with the modeling code's defaults for absent keys.
static tpr_status parse_sparse(const cJSON *root, const char *origin, tpr_model_config *c) {
  const cJSON *sc = at(root, "sparse_config");
  if (sc && !cJSON_IsObject(sc)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"sparse_config\" must be an object", origin);
  static const struct {
    const char *key;
    int64_t dflt;
  } keys[] = {{"kernel_size", 32}, {"kernel_stride", 16}, {"block_size", 64}, {"topk", 64},
              {"init_blocks", 1},  {"window_size", 2048}, {"dense_len", 8192}};
  int64_t *dst[] = {&c->sparse_kernel_size, &c->sparse_kernel_stride, &c->sparse_block_size, &c->sparse_topk,
                    &c->sparse_init_blocks, &c->sparse_window_size, &c->sparse_dense_len};
  for (int i = 0; i < 7; i++) {
    TPR_CHECK(int_key(sc, origin, "sparse_config", keys[i].key, false, keys[i].dflt, dst[i]));
    if (*dst[i] < (i < 3 ? 1 : 0))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"sparse_config.%s\" must be %s, got %lld", origin, keys[i].key,
                      i < 3 ? "positive" : ">= 0", (long long)*dst[i]);
  }
  if (c->sparse_kernel_size % c->sparse_kernel_stride || c->sparse_block_size % c->sparse_kernel_stride)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: \"sparse_config\" kernel_size %lld and block_size %lld must be "
                    "multiples of kernel_stride %lld (how the block scores pool the chunks)", origin,
                    (long long)c->sparse_kernel_size, (long long)c->sparse_block_size,
                    (long long)c->sparse_kernel_stride);
  bool nope = false;
  TPR_CHECK(bool_key(sc, origin, "use_nope", false, &nope));
  if (nope)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: \"sparse_config.use_nope\": true is not implemented (the published "
                    "config has false)", origin);
  return TPR_OK;
}

tpr_status tpr__model_config_sala(const void *root_, const char *origin, tpr_model_config *c) {
  const cJSON *root = root_;
  // Dense SwiGLU MLP in every layer.
  TPR_CHECK(int_key(root, origin, "", "intermediate_size", true, 0, &c->dense_intermediate_size));
  c->num_experts = c->experts_per_tok = c->moe_intermediate_size = c->num_moe_layers = 0;
  const cJSON *act = at(root, "hidden_act");
  if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minicpm_sala with a \"hidden_act\" other than \"silu\"", origin);
  bool flag = false;
  TPR_CHECK(bool_key(root, origin, "attention_bias", false, &flag));
  if (flag) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minicpm_sala with \"attention_bias\": true", origin);
  if (at(root, "rope_scaling"))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minicpm_sala with \"rope_scaling\" (only the default RoPE)", origin);
  if (c->rotary_dim != c->head_dim)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minicpm_sala rotates whole heads (rotary_dim %lld of head_dim %lld)",
                    origin, (long long)c->rotary_dim, (long long)c->head_dim);
  // The sparse layers' heads are hidden_size / num_attention_heads; the lightning layers' are head_dim.
  if (c->num_heads < 1 || c->hidden_size % c->num_heads || c->head_dim != c->hidden_size / c->num_heads)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minicpm_sala needs \"head_dim\" %lld = hidden_size / "
                    "num_attention_heads (the sparse layers' head size)", origin, (long long)c->head_dim);
  int64_t nh = 0, hd = 0;
  TPR_CHECK(int_key(root, origin, "", "lightning_nh", false, c->num_heads, &nh));
  TPR_CHECK(int_key(root, origin, "", "lightning_head_dim", false, c->head_dim, &hd));
  if (nh != c->num_heads || hd != c->head_dim)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: \"lightning_nh\" %lld / \"lightning_head_dim\" %lld differ from "
                    "num_attention_heads %lld / head_dim %lld, which the published modeling code builds its "
                    "lightning layers with", origin, (long long)nh, (long long)hd, (long long)c->num_heads,
                    (long long)c->head_dim);
  TPR_CHECK(int_key(root, origin, "", "lightning_nkv", false, c->num_kv_heads, &c->linear_kv_heads));
  if (c->linear_kv_heads < 1 || c->num_heads % c->linear_kv_heads)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"lightning_nkv\" %lld must divide num_attention_heads %lld", origin,
                    (long long)c->linear_kv_heads, (long long)c->num_heads);
  const cJSON *scale = at(root, "lightning_scale");
  if (scale && (!cJSON_IsString(scale) || strcmp(scale->valuestring, "1/sqrt(d)")))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: only \"lightning_scale\" \"1/sqrt(d)\" is implemented", origin);
  TPR_CHECK(bool_key(root, origin, "lightning_use_rope", false, &c->linear_rope));
  TPR_CHECK(bool_key(root, origin, "qk_norm", true, &c->linear_qk_norm));
  TPR_CHECK(bool_key(root, origin, "use_output_norm", false, &c->linear_out_norm));
  TPR_CHECK(bool_key(root, origin, "use_output_gate", false, &c->linear_out_gate));
  TPR_CHECK(bool_key(root, origin, "attn_use_output_gate", false, &c->attn_out_gate));
  TPR_CHECK(bool_key(root, origin, "attn_use_rope", false, &flag));
  if (flag)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minicpm_sala with \"attn_use_rope\": true (RoPE in the sparse layers) "
                    "is not implemented", origin);
  c->attn_nope = true;
  c->linear_alibi_slopes = true;
  c->linear_block_size = 64;  // the lightning prefill's block: any size gives the same result (to rounding)
  // muP.
  double scale_emb, scale_depth, dim_model_base;
  TPR_CHECK(num_key(root, origin, "scale_emb", &scale_emb));
  TPR_CHECK(num_key(root, origin, "scale_depth", &scale_depth));
  TPR_CHECK(num_key(root, origin, "dim_model_base", &dim_model_base));
  c->embed_scale = scale_emb;
  c->residual_scale = c->num_layers > 0 ? scale_depth / sqrt((double)c->num_layers) : 0;
  c->logit_divisor = (double)c->hidden_size / dim_model_base;
  // The mixer of each layer.
  const cJSON *mt = at(root, "mixer_types"), *e;
  if (c->num_layers > MAX_MIXER_LAYERS)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minicpm_sala with %lld layers (at most %d)", origin,
                    (long long)c->num_layers, MAX_MIXER_LAYERS);
  if (!cJSON_IsArray(mt) || cJSON_GetArraySize(mt) != c->num_layers)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"mixer_types\" must be an array of num_hidden_layers (%lld) strings", origin,
                    (long long)c->num_layers);
  int64_t l = 0;
  cJSON_ArrayForEach(e, mt) {
    if (!cJSON_IsString(e) || (strcmp(e->valuestring, "minicpm4") && !is_lightning(e->valuestring)))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"mixer_types\"[%lld] must be \"minicpm4\" or \"lightning-attn\"", origin,
                      (long long)l);
    if (is_lightning(e->valuestring)) c->linear_mask[l / 64] |= 1ull << (l % 64), c->num_linear_layers++;
    l++;
  }
  return parse_sparse(root, origin, c);
}
