// The tpr command-line tool, run as a subprocess (bin/tpr beside this test's
// binary), without mpirun: a world of one on the self backend. Exit codes are
// the contract: 0 success, 1 failure, 2 usage error, never a signal. Output
// goes to temp files; JSON output is parsed with cJSON. In the sanitizer
// build the CLI is instrumented too, so every run also checks that stderr
// carries no sanitizer report.
#include "test_util.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_cli_XXXXXX";

typedef struct run_result {
  int code;  // exit status, or -signal when killed by one
  char *out, *err;
} run_result;

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = calloc((size_t)n + 1, 1);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  if (len) *len = (size_t)n;
  return buf;
}

static void spit(const char *path, const void *bytes, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, len, f), len);
  fclose(f);
}

static const char *tmp_file(const char *name) {
  static char paths[8][4200];
  static int next;
  char *p = paths[next++ % 8];
  snprintf(p, sizeof paths[0], "%s/%s", tmp_dir, name);
  return p;
}

// Runs tpr with args (NULL-terminated, after argv[0]).
static run_result run_tpr(const char *const *args) {
  const char *argv[32] = {tpr_path};
  int n = 1;
  for (; args[n - 1]; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  char out_path[4200], err_path[4200];
  snprintf(out_path, sizeof out_path, "%s/stdout", tmp_dir);
  snprintf(err_path, sizeof err_path, "%s/stderr", tmp_dir);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int in = open("/dev/null", O_RDONLY);
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || out < 0 || err < 0) _exit(126);
    dup2(in, 0), dup2(out, 1), dup2(err, 2);
    // Not launched by mpirun: the CLI must pick the self backend.
    static const char *const launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                                "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof launcher_vars / sizeof launcher_vars[0]; i++) unsetenv(launcher_vars[i]);
    setenv("TPR_NUM_THREADS", "1", 1);
    unsetenv("TPR_LOG_LEVEL");
    execv(tpr_path, (char *const *)argv);
    _exit(127);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  run_result r = {.code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st)};
  r.out = slurp(out_path, NULL);
  r.err = slurp(err_path, NULL);
  if (strstr(r.err, "Sanitizer") || strstr(r.err, "runtime error:")) {
    fprintf(stderr, "tpr %s: sanitizer report:\n%s\n", args[0] ? args[0] : "", r.err);
    free(r.out), free(r.err);
    fail();
  }
  return r;
}

#define RUN(...) run_tpr((const char *const[]){__VA_ARGS__, NULL})

static void expect_exit(const run_result *r, int code) {
  if (r->code != code) fail_msg("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r->code, code, r->out, r->err);
}

static void expect_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("expected '%s' in:\n%s", needle, hay);
}

static void done(run_result *r) {
  free(r->out);
  free(r->err);
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
  done(&r);
  r = run_tpr((const char *const[]){NULL});
  expect_exit(&r, 2);
  expect_contains(r.err, "usage: tpr");
  assert_string_equal(r.out, "");
  done(&r);
  r = RUN("frobnicate");
  expect_exit(&r, 2);
  expect_contains(r.err, "unknown command 'frobnicate'");
  done(&r);
  r = RUN("mlp", "--help");
  expect_exit(&r, 0);
  expect_contains(r.out, "--config");
  expect_contains(r.out, "--json");
  done(&r);
  r = RUN("program", "-h");
  expect_exit(&r, 0);
  expect_contains(r.out, "--out");
  done(&r);
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
  done(&p);
  cJSON_Delete(j);
  done(&r);
  // Overrides reach the run.
  char tokens[32];
  snprintf(tokens, sizeof tokens, "%lld", (long long)tt_randint(1, 40));
  r = RUN("mlp", "--json", "--iters", "0", "--tokens", tokens);
  expect_exit(&r, 0);
  j = parse_json(r.out);
  assert_true(json_num(j, "tokens") == atof(tokens));
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "check_passed")));
  cJSON_Delete(j);
  done(&r);
}

