// Progress lines (runtime/progress.h): the line's text, when it is drawn
// and erased, and the commands as a user runs them — under a terminal
// (util-linux `script` gives them a pty) a line is drawn and erased; in a
// pipe, with TERM=dumb or TPR_PROGRESS=0 nothing is; TPR_PROGRESS=1 draws
// on stderr and leaves --json's stdout a clean JSON object.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/progress.h"

static char tpr_path[4096], configs[4096], ck[4200], tokens[4200];
static char tmp_dir[] = "/tmp/tpr_test_progress_XXXXXX";

// ---- the line -----------------------------------------------------------------------------------------------

static void test_format_counts(void **state) {
  tpr_progress p = {.total = 40, .done = 10, .t0 = 100.0};
  snprintf(p.what, sizeof p.what, "training");
  snprintf(p.unit, sizeof p.unit, "steps");
  snprintf(p.note, sizeof p.note, "loss 3.2500");
  char line[256];
  tpr_progress_format(&p, 112.0, 200, line, sizeof line);  // 10 of 40 in 12 s: 36 s to go
  assert_string_equal(line, "training  [#####---------------]  25%  10/40 steps  loss 3.2500  ETA 0:36");
  p.done = 40;  // complete: the time it took instead of an ETA
  tpr_progress_format(&p, 112.0, 200, line, sizeof line);
  assert_string_equal(line, "training  [####################] 100%  40/40 steps  loss 3.2500  0:12");
  p.total = 0, p.done = 7, p.note[0] = '\0';  // unknown total: no bar, no ETA
  tpr_progress_format(&p, 112.0, 200, line, sizeof line);
  assert_string_equal(line, "training  7 steps  0:12");
}

static void test_format_bytes(void **state) {
  tpr_progress p = {.total = 3ull << 30, .done = 1ull << 30, .t0 = 0};
  snprintf(p.what, sizeof p.what, "loading weights");
  char line[256];
  tpr_progress_format(&p, 4.0, 200, line, sizeof line);  // 1 GiB in 4 s, 2 GiB to go: 8 s
  assert_string_equal(line, "loading weights  [######--------------]  33%  1.00/3.00 GiB  256 MiB/s  ETA 0:08");
  p.done = 0, p.t0 = 0;  // nothing yet: no rate, no ETA
  tpr_progress_format(&p, 4000.0, 200, line, sizeof line);
  assert_string_equal(line, "loading weights  [--------------------]   0%  0.00/3.00 GiB  1:06:40");
  // A narrow terminal: cut one column short of its width (the last would wrap).
  tpr_progress_format(&p, 4000.0, 20, line, sizeof line);
  assert_int_equal(strlen(line), 19);
  assert_memory_equal(line, "loading weights  [-", 19);
}

static char *drawn(FILE *f) {
  fflush(f);
  long n = ftell(f);
  char *s = calloc((size_t)n + 1, 1);
  rewind(f);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  fseek(f, 0, SEEK_END);
  return s;
}

static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

static void test_drawing(void **state) {
  FILE *f = tmpfile();
  assert_non_null(f);
  tpr_progress p;
  tpr_progress_enable(false, f);  // off: nothing at all
  tpr_progress_begin(&p, "off", 10, "items");
  tpr_progress_update(&p, 10, "x");
  tpr_progress_end(&p);
  char *s = drawn(f);
  assert_string_equal(s, "");
  free(s);
  tpr_progress_enable(true, f);
  tpr_progress_begin(&p, "work", 100, "items");  // drawn at once
  for (int i = 1; i < 50; i++) tpr_progress_update(&p, (uint64_t)i, NULL);  // within 0.1 s: not redrawn
  s = drawn(f);
  assert_int_equal(count(s, "\r\033[K"), 1);
  assert_non_null(strstr(s, "work  [--------------------]   0%  0/100 items"));
  free(s);
  tpr_progress_clear(&p);  // erased; the next update draws at once
  tpr_progress_update(&p, 60, "note");
  tpr_progress_update(&p, 100, NULL);  // complete: always drawn
  tpr_progress_end(&p);
  tpr_progress_update(&p, 100, NULL);  // after the end: nothing
  s = drawn(f);
  assert_int_equal(count(s, "\r\033[K"), 5);  // begin, clear, 60, 100, end
  assert_non_null(strstr(s, "60/100 items  note"));
  assert_non_null(strstr(s, "100/100 items  note"));
  const char *tail = s + strlen(s) - 4;
  assert_string_equal(tail, "\r\033[K");  // the work is over: the line is gone
  free(s);
  tpr_progress_enable(false, NULL);
  fclose(f);
}

