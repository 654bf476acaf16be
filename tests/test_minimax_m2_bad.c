// `tpr forward` and `tpr run` on bad input, alone and under mpirun: each
// case must exit non-zero within seconds (a hang is killed by timeout(1)
// and fails the test) with a message naming the problem, on every rank
// that printed one, and forward must not leave a logits file behind.
#include "test_util.h"
#include "cli_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_fixture.h"

#define FIX TPR_FIXTURES "/minimax_m2_tiny"
#define KILL_AFTER 60    // seconds before timeout(1) kills a run (a hang)
#define PROMPT_LIMIT_S 15  // "within a few seconds", with room for ASan and a loaded machine

static char tpr_path[4096], ck[4200], out[4200];
static char tmp_dir[] = "/tmp/tpr_test_m2_bad_XXXXXX";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// `tpr args...` alone (np 0) or under `mpirun -np np`; prints how long it took.
static run_result run_np(int np, const char *const *args) {
  double t0 = now_s();
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = KILL_AFTER});
  double secs = now_s() - t0;
  printf("  np %d: exit %d after %.2f s\n", np, r.code, secs);
  if (secs > PROMPT_LIMIT_S) fail_msg("took %.1f s to fail (limit %d s)\nstderr:\n%s", secs, PROMPT_LIMIT_S, r.err);
  return r;
}
#define RUN(np, ...) run_np(np, (const char *const[]){__VA_ARGS__, NULL})

// A failure naming the problem: every needle in stderr, and, under mpirun,
// every "error on rank" line says the same (each rank may fail alone; a
// rank's line can be cut off by another's MPI_Abort, so at least one).
static void expect_fail(run_result r, const char *what, const char *const *needles) {
  if (r.code == 0) fail_msg("%s: exit 0\nstdout:\n%s\nstderr:\n%s", what, r.out, r.err);
  for (int i = 0; needles[i]; i++)
    if (!strstr(r.err, needles[i])) fail_msg("%s: '%s' not in stderr:\n%s", what, needles[i], r.err);
  int lines = 0;
  for (const char *p = strstr(r.err, "error on rank"); p; p = strstr(p + 1, "error on rank")) {
    char line[2048];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(p, "\n"), p);
    for (int i = 0; needles[i]; i++)
      if (!strstr(line, needles[i])) fail_msg("%s: a rank says otherwise: %s", what, line);
    lines++;
  }
  const char *said = strstr(r.err, "tpr ");  // tpr's own first line, past Open MPI's banners
  if (said) printf("  %.*s\n", (int)strcspn(said, "\n"), said);
  if (lines) printf("  (%d rank(s) reported it)\n", lines);
  struct stat st;
  if (stat(out, &st) == 0) fail_msg("%s: a logits file was written", what);
  tt_run_done(&r);
}
#define FAILS(what, run, ...)                                        \
  do {                                                              \
    printf("%s\n", what);                                           \
    run_result r_ = (run);                                          \
    expect_fail(r_, what, (const char *const[]){__VA_ARGS__, NULL}); \
  } while (0)

static void test_token_out_of_vocab(void **state) {
  FAILS("--tokens with id 256 (vocab 256), np 2", RUN(2, "forward", "--model", FIX, "--tokens", "1,256", "--out", out),
        "token id 256", "vocabulary [0, 256)");
  FAILS("--tokens with id 256, alone", RUN(0, "forward", "--model", FIX, "--tokens", "256", "--out", out),
        "token id 256", "vocabulary");
  FAILS("second --prompt-ids with id 300, np 2",
        RUN(2, "run", "--model", FIX, "--max-new-tokens", "2", "--prompt-ids", "1,2", "--prompt-ids", "5,300"),
        "token id 300", "vocabulary [0, 256)");
}

static void test_bad_token_lists(void **state) {
  FAILS("--tokens \"\"", RUN(0, "forward", "--model", FIX, "--tokens", "", "--out", out), "--tokens", "empty");
  FAILS("--prompt-ids \"\", np 2", RUN(2, "run", "--model", FIX, "--prompt-ids", ""), "--prompt-ids", "empty");
  FAILS("--tokens 1,a,3", RUN(0, "forward", "--model", FIX, "--tokens", "1,a,3", "--out", out), "--tokens",
        "'1,a,3'", "not a token id");
  FAILS("--prompt-ids 1,2x", RUN(0, "run", "--model", FIX, "--prompt-ids", "1,2x"), "--prompt-ids", "not a token id");
  FAILS("--tokens -1", RUN(0, "forward", "--model", FIX, "--tokens", "3,-1", "--out", out), "--tokens",
        "not a token id");
}

