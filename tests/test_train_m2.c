// `tpr train` on the MiniMax-M2 fixture against PyTorch (transformers'
// MiniMaxM2ForCausalLM + torch.optim.AdamW + clip_grad_norm_, f32:
// scripts/reference/make_train_fixture.py, tests/fixtures/minimax_m2_train):
// step 0's loss and every parameter's gradient at tp 1/2/4 and at expert-
// and data-parallel foldings; 10 AdamW steps' losses and parameters; resume
// from step 5 bit for bit; negative controls (a missing backward all-reduce
// must fail the gradient bound); bad input.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shard/safetensors.h"

#define LOSS_BOUND 1e-5  // relative, step 0 (the bar)
#define GRAD_BOUND 1e-4  // max|d| / max|g| per tensor (the bar)
#define STEPS_BOUND 1e-4  // relative, losses of 10 AdamW steps

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_train_XXXXXX";
static cJSON *meta;

#define FIX TPR_FIXTURES "/minimax_m2_train"
#define MODEL TPR_FIXTURES "/minimax_m2_tiny"

// meta.json's number at a dotted path ("optimizer.lr_schedule.lr_max"),
// or element `index` of the array there.
static double meta_at(const char *path, int index) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  const cJSON *x = meta;
  for (char *k = strtok(buf, "."); k && x; k = strtok(NULL, ".")) x = cJSON_GetObjectItemCaseSensitive(x, k);
  if (index >= 0) x = cJSON_GetArrayItem(x, index);
  if (!cJSON_IsNumber(x)) fail_msg("meta.json: %s[%d] missing", path, index);
  return x->valuedouble;
}

// The fixture's hyperparameters and records by short name.
static double meta_num(const char *key, int index) {
  static const char *const map[][2] = {
      {"lr", "optimizer.lr_schedule.lr_max"},   {"warmup", "optimizer.lr_schedule.warmup"},
      {"min_lr", "optimizer.lr_schedule.min_lr"}, {"weight_decay", "optimizer.weight_decay.ndim>=2"},
      {"clip", "optimizer.grad_clip.max_norm"},  {"aux_coef", "model.router_aux_loss_coef"},
      {"steps", "optimizer.steps"},              {"losses", "records.loss"},
  };
  for (size_t i = 0; i < sizeof map / sizeof *map; i++)
    if (!strcmp(map[i][0], key)) return meta_at(map[i][1], index);
  fail_msg("meta_num: unknown key %s", key);
  return 0;
}

// One `tpr train` run of a `steps`-step schedule; returns the per-step JSON
// reports (an array of `lines` entries: steps, unless the run stops early).
// Appends the fixture's hyperparameters (a `steps`-step schedule) to args.
static void add_hparams(const char **args, int *n, int steps) {
  static char v[7][32];
  snprintf(v[0], sizeof v[0], "%d", steps);
  snprintf(v[1], sizeof v[1], "%.17g", meta_num("lr", -1));
  snprintf(v[2], sizeof v[2], "%d", (int)meta_num("warmup", -1));
  snprintf(v[3], sizeof v[3], "%.17g", meta_num("min_lr", -1));
  snprintf(v[4], sizeof v[4], "%.17g", meta_num("weight_decay", -1));
  snprintf(v[5], sizeof v[5], "%.17g", meta_num("clip", -1));
  snprintf(v[6], sizeof v[6], "%.17g", meta_num("aux_coef", -1));
  const char *flags[7] = {"--steps", "--lr", "--warmup", "--min-lr", "--weight-decay", "--clip", "--aux-coef"};
  for (int i = 0; i < 7; i++) args[(*n)++] = flags[i], args[(*n)++] = v[i];
}

static cJSON *train_n(int np, const char *const *mesh, int steps, int lines, const char *const *extra,
                      run_result *failed) {
  const char *args[64] = {"train", "--model", MODEL, "--data", FIX "/tokens.npy", "--data-order", "sequential",
                          "--seq-len", "16", "--json"};
  int n = 10;
  add_hparams(args, &n, steps);
  for (int i = 0; mesh && mesh[i]; i++) args[n++] = mesh[i];
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 240});
  if (failed) {
    *failed = r;
    if (r.code != 0) return NULL;
  }
  if (r.code != 0) fail_msg("tpr train (np %d) failed with %d: %s", np, r.code, r.err);
  cJSON *steps_out = cJSON_CreateArray();
  for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(line);
    if (j && cJSON_GetObjectItemCaseSensitive(j, "summary")) {  // the closing summary, not a step
      assert_non_null(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "summary"),
                                                        "peak_rss_bytes"));
      cJSON_Delete(j);
    } else if (j && cJSON_GetObjectItemCaseSensitive(j, "step")) {
      cJSON_AddItemToArray(steps_out, j);
    } else {
      cJSON_Delete(j);  // the start-up memory line
    }
  }
  if (!failed) tt_run_done(&r);
  assert_int_equal(cJSON_GetArraySize(steps_out), lines);
  return steps_out;
}

