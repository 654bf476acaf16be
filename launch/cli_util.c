#include "launch/cli_util.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/progress.h"

bool tpr_cli_sizes_ok(const char *cmd, const char *names, int n, const int64_t *v, int64_t limit) {
  int64_t prod = 1;
  bool ok = true;
  for (int i = 0; i < n && ok; i++) ok = tpr_size_mul_checked(names, prod, v[i], limit, &prod) == TPR_OK;
  if (ok) return true;
  fprintf(stderr, "%s: %s:", cmd, names);
  for (int i = 0; i < n; i++) fprintf(stderr, "%s %lld", i ? " x" : "", (long long)v[i]);
  fprintf(stderr, " exceeds %lld\n", (long long)limit);
  return false;
}

bool tpr_cli_mesh_ok(const char *cmd, const tpr_cli_mesh *m, const char *usage) {
  if (m->tp == 0) {
    fprintf(stderr, "tpr %s: --tp is required\n%s\n", cmd, usage);
    return false;
  }
  const struct {
    const char *flag;
    int64_t v;
  } f[] = {{"tp", m->tp}, {"ep", m->ep}, {"etp", m->etp}, {"dp", m->dp}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].v < 1 || f[i].v > (1 << 24)) {
      fprintf(stderr, "tpr %s: --%s %lld must be in [1, %d]\n", cmd, f[i].flag, (long long)f[i].v, 1 << 24);
      return false;
    }
  return true;
}

bool tpr_cli_load_dtype(const char *cmd, const char *name, tpr_dtype *out) {
  if (!strcmp(name, "source")) {
    *out = TPR_LOAD_SOURCE_DTYPE;
    return true;
  }
  if (tpr_dtype_parse(name, out) == TPR_OK && tpr_dtype_is_float(*out) && *out != TPR_F8E4M3) return true;
  fprintf(stderr, "tpr %s: --dtype '%s': use source, f32, bf16 or f16\n", cmd, name);
  return false;
}

tpr_status tpr_cli_plan(const char *model, const tpr_cli_mesh *m, tpr_shard_plan *plan) {
  tpr_model_config c;
  TPR_CHECK(tpr_model_config_load(model, &c));
  TPR_CHECK(tpr_shard_plan_build(&c, (int)m->tp, (int)m->ep, (int)m->etp, (int)m->dp, TPR_BF16, plan));
  return TPR_OK;
}

uint64_t tpr_cli_safetensors_bytes(const char *dir, int *files) {
  DIR *d = opendir(dir);
  uint64_t total = 0;
  *files = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    size_t n = strlen(e->d_name);
    char path[4096];
    struct stat st;
    if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) total += (uint64_t)st.st_size, ++*files;
  }
  if (d) closedir(d);
  return total;
}

bool tpr_cli_print_json(cJSON *j) {
  char *text = j ? cJSON_PrintUnformatted(j) : NULL;  // NULL if any allocation failed
  cJSON_Delete(j);
  if (!text) {
    fprintf(stderr, "tpr: out of memory printing JSON\n");
    return false;
  }
  printf("%s\n", text);
  free(text);
  return true;
}

void tpr_cli_progress(int rank) { tpr_progress_enable(rank == 0 && tpr_progress_terminal(), NULL); }

double tpr_cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *tpr_cli_bytes_prec(uint64_t b, int decimals, char *buf, size_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  snprintf(buf, n, "%.*f %s", u ? decimals : 0, v, units[u]);
  return buf;
}

const char *tpr_cli_bytes(uint64_t b, char *buf, size_t n) { return tpr_cli_bytes_prec(b, 1, buf, n); }

double tpr_cli_sgemm_gflops(void) {
  const int n = 1024;
  float *a = malloc((size_t)n * n * sizeof *a), *b = malloc((size_t)n * n * sizeof *b), *c = malloc((size_t)n * n * sizeof *c);
  if (!a || !b || !c) return 0;
  for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)(i % 13) * 0.01f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);  // warm-up
  double best = 0;
  for (int r = 0; r < 3; r++) {
    double t0 = tpr_cli_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    double g = 2.0 * n * n * n / (tpr_cli_now() - t0) * 1e-9;
    if (g > best) best = g;
  }
  free(a), free(b), free(c);
  return best;
}

char *tpr_cli_join_data(const tpr_arg_list *l) {
  size_t len = 1;
  for (int i = 0; i < l->n; i++) len += strlen(l->items[i]) + 1;
  char *b = l->n ? malloc(len) : NULL;
  if (!b) return NULL;
  b[0] = 0;
  for (int i = 0; i < l->n; i++) {
    if (i) strcat(b, ",");
    strcat(b, l->items[i]);
  }
  return b;
}
