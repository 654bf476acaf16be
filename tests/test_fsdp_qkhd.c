// FSDP (`tpr train --fsdp`; shard/fsdp.h) for the per-head QK-norm families
// built by models/qk_head_decoder.c, against plain training of the
// concatenated batch on one rank: 5 AdamW steps' losses, gradient norms and
// parameters at dp 2 and 4, with tp 2 and with ep 2.
//   qwen3_moe:      a dense-MLP layer (0) beside MoE layers; also without
//                   prefetch/reshard, bf16 params, both negative controls
//                   (gradients summed instead of averaged, a rank keeping
//                   the next rank's chunk), bytes per rank at dp 4 against
//                   dp 1, and a checkpoint saved at dp 4 resumed at dp 2 / 1.
//   hunyuan_v1_moe: the shared expert (and QK-norm after RoPE).
//   qwen3_vl_moe:   MRoPE with the fixture's positions_3d, which FSDP leaves
//                   as they are.
//   qwen2_vl:       no experts; its q/k/v biases chunked like any param.
//   minimax:        its own builder (models/minimax.c): lightning layers
//                   (whole-width norm weights, the family's constants never
//                   chunked) beside a softmax layer; run alone as
//                   `test_fsdp_qkhd minimax` (ctest test_fsdp_minimax).
// Every run reads the windows in a permutation seeded from TPR_TEST_SEED
// (fresh data each run; the same windows for every layout of one check).
#include "test_util.h"
#include "cli_util.h"
#include "fsdp_runs.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/safetensors.h"

#define BOUND 1e-5      // relative: losses, gradient norms, ||a - b|| / ||b|| of every parameter tensor
#define DP_BOUND 3e-6   // losses and gradient norms, FSDP against plain data parallelism of the same layout
#define BF16_BOUND 1e-4  // bf16 params: losses, gradient norms, parameters (see test_bf16)
#define CONTROL 1e-3    // a negative control must differ by more than this
#define MEMORY_BAR 0.3  // params + gradients + optimizer bytes per rank, dp 4 / dp 1

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_fsdp_qkhd_XXXXXX";
static char seed_arg[32];

// A family's fixtures: the tiny checkpoint and its training data.
typedef struct family {
  const char *name, *model, *data;
  const char *pos3;  // MRoPE: the (3, T) positions file, else NULL
} family;

static const family QWEN3 = {"qwen3_moe", TPR_FIXTURES "/qwen3_moe_tiny", TPR_FIXTURES "/qwen3_moe_train/tokens.npy",
                             NULL};
static const family HUNYUAN = {"hunyuan_v1_moe", TPR_FIXTURES "/hunyuan_moe_tiny",
                               TPR_FIXTURES "/hunyuan_moe_train/tokens.npy", NULL};
static const family QWEN2_VL = {"qwen2_vl", TPR_FIXTURES "/qwen2_vl_tiny", TPR_FIXTURES "/qwen2_vl_train/tokens.npy",
                                TPR_FIXTURES "/qwen2_vl_train/positions_3d.npy"};
static const family QWEN3_VL = {"qwen3_vl_moe", TPR_FIXTURES "/qwen3_vl_moe_tiny",
                                TPR_FIXTURES "/qwen3_vl_moe_train/tokens.npy",
                                TPR_FIXTURES "/qwen3_vl_moe_train/positions_3d.npy"};

static const family MINIMAX = {"minimax", TPR_FIXTURES "/minimax_tiny", TPR_FIXTURES "/minimax_train/tokens.npy",
                                NULL};

typedef struct dir_name { char s[512]; } dir_name;
static dir_name dir_of(const char *name) {
  dir_name d;
  snprintf(d.s, sizeof d.s, "%s/%s", tmp_dir, name);
  return d;
}


