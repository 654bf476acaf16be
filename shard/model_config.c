#include "model_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/file_io.h"
#include "runtime/tensor.h"

// Sizes beyond this are not a model we could hold; the cap keeps every
// product the planner forms well inside int64.
#define SIZE_CAP ((int64_t)1 << 30)
// Layers are looped over per config and per rank: far above any model (< 200).
#define MAX_LAYERS 65536

static const char *const family_names[TPR_FAMILY_COUNT] = {
    [TPR_FAMILY_MINIMAX_M2] = "minimax_m2",
    [TPR_FAMILY_QWEN3_MOE] = "qwen3_moe",
    [TPR_FAMILY_HUNYUAN_V1_MOE] = "hunyuan_v1_moe",
    [TPR_FAMILY_QWEN3_VL_MOE] = "qwen3_vl_moe",
    [TPR_FAMILY_QWEN2_VL] = "qwen2_vl",
    [TPR_FAMILY_MINIMAX] = "minimax",
    [TPR_FAMILY_MINICPM_SALA] = "minicpm_sala",
};

const char *tpr_model_family_name(tpr_model_family f) {
  return (unsigned)f < TPR_FAMILY_COUNT ? family_names[f] : "?";
}

// ---- typed getters: every error names the key and the origin ----

// A JSON null counts as absent: HF writes None for "use the default".
static const cJSON *item(const cJSON *obj, const char *key) {
  const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
  return cJSON_IsNull(v) ? NULL : v;
}

static tpr_status get_int(const cJSON *root, const char *origin, const char *key, bool required, int64_t dflt,
                          int64_t *out) {
  const cJSON *v = item(root, key);
  if (!v) {
    if (required) return TPR_FAIL(TPR_ERR_FORMAT, "%s: missing required key \"%s\"", origin, key);
    *out = dflt;
    return TPR_OK;
  }
  if (!cJSON_IsNumber(v)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be an integer (a JSON number)", origin, key);
  double d = v->valuedouble;
  if (d != floor(d) || fabs(d) > (double)SIZE_CAP)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be an integer of at most %lld, got %g", origin, key,
                    (long long)SIZE_CAP, d);
  *out = (int64_t)d;
  return TPR_OK;
}

// `parent` names the enclosing object in messages ("rope_parameters"), or NULL.
static tpr_status get_double(const cJSON *root, const char *origin, const char *parent, const char *key, double dflt,
                             double *out, bool *present) {
  const cJSON *v = item(root, key);
  if (present) *present = v != NULL;
  if (!v) {
    *out = dflt;
    return TPR_OK;
  }
  if (!cJSON_IsNumber(v))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s%s%s\" must be a number", origin, parent ? parent : "", parent ? "." : "",
                    key);
  *out = v->valuedouble;
  return TPR_OK;
}

