// tpr scale run: every mesh of a sweep launched with mpirun, running the
// existing commands with --json (tpr train; tpr bench model for prefill and
// decode), repeated until the step time is stable, one results.jsonl line per
// mesh (schema in docs/scale.md). Also the machine's description (one
// single-rank tpr bench model: sgemm rate and read bandwidth) and the
// collectives' rows for the alpha-beta fit (tpr bench comm at every np > 1).
#include "launch/scale_run.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "runtime/progress.h"
#include "scale/results.h"
#include "scale/stepmodel.h"

int tpr_scale_int_list(const char *flag, const char *text, int *out, int max) {
  int n = 0, lo, hi;
  char tail;
  if (sscanf(text, "%d..%d%c", &lo, &hi, &tail) == 2) {
    if (lo < 1 || hi < lo) return fprintf(stderr, "tpr scale: %s %s: needs 1 <= LO <= HI\n", flag, text), -1;
    for (long v = lo; v <= hi && n < max; v *= 2) out[n++] = (int)v;
    return n;
  }
  const char *p = text;
  while (*p) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 1 || v > 1 << 20 || (*end && *end != ',') || n >= max)
      return fprintf(stderr, "tpr scale: %s '%s': expected a list like 1,2,4 or a range 8..1024\n", flag, text), -1;
    out[n++] = (int)v;
    p = *end ? end + 1 : end;
  }
  return n ? n : (fprintf(stderr, "tpr scale: %s is empty\n", flag), -1);
}

typedef struct sweep {
  const char *config, *out, *tpr, *mpirun;
  const char *comm_max;  // the largest bench comm message (bench comm's size syntax)
  tpr_workload wl;
  bool strong;
  int64_t seq, batch, prompt, gen, steps, repeats, max_repeats;
  tpr_scale_config cfg;
  double cores, sgemm, read_gbs;
  double read_gbs_node, sgemm_busy;  // every core running a rank of the probe (0: one core)
  char mpi[128], tokens[1024];
} sweep;

// Runs a shell command; returns the lines of its stdout that start with '{'
// (malloc'ed, '\n'-separated) or NULL if it failed; stderr goes to DIR/log.
static char *run_lines(const sweep *s, const char *cmd) {
  char full[8192];
  snprintf(full, sizeof full, "%s 2>>'%s/log'", cmd, s->out);
  FILE *p = popen(full, "r");
  if (!p) return NULL;
  char line[65536], *all = NULL;
  size_t len = 0;
  while (fgets(line, sizeof line, p)) {
    if (line[0] != '{') continue;
    size_t k = strlen(line);
    char *grown = realloc(all, len + k + 1);
    if (!grown) break;
    all = grown;
    memcpy(all + len, line, k + 1);
    len += k;
  }
  if (pclose(p) != 0) free(all), all = NULL;
  return all;
}

// The last JSON line containing key (malloc'ed) or NULL.
static char *run_json(const sweep *s, const char *cmd, const char *key) {
  char *all = run_lines(s, cmd), *last = NULL;
  for (char *l = all ? strtok(all, "\n") : NULL; l; l = strtok(NULL, "\n"))
    if (strstr(l, key)) last = l;
  char *out = last ? strdup(last) : NULL;
  free(all);
  return out;
}

static double num(const cJSON *j, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static bool machine(sweep *s) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' -np 1 '%s' bench model --config '%s' --random-weights --batch 1 --prompt-len 4 "
           "--gen-len 2 --json", s->mpirun, s->tpr, s->config);
  char *line = run_json(s, cmd, "machine_gemm_gflops_per_rank");
  cJSON *j = line ? cJSON_Parse(line) : NULL;
  free(line);
  s->sgemm = num(j, "machine_gemm_gflops_per_rank"), s->read_gbs = num(j, "machine_read_gbs_per_rank");
  cJSON_Delete(j);
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  s->cores = c > 0 ? (double)c : 1;
  // The same probe on every core at once: each rank's read bandwidth and
  // GEMM rate when they share the node (its memory bus, caches, clocks).
  if (c > 1) {
    snprintf(cmd, sizeof cmd, "'%s' -np %ld --oversubscribe '%s' bench model --config '%s' --random-weights --batch 1 --prompt-len 4 "
             "--gen-len 2 --json", s->mpirun, c, s->tpr, s->config);
    line = run_json(s, cmd, "machine_gemm_gflops_per_rank");
    j = line ? cJSON_Parse(line) : NULL;
    free(line);
    s->sgemm_busy = num(j, "machine_gemm_gflops_per_rank");
    s->read_gbs_node = num(j, "machine_read_gbs_per_rank") * (double)c;
    cJSON_Delete(j);
  }
  snprintf(cmd, sizeof cmd, "'%s' --version 2>/dev/null", s->mpirun);
  FILE *p = popen(cmd, "r");
  if (!p || !fgets(s->mpi, sizeof s->mpi, p)) snprintf(s->mpi, sizeof s->mpi, "unknown");
  if (p) pclose(p);
  s->mpi[strcspn(s->mpi, "\n")] = 0;
  return s->sgemm > 0 && s->read_gbs > 0;
}

