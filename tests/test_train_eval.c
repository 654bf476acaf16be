// Validation inside `tpr train` (--eval-data, train/eval_windows.h) against
// `tpr eval`, which scores the same windows through an inference session
// instead of the training program: the loss reported after the last step
// equals `tpr eval` of the checkpoint that step saved (1e-5 relative), at tp
// 2 and at dp 2 x ep 2 with FSDP (an odd window count: one replica scores a
// filler window). Validation must not change the training: every step's
// loss with --eval-data equals the run without it, with the aux-loss-free
// bias update on (its expert-load counts must not see the eval windows).
// Control: the eval after step 2 differs from the final model's score by far
// more than the bound. Bad input: --eval-every without --eval-data, an eval
// file shorter than a window, ids past the vocabulary.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BOUND 1e-5
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static char tpr_path[4096], config[4200];
static char tmp_dir[] = "/tmp/tpr_test_train_eval_XXXXXX";
static char train_npy[4300], val_npy[4300];

// Tokens a few steps can learn: a random cycle of `period` ids (drawn from
// the test seed) with one id in 8 replaced by a random one, so training
// moves the validation loss far more than the comparison's bound.
static void write_tokens(const char *path, int64_t n, int vocab, const int32_t *cycle, int period) {
  int32_t *v = malloc((size_t)n * sizeof *v);
  assert_non_null(v);
  for (int64_t i = 0; i < n; i++) v[i] = tt_randint(0, 7) ? cycle[i % period] : (int32_t)tt_randint(0, vocab - 1);
  tt_write_npy_i32(path, v, n);
  free(v);
}

// `tpr train` (np ranks) with `extra`; its JSON lines: the step losses into
// loss[] (steps of them) and the eval reports in order into eval[] (*n_eval).
static void train(int np, const char *const *extra, int steps, double *loss, double *eval, int *n_eval) {
  const char *args[48] = {"train", "--config", config, "--random-init", "--seed", "7", "--data", train_npy,
                          "--seq-len", "32", "--lr", "1e-2", "--json"};
  int n = 13;
  char st[16];
  snprintf(st, sizeof st, "%d", steps);
  args[n++] = "--steps", args[n++] = st;
  for (int i = 0; extra[i]; i++) args[n++] = extra[i];
  args[n] = NULL;
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 300});
  if (r.code != 0) fail_msg("tpr train (np %d): exit %d\n%s", np, r.code, r.err);
  int ns = 0;
  *n_eval = 0;
  for (char *l = strtok(r.out, "\n"); l; l = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(l), *e = cJSON_GetObjectItemCaseSensitive(j, "eval");
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "step")) && ns < steps) loss[ns++] = tt_json_num(j, "loss");
    if (e) eval[(*n_eval)++] = tt_json_num(e, "loss");
    cJSON_Delete(j);
  }
  assert_int_equal(ns, steps);
  tt_run_done(&r);
}

static double tpr_eval(int np, const char *model, const char *const *mesh) {
  const char *args[32] = {"eval", "--model", model, "--data", val_npy, "--seq-len", "32", "--json"};
  int n = 8;
  for (int i = 0; mesh[i]; i++) args[n++] = mesh[i];
  args[n] = NULL;
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 120});
  if (r.code != 0) fail_msg("tpr eval: exit %d\n%s", r.code, r.err);
  const char *line = strstr(r.out, "{\"command\"");
  assert_non_null(line);
  cJSON *j = cJSON_Parse(line);
  assert_non_null(j);
  double loss = tt_json_num(j, "loss");
  cJSON_Delete(j);
  tt_run_done(&r);
  return loss;
}

static void check_mesh(int np, const char *name, const char *const *mesh) {
  const char *save = tt_path(tmp_dir, name);
  const char *extra[24] = {"--eval-data", val_npy, "--eval-every", "2", "--save", save};
  int n = 6;
  for (int i = 0; mesh[i]; i++) extra[n++] = mesh[i];
  extra[n] = NULL;
  double loss[4], eval[4];
  int ne;
  train(np, extra, 4, loss, eval, &ne);
  assert_int_equal(ne, 2);  // after steps 2 and 4
  double want = tpr_eval(1, save, ARGS("--tp", "1"));
  double err = fabs(eval[1] - want) / want, control = fabs(eval[0] - want) / want;
  printf("  %s: eval after step 4 %.9f, tpr eval of the step-4 save %.9f: rel %.2e (bound %.0e); after step 2 "
         "%.9f (control, rel %.2e)\n", name, eval[1], want, err, BOUND, eval[0], control);
  assert_true(err <= BOUND);
  assert_true(control > 100 * BOUND);
}

