// `tpr train --sft` against transformers' Trainer (tests/fixtures/sft_train
// on the dense Qwen2-VL text decoder, sft_train_qwen3 on Qwen3-MoE;
// scripts/reference/make_sft_train_fixture.py): a token-shard index with
// loss masks, one optimizer step of 4 windows whose learned targets number
// 11, 0, 3 and 9. Step 0's loss (1e-5 relative), gradient norm (1e-5) and
// gradients (1e-4, max|d| / max|g| per tensor) equal PyTorch's
// num_items_in_batch rule on every arrangement of the 4 windows: 2
// micro-batches x 2 rows, 2 replicas (FSDP, dp x ep for the MoE, plain dp),
// tp 2. Control: the per-micro-batch mean rule, recorded by the generator,
// lies far outside the bounds. Also: the shards, the index, a comma list, a
// glob and --data given twice train exactly as their concatenation in one
// file (bit for bit, with and without --sft); a resumed --sft run continues
// as the unbroken one (bit for bit); the index's val split is what `tpr
// eval` and --eval-data score by default; refusals (--sft without masks, a
// glob with no match, an unknown split).
#include "test_util.h"
#include "cli_util.h"
#include "train_harness.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/npy.h"

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define FIX TPR_FIXTURES "/sft_train"
#define MODEL TPR_FIXTURES "/qwen2_vl_tiny"
#define FIX_MOE TPR_FIXTURES "/sft_train_qwen3"
#define MODEL_MOE TPR_FIXTURES "/qwen3_moe_tiny"

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_train_sft_XXXXXX";
static cJSON *meta;

static double meta_num(const char *a, const char *b) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(meta, a);
  if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
  if (!cJSON_IsNumber(x)) fail_msg("meta.json: %s%s%s missing", a, b ? "." : "", b ? b : "");
  return x->valuedouble;
}

// `tpr train --json` at np ranks on `data` with `extra`: the steps' losses
// and gradient norms (steps of each); returns the run (the caller frees).
static run_result train_model(int np, const char *model, const char *data, int steps, const char *const *extra,
                              double *loss, double *norm) {
  char st[16];
  snprintf(st, sizeof st, "%d", steps);
  const char *args[48] = {"train", "--model", model, "--data", data, "--seq-len", "16", "--steps", st, "--json"};
  int n = 10;
  for (int i = 0; extra[i]; i++) args[n++] = extra[i];
  args[n] = NULL;
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 240});
  if (r.code != 0) return r;
  int ns = 0;
  char *copy = strdup(r.out);
  for (char *l = strtok(copy, "\n"); l; l = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(l);
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "step")) && ns < steps) {
      if (loss) loss[ns] = tt_json_num(j, "loss");
      if (norm) norm[ns] = tt_json_num(j, "grad_norm");
      ns++;
    }
    cJSON_Delete(j);
  }
  free(copy);
  assert_int_equal(ns, steps);
  return r;
}

static run_result train(int np, const char *data, int steps, const char *const *extra, double *loss, double *norm) {
  return train_model(np, MODEL, data, steps, extra, loss, norm);
}

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

typedef struct mesh_case {
  int np;
  const char *const *mesh;
} mesh_case;