// `tpr train` on f's fixture (5 steps unless args say otherwise, seeded
// window order, etp 1 so the expert layout does not follow the world size);
// saves to `save` if given.
static run train(const family *f, int np, const char *save, const char *const *args) {
  const char *a[64] = {"train", "--data", f->data, "--data-order", "random", "--seed", seed_arg, "--seq-len", "16",
                       "--steps", "5", "--lr", "1e-3", "--ep", "1", "--etp", "1", "--json"};
  int n = 18;
  if (save) a[n++] = "--save", a[n++] = save;
  if (f->pos3) a[n++] = "--positions-3d", a[n++] = f->pos3;
  bool model = false;
  for (int i = 0; args[i]; i++) model = model || !strcmp(args[i], "--resume") || !strcmp(args[i], "--config");
  if (!model) a[n++] = "--model", a[n++] = f->model;
  for (int i = 0; args[i]; i++) a[n++] = args[i];
  a[n] = NULL;
  run_result r = tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.np = np, .timeout_s = 300});
  if (r.code != 0) fail_msg("%s: tpr train (np %d) failed with %d: %s", f->name, np, r.code, r.err);
  run out = fr_parse(r.out);
  tt_run_done(&r);
  return out;
}



// args + more (both NULL-terminated) in buf (cap 32).
static const char *const *join(const char **buf, const char *const *args, const char *const *more) {
  int n = 0;
  for (int i = 0; args[i]; i++) buf[n++] = args[i];
  for (int i = 0; more && more[i]; i++) buf[n++] = more[i];
  buf[n] = NULL;
  return buf;
}

// f on np ranks in `layout` (--dp/--tp/--ep/--micro-batch), FSDP with
// `extra` flags, against (1) plain data parallelism of the same layout
// (--no-fsdp), which differs only in the order of the replicas' reduction
// (per sequence in FSDP's reduce-scatter, per step in DP's all-reduce):
// losses and gradient norms to DP_BOUND, parameters to BOUND; (2) the
// one-rank run `ref` of the concatenated batch: losses, gradient norms and
// parameters to BOUND beyond plain data parallelism's own distance from it. A rarely routed expert's AdamW update amplifies the
// reduction order's rounding (measured over 10 seeds: up to 1.1e-5 for
// plain DP against one rank, 1.4e-6 for FSDP against plain DP; and
// TPR_TEST_SEED=409464270582350 gives Hunyuan at np 4, dp 4 a gradient-norm
// difference of 1.02e-6 from the reduction order alone, hence DP_BOUND
// 3e-6); a real bug moves parameters by 1e-3 or more and the norms by 1e-1. A control (extra holds --debug-fsdp)
// must differ from both.
static void check(const family *f, int np, const char *const *layout, const char *const *extra, const run *ref,
                  const char *ref_dir, bool control) {
  dir_name fd = dir_of("got"), dd = dir_of("plain");
  const char *a[32], *b[32];
  run got = train(f, np, fd.s, join(a, layout, extra));
  run dp = train(f, np, dd.s, join(b, layout, ARGS("--no-fsdp")));
  const char *w1, *w2, *w3;
  double le = fr_step_err(&got, ref, false), ge = fr_step_err(&got, ref, true), pe = fr_compare_dirs(fd.s, ref_dir, &w1);
  double dl = fr_step_err(&got, &dp, false), dg = fr_step_err(&got, &dp, true), dpe = fr_compare_dirs(fd.s, dd.s, &w2);
  double base = fr_compare_dirs(dd.s, ref_dir, &w3);
  double base_l = fr_step_err(&dp, ref, false), base_g = fr_step_err(&dp, ref, true);
  printf("  %s np %d", f->name, np);
  for (int i = 0; layout[i]; i++) printf(" %s", layout[i]);
  for (int i = 0; extra[i]; i++) printf(" %s", extra[i]);
  printf("%s: gathered %.0f B/step\n    against plain DP: losses %.2e, gradient norms %.2e, parameters %.2e (%s)\n"
         "    against one rank: losses %.2e, gradient norms %.2e, parameters %.2e (%s; plain DP %.2e, %.2e, %.2e)\n",
         control ? " [negative control]" : "", got.gathered, dl, dg, dpe, w2, le, ge, pe, w1, base_l, base_g, base);
  // The run must really have gathered its params (FSDP on), and the plain
  // one not, or the comparison says nothing about FSDP.
  assert_true(got.gathered > 0);
  assert_true(dp.gathered == 0);
  // AdamW with clipping is blind to a constant gradient scale (a sum over
  // dp instead of the mean moves no parameter): the norms catch it.
  if (control) {
    assert_true(dpe > CONTROL || dg > CONTROL);
    assert_true(pe > CONTROL || ge > CONTROL);
  } else {
    // The norms' reduction-order noise on a seed where plain DP itself is
    // far from one rank (minimax, TPR_TEST_SEED=316898983268122: plain DP
    // 2.5e-5 from one rank, FSDP 4.7e-5 from plain DP, parameters 1e-7)
    // is allowed: twice plain DP's distance, as the one-rank checks allow it.
    assert_true(dl <= DP_BOUND + 2 * base_l && dg <= DP_BOUND + 2 * base_g && dpe <= BOUND);
    assert_true(le <= BOUND + base_l && ge <= BOUND + base_g);
    assert_true(pe <= BOUND + base);
  }
}

