// HF config.json -> tpr_model_config: the real MiniMax-M2 config and the tiny
// test configs parse to the right numbers; every kind of bad config is a
// TPR_ERR_FORMAT whose message names the offending key and the file.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shard/model_config.h"

static char configs_dir[4096];
static char tmp_dir[] = "/tmp/tpr_test_model_config_XXXXXX";

static const char *config_path(const char *name) { return tt_path(configs_dir, name); }

static void expect_m2(const tpr_model_config *c) {
  assert_int_equal(c->family, TPR_FAMILY_MINIMAX_M2);
  assert_string_equal(tpr_model_family_name(c->family), "minimax_m2");
  assert_int_equal(c->num_layers, 62);
  assert_int_equal(c->hidden_size, 3072);
  assert_int_equal(c->num_heads, 48);
  assert_int_equal(c->num_kv_heads, 8);
  assert_int_equal(c->head_dim, 128);
  assert_int_equal(c->rotary_dim, 64);
  assert_true(c->rope_theta == 5e6);
  assert_true(c->rms_norm_eps == 1e-6);
  assert_int_equal(c->num_experts, 256);
  assert_int_equal(c->experts_per_tok, 8);
  assert_int_equal(c->moe_intermediate_size, 1536);
  assert_int_equal(c->vocab_size, 200064);
  assert_int_equal(c->router, TPR_ROUTER_SIGMOID);
  assert_true(c->routing_bias);
  assert_true(c->norm_topk_prob);
  assert_int_equal(c->qk_norm, TPR_QK_NORM_FULL);
  assert_false(c->tie_word_embeddings);
  assert_int_equal(c->shared_expert_intermediate_size, 0);
  assert_int_equal(c->num_moe_layers, 62);
  assert_int_equal(c->dense_intermediate_size, 0);
}

static void test_real_minimax_m2(void **state) {
  tpr_model_config c;
  TT_OK(tpr_model_config_load(config_path("minimax_m2.json"), &c));
  expect_m2(&c);
  // A checkpoint directory: the loader finds its config.json.
  char dir[4200], file[4300];
  snprintf(dir, sizeof dir, "%s/ckpt", tmp_dir);
  snprintf(file, sizeof file, "%s/config.json", dir);
  assert_int_equal(mkdir(dir, 0700), 0);
  char *text = tt_slurp(config_path("minimax_m2.json"), NULL);
  tt_spit(file, text, strlen(text));
  free(text);
  memset(&c, 0, sizeof c);
  TT_OK(tpr_model_config_load(dir, &c));
  expect_m2(&c);
  strcat(dir, "/");
  TT_OK(tpr_model_config_load(dir, &c));
  expect_m2(&c);
  unlink(file);
  // A directory without config.json: an I/O error naming the file looked for.
  assert_int_equal(tpr_model_config_load(dir, &c), TPR_ERR_IO);
  assert_non_null(strstr(tpr_last_error(), "config.json"));
  rmdir(dir);
}

static void test_tiny_configs(void **state) {
  tpr_model_config c;
  TT_OK(tpr_model_config_load(config_path("minimax_m2_tiny.json"), &c));
  assert_int_equal(c.num_layers, 2);
  assert_int_equal(c.hidden_size, 64);
  assert_int_equal(c.num_heads, 6);
  assert_int_equal(c.num_kv_heads, 2);
  assert_int_equal(c.head_dim, 16);
  assert_int_equal(c.rotary_dim, 8);
  assert_int_equal(c.num_experts, 8);
  assert_int_equal(c.experts_per_tok, 2);
  assert_int_equal(c.moe_intermediate_size, 32);
  assert_int_equal(c.vocab_size, 256);

  TT_OK(tpr_model_config_load(config_path("qwen3_moe_tiny.json"), &c));
  assert_int_equal(c.family, TPR_FAMILY_QWEN3_MOE);
  assert_int_equal(c.qk_norm, TPR_QK_NORM_PER_HEAD);
  assert_int_equal(c.router, TPR_ROUTER_SOFTMAX);
  assert_false(c.routing_bias);
  assert_true(c.norm_topk_prob);
  assert_int_equal(c.num_layers, 4);
  assert_int_equal(c.num_moe_layers, 3);  // mlp_only_layers [0]
  assert_int_equal(c.dense_intermediate_size, 96);
  assert_int_equal(c.moe_intermediate_size, 32);
  assert_int_equal(c.rotary_dim, 16);  // Qwen3 rotates the whole head
  assert_true(c.rope_theta == 1e6);
}

