// FSDP (`tpr train` at dp > 1; shard/fsdp.h) against plain training of the
// concatenated batch on one rank: 5 AdamW steps' losses and parameters at
// dp 2 and 4, with tp 2 and with ep 2, and with bf16 params against dp 1
// with bf16 params; negative controls (gradients summed instead of
// averaged, a rank keeping the next rank's chunk); the bytes per rank on
// configs/minimax_m2_small.json at dp 4 against dp 1; resharding a
// checkpoint saved at dp 4 onto dp 2 and dp 1.
#include "test_util.h"
#include "cli_util.h"
#include "fsdp_runs.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/safetensors.h"

#define BOUND 1e-5     // relative: losses, and ||a - b|| / ||b|| of every parameter tensor
#define CONTROL 1e-3   // a negative control must differ by more than this
#define MEMORY_BAR 0.3  // params + gradients + optimizer bytes per rank, dp 4 / dp 1

#define FIX TPR_FIXTURES "/minimax_m2_train"
#define MODEL TPR_FIXTURES "/minimax_m2_tiny"
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_fsdp_XXXXXX";

// A run directory under tmp_dir (tt_path's buffers rotate: not for keeping).
typedef struct dir_name { char s[512]; } dir_name;
static dir_name dir_of(const char *name) {
  dir_name d;
  snprintf(d.s, sizeof d.s, "%s/%s", tmp_dir, name);
  return d;
}


// `tpr train` on the fixture (5 steps of a 5-step schedule unless args say
// otherwise, sequential windows, etp 1 so the expert layout does not follow
// the world size); the step losses and the memory line; saves to `save`.
static run train(int np, const char *save, const char *const *args) {
  const char *a[64] = {"train", "--data", FIX "/tokens.npy", "--data-order", "sequential", "--seq-len", "16",
                       "--steps", "5", "--lr", "1e-3", "--ep", "1", "--etp", "1", "--json"};
  int n = 16;
  if (save) a[n++] = "--save", a[n++] = save;
  bool model = false;
  for (int i = 0; args[i]; i++) model = model || !strcmp(args[i], "--resume") || !strcmp(args[i], "--config");
  if (!model) a[n++] = "--model", a[n++] = MODEL;
  for (int i = 0; args[i]; i++) a[n++] = args[i];
  a[n] = NULL;
  run_result r = tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.np = np, .timeout_s = 300});
  if (r.code != 0) fail_msg("tpr train (np %d) failed with %d: %s", np, r.code, r.err);
  run out = fr_parse(r.out);
  tt_run_done(&r);
  return out;
}



// Runs np ranks with args, compares with the reference run in ref_dir.
static void check(int np, const char *const *args, const run *ref, const char *ref_dir, bool control) {
  dir_name d = dir_of("got");
  const char *dir = d.s;
  run got = train(np, dir, args);
  const char *worst;
  double le = fr_step_err(&got, ref, false), ge = fr_step_err(&got, ref, true), pe = fr_compare_dirs(dir, ref_dir, &worst);
  printf("  np %d", np);
  for (int i = 0; args[i]; i++) printf(" %s", args[i]);
  printf(": losses %.2e, gradient norms %.2e, parameters %.2e (%s)%s\n", le, ge, pe, worst,
         control ? " [negative control]" : "");
  // AdamW with clipping is blind to a constant gradient scale (a sum over
  // dp instead of the mean moves no parameter): the norms catch it.
  if (control) {
    assert_true(pe > CONTROL || ge > CONTROL);
  } else {
    assert_true(le <= BOUND);
    assert_true(ge <= BOUND);
    assert_true(pe <= BOUND);
  }
}

static void test_parity(void **state) {
  (void)state;
  dir_name rd = dir_of("ref");
  const char *ref = rd.s;
  run r = train(1, ref, ARGS("--micro-batch", "4", "--no-fsdp"));  // the concatenated batch of 4 windows
  check(2, ARGS("--dp", "2", "--micro-batch", "2"), &r, ref, false);
  check(4, ARGS("--dp", "4", "--micro-batch", "1"), &r, ref, false);
  check(4, ARGS("--dp", "2", "--tp", "2", "--micro-batch", "2"), &r, ref, false);
  check(2, ARGS("--dp", "2", "--ep", "2", "--micro-batch", "2"), &r, ref, false);
  check(4, ARGS("--dp", "4", "--micro-batch", "1", "--no-prefetch", "--no-reshard"), &r, ref, false);
  // Negative controls: either bug must move the parameters.
  check(2, ARGS("--dp", "2", "--micro-batch", "2", "--debug-fsdp", "sum-grads"), &r, ref, true);
  check(2, ARGS("--dp", "2", "--micro-batch", "2", "--debug-fsdp", "wrong-shard"), &r, ref, true);
}

