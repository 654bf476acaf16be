// The training tests' shared harness: see train_harness.h.
#include "train_harness.h"

#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/safetensors.h"

th_fixture th;

int th_setup(const char *test, const char *tmp_template, const char *fix, const char *model) {
  if (tt_tpr_path(th.tpr, sizeof th.tpr, test) != 0) return -1;
  snprintf(th.tmp_dir, sizeof th.tmp_dir, "%s", tmp_template);
  if (!mkdtemp(th.tmp_dir)) return -1;
  th.fix = fix, th.model = model, th.run_args = NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/meta.json", fix);
  size_t len;
  char *text = tt_slurp(path, &len);
  th.meta = cJSON_Parse(text);
  free(text);
  return th.meta ? 0 : -1;
}

int th_teardown(void **state) {
  (void)state;
  cJSON_Delete(th.meta);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", th.tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

double th_meta_at(const char *path, int index) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  const cJSON *x = th.meta;
  for (char *k = strtok(buf, "."); k && x; k = strtok(NULL, ".")) x = cJSON_GetObjectItemCaseSensitive(x, k);
  if (index >= 0) x = cJSON_GetArrayItem(x, index);
  if (!cJSON_IsNumber(x)) fail_msg("meta.json: %s[%d] missing", path, index);
  return x->valuedouble;
}

void th_add_hparams(const char **args, int *n, int steps, double aux) {
  static char v[7][32];  // the args point here until the run
  snprintf(v[0], sizeof v[0], "%d", steps);
  snprintf(v[1], sizeof v[1], "%.17g", th_meta_at("optimizer.lr_schedule.lr_max", -1));
  snprintf(v[2], sizeof v[2], "%d", (int)th_meta_at("optimizer.lr_schedule.warmup", -1));
  snprintf(v[3], sizeof v[3], "%.17g", th_meta_at("optimizer.lr_schedule.min_lr", -1));
  snprintf(v[4], sizeof v[4], "%.17g", th_meta_at("optimizer.weight_decay.ndim>=2", -1));
  snprintf(v[5], sizeof v[5], "%.17g", th_meta_at("optimizer.grad_clip.max_norm", -1));
  snprintf(v[6], sizeof v[6], "%.17g", aux);
  const char *flags[7] = {"--steps", "--lr", "--warmup", "--min-lr", "--weight-decay", "--clip", "--aux-coef"};
  for (int i = 0; i < 7; i++) args[(*n)++] = flags[i], args[(*n)++] = v[i];
}

// The fixture's window length (meta.json data.seq_len) as an argument: every
// run of the harness trains on the fixture's windows.
static const char *seq_len_arg(void) {
  static char v[24];
  snprintf(v, sizeof v, "%d", (int)th_meta_at("data.seq_len", -1));
  return v;
}

// dir/name into buf. The harness leaves tt_path's few rotating buffers to
// the tests, whose paths must outlive the harness's calls.
static void join(char *buf, size_t cap, const char *dir, const char *name) { snprintf(buf, cap, "%s/%s", dir, name); }

cJSON *th_train_n(int np, const char *const *mesh, int steps, int lines, double aux, const char *const *extra,
                  run_result *failed) {
  char data[4096];
  join(data, sizeof data, th.fix, "tokens.npy");
  const char *args[64] = {"train", "--model", th.model, "--data", data, "--data-order", "sequential",
                          "--seq-len", seq_len_arg(), "--json"};
  int n = 10;
  th_add_hparams(args, &n, steps, aux);
  for (int i = 0; mesh && mesh[i]; i++) args[n++] = mesh[i];
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  for (int i = 0; th.run_args && th.run_args[i]; i++) args[n++] = th.run_args[i];
  run_result r = tt_run(th.tpr, th.tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 240});
  if (failed) {
    *failed = r;
    if (r.code != 0) return NULL;
  }
  if (r.code != 0) fail_msg("tpr train (np %d) failed with %d: %s", np, r.code, r.err);
  cJSON *out = cJSON_CreateArray();
  for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(line);
    if (j && cJSON_GetObjectItemCaseSensitive(j, "summary")) {  // the closing summary, not a step
      assert_non_null(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "summary"),
                                                        "peak_rss_bytes"));
      cJSON_Delete(j);
    } else if (j && cJSON_GetObjectItemCaseSensitive(j, "step")) {
      cJSON_AddItemToArray(out, j);
    } else {
      cJSON_Delete(j);  // the start-up memory line
    }
  }
  if (!failed) tt_run_done(&r);
  assert_int_equal(cJSON_GetArraySize(out), lines);
  return out;
}