// Parses the real config with one edit applied: `key` set to the JSON value
// `value` (NULL deletes it), inside "rope_parameters" when nested.
static tpr_status parse_edited(const char *base, const char *key, const char *value, tpr_model_config *c) {
  char *text = tt_slurp(config_path(base), NULL);
  cJSON *root = cJSON_Parse(text);
  free(text);
  assert_non_null(root);
  cJSON *obj = root;
  if (strncmp(key, "rope_parameters.", 16) == 0) {
    obj = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (!obj) obj = cJSON_AddObjectToObject(root, "rope_parameters");
    key += 16;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
  if (value) {
    cJSON *v = cJSON_Parse(value);
    assert_non_null(v);
    cJSON_AddItemToObject(obj, key, v);
  }
  char *edited = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  tpr_status rc = tpr_model_config_parse(edited, strlen(edited), "edited.json", c);
  free(edited);
  return rc;
}

static void test_rotary_and_rope_spellings(void **state) {
  tpr_model_config c;
  // Only the factor: rotary_dim = head_dim * factor.
  char *text = tt_slurp(config_path("minimax_m2.json"), NULL);
  cJSON *root = cJSON_Parse(text);
  free(text);
  cJSON_DeleteItemFromObjectCaseSensitive(root, "rotary_dim");
  cJSON_AddNumberToObject(root, "partial_rotary_factor", 0.25);
  char *s = cJSON_PrintUnformatted(root);
  TT_OK(tpr_model_config_parse(s, strlen(s), "factor.json", &c));
  assert_int_equal(c.rotary_dim, 32);
  free(s);
  // Transformers v5: theta and factor inside rope_parameters.
  cJSON_DeleteItemFromObjectCaseSensitive(root, "partial_rotary_factor");
  cJSON_DeleteItemFromObjectCaseSensitive(root, "rope_theta");
  cJSON *rope = cJSON_AddObjectToObject(root, "rope_parameters");
  cJSON_AddStringToObject(rope, "rope_type", "default");
  cJSON_AddNumberToObject(rope, "rope_theta", 1234.5);
  cJSON_AddNumberToObject(rope, "partial_rotary_factor", 0.5);
  s = cJSON_PrintUnformatted(root);
  TT_OK(tpr_model_config_parse(s, strlen(s), "v5.json", &c));
  assert_int_equal(c.rotary_dim, 64);
  assert_true(c.rope_theta == 1234.5);
  free(s);
  cJSON_Delete(root);
  // Both given and consistent; null means "default" as HF reads None.
  TT_OK(parse_edited("minimax_m2.json", "partial_rotary_factor", "0.5", &c));
  assert_int_equal(c.rotary_dim, 64);
  TT_OK(parse_edited("minimax_m2.json", "rope_theta", "null", &c));
  assert_true(c.rope_theta == 5e6);
  TT_OK(parse_edited("minimax_m2.json", "use_qk_norm", "false", &c));
  assert_int_equal(c.qk_norm, TPR_QK_NORM_NONE);
  TT_OK(parse_edited("minimax_m2.json", "tie_word_embeddings", "true", &c));
  assert_true(c.tie_word_embeddings);
}

typedef struct bad_case {
  const char *key, *value;  // edit applied to the real config (value NULL: delete)
  const char *needle;       // besides the key, the message must contain this
  tpr_status want;
} bad_case;

static void test_bad_configs(void **state) {
  static const bad_case cases[] = {
      // Missing required keys.
      {"model_type", NULL, "missing", TPR_ERR_FORMAT},
      {"vocab_size", NULL, "missing", TPR_ERR_FORMAT},
      {"hidden_size", NULL, "missing", TPR_ERR_FORMAT},
      {"intermediate_size", NULL, "missing", TPR_ERR_FORMAT},
      {"num_hidden_layers", NULL, "missing", TPR_ERR_FORMAT},
      {"num_attention_heads", NULL, "missing", TPR_ERR_FORMAT},
      {"num_key_value_heads", NULL, "missing", TPR_ERR_FORMAT},
      {"head_dim", NULL, "missing", TPR_ERR_FORMAT},
      {"rotary_dim", NULL, "missing", TPR_ERR_FORMAT},
      {"num_local_experts", NULL, "missing", TPR_ERR_FORMAT},
      {"num_experts_per_tok", NULL, "missing", TPR_ERR_FORMAT},
      {"hidden_size", "null", "missing", TPR_ERR_FORMAT},
      // Unknown or not-yet-supported families.
      {"model_type", "\"llama\"", "llama", TPR_ERR_FORMAT},
      {"model_type", "\"qwen2_moe\"", "qwen2_moe", TPR_ERR_FORMAT},
      // Wrong JSON types.
      {"model_type", "3", "string", TPR_ERR_FORMAT},
      {"hidden_size", "\"3072\"", "integer", TPR_ERR_FORMAT},
      {"hidden_size", "3072.5", "integer", TPR_ERR_FORMAT},
      {"num_key_value_heads", "[8]", "integer", TPR_ERR_FORMAT},
      {"rope_theta", "\"5e6\"", "number", TPR_ERR_FORMAT},
      {"rms_norm_eps", "true", "number", TPR_ERR_FORMAT},
      {"use_qk_norm", "1", "true or false", TPR_ERR_FORMAT},
      {"use_routing_bias", "\"yes\"", "true or false", TPR_ERR_FORMAT},
      {"tie_word_embeddings", "0", "true or false", TPR_ERR_FORMAT},
      {"scoring_func", "1", "string", TPR_ERR_FORMAT},
      {"qk_norm_type", "{}", "string", TPR_ERR_FORMAT},
      {"rope_parameters", "[]", "object", TPR_ERR_FORMAT},
      {"rope_parameters.rope_theta", "\"x\"", "must be a number", TPR_ERR_FORMAT},
      {"rope_parameters.rope_theta", "10000", "disagrees", TPR_ERR_FORMAT},
      {"rope_parameters.partial_rotary_factor", "0.25", "disagrees", TPR_ERR_FORMAT},
      // Inconsistent or out-of-range values.
      {"num_key_value_heads", "7", "must divide", TPR_ERR_FORMAT},
      {"num_key_value_heads", "96", "must divide", TPR_ERR_FORMAT},
      {"rotary_dim", "130", "at most", TPR_ERR_FORMAT},
      {"rotary_dim", "63", "even", TPR_ERR_FORMAT},
      {"partial_rotary_factor", "0.25", "disagrees", TPR_ERR_FORMAT},
      {"partial_rotary_factor", "1.5", "(0, 1]", TPR_ERR_FORMAT},
      {"num_experts_per_tok", "257", "exceeds", TPR_ERR_FORMAT},
      {"num_experts_per_tok", "0", "positive", TPR_ERR_FORMAT},
      {"hidden_size", "0", "positive", TPR_ERR_FORMAT},
      {"hidden_size", "-3072", "positive", TPR_ERR_FORMAT},
      {"vocab_size", "0", "positive", TPR_ERR_FORMAT},
      {"num_hidden_layers", "-1", "positive", TPR_ERR_FORMAT},
      {"num_attention_heads", "0", "positive", TPR_ERR_FORMAT},
      {"head_dim", "0", "positive", TPR_ERR_FORMAT},
      {"intermediate_size", "0", "positive", TPR_ERR_FORMAT},
      {"num_local_experts", "0", "positive", TPR_ERR_FORMAT},
      {"hidden_size", "1e12", "at most", TPR_ERR_FORMAT},
      {"rope_theta", "0", "positive", TPR_ERR_FORMAT},
      {"rms_norm_eps", "0", "(0, 1)", TPR_ERR_FORMAT},
      {"scoring_func", "\"relu\"", "relu", TPR_ERR_FORMAT},
      {"qk_norm_type", "\"per_token\"", "per_token", TPR_ERR_FORMAT},
      {"shared_intermediate_size", "512", "shared expert", TPR_ERR_UNSUPPORTED},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const bad_case *b = &cases[i];
    tpr_model_config c;
    tpr_clear_error();
    tpr_status rc = parse_edited("minimax_m2.json", b->key, b->value, &c);
    const char *msg = tpr_last_error();
    const char *bare_key = strchr(b->key, '.') ? strchr(b->key, '.') + 1 : b->key;
    if (rc != b->want || !strstr(msg, bare_key) || !strstr(msg, b->needle) || !strstr(msg, "edited.json"))
      fail_msg("%s = %s: got %s \"%s\", want %s naming the key, the file and \"%s\"", b->key,
               b->value ? b->value : "(deleted)", tpr_status_name(rc), msg, tpr_status_name(b->want), b->needle);
  }
}

static void test_bad_files(void **state) {
  tpr_model_config c;
  assert_int_equal(tpr_model_config_load("/nonexistent/config.json", &c), TPR_ERR_IO);
  assert_non_null(strstr(tpr_last_error(), "/nonexistent/config.json"));
  char path[4200];
  snprintf(path, sizeof path, "%s/bad.json", tmp_dir);
  static const char *const texts[] = {"{\"model_type\": \"minimax_m2\", ", "[1, 2]", "", "null"};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    tt_spit(path, texts[i], strlen(texts[i]));
    assert_int_equal(tpr_model_config_load(path, &c), TPR_ERR_FORMAT);
    assert_non_null(strstr(tpr_last_error(), "JSON"));
    assert_non_null(strstr(tpr_last_error(), path));
  }
  // Through the file loader, a semantic error names the file too.
  const char *bare = "{\"model_type\": \"minimax_m2\", \"vocab_size\": 10}";
  tt_spit(path, bare, strlen(bare));
  assert_int_equal(tpr_model_config_load(path, &c), TPR_ERR_FORMAT);
  assert_non_null(strstr(tpr_last_error(), path));
  assert_non_null(strstr(tpr_last_error(), "hidden_size"));
  unlink(path);
}

