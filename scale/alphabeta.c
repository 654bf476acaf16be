// alpha-beta fits of the collectives (see alphabeta.h).
#include "scale/alphabeta.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[TPR_COLL_COUNT] = {
    [TPR_COLL_ALL_REDUCE] = "all_reduce",   [TPR_COLL_ALL_GATHER] = "all_gather",
    [TPR_COLL_REDUCE_SCATTER] = "reduce_scatter", [TPR_COLL_ALL_TO_ALL] = "all_to_all",
    [TPR_COLL_BROADCAST] = "broadcast",
};

const char *tpr_coll_name(tpr_coll c) { return (unsigned)c < TPR_COLL_COUNT ? names[c] : "?"; }

int tpr_coll_from_name(const char *name) {
  for (int k = 0; name && k < TPR_COLL_COUNT; k++)
    if (!strcmp(name, names[k])) return k;
  return -1;
}

double tpr_scale_bus_factor(tpr_coll op, int n) {
  if (n <= 1) return 0;
  double f = (double)(n - 1) / n;
  switch (op) {
    case TPR_COLL_ALL_REDUCE: return 2 * f;
    case TPR_COLL_ALL_GATHER:
    case TPR_COLL_REDUCE_SCATTER:
    case TPR_COLL_ALL_TO_ALL: return f;
    case TPR_COLL_BROADCAST: return 1;
    default: return 0;
  }
}

double tpr_scale_latency_steps(int n) { return n <= 1 ? 0 : ceil(log2((double)n)); }

double tpr_ab_time(const tpr_ab *ab, tpr_coll op, int n, double size) {
  if (n <= 1) return 0;
  bool large = ab->split > 0 && size >= ab->split;
  return (large ? ab->alpha_large : ab->alpha) * tpr_scale_latency_steps(n) +
         (large ? ab->beta_large : ab->beta) * size * tpr_scale_bus_factor(op, n);
}

// A row the fit uses. Rows that moved nothing are left out: nccl-tests' sizes
// round a gather's per-rank count down to 16 bytes, so its 8- and 32-byte rows
// are calls of count 0 that return at once (~0.05 us). Under the relative
// weights below one of them outweighs a thousand real rows and drags alpha to
// zero, which made every small collective of a decode step look free.
static bool fit_row(const tpr_comm_sample *r, tpr_coll op, const char *transport, int ranks) {
  if (r->op != op || r->ranks <= 1 || !(r->time_s > 0) || !(r->size > 0)) return false;
  return !(transport && strcmp(r->transport, transport)) && !(ranks > 0 && r->ranks != ranks);
}

// One line over the rows with lo <= size < hi: alpha, beta and the sum of
// squared relative residuals; false when the rows cannot give both.
typedef struct ab_line {
  double alpha, beta, sse;
  int used, sizes;  // rows, distinct sizes
} ab_line;

static bool fit_line(const tpr_comm_sample *s, size_t n, tpr_coll op, const char *transport, int ranks,
                     tpr_bus_factor_fn factor, double lo, double hi, ab_line *out) {
  // Weighted normal equations of min sum ((t - a*L - b*x) / t)^2.
  double sll = 0, slx = 0, sxx = 0, slt = 0, sxt = 0, last = -1;
  *out = (ab_line){0};
  for (size_t i = 0; i < n; i++) {
    if (!fit_row(&s[i], op, transport, ranks) || s[i].size < lo || s[i].size >= hi) continue;
    double L = tpr_scale_latency_steps(s[i].ranks), x = s[i].size * factor(op, s[i].ranks), w = 1 / (s[i].time_s * s[i].time_s);
    sll += w * L * L, slx += w * L * x, sxx += w * x * x, slt += w * L * s[i].time_s, sxt += w * x * s[i].time_s;
    out->used++;
    if (s[i].size != last) out->sizes++, last = s[i].size;  // rows come grouped by size within a run
  }
  double det = sll * sxx - slx * slx;
  if (out->used < 2 || !(fabs(det) > 1e-12 * sll * sxx)) return false;
  out->alpha = (slt * sxx - sxt * slx) / det;
  out->beta = (sll * sxt - slx * slt) / det;
  for (size_t i = 0; i < n; i++) {
    if (!fit_row(&s[i], op, transport, ranks) || s[i].size < lo || s[i].size >= hi) continue;
    double pred = out->alpha * tpr_scale_latency_steps(s[i].ranks) + out->beta * s[i].size * factor(op, s[i].ranks);
    out->sse += (pred / s[i].time_s - 1) * (pred / s[i].time_s - 1);
  }
  return true;
}