static tpr_status get_bool(const cJSON *root, const char *origin, const char *key, bool dflt, bool *out) {
  const cJSON *v = item(root, key);
  if (!v) {
    *out = dflt;
    return TPR_OK;
  }
  if (!cJSON_IsBool(v)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be true or false", origin, key);
  *out = cJSON_IsTrue(v);
  return TPR_OK;
}

static tpr_status get_string(const cJSON *root, const char *origin, const char *key, const char *dflt,
                             const char **out) {
  const cJSON *v = item(root, key);
  if (!v) {
    *out = dflt;
    return TPR_OK;
  }
  if (!cJSON_IsString(v)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be a string", origin, key);
  *out = v->valuestring;
  return TPR_OK;
}

// ---- the pieces every family shares ----

// A RoPE setting given top level (legacy, the hub's M2 config) and/or inside
// "rope_parameters" (transformers v5). Both present and different is an error
// rather than a guess at which one the writer meant.
static tpr_status get_rope_value(const cJSON *root, const cJSON *rope, const char *origin, const char *key,
                                 double dflt, double *out, bool *present) {
  double top = dflt, nested = dflt;
  bool has_top = false, has_nested = false;
  TPR_CHECK(get_double(root, origin, NULL, key, dflt, &top, &has_top));
  if (rope) TPR_CHECK(get_double(rope, origin, "rope_parameters", key, dflt, &nested, &has_nested));
  if (has_top && has_nested && top != nested)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" %g disagrees with \"rope_parameters.%s\" %g", origin, key, top, key,
                    nested);
  *out = has_nested ? nested : top;
  if (present) *present = has_top || has_nested;
  return TPR_OK;
}

// Attention geometry and RoPE. Transformers v5 moved rope_theta and
// partial_rotary_factor into "rope_parameters"; the hub's MiniMax-M2 config
// keeps them top level and gives rotary_dim. Both spellings are read.
//
// The HF classes default num_key_value_heads to the flagship's count (8 for
// M2, 4 for Qwen3), silently wrong for any other checkpoint, so it is
// required. For M2 so are head_dim (class default 128, not hidden/heads) and
// a rotary size (the hub class defaults rotary_dim 64, transformers
// partial_rotary_factor 1); Qwen3 falls back to head_dim = hidden/heads and
// full rotation, as its modeling code does.
static tpr_status parse_attention(const cJSON *root, const char *origin, bool m2, double default_theta,
                                  tpr_model_config *c) {
  TPR_CHECK(get_int(root, origin, "num_attention_heads", true, 0, &c->num_heads));
  TPR_CHECK(get_int(root, origin, "num_key_value_heads", true, 0, &c->num_kv_heads));
  int64_t dflt_d = c->num_heads > 0 && c->hidden_size % c->num_heads == 0 ? c->hidden_size / c->num_heads : 0;
  TPR_CHECK(get_int(root, origin, "head_dim", m2 || dflt_d == 0, dflt_d, &c->head_dim));

  const cJSON *rope = item(root, "rope_parameters");
  if (rope && !cJSON_IsObject(rope)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"rope_parameters\" must be an object", origin);
  double theta = default_theta, factor = 1.0;
  bool has_factor = false;
  TPR_CHECK(get_rope_value(root, rope, origin, "rope_theta", default_theta, &theta, NULL));
  TPR_CHECK(get_rope_value(root, rope, origin, "partial_rotary_factor", 1.0, &factor, &has_factor));
  c->rope_theta = theta;

  const char *fkey = "partial_rotary_factor";
  if (has_factor && !(factor > 0 && factor <= 1))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be in (0, 1], got %g", origin, fkey, factor);
  double from_factor = (double)c->head_dim * factor;
  if (has_factor && from_factor != floor(from_factor))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" %g times head_dim %lld is not a whole number of dims", origin, fkey,
                    factor, (long long)c->head_dim);
  if (m2 && !has_factor && !item(root, "rotary_dim"))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: missing required key \"rotary_dim\" (or \"partial_rotary_factor\")", origin);
  TPR_CHECK(get_int(root, origin, "rotary_dim", false, (int64_t)from_factor, &c->rotary_dim));
  if (has_factor && item(root, "rotary_dim") && c->rotary_dim != (int64_t)from_factor)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"rotary_dim\" %lld disagrees with \"%s\" %g * head_dim %lld", origin,
                    (long long)c->rotary_dim, fkey, factor, (long long)c->head_dim);
  return TPR_OK;
}

static tpr_status parse_common(const cJSON *root, const char *origin, tpr_model_config *c) {
  TPR_CHECK(get_int(root, origin, "vocab_size", true, 0, &c->vocab_size));
  TPR_CHECK(get_int(root, origin, "hidden_size", true, 0, &c->hidden_size));
  TPR_CHECK(get_int(root, origin, "num_hidden_layers", true, 0, &c->num_layers));
  TPR_CHECK(get_double(root, origin, NULL, "rms_norm_eps", 1e-6, &c->rms_norm_eps, NULL));
  TPR_CHECK(get_double(root, origin, NULL, "router_aux_loss_coef", 0.001, &c->router_aux_loss_coef, NULL));
  return get_bool(root, origin, "tie_word_embeddings", false, &c->tie_word_embeddings);
}

// MiniMax-M2: the hub's configuration_minimax_m2.py names and defaults.
// "intermediate_size" is the routed expert width (there is no dense MLP).
static tpr_status parse_minimax_m2(const cJSON *root, const char *origin, tpr_model_config *c) {
  TPR_CHECK(parse_common(root, origin, c));
  TPR_CHECK(parse_attention(root, origin, true, 5e6, c));
  TPR_CHECK(get_int(root, origin, "intermediate_size", true, 0, &c->moe_intermediate_size));
  TPR_CHECK(get_int(root, origin, "num_local_experts", true, 0, &c->num_experts));
  TPR_CHECK(get_int(root, origin, "num_experts_per_tok", true, 0, &c->experts_per_tok));
  TPR_CHECK(get_int(root, origin, "shared_intermediate_size", false, 0, &c->shared_expert_intermediate_size));
  if (c->shared_expert_intermediate_size != 0)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: \"shared_intermediate_size\" %lld: minimax_m2 has no shared expert",
                    origin, (long long)c->shared_expert_intermediate_size);
  const char *scoring = NULL, *qk_type = NULL;
  bool use_qk_norm = true;
  TPR_CHECK(get_string(root, origin, "scoring_func", "sigmoid", &scoring));
  if (strcmp(scoring, "sigmoid") == 0) c->router = TPR_ROUTER_SIGMOID;
  else if (strcmp(scoring, "softmax") == 0) c->router = TPR_ROUTER_SOFTMAX;
  else return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"scoring_func\" must be \"sigmoid\" or \"softmax\", got \"%s\"", origin, scoring);
  TPR_CHECK(get_bool(root, origin, "use_routing_bias", true, &c->routing_bias));
  TPR_CHECK(get_bool(root, origin, "use_qk_norm", true, &use_qk_norm));
  TPR_CHECK(get_string(root, origin, "qk_norm_type", "per_layer", &qk_type));
  if (strcmp(qk_type, "per_layer") == 0) c->qk_norm = TPR_QK_NORM_FULL;
  else if (strcmp(qk_type, "per_head") == 0) c->qk_norm = TPR_QK_NORM_PER_HEAD;
  else return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"qk_norm_type\" must be \"per_layer\" or \"per_head\", got \"%s\"", origin, qk_type);
  if (!use_qk_norm) c->qk_norm = TPR_QK_NORM_NONE;
  c->norm_topk_prob = true;  // the M2 router always renormalises the chosen weights
  c->num_moe_layers = c->num_layers;
  return TPR_OK;
}