// A token file for tpr train: u16 ids of a fixed pseudo-random walk.
static bool write_tokens(sweep *s) {
  snprintf(s->tokens, sizeof s->tokens, "%s/tokens.npy", s->out);
  FILE *f = fopen(s->tokens, "wb");
  if (!f) return false;
  char h[118];
  int n = 1 << 16;
  snprintf(h, sizeof h, "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }", n);
  size_t len = strlen(h);
  memset(h + len, ' ', sizeof h - len - 1), h[sizeof h - 1] = '\n';  // 10 + 118 = 128: aligned
  unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, sizeof h, 0};
  bool ok = fwrite(magic, 1, 10, f) == 10 && fwrite(h, 1, sizeof h, f) == sizeof h;
  uint32_t x = 12345;
  for (int i = 0; ok && i < n; i++) {
    x = x * 1664525u + 1013904223u;
    uint16_t v = (uint16_t)((x >> 8) % (uint32_t)s->cfg.vocab);
    ok = fwrite(&v, 2, 1, f) == 1;
  }
  return fclose(f) == 0 && ok;
}

static void comm_rows(const sweep *s, int np) {
  char path[1200], cmd[4096];
  snprintf(path, sizeof path, "%s/comm_np%d.jsonl", s->out, np);
  if (access(path, F_OK) == 0) return;  // measured already: one per machine and np
  snprintf(cmd, sizeof cmd, "'%s' -np %d '%s' bench comm -o all -b 8 -e %s -f 4 -n 10 -w 2 -c 0 --json > '%s' "
           "2>>'%s/log'", s->mpirun, np, s->tpr, s->comm_max, path, s->out);
  if (system(cmd) != 0) fprintf(stderr, "tpr scale run: bench comm at np %d failed (see %s/log)\n", np, s->out);
}

// One run: its step time, tokens/s, phases and peak RSS (the largest rank's).
// Train phases: forward+backward, gradient sync, optimizer, exposed FSDP
// communication (medians over the timed steps); inference: the step.
#define N_PHASES 4
typedef struct sample {
  double step, tps, ph[N_PHASES], rss;
  double coll[TPR_COLL_COUNT];  // seconds per step in each collective kind (rank 0, --profile)
} sample;

// The collective kind an op of the profile is, or -1 (all_to_allv, the
// MoE dispatcher's exchange, counts as all_to_all as the model has it).
static int coll_of_op(const char *op) {
  return op && !strcmp(op, "all_to_allv") ? TPR_COLL_ALL_TO_ALL : tpr_coll_from_name(op);
}

static const char *phase_names[2][N_PHASES] = {{"compute", "grad_sync", "optimizer", "exposed_comm"},
                                               {"step", NULL, NULL, NULL}};