static cJSON *train(int np, const char *const *mesh, int steps, const char *const *extra, run_result *failed) {
  return train_n(np, mesh, steps, steps, extra, failed);
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
  for (int i = 0; tpr_st_get(want, i); i++) {
    const tpr_st_tensor *w = tpr_st_get(want, i), *g = tpr_st_find(got, w->name);
    if (!g) fail_msg("%s has no %s", got_path, w->name);
    int64_t n = 1, start[2] = {0, 0};
    for (int d = 0; d < w->ndim; d++) n *= w->shape[d];
    if (g->ndim != w->ndim || (w->ndim == 2 && g->shape[1] != w->shape[1]) || g->shape[0] != w->shape[0])
      fail_msg("%s: shape differs", w->name);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    TT_OK(tpr_st_read_f32(got, w->name, start, w->shape, a));
    TT_OK(tpr_st_read_f32(want, w->name, start, w->shape, b));
    double md = 0, mb = 0;
    for (int64_t k = 0; k < n; k++) {
      double d = fabs((double)a[k] - b[k]);
      md = d > md || isnan(d) ? (isnan(d) ? INFINITY : d) : md;
      mb = fabs(b[k]) > mb ? fabs(b[k]) : mb;
    }
    double rel = mb > 0 ? md / mb : md;
    if (rel > worst) {
      worst = rel;
      snprintf(name, sizeof name, "%s", w->name);
    }
    free(a), free(b);
  }
  tpr_st_close(got), tpr_st_close(want);
  if (worst_name) *worst_name = name;
  return worst;
}

// Step 0 on one mesh: loss and every gradient against PyTorch's.
static double step0(int np, const char *const *mesh, const char *const *extra, double *loss_err) {
  const char *dump = tt_path(tmp_dir, "grads.safetensors");
  unlink(dump);
  const char *args[24] = {"--dump-grads", dump};
  int n = 2;
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  args[n] = NULL;
  cJSON *steps = train(np, mesh, 1, args, NULL);
  double want = meta_num("losses", 0);
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

#define MESH(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_step0_tensor_parallel(void **state) {
  // dp 1 here: both windows of step 0 run on every replica as 2 micro-steps.
  struct {
    int np;
    const char *const *mesh;
  } cases[] = {
      {1, MESH("--grad-accum", "2")},
      {2, MESH("--grad-accum", "2", "--tp", "2")},
      {4, MESH("--grad-accum", "2", "--tp", "4")},  // Q 6->8 padded interleaved, KV 2->4 replicated
      {4, MESH("--grad-accum", "2", "--tp", "4", "--moe-dispatch", "alltoall")},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    double le, ge = step0(cases[i].np, cases[i].mesh, NULL, &le);
    assert_true(le <= LOSS_BOUND);
    assert_true(ge <= GRAD_BOUND);
  }
}

static void test_step0_expert_and_data_parallel(void **state) {
  struct {
    int np;
    const char *const *mesh;
  } cases[] = {
      {4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "2", "--etp", "2")},
      {4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "4", "--etp", "1")},
      {4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "2", "--etp", "1")},  // edp 2: disjoint token slices
      {2, MESH("--dp", "2", "--tp", "1", "--ep", "2")},                         // one window per replica
      {4, MESH("--dp", "2", "--tp", "2", "--ep", "2", "--etp", "2")},
      {4, MESH("--dp", "2", "--tp", "2", "--ep", "4", "--etp", "1")},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    double le, ge = step0(cases[i].np, cases[i].mesh, NULL, &le);
    assert_true(le <= LOSS_BOUND);
    assert_true(ge <= GRAD_BOUND);
  }
}

// Negative controls: without the backward all-reduce of the QK-norm, or of
// the column-parallel inputs, the tp 4 gradients are wrong (the forward and
// so the loss are unchanged).
static void test_missing_grad_all_reduce_fails(void **state) {
  const char *const *tp4 = MESH("--grad-accum", "2", "--tp", "4");
  double le, qk = step0(4, tp4, MESH("--debug-skip-grad-marks", "qk-norm"), &le);
  assert_true(le <= LOSS_BOUND);
  double col = step0(4, tp4, MESH("--debug-skip-grad-marks", "column"), &le);
  assert_true(le <= LOSS_BOUND);
  printf("  controls: without the QK-norm's backward all-reduce %.2e, without the column inputs' %.2e "
         "(both must exceed %.0e)\n", qk, col, GRAD_BOUND);
  assert_true(qk > 100 * GRAD_BOUND);
  assert_true(col > 100 * GRAD_BOUND);
}

