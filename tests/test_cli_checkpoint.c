// The checkpoint commands as a user runs them (bin/tpr beside this test's
// binary, no mpirun): make-checkpoint writes a random tiny MiniMax-M2,
// load --json reports what a rank holds, convert writes per-rank files that
// load to the same bytes and refuse another mesh. Exit codes are the
// contract: 0 success, 1 failure, 2 usage error.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_fixture.h"

static char tpr_path[4096], ck[4200], conv[4200];
static char tmp_dir[] = "/tmp/tpr_test_cli_ckpt_XXXXXX";

#define RUN(...) tt_run_tpr(tpr_path, tmp_dir, (const char *const[]){__VA_ARGS__, NULL})

static void expect(run_result *r, int code, const char *in_err) {
  if (r->code != code) fail_msg("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r->code, code, r->out, r->err);
  if (in_err && !strstr(r->err, in_err)) fail_msg("expected '%s' in stderr:\n%s", in_err, r->err);
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
  tt_run_done(&r);
  static const char *const cmds[] = {"convert", "load", "make-checkpoint"};
  for (int i = 0; i < 3; i++) {
    r = RUN(cmds[i], "--help");
    expect(&r, 0, NULL);
    tt_run_done(&r);
  }
}

static void test_make_checkpoint(void **state) {
  cJSON *j = tt_json_of(RUN("make-checkpoint", "--config", TPR_CONFIGS "/minimax_m2_tiny.json", "--out", ck, "--files",
                         "3", "--seed", "7", "--json"));
  assert_true(tt_json_num(j, "files") == 3 && tt_json_num(j, "tensor_bytes") > 0 && tt_json_num(j, "file_bytes") > tt_json_num(j, "tensor_bytes"));
  cJSON_Delete(j);
  run_result r = RUN("make-checkpoint", "--config", TPR_CONFIGS "/minimax_m2_tiny.json");
  expect(&r, 2, "--out");
  tt_run_done(&r);
  r = RUN("make-checkpoint", "--config", "/nonexistent.json", "--out", conv);
  expect(&r, 1, "/nonexistent.json");
  tt_run_done(&r);
  r = RUN("make-checkpoint", "--config", TPR_CONFIGS "/minimax_m2_tiny.json", "--out", conv, "--dtype", "source");
  expect(&r, 2, "source");
  tt_run_done(&r);
}

static void test_load_and_convert(void **state) {
  cJSON *plan = tt_json_of(RUN("plan", "--model", ck, "--tp", "2", "--ep", "2", "--json"));
  double held = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(plan, "per_rank_bytes"), 1)->valuedouble;
  cJSON_Delete(plan);
  cJSON *j = tt_json_of(RUN("load", "--model", ck, "--tp", "2", "--ep", "2", "--rank", "1", "--dtype", "bf16", "--json"));
  const cJSON *r0 = rank0(j);
  assert_true(tt_json_num(r0, "rank") == 1 && tt_json_num(r0, "bytes_held") == held);  // bf16 everywhere: the plan's count
  // Read: the checkpoint's bytes for those values; the f32 routing bias (8 experts x 2 layers) is 2 bytes wider each.
  double bias_extra = 2 * 8 * 2;
  assert_true(tt_json_num(r0, "bytes_read") == held + bias_extra);
  assert_true(tt_json_num(r0, "peak_rss_bytes") > 0 && tt_json_num(r0, "seconds") >= 0);
  assert_true(tt_json_num(j, "checkpoint_bytes") > held && tt_json_num(j, "checkpoint_files") == 3);
  cJSON_Delete(j);
  run_result r = RUN("load", "--model", ck, "--tp", "2", "--rank", "2");
  expect(&r, 1, "rank 2");
  tt_run_done(&r);
  r = RUN("load", "--model", ck);
  expect(&r, 2, "--tp");
  tt_run_done(&r);

  j = tt_json_of(RUN("convert", "--model", ck, "--tp", "2", "--ep", "2", "--out", conv, "--json"));
  assert_true(tt_json_num(j, "files") == 2 && tt_json_num(j, "bytes_written") > 0);
  cJSON_Delete(j);
  j = tt_json_of(RUN("load", "--model", conv, "--tp", "2", "--ep", "2", "--rank", "1", "--dtype", "bf16", "--json"));
  assert_true(tt_json_num(rank0(j), "bytes_held") == held && tt_json_num(rank0(j), "bytes_read") == held + bias_extra);
  cJSON_Delete(j);
  r = RUN("load", "--model", conv, "--tp", "2");
  expect(&r, 1, "tp=2 ep=2 etp=1 dp=1");
  if (!strstr(r.err, "tp=2 ep=1 etp=1 dp=1")) fail_msg("the requested mesh is not named:\n%s", r.err);
  tt_run_done(&r);
  r = RUN("convert", "--model", ck, "--tp", "2", "--ep", "2", "--out", conv);
  expect(&r, 1, "--force");
  tt_run_done(&r);
  r = RUN("convert", "--model", ck, "--tp", "4", "--out", conv, "--force");
  expect(&r, 0, NULL);
  tt_run_done(&r);
  j = tt_json_of(RUN("load", "--model", conv, "--tp", "4", "--rank", "3", "--json"));
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
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_cli_checkpoint") != 0) return 1;
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
