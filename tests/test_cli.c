// The tpr command-line tool, run as a subprocess (bin/tpr beside this test's
// binary), without mpirun: a world of one on the self backend. Exit codes are
// the contract: 0 success, 1 failure, 2 usage error, never a signal. Output
// goes to temp files; JSON output is parsed with cJSON. In the sanitizer
// build the CLI is instrumented too, so every run also checks that stderr
// carries no sanitizer report.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_cli_XXXXXX";

#define RUN(...) tt_run_tpr(tpr_path, tmp_dir, (const char *const[]){__VA_ARGS__, NULL})

static void expect_exit(const run_result *r, int code) {
  if (r->code != code) fail_msg("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r->code, code, r->out, r->err);
}

static void expect_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("expected '%s' in:\n%s", needle, hay);
}

static cJSON *parse_json(const char *text) {
  cJSON *j = cJSON_Parse(text);
  if (!j || !cJSON_IsObject(j)) fail_msg("not a JSON object:\n%s", text);
  return j;
}

static double json_num(const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v)) fail_msg("JSON key '%s' missing or not a number", key);
  return v->valuedouble;
}

static const char *json_str(const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsString(v)) fail_msg("JSON key '%s' missing or not a string", key);
  return v->valuestring;
}

static void test_help_and_usage(void **state) {
  run_result r = RUN("--help");
  expect_exit(&r, 0);
  expect_contains(r.out, "usage: tpr");
  expect_contains(r.out, "mlp");
  expect_contains(r.out, "program");
  tt_run_done(&r);
  r = tt_run_tpr(tpr_path, tmp_dir, (const char *const[]){NULL});
  expect_exit(&r, 2);
  expect_contains(r.err, "usage: tpr");
  assert_string_equal(r.out, "");
  tt_run_done(&r);
  r = RUN("frobnicate");
  expect_exit(&r, 2);
  expect_contains(r.err, "unknown command 'frobnicate'");
  tt_run_done(&r);
  r = RUN("mlp", "--help");
  expect_exit(&r, 0);
  expect_contains(r.out, "--config");
  expect_contains(r.out, "--json");
  tt_run_done(&r);
  r = RUN("program", "-h");
  expect_exit(&r, 0);
  expect_contains(r.out, "--out");
  tt_run_done(&r);
}

static void test_mlp_json(void **state) {
  run_result r = RUN("mlp", "--json", "--iters", "1");
  expect_exit(&r, 0);
  cJSON *j = parse_json(r.out);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "check_passed")));
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "ranks_agree")));
  assert_string_equal(json_str(j, "command"), "mlp");
  assert_true(json_num(j, "world_size") == 1);
  assert_true(json_num(j, "tp") == 1);
  assert_true(json_num(j, "hidden_size") == 256);
  assert_true(json_num(j, "tokens") == 64);
  double arena = json_num(j, "arena_bytes"), naive = json_num(j, "naive_bytes");
  assert_true(arena > 0 && arena < naive);
  assert_true(json_num(j, "max_rel_err_vs_tp1") < 1e-5);
  assert_int_equal(strlen(json_str(j, "program_hash")), 16);
  // The mlp command runs the same default program that `tpr program` builds.
  run_result p = RUN("program", "--json");
  expect_exit(&p, 0);
  cJSON *pj = parse_json(p.out);
  assert_string_equal(json_str(pj, "hash"), json_str(j, "program_hash"));
  assert_true(json_num(pj, "bytes") == json_num(j, "program_bytes"));
  cJSON_Delete(pj);
  tt_run_done(&p);
  cJSON_Delete(j);
  tt_run_done(&r);
  // Overrides reach the run.
  char tokens[32];
  snprintf(tokens, sizeof tokens, "%lld", (long long)tt_randint(1, 40));
  r = RUN("mlp", "--json", "--iters", "0", "--tokens", tokens);
  expect_exit(&r, 0);
  j = parse_json(r.out);
  assert_true(json_num(j, "tokens") == atof(tokens));
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "check_passed")));
  cJSON_Delete(j);
  tt_run_done(&r);
}