// Ten AdamW steps (warmup, cosine decay, clipping) equal PyTorch's.
static void test_ten_steps(void **state) {
  int total = (int)meta_num("steps", -1);
  const char *const *meshes[] = {MESH("--grad-accum", "2"), MESH("--grad-accum", "2", "--tp", "4")};
  int nps[] = {1, 4};
  for (int m = 0; m < 2; m++) {
    const char *save = tt_path(tmp_dir, m ? "ten_tp4" : "ten_tp1");
    cJSON *steps = train(nps[m], meshes[m], total, MESH("--save", save), NULL);
    double worst = 0;
    for (int s = 0; s < total; s++) {
      double want = meta_num("losses", s), got = step_num(steps, s, "loss");
      double e = fabs(got - want) / fabs(want);
      worst = e > worst ? e : worst;
    }
    cJSON_Delete(steps);
    const char *wn;
    double pe = compare_files(tt_path(save, "model.safetensors"), FIX "/final_params.safetensors", &wn);
    printf("  np %d, %d steps: worst loss rel err %.2e; parameters after them %.2e (%s)\n", nps[m], total, worst, pe,
           wn);
    assert_true(worst <= STEPS_BOUND);
    assert_true(pe <= STEPS_BOUND);
  }
}

// A run stopped after step 5 and resumed from its checkpoint reaches the
// uninterrupted run's step-10 weights and moments bit for bit.
static void test_resume_bit_identical(void **state) {
  int total = (int)meta_num("steps", -1);
  const char *full = tt_path(tmp_dir, "full"), *half = tt_path(tmp_dir, "half"), *rest = tt_path(tmp_dir, "rest");
  const char *const *mesh = MESH("--grad-accum", "2", "--tp", "2");
  char five[16];
  snprintf(five, sizeof five, "%d", total / 2);
  cJSON_Delete(train(2, mesh, total, MESH("--save", full), NULL));
  run_result stopped;
  cJSON *a = train_n(2, mesh, total, total / 2, MESH("--save", half, "--stop-after", five), &stopped);
  assert_non_null(a);
  cJSON_Delete(a);
  tt_run_done(&stopped);
  // --resume loads the weights, moments and step from the directory alone.
  const char *args[64] = {"train", "--resume", half, "--data", FIX "/tokens.npy", "--data-order", "sequential",
                          "--seq-len", "16", "--save", rest, "--json", "--tp", "2", "--grad-accum", "2"};
  int n = 16;
  add_hparams(args, &n, total);
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = 2, .timeout_s = 240});
  if (r.code != 0) fail_msg("resume failed: %s", r.err);
  tt_run_done(&r);
  const char *files[] = {"model.safetensors", "optim-rank-00000-of-00002.safetensors",
                         "optim-rank-00001-of-00002.safetensors"};
  for (int i = 0; i < 3; i++) {
    size_t la, lb;
    char *x = tt_slurp(tt_path(full, files[i]), &la), *y = tt_slurp(tt_path(rest, files[i]), &lb);
    printf("  resume: %s %s\n", files[i], la == lb && !memcmp(x, y, la) ? "identical" : "DIFFERS");
    assert_true(la == lb && memcmp(x, y, la) == 0);
    free(x), free(y);
  }
}

