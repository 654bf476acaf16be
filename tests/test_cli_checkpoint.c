// The checkpoint commands as a user runs them (bin/tpr beside this test's
// binary, no mpirun): make-checkpoint writes a random tiny MiniMax-M2,
// load --json reports what a rank holds, convert writes per-rank files that
// load to the same bytes and refuse another mesh. Exit codes are the
// contract: 0 success, 1 failure, 2 usage error.
#include "test_util.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_fixture.h"

static char tpr_path[4096], ck[4200], conv[4200];
static char tmp_dir[] = "/tmp/tpr_test_cli_ckpt_XXXXXX";

typedef struct run_result {
  int code;  // exit status, or -signal
  char *out, *err;
} run_result;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = calloc((size_t)n + 1, 1);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  return buf;
}

static run_result run_tpr(const char *const *args) {
  const char *argv[32] = {tpr_path};
  int n = 1;
  for (; args[n - 1]; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  char out_path[4200], err_path[4200];
  snprintf(out_path, sizeof out_path, "%s/stdout", tmp_dir);
  snprintf(err_path, sizeof err_path, "%s/stderr", tmp_dir);
  fflush(stdout), fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int in = open("/dev/null", O_RDONLY), out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || out < 0 || err < 0) _exit(126);
    dup2(in, 0), dup2(out, 1), dup2(err, 2);
    static const char *const launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                                "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof launcher_vars / sizeof launcher_vars[0]; i++) unsetenv(launcher_vars[i]);
    setenv("TPR_NUM_THREADS", "1", 1);
    execv(tpr_path, (char *const *)argv);
    _exit(127);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  run_result r = {.code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st), .out = slurp(out_path), .err = slurp(err_path)};
  if (strstr(r.err, "Sanitizer") || strstr(r.err, "runtime error:")) fail_msg("sanitizer report:\n%s", r.err);
  return r;
}

#define RUN(...) run_tpr((const char *const[]){__VA_ARGS__, NULL})

static void expect(run_result *r, int code, const char *in_err) {
  if (r->code != code) fail_msg("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r->code, code, r->out, r->err);
  if (in_err && !strstr(r->err, in_err)) fail_msg("expected '%s' in stderr:\n%s", in_err, r->err);
}

static void done(run_result *r) { free(r->out), free(r->err); }

// Runs a --json command that must succeed; returns its object.
static cJSON *json_of(run_result r) {
  expect(&r, 0, NULL);
  cJSON *j = cJSON_Parse(r.out);
  if (!cJSON_IsObject(j)) fail_msg("not a JSON object:\n%s", r.out);
  done(&r);
  return j;
}

static double num(const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v)) fail_msg("JSON key '%s' missing or not a number", key);
  return v->valuedouble;
}

static const cJSON *rank0(const cJSON *j) {
  const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(j, "ranks");
  assert_int_equal(cJSON_GetArraySize(ranks), 1);
  return cJSON_GetArrayItem(ranks, 0);
}

static void test_help(void **state) {
  run_result r = RUN("--help");
  expect(&r, 0, NULL);
  for (const char *const *c = (const char *const[]){"convert", "load", "make-checkpoint", NULL}; *c; c++)
    if (!strstr(r.out, *c)) fail_msg("'%s' missing from tpr --help:\n%s", *c, r.out);
  done(&r);
  static const char *const cmds[] = {"convert", "load", "make-checkpoint"};
  for (int i = 0; i < 3; i++) {
    r = RUN(cmds[i], "--help");
    expect(&r, 0, NULL);
    done(&r);
  }
}

static void test_make_checkpoint(void **state) {
  cJSON *j = json_of(RUN("make-checkpoint", "--config", TPR_CONFIGS "/minimax_m2_tiny.json", "--out", ck, "--files",
                         "3", "--seed", "7", "--json"));
  assert_true(num(j, "files") == 3 && num(j, "tensor_bytes") > 0 && num(j, "file_bytes") > num(j, "tensor_bytes"));
  cJSON_Delete(j);
  run_result r = RUN("make-checkpoint", "--config", TPR_CONFIGS "/minimax_m2_tiny.json");
  expect(&r, 2, "--out");
  done(&r);
  r = RUN("make-checkpoint", "--config", "/nonexistent.json", "--out", conv);
  expect(&r, 1, "/nonexistent.json");
  done(&r);
  r = RUN("make-checkpoint", "--config", TPR_CONFIGS "/minimax_m2_tiny.json", "--out", conv, "--dtype", "source");
  expect(&r, 2, "source");
  done(&r);
}