static void test_bf16(void **state) {
  (void)state;
  dir_name rd = dir_of("ref_bf16"), fd = dir_of("ref");
  const char *ref = rd.s;
  run r = train(1, ref, ARGS("--micro-batch", "4", "--fsdp", "--param-dtype", "bf16"));
  check(2, ARGS("--dp", "2", "--micro-batch", "2", "--param-dtype", "bf16"), &r, ref, false);
  check(4, ARGS("--dp", "2", "--tp", "2", "--micro-batch", "2", "--param-dtype", "bf16"), &r, ref, false);
  // bf16 params really are rounded: against the f32 run they differ.
  const char *f32 = fd.s;
  const char *worst;
  double d = fr_compare_dirs(ref, f32, &worst);
  printf("  bf16 against f32 params: %.2e (%s)\n", d, worst);
  assert_true(d > BOUND);
}

static void test_memory(void **state) {
  (void)state;
  char cfg[4096];
  tt_configs_dir(cfg, sizeof cfg);
  strcat(cfg, "/minimax_m2_small.json");
  const char *common[] = {"--config", cfg, "--random-init", "--steps", "1", NULL};
  run one = train(1, NULL, ARGS(common[0], common[1], common[2], common[3], common[4], "--no-fsdp"));
  run four = train(4, NULL, ARGS(common[0], common[1], common[2], common[3], common[4], "--dp", "4"));
  double a = one.mem[0] + one.mem[1] + one.mem[2], b = four.mem[0] + four.mem[1] + four.mem[2];
  printf("  minimax_m2_small: params + gradients + optimizer per rank: dp 1 %.1f MiB (params %.1f, grads %.1f, "
         "optimizer %.1f), dp 4 FSDP %.1f MiB (params %.1f, grads %.1f, optimizer %.1f): ratio %.3f (bar %.1f)\n",
         a / 1048576, one.mem[0] / 1048576, one.mem[1] / 1048576, one.mem[2] / 1048576, b / 1048576,
         four.mem[0] / 1048576, four.mem[1] / 1048576, four.mem[2] / 1048576, b / a, MEMORY_BAR);
  assert_true(a > 0 && b > 0);
  assert_true(b <= MEMORY_BAR * a);
}

static void test_reshard(void **state) {
  (void)state;
  dir_name rd = dir_of("ref_5"), hd = dir_of("half");
  const char *ref = rd.s, *half = hd.s;
  run r = train(1, ref, ARGS("--micro-batch", "4", "--no-fsdp"));  // uninterrupted
  train(4, half, ARGS("--dp", "4", "--micro-batch", "1", "--stop-after", "2"));
  const struct {
    int np;
    const char *const *args;
  } cases[] = {{2, ARGS("--resume", half, "--dp", "2", "--micro-batch", "2")},
               {1, ARGS("--resume", half, "--micro-batch", "4", "--no-fsdp")}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    dir_name d = dir_of("resumed");
    const char *dir = d.s;
    run got = train(cases[c].np, dir, cases[c].args);
    assert_int_equal(got.steps, 3);
    double le = 0;
    for (int i = 0; i < 3; i++) {
      double e = fabs(got.loss[i] - r.loss[2 + i]) / fabs(r.loss[2 + i]);
      le = e > le ? e : le;
    }
    const char *worst;
    double pe = fr_compare_dirs(dir, ref, &worst);
    printf("  saved at dp 4 after 2 steps, resumed on np %d for 3: losses %.2e, parameters %.2e (%s)\n",
           cases[c].np, le, pe, worst);
    assert_true(le <= BOUND);
    assert_true(pe <= BOUND);
  }
}

static int setup(void **state) {
  (void)state;
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_fsdp") != 0) return -1;
  return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_reshard),
      cmocka_unit_test(test_memory),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
