#include "launch/model_cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

tpr_status tpr_cli_token_list(const char *flag, const char *text, int32_t **ids, int64_t *n) {
  *ids = NULL;
  *n = 0;
  if (!text || !*text) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: empty token list", flag);
  int64_t cap = 1;
  for (const char *p = text; *p; p++) cap += *p == ',';
  int32_t *out = malloc((size_t)cap * sizeof *out);
  if (!out) return TPR_FAIL(TPR_ERR_OOM, "%s: token list", flag);
  const char *p = text;
  for (int64_t i = 0; i < cap; i++) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
      free(out);
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: item %lld of '%s' is not a token id (a number in [0, 2^31))", flag,
                      (long long)i + 1, text);
    }
    out[i] = (int32_t)v;
    p = end + 1;
  }
  *ids = out;
  *n = cap;
  return TPR_OK;
}

tpr_status tpr_cli_open_model(tpr_world *w, const char *model, int64_t tp, int64_t max_seq,
                              const tpr_model_debug *d, tpr_m2_session **out) {
  if (tp != 0 && tp != w->size)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--tp %lld does not match the world of %d ranks (run mpirun -np %lld, or "
                    "leave --tp out)", (long long)tp, w->size, (long long)tp);
  tpr_m2_session_opts o = {.model_dir = model,
                           .max_seq = max_seq,
                           .broadcast_program = d->broadcast_program,
                           .per_rank_qk_norm = d->per_rank_qk_norm,
                           .force_tp_rank = (int)d->force_tp_rank};
  return tpr_m2_session_open(&o, w->host, w->cpu, out);
}
