// `tpr train` on the Qwen3-MoE fixture against PyTorch (transformers'
// Qwen3MoeForCausalLM + torch.optim.AdamW + clip_grad_norm_, f32:
// scripts/reference/make_qwen3_train_fixture.py, tests/fixtures/qwen3_moe_train):
// step 0's loss and every parameter's gradient at tp 1, tp 2, tp 4 (KV heads
// replicated), expert-parallel and data-parallel meshes; the AdamW steps'
// losses and parameters; a resume bit for bit; negative controls (the aux loss left out, a missing
// backward all-reduce of the per-head norm weights or of the column inputs
// must fail the gradient bound); refusals.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/safetensors.h"

#define LOSS_BOUND 1e-5   // relative, step 0 (the bar)
#define GRAD_BOUND 1e-4   // max|d| / max|g| per tensor (the bar)
#define STEPS_BOUND 1e-4  // relative, losses and parameters after the AdamW steps

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_train_qwen3_XXXXXX";
static cJSON *meta;

#define FIX TPR_FIXTURES "/qwen3_moe_train"
#define MODEL TPR_FIXTURES "/qwen3_moe_tiny"
#define MESH(...) ((const char *const[]){__VA_ARGS__, NULL})

// meta.json's number at a dotted path, or element `index` of the array there.
static double meta_at(const char *path, int index) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  const cJSON *x = meta;
  for (char *k = strtok(buf, "."); k && x; k = strtok(NULL, ".")) x = cJSON_GetObjectItemCaseSensitive(x, k);
  if (index >= 0) x = cJSON_GetArrayItem(x, index);
  if (!cJSON_IsNumber(x)) fail_msg("meta.json: %s[%d] missing", path, index);
  return x->valuedouble;
}

// Appends the fixture's hyperparameters (a `steps`-step schedule) to args.
// aux: the aux-loss weight to pass (the fixture's unless a control changes it).
static void add_hparams(const char **args, int *n, int steps, double aux) {
  static char v[7][32];
  snprintf(v[0], sizeof v[0], "%d", steps);
  snprintf(v[1], sizeof v[1], "%.17g", meta_at("optimizer.lr_schedule.lr_max", -1));
  snprintf(v[2], sizeof v[2], "%d", (int)meta_at("optimizer.lr_schedule.warmup", -1));
  snprintf(v[3], sizeof v[3], "%.17g", meta_at("optimizer.lr_schedule.min_lr", -1));
  snprintf(v[4], sizeof v[4], "%.17g", meta_at("optimizer.weight_decay.ndim>=2", -1));
  snprintf(v[5], sizeof v[5], "%.17g", meta_at("optimizer.grad_clip.max_norm", -1));
  snprintf(v[6], sizeof v[6], "%.17g", aux);
  const char *flags[7] = {"--steps", "--lr", "--warmup", "--min-lr", "--weight-decay", "--clip", "--aux-coef"};
  for (int i = 0; i < 7; i++) args[(*n)++] = flags[i], args[(*n)++] = v[i];
}

// One `tpr train` run; returns the per-step JSON reports (`steps` of them).
static cJSON *train(int np, const char *const *mesh, int steps, double aux, const char *const *extra) {
  const char *args[64] = {"train", "--model", MODEL, "--data", FIX "/tokens.npy", "--data-order", "sequential",
                          "--seq-len", "16", "--json"};
  int n = 10;
  add_hparams(args, &n, steps, aux);
  for (int i = 0; mesh && mesh[i]; i++) args[n++] = mesh[i];
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 240});
  if (r.code != 0) fail_msg("tpr train (np %d) failed with %d: %s", np, r.code, r.err);
  cJSON *out = cJSON_CreateArray();
  for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(line);
    if (j && cJSON_GetObjectItemCaseSensitive(j, "step") && !cJSON_GetObjectItemCaseSensitive(j, "summary"))
      cJSON_AddItemToArray(out, j);
    else
      cJSON_Delete(j);
  }
  tt_run_done(&r);
  assert_int_equal(cJSON_GetArraySize(out), steps);
  return out;
}

static double step_num(const cJSON *steps, int i, const char *key) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(steps, i), key);
  if (!cJSON_IsNumber(x)) fail_msg("step %d: %s missing", i, key);
  return x->valuedouble;
}