cJSON *th_train(int np, const char *const *mesh, int steps, double aux, const char *const *extra) {
  return th_train_n(np, mesh, steps, steps, aux, extra, NULL);
}

run_result th_resume(int np, const char *from, const char *save, const char *const *mesh, int steps, double aux,
                     const char *const *extra, int timeout_s) {
  char data[4096];
  join(data, sizeof data, th.fix, "tokens.npy");
  // --resume loads the weights, moments and step from the directory alone.
  const char *args[64] = {"train", "--resume", from, "--data", data, "--seq-len",
                          seq_len_arg(), "--save", save, "--json"};
  int n = 10;
  th_add_hparams(args, &n, steps, aux);
  for (int i = 0; mesh && mesh[i]; i++) args[n++] = mesh[i];
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  for (int i = 0; th.run_args && th.run_args[i]; i++) args[n++] = th.run_args[i];
  return tt_run(th.tpr, th.tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = timeout_s});
}

double th_step_num(const cJSON *steps, int i, const char *key) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(steps, i), key);
  if (!cJSON_IsNumber(x)) fail_msg("step %d: %s missing", i, key);
  return x->valuedouble;
}

// Tensor `name` (shape want_shape, 1-D or 2-D) of a saved model into dst:
// under its own name, or where transformers' Qwen3-VL-MoE layout keeps it
// (a save of that family, train/checkpoint_layout.c): "model.X" as
// "model.language_model.X", expert e's gate/up rows in the layer's fused
// gate_up_proj (E, 2F, H), its down in down_proj (E, H, F). Read here from
// the layout's own definition, independently of the writer. False if none.
static bool read_saved(const tpr_st_set *got, const char *name, const int64_t *want_shape, int ndim, float *dst) {
  const int64_t zero[3] = {0, 0, 0};
  const tpr_st_tensor *g = tpr_st_find(got, name);
  if (g) {
    if (g->ndim != ndim || g->shape[0] != want_shape[0] || (ndim == 2 && g->shape[1] != want_shape[1]))
      fail_msg("%s: shape differs", name);
    TT_OK(tpr_st_read_f32(got, name, zero, want_shape, dst));
    return true;
  }
  char alt[200], which[8];
  int L, e, end = 0;
  if (sscanf(name, "model.layers.%d.mlp.experts.%d.%7[a-z]_proj.weight%n", &L, &e, which, &end) == 3 && !name[end] &&
      ndim == 2) {
    bool down = !strcmp(which, "down");
    snprintf(alt, sizeof alt, "model.language_model.layers.%d.mlp.experts.%s", L, down ? "down_proj" : "gate_up_proj");
    const tpr_st_tensor *f = tpr_st_find(got, alt);
    if (!f || f->ndim != 3) return false;
    int64_t F = down ? want_shape[1] : want_shape[0], H = down ? want_shape[0] : want_shape[1];
    int64_t start[3] = {e, !strcmp(which, "up") ? F : 0, 0}, len[3] = {1, want_shape[0], want_shape[1]};
    if (f->shape[1] != (down ? H : 2 * F) || f->shape[2] != (down ? F : H)) fail_msg("%s: fused shape differs", alt);
    TT_OK(tpr_st_read_f32(got, alt, start, len, dst));
    return true;
  }
  if (!strncmp(name, "model.", 6)) {
    snprintf(alt, sizeof alt, "model.language_model.%s", name + 6);
    if (tpr_st_find(got, alt)) return read_saved(got, alt, want_shape, ndim, dst);
  }
  return false;
}

double th_compare_files(const char *got_path, const char *want_path, int min_tensors, const char **worst_name) {
  tpr_st_set *got, *want;
  if (tpr_st_open(got_path, &got) != TPR_OK) fail_msg("%s: %s", got_path, tpr_last_error());
  if (tpr_st_open(want_path, &want) != TPR_OK) fail_msg("%s: %s", want_path, tpr_last_error());
  static char name[160];
  double worst = 0;
  int n_tensors = 0;
  for (int i = 0; tpr_st_get(want, i); i++, n_tensors++) {
    const tpr_st_tensor *w = tpr_st_get(want, i);
    int64_t n = 1, start[2] = {0, 0};
    for (int d = 0; d < w->ndim; d++) n *= w->shape[d];
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);  // (n)
    if (!read_saved(got, w->name, w->shape, w->ndim, a)) fail_msg("%s has no %s", got_path, w->name);
    TT_OK(tpr_st_read_f32(want, w->name, start, w->shape, b));
    double md = 0, mb = 0;
    for (int64_t k = 0; k < n; k++) {
      double d = fabs((double)a[k] - b[k]);
      md = isnan(d) ? INFINITY : d > md ? d : md;  // a NaN anywhere is the worst error
      mb = fabs(b[k]) > mb ? fabs(b[k]) : mb;
    }
    double rel = mb > 0 ? md / mb : md;
    if (rel > worst) worst = rel, snprintf(name, sizeof name, "%s", w->name);
    free(a), free(b);
  }
  tpr_st_close(got), tpr_st_close(want);
  assert_true(n_tensors > min_tensors);  // every trained tensor of the fixture is compared
  if (worst_name) *worst_name = name;
  return worst;
}

