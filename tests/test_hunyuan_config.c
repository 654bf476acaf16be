// hunyuan_v1_moe from config.json to the CLI (shard/model_config.c,
// shard/shard_plan.c):
//  - the fixture's config (transformers 5.23's save_pretrained) parses to the
//    fields the builder reads: shared expert of intermediate_size, softmax
//    top-k renormalised, per-head QK-norm after RoPE, every layer MoE; a
//    hub-style per-layer "moe_topk" list of equal values reads the same;
//  - variants refused by name, each message naming its key: RoPE scaling
//    (ntk alpha, rope_scaling), attention_bias, use_cla, per-layer
//    num_experts or differing moe_topk, num_shared_expert != 1,
//    moe_intermediate_size != intermediate_size, use_mixed_mlp_moe false;
//  - the plan at a random tp in {1, 2, 4} holds the shared expert split over
//    tp (S/tp rows) in every layer, and at tp 3 (32 % 3 != 0) is refused;
//  - the CLI: `tpr plan` and `tpr run --prompt-ids` work on the fixture,
//    `tpr train` refuses the family by name before reading any weight.
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "shard/model_config.h"
#include "shard/shard_plan.h"

#define FIX TPR_FIXTURES "/hunyuan_moe_tiny"

static char *base;  // the fixture's config.json
static size_t base_len;

// The fixture's config with `"key": value` inserted after its opening brace
// (cJSON keeps the first of duplicate keys, so this overrides).
static tpr_status parse_with(const char *key, const char *value, tpr_model_config *c) {
  char *json = malloc(base_len + 256);
  snprintf(json, base_len + 256, "{\"%s\": %s, %s", key, value, strchr(base, '{') + 1);
  tpr_status rc = tpr_model_config_parse(json, strlen(json), "test config", c);
  free(json);
  return rc;
}

static void test_parse(void **state) {
  (void)state;
  tpr_model_config c, l;
  TT_OK(tpr_model_config_load(FIX, &c));
  printf("fixture: family %s, %lld layers (%lld MoE), %lld experts top-%lld (width %lld), shared %lld, "
         "qk per-head after RoPE %d, renormalised %d, theta %g\n", tpr_model_family_name(c.family),
         (long long)c.num_layers, (long long)c.num_moe_layers, (long long)c.num_experts, (long long)c.experts_per_tok,
         (long long)c.moe_intermediate_size, (long long)c.shared_expert_intermediate_size,
         c.qk_norm == TPR_QK_NORM_PER_HEAD && c.qk_norm_after_rope, c.norm_topk_prob, c.rope_theta);
  assert_int_equal(c.family, TPR_FAMILY_HUNYUAN_V1_MOE);
  assert_int_equal(c.num_experts, 8);
  assert_int_equal(c.experts_per_tok, 2);
  assert_int_equal(c.moe_intermediate_size, 32);
  assert_int_equal(c.shared_expert_intermediate_size, 32);
  assert_int_equal(c.num_moe_layers, c.num_layers);
  assert_int_equal(c.head_dim, 8);
  assert_int_equal(c.rotary_dim, 8);
  assert_true(c.qk_norm == TPR_QK_NORM_PER_HEAD && c.qk_norm_after_rope && c.norm_topk_prob);
  assert_true(c.router == TPR_ROUTER_SOFTMAX && !c.routing_bias);
  TT_OK(parse_with("moe_topk", "[2, 2, 2]", &l));  // the hub's per-layer spelling
  assert_int_equal(l.experts_per_tok, 2);
}

