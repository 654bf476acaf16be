// tpr compare: two tensors from safetensors files, element by element:
// max |a - b| relative to max |b| (b is the reference), as the golden tests
// measure logits against transformers. Exit 1 when above --tol.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/args.h"
#include "launch/commands.h"
#include "shard/safetensors.h"

// The whole tensor `key` of `path` as f32 (caller frees), its shape in t.
static float *read_all(const char *path, const char *key, tpr_st_set **set, const tpr_st_tensor **t) {
  if (tpr_st_open(path, set) != TPR_OK) return NULL;
  if (!(*t = tpr_st_find(*set, key))) {
    TPR_FAIL(TPR_ERR_INVALID_ARG, "%s has no tensor '%s'", path, key);
    return NULL;
  }
  int64_t start[TPR_MAX_DIMS] = {0};
  float *x = malloc((size_t)((*t)->numel ? (*t)->numel : 1) * sizeof *x);
  if (!x || tpr_st_read_f32(*set, key, start, (*t)->shape, x) != TPR_OK) {
    free(x);
    return NULL;
  }
  return x;
}

int tpr_cmd_compare(int argc, char **argv) {
  const char *a_path = NULL, *b_path = NULL, *a_key = NULL, *b_key = NULL;
  double tol = 1e-4;
  bool json = false;
  const tpr_arg args[] = {
      {"a", TPR_ARG_STR, &a_path, "safetensors file to check"},
      {"a-key", TPR_ARG_STR, &a_key, "tensor in --a"},
      {"b", TPR_ARG_STR, &b_path, "reference safetensors file"},
      {"b-key", TPR_ARG_STR, &b_key, "tensor in --b (default: --a-key)"},
      {"tol", TPR_ARG_FLOAT, &tol, "bound on max|a-b| / max|b| (default 1e-4)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object"},
  };
  const char *usage = "usage: tpr compare --a FILE --a-key NAME --b FILE [--b-key NAME] [--tol X] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!a_path || !b_path || !a_key) {
    fprintf(stderr, "tpr compare: --a, --a-key and --b are required\n%s\n", usage);
    return 2;
  }
  if (!b_key) b_key = a_key;
  tpr_st_set *sa = NULL, *sb = NULL;
  const tpr_st_tensor *ta = NULL, *tb = NULL;
  float *a = read_all(a_path, a_key, &sa, &ta), *b = a ? read_all(b_path, b_key, &sb, &tb) : NULL;
  int rc = 0;
  if (!a || !b) {
    fprintf(stderr, "tpr compare: %s\n", tpr_last_error());
    rc = 1;
  } else if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, (size_t)ta->ndim * sizeof *ta->shape) != 0) {
    fprintf(stderr, "tpr compare: %s and %s have different shapes\n", a_key, b_key);
    rc = 1;
  } else {
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < ta->numel; i++) {
      double e = fabs((double)a[i] - (double)b[i]);
      if (!(e <= max_err)) max_err = e;  // NaN counts as the worst
      if (fabs((double)b[i]) > max_ref) max_ref = fabs((double)b[i]);
    }
    double rel = max_err / (max_ref > 0 ? max_ref : 1);
    bool ok = rel <= tol;
    if (json)
      printf("{\"command\":\"compare\",\"numel\":%lld,\"max_abs_diff\":%.6e,\"max_abs_ref\":%.6e,\"rel\":%.6e,"
             "\"tol\":%g,\"pass\":%s}\n",
             (long long)ta->numel, max_err, max_ref, rel, tol, ok ? "true" : "false");
    else
      printf("compare %s[%s] vs %s[%s]: %lld values, max|a-b| %.3e, max|b| %.3e, relative %.3e (tol %g): %s\n",
             a_path, a_key, b_path, b_key, (long long)ta->numel, max_err, max_ref, rel, tol, ok ? "PASS" : "FAIL");
    rc = ok ? 0 : 1;
  }
  free(a), free(b);
  tpr_st_close(sa), tpr_st_close(sb);
  return rc;
}