// Step 0 of `tpr train --sft` on fixture dir `fix` (meta m) with model
// `model` on each mesh case, against PyTorch's loss, norm and gradients;
// the fixture's control must lie far outside the bounds.
static void check_step0(const char *fix, const char *model, const cJSON *m, const mesh_case *cases, int n_cases,
                        const char *const *extra_all) {
  double want_loss = tt_json_num(m, "step0_loss"), want_norm = tt_json_num(m, "step0_grad_norm");
  char ref[4300], control[4300], data[4300];
  snprintf(ref, sizeof ref, "%s/step0_grads.safetensors", fix);
  snprintf(control, sizeof control, "%s/control_grads.safetensors", fix);
  snprintf(data, sizeof data, "%s/data.json", fix);
  for (int i = 0; i < n_cases; i++) {
    const char *dump = tt_path(tmp_dir, "grads.safetensors");
    const char *extra[32] = {"--sft", "--data-order", "sequential", "--dump-grads", dump};
    int n = 5;
    for (int k = 0; cases[i].mesh[k]; k++) extra[n++] = cases[i].mesh[k];
    for (int k = 0; extra_all[k]; k++) extra[n++] = extra_all[k];
    extra[n] = NULL;
    double loss, norm;
    run_result r = train_model(cases[i].np, model, data, 1, extra, &loss, &norm);
    if (r.code != 0) fail_msg("tpr train --sft (np %d): exit %d\n%s", cases[i].np, r.code, r.err);
    tt_run_done(&r);
    const char *worst;
    double g = th_compare_files(dump, ref, 4, &worst);
    printf("  np %d", cases[i].np);
    for (int k = 0; cases[i].mesh[k]; k++) printf(" %s", cases[i].mesh[k]);
    printf(": loss %.9g (rel %.2e), |g| %.9g (rel %.2e), worst gradient %.2e (%s)\n", loss, rel(loss, want_loss),
           norm, rel(norm, want_norm), g, worst);
    assert_true(rel(loss, want_loss) <= TH_LOSS_BOUND);
    assert_true(rel(norm, want_norm) <= TH_LOSS_BOUND);
    assert_true(g <= TH_GRAD_BOUND);
  }
  // The control: per-micro-batch means are far outside every bound.
  const char *worst;
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "control");
  double cg = th_compare_files(control, ref, 4, &worst);
  double cl = rel(tt_json_num(c, "loss"), want_loss), cn = rel(tt_json_num(c, "grad_norm"), want_norm);
  printf("  control (per-micro-batch mean): loss rel %.2e, |g| rel %.2e, gradient %.2e (%s)\n", cl, cn, cg, worst);
  assert_true(cl > 10 * TH_LOSS_BOUND && cn > 10 * TH_LOSS_BOUND && cg > 100 * TH_GRAD_BOUND);
}

// The dense Qwen2-VL text decoder: micro-batches, replicas (FSDP and plain), tp.
static void test_step0_matches_trainer(void **state) {
  (void)state;
  const mesh_case cases[] = {
      {1, ARGS("--micro-batch", "2", "--grad-accum", "2")},
      {2, ARGS("--dp", "2", "--micro-batch", "1", "--grad-accum", "2")},  // FSDP (the dp default)
      {2, ARGS("--dp", "2", "--no-fsdp", "--micro-batch", "2", "--grad-accum", "1")},
      {2, ARGS("--tp", "2", "--micro-batch", "2", "--grad-accum", "2")},
  };
  check_step0(FIX, MODEL, meta, cases, 4, ARGS("--aux-coef", "0"));
}

// Qwen3-MoE (aux loss off, as Trainer runs it by default): experts under
// dp x ep with the all-to-all dispatch and FSDP, plain dp, and tp.
static void test_step0_moe(void **state) {
  (void)state;
  char *text = tt_slurp(FIX_MOE "/meta.json", NULL);
  cJSON *m = cJSON_Parse(text);
  free(text);
  assert_non_null(m);
  const mesh_case cases[] = {
      {1, ARGS("--micro-batch", "2", "--grad-accum", "2")},
      {2, ARGS("--dp", "2", "--ep", "2", "--micro-batch", "1", "--grad-accum", "2")},
      {2, ARGS("--dp", "2", "--no-fsdp", "--micro-batch", "2", "--grad-accum", "1")},
      {2, ARGS("--tp", "2", "--micro-batch", "2", "--grad-accum", "2")},
  };
  check_step0(FIX_MOE, MODEL_MOE, m, cases, 4, ARGS("--aux-coef", "0"));
  cJSON_Delete(m);
}

// The train split's two shards written as one file (tokens and mask).
static void write_concat(const char *tokens_path, const char *mask_path) {
  const char *names[2][2] = {{FIX "/data.train.00000.npy", FIX "/data.train.00000.mask.npy"},
                             {FIX "/data.train.00001.npy", FIX "/data.train.00001.mask.npy"}};
  uint16_t ids[256];
  uint8_t mask[256];
  int64_t n = 0;
  for (int s = 0; s < 2; s++) {
    tpr_npy *t, *m;
    TT_OK(tpr_npy_open(names[s][0], &t));
    TT_OK(tpr_npy_open(names[s][1], &m));
    for (int64_t i = 0; i < tpr_npy_len(t); i++, n++) {
      int64_t v, k;
      TT_OK(tpr_npy_get(t, i, &v));
      TT_OK(tpr_npy_get(m, i, &k));
      ids[n] = (uint16_t)v, mask[n] = (uint8_t)k;
    }
    tpr_npy_close(t), tpr_npy_close(m);
  }
  TT_OK(tpr_npy_write(tokens_path, "<u2", ids, n));
  TT_OK(tpr_npy_write(mask_path, "|u1", mask, n));
}