// Qwen3-MoE: Qwen3MoeConfig names and defaults. A layer is sparse unless it
// is listed in mlp_only_layers or (index+1) is not a multiple of
// decoder_sparse_step; the others run a dense MLP of intermediate_size.
static tpr_status parse_qwen3_moe(const cJSON *root, const char *origin, tpr_model_config *c) {
  TPR_CHECK(parse_common(root, origin, c));
  TPR_CHECK(parse_attention(root, origin, false, 1e4, c));
  TPR_CHECK(get_int(root, origin, "moe_intermediate_size", true, 0, &c->moe_intermediate_size));
  // Hub configs say num_experts; transformers 5's save_pretrained writes its
  // attribute-map name num_local_experts. Either, and both only if equal.
  int64_t local = 0;
  TPR_CHECK(get_int(root, origin, "num_experts", false, 0, &c->num_experts));
  TPR_CHECK(get_int(root, origin, "num_local_experts", false, 0, &local));
  if (!item(root, "num_experts") && !item(root, "num_local_experts"))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: missing required key \"num_experts\" (or \"num_local_experts\")", origin);
  if (item(root, "num_experts") && item(root, "num_local_experts") && local != c->num_experts)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"num_experts\" %lld disagrees with \"num_local_experts\" %lld", origin,
                    (long long)c->num_experts, (long long)local);
  if (!item(root, "num_experts")) c->num_experts = local;
  TPR_CHECK(get_int(root, origin, "num_experts_per_tok", true, 0, &c->experts_per_tok));
  TPR_CHECK(get_bool(root, origin, "norm_topk_prob", false, &c->norm_topk_prob));
  int64_t step;
  if (c->num_layers > MAX_LAYERS)  // before the per-layer loop below runs that many times
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"num_hidden_layers\" %lld exceeds %d", origin, (long long)c->num_layers,
                    MAX_LAYERS);
  TPR_CHECK(get_int(root, origin, "decoder_sparse_step", false, 1, &step));
  if (step < 1) return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"decoder_sparse_step\" must be >= 1, got %lld", origin, (long long)step);
  const cJSON *only = item(root, "mlp_only_layers");
  if (only && !cJSON_IsArray(only))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"mlp_only_layers\" must be an array of layer indices", origin);
  const cJSON *e;
  cJSON_ArrayForEach(e, only) {
    if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
        e->valuedouble >= (double)c->num_layers)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"mlp_only_layers\" entries must be layer indices in [0, %lld)", origin,
                      (long long)c->num_layers);
  }
  c->decoder_sparse_step = step;
  cJSON_ArrayForEach(e, only) {
    int64_t l = (int64_t)e->valuedouble;
    if (l >= 256)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: \"mlp_only_layers\" entry %lld: layers past 255 are not supported", origin,
                      (long long)l);
    c->mlp_only_mask[l / 64] |= 1ull << (l % 64);
  }
  c->num_moe_layers = 0;
  for (int64_t l = 0; l < c->num_layers; l++) c->num_moe_layers += tpr_model_config_layer_is_moe(c, l);
  // Variants the qwen3_moe builder does not run are refused by name here,
  // before a plan or a load is made of them.
  bool bias = false, sliding = false;
  TPR_CHECK(get_bool(root, origin, "attention_bias", false, &bias));
  TPR_CHECK(get_bool(root, origin, "use_sliding_window", false, &sliding));
  if (bias)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: qwen3_moe with \"attention_bias\": true is not supported (q/k/v/o biases)",
                    origin);
  if (sliding)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: qwen3_moe with \"use_sliding_window\": true is not supported (every layer "
                    "attends the whole sequence here)", origin);
  if (c->num_moe_layers < c->num_layers)
    TPR_CHECK(get_int(root, origin, "intermediate_size", true, 0, &c->dense_intermediate_size));
  c->router = TPR_ROUTER_SOFTMAX;
  c->routing_bias = false;
  c->qk_norm = TPR_QK_NORM_PER_HEAD;
  return TPR_OK;
}