static void test_mlp_bad_args(void **state) {
  static const char *const bad[][3] = {
      {"--tokens", "abc", "not a valid size"}, {"--tokens", "12x", "not a valid size"},
      {"--tokens", NULL, "needs a value"},        {"--bogus", NULL, "unknown option '--bogus'"},
      {"--json=1", NULL, "takes no value"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    run_result r = bad[i][1] ? RUN("mlp", bad[i][0], bad[i][1]) : RUN("mlp", bad[i][0]);
    expect_exit(&r, 2);
    expect_contains(r.err, bad[i][2]);
    tt_run_done(&r);
  }
  // --tp other than the world size is refused with a reason, not a crash.
  run_result r = RUN("mlp", "--tp", "2");
  expect_exit(&r, 1);
  expect_contains(r.err, "--tp 2");
  tt_run_done(&r);
}

static void test_mlp_configs(void **state) {
  run_result r = RUN("mlp", "--config", "/nonexistent.json");
  expect_exit(&r, 1);
  expect_contains(r.err, "/nonexistent.json");
  tt_run_done(&r);
  r = RUN("mlp", "--config", tmp_dir);  // a directory is not a config
  expect_exit(&r, 1);
  expect_contains(r.err, tmp_dir);
  tt_run_done(&r);

  long long H = tt_randint(4, 48), F = 4 * tt_randint(1, 24), T = tt_randint(1, 16);
  char text[512];
  const char *missing = tt_path(tmp_dir, "missing.json");
  snprintf(text, sizeof text, "{\"intermediate_size\": %lld, \"tokens\": %lld, \"rms_norm_eps\": 1e-5}", F, T);
  tt_spit(missing, text, strlen(text));
  r = RUN("mlp", "--config", missing);
  expect_exit(&r, 1);
  expect_contains(r.err, "hidden_size");
  expect_contains(r.err, missing);
  tt_run_done(&r);

  const char *malformed = tt_path(tmp_dir, "malformed.json");
  snprintf(text, sizeof text, "{\"hidden_size\": %lld, \"intermediate_size\": ", H);
  tt_spit(malformed, text, strlen(text));
  r = RUN("mlp", "--config", malformed);
  expect_exit(&r, 1);
  expect_contains(r.err, "JSON");
  expect_contains(r.err, malformed);
  tt_run_done(&r);

  const char *bad_value = tt_path(tmp_dir, "bad_value.json");
  snprintf(text, sizeof text,
           "{\"hidden_size\": %lld.5, \"intermediate_size\": %lld, \"tokens\": %lld, \"rms_norm_eps\": 1e-5}", H, F, T);
  tt_spit(bad_value, text, strlen(text));
  r = RUN("mlp", "--config", bad_value);
  expect_exit(&r, 1);
  expect_contains(r.err, "positive integer");
  tt_run_done(&r);

  const char *good = tt_path(tmp_dir, "good.json");
  snprintf(text, sizeof text,
           "{\"hidden_size\": %lld, \"intermediate_size\": %lld, \"tokens\": %lld, \"rms_norm_eps\": 1e-5}", H, F, T);
  tt_spit(good, text, strlen(text));
  r = RUN("mlp", "--config", good, "--json", "--iters", "1");
  expect_exit(&r, 0);
  cJSON *j = parse_json(r.out);
  assert_true(json_num(j, "hidden_size") == (double)H);
  assert_true(json_num(j, "intermediate_size") == (double)F);
  assert_true(json_num(j, "tokens") == (double)T);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "check_passed")));
  cJSON_Delete(j);
  tt_run_done(&r);
}