static void test_shards_equal_concat(void **state) {
  (void)state;
  char whole[4300], mask[4300];
  snprintf(whole, sizeof whole, "%s", tt_path(tmp_dir, "whole.npy"));
  snprintf(mask, sizeof mask, "%s", tt_path(tmp_dir, "whole.mask.npy"));
  write_concat(whole, mask);
  const char *specs[] = {whole, FIX "/data.json", FIX "/data.json:train",
                         FIX "/data.train.00000.npy," FIX "/data.train.00001.npy", FIX "/data.train.*.npy"};
  enum { STEPS = 5 };
  for (int sft = 0; sft < 2; sft++) {
    double want[STEPS], got[STEPS];
    const char *const *extra = sft ? ARGS("--sft", "--seed", "3", "--lr", "1e-2") : ARGS("--seed", "3", "--lr", "1e-2");
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
      run_result r = train(1, specs[k], STEPS, extra, k ? got : want, NULL);
      if (r.code != 0) fail_msg("tpr train --data %s: exit %d\n%s", specs[k], r.code, r.err);
      tt_run_done(&r);
      if (k) assert_memory_equal(got, want, sizeof got);
    }
    // --data given twice: the same list.
    const char *const *twice = sft ? ARGS("--data", FIX "/data.train.00001.npy", "--sft", "--seed", "3", "--lr", "1e-2")
                                   : ARGS("--data", FIX "/data.train.00001.npy", "--seed", "3", "--lr", "1e-2");
    run_result r = train(1, FIX "/data.train.00000.npy", STEPS, twice, got, NULL);
    if (r.code != 0) fail_msg("tpr train --data A --data B: exit %d\n%s", r.code, r.err);
    tt_run_done(&r);
    assert_memory_equal(got, want, sizeof got);
    printf("  %s: %d random-order steps on the shards: the index, a list, --data twice and a glob = the "
           "concatenated file bit for bit (losses %.9g .. %.9g)\n", sft ? "--sft" : "no mask", STEPS, want[0], want[STEPS - 1]);
    assert_true(want[0] != want[STEPS - 1]);  // it trains
  }
}

// --sft resumed from a checkpoint of step 2 continues as the unbroken run:
// the same windows, masks and weights (losses bit for bit), on shards read
// in random order at dp 2.
static void test_resume(void **state) {
  (void)state;
  const char *save = tt_path(tmp_dir, "ckpt");
  char save_dir[4300];
  snprintf(save_dir, sizeof save_dir, "%s", save);
  double full[4], half[2], rest[2];
  run_result r = train(2, FIX "/data.json", 4, ARGS("--sft", "--dp", "2", "--seed", "5", "--lr", "1e-2"), full, NULL);
  if (r.code != 0) fail_msg("unbroken run: exit %d\n%s", r.code, r.err);
  tt_run_done(&r);
  // 2 report lines of a 4-step schedule (the later --steps wins over the helper's).
  r = train(2, FIX "/data.json", 2,
            ARGS("--sft", "--dp", "2", "--seed", "5", "--lr", "1e-2", "--steps", "4", "--stop-after", "2", "--save",
                 save_dir), half, NULL);
  if (r.code != 0) fail_msg("first half: exit %d\n%s", r.code, r.err);
  tt_run_done(&r);
  const char *args[] = {"train", "--resume", save_dir, "--data", FIX "/data.json", "--sft", "--seq-len", "16",
                        "--steps", "4", "--dp", "2", "--lr", "1e-2", "--json", NULL};
  r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = 2, .timeout_s = 240});
  if (r.code != 0) fail_msg("resume: exit %d\n%s", r.code, r.err);
  int ns = 0;
  for (char *l = strtok(r.out, "\n"); l; l = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(l);
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "step")) && ns < 2) rest[ns++] = tt_json_num(j, "loss");
    cJSON_Delete(j);
  }
  tt_run_done(&r);
  assert_int_equal(ns, 2);
  printf("  unbroken %.9g %.9g %.9g %.9g; stopped %.9g %.9g, resumed %.9g %.9g\n", full[0], full[1], full[2],
         full[3], half[0], half[1], rest[0], rest[1]);
  assert_true(half[0] == full[0] && half[1] == full[1] && rest[0] == full[2] && rest[1] == full[3]);
}