// An int or, as hub configs write it per layer, a list of equal ints (the
// Hunyuan-A13B config says "moe_topk": [8, 8, ...]); per-layer values that
// differ are refused by name.
static tpr_status get_int_or_uniform_list(const cJSON *root, const char *origin, const char *key, int64_t dflt,
                                          int64_t *out) {
  const cJSON *v = item(root, key);
  if (!cJSON_IsArray(v)) return get_int(root, origin, key, false, dflt, out);
  const cJSON *e;
  bool first = true;
  cJSON_ArrayForEach(e, v) {
    if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || fabs(e->valuedouble) > (double)SIZE_CAP)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" entries must be integers", origin, key);
    if (!first && (int64_t)e->valuedouble != *out)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: \"%s\" differs between layers (%lld and %g): per-layer values are "
                      "not supported", origin, key, (long long)*out, e->valuedouble);
    *out = (int64_t)e->valuedouble, first = false;
  }
  if (first) return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" is an empty list", origin, key);
  return TPR_OK;
}

// Hunyuan-MoE: transformers' HunYuanMoEV1Config / HunYuanMoEV1ForCausalLM.
// Every layer is an MoE layer: num_experts routed SwiGLU experts (softmax
// top-moe_topk, always renormalised) beside one shared MLP, both of width
// intermediate_size; per-head query/key layernorm after RoPE. What the
// current transformers code has and tpr does not run is refused by name;
// hub keys of Tencent's original code that transformers ignores but that
// change the model (cross-layer attention, other shared/expert widths) are
// refused too rather than silently dropped.
static tpr_status parse_hunyuan_v1_moe(const cJSON *root, const char *origin, tpr_model_config *c) {
  TPR_CHECK(parse_common(root, origin, c));
  TPR_CHECK(parse_attention(root, origin, false, 1e4, c));
  TPR_CHECK(get_int(root, origin, "intermediate_size", true, 0, &c->moe_intermediate_size));
  c->shared_expert_intermediate_size = c->moe_intermediate_size;
  const cJSON *ne = item(root, "num_experts");
  if (cJSON_IsArray(ne))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: hunyuan_v1_moe with a per-layer \"num_experts\" list is not supported",
                    origin);
  TPR_CHECK(get_int(root, origin, "num_experts", false, 1, &c->num_experts));  // the class default: 1
  TPR_CHECK(get_int_or_uniform_list(root, origin, "moe_topk", 1, &c->experts_per_tok));
  const cJSON *rope = item(root, "rope_parameters");
  const char *rope_type = "default";
  if (cJSON_IsObject(rope)) {
    const cJSON *t = item(rope, "rope_type");
    if (!t) t = item(rope, "type");
    if (t && !cJSON_IsString(t)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"rope_parameters.rope_type\" must be a string", origin);
    if (t) rope_type = t->valuestring;
  }
  if (strcmp(rope_type, "default") != 0 || item(root, "rope_scaling"))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: hunyuan_v1_moe with RoPE scaling (rope type \"%s\"%s) is not supported: "
                    "only the default rotary", origin, rope_type, item(root, "rope_scaling") ? ", rope_scaling" : "");
  bool flag = false;
  TPR_CHECK(get_bool(root, origin, "attention_bias", false, &flag));
  if (flag)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: hunyuan_v1_moe with \"attention_bias\": true is not supported (q/k/v/o "
                    "biases)", origin);
  TPR_CHECK(get_bool(root, origin, "use_cla", false, &flag));
  if (flag)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: hunyuan_v1_moe with \"use_cla\": true (cross-layer KV sharing) is not "
                    "supported; transformers ignores it too", origin);
  bool mixed = true, qk = true;
  TPR_CHECK(get_bool(root, origin, "use_mixed_mlp_moe", true, &mixed));
  TPR_CHECK(get_bool(root, origin, "use_qk_norm", true, &qk));
  if (!mixed || !qk)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: hunyuan_v1_moe with \"%s\": false is not supported (transformers' "
                    "model always has it)", origin, !mixed ? "use_mixed_mlp_moe" : "use_qk_norm");
  int64_t v = 0;
  TPR_CHECK(get_int_or_uniform_list(root, origin, "num_shared_expert", 1, &v));
  if (v != 1)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: hunyuan_v1_moe with \"num_shared_expert\" %lld is not supported (one "
                    "shared MLP)", origin, (long long)v);
  TPR_CHECK(get_int_or_uniform_list(root, origin, "moe_intermediate_size", c->moe_intermediate_size, &v));
  if (v != c->moe_intermediate_size)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: hunyuan_v1_moe with \"moe_intermediate_size\" %lld != "
                    "\"intermediate_size\" %lld is not supported (transformers builds both at intermediate_size)",
                    origin, (long long)v, (long long)c->moe_intermediate_size);
  c->router = TPR_ROUTER_SOFTMAX;
  c->routing_bias = false;
  c->norm_topk_prob = true;  // HunYuanMoEV1Gate always renormalises the chosen weights
  c->qk_norm = TPR_QK_NORM_PER_HEAD;
  c->qk_norm_after_rope = true;
  c->num_moe_layers = c->num_layers;
  return TPR_OK;
}