double th_step0(int np, const char *const *mesh, double aux, const char *const *extra, int min_tensors,
                double *loss_err) {
  char dump[4096];
  join(dump, sizeof dump, th.tmp_dir, "grads.safetensors");
  unlink(dump);
  const char *args[24] = {"--dump-grads", dump};
  int n = 2;
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  args[n] = NULL;
  cJSON *steps = th_train(np, mesh, 1, aux, args);
  double want = th_meta_at("records.loss", 0);
  *loss_err = fabs(th_step_num(steps, 0, "loss") - want) / fabs(want);
  cJSON_Delete(steps);
  char ref[4096];
  join(ref, sizeof ref, th.fix, "step0_grads.safetensors");
  const char *worst;
  double g = th_compare_files(dump, ref, min_tensors, &worst);
  printf("  np %d", np);
  for (int i = 0; mesh && mesh[i]; i++) printf(" %s", mesh[i]);
  for (int i = 0; extra && extra[i]; i++) printf(" %s", extra[i]);
  printf(": loss rel err %.2e, worst gradient %.2e (%s)\n", *loss_err, g, worst);
  return g;
}

void th_check_step0(const th_mesh_case *cases, size_t n, double aux, int min_tensors) {
  for (size_t i = 0; i < n; i++) {
    double le, ge = th_step0(cases[i].np, cases[i].mesh, aux, NULL, min_tensors, &le);
    assert_true(le <= TH_LOSS_BOUND);
    assert_true(ge <= TH_GRAD_BOUND);
  }
}

double th_steps_distance(int np, const char *const *mesh, int total, double aux, const char *save_dir,
                         int min_tensors) {
  char save[600];
  snprintf(save, sizeof save, "%s", save_dir);  // the caller's may be tt_path's
  cJSON *steps = th_train(np, mesh, total, aux, MESH("--save", save));
  double worst = 0;
  for (int s = 0; s < total; s++) {
    double want = th_meta_at("records.loss", s), e = fabs(th_step_num(steps, s, "loss") - want) / fabs(want);
    worst = e > worst ? e : worst;
  }
  cJSON_Delete(steps);
  char got[4096], want[4096];
  join(got, sizeof got, save, "model.safetensors");
  join(want, sizeof want, th.fix, "final_params.safetensors");
  const char *wn;
  double pe = th_compare_files(got, want, min_tensors, &wn);
  printf("  np %d", np);
  for (int i = 0; mesh && mesh[i]; i++) printf(" %s", mesh[i]);
  printf(", %d steps: worst loss rel err %.2e; parameters after them %.2e (%s)\n", total, worst, pe, wn);
  assert_true(worst <= TH_STEPS_BOUND);
  return pe;
}

void th_check_steps(int np, const char *const *mesh, int total, double aux, const char *save_dir, int min_tensors) {
  assert_true(th_steps_distance(np, mesh, total, aux, save_dir, min_tensors) <= TH_STEPS_BOUND);
}