// The reference: one rank, plain training, the concatenated batch of 4 windows.
static run reference(const family *f, const char *dir) {
  run r = train(f, 1, dir, ARGS("--micro-batch", "4", "--no-fsdp"));
  assert_int_equal(r.steps, 5);
  assert_true(r.gathered == 0);
  printf("  %s reference (np 1, no FSDP): losses %.4f .. %.4f\n", f->name, r.loss[0], r.loss[4]);
  return r;
}

#define DP2 ARGS("--dp", "2", "--micro-batch", "2")
#define DP4 ARGS("--dp", "4", "--micro-batch", "1")
#define DP2_TP2 ARGS("--dp", "2", "--tp", "2", "--micro-batch", "2")
#define DP2_EP2 ARGS("--dp", "2", "--ep", "2", "--micro-batch", "2")
#define FSDP ARGS("--fsdp")

static void test_qwen3(void **state) {
  (void)state;
  dir_name rd = dir_of("ref_qwen3");
  run r = reference(&QWEN3, rd.s);
  check(&QWEN3, 2, DP2, FSDP, &r, rd.s, false);
  check(&QWEN3, 4, DP4, FSDP, &r, rd.s, false);
  check(&QWEN3, 4, DP2_TP2, FSDP, &r, rd.s, false);
  check(&QWEN3, 2, DP2_EP2, FSDP, &r, rd.s, false);
  check(&QWEN3, 4, DP4, ARGS("--fsdp", "--no-prefetch", "--no-reshard"), &r, rd.s, false);
  // Negative controls: either bug must move the parameters or the norms.
  check(&QWEN3, 2, DP2, ARGS("--fsdp", "--debug-fsdp", "sum-grads"), &r, rd.s, true);
  check(&QWEN3, 2, DP2, ARGS("--fsdp", "--debug-fsdp", "wrong-shard"), &r, rd.s, true);
}

static void test_hunyuan(void **state) {
  (void)state;
  dir_name rd = dir_of("ref_hunyuan");
  run r = reference(&HUNYUAN, rd.s);
  check(&HUNYUAN, 4, DP4, FSDP, &r, rd.s, false);
  check(&HUNYUAN, 4, DP2_TP2, FSDP, &r, rd.s, false);
  check(&HUNYUAN, 2, DP2_EP2, FSDP, &r, rd.s, false);
  check(&HUNYUAN, 2, DP2, ARGS("--fsdp", "--debug-fsdp", "wrong-shard"), &r, rd.s, true);
}

static void test_qwen3_vl(void **state) {
  (void)state;
  dir_name rd = dir_of("ref_qwen3_vl");
  run r = reference(&QWEN3_VL, rd.s);
  check(&QWEN3_VL, 2, DP2, FSDP, &r, rd.s, false);
  check(&QWEN3_VL, 4, DP2_TP2, FSDP, &r, rd.s, false);
  check(&QWEN3_VL, 4, ARGS("--dp", "2", "--tp", "2", "--ep", "2", "--micro-batch", "2"), FSDP, &r, rd.s, false);
  check(&QWEN3_VL, 2, DP2, ARGS("--fsdp", "--debug-fsdp", "sum-grads"), &r, rd.s, true);
}