static void test_load_and_convert(void **state) {
  cJSON *plan = json_of(RUN("plan", "--model", ck, "--tp", "2", "--ep", "2", "--json"));
  double held = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(plan, "per_rank_bytes"), 1)->valuedouble;
  cJSON_Delete(plan);
  cJSON *j = json_of(RUN("load", "--model", ck, "--tp", "2", "--ep", "2", "--rank", "1", "--dtype", "bf16", "--json"));
  const cJSON *r0 = rank0(j);
  assert_true(num(r0, "rank") == 1 && num(r0, "bytes_held") == held);  // bf16 everywhere: the plan's count
  // Read: the checkpoint's bytes for those values; the f32 routing bias (8 experts x 2 layers) is 2 bytes wider each.
  double bias_extra = 2 * 8 * 2;
  assert_true(num(r0, "bytes_read") == held + bias_extra);
  assert_true(num(r0, "peak_rss_bytes") > 0 && num(r0, "seconds") >= 0);
  assert_true(num(j, "checkpoint_bytes") > held && num(j, "checkpoint_files") == 3);
  cJSON_Delete(j);
  run_result r = RUN("load", "--model", ck, "--tp", "2", "--rank", "2");
  expect(&r, 1, "rank 2");
  done(&r);
  r = RUN("load", "--model", ck);
  expect(&r, 2, "--tp");
  done(&r);

  j = json_of(RUN("convert", "--model", ck, "--tp", "2", "--ep", "2", "--out", conv, "--json"));
  assert_true(num(j, "files") == 2 && num(j, "bytes_written") > 0);
  cJSON_Delete(j);
  j = json_of(RUN("load", "--model", conv, "--tp", "2", "--ep", "2", "--rank", "1", "--dtype", "bf16", "--json"));
  assert_true(num(rank0(j), "bytes_held") == held && num(rank0(j), "bytes_read") == held + bias_extra);
  cJSON_Delete(j);
  r = RUN("load", "--model", conv, "--tp", "2");
  expect(&r, 1, "tp=2 ep=2 etp=1 dp=1");
  if (!strstr(r.err, "tp=2 ep=1 etp=1 dp=1")) fail_msg("the requested mesh is not named:\n%s", r.err);
  done(&r);
  r = RUN("convert", "--model", ck, "--tp", "2", "--ep", "2", "--out", conv);
  expect(&r, 1, "--force");
  done(&r);
  r = RUN("convert", "--model", ck, "--tp", "4", "--out", conv, "--force");
  expect(&r, 0, NULL);
  done(&r);
  j = json_of(RUN("load", "--model", conv, "--tp", "4", "--rank", "3", "--json"));
  cJSON_Delete(j);
}

static int cleanup(void **state) {
  ck_rmdir(conv);
  ck_rmdir(ck);
  char p[4200];
  snprintf(p, sizeof p, "%s/stdout", tmp_dir), unlink(p);
  snprintf(p, sizeof p, "%s/stderr", tmp_dir), unlink(p);
  return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(void) {
  char self[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  snprintf(tpr_path, sizeof tpr_path, "%s/../bin/tpr", dirname(self));
  if (access(tpr_path, X_OK) != 0) {
    fprintf(stderr, "test_cli_checkpoint: %s is not built\n", tpr_path);
    return 1;
  }
  if (!mkdtemp(tmp_dir)) return 1;
  snprintf(ck, sizeof ck, "%s/ck", tmp_dir);
  snprintf(conv, sizeof conv, "%s/conv", tmp_dir);
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_make_checkpoint),
      cmocka_unit_test(test_load_and_convert),
  };
  return cmocka_run_group_tests(tests, NULL, cleanup);
}