static bool one_run(const sweep *s, const tpr_scale_mesh *m, int64_t per_replica, sample *out) {
  char cmd[4096];
  const char *bin = s->tpr;
  if (s->wl == TPR_WL_TRAIN) {
    snprintf(cmd, sizeof cmd, "'%s' -np %d --oversubscribe '%s' train --config '%s' --random-init --data '%s' "
             "--seq-len %lld --micro-batch %lld --steps %lld --tp %d --dp %d --ep %d --profile --json", s->mpirun,
             m->world, bin,
             s->config, s->tokens, (long long)s->seq, (long long)per_replica, (long long)s->steps, m->tp, m->dp, m->ep);
  } else {
    snprintf(cmd, sizeof cmd, "'%s' -np %d --oversubscribe '%s' bench model --config '%s' --random-weights "
             "--batch %lld --prompt-len %lld --gen-len %lld --tp %d --dp %d --ep %d --profile --json", s->mpirun,
             m->world, bin,
             s->config, (long long)(per_replica * m->dp), (long long)s->prompt, (long long)s->gen, m->tp, m->dp, m->ep);
  }
  *out = (sample){0};
  const cJSON *rss = NULL;
  cJSON *j = NULL;
  if (s->wl == TPR_WL_TRAIN) {
    // The median over the timed steps (the first is warm-up), not the
    // summary's mean: a step the machine's other load delayed counts once.
    char *all = run_lines(s, cmd);
    double v[5][256], c[TPR_COLL_COUNT][256] = {{0}};
    int ns = 0;
    for (char *l = all ? strtok(all, "\n") : NULL; l; l = strtok(NULL, "\n")) {
      cJSON *x = cJSON_Parse(l);
      const cJSON *step = cJSON_GetObjectItemCaseSensitive(x, "step");
      if (cJSON_IsNumber(step) && step->valuedouble >= 1 && ns < 256) {
        v[0][ns] = num(x, "ms") * 1e-3, v[1][ns] = num(x, "fwd_bwd_ms") * 1e-3, v[2][ns] = num(x, "grad_sync_ms") * 1e-3;
        v[3][ns] = num(x, "optimizer_ms") * 1e-3;
        const cJSON *fsdp = cJSON_GetObjectItemCaseSensitive(x, "fsdp");
        v[4][ns] = num(fsdp, "exposed_ms") * 1e-3;
        // Each collective kind: the program's (--profile's collective_ms),
        // FSDP's gathers and scatters (outside the program) added.
        for (const cJSON *o = cJSON_GetObjectItemCaseSensitive(x, "collective_ms"), *k = o ? o->child : NULL; k;
             k = k->next) {
          int kind = coll_of_op(k->string);
          if (kind >= 0 && cJSON_IsNumber(k)) c[kind][ns] += k->valuedouble * 1e-3;
        }
        c[TPR_COLL_ALL_GATHER][ns] += num(fsdp, "all_gather_ms") * 1e-3;
        c[TPR_COLL_REDUCE_SCATTER][ns] += num(fsdp, "reduce_scatter_ms") * 1e-3;
        ns++;
      }
      if (cJSON_GetObjectItemCaseSensitive(x, "summary")) cJSON_Delete(j), j = x, x = NULL;
      cJSON_Delete(x);
    }
    free(all);
    if (!j || !ns) return cJSON_Delete(j), fprintf(stderr, "tpr scale run: no steps from: %s (see %s/log)\n", cmd, s->out), false;
    double q1, q3;
    tpr_scale_quartiles(v[0], (size_t)ns, &q1, &out->step, &q3);
    for (int k = 1; k < 5; k++) tpr_scale_quartiles(v[k], (size_t)ns, &q1, &out->ph[k - 1], &q3);
    for (int k = 0; k < TPR_COLL_COUNT; k++) tpr_scale_quartiles(c[k], (size_t)ns, &q1, &out->coll[k], &q3);
    out->tps = out->step > 0 ? (double)(s->seq * per_replica * m->dp) / out->step : 0;
    rss = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "summary"), "peak_rss_bytes");
  } else {
    char *line = run_json(s, cmd, "\"bench model\"");
    j = line ? cJSON_Parse(line) : NULL;
    free(line);
    if (!j) return fprintf(stderr, "tpr scale run: no JSON from: %s (see %s/log)\n", cmd, s->out), false;
    double tps = num(j, s->wl == TPR_WL_DECODE ? "decode_tok_s" : "prefill_tok_s");
    double per_step = s->wl == TPR_WL_DECODE ? num(j, "decode_tokens_per_step") : (double)(per_replica * s->prompt * m->dp);
    out->tps = tps, out->step = tps > 0 ? per_step / tps : 0, out->ph[0] = out->step;
    out->rss = num(j, "peak_rss_bytes_max");
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "profile"),
                                                       s->wl == TPR_WL_DECODE ? "decode" : "prefill");
    double steps = num(ph, "steps");
    for (const cJSON *o = cJSON_GetObjectItemCaseSensitive(ph, "ops"), *k = o ? o->child : NULL; k && steps > 0;
         k = k->next) {
      int c = coll_of_op(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(k, "op")));
      if (c >= 0) out->coll[c] += num(k, "ms") * 1e-3 / steps;
    }
  }
  for (const cJSON *r = rss ? rss->child : NULL; r; r = r->next)
    if (r->valuedouble > out->rss) out->rss = r->valuedouble;
  cJSON_Delete(j);
  return out->step > 0;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static cJSON *stats(double *x, int n) {
  double q1, med, q3;
  tpr_scale_quartiles(x, (size_t)n, &q1, &med, &q3);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "median", med);
  cJSON_AddNumberToObject(o, "q1", q1);
  cJSON_AddNumberToObject(o, "q3", q3);
  return o;
}