static void test_mlp_bad_args(void **state) {
  static const char *const bad[][3] = {
      {"--tokens", "abc", "not a valid integer"}, {"--tokens", "12x", "not a valid integer"},
      {"--tokens", NULL, "needs a value"},        {"--bogus", NULL, "unknown option '--bogus'"},
      {"--json=1", NULL, "takes no value"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    run_result r = bad[i][1] ? RUN("mlp", bad[i][0], bad[i][1]) : RUN("mlp", bad[i][0]);
    expect_exit(&r, 2);
    expect_contains(r.err, bad[i][2]);
    done(&r);
  }
  // --tp other than the world size is refused with a reason, not a crash.
  run_result r = RUN("mlp", "--tp", "2");
  expect_exit(&r, 1);
  expect_contains(r.err, "--tp 2");
  done(&r);
}

static void test_mlp_configs(void **state) {
  run_result r = RUN("mlp", "--config", "/nonexistent.json");
  expect_exit(&r, 1);
  expect_contains(r.err, "/nonexistent.json");
  done(&r);
  r = RUN("mlp", "--config", tmp_dir);  // a directory is not a config
  expect_exit(&r, 1);
  expect_contains(r.err, tmp_dir);
  done(&r);

  long long H = tt_randint(4, 48), F = 4 * tt_randint(1, 24), T = tt_randint(1, 16);
  char text[512];
  const char *missing = tmp_file("missing.json");
  snprintf(text, sizeof text, "{\"intermediate_size\": %lld, \"tokens\": %lld, \"rms_norm_eps\": 1e-5}", F, T);
  spit(missing, text, strlen(text));
  r = RUN("mlp", "--config", missing);
  expect_exit(&r, 1);
  expect_contains(r.err, "hidden_size");
  expect_contains(r.err, missing);
  done(&r);

  const char *malformed = tmp_file("malformed.json");
  snprintf(text, sizeof text, "{\"hidden_size\": %lld, \"intermediate_size\": ", H);
  spit(malformed, text, strlen(text));
  r = RUN("mlp", "--config", malformed);
  expect_exit(&r, 1);
  expect_contains(r.err, "JSON");
  expect_contains(r.err, malformed);
  done(&r);

  const char *bad_value = tmp_file("bad_value.json");
  snprintf(text, sizeof text,
           "{\"hidden_size\": %lld.5, \"intermediate_size\": %lld, \"tokens\": %lld, \"rms_norm_eps\": 1e-5}", H, F, T);
  spit(bad_value, text, strlen(text));
  r = RUN("mlp", "--config", bad_value);
  expect_exit(&r, 1);
  expect_contains(r.err, "positive integer");
  done(&r);

  const char *good = tmp_file("good.json");
  snprintf(text, sizeof text,
           "{\"hidden_size\": %lld, \"intermediate_size\": %lld, \"tokens\": %lld, \"rms_norm_eps\": 1e-5}", H, F, T);
  spit(good, text, strlen(text));
  r = RUN("mlp", "--config", good, "--json", "--iters", "1");
  expect_exit(&r, 0);
  cJSON *j = parse_json(r.out);
  assert_true(json_num(j, "hidden_size") == (double)H);
  assert_true(json_num(j, "intermediate_size") == (double)F);
  assert_true(json_num(j, "tokens") == (double)T);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "check_passed")));
  cJSON_Delete(j);
  done(&r);
}