// Qwen2-VL / Qwen2.5-VL (Qwen2VLForConditionalGeneration,
// Qwen2_5_VLForConditionalGeneration; their text decoders are the same code
// in transformers 5.23): a dense Qwen2 -- q/k/v with biases, no QK-norm, a
// SwiGLU MLP of intermediate_size in every layer -- with sectioned MRoPE.
// `text` is text_config as transformers 5 writes it, or the root of a hub
// config (flat keys). What transformers' model has and tpr does not run is
// refused by name.
static tpr_status parse_qwen2_vl(const cJSON *root, const cJSON *text, const char *origin, tpr_model_config *c) {
  TPR_CHECK(parse_common(text, origin, c));
  TPR_CHECK(get_double(text, origin, NULL, "rms_norm_eps", 1e-5, &c->rms_norm_eps, NULL));  // the class default
  bool has_d = item(text, "head_dim") != NULL;
  TPR_CHECK(parse_attention(text, origin, false, 1e6, c));
  // Qwen2VLAttention takes head_dim = hidden_size / heads whatever the
  // config says (and its rotary embedding would read the key): refuse a
  // config where the two disagree rather than pick one.
  if (c->num_heads < 1 || c->hidden_size % c->num_heads)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: qwen2_vl needs \"hidden_size\" %lld divisible by \"num_attention_heads\" %lld",
                    origin, (long long)c->hidden_size, (long long)c->num_heads);
  if (has_d && c->head_dim != c->hidden_size / c->num_heads)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: qwen2_vl with \"head_dim\" %lld != hidden_size / heads %lld is not "
                    "supported (transformers' attention uses the latter)", origin, (long long)c->head_dim,
                    (long long)(c->hidden_size / c->num_heads));
  if (c->rotary_dim != c->head_dim)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: qwen2_vl with \"partial_rotary_factor\" (%lld of %lld dims) is not "
                    "supported: transformers rotates the whole head", origin, (long long)c->rotary_dim,
                    (long long)c->head_dim);
  TPR_CHECK(get_int(text, origin, "intermediate_size", true, 0, &c->dense_intermediate_size));
  const char *act = NULL;
  TPR_CHECK(get_string(text, origin, "hidden_act", "silu", &act));
  if (strcmp(act, "silu"))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: qwen2_vl with \"hidden_act\" \"%s\" is not supported (SwiGLU: silu)",
                    origin, act);
  bool sliding = false;
  TPR_CHECK(get_bool(text, origin, "use_sliding_window", false, &sliding));
  const cJSON *lt = item(text, "layer_types"), *e;
  if (!cJSON_IsArray(lt)) lt = NULL;
  cJSON_ArrayForEach(e, lt) sliding |= !cJSON_IsString(e) || strcmp(e->valuestring, "full_attention") != 0;
  if (sliding)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: qwen2_vl with sliding-window attention (\"use_sliding_window\" / "
                    "\"layer_types\") is not supported (every layer attends the whole sequence here)", origin);
  // rope_type other than default / mrope (rope scaling) and mrope_interleaved
  // are refused there; mrope_section defaults to the modeling code's.
  TPR_CHECK(tpr__model_config_mrope(text, origin, 1 /* sectioned */, c));
  // transformers 5 reads tie_word_embeddings at the top level and forwards
  // a pre-v5 text_config's true to it.
  bool top = false, nested = false;
  TPR_CHECK(get_bool(root, origin, "tie_word_embeddings", false, &top));
  TPR_CHECK(get_bool(text, origin, "tie_word_embeddings", false, &nested));
  c->tie_word_embeddings = top || nested;
  c->qkv_bias = true;  // Qwen2VLAttention: q/k/v Linear(bias=True), o_proj without
  c->qk_norm = TPR_QK_NORM_NONE;
  c->num_experts = c->experts_per_tok = c->moe_intermediate_size = c->num_moe_layers = 0;
  return TPR_OK;
}

bool tpr_model_config_layer_is_linear(const tpr_model_config *c, int64_t l) {
  return l >= 0 && l < 256 && (c->linear_mask[l / 64] >> (l % 64) & 1);
}

