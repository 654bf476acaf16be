// results.jsonl: schema checks and statistics (see results.h).
#include "scale/results.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(const double *x, size_t n, double q) {
  double pos = q * (double)(n - 1);
  size_t i = (size_t)pos;
  return i + 1 < n ? x[i] + (pos - (double)i) * (x[i + 1] - x[i]) : x[n - 1];
}

void tpr_scale_quartiles(double *x, size_t n, double *q1, double *median, double *q3) {
  if (!n) {
    *q1 = *median = *q3 = 0;
    return;
  }
  qsort(x, n, sizeof *x, cmp_double);
  *q1 = quantile(x, n, 0.25), *median = quantile(x, n, 0.5), *q3 = quantile(x, n, 0.75);
}

static const cJSON *field(const cJSON *j, const char *k) { return cJSON_GetObjectItemCaseSensitive(j, k); }

// Required fields: name and cJSON type.
static const struct {
  const char *name;
  int type;  // cJSON_Number, cJSON_String, cJSON_Object
} required[] = {
    {"schema", cJSON_String}, {"workload", cJSON_String}, {"config", cJSON_String}, {"mode", cJSON_String},
    {"np", cJSON_Number},     {"tp", cJSON_Number},       {"dp", cJSON_Number},     {"ep", cJSON_Number},
    {"etp", cJSON_Number},    {"tokens_per_step", cJSON_Number}, {"context", cJSON_Number},
    {"samples", cJSON_Number}, {"repeats", cJSON_Number}, {"step_s", cJSON_Object}, {"tokens_per_s", cJSON_Object},
    {"phases_s", cJSON_Object}, {"bytes_per_step", cJSON_Object}, {"peak_rss_bytes", cJSON_Number},
    {"machine", cJSON_Object}, {"command", cJSON_String},
};

static tpr_status check_stats(const cJSON *s, const char *name) {
  const cJSON *q1 = field(s, "q1"), *m = field(s, "median"), *q3 = field(s, "q3");
  if (!cJSON_IsNumber(q1) || !cJSON_IsNumber(m) || !cJSON_IsNumber(q3))
    return TPR_FAIL(TPR_ERR_FORMAT, "scale results: %s needs numbers q1, median, q3", name);
  if (!(q1->valuedouble <= m->valuedouble && m->valuedouble <= q3->valuedouble) || !(q1->valuedouble > 0))
    return TPR_FAIL(TPR_ERR_FORMAT, "scale results: %s quartiles %g <= %g <= %g must be ordered and > 0", name,
                    q1->valuedouble, m->valuedouble, q3->valuedouble);
  return TPR_OK;
}

tpr_status tpr_scale_result_validate(const cJSON *j) {
  if (!cJSON_IsObject(j)) return TPR_FAIL(TPR_ERR_FORMAT, "scale results: a line is not a JSON object");
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
    const cJSON *v = field(j, required[i].name);
    if (!v || (v->type & 0xFF) != required[i].type)
      return TPR_FAIL(TPR_ERR_FORMAT, "scale results: field '%s' %s", required[i].name,
                      v ? "has the wrong type" : "is missing");
  }
  if (strcmp(field(j, "schema")->valuestring, TPR_SCALE_SCHEMA))
    return TPR_FAIL(TPR_ERR_FORMAT, "scale results: schema '%s' is not %s", field(j, "schema")->valuestring,
                    TPR_SCALE_SCHEMA);
  if (tpr_workload_from_name(field(j, "workload")->valuestring) < 0)
    return TPR_FAIL(TPR_ERR_FORMAT, "scale results: workload '%s' (train, prefill, decode)",
                    field(j, "workload")->valuestring);
  const char *mode = field(j, "mode")->valuestring;
  if (strcmp(mode, "strong") && strcmp(mode, "weak"))
    return TPR_FAIL(TPR_ERR_FORMAT, "scale results: mode '%s' (strong, weak)", mode);
  tpr_scale_mesh m = {.world = (int)field(j, "np")->valuedouble, .tp = (int)field(j, "tp")->valuedouble,
                      .dp = (int)field(j, "dp")->valuedouble, .ep = (int)field(j, "ep")->valuedouble,
                      .etp = (int)field(j, "etp")->valuedouble};
  if (m.world < 1 || m.tp < 1 || m.dp < 1 || m.ep < 1 || m.etp < 1 || m.dp * m.tp != m.world ||
      m.world % (m.ep * m.etp))
    return TPR_FAIL(TPR_ERR_FORMAT, "scale results: mesh np %d tp %d dp %d ep %d etp %d is inconsistent", m.world,
                    m.tp, m.dp, m.ep, m.etp);
  if (!(field(j, "tokens_per_step")->valuedouble >= 1) || !(field(j, "repeats")->valuedouble >= 1))
    return TPR_FAIL(TPR_ERR_FORMAT, "scale results: tokens_per_step and repeats must be >= 1");
  TPR_CHECK(check_stats(field(j, "step_s"), "step_s"));
  TPR_CHECK(check_stats(field(j, "tokens_per_s"), "tokens_per_s"));
  const cJSON *mach = field(j, "machine");
  const char *mk[] = {"cores", "sgemm_gflops", "read_gbs"};
  for (int i = 0; i < 3; i++)
    if (!cJSON_IsNumber(field(mach, mk[i])) || !(field(mach, mk[i])->valuedouble > 0))
      return TPR_FAIL(TPR_ERR_FORMAT, "scale results: machine.%s must be a number > 0", mk[i]);
  if (!cJSON_IsString(field(mach, "mpi")))
    return TPR_FAIL(TPR_ERR_FORMAT, "scale results: machine.mpi must be a string");
  const cJSON *co = field(j, "collective_s");
  if (co && !cJSON_IsObject(co)) return TPR_FAIL(TPR_ERR_FORMAT, "scale results: collective_s must be an object");
  for (const cJSON *k = co ? co->child : NULL; k; k = k->next) {
    if (tpr_coll_from_name(k->string) < 0)
      return TPR_FAIL(TPR_ERR_FORMAT, "scale results: collective_s.%s is no collective kind (all_reduce, all_gather, "
                      "reduce_scatter, all_to_all, broadcast)", k->string);
    if (!cJSON_IsNumber(k) || !(k->valuedouble >= 0))
      return TPR_FAIL(TPR_ERR_FORMAT, "scale results: collective_s.%s must be a number >= 0", k->string);
  }
  return TPR_OK;
}