static void test_program_round_trip(void **state) {
  const char *file = tmp_file("block.tprp");
  run_result a = RUN("program", "--json", "--out", file);
  expect_exit(&a, 0);
  cJSON *ja = parse_json(a.out);
  assert_true(json_num(ja, "values") > 0);
  assert_true(json_num(ja, "nodes") > 0);
  assert_true(json_num(ja, "nodes") < json_num(ja, "values"));
  assert_int_equal(strlen(json_str(ja, "hash")), 16);
  size_t len;
  free(slurp(file, &len));
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
  done(&a), done(&b), done(&c);
  // The text listing names the hash too.
  run_result d = RUN("program", "--in", file, "--summary");
  expect_exit(&d, 0);
  expect_contains(d.out, "hash");
  done(&d);
  run_result e = RUN("program", "--in", "/nonexistent.tprp");
  expect_exit(&e, 1);
  expect_contains(e.err, "/nonexistent.tprp");
  done(&e);
}

static void test_program_corrupt(void **state) {
  const char *file = tmp_file("good.tprp"), *bad = tmp_file("bad.tprp");
  run_result r = RUN("program", "--summary", "--out", file);
  expect_exit(&r, 0);
  done(&r);
  size_t len;
  unsigned char *bytes = (unsigned char *)slurp(file, &len);
  assert_true(len > 16);
  run_result orig = RUN("program", "--in", file, "--json");
  expect_exit(&orig, 0);
  cJSON *jo = parse_json(orig.out);
  // Every truncation fails cleanly with exit 1: the stored value and node
  // counts come last, so even a cut at a field boundary is detected.
  size_t cuts[] = {0, 1, len - 1, len / 2, (size_t)tt_randint(2, (int64_t)len - 2)};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    spit(bad, bytes, cuts[i]);
    r = RUN("program", "--in", bad, "--json");
    if (r.code != 1) fail_msg("truncated to %zu of %zu bytes: exit %d\n%s", cuts[i], len, r.code, r.err);
    expect_contains(r.err, "tpr program: error: ");
    assert_string_equal(r.out, "");
    done(&r);
  }
  cJSON_Delete(jo);
  done(&orig);
  unsigned char *garbage = malloc(len);
  for (size_t i = 0; i < len; i++) garbage[i] = (unsigned char)tt_next_u64();
  garbage[0] = 0xff;  // wire type 7 (low bits of the first tag byte): never valid protobuf
  spit(bad, garbage, len);
  r = RUN("program", "--in", bad);
  expect_exit(&r, 1);
  expect_contains(r.err, "not a valid serialized program");
  done(&r);
  // Random corruption may still decode to a valid program, but must never crash.
  for (int trial = 0; trial < 12; trial++) {
    memcpy(garbage, bytes, len);
    int flips = (int)tt_randint(1, 4);
    for (int f = 0; f < flips; f++) garbage[tt_randint(0, (int64_t)len - 1)] ^= (unsigned char)(1u << tt_randint(0, 7));
    spit(bad, garbage, len);
    r = RUN("program", "--in", bad, "--json");
    if (r.code != 0 && r.code != 1) fail_msg("corrupt program: exit %d\n%s", r.code, r.err);
    if (r.code == 1) expect_contains(r.err, "tpr program: error: ");
    done(&r);
  }
  free(garbage);
  free(bytes);
}

static int remove_tmp(void **state) {
  static const char *const names[] = {"stdout", "stderr", "missing.json", "malformed.json", "bad_value.json",
                                      "good.json", "block.tprp", "good.tprp", "bad.tprp"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tmp_file(names[i]));
  return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(void) {
  tt_seed_from_env();
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  snprintf(tpr_path, sizeof tpr_path, "%s/../bin/tpr", dirname(self));
  if (access(tpr_path, X_OK) != 0) {
    fprintf(stderr, "test_cli: %s is not built\n", tpr_path);
    return 1;
  }
  if (!mkdtemp(tmp_dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_and_usage),
      cmocka_unit_test(test_mlp_json),
      cmocka_unit_test(test_mlp_bad_args),
      cmocka_unit_test(test_mlp_configs),
      cmocka_unit_test(test_program_round_trip),
      cmocka_unit_test(test_program_corrupt),
  };
  return cmocka_run_group_tests(tests, NULL, remove_tmp);
}