static bool point(const sweep *s, tpr_scale_mesh *m, FILE *results) {
  int64_t per_replica = s->strong ? s->batch / m->dp : s->batch;
  if (per_replica < 1 || (s->strong && s->batch % m->dp)) {
    fprintf(stderr, "tpr scale run: --strong: --batch %lld does not split over dp %d; skipped\n", (long long)s->batch,
            m->dp);
    return true;
  }
  sample runs[64];
  double x[64];
  int n = 0;
  for (; n < s->max_repeats && n < 64; n++) {
    if (!one_run(s, m, per_replica, &runs[n])) return false;
    if (n + 1 >= s->repeats) {  // stable: interquartile range within 10% of the median
      for (int i = 0; i <= n; i++) x[i] = runs[i].step;
      double q1, med, q3;
      tpr_scale_quartiles(x, (size_t)n + 1, &q1, &med, &q3);
      if (q3 - q1 <= 0.1 * med) {
        n++;
        break;
      }
    }
  }
  tpr_scale_work w = {.kind = s->wl};
  if (s->wl == TPR_WL_TRAIN) w.tokens = s->seq * per_replica, w.context = s->seq / 2, w.samples = w.tokens;
  else if (s->wl == TPR_WL_PREFILL) w.tokens = per_replica * s->prompt, w.context = s->prompt / 2, w.samples = per_replica;
  else w.tokens = per_replica, w.context = s->prompt + s->gen / 2, w.samples = per_replica;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "schema", TPR_SCALE_SCHEMA);
  cJSON_AddStringToObject(j, "workload", tpr_workload_name(s->wl));
  cJSON_AddStringToObject(j, "config", s->config);
  cJSON_AddStringToObject(j, "mode", s->strong ? "strong" : "weak");
  cJSON_AddNumberToObject(j, "np", m->world);
  cJSON_AddNumberToObject(j, "tp", m->tp);
  cJSON_AddNumberToObject(j, "dp", m->dp);
  cJSON_AddNumberToObject(j, "ep", m->ep);
  cJSON_AddNumberToObject(j, "etp", m->etp);
  cJSON_AddNumberToObject(j, "tokens_per_step", (double)w.tokens);
  cJSON_AddNumberToObject(j, "context", (double)w.context);
  cJSON_AddNumberToObject(j, "samples", (double)w.samples);
  cJSON_AddNumberToObject(j, "repeats", n);
  for (int i = 0; i < n; i++) x[i] = runs[i].step;
  cJSON_AddItemToObject(j, "step_s", stats(x, n));
  for (int i = 0; i < n; i++) x[i] = runs[i].tps;
  cJSON_AddItemToObject(j, "tokens_per_s", stats(x, n));
  cJSON *ph = cJSON_CreateObject();
  for (int k = 0; k < N_PHASES; k++) {
    const char *name = phase_names[s->wl == TPR_WL_TRAIN ? 0 : 1][k];
    if (!name) continue;
    for (int i = 0; i < n; i++) x[i] = runs[i].ph[k];
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    cJSON_AddNumberToObject(ph, name, x[n / 2]);
  }
  cJSON_AddItemToObject(j, "phases_s", ph);
  // Measured time in each collective kind (rank 0, waits for peers
  // included), the median over the runs: what the model's comm terms
  // predict, kind by kind.
  cJSON *co = cJSON_CreateObject();
  for (int k = 0; k < TPR_COLL_COUNT; k++) {
    for (int i = 0; i < n; i++) x[i] = runs[i].coll[k];
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    cJSON_AddNumberToObject(co, tpr_coll_name((tpr_coll)k), x[n / 2]);
  }
  cJSON_AddItemToObject(j, "collective_s", co);
  // Bytes per collective kind: counted from the config and the mesh (the
  // commands do not report them), per rank per step, f32 activations.
  tpr_scale_hw hw = {.act_bytes = 4, .param_bytes = 4};
  tpr_scale_call calls[TPR_SCALE_MAX_CALLS];
  int nc = tpr_scale_step_calls(&s->cfg, m, &w, &hw, calls);
  double bytes[TPR_COLL_COUNT] = {0};
  for (int i = 0; i < nc; i++) bytes[calls[i].op] += calls[i].count * calls[i].size;
  cJSON *by = cJSON_CreateObject();
  for (int k = 0; k < TPR_COLL_COUNT; k++) cJSON_AddNumberToObject(by, tpr_coll_name((tpr_coll)k), bytes[k]);
  cJSON_AddItemToObject(j, "bytes_per_step", by);
  for (int i = 0; i < n; i++) x[i] = runs[i].rss;
  qsort(x, (size_t)n, sizeof *x, cmp_d);
  cJSON_AddNumberToObject(j, "peak_rss_bytes", x[n - 1]);
  cJSON *mach = cJSON_CreateObject();
  cJSON_AddNumberToObject(mach, "cores", s->cores);
  cJSON_AddNumberToObject(mach, "sgemm_gflops", s->sgemm);
  cJSON_AddNumberToObject(mach, "read_gbs", s->read_gbs);
  if (s->read_gbs_node > 0 && s->sgemm_busy > 0) {
    cJSON_AddNumberToObject(mach, "read_gbs_node", s->read_gbs_node);
    cJSON_AddNumberToObject(mach, "sgemm_gflops_busy", s->sgemm_busy);
  }
  cJSON_AddNumberToObject(mach, "threads_per_rank", 1);
  cJSON_AddStringToObject(mach, "mpi", s->mpi);
  cJSON_AddStringToObject(mach, "transport", "mpi");
  cJSON_AddItemToObject(j, "machine", mach);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "%s seq %lld batch %lld prompt %lld gen %lld steps %lld",
           s->wl == TPR_WL_TRAIN ? "tpr train" : "tpr bench model", (long long)s->seq, (long long)per_replica,
           (long long)s->prompt, (long long)s->gen, (long long)s->steps);
  cJSON_AddStringToObject(j, "command", cmd);
  char *text = cJSON_PrintUnformatted(j);
  bool ok = text && tpr_scale_result_validate(j) == TPR_OK && fprintf(results, "%s\n", text) > 0;
  fflush(results);
  cJSON_Delete(j);
  free(text);
  double q1, med, q3;
  for (int i = 0; i < n; i++) x[i] = runs[i].step;
  tpr_scale_quartiles(x, (size_t)n, &q1, &med, &q3);
  printf("  %-8s np %-4d tp %-3d dp %-3d ep %-3d etp %-3d  %10.3f ms/step (IQR %.3f, %d runs)\n",
         tpr_workload_name(s->wl), m->world, m->tp, m->dp, m->ep, m->etp, med * 1e3, (q3 - q1) * 1e3, n);
  fflush(stdout);
  return ok;
}

