#include "m2_ref.h"

#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

double m2_rel_err(const float *got, const float *want, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - (double)want[i]);
    if (!isfinite(e)) return INFINITY;
    if (e > d) d = e;
    if (fabs((double)want[i]) > m) m = fabs((double)want[i]);
  }
  return d / (m > 0 ? m : 1e-30);
}

void m2_read_f32(const tpr_st_set *set, const char *name, int64_t rows, int64_t cols, float *dst) {
  const tpr_st_tensor *t = tpr_st_find(set, name);
  if (!t) fail_msg("'%s' missing", name);
  int64_t numel = rows * (cols ? cols : 1);
  if (t->numel != numel || t->shape[0] != rows || (cols && (t->ndim != 2 || t->shape[1] != cols)))
    fail_msg("'%s' has %lld values, want (%lld, %lld)", name, (long long)t->numel, (long long)rows, (long long)cols);
  TT_OK(tpr_st_read_f32(set, name, NULL, NULL, dst));
}

void m2_ids_text(const int32_t *ids, int n, char *text) {
  *text = '\0';
  for (int i = 0; i < n; i++) text += sprintf(text, "%s%d", i ? "," : "", ids[i]);
}

static void read_ids(const tpr_st_set *set, const char *name, int n, int32_t *ids, char *text) {
  float f[16];
  m2_read_f32(set, name, n, 0, f);
  for (int i = 0; i < n; i++) ids[i] = (int32_t)f[i];
  if (text) m2_ids_text(ids, n, text);
}

float *m2_read_logits(const char *path, const char *key, int64_t T) {
  tpr_st_set *set;
  TT_OK(tpr_st_open(path, &set));
  const tpr_st_tensor *t = tpr_st_find(set, key);
  if (!t || t->dtype != TPR_F32) fail_msg("%s: no f32 '%s'", path, key);
  float *x = malloc((size_t)(T * M2_V) * sizeof *x);
  m2_read_f32(set, key, T, M2_V, x);
  tpr_st_close(set);
  return x;
}

void m2_ref_load(m2_ref *r) {
  tpr_st_set *set;
  TT_OK(tpr_st_open(M2_FIX "/reference.safetensors", &set));
  read_ids(set, "tokens_a", M2_TA, r->a, r->a_text);
  read_ids(set, "tokens_b", M2_TB, r->b, r->b_text);
  read_ids(set, "greedy_a", M2_NG, r->greedy_a, NULL);
  m2_read_f32(set, "logits_a", M2_TA, M2_V, r->logits_a);
  m2_read_f32(set, "logits_b", M2_TB, M2_V, r->logits_b);
  m2_read_f32(set, "greedy_logits_a", M2_NG, M2_V, r->greedy_logits_a);
  tpr_st_close(set);
}