static void test_tp_mismatch(void **state) {
  FAILS("--tp 3 under mpirun -np 4",
        RUN(4, "forward", "--model", FIX, "--tokens", "1,2", "--out", out, "--tp", "3"), "--tp 3",
        "world of 4 ranks");
  FAILS("--tp 4 alone", RUN(0, "run", "--model", FIX, "--prompt-ids", "1,2", "--tp", "4"), "--tp 4",
        "world of 1 ranks");
}

// The fixture's expert width (32) cannot split over etp = 3.
static void test_mesh_cannot_fit(void **state) {
  FAILS("np 3 on expert width 32", RUN(3, "forward", "--model", FIX, "--tokens", "1,2", "--out", out),
        "expert width 32", "etp=3");
}

static void test_missing_model(void **state) {
  FAILS("--model /nonexistent, np 2",
        RUN(2, "forward", "--model", "/nonexistent/m2", "--tokens", "1,2", "--out", out), "/nonexistent/m2");
  FAILS("--model /nonexistent alone", RUN(0, "run", "--model", "/nonexistent/m2", "--prompt-ids", "1"),
        "/nonexistent/m2");
}

// A random tiny checkpoint (tests/ckpt_fixture.c) runs at np 2; without one
// tensor, or with one a row too long, it must fail naming that tensor.
static void test_broken_checkpoint(void **state) {
  assert_int_equal(mkdir(ck, 0700), 0);
  ck_model m;
  ck_spec sp = ck_default_spec();
  ck_write(ck, &sp, &m);
  run_result r = RUN(2, "forward", "--model", ck, "--tokens", "1,2,249", "--out", out);
  if (r.code != 0) fail_msg("the intact checkpoint fails: exit %d\n%s", r.code, r.err);
  tt_run_done(&r);
  unlink(out);
  const char *name = "model.layers.1.self_attn.q_proj.weight";
  ck_rewrite(ck, &m, name, NULL);
  FAILS("checkpoint without layer 1 q_proj, np 2", RUN(2, "forward", "--model", ck, "--tokens", "1,2", "--out", out),
        name);
  ck_rewrite(ck, &m, NULL, name);  // back, one row too many
  FAILS("checkpoint with layer 1 q_proj a row too long",
        RUN(0, "run", "--model", ck, "--prompt-ids", "1,2", "--max-new-tokens", "2"), name);
  const char *expert = "model.layers.0.block_sparse_moe.experts.5.w2.weight";
  ck_rewrite(ck, &m, expert, NULL);
  FAILS("checkpoint without an expert's w2, np 2",
        RUN(2, "run", "--model", ck, "--prompt-ids", "1,2", "--max-new-tokens", "2"), expert);
  ck_free(&m);
}

static void test_help(void **state) {
  static const char *const cmds[] = {"forward", "run"};
  for (int i = 0; i < 2; i++) {
    run_result r = RUN(0, cmds[i], "--help");
    if (r.code != 0) fail_msg("tpr %s --help: exit %d\n%s", cmds[i], r.code, r.err);
    if (!strstr(r.out, "usage")) fail_msg("tpr %s --help prints no usage:\n%s", cmds[i], r.out);
    tt_run_done(&r);
  }
  FAILS("tpr forward without --out", RUN(0, "forward", "--model", FIX, "--tokens", "1"), "--out");
}

static int teardown(void **state) {
  ck_rmdir(ck);
  unlink(out);
  unlink(tt_path(tmp_dir, "stdout"));
  unlink(tt_path(tmp_dir, "stderr"));
  return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_minimax_m2_bad") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  snprintf(ck, sizeof ck, "%s/ck", tmp_dir);
  snprintf(out, sizeof out, "%s/logits.safetensors", tmp_dir);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  setenv("LSAN_OPTIONS", "suppressions=" TPR_FIXTURES "/../lsan.supp:print_suppressions=0", 0);
  tt_seed_from_env();
  double t0 = now_s();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_token_out_of_vocab),
      cmocka_unit_test(test_bad_token_lists),
      cmocka_unit_test(test_tp_mismatch),
      cmocka_unit_test(test_mesh_cannot_fit),
      cmocka_unit_test(test_missing_model),
      cmocka_unit_test(test_broken_checkpoint),
  };
  int rc = cmocka_run_group_tests(tests, NULL, teardown);
  printf("test_minimax_m2_bad: %.1f s\n", now_s() - t0);
  return rc;
}