tpr_status tpr_scale_point_from_json(const cJSON *j, tpr_scale_point *out) {
  TPR_CHECK(tpr_scale_result_validate(j));
  *out = (tpr_scale_point){0};
  out->workload = (tpr_workload)tpr_workload_from_name(field(j, "workload")->valuestring);
  out->mesh = (tpr_scale_mesh){.world = (int)field(j, "np")->valuedouble, .tp = (int)field(j, "tp")->valuedouble,
                               .dp = (int)field(j, "dp")->valuedouble, .ep = (int)field(j, "ep")->valuedouble,
                               .etp = (int)field(j, "etp")->valuedouble};
  out->mesh.fsdp = out->workload == TPR_WL_TRAIN && out->mesh.dp > 1;
  out->work = (tpr_scale_work){.kind = out->workload, .tokens = (int64_t)field(j, "tokens_per_step")->valuedouble,
                               .context = (int64_t)field(j, "context")->valuedouble,
                               .samples = (int64_t)field(j, "samples")->valuedouble};
  const cJSON *s = field(j, "step_s");
  out->step_s = field(s, "median")->valuedouble, out->step_q1 = field(s, "q1")->valuedouble;
  out->step_q3 = field(s, "q3")->valuedouble;
  out->tokens_per_s = field(field(j, "tokens_per_s"), "median")->valuedouble;
  const cJSON *mach = field(j, "machine");
  out->cores = field(mach, "cores")->valuedouble, out->sgemm_gflops = field(mach, "sgemm_gflops")->valuedouble;
  out->read_gbs = field(mach, "read_gbs")->valuedouble;
  const cJSON *node = field(mach, "read_gbs_node"), *busy = field(mach, "sgemm_gflops_busy");
  out->read_gbs_node = cJSON_IsNumber(node) && node->valuedouble > 0 ? node->valuedouble : 0;
  out->sgemm_gflops_busy = cJSON_IsNumber(busy) && busy->valuedouble > 0 ? busy->valuedouble : 0;
  snprintf(out->config, sizeof out->config, "%s", field(j, "config")->valuestring);
  const cJSON *co = field(j, "collective_s");
  out->has_coll = co != NULL;
  for (const cJSON *k = co ? co->child : NULL; k; k = k->next) out->coll_s[tpr_coll_from_name(k->string)] = k->valuedouble;
  return TPR_OK;
}

tpr_status tpr_scale_read_results(const char *path, tpr_scale_point **points, size_t *n) {
  *points = NULL, *n = 0;
  FILE *f = fopen(path, "r");
  if (!f) return TPR_FAIL(TPR_ERR_IO, "scale: cannot open %s", path);
  char line[16384];
  int lineno = 0;
  tpr_status rc = TPR_OK;
  while (rc == TPR_OK && fgets(line, sizeof line, f)) {
    lineno++;
    if (line[0] == '\n') continue;
    cJSON *j = cJSON_Parse(line);
    tpr_scale_point p;
    rc = j ? tpr_scale_point_from_json(j, &p) : TPR_FAIL(TPR_ERR_FORMAT, "not JSON");
    cJSON_Delete(j);
    if (rc != TPR_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", tpr_last_error());
      rc = TPR_FAIL(rc, "scale: %s:%d does not follow %s: %s", path, lineno, TPR_SCALE_SCHEMA, why);
      break;
    }
    tpr_scale_point *grown = realloc(*points, (*n + 1) * sizeof *grown);
    if (!grown) {
      rc = TPR_FAIL(TPR_ERR_OOM, "scale: results");
      break;
    }
    *points = grown;
    grown[(*n)++] = p;
  }
  fclose(f);
  if (rc != TPR_OK) free(*points), *points = NULL, *n = 0;
  return rc;
}