// qwen2_vl: no experts, q/k/v biases (1-D column params chunked like any
// other), sectioned MRoPE at the fixture's positions.
static void test_qwen2_vl(void **state) {
  (void)state;
  dir_name rd = dir_of("ref_qwen2_vl");
  run r = reference(&QWEN2_VL, rd.s);
  check(&QWEN2_VL, 2, DP2, FSDP, &r, rd.s, false);
  check(&QWEN2_VL, 4, DP4, FSDP, &r, rd.s, false);
  check(&QWEN2_VL, 4, DP2_TP2, FSDP, &r, rd.s, false);
  check(&QWEN2_VL, 2, DP2, ARGS("--fsdp", "--debug-fsdp", "wrong-shard"), &r, rd.s, true);
}

// minimax: dp 2, dp 2 x tp 2 (2 lightning heads per rank), dp 2 x ep 2, and
// dp 2 without prefetch/reshard; both negative controls (a rank keeping the
// next rank's chunk, gradients summed instead of averaged).
static void test_minimax(void **state) {
  (void)state;
  dir_name rd = dir_of("ref_minimax");
  run r = reference(&MINIMAX, rd.s);
  check(&MINIMAX, 2, DP2, FSDP, &r, rd.s, false);
  check(&MINIMAX, 4, DP2_TP2, FSDP, &r, rd.s, false);
  check(&MINIMAX, 2, DP2_EP2, FSDP, &r, rd.s, false);
  check(&MINIMAX, 2, DP2, ARGS("--fsdp", "--no-prefetch", "--no-reshard"), &r, rd.s, false);
  check(&MINIMAX, 2, DP2, ARGS("--fsdp", "--debug-fsdp", "wrong-shard"), &r, rd.s, true);
  check(&MINIMAX, 2, DP2, ARGS("--fsdp", "--debug-fsdp", "sum-grads"), &r, rd.s, true);
}

// bf16 params (FSDP only, so no plain run to compare with): dp 2 and dp 2 x
// tp 2 against dp 1 with the same bf16 params, to BF16_BOUND: an f32 master
// one rounding step away (the reduction order) can round to the
// neighbouring bf16 value, 2^-8 relative on that element, and the next
// step's losses and gradients see it (measured over 12 seeds: gradient
// norms up to 9e-6, parameters 1.5e-5).
static void test_bf16(void **state) {
  (void)state;
  dir_name rd = dir_of("ref_bf16"), fd = dir_of("ref_f32");
  run r = train(&QWEN3, 1, rd.s, ARGS("--micro-batch", "4", "--fsdp", "--param-dtype", "bf16"));
  const char *const *layouts[2] = {DP2, DP2_TP2};
  for (int i = 0; i < 2; i++) {
    dir_name gd = dir_of("got_bf16");
    const char *a[32];
    int np = i ? 4 : 2;
    run got = train(&QWEN3, np, gd.s, join(a, layouts[i], ARGS("--fsdp", "--param-dtype", "bf16")));
    const char *worst;
    double le = fr_step_err(&got, &r, false), ge = fr_step_err(&got, &r, true), pe = fr_compare_dirs(gd.s, rd.s, &worst);
    printf("  qwen3_moe bf16 params np %d %s: losses %.2e, gradient norms %.2e, parameters %.2e (%s)\n", np,
           i ? "dp 2 tp 2" : "dp 2", le, ge, pe, worst);
    assert_true(got.gathered > 0);
    assert_true(le <= BF16_BOUND && ge <= BF16_BOUND && pe <= BF16_BOUND);
  }
  // bf16 params really are rounded: against f32 params they differ.
  train(&QWEN3, 1, fd.s, ARGS("--micro-batch", "4", "--no-fsdp"));
  const char *worst;
  double d = fr_compare_dirs(rd.s, fd.s, &worst);
  printf("  qwen3_moe bf16 against f32 params: %.2e (%s)\n", d, worst);
  assert_true(d > BF16_BOUND);
}