static const char run_usage[] =
    "usage: tpr scale run --config F --out DIR [--workload train|prefill|decode] [--np 1,2,4] [--tp LIST] [--ep LIST]\n"
    "         [--dp LIST] [--strong | --weak] [--batch B] [--seq-len T] [--prompt-len P] [--gen-len G] [--steps S]\n"
    "         [--repeats R] [--max-repeats M] [--mpirun PATH]\n\n"
    "Runs every mesh (np in --np; tp, dp, ep from the lists where np = dp*tp and ep divides np; default tp = np)\n"
    "under mpirun --oversubscribe with one thread per rank, repeating until the step time's interquartile range\n"
    "is within 10% of the median (at least R, at most M runs), and appends one line per mesh to DIR/results.jsonl\n"
    "(schema tpr.scale.v1, docs/scale.md). --weak (default): --batch sequences per replica; --strong: --batch\n"
    "sequences in all, split over dp. Also writes DIR/comm_npN.jsonl (tpr bench comm -o all) for the fit of\n"
    "tpr scale model --calibrate DIR.";

int tpr_scale_run(int argc, char **argv) {
  sweep s = {.wl = TPR_WL_TRAIN, .seq = 32, .batch = 1, .prompt = 16, .gen = 16, .steps = 6, .repeats = 3,
             .max_repeats = 7, .mpirun = "mpirun", .comm_max = "64M"};
  const char *workload = "train", *np_s = "1,2,4", *tp_s = NULL, *ep_s = NULL, *dp_s = NULL;
  bool strong = false, weak = false;
  const tpr_arg args[] = {
      {"config", TPR_ARG_STR, &s.config, "model config.json (random weights)"},
      {"out", TPR_ARG_STR, &s.out, "output directory (results.jsonl is appended)"},
      {"workload", TPR_ARG_STR, &workload, "train | prefill | decode (default train)"},
      {"np", TPR_ARG_STR, &np_s, "rank counts (default 1,2,4)"},
      {"tp", TPR_ARG_STR, &tp_s, "tensor-parallel degrees to try (default: np)"},
      {"ep", TPR_ARG_STR, &ep_s, "expert-parallel degrees to try (default 1)"},
      {"dp", TPR_ARG_STR, &dp_s, "data-parallel degrees to try (default: np / tp)"},
      {"strong", TPR_ARG_FLAG, &strong, "fixed global batch"},
      {"weak", TPR_ARG_FLAG, &weak, "fixed batch per replica (default)"},
      {"batch", TPR_ARG_SIZE, &s.batch, "sequences (default 1)"},
      {"seq-len", TPR_ARG_SIZE, &s.seq, "train: tokens per sequence (default 32)"},
      {"prompt-len", TPR_ARG_SIZE, &s.prompt, "prefill/decode: prompt tokens (default 16)"},
      {"gen-len", TPR_ARG_SIZE, &s.gen, "decode: generated tokens (default 16)"},
      {"steps", TPR_ARG_INT, &s.steps, "train: optimizer steps per run (default 6; the first is untimed)"},
      {"repeats", TPR_ARG_INT, &s.repeats, "runs per mesh at least (default 3)"},
      {"max-repeats", TPR_ARG_INT, &s.max_repeats, "runs per mesh at most (default 7)"},
      {"mpirun", TPR_ARG_STR, &s.mpirun, "the MPI launcher (default mpirun)"},
      {"comm-max-bytes", TPR_ARG_STR, &s.comm_max,
       "largest message of the collectives' bench comm rows (default 64M: the sizes a step's FSDP gathers and "
       "gradient reductions reach, past the caches)"},
  };
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], run_usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  int wl = tpr_workload_from_name(workload), nps[32], tps[32], eps[32], dps[32], nnp, ntp = 0, nep = 1, ndp = 0;
  eps[0] = 1;
  if (!s.config || !s.out) return fprintf(stderr, "tpr scale run: --config and --out are required\n%s\n", run_usage), 2;
  if (wl < 0) return fprintf(stderr, "tpr scale run: --workload '%s' (train, prefill, decode)\n", workload), 2;
  if (strong && weak) return fprintf(stderr, "tpr scale run: --strong and --weak exclude each other\n"), 2;
  if (s.batch < 1 || s.seq < 2 || s.prompt < 1 || s.gen < 1 || s.steps < 2 || s.repeats < 1 ||
      s.max_repeats < s.repeats || s.max_repeats > 64)
    return fprintf(stderr, "tpr scale run: --batch, --prompt-len, --gen-len >= 1, --seq-len, --steps >= 2, "
                   "1 <= --repeats <= --max-repeats <= 64\n"), 2;
  const char *bad = strpbrk(s.config, "'") ? s.config : strpbrk(s.out, "'") ? s.out : NULL;
  if (bad) return fprintf(stderr, "tpr scale run: paths with a quote are not supported: %s\n", bad), 2;
  if ((nnp = tpr_scale_int_list("--np", np_s, nps, 32)) < 0 || (tp_s && (ntp = tpr_scale_int_list("--tp", tp_s, tps, 32)) < 0) ||
      (ep_s && (nep = tpr_scale_int_list("--ep", ep_s, eps, 32)) < 0) ||
      (dp_s && (ndp = tpr_scale_int_list("--dp", dp_s, dps, 32)) < 0))
    return 2;
  s.wl = (tpr_workload)wl, s.strong = strong;
  tpr_status st = tpr_scale_config_read(s.config, &s.cfg);
  if (st != TPR_OK) return fprintf(stderr, "tpr scale run: %s\n", tpr_last_error()), 1;
  char self[1024];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return fprintf(stderr, "tpr scale run: cannot find the tpr binary (/proc/self/exe)\n"), 1;
  self[len] = 0;
  s.tpr = self;
  if (mkdir(s.out, 0777) && errno != EEXIST) return fprintf(stderr, "tpr scale run: cannot create %s\n", s.out), 1;
  // Open MPI refuses root without these; one thread per rank makes the
  // per-rank compute rate the same at every np (oversubscription aside).
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  setenv("TPR_NUM_THREADS", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  if (!machine(&s)) return fprintf(stderr, "tpr scale run: measuring the machine failed (see %s/log)\n", s.out), 1;
  if (s.wl == TPR_WL_TRAIN && !write_tokens(&s))
    return fprintf(stderr, "tpr scale run: cannot write %s\n", s.tokens), 1;
  printf("tpr scale run: %s %s, %s scaling, machine: %.0f cores, sgemm %.1f GFLOP/s and read %.1f GB/s per rank, %s\n",
         tpr_workload_name(s.wl), s.config, strong ? "strong" : "weak", s.cores, s.sgemm, s.read_gbs, s.mpi);
  if (s.read_gbs_node > 0)
    printf("  every core busy: read %.1f GB/s for the node, sgemm %.1f GFLOP/s per rank\n", s.read_gbs_node,
           s.sgemm_busy);
  char path[1200];
  snprintf(path, sizeof path, "%s/results.jsonl", s.out);
  FILE *results = fopen(path, "a");
  if (!results) return fprintf(stderr, "tpr scale run: cannot open %s\n", path), 1;
  // Every mesh first, so the progress line knows how many points remain.
  tpr_scale_mesh *meshes = malloc((size_t)nnp * (size_t)(ntp ? ntp : ndp ? ndp : 1) * (size_t)nep * sizeof *meshes);
  if (!meshes) return fclose(results), fprintf(stderr, "tpr scale run: out of memory\n"), 1;
  int rc = 0, points = 0;
  for (int a = 0; a < nnp; a++) {
    int np = nps[a];
    for (int b = 0; b < (ntp ? ntp : ndp ? ndp : 1); b++) {
      int tp = ntp ? tps[b] : ndp ? (np % dps[b] ? 0 : np / dps[b]) : np;
      if (tp < 1 || np % tp) continue;
      int dp = np / tp;
      bool dp_ok = !ndp;
      for (int d = 0; d < ndp; d++) dp_ok |= dps[d] == dp;
      if (!dp_ok) continue;
      for (int e = 0; e < nep; e++) {
        if (np % eps[e]) continue;
        tpr_scale_mesh m = {.world = np, .tp = tp, .dp = dp, .ep = eps[e]};
        if (tpr_scale_mesh_resolve(&m) != TPR_OK) continue;
        m.fsdp = s.wl == TPR_WL_TRAIN && m.dp > 1;
        meshes[points++] = m;
      }
    }
  }
  tpr_cli_progress(0);
  setenv("TPR_PROGRESS", "0", 1);  // the runs it starts write to the log, never a progress line
  tpr_progress bar;
  tpr_progress_begin(&bar, "scale run", (uint64_t)points, "points");
  for (int i = 0; i < points && !rc; i++) {
    const tpr_scale_mesh *m = &meshes[i];
    char note[96];
    snprintf(note, sizeof note, "now np %d tp %d dp %d ep %d", m->world, m->tp, m->dp, m->ep);
    tpr_progress_update(&bar, (uint64_t)i, note);
    if (m->world > 1 && (i == 0 || meshes[i - 1].world != m->world)) comm_rows(&s, m->world);
    tpr_scale_mesh copy = *m;
    if (!point(&s, &copy, results)) rc = 1;
  }
  tpr_progress_end(&bar);
  free(meshes);
  fclose(results);
  if (!rc && !points) return fprintf(stderr, "tpr scale run: no mesh fits --np, --tp, --dp, --ep\n"), 2;
  if (!rc) printf("%d point(s) appended to %s\n", points, path);
  return rc;
}