// MiniMax (transformers' MiniMaxConfig, model_type "minimax"): softmax
// attention (GQA, full RoPE, no QK-norm, no biases) and lightning attention
// layers by layer_types, every layer MoE (softmax router, the chosen weights
// renormalised, "intermediate_size" the expert width), weighted residuals.
// What the modeling code does not do the way tpr builds it is refused here:
// another activation, sliding-window attention, partial or scaled RoPE.
static tpr_status parse_minimax(const cJSON *root, const char *origin, tpr_model_config *c) {
  TPR_CHECK(parse_common(root, origin, c));
  TPR_CHECK(parse_attention(root, origin, false, 1e6, c));
  if (c->rotary_dim != c->head_dim)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minimax rotates every head dim (its default RoPE ignores "
                    "\"partial_rotary_factor\"); rotary_dim %lld of head_dim %lld is refused", origin,
                    (long long)c->rotary_dim, (long long)c->head_dim);
  const cJSON *rope = item(root, "rope_parameters");
  const char *rope_type = "default", *act = "silu";
  if (rope) TPR_CHECK(get_string(rope, origin, "rope_type", "default", &rope_type));
  if (strcmp(rope_type, "default") != 0)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minimax with \"rope_parameters.rope_type\" \"%s\" (only the default "
                    "RoPE is built)", origin, rope_type);
  TPR_CHECK(get_string(root, origin, "hidden_act", "silu", &act));
  if (strcmp(act, "silu") != 0)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minimax with \"hidden_act\" \"%s\" (only silu is built: the experts' "
                    "SwiGLU and the lightning qkv activation)", origin, act);
  if (item(root, "sliding_window"))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minimax with a \"sliding_window\" (every softmax layer attends the "
                    "whole sequence here)", origin);
  TPR_CHECK(get_int(root, origin, "intermediate_size", true, 0, &c->moe_intermediate_size));
  TPR_CHECK(get_int(root, origin, "num_local_experts", true, 0, &c->num_experts));
  TPR_CHECK(get_int(root, origin, "num_experts_per_tok", true, 0, &c->experts_per_tok));
  TPR_CHECK(get_int(root, origin, "block_size", false, 256, &c->linear_block_size));
  if (c->linear_block_size < 1)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"block_size\" must be a positive integer, got %lld", origin,
                    (long long)c->linear_block_size);
  static const char *const factor_keys[6] = {"full_attn_alpha_factor", "full_attn_beta_factor",
                                             "linear_attn_alpha_factor", "linear_attn_beta_factor",
                                             "mlp_alpha_factor", "mlp_beta_factor"};
  double *factors[6] = {&c->attn_alpha[0], &c->attn_beta[0], &c->attn_alpha[1], &c->attn_beta[1], &c->mlp_alpha,
                        &c->mlp_beta};
  for (int i = 0; i < 6; i++) {
    TPR_CHECK(get_double(root, origin, NULL, factor_keys[i], 1.0, factors[i], NULL));
    if (!isfinite(*factors[i]))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be a finite number", origin, factor_keys[i]);
  }
  if (c->num_layers > 256)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: minimax with %lld layers: layer_types past 255 are not supported",
                    origin, (long long)c->num_layers);
  // MiniMaxConfig's default: layer i is full_attention when (i + 1) is odd.
  const cJSON *lt = item(root, "layer_types"), *e;
  if (lt && (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->num_layers))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"layer_types\" must be an array of num_hidden_layers (%lld) strings",
                    origin, (long long)c->num_layers);
  for (int64_t l = 0; l < c->num_layers; l++) {
    bool linear = (l + 1) % 2 == 0;
    if (lt) {
      e = cJSON_GetArrayItem(lt, (int)l);
      if (!cJSON_IsString(e) || (strcmp(e->valuestring, "linear_attention") && strcmp(e->valuestring, "full_attention")))
        return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"layer_types\"[%lld] must be \"linear_attention\" or "
                        "\"full_attention\"", origin, (long long)l);
      linear = strcmp(e->valuestring, "linear_attention") == 0;
    }
    if (linear) c->linear_mask[l / 64] |= 1ull << (l % 64), c->num_linear_layers++;
  }
  c->router = TPR_ROUTER_SOFTMAX;
  c->norm_topk_prob = true;  // MiniMaxTopKRouter always renormalises the chosen weights
  c->qk_norm = TPR_QK_NORM_NONE;
  c->num_moe_layers = c->num_layers;
  return TPR_OK;
}

bool tpr_model_config_layer_is_moe(const tpr_model_config *c, int64_t l) {
  int64_t step = c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1;
  bool only = l >= 0 && l < 256 && (c->mlp_only_mask[l / 64] >> (l % 64) & 1);
  return c->num_experts > 0 && !only && (l + 1) % step == 0;
}