static void test_program_round_trip(void **state) {
  const char *file = tt_path(tmp_dir, "block.tprp");
  run_result a = RUN("program", "--json", "--out", file);
  expect_exit(&a, 0);
  cJSON *ja = parse_json(a.out);
  assert_true(json_num(ja, "values") > 0);
  assert_true(json_num(ja, "nodes") > 0);
  assert_true(json_num(ja, "nodes") < json_num(ja, "values"));
  assert_int_equal(strlen(json_str(ja, "hash")), 16);
  size_t len;
  free(tt_slurp(file, &len));
  assert_true(json_num(ja, "bytes") == (double)len);
  run_result b = RUN("program", "--in", file, "--json");
  expect_exit(&b, 0);
  cJSON *jb = parse_json(b.out);
  assert_string_equal(json_str(jb, "hash"), json_str(ja, "hash"));
  assert_true(json_num(jb, "values") == json_num(ja, "values"));
  assert_true(json_num(jb, "nodes") == json_num(ja, "nodes"));
  assert_true(json_num(jb, "arena_bytes") == json_num(ja, "arena_bytes"));
  // A program built for another tp is another program.
  run_result c = RUN("program", "--json", "--tp", "2");
  expect_exit(&c, 0);
  cJSON *jc = parse_json(c.out);
  assert_string_not_equal(json_str(jc, "hash"), json_str(ja, "hash"));
  cJSON_Delete(ja), cJSON_Delete(jb), cJSON_Delete(jc);
  tt_run_done(&a), tt_run_done(&b), tt_run_done(&c);
  // The text listing names the hash too.
  run_result d = RUN("program", "--in", file, "--summary");
  expect_exit(&d, 0);
  expect_contains(d.out, "hash");
  tt_run_done(&d);
  run_result e = RUN("program", "--in", "/nonexistent.tprp");
  expect_exit(&e, 1);
  expect_contains(e.err, "/nonexistent.tprp");
  tt_run_done(&e);
}

static void test_program_corrupt(void **state) {
  const char *file = tt_path(tmp_dir, "good.tprp"), *bad = tt_path(tmp_dir, "bad.tprp");
  run_result r = RUN("program", "--summary", "--out", file);
  expect_exit(&r, 0);
  tt_run_done(&r);
  size_t len;
  unsigned char *bytes = (unsigned char *)tt_slurp(file, &len);
  assert_true(len > 16);
  run_result orig = RUN("program", "--in", file, "--json");
  expect_exit(&orig, 0);
  cJSON *jo = parse_json(orig.out);
  // Every truncation fails cleanly with exit 1: the stored value and node
  // counts come last, so even a cut at a field boundary is detected.
  size_t cuts[] = {0, 1, len - 1, len / 2, (size_t)tt_randint(2, (int64_t)len - 2)};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    tt_spit(bad, bytes, cuts[i]);
    r = RUN("program", "--in", bad, "--json");
    if (r.code != 1) fail_msg("truncated to %zu of %zu bytes: exit %d\n%s", cuts[i], len, r.code, r.err);
    expect_contains(r.err, "tpr program: error: ");
    assert_string_equal(r.out, "");
    tt_run_done(&r);
  }
  cJSON_Delete(jo);
  tt_run_done(&orig);
  unsigned char *garbage = malloc(len);
  for (size_t i = 0; i < len; i++) garbage[i] = (unsigned char)tt_next_u64();
  garbage[0] = 0xff;  // wire type 7 (low bits of the first tag byte): never valid protobuf
  tt_spit(bad, garbage, len);
  r = RUN("program", "--in", bad);
  expect_exit(&r, 1);
  expect_contains(r.err, "not a valid serialized program");
  tt_run_done(&r);
  // Random corruption may still decode to a valid program, but must never crash.
  for (int trial = 0; trial < 12; trial++) {
    memcpy(garbage, bytes, len);
    int flips = (int)tt_randint(1, 4);
    for (int f = 0; f < flips; f++) garbage[tt_randint(0, (int64_t)len - 1)] ^= (unsigned char)(1u << tt_randint(0, 7));
    tt_spit(bad, garbage, len);
    r = RUN("program", "--in", bad, "--json");
    if (r.code != 0 && r.code != 1) fail_msg("corrupt program: exit %d\n%s", r.code, r.err);
    if (r.code == 1) expect_contains(r.err, "tpr program: error: ");
    tt_run_done(&r);
  }
  free(garbage);
  free(bytes);
}

