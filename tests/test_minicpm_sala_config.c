// MiniCPM-SALA's config.json (shard/model_config_sala.c): the published
// config (configs/minicpm_sala.json, without its quantization block) and the
// reference's tiny one (tests/fixtures/minicpm_sala_tiny) parse to the
// numbers docs/minicpm-sala.md states; what is not implemented is refused by
// name; the engine finds its family, and the published config plans at tp
// 1/2/4/8 (lightning heads whole per rank, sparse KV heads sharded or
// replicated).
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/family.h"
#include "shard/shard_plan.h"
#include "shard/model_config.h"

#ifndef TPR_FIXTURES
#define TPR_FIXTURES "tests/fixtures"
#endif

static char configs_dir[4096];

static void test_published(void **state) {
  (void)state;
  tpr_model_config c;
  TT_OK(tpr_model_config_load(tt_path(configs_dir, "minicpm_sala.json"), &c));
  assert_int_equal(c.family, TPR_FAMILY_MINICPM_SALA);
  assert_string_equal(tpr_model_family_name(c.family), "minicpm_sala");
  assert_int_equal(c.num_layers, 32);
  assert_int_equal(c.num_heads, 32);
  assert_int_equal(c.num_kv_heads, 2);
  assert_int_equal(c.linear_kv_heads, 32);
  assert_int_equal(c.head_dim, 128);
  assert_int_equal(c.dense_intermediate_size, 16384);
  assert_int_equal(c.num_experts, 0);
  assert_int_equal(c.num_linear_layers, 24);
  const int sparse[] = {0, 9, 16, 17, 22, 29, 30, 31};  // the list
  for (int l = 0, i = 0; l < 32; l++) {
    const bool is_sparse = i < 8 && sparse[i] == l;
    assert_int_equal(tpr_model_config_layer_is_linear(&c, l), !is_sparse);
    i += is_sparse;
  }
  assert_true(c.linear_alibi_slopes && c.linear_rope && c.linear_qk_norm && c.linear_out_norm && c.linear_out_gate);
  assert_true(c.attn_nope && c.attn_out_gate);
  assert_true(c.embed_scale == 12.0);
  assert_true(fabs(c.residual_scale - 1.4 / sqrt(32.0)) < 1e-15);
  assert_true(c.logit_divisor == 16.0);  // 4096 / 256
  assert_int_equal(c.sparse_kernel_size, 32);
  assert_int_equal(c.sparse_kernel_stride, 16);
  assert_int_equal(c.sparse_block_size, 64);
  assert_int_equal(c.sparse_topk, 64);
  assert_int_equal(c.sparse_init_blocks, 1);
  assert_int_equal(c.sparse_window_size, 2048);
  assert_int_equal(c.sparse_dense_len, 8192);
  assert_false(c.tie_word_embeddings);
  const tpr_family *f;
  TT_OK(tpr_family_find(c.family, &f));
  assert_string_equal(f->name, "minicpm_sala");
  for (int tp = 1; tp <= 8; tp *= 2) {
    tpr_shard_plan p;
    TT_OK(tpr_shard_plan_build(&c, tp, 1, 1, 1, TPR_BF16, &p));
    // 2 sparse KV heads: sharded up to tp 2, replicated beyond.
    assert_int_equal(p.attn.strategy, tp <= 2 ? TPR_KV_SHARD : TPR_KV_REPLICATE);
    int lin = 0, sm = 0;
    for (int i = 0; i < p.n_tensors; i++) {
      lin += p.tensors[i].attn_layers == TPR_ATTN_LAYERS_LINEAR;
      sm += p.tensors[i].attn_layers == TPR_ATTN_LAYERS_SOFTMAX;
      if (p.tensors[i].attn_layers == TPR_ATTN_LAYERS_LINEAR) assert_int_equal(p.tensors[i].count, 24);
      if (p.tensors[i].attn_layers == TPR_ATTN_LAYERS_SOFTMAX) assert_int_equal(p.tensors[i].count, 8);
    }
    assert_int_equal(lin, 8);  // q, k, v, o, q_norm, k_norm, o_norm, z
    assert_int_equal(sm, 5);   // q, k, v, o, o_gate
    tpr_shard_plan_free(&p);
  }
}