// Worst max|a-b|/max|b| over the tensors of `want` (every one must be in got).
static double compare_files(const char *got_path, const char *want_path, const char **worst_name) {
  tpr_st_set *got, *want;
  if (tpr_st_open(got_path, &got) != TPR_OK) fail_msg("%s: %s", got_path, tpr_last_error());
  if (tpr_st_open(want_path, &want) != TPR_OK) fail_msg("%s: %s", want_path, tpr_last_error());
  static char name[160];
  double worst = 0;
  int n_tensors = 0;
  for (int i = 0; tpr_st_get(want, i); i++, n_tensors++) {
    const tpr_st_tensor *w = tpr_st_get(want, i), *g = tpr_st_find(got, w->name);
    if (!g) fail_msg("%s has no %s", got_path, w->name);
    int64_t n = 1, start[2] = {0, 0};
    for (int d = 0; d < w->ndim; d++) n *= w->shape[d];
    if (g->ndim != w->ndim || g->shape[0] != w->shape[0] || (w->ndim == 2 && g->shape[1] != w->shape[1]))
      fail_msg("%s: shape differs", w->name);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    TT_OK(tpr_st_read_f32(got, w->name, start, w->shape, a));
    TT_OK(tpr_st_read_f32(want, w->name, start, w->shape, b));
    double md = 0, mb = 0;
    for (int64_t k = 0; k < n; k++) {
      double d = fabs((double)a[k] - b[k]);
      md = isnan(d) ? INFINITY : d > md ? d : md;
      mb = fabs(b[k]) > mb ? fabs(b[k]) : mb;
    }
    double rel = mb > 0 ? md / mb : md;
    if (rel > worst) worst = rel, snprintf(name, sizeof name, "%s", w->name);
    free(a), free(b);
  }
  tpr_st_close(got), tpr_st_close(want);
  assert_true(n_tensors > 50);  // every trained tensor of the 4-layer fixture is compared
  if (worst_name) *worst_name = name;
  return worst;
}

// Step 0 on one mesh: the loss and every gradient against PyTorch's.
static double step0(int np, const char *const *mesh, double aux, const char *const *extra, double *loss_err) {
  const char *dump = tt_path(tmp_dir, "grads.safetensors");
  unlink(dump);
  const char *args[24] = {"--dump-grads", dump};
  int n = 2;
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  args[n] = NULL;
  cJSON *steps = train(np, mesh, 1, aux, args);
  double want = meta_at("records.loss", 0);
  *loss_err = fabs(step_num(steps, 0, "loss") - want) / fabs(want);
  cJSON_Delete(steps);
  const char *worst;
  double g = compare_files(dump, FIX "/step0_grads.safetensors", &worst);
  printf("  np %d", np);
  for (int i = 0; mesh && mesh[i]; i++) printf(" %s", mesh[i]);
  for (int i = 0; extra && extra[i]; i++) printf(" %s", extra[i]);
  printf(": loss rel err %.2e, worst gradient %.2e (%s)\n", *loss_err, g, worst);
  return g;
}

static void test_step0_meshes(void **state) {
  (void)state;
  double aux = meta_at("model.router_aux_loss_coef", -1);
  struct {
    int np;
    const char *const *mesh;
  } cases[] = {
      {1, MESH("--grad-accum", "2")},
      {2, MESH("--grad-accum", "2", "--tp", "2")},
      {4, MESH("--grad-accum", "2", "--tp", "4")},  // 2 KV heads replicated over 4 ranks
      {2, MESH("--grad-accum", "2", "--tp", "2", "--ep", "2", "--etp", "1")},
      {4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "2", "--etp", "2")},
      {2, MESH("--dp", "2", "--tp", "1", "--ep", "2")},  // one window per replica
      {4, MESH("--dp", "2", "--tp", "2", "--ep", "2", "--etp", "1", "--moe-dispatch", "alltoall")},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    double le, ge = step0(cases[i].np, cases[i].mesh, aux, NULL, &le);
    assert_true(le <= LOSS_BOUND);
    assert_true(ge <= GRAD_BOUND);
  }
}

// Negative controls: the forward is the same (the aux loss only adds), but
// without the aux loss the routers' gradients miss its part, and without the
// backward all-reduce of the per-head norm weights or of the column-parallel
// inputs the tp 2 gradients are partial.
static void test_controls_fail(void **state) {
  (void)state;
  double aux = meta_at("model.router_aux_loss_coef", -1), le;
  const char *const *tp1 = MESH("--grad-accum", "2"), *const *tp2 = MESH("--grad-accum", "2", "--tp", "2");
  double no_aux = step0(1, tp1, 0.0, NULL, &le);
  double qk = step0(2, tp2, aux, MESH("--debug-skip-grad-marks", "qk-norm"), &le);
  assert_true(le <= LOSS_BOUND);
  double col = step0(2, tp2, aux, MESH("--debug-skip-grad-marks", "column"), &le);
  assert_true(le <= LOSS_BOUND);
  printf("  controls: aux loss left out %.2e, per-head norm weights' all-reduce left out %.2e, column inputs' "
         "%.2e (each must exceed %.0e)\n", no_aux, qk, col, 100 * GRAD_BOUND);
  assert_true(no_aux > 100 * GRAD_BOUND);
  assert_true(qk > 100 * GRAD_BOUND);
  assert_true(col > 100 * GRAD_BOUND);
}