// Sizes on the command line go through runtime/tensor.h's checked helper:
// past 2^50, negative, or products a command multiplies past what fits, each
// is refused with exit 2 and a message naming the option, before anything is
// loaded or allocated. Values are drawn fresh; the control is a size at the
// bound itself, which the parser must pass on (the command then fails later,
// for the missing model, not for the size).
static void test_cli_sizes(void **state) {
  char cfg[4096], here[4096], big[32], neg[32], seq[32], mb[32], bound[32];
  snprintf(here, sizeof here, "%s", __FILE__);
  snprintf(cfg, sizeof cfg, "%s/fixtures/minimax_m2_tiny/config.json", dirname(here));
  snprintf(big, sizeof big, "%lld", (long long)tt_randint((INT64_C(1) << 50) + 1, INT64_MAX));
  snprintf(neg, sizeof neg, "%lld", (long long)-tt_randint(1, INT64_MAX));
  int64_t s = tt_randint(1 << 16, 1 << 20), m = tt_randint((INT32_MAX / s) + 1, (INT64_C(1) << 40) / s);
  snprintf(seq, sizeof seq, "%lld", (long long)s);
  snprintf(mb, sizeof mb, "%lld", (long long)m);
  snprintf(bound, sizeof bound, "%lld", (long long)(INT64_C(1) << 50));
  printf("  too big %s, negative %s, seq-len x micro-batch %s x %s\n", big, neg, seq, mb);
  struct {
    const char *const *argv;
    const char *want;
  } cases[] = {
      {(const char *const[]){"train", "--config", cfg, "--random-init", "--data", "none.npy", "--seq-len", big, NULL},
       "--seq-len"},
      {(const char *const[]){"train", "--config", cfg, "--random-init", "--data", "none.npy", "--seq-len", seq,
                             "--micro-batch", mb, NULL},
       "--seq-len x --micro-batch"},
      {(const char *const[]){"bench", "model", "--config", cfg, "--random-weights", "--batch", mb, "--prompt-len", seq,
                             NULL},
       "--batch x (--prompt-len + --gen-len)"},
      {(const char *const[]){"run", "--model", "none", "--prompt-ids", "1", "--max-new-tokens", neg, NULL},
       "a size cannot be negative"},
      {(const char *const[]){"serve", "--model", "none", "--kv-cache-bytes", big, NULL}, "larger than any size"},
      {(const char *const[]){"eval", "--model", "none", "--data", "none.npy", "--seq-len", "1e3", NULL},
       "is not a valid size"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_result r = tt_run_tpr(tpr_path, tmp_dir, cases[i].argv);
    printf("  %s: exit %d: %s", cases[i].argv[0], r.code, r.err);
    expect_exit(&r, 2);
    expect_contains(r.err, cases[i].want);
    tt_run_done(&r);
  }
  // Control: exactly 2^50 is a size the parser accepts.
  run_result r = RUN("run", "--model", "none", "--prompt-ids", "1", "--max-new-tokens", bound);
  if (r.code == 0 || strstr(r.err, "larger than any size") || strstr(r.err, "cannot be negative"))
    fail_msg("--max-new-tokens 2^50 refused as a size (exit %d):\n%s", r.code, r.err);
  tt_run_done(&r);
}

static int remove_tmp(void **state) {
  static const char *const names[] = {"stdout", "stderr", "missing.json", "malformed.json", "bad_value.json",
                                      "good.json", "block.tprp", "good.tprp", "bad.tprp"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tt_path(tmp_dir, names[i]));
  return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(void) {
  tt_seed_from_env();
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_cli") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_and_usage),
      cmocka_unit_test(test_mlp_json),
      cmocka_unit_test(test_mlp_bad_args),
      cmocka_unit_test(test_mlp_configs),
      cmocka_unit_test(test_program_round_trip),
      cmocka_unit_test(test_program_corrupt),
      cmocka_unit_test(test_cli_sizes),
  };
  return cmocka_run_group_tests(tests, NULL, remove_tmp);
}