static void test_tiny_fixture(void **state) {
  (void)state;
  tpr_model_config c;
  TT_OK(tpr_model_config_load(TPR_FIXTURES "/minicpm_sala_tiny", &c));
  assert_int_equal(c.num_layers, 4);
  assert_int_equal(c.num_linear_layers, 2);
  assert_int_equal(c.linear_kv_heads, 2);
  assert_true(c.logit_divisor == 4.0);  // 32 / 8
  assert_int_equal(c.sparse_block_size, 8);
  assert_int_equal(c.sparse_dense_len, 48);
}

// The published config with key set to the JSON `value` (NULL: deleted), in sparse_config when nested.
static tpr_status edited(const char *key, const char *value, tpr_model_config *c) {
  char *text = tt_slurp(tt_path(configs_dir, "minicpm_sala.json"), NULL);
  cJSON *root = cJSON_Parse(text), *obj = root;
  free(text);
  if (!strncmp(key, "sparse_config.", 14)) obj = cJSON_GetObjectItemCaseSensitive(root, "sparse_config"), key += 14;
  cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
  if (value) cJSON_AddItemToObject(obj, key, cJSON_Parse(value));
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  tpr_status rc = tpr_model_config_parse(s, strlen(s), "edited.json", c);
  free(s);
  return rc;
}

static void test_refusals(void **state) {
  (void)state;
  static const struct {
    const char *key, *value, *says;
    tpr_status rc;
  } cases[] = {
      {"lightning_nh", "16", "lightning_nh", TPR_ERR_UNSUPPORTED},
      {"lightning_head_dim", "64", "lightning_head_dim", TPR_ERR_UNSUPPORTED},
      {"lightning_nkv", "5", "lightning_nkv", TPR_ERR_FORMAT},
      {"attn_use_rope", "true", "attn_use_rope", TPR_ERR_UNSUPPORTED},
      {"lightning_scale", "\"1/d\"", "lightning_scale", TPR_ERR_UNSUPPORTED},
      {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2}", "rope_scaling", TPR_ERR_UNSUPPORTED},
      {"hidden_act", "\"gelu\"", "hidden_act", TPR_ERR_UNSUPPORTED},
      {"scale_depth", NULL, "scale_depth", TPR_ERR_FORMAT},
      {"dim_model_base", "0", "dim_model_base", TPR_ERR_FORMAT},
      {"mixer_types", "[\"minicpm4\"]", "mixer_types", TPR_ERR_FORMAT},
      {"head_dim", "64", "head_dim", TPR_ERR_UNSUPPORTED},
      {"sparse_config.use_nope", "true", "use_nope", TPR_ERR_UNSUPPORTED},
      {"sparse_config.kernel_size", "40", "kernel_stride", TPR_ERR_UNSUPPORTED},
      {"sparse_config.block_size", "0", "block_size", TPR_ERR_FORMAT},
      {"sparse_config.topk", "-1", "topk", TPR_ERR_FORMAT},
  };
  tpr_model_config c;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const tpr_status rc = edited(cases[i].key, cases[i].value, &c);
    if (rc != cases[i].rc || !strstr(tpr_last_error(), cases[i].says))
      fail_msg("%s = %s: got %s \"%s\"", cases[i].key, cases[i].value ? cases[i].value : "(deleted)",
               tpr_status_name(rc), tpr_last_error());
  }
  // A mixer name the published code does not know, in a whole list.
  char list[1024] = "[";
  for (int l = 0; l < 32; l++) strcat(list, l == 5 ? "\"linear\"," : "\"minicpm4\",");
  list[strlen(list) - 1] = ']';
  assert_int_equal(edited("mixer_types", list, &c), TPR_ERR_FORMAT);
  assert_non_null(strstr(tpr_last_error(), "mixer_types\"[5]"));
  // sparse_config absent: the modeling code's defaults.
  TT_OK(edited("sparse_config", NULL, &c));
  assert_int_equal(c.sparse_dense_len, 8192);
  assert_int_equal(c.sparse_window_size, 2048);
}

int main(void) {
  tt_configs_dir(configs_dir, sizeof configs_dir);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_published),
      cmocka_unit_test(test_tiny_fixture),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