static void test_matches_tpr_eval(void **state) {
  (void)state;
  check_mesh(2, "tp2", ARGS("--tp", "2"));
  check_mesh(4, "dp2ep2", ARGS("--tp", "2", "--dp", "2", "--ep", "2", "--fsdp"));
}

static void test_training_untouched(void **state) {
  (void)state;
  double a[4], b[4], e[4];
  int ne;
  const char *const *mesh = ARGS("--tp", "2", "--bias-update-rate", "0.01");
  const char *with[] = {"--tp", "2", "--bias-update-rate", "0.01", "--eval-data", val_npy, "--eval-every", "1", NULL};
  train(2, mesh, 4, a, e, &ne);
  assert_int_equal(ne, 0);
  train(2, with, 4, b, e, &ne);
  assert_int_equal(ne, 4);
  for (int s = 0; s < 4; s++) {
    printf("  step %d loss %.9g without validation, %.9g with it after every step\n", s, a[s], b[s]);
    assert_true(a[s] == b[s]);
  }
}

static void test_bad_input(void **state) {
  (void)state;
  const char *shortf = tt_path(tmp_dir, "short.npy"), *big = tt_path(tmp_dir, "big.npy");
  char short_path[4300], big_path[4300];
  snprintf(short_path, sizeof short_path, "%s", shortf);
  snprintf(big_path, sizeof big_path, "%s", big);
  int32_t zero = 0;
  write_tokens(short_path, 20, 256, &zero, 1);  // fewer than a window of 32 + 1
  int32_t v[100];
  for (int i = 0; i < 100; i++) v[i] = i == 57 ? 256 : i;  // one id past the tiny config's vocabulary
  tt_write_npy_i32(big_path, v, 100);
  const struct {
    const char *const *extra;
    int code;
    const char *want;
  } cases[] = {
      {ARGS("--eval-every", "2"), 2, "need --eval-data"},
      {ARGS("--eval-data", short_path), 1, "fewer than one window"},
      {ARGS("--eval-data", big_path), 1, "256"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *args[24] = {"train", "--config", config, "--random-init", "--data", train_npy, "--seq-len", "32",
                            "--steps", "1"};
    int n = 10;
    for (int k = 0; cases[i].extra[k]; k++) args[n++] = cases[i].extra[k];
    args[n] = NULL;
    run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.timeout_s = 60});
    printf("  %s: exit %d: %s", cases[i].extra[1], r.code, strstr(r.err, "tpr train") ? strstr(r.err, "tpr train") : r.err);
    assert_int_equal(r.code, cases[i].code);
    assert_non_null(strstr(r.err, cases[i].want));
    tt_run_done(&r);
  }
}

static int setup(void **state) {
  (void)state;
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_train_eval") != 0 || !mkdtemp(tmp_dir)) return -1;
  char configs[4096];
  tt_configs_dir(configs, sizeof configs);
  snprintf(config, sizeof config, "%s/minimax_m2_tiny.json", configs);
  snprintf(train_npy, sizeof train_npy, "%s", tt_path(tmp_dir, "train.npy"));
  snprintf(val_npy, sizeof val_npy, "%s", tt_path(tmp_dir, "val.npy"));
  int32_t cycle[16];
  for (int i = 0; i < 16; i++) cycle[i] = (int32_t)tt_randint(0, 255);
  write_tokens(train_npy, 4096, 256, cycle, 16);
  write_tokens(val_npy, 32 * 21 + 1, 256, cycle, 16);  // 21 windows: odd, so at dp 2 one replica scores a filler
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_tpr_eval),
      cmocka_unit_test(test_training_untouched),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