// The fixture's AdamW steps (warmup, cosine decay, clipping) equal PyTorch's:
// every step's loss, and the saved parameters after them.
static void test_steps(void **state) {
  (void)state;
  int total = (int)meta_at("optimizer.steps", -1);
  double aux = meta_at("model.router_aux_loss_coef", -1);
  const char *const *meshes[] = {MESH("--grad-accum", "2"), MESH("--grad-accum", "2", "--tp", "2", "--ep", "2",
                                                                 "--etp", "1")};
  int nps[] = {1, 2};
  for (int m = 0; m < 2; m++) {
    const char *save = tt_path(tmp_dir, m ? "steps_tp2" : "steps_tp1");
    cJSON *steps = train(nps[m], meshes[m], total, aux, MESH("--save", save));
    double worst = 0;
    for (int s = 0; s < total; s++) {
      double want = meta_at("records.loss", s), e = fabs(step_num(steps, s, "loss") - want) / fabs(want);
      worst = e > worst ? e : worst;
    }
    cJSON_Delete(steps);
    const char *wn;
    double pe = compare_files(tt_path(save, "model.safetensors"), FIX "/final_params.safetensors", &wn);
    printf("  np %d, %d steps: worst loss rel err %.2e; parameters after them %.2e (%s)\n", nps[m], total, worst,
           pe, wn);
    assert_true(worst <= STEPS_BOUND);
    assert_true(pe <= STEPS_BOUND);
    char *cfg = tt_slurp(tt_path(save, "config.json"), NULL);  // what from_pretrained reads the class from
    assert_non_null(strstr(cfg, "qwen3_moe"));
    free(cfg);
  }
}

// A run stopped half-way and resumed from its checkpoint reaches the
// uninterrupted run's weights and moments bit for bit.
static void test_resume_bit_identical(void **state) {
  (void)state;
  int total = 4;
  double aux = meta_at("model.router_aux_loss_coef", -1);
  const char *full = tt_path(tmp_dir, "full"), *half = tt_path(tmp_dir, "half"), *rest = tt_path(tmp_dir, "rest");
  const char *const *mesh = MESH("--grad-accum", "2", "--tp", "2");
  cJSON_Delete(train(2, mesh, total, aux, MESH("--save", full)));
  const char *args[64] = {"train", "--model", MODEL, "--data", FIX "/tokens.npy", "--data-order", "sequential",
                          "--seq-len", "16", "--save", half, "--stop-after", "2", "--tp", "2", "--grad-accum", "2"};
  int n = 17;
  add_hparams(args, &n, total, aux);
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = 2, .timeout_s = 240});
  if (r.code != 0) fail_msg("stopped run failed: %s", r.err);
  tt_run_done(&r);
  // --resume loads the weights, moments and step from the directory alone.
  const char *res[64] = {"train", "--resume", half, "--data", FIX "/tokens.npy", "--data-order", "sequential",
                         "--seq-len", "16", "--save", rest, "--tp", "2", "--grad-accum", "2"};
  n = 15;
  add_hparams(res, &n, total, aux);
  r = tt_run(tpr_path, tmp_dir, res, &(tt_run_opts){.np = 2, .timeout_s = 240});
  if (r.code != 0) fail_msg("resume failed: %s", r.err);
  tt_run_done(&r);
  const char *files[] = {"model.safetensors", "optim-rank-00000-of-00002.safetensors",
                         "optim-rank-00001-of-00002.safetensors"};
  for (int i = 0; i < 3; i++) {
    size_t la, lb;
    char *x = tt_slurp(tt_path(full, files[i]), &la), *y = tt_slurp(tt_path(rest, files[i]), &lb);
    printf("  resume at step 2 of %d: %s %s\n", total, files[i], la == lb && !memcmp(x, y, la) ? "identical" : "DIFFERS");
    assert_true(la == lb && memcmp(x, y, la) == 0);
    free(x), free(y);
  }
}

static void test_refusals(void **state) {
  (void)state;
  struct {
    const char *what;
    const char *const *args;
    const char *expect;
  } cases[] = {
      {"family without training",
       MESH("train", "--model", TPR_FIXTURES "/hunyuan_moe_tiny", "--data", FIX "/tokens.npy", "--seq-len", "16"),
       "hunyuan_v1_moe runs inference only"},
      {"FSDP", MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "16", "--fsdp"),
       "--no-fsdp"},
      {"routing-bias update",
       MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "16", "--bias-update-rate", "0.01"),
       "qwen3_moe has not"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    run_result r = tt_run(tpr_path, tmp_dir, cases[i].args, &(tt_run_opts){.np = 1, .timeout_s = 60});
    printf("  %s: exit %d: %.200s\n", cases[i].what, r.code, r.err);
    assert_true(r.code != 0);
    assert_non_null(strstr(r.err, cases[i].expect));
    tt_run_done(&r);
  }
}

static int setup(void **state) {
  (void)state;
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_train_qwen3") != 0) return -1;
  if (!mkdtemp(tmp_dir)) return -1;
  size_t len;
  char *text = tt_slurp(FIX "/meta.json", &len);
  meta = cJSON_Parse(text);
  free(text);
  return meta ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  cJSON_Delete(meta);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step0_meshes),
      cmocka_unit_test(test_controls_fail),
      cmocka_unit_test(test_steps),
      cmocka_unit_test(test_resume_bit_identical),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