// A random-order run resumed with neither --seed nor --data-order reads on
// in the checkpoint's order (trainer_state.json) and ends as the
// uninterrupted run; asking for another seed on --resume is refused.
// Control: the same schedule with another seed ends elsewhere, so the
// comparison depends on the order.
static void test_resume_keeps_data_order(void **state) {
  const int total = 4;
  const char *full = tt_path(tmp_dir, "order_full"), *half = tt_path(tmp_dir, "order_half");
  const char *rest = tt_path(tmp_dir, "order_rest"), *other = tt_path(tmp_dir, "order_other");
  const char *const *mesh = MESH("--grad-accum", "2");
  cJSON_Delete(train(1, mesh, total, MESH("--save", full, "--data-order", "random", "--seed", "7"), NULL));
  cJSON_Delete(train(1, mesh, total, MESH("--save", other, "--data-order", "random", "--seed", "8"), NULL));
  run_result stopped;
  cJSON *a = train_n(1, mesh, total, total / 2,
                     MESH("--save", half, "--stop-after", "2", "--data-order", "random", "--seed", "7"), &stopped);
  assert_non_null(a);
  cJSON_Delete(a);
  tt_run_done(&stopped);
  const char *args[64] = {"train", "--resume", half, "--data", FIX "/tokens.npy", "--seq-len", "16",
                          "--save", rest, "--json", "--grad-accum", "2"};
  int n = 12;
  add_hparams(args, &n, total);
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = 1, .timeout_s = 240});
  if (r.code != 0) fail_msg("resume failed: %s", r.err);
  tt_run_done(&r);
  size_t la, lb, lc;
  char *x = tt_slurp(tt_path(full, "model.safetensors"), &la), *y = tt_slurp(tt_path(rest, "model.safetensors"), &lb);
  char *z = tt_slurp(tt_path(other, "model.safetensors"), &lc);
  bool same = la == lb && !memcmp(x, y, la), control_differs = la != lc || memcmp(x, z, la) != 0;
  printf("  random order, seed 7, resumed without --seed: %s; seed 8 instead: %s\n", same ? "identical" : "DIFFERS",
         control_differs ? "differs (control)" : "SAME");
  assert_true(same);
  assert_true(control_differs);
  free(x), free(y), free(z);
  args[n++] = "--seed", args[n++] = "8";
  r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = 1, .timeout_s = 240});
  printf("  resume asking for seed 8: exit %d: %s", r.code, r.err);
  assert_int_equal(r.code, 2);
  assert_non_null(strstr(r.err, "seed 7"));
  tt_run_done(&r);
}

// A save that died half-way leaves "<dir>.tmp" behind and the previous
// checkpoint whole: resuming from it works, and the next save clears the
// leftover and publishes a whole new checkpoint.
static void test_interrupted_save(void **state) {
  const char *dir = tt_path(tmp_dir, "ckpt"), *tmp = tt_path(tmp_dir, "ckpt.tmp");
  const char *const *mesh = MESH("--grad-accum", "2");
  cJSON_Delete(train(1, mesh, 2, MESH("--save", dir), NULL));
  size_t len;
  char *before = tt_slurp(tt_path(dir, "model.safetensors"), &len);
  // What a process killed in the middle of writing leaves: a partial directory.
  assert_int_equal(mkdir(tmp, 0755), 0);
  tt_spit(tt_path(tmp, "model.safetensors"), before, len / 3);
  tt_spit(tt_path(tmp, "optim-rank-00000-of-00001.safetensors"), "garbage", 7);
  size_t len2;
  char *still = tt_slurp(tt_path(dir, "model.safetensors"), &len2);
  assert_true(len2 == len && !memcmp(before, still, len));
  free(still);
  const char *args[40] = {"train", "--resume", dir, "--data", FIX "/tokens.npy", "--data-order", "sequential",
                          "--seq-len", "16", "--grad-accum", "2", "--save", dir, "--json"};
  int n = 14;
  add_hparams(args, &n, 3);
  run_result r = tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = 1, .timeout_s = 120});
  if (r.code != 0) fail_msg("resume after an interrupted save failed: %s", r.err);
  tt_run_done(&r);
  struct stat st;
  assert_true(stat(tmp, &st) != 0);  // the leftover is gone
  char *after = tt_slurp(tt_path(dir, "trainer_state.json"), NULL);
  assert_non_null(strstr(after, "\"step\":\t3") ? after : strstr(after, "\"step\": 3"));
  free(after), free(before);
  printf("  interrupted save: previous checkpoint intact, resumed, leftover cleared, step 3 published\n");
}

// f32 tensor `name` of a safetensors file (malloc'ed), *n its elements.
static float *read_tensor(const char *path, const char *name, int64_t *n) {
  tpr_st_set *set;
  TT_OK(tpr_st_open(path, &set));
  const tpr_st_tensor *t = tpr_st_find(set, name);
  if (!t || t->ndim != 1) fail_msg("%s: no 1-D %s", path, name);
  *n = t->shape[0];
  float *x = malloc((size_t)*n * sizeof *x);
  TT_OK(tpr_st_read_f32(set, name, (const int64_t[]){0}, t->shape, x));
  tpr_st_close(set);
  return x;
}