static double tpr_eval(const char *data, int64_t *windows) {
  run_result r = tt_run(tpr_path, tmp_dir, ARGS("eval", "--model", MODEL, "--data", data, "--seq-len", "16", "--json"),
                        &(tt_run_opts){.timeout_s = 120});
  if (r.code != 0) fail_msg("tpr eval --data %s: exit %d\n%s", data, r.code, r.err);
  cJSON *j = cJSON_Parse(strstr(r.out, "{\"command\""));
  double loss = tt_json_num(j, "loss");
  *windows = (int64_t)tt_json_num(j, "windows");
  cJSON_Delete(j);
  tt_run_done(&r);
  return loss;
}

static void test_val_split(void **state) {
  (void)state;
  double want = meta_num("val", "loss");
  int64_t w1, w2, w3;
  double a = tpr_eval(FIX "/data.json", &w1), b = tpr_eval(FIX "/data.json:val", &w2);
  double c = tpr_eval(FIX "/data.json:train", &w3);
  printf("  tpr eval: data.json %.9g (%lld windows), :val %.9g, :train %.9g (%lld windows); PyTorch's val %.9g\n", a,
         (long long)w1, b, c, (long long)w3, want);
  assert_true(w1 == 2 && w2 == 2 && w3 == 4);
  assert_true(rel(a, want) <= TH_LOSS_BOUND && a == b);
  assert_true(rel(c, want) > 100 * TH_LOSS_BOUND);  // the train split is another stream
  // --eval-data PREFIX.json: the val split by default (lr tiny: the model unchanged).
  run_result r = train(1, FIX "/data.json", 1, ARGS("--sft", "--lr", "1e-30", "--eval-data", FIX "/data.json"), NULL,
                       NULL);
  if (r.code != 0) fail_msg("tpr train --eval-data: exit %d\n%s", r.code, r.err);
  cJSON *j = cJSON_Parse(strstr(r.out, "{\"eval\""));
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eval");
  printf("  tpr train --eval-data data.json: %.9g over %g windows\n", tt_json_num(e, "loss"), tt_json_num(e, "windows"));
  assert_true(rel(tt_json_num(e, "loss"), want) <= TH_LOSS_BOUND && tt_json_num(e, "windows") == 2);
  cJSON_Delete(j);
  tt_run_done(&r);
}

static void test_refusals(void **state) {
  (void)state;
  char bare[4300];
  snprintf(bare, sizeof bare, "%s", tt_path(tmp_dir, "nomask.npy"));
  int32_t v[40];
  for (int i = 0; i < 40; i++) v[i] = i;
  tt_write_npy_i32(bare, v, 40);
  const struct {
    const char *data;
    const char *const *extra;
    const char *want;
  } cases[] = {
      {bare, ARGS("--sft"), "nomask.mask.npy: No such file"},
      {FIX "/nothing.*.npy", ARGS("--sft"), "matches no file"},
      {FIX "/data.json:test", ARGS("--sft"), "data.json:test': unknown split 'test'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_result r = train(1, cases[i].data, 1, cases[i].extra, NULL, NULL);
    const char *msg = strstr(r.err, "tpr") ? strstr(r.err, "tpr") : r.err;
    printf("  --data %s: exit %d: %s", cases[i].data, r.code, msg);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, cases[i].want));
    tt_run_done(&r);
  }
}

static int setup(void **state) {
  (void)state;
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_train_sft") != 0 || !mkdtemp(tmp_dir)) return -1;
  char *text = tt_slurp(FIX "/meta.json", NULL);
  meta = text ? cJSON_Parse(text) : NULL;
  free(text);
  return meta ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  cJSON_Delete(meta);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step0_matches_trainer),
      cmocka_unit_test(test_step0_moe),
      cmocka_unit_test(test_shards_equal_concat),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_val_split),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