tpr_status tpr_model_config_validate(const tpr_model_config *c, const char *origin) {
  if ((unsigned)c->family >= TPR_FAMILY_COUNT) return TPR_FAIL(TPR_ERR_FORMAT, "%s: invalid model family", origin);
  bool m2 = c->family == TPR_FAMILY_MINIMAX_M2 || c->family == TPR_FAMILY_MINIMAX;  // their keys' names
  struct {
    const char *key;
    int64_t v;
  } positive[] = {
      {"vocab_size", c->vocab_size},
      {"hidden_size", c->hidden_size},
      {"num_hidden_layers", c->num_layers},
      {"num_attention_heads", c->num_heads},
      {"num_key_value_heads", c->num_kv_heads},
      {"head_dim", c->head_dim},
      {"rotary_dim", c->rotary_dim},
      {m2 ? "num_local_experts" : "num_experts", c->num_experts},
      {"num_experts_per_tok", c->experts_per_tok},
      {m2 ? "intermediate_size" : "moe_intermediate_size", c->moe_intermediate_size},
  };
  // A dense model (no experts) has no expert sizes: they are 0 together.
  bool dense = c->num_experts == 0 && c->experts_per_tok == 0 && c->moe_intermediate_size == 0 &&
               c->num_moe_layers == 0 && !m2;
  size_t n_positive = sizeof positive / sizeof positive[0] - (dense ? 3 : 0);  // the last three are the experts'
  for (size_t i = 0; i < n_positive; i++)
    if (positive[i].v < 1 || positive[i].v > SIZE_CAP)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be a positive integer, got %lld", origin, positive[i].key,
                      (long long)positive[i].v);
  if (c->num_layers > MAX_LAYERS)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"num_hidden_layers\" %lld exceeds %d", origin, (long long)c->num_layers,
                    MAX_LAYERS);
  // Each field is capped, but tensors are products of them: the largest
  // weights must pass the same element bound as any shape from outside.
  struct {
    const char *what;
    int64_t a, b, c;
  } weights[] = {
      {"embed_tokens (vocab_size x hidden_size)", c->vocab_size, c->hidden_size, 1},
      {"q_proj (num_attention_heads x head_dim x hidden_size)", c->num_heads, c->head_dim, c->hidden_size},
      {"experts (num_experts x moe_intermediate_size x hidden_size)", c->num_experts, c->moe_intermediate_size,
       c->hidden_size},
      {"dense mlp (intermediate_size x hidden_size)", c->dense_intermediate_size, c->hidden_size, 1},
      {"shared expert (intermediate_size x hidden_size)", c->shared_expert_intermediate_size, c->hidden_size, 1},
  };
  for (size_t i = 0; i < sizeof weights / sizeof weights[0]; i++) {
    int64_t ab, abc;
    if (tpr_size_mul_checked(weights[i].what, weights[i].a, weights[i].b, TPR_SHAPE_MAX_NUMEL, &ab) != TPR_OK ||
        tpr_size_mul_checked(weights[i].what, ab, weights[i].c, TPR_SHAPE_MAX_NUMEL, &abc) != TPR_OK)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: %s has more than 2^48 elements", origin, weights[i].what);
  }
  if (c->num_heads % c->num_kv_heads)
    return TPR_FAIL(TPR_ERR_FORMAT,
                    "%s: \"num_key_value_heads\" %lld must divide \"num_attention_heads\" %lld (each KV head serves a "
                    "whole group of query heads)",
                    origin, (long long)c->num_kv_heads, (long long)c->num_heads);
  if (c->mrope_layout && (c->mrope_layout > 2 || c->mrope_section[0] < 0 || c->mrope_section[1] < 0 ||
                         c->mrope_section[2] < 0 ||
                         2 * (c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2]) != c->rotary_dim))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"mrope_section\" [%lld, %lld, %lld] must sum to rotary_dim/2 = %lld", origin,
                    (long long)c->mrope_section[0], (long long)c->mrope_section[1], (long long)c->mrope_section[2],
                    (long long)(c->rotary_dim / 2));
  if (c->rotary_dim > c->head_dim || c->rotary_dim % 2)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"rotary_dim\" %lld must be even and at most \"head_dim\" %lld", origin,
                    (long long)c->rotary_dim, (long long)c->head_dim);
  if (c->experts_per_tok > c->num_experts)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"num_experts_per_tok\" %lld exceeds \"%s\" %lld", origin,
                    (long long)c->experts_per_tok, m2 ? "num_local_experts" : "num_experts", (long long)c->num_experts);
  if (!(c->rope_theta > 0 && isfinite(c->rope_theta)))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"rope_theta\" must be positive, got %g", origin, c->rope_theta);
  if (!(c->router_aux_loss_coef >= 0) || isinf(c->router_aux_loss_coef))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"router_aux_loss_coef\" must be a finite number >= 0, got %g", origin,
                    c->router_aux_loss_coef);
  if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"rms_norm_eps\" must be in (0, 1), got %g", origin, c->rms_norm_eps);
  if (c->shared_expert_intermediate_size < 0 || c->shared_expert_intermediate_size > SIZE_CAP)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: shared expert size %lld out of range", origin,
                    (long long)c->shared_expert_intermediate_size);
  if (c->num_moe_layers < 0 || c->num_moe_layers > c->num_layers)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: %lld MoE layers out of %lld", origin, (long long)c->num_moe_layers,
                    (long long)c->num_layers);
  if (c->num_moe_layers < c->num_layers && (c->dense_intermediate_size < 1 || c->dense_intermediate_size > SIZE_CAP))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"intermediate_size\" of the dense MLP layers must be a positive integer, got %lld",
                    origin, (long long)c->dense_intermediate_size);
  return TPR_OK;
}