static void test_qwen3_bad(void **state) {
  tpr_model_config c;
  static const bad_case cases[] = {
      {"moe_intermediate_size", NULL, "missing", TPR_ERR_FORMAT},
      {"num_experts", NULL, "missing", TPR_ERR_FORMAT},
      {"intermediate_size", NULL, "missing", TPR_ERR_FORMAT},  // needed: layer 0 is dense
      {"mlp_only_layers", "[7]", "layer indices", TPR_ERR_FORMAT},
      {"mlp_only_layers", "3", "array", TPR_ERR_FORMAT},
      {"decoder_sparse_step", "0", ">= 1", TPR_ERR_FORMAT},
      {"norm_topk_prob", "\"true\"", "true or false", TPR_ERR_FORMAT},
      {"num_experts_per_tok", "9", "exceeds", TPR_ERR_FORMAT},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const bad_case *b = &cases[i];
    tpr_status rc = parse_edited("qwen3_moe_tiny.json", b->key, b->value, &c);
    const char *msg = tpr_last_error();
    if (rc != b->want || !strstr(msg, b->key) || !strstr(msg, b->needle))
      fail_msg("qwen3 %s = %s: got %s \"%s\"", b->key, b->value ? b->value : "(deleted)", tpr_status_name(rc), msg);
  }
  // decoder_sparse_step 2 with no mlp_only_layers: layers 1 and 3 are sparse.
  TT_OK(parse_edited("qwen3_moe_tiny.json", "mlp_only_layers", NULL, &c));
  assert_int_equal(c.num_moe_layers, 4);
  TT_OK(parse_edited("qwen3_moe_tiny.json", "decoder_sparse_step", "2", &c));
  assert_int_equal(c.num_moe_layers, 2);  // layers 1 and 3; layer 0 is dense anyway
  // head_dim falls back to hidden / heads (64 / 4) as Qwen3 does.
  TT_OK(parse_edited("qwen3_moe_tiny.json", "head_dim", NULL, &c));
  assert_int_equal(c.head_dim, 16);
}

static int cleanup(void **state) { return rmdir(tmp_dir) == 0 ? 0 : -1; }

int main(void) {
  tt_seed_from_env();
  tt_configs_dir(configs_dir, sizeof configs_dir);  // or $TPR_CONFIGS_DIR
  if (!mkdtemp(tmp_dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_real_minimax_m2),
      cmocka_unit_test(test_tiny_configs),
      cmocka_unit_test(test_rotary_and_rope_spellings),
      cmocka_unit_test(test_bad_configs),
      cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_qwen3_bad),
  };
  return cmocka_run_group_tests(tests, NULL, cleanup);
}
