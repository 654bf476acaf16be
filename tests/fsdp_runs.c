#include "fsdp_runs.h"

#include "test_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/safetensors.h"

run fr_parse(char *out) {
  run r = {0};
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(line);
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss"), *mem = cJSON_GetObjectItemCaseSensitive(j, "memory");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(j, "grad_norm"), *fs = cJSON_GetObjectItemCaseSensitive(j, "fsdp");
    if (cJSON_IsNumber(loss) && cJSON_IsNumber(norm) && r.steps < 8)
      r.norm[r.steps] = norm->valuedouble, r.loss[r.steps++] = loss->valuedouble;
    const cJSON *gb = cJSON_GetObjectItemCaseSensitive(fs, "all_gather_bytes");
    if (cJSON_IsNumber(gb)) r.gathered = gb->valuedouble;
    const char *keys[4] = {"params_bytes", "grads_bytes", "optimizer_bytes", "arena_bytes"};
    for (int k = 0; mem && k < 4; k++)
      r.mem[k] = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(mem, keys[k]), 0)->valuedouble;
    cJSON_Delete(j);
  }
  return r;
}

double fr_compare_dirs(const char *got_dir, const char *want_dir, const char **worst_name) {
  tpr_st_set *got, *want;
  char gp[600], wp[600];
  snprintf(gp, sizeof gp, "%s/model.safetensors", got_dir);
  snprintf(wp, sizeof wp, "%s/model.safetensors", want_dir);
  if (tpr_st_open(gp, &got) != TPR_OK) fail_msg("%s: %s", gp, tpr_last_error());
  if (tpr_st_open(wp, &want) != TPR_OK) fail_msg("%s: %s", wp, tpr_last_error());
  static char name[160];
  double worst = 0;
  int count = 0;
  for (int i = 0; tpr_st_get(want, i); i++, count++) {
    const tpr_st_tensor *w = tpr_st_get(want, i), *g = tpr_st_find(got, w->name);
    if (!g || g->ndim != w->ndim || g->shape[0] != w->shape[0]) fail_msg("%s: missing or another shape", w->name);
    int64_t n = 1, start[TPR_MAX_DIMS] = {0};  // any rank: fused experts, a vision tower's 5-D patch embedding
    for (int d = 0; d < w->ndim; d++) n *= w->shape[d];
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    TT_OK(tpr_st_read_f32(got, w->name, start, w->shape, a));
    TT_OK(tpr_st_read_f32(want, w->name, start, w->shape, b));
    double dd = 0, bb = 0;
    for (int64_t k = 0; k < n; k++) dd += ((double)a[k] - b[k]) * ((double)a[k] - b[k]), bb += (double)b[k] * b[k];
    double rel = bb > 0 ? sqrt(dd / bb) : sqrt(dd);
    if (rel > worst || isnan(rel)) {
      worst = isnan(rel) ? INFINITY : rel;
      snprintf(name, sizeof name, "%s", w->name);
    }
    free(a), free(b);
  }
  tpr_st_close(got), tpr_st_close(want);
  assert_true(count > 0);
  *worst_name = name;
  return worst;
}

double fr_step_err(const run *a, const run *b, bool norms) {
  assert_int_equal(a->steps, b->steps);
  double worst = 0;
  for (int i = 0; i < a->steps; i++) {
    double x = norms ? a->norm[i] : a->loss[i], y = norms ? b->norm[i] : b->loss[i];
    double e = fabs(x - y) / fabs(y);
    worst = e > worst ? e : worst;
  }
  return worst;
}