static void test_memory(void **state) {
  (void)state;
  char cfg[4096];
  tt_configs_dir(cfg, sizeof cfg);
  strcat(cfg, "/qwen3_moe_tiny.json");
  run one = train(&QWEN3, 1, NULL, ARGS("--config", cfg, "--random-init", "--steps", "1", "--no-fsdp"));
  run four = train(&QWEN3, 4, NULL, ARGS("--config", cfg, "--random-init", "--steps", "1", "--fsdp", "--dp", "4"));
  double a = one.mem[0] + one.mem[1] + one.mem[2], b = four.mem[0] + four.mem[1] + four.mem[2];
  printf("  qwen3_moe_tiny config: params + gradients + optimizer per rank: dp 1 %.1f KiB (params %.1f, grads %.1f, "
         "optimizer %.1f), dp 4 FSDP %.1f KiB (params %.1f, grads %.1f, optimizer %.1f): ratio %.3f (bar %.1f)\n",
         a / 1024, one.mem[0] / 1024, one.mem[1] / 1024, one.mem[2] / 1024, b / 1024, four.mem[0] / 1024,
         four.mem[1] / 1024, four.mem[2] / 1024, b / a, MEMORY_BAR);
  assert_true(a > 0 && b > 0);
  assert_true(four.gathered > 0);
  assert_true(b <= MEMORY_BAR * a);
}

// Saved at dp 4 after 2 steps; resumed on dp 2 (FSDP) and on one rank.
static void test_reshard(void **state) {
  (void)state;
  dir_name rd = dir_of("ref_5"), hd = dir_of("half");
  const char *ref = rd.s, *half = hd.s;
  run r = train(&QWEN3, 1, ref, ARGS("--micro-batch", "4", "--no-fsdp"));  // uninterrupted
  // The first 2 steps at dp 4 carry dp 4's reduction order: its distance
  // from one rank, uninterrupted, is the baseline (see check).
  dir_name ud = dir_of("full_dp4");
  train(&QWEN3, 4, ud.s, ARGS("--fsdp", "--dp", "4", "--micro-batch", "1"));
  const char *bw;
  double base = fr_compare_dirs(ud.s, ref, &bw);
  train(&QWEN3, 4, half, ARGS("--fsdp", "--dp", "4", "--micro-batch", "1", "--stop-after", "2"));
  const struct {
    int np;
    const char *const *args;
  } cases[] = {{2, ARGS("--resume", half, "--fsdp", "--dp", "2", "--micro-batch", "2")},
               {1, ARGS("--resume", half, "--micro-batch", "4", "--no-fsdp")}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    dir_name d = dir_of("resumed");
    run got = train(&QWEN3, cases[c].np, d.s, cases[c].args);
    assert_int_equal(got.steps, 3);
    double le = 0;
    for (int i = 0; i < 3; i++) {
      double e = fabs(got.loss[i] - r.loss[2 + i]) / fabs(r.loss[2 + i]);
      le = e > le ? e : le;
    }
    const char *worst;
    double pe = fr_compare_dirs(d.s, ref, &worst);
    printf("  qwen3_moe saved at dp 4 after 2 steps, resumed on np %d for 3: losses %.2e, parameters %.2e (%s; "
           "uninterrupted dp 4: %.2e)\n", cases[c].np, le, pe, worst, base);
    assert_true(le <= BOUND);
    assert_true(pe <= BOUND + base);
  }
}

static int setup(void **state) {
  (void)state;
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_fsdp_qkhd") != 0) return -1;
  return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

// No argument: the per-head QK-norm families; "minimax": that family alone
// (its own ctest, so either can be run without the other).
int main(int argc, char **argv) {
  snprintf(seed_arg, sizeof seed_arg, "%llu", (unsigned long long)(tt_seed_from_env() % 1000000007ULL));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_qwen3),  cmocka_unit_test(test_hunyuan), cmocka_unit_test(test_qwen3_vl),
      cmocka_unit_test(test_qwen2_vl),
      cmocka_unit_test(test_bf16),   cmocka_unit_test(test_reshard), cmocka_unit_test(test_memory),
  };
  const struct CMUnitTest minimax[] = {cmocka_unit_test(test_minimax)};
  if (argc == 2 && !strcmp(argv[1], "minimax")) {
    return cmocka_run_group_tests_name("test_fsdp_minimax", minimax, setup, teardown);
  }
  if (argc != 1) {
    fprintf(stderr, "usage: test_fsdp_qkhd [minimax]\n");
    return 2;
  }
  return cmocka_run_group_tests(tests, setup, teardown);
}