// ---- the commands ---------------------------------------------------------------------------------------------

// `script -qec CMD /dev/null`: CMD on a pty, its stdout and stderr both the
// terminal; script's own stdout (what r.out holds) is that terminal's output.
static run_result on_terminal(const char *cmd) {
  const char *const args[] = {"-qec", cmd, "/dev/null", NULL};
  return tt_run("/usr/bin/script", tmp_dir, args, &(tt_run_opts){.timeout_s = 120});
}

static void expect_ok(const run_result *r) {
  if (r->code != 0) fail_msg("exit %d\nstdout:\n%s\nstderr:\n%s", r->code, r->out, r->err);
}

static void test_make_checkpoint_terminal(void **state) {
  char cmd[20000];
  snprintf(cmd, sizeof cmd, "'%s' make-checkpoint --config '%s/minimax_m2_tiny.json' --out '%s/a' --files 2", tpr_path,
           configs, tmp_dir);
  run_result r = on_terminal(cmd);
  expect_ok(&r);
  assert_non_null(strstr(r.out, "\r\033[Kwriting checkpoint  ["));
  assert_non_null(strstr(r.out, "] 100%"));
  assert_non_null(strstr(r.out, "\r\033[Kwrote "));  // erased before the summary
  tt_run_done(&r);
  // TERM=dumb and TPR_PROGRESS=0: the same command draws nothing.
  static const char *const quiet[] = {"TERM=dumb", "TPR_PROGRESS=0"};
  for (int i = 0; i < 2; i++) {
    char c2[12100];
    snprintf(c2, sizeof c2, "env %s '%s' make-checkpoint --config '%s/minimax_m2_tiny.json' --out '%s/b%d'", quiet[i],
             tpr_path, configs, tmp_dir, i);
    r = on_terminal(c2);
    expect_ok(&r);
    assert_null(strstr(r.out, "\033[K"));
    assert_non_null(strstr(r.out, "wrote "));
    tt_run_done(&r);
  }
}

// tpr data prepare: the line on a terminal (bytes read, documents, tokens),
// plain lines every 5 s elsewhere (a run this short prints none).
static void test_data_prepare_terminal(void **state) {
  char text[4300], cmd[20000];
  snprintf(text, sizeof text, "%s/corpus.txt", tmp_dir);
  FILE *f = fopen(text, "w");
  assert_non_null(f);
  for (int i = 0; i < 2000; i++) fprintf(f, "document %d: %d %d %d\n\n", i, rand(), rand(), rand());
  fclose(f);
  snprintf(cmd, sizeof cmd, "'%s' data prepare --model '%s/../tests/fixtures/demo_model' --input '%s' --output '%s/dp/a'",
           tpr_path, configs, text, tmp_dir);
  run_result r = on_terminal(cmd);
  expect_ok(&r);
  assert_non_null(strstr(r.out, "\r\033[Kpreparing  ["));
  assert_non_null(strstr(r.out, " documents  "));
  tt_run_done(&r);
  char model[4300], out[4300];
  snprintf(model, sizeof model, "%s/../tests/fixtures/demo_model", configs);
  snprintf(out, sizeof out, "%s/dp/b", tmp_dir);
  r = tt_run_tpr(tpr_path, tmp_dir,
                 (const char *const[]){"data", "prepare", "--model", model, "--input", text, "--output", out, NULL});
  expect_ok(&r);
  assert_null(strchr(r.err, '\033'));
  assert_null(strchr(r.err, '\r'));
  tt_run_done(&r);
}

static void test_json_stdout_clean(void **state) {
  char out[4300];
  snprintf(out, sizeof out, "%s/d", tmp_dir);
  setenv("TPR_PROGRESS", "1", 1);  // drawn on stderr even into a file
  char cfg[4200];
  snprintf(cfg, sizeof cfg, "%s/minimax_m2_tiny.json", configs);
  run_result r = tt_run_tpr(tpr_path, tmp_dir,
                            (const char *const[]){"make-checkpoint", "--config", cfg, "--out", out, "--json", NULL});
  unsetenv("TPR_PROGRESS");
  expect_ok(&r);
  assert_non_null(strstr(r.err, "\r\033[Kwriting checkpoint"));
  assert_null(strchr(r.out, '\r'));
  assert_null(strchr(r.out, '\033'));
  char *err = r.err;
  r.err = strdup("");
  cJSON *j = tt_json_of(r);  // stdout alone: one JSON object
  assert_true(tt_json_num(j, "files") >= 1);
  cJSON_Delete(j);
  free(err);
  // Piped without TPR_PROGRESS: neither stream carries a control character.
  snprintf(out, sizeof out, "%s/e", tmp_dir);
  r = tt_run_tpr(tpr_path, tmp_dir, (const char *const[]){"make-checkpoint", "--config", cfg, "--out", out, NULL});
  expect_ok(&r);
  assert_null(strchr(r.out, '\033'));
  assert_null(strchr(r.err, '\033'));
  assert_null(strchr(r.err, '\r'));
  tt_run_done(&r);
}