tpr_status tpr_model_config_parse(const char *json, size_t len, const char *origin, tpr_model_config *out) {
  memset(out, 0, sizeof *out);
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: not a valid JSON object", origin);
  }
  tpr_model_config c = {0};
  const char *type = NULL;
  tpr_status rc = get_string(root, origin, "model_type", NULL, &type);
  if (rc == TPR_OK && !type) rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: missing required key \"model_type\"", origin);
  if (rc != TPR_OK) goto done;
  if (strcmp(type, "minimax_m2") == 0) {
    c.family = TPR_FAMILY_MINIMAX_M2;
    TPR_CHECK_GOTO(parse_minimax_m2(root, origin, &c), rc, done);
  } else if (strcmp(type, "qwen3_moe") == 0) {
    c.family = TPR_FAMILY_QWEN3_MOE;
    TPR_CHECK_GOTO(parse_qwen3_moe(root, origin, &c), rc, done);
  } else if (strcmp(type, "qwen3_vl_moe") == 0) {
    // Qwen3VLMoeForConditionalGeneration: the text decoder's config is nested
    // (text_config, a Qwen3-MoE one plus MRoPE); the vision tower is not run.
    const cJSON *text = item(root, "text_config");
    if (!cJSON_IsObject(text)) {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: qwen3_vl_moe needs a \"text_config\" object", origin);
      goto done;
    }
    TPR_CHECK_GOTO(parse_qwen3_moe(text, origin, &c), rc, done);
    c.family = TPR_FAMILY_QWEN3_VL_MOE;
    c.norm_topk_prob = true;  // Qwen3VLMoeTextTopKRouter always renormalises (no norm_topk_prob key)
    TPR_CHECK_GOTO(tpr__model_config_mrope(text, origin, 2 /* interleaved */, &c), rc, done);
    // The top-level tie_word_embeddings is the model's (the text config's own
    // default differs); the text config's is read only when the top level has none.
    if (item(root, "tie_word_embeddings"))
      TPR_CHECK_GOTO(get_bool(root, origin, "tie_word_embeddings", false, &c.tie_word_embeddings), rc, done);

  } else if (strcmp(type, "qwen2_vl") == 0 || strcmp(type, "qwen2_5_vl") == 0) {
    // transformers 5 nests the text decoder's keys in text_config; hub
    // configs keep them flat at the top level (the class reads both).
    const cJSON *text = item(root, "text_config");
    if (text && !cJSON_IsObject(text)) {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: \"text_config\" must be an object", origin);
      goto done;
    }
    c.family = TPR_FAMILY_QWEN2_VL;
    TPR_CHECK_GOTO(parse_qwen2_vl(root, text ? text : root, origin, &c), rc, done);
  } else if (strcmp(type, "minimax") == 0) {
    c.family = TPR_FAMILY_MINIMAX;
    TPR_CHECK_GOTO(parse_minimax(root, origin, &c), rc, done);
  } else if (strcmp(type, "minicpm_sala") == 0) {
    // No transformers class: the keys of the published config.json and modeling code (docs/minicpm-sala.md).
    c.family = TPR_FAMILY_MINICPM_SALA;
    TPR_CHECK_GOTO(parse_common(root, origin, &c), rc, done);
    TPR_CHECK_GOTO(parse_attention(root, origin, false, 1e4, &c), rc, done);
    TPR_CHECK_GOTO(tpr__model_config_sala(root, origin, &c), rc, done);
  } else if (strcmp(type, "hunyuan_v1_moe") == 0) {
    c.family = TPR_FAMILY_HUNYUAN_V1_MOE;
    TPR_CHECK_GOTO(parse_hunyuan_v1_moe(root, origin, &c), rc, done);
  } else {
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: unknown \"model_type\" \"%s\" (known: minimax_m2, qwen3_moe, hunyuan_v1_moe, "
                  "qwen3_vl_moe, qwen2_vl, qwen2_5_vl, minimax, minicpm_sala)", origin, type);
    goto done;
  }
  TPR_CHECK_GOTO(tpr_model_config_validate(&c, origin), rc, done);
  *out = c;
done:
  cJSON_Delete(root);
  return rc;
}

tpr_status tpr_model_config_load(const char *path, tpr_model_config *out) {
  memset(out, 0, sizeof *out);
  struct stat st;
  char file[4096];
  // A checkpoint directory holds its config as config.json.
  int n = snprintf(file, sizeof file, "%s", path);
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    n = snprintf(file, sizeof file, "%s%sconfig.json", path, path[0] && path[strlen(path) - 1] == '/' ? "" : "/");
  if (n < 0 || (size_t)n >= sizeof file) return TPR_FAIL(TPR_ERR_INVALID_ARG, "config path too long: %s", path);
  uint8_t *text = NULL;
  size_t len = 0;
  TPR_CHECK(tpr_file_read(file, &text, &len));
  tpr_status rc = tpr_model_config_parse((const char *)text, len, file, out);
  free(text);
  return rc;
}