// Aux-loss-free balancing: after a step every routing bias moved by exactly
// +-rate or 0 (towards the mean load), and the same on every mesh.
static void test_bias_update(void **state) {
  const double rate = 1.0 / 1024;  // b +- rate rounds by at most half an ulp of |b| < 4: 2.4e-7
  char r[32];
  snprintf(r, sizeof r, "%.17g", rate);
  const char *one = tt_path(tmp_dir, "bias_tp1"), *four = tt_path(tmp_dir, "bias_tp4");
  cJSON_Delete(train(1, MESH("--grad-accum", "2"), 1, MESH("--save", one, "--bias-update-rate", r), NULL));
  cJSON_Delete(train(4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "2", "--etp", "2"), 1,
                     MESH("--save", four, "--bias-update-rate", r), NULL));
  int up = 0, down = 0;
  for (int L = 0; L < 2; L++) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.e_score_correction_bias", L);
    int64_t n0, n1, n4;
    float *b0 = read_tensor(MODEL "/model.safetensors", name, &n0), *b1 = read_tensor(tt_path(one, "model.safetensors"), name, &n1),
          *b4 = read_tensor(tt_path(four, "model.safetensors"), name, &n4);
    assert_true(n0 == n1 && n1 == n4);
    for (int64_t e = 0; e < n0; e++) {
      double d = (double)b1[e] - b0[e];
      assert_true(b1[e] == b4[e]);  // identical on both meshes
      assert_true(fabs(fabs(d) - rate) <= 2.4e-7 || d == 0);
      up += d > 0, down += d < 0;
    }
    free(b0), free(b1), free(b4);
  }
  printf("  bias update: %d biases up, %d down by %.3g, identical at tp 1 and tp 4 x ep 2\n", up, down, rate);
  assert_true(up > 0 && down > 0);
}

// A 1-D '<i4' .npy file of ids.
static void write_npy_i32(const char *path, const int32_t *v, int n) {
  char hdr[128];
  int len = snprintf(hdr, sizeof hdr, "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", n);
  while ((10 + len + 1) % 64) hdr[len++] = ' ';
  hdr[len++] = '\n';
  size_t total = 10 + (size_t)len + 4 * (size_t)n;
  unsigned char *b = malloc(total);
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (unsigned char)(len & 255), b[9] = (unsigned char)(len >> 8);
  memcpy(b + 10, hdr, (size_t)len);
  memcpy(b + 10 + len, v, 4 * (size_t)n);
  tt_spit(path, b, total);
  free(b);
}

static void test_bad_input(void **state) {
  const char *bad_npy = tt_path(tmp_dir, "bad.npy");
  tt_spit(bad_npy, "\x93NUMPY\x01\x00garbage", 15);
  const char *big = tt_path(tmp_dir, "big_ids.npy");
  int32_t ids[40];
  for (int i = 0; i < 40; i++) ids[i] = i == 23 ? 256 : i;  // 256 = the fixture's vocabulary size
  write_npy_i32(big, ids, 40);
  struct {
    const char *what;
    int np;
    const char *const *args;
    const char *expect;
  } cases[] = {
      {"corrupt npy", 1, MESH("train", "--model", MODEL, "--data", bad_npy, "--seq-len", "16"), "npy"},
      {"short data", 1, MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "4096"), "short"},
      {"tp not dividing", 2, MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--tp", "3"), "tp"},
      {"unwritable save", 1,
       MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "16", "--steps", "1", "--save",
            "/proc/tpr-cannot-write-here"),
       "cannot"},
      {"no data", 1, MESH("train", "--model", MODEL), "--data"},
      {"id past the vocabulary", 2, MESH("train", "--model", MODEL, "--data", big, "--seq-len", "16"), "256"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    run_result r = tt_run(tpr_path, tmp_dir, cases[i].args + 0, &(tt_run_opts){.np = cases[i].np, .timeout_s = 60});
    printf("  %s: exit %d: %.200s\n", cases[i].what, r.code, r.err);
    assert_true(r.code != 0);
    assert_non_null(strstr(r.err, cases[i].expect));
    tt_run_done(&r);
  }
}

static int setup(void **state) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_train_m2") != 0) return -1;
  if (!mkdtemp(tmp_dir)) return -1;
  size_t len;
  char *text = tt_slurp(FIX "/meta.json", &len);
  meta = cJSON_Parse(text);
  free(text);
  return meta ? 0 : -1;
}

static int teardown(void **state) {
  cJSON_Delete(meta);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step0_tensor_parallel),  cmocka_unit_test(test_step0_expert_and_data_parallel),
      cmocka_unit_test(test_missing_grad_all_reduce_fails), cmocka_unit_test(test_ten_steps),
      cmocka_unit_test(test_resume_bit_identical),    cmocka_unit_test(test_interrupted_save),
      cmocka_unit_test(test_resume_keeps_data_order),
      cmocka_unit_test(test_bias_update),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