static void test_refused(void **state) {
  (void)state;
  static const struct {
    const char *key, *value, *needle;
    tpr_status want;
  } cases[] = {
      {"rope_parameters", "{\"rope_type\": \"dynamic\", \"alpha\": 1000.0, \"rope_theta\": 10000.0}", "dynamic",
       TPR_ERR_UNSUPPORTED},
      {"rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}", "rope_scaling", TPR_ERR_UNSUPPORTED},
      {"attention_bias", "true", "attention_bias", TPR_ERR_UNSUPPORTED},
      {"use_cla", "true", "use_cla", TPR_ERR_UNSUPPORTED},
      {"num_experts", "[8, 8, 8]", "num_experts", TPR_ERR_UNSUPPORTED},
      {"moe_topk", "[2, 1, 2]", "moe_topk", TPR_ERR_UNSUPPORTED},
      {"num_shared_expert", "2", "num_shared_expert", TPR_ERR_UNSUPPORTED},
      {"moe_intermediate_size", "16", "moe_intermediate_size", TPR_ERR_UNSUPPORTED},
      {"use_mixed_mlp_moe", "false", "use_mixed_mlp_moe", TPR_ERR_UNSUPPORTED},
      {"moe_topk", "9", "exceeds", TPR_ERR_FORMAT},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tpr_model_config c;
    tpr_status rc = parse_with(cases[i].key, cases[i].value, &c);
    const char *msg = tpr_last_error();
    printf("  %s = %s -> %s: %s\n", cases[i].key, cases[i].value, tpr_status_name(rc), msg);
    assert_int_equal(rc, cases[i].want);
    assert_non_null(strstr(msg, cases[i].needle));
  }
}

static void test_plan(void **state) {
  (void)state;
  tpr_model_config c;
  tpr_shard_plan p;
  TT_OK(tpr_model_config_load(FIX, &c));
  int tp = 1 << tt_randint(0, 2);
  TT_OK(tpr_shard_plan_build(&c, tp, 1, tp, 1, TPR_F32, &p));
  int shared = 0;
  for (int i = 0; i < p.n_tensors; i++)
    if (strstr(p.tensors[i].name, "shared_mlp")) {
      const tpr_shard_tensor *t = &p.tensors[i];
      bool down = strstr(t->name, "down_proj") != NULL;
      assert_int_equal(t->count, c.num_layers);
      assert_true(t->moe_layers);
      assert_int_equal(down ? t->rank_shape[1] : t->rank_shape[0], 32 / tp);
      shared++;
    }
  printf("plan tp %d: %d shared-expert kinds of %lld tensors each, width 32 -> %d per rank\n", tp, shared,
         (long long)c.num_layers, 32 / tp);
  assert_int_equal(shared, 3);
  tpr_shard_plan_free(&p);
  assert_int_equal(tpr_shard_plan_build(&c, 3, 1, 1, 1, TPR_F32, &p), TPR_ERR_INVALID_ARG);
  printf("plan tp 3: %s\n", tpr_last_error());
  assert_non_null(strstr(tpr_last_error(), "shared expert"));
}

static void test_cli(void **state) {
  (void)state;
  char tpr[4096], tmp[] = "/tmp/tpr_hunyuan_cli_XXXXXX";
  if (tt_tpr_path(tpr, sizeof tpr, "test_hunyuan_config") != 0) skip();
  assert_non_null(mkdtemp(tmp));
  run_result r = tt_run_tpr(tpr, tmp, (const char *const[]){"plan", "--model", FIX, "--tp", "2", NULL});
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.out, "shared_mlp.down_proj"));
  tt_run_done(&r);
  r = tt_run_tpr(tpr, tmp, (const char *const[]){"run", "--model", FIX, "--prompt-ids", "1,2,3", "--max-new-tokens",
                                                  "4", NULL});
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.out, "generated:"));
  tt_run_done(&r);
  r = tt_run_tpr(tpr, tmp, (const char *const[]){"train", "--model", FIX, "--data", "/dev/null", "--steps", "1", NULL});
  // The family trains (tests/test_train_family.c): the run gets past the
  // family and fails on the data file.
  printf("tpr plan, run: exit 0; tpr train on /dev/null: exit %d: %s", r.code, r.err);
  assert_int_not_equal(r.code, 0);
  assert_null(strstr(r.err, "runs inference only"));
  assert_non_null(strstr(r.err, "/dev/null: not a regular file"));
  tt_run_done(&r);
  unlink(tt_path(tmp, "stdout"));
  unlink(tt_path(tmp, "stderr"));
  rmdir(tmp);
}

int main(void) {
  tt_seed_from_env();
  base = tt_slurp(FIX "/config.json", &base_len);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_plan),
      cmocka_unit_test(test_cli),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  free(base);
  return failed;
}