static void test_load_and_train_terminal(void **state) {
  char cmd[20000];
  snprintf(cmd, sizeof cmd, "'%s' load --model '%s' --tp 1", tpr_path, ck);
  run_result r = on_terminal(cmd);
  expect_ok(&r);
  assert_non_null(strstr(r.out, "\r\033[Kloading weights  ["));
  tt_run_done(&r);
  snprintf(cmd, sizeof cmd, "'%s' convert --model '%s' --tp 2 --out '%s/conv'", tpr_path, ck, tmp_dir);
  r = on_terminal(cmd);
  expect_ok(&r);
  assert_non_null(strstr(r.out, "\r\033[Kconverting  [----------"));
  assert_non_null(strstr(r.out, "2/2 ranks"));
  assert_non_null(strstr(r.out, "\r\033[Kloading weights  ["));  // each rank's read, on the same line
  tt_run_done(&r);
  // Under mpirun a rank's stderr is a pipe: rank 0 draws because mpirun's
  // stderr is the terminal; the other rank never does (one line per step).
  // Open MPI's components leak what LeakSanitizer cannot attribute (as for
  // every mpirun test): leak checking off for the ranks.
  snprintf(cmd, sizeof cmd,
           "ASAN_OPTIONS=detect_leaks=0 '%s' -np 2 --oversubscribe '%s' train --model '%s' --data '%s' --seq-len 8 "
           "--steps 3 --tp 2",
           TPR_MPIEXEC, tpr_path, ck, tokens);
  r = on_terminal(cmd);
  expect_ok(&r);
  assert_non_null(strstr(r.out, "\r\033[Ktraining  [--------------------]   0%  0/3 steps"));
  assert_non_null(strstr(r.out, "1/3 steps  loss "));
  assert_non_null(strstr(r.out, "ETA "));
  assert_int_equal(count(r.out, "step     1/3"), 1);
  assert_int_equal(count(r.out, "training  [####################] 100%"), 1);
  tt_run_done(&r);
  // The same run in a pipe: the step lines only.
  r = tt_run_mpi(2, tpr_path, tmp_dir,
                 (const char *const[]){"train", "--model", ck, "--data", tokens, "--seq-len", "8", "--steps", "3",
                                       "--tp", "2", NULL});
  expect_ok(&r);
  assert_non_null(strstr(r.out, "step     3/3"));
  assert_null(strchr(r.out, '\033'));
  assert_null(strchr(r.err, '\033'));
  tt_run_done(&r);
}

static int setup(void **state) {
  if (!mkdtemp(tmp_dir) || tt_tpr_path(tpr_path, sizeof tpr_path, "test_progress") != 0) return -1;
  if (access("/usr/bin/script", X_OK) != 0) {
    fprintf(stderr, "test_progress: /usr/bin/script (util-linux) is missing\n");
    return -1;
  }
  tt_configs_dir(configs, sizeof configs);
  snprintf(ck, sizeof ck, "%s/ck", tmp_dir);
  char cfg[4200];
  snprintf(cfg, sizeof cfg, "%s/minimax_m2_tiny.json", configs);
  run_result r = tt_run_tpr(tpr_path, tmp_dir, (const char *const[]){"make-checkpoint", "--config", cfg, "--out", ck, NULL});
  int code = r.code;
  tt_run_done(&r);
  // Random token ids within the tiny vocabulary (fresh every run).
  snprintf(tokens, sizeof tokens, "%s/tokens.npy", tmp_dir);
  int32_t ids[256];
  srand((unsigned)getpid());
  for (int i = 0; i < 256; i++) ids[i] = rand() % 64;
  tt_write_npy_i32(tokens, ids, 256);
  return code == 0 ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format_counts),       cmocka_unit_test(test_format_bytes),
      cmocka_unit_test(test_drawing),             cmocka_unit_test(test_make_checkpoint_terminal),
      cmocka_unit_test(test_json_stdout_clean),   cmocka_unit_test(test_load_and_train_terminal),
      cmocka_unit_test(test_data_prepare_terminal),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