void th_check_resume(int total, double aux) {
  char full[512], half[512], rest[512], stop[16];
  join(full, sizeof full, th.tmp_dir, "full");
  join(half, sizeof half, th.tmp_dir, "half");
  join(rest, sizeof rest, th.tmp_dir, "rest");
  snprintf(stop, sizeof stop, "%d", total / 2);
  const char *const *mesh = MESH("--grad-accum", "2", "--tp", "2");
  cJSON_Delete(th_train(2, mesh, total, aux, MESH("--save", full)));
  run_result stopped;
  cJSON *a = th_train_n(2, mesh, total, total / 2, aux, MESH("--save", half, "--stop-after", stop), &stopped);
  if (!a) fail_msg("stopped run failed: %s", stopped.err);
  cJSON_Delete(a);
  tt_run_done(&stopped);
  run_result r = th_resume(2, half, rest, mesh, total, aux, MESH("--data-order", "sequential"), 240);
  if (r.code != 0) fail_msg("resume failed: %s", r.err);
  tt_run_done(&r);
  const char *files[] = {"model.safetensors", "optim-rank-00000-of-00002.safetensors",
                         "optim-rank-00001-of-00002.safetensors"};
  for (int i = 0; i < 3; i++) {
    size_t la, lb;
    char pa[600], pb[600];
    join(pa, sizeof pa, full, files[i]), join(pb, sizeof pb, rest, files[i]);
    char *x = tt_slurp(pa, &la), *y = tt_slurp(pb, &lb);
    bool same = la == lb && !memcmp(x, y, la);
    printf("  resume at step %d of %d: %s %s\n", total / 2, total, files[i], same ? "identical" : "DIFFERS");
    assert_true(same);
    free(x), free(y);
  }
}

void th_check_refusal(const char *what, int np, const char *const *args, const char *expect) {
  run_result r = tt_run(th.tpr, th.tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 60});
  printf("  %s: exit %d: %.200s\n", what, r.code, r.err);
  assert_true(r.code != 0);
  assert_non_null(strstr(r.err, expect));
  tt_run_done(&r);
}

// Tensors of `want` whose name, dtype, shape or bytes differ in `got` (or
// are missing); -1 when the two hold different numbers of tensors.
static int tensors_differing(const char *got_dir, const char *want_dir) {
  tpr_st_set *got = NULL, *want = NULL;
  TT_OK(tpr_st_open(got_dir, &got));
  TT_OK(tpr_st_open(want_dir, &want));
  int differ = tpr_st_count(got) == tpr_st_count(want) ? 0 : -1;
  for (int i = 0; i < tpr_st_count(want) && differ >= 0; i++) {
    const tpr_st_tensor *w = tpr_st_get(want, i), *g = tpr_st_find(got, w->name);
    bool same = g && g->dtype == w->dtype && g->ndim == w->ndim && g->nbytes == w->nbytes &&
                !memcmp(g->shape, w->shape, (size_t)w->ndim * sizeof *w->shape) &&
                !memcmp(g->data, w->data, w->nbytes);
    if (!g) printf("  %s missing from the save\n", w->name);
    differ += !same;
  }
  tpr_st_close(got), tpr_st_close(want);
  return differ;
}

const char *th_check_save_as_saved(const char *positions_3d) {
  static char dirs[2][600];
  char data[4096];
  join(data, sizeof data, th.fix, "tokens.npy");
  const char *lr[2] = {"1e-30", "1e-2"};
  int differ[2];
  for (int k = 0; k < 2; k++) {
    join(dirs[k], sizeof dirs[k], th.tmp_dir, k ? "save_moved" : "save_still");
    const char *args[24] = {"train", "--model", th.model, "--data", data, "--seq-len", seq_len_arg(), "--steps", "1",
                            "--lr", lr[k], "--weight-decay", "0", "--save", dirs[k]};
    int n = 15;
    if (positions_3d) args[n++] = "--positions-3d", args[n++] = positions_3d;
    args[n] = NULL;
    run_result r = tt_run_tpr(th.tpr, th.tmp_dir, args);
    if (r.code != 0) fail_msg("tpr train --save: exit %d\n%s", r.code, r.err);
    tt_run_done(&r);
    differ[k] = tensors_differing(dirs[k], th.model);
  }
  printf("  --save at lr 1e-30: %d tensor(s) differ from %s (save_pretrained's); at lr 1e-2: %d\n", differ[0],
         th.model, differ[1]);
  assert_int_equal(differ[0], 0);
  assert_true(differ[1] > 0);
  return dirs[1];
}

void th_check_steps_meshes(int n, const int *nps, const char *const *const *meshes, double aux, int min_tensors,
                           const char *model_type) {
  int total = (int)th_meta_at("optimizer.steps", -1);
  char want[96];
  snprintf(want, sizeof want, "\"%s\"", model_type);
  for (int m = 0; m < n; m++) {
    char save[600], cfg_path[700];
    snprintf(save, sizeof save, "%s/steps_%d", th.tmp_dir, m);
    th_check_steps(nps[m], meshes[m], total, aux, save, min_tensors);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", save);
    char *cfg = tt_slurp(cfg_path, NULL);
    if (!strstr(cfg, want)) fail_msg("%s does not name %s", cfg_path, want);
    free(cfg);
  }
}