// The large regime's line may cross zero below the split (bandwidth that
// keeps falling with size gives a negative intercept); it must be positive
// from the split on, at every rank count of its rows.
static bool positive_from(const tpr_comm_sample *s, size_t n, tpr_coll op, const char *transport, int ranks,
                          tpr_bus_factor_fn factor, const ab_line *l, double split) {
  for (size_t i = 0; i < n; i++)
    if (fit_row(&s[i], op, transport, ranks) &&
        !(l->alpha * tpr_scale_latency_steps(s[i].ranks) + l->beta * split * factor(op, s[i].ranks) > 0))
      return false;
  return true;
}

tpr_status tpr_scale_fit_ab(const tpr_comm_sample *s, size_t n, tpr_coll op, const char *transport, int ranks,
                            tpr_bus_factor_fn factor, tpr_ab *out) {
  if (!factor) factor = tpr_scale_bus_factor;
  *out = (tpr_ab){0};
  ab_line one;
  if (!fit_line(s, n, op, transport, ranks, factor, 0, INFINITY, &one))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale: alpha-beta fit of %s over %s: %d usable rows%s", tpr_coll_name(op),
                    transport ? transport : "any transport", one.used,
                    one.used < 2 ? " (needs >= 2 at n > 1)" : " cannot separate latency from bandwidth (one size only?)");
  *out = (tpr_ab){.alpha = one.alpha, .beta = one.beta, .rms_rel = sqrt(one.sse / one.used), .points = one.used};
  if (out->rms_rel <= 0.02) return TPR_OK;
  double best_sse = 0.75 * 0.75 * one.sse;  // a split must cut the rms residual by a quarter
  for (size_t i = 0; i < n; i++) {
    if (!fit_row(&s[i], op, transport, ranks)) continue;
    ab_line small, large;
    if (!fit_line(s, n, op, transport, ranks, factor, 0, s[i].size, &small) ||
        !fit_line(s, n, op, transport, ranks, factor, s[i].size, INFINITY, &large) || small.sizes < 2 ||
        large.sizes < 2 || !(small.beta > 0) || !(large.beta > 0) || small.alpha < 0 ||
        !positive_from(s, n, op, transport, ranks, factor, &large, s[i].size) || small.sse + large.sse >= best_sse)
      continue;
    best_sse = small.sse + large.sse;
    *out = (tpr_ab){.alpha = small.alpha, .beta = small.beta, .rms_rel = sqrt(best_sse / one.used),
                    .points = one.used, .split = s[i].size, .alpha_large = large.alpha, .beta_large = large.beta};
  }
  return TPR_OK;
}

static const char *jstr(const cJSON *j, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jnum(const cJSON *j, const char *k, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  if (!cJSON_IsNumber(v)) return false;
  *out = v->valuedouble;
  return true;
}

tpr_status tpr_scale_read_comm(const char *path, tpr_comm_sample **samples, size_t *n) {
  FILE *f = fopen(path, "r");
  if (!f) return TPR_FAIL(TPR_ERR_IO, "scale: cannot open bench comm output %s", path);
  char line[4096];
  int lineno = 0, op = -1, ranks = 0;
  char transport[16] = "";
  tpr_status rc = TPR_OK;
  while (rc == TPR_OK && fgets(line, sizeof line, f)) {
    lineno++;
    if (line[0] != '{') continue;  // mpirun's or the shell's own lines
    cJSON *j = cJSON_Parse(line);
    if (!j) {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "scale: %s:%d is not JSON", path, lineno);
      break;
    }
    const char *kind = jstr(j, "kind");
    double v, size, us;
    if (kind && !strcmp(kind, "header")) {
      op = tpr_coll_from_name(jstr(j, "op"));
      ranks = jnum(j, "ranks", &v) ? (int)v : 0;
      const char *b = jstr(j, "backend");
      snprintf(transport, sizeof transport, "%s", b ? b : "?");
      if (ranks < 1) rc = TPR_FAIL(TPR_ERR_FORMAT, "scale: %s:%d: header without ranks", path, lineno);
    } else if (kind && !strcmp(kind, "result")) {
      if (ranks < 1) {
        rc = TPR_FAIL(TPR_ERR_FORMAT, "scale: %s:%d: result before any header", path, lineno);
      } else if (!jnum(j, "size", &size) || !jnum(j, "time_us", &us)) {
        rc = TPR_FAIL(TPR_ERR_FORMAT, "scale: %s:%d: result without size or time_us", path, lineno);
      } else if (op >= 0) {  // sendrecv rows are skipped: no step issues one
        tpr_comm_sample *grown = realloc(*samples, (*n + 1) * sizeof **samples);
        if (!grown) {
          rc = TPR_FAIL(TPR_ERR_OOM, "scale: comm samples");
        } else {
          *samples = grown;
          grown[*n] = (tpr_comm_sample){.op = (tpr_coll)op, .ranks = ranks, .size = size, .time_s = us * 1e-6};
          snprintf(grown[*n].transport, sizeof grown[*n].transport, "%s", transport);
          (*n)++;
        }
      }
    }
    cJSON_Delete(j);
  }
  fclose(f);
  return rc;
}
