// tpr scale: scaling sweeps (run), the step-time model's calibration on this
// machine (model --calibrate), its extrapolation to large meshes (predict)
// and the plots (plot). docs/scale.md describes the model and the files.
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch/args.h"
#include "launch/commands.h"
#include "launch/scale_run.h"
#include "scale/alphabeta.h"
#include "scale/hardware.h"
#include "scale/results.h"
#include "scale/stepmodel.h"

static int fail(const char *cmd) {
  fprintf(stderr, "tpr scale %s: %s\n", cmd, tpr_last_error());
  return 1;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

// The median of m sorted values (m > 0): the mean of the middle two for even m.
static double median_sorted(const double *v, size_t m) { return m % 2 ? v[m / 2] : (v[m / 2 - 1] + v[m / 2]) / 2; }

static int cmp_name(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

// The points calibration uses: every single-rank point (t_fixed) and, with
// sync_on_tp, the tensor-parallel meshes (tp = np, ep = 1: the fewest
// collectives per step) for t_sync at their np. Every other point is held out.
static bool is_calibration(const tpr_scale_point *p, bool sync_on_tp) {
  return p->mesh.world == 1 || (sync_on_tp && p->mesh.tp == p->mesh.world && p->mesh.ep == 1);
}

// Every point of a results file comes from one config (a sweep's): read once.
// A relative path is as the sweep was run: from the working directory, else
// from DIR's ancestors (a committed sweep under docs/ names configs/...).
static tpr_status points_config(const char *dir, const tpr_scale_point *pts, size_t n, tpr_scale_config *cfg) {
  if (!n) return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale model: %s/results.jsonl has no points", dir);
  for (size_t i = 1; i < n; i++)
    if (strcmp(pts[i].config, pts[0].config))
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale model: results mix configs %s and %s (one sweep per directory)",
                      pts[0].config, pts[i].config);
  const char *c = pts[0].config;
  if (c[0] != '/' && access(c, R_OK) != 0) {
    char up[4096] = "";
    for (int k = 1; k <= 4; k++) {
      char path[8192];
      size_t len = strlen(up);
      snprintf(up + len, sizeof up - len, "../");
      snprintf(path, sizeof path, "%s/%s%s", dir, up, c);
      if (access(path, R_OK) == 0) return tpr_scale_config_read(path, cfg);
    }
  }
  return tpr_scale_config_read(c, cfg);
}

// The machine's hardware description: alpha-beta fits of DIR/comm_np*.jsonl
// (one node: every group is "intra"), the roofline from the sweep's machine
// description, the roofline factor from the single-rank points (the median
// of measured / roofline; additive: t_fixed, their median residual over
// it). Points with np > 1 are not used.
static tpr_status calibrate(const char *dir, const tpr_scale_config *cfg, const tpr_scale_point *pts, size_t n,
                            bool sync_on_tp, bool additive, tpr_scale_hw *hw) {
  *hw = (tpr_scale_hw){.ranks_per_node = 1 << 20, .param_bytes = 4, .act_bytes = 4, .sync_on_tp = sync_on_tp};
  snprintf(hw->name, sizeof hw->name, "calibrated");
  if (!n) return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale model: %s/results.jsonl has no points", dir);
  // The roofline: the median of the sweeps' machine descriptions. Each
  // sweep (one tpr scale run) measures the machine once and several may
  // share a DIR, so each description counts once, not once per point: a
  // probe that a passing load slowed would otherwise weigh as much as the
  // sweep's point count.
  double *v = malloc(4 * n * sizeof *v);
  if (!v) return TPR_FAIL(TPR_ERR_OOM, "scale model: %zu points", n);
  size_t ns = 0, nb = 0;
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++)
      seen = pts[j].sgemm_gflops == pts[i].sgemm_gflops && pts[j].read_gbs == pts[i].read_gbs &&
             pts[j].read_gbs_node == pts[i].read_gbs_node && pts[j].sgemm_gflops_busy == pts[i].sgemm_gflops_busy;
    if (seen) continue;
    v[ns] = pts[i].sgemm_gflops, v[n + ns] = pts[i].read_gbs, ns++;
    // The all-cores-busy rates: the median of the sweeps that measured them.
    if (pts[i].read_gbs_node > 0 && pts[i].sgemm_gflops_busy > 0)
      v[2 * n + nb] = pts[i].read_gbs_node, v[3 * n + nb] = pts[i].sgemm_gflops_busy, nb++;
  }
  for (int k = 0; k < 4; k++) qsort(v + k * n, k < 2 ? ns : nb, sizeof *v, cmp_d);
  hw->gemm_flops = median_sorted(v, ns) * 1e9, hw->mem_bw = median_sorted(v + n, ns) * 1e9, hw->cores = pts[0].cores;
  if (nb) hw->mem_bw_node = median_sorted(v + 2 * n, nb) * 1e9, hw->gemm_flops_busy = median_sorted(v + 3 * n, nb) * 1e9;
  free(v);
  DIR *d = opendir(dir);
  if (!d) return TPR_FAIL(TPR_ERR_IO, "scale model: cannot list %s", dir);
  char names[64][256];  // sorted: a fixed read order, so the fit is deterministic
  int nn = 0;
  for (struct dirent *e; (e = readdir(d)) && nn < 64;)
    if (!strncmp(e->d_name, "comm_np", 7) && strstr(e->d_name, ".jsonl")) snprintf(names[nn++], 256, "%s", e->d_name);
  closedir(d);
  qsort(names, (size_t)nn, sizeof names[0], cmp_name);
  tpr_comm_sample *rows = NULL;
  size_t nrows = 0;
  tpr_status rc = TPR_OK;
  for (int i = 0; i < nn && rc == TPR_OK; i++) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%.255s", dir, names[i]) >= (int)sizeof path)
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "scale model: directory name too long: %s", dir);
    else
      rc = tpr_scale_read_comm(path, &rows, &nrows);
  }
  for (int k = 0; k < TPR_COLL_COUNT && rc == TPR_OK; k++) {
    if (tpr_scale_fit_ab(rows, nrows, (tpr_coll)k, "mpi", 0, NULL, &hw->intra[k]) != TPR_OK) hw->intra[k].points = 0;
    hw->inter[k] = hw->intra[k];
    for (int g = 2; g < TPR_SCALE_FIT_RANKS; g++)  // rank counts without rows (or one size) stay unfitted
      if (tpr_scale_fit_ab(rows, nrows, (tpr_coll)k, "mpi", g, NULL, &hw->by_ranks[k][g]) != TPR_OK)
        hw->by_ranks[k][g].points = 0;
  }
  free(rows);
  TPR_CHECK(rc);
  for (int w = 0; w < 3; w++) {
    double r[256];
    size_t m = 0;
    for (size_t i = 0; i < n && m < 256; i++) {
      if (pts[i].workload != (tpr_workload)w || pts[i].mesh.world != 1) continue;
      double fl, by;
      tpr_scale_step_work(cfg, &pts[i].mesh, &pts[i].work, hw, &fl, &by);
      double roof = fmax(fl / hw->gemm_flops, by / hw->mem_bw);
      r[m++] = additive ? fmax(0, pts[i].step_s - roof) : pts[i].step_s / roof;
    }
    if (m) qsort(r, m, sizeof *r, cmp_d);
    // What a single-rank step takes beyond its roofline is either a cost
    // per step (additive) or, by default, a factor on the work (kernels
    // below peak, elementwise ops): a rank's share of the work shrinks with
    // tp, and so does that part of its time.
    if (additive) hw->t_fixed[w] = m ? r[m / 2] : 0;
    else hw->roofline_factor[w] = m ? r[m / 2] : 1;
  }
  // t_sync[workload][np]: the median over the workload's calibration meshes
  // at np of what their steps took beyond the model so far, per collective
  // call. (One value for every workload would carry a training step's wait,
  // whose segments between calls are long, to decode's short ones.)
  for (int w = 0; sync_on_tp && w < 3; w++)
    for (int g = 2; g < TPR_SCALE_FIT_RANKS; g++) {
      double r[256];
      size_t m = 0;
      for (size_t i = 0; i < n && m < 256; i++) {
        if (pts[i].workload != (tpr_workload)w || pts[i].mesh.world != g || !is_calibration(&pts[i], true)) continue;
        tpr_scale_pred p;
        TPR_CHECK(tpr_scale_predict(cfg, &pts[i].mesh, &pts[i].work, hw, &p));
        if (p.calls > 0) r[m++] = fmax(0, (pts[i].step_s - p.step_s) / p.calls);
      }
      if (m) qsort(r, m, sizeof *r, cmp_d);
      hw->t_sync[w][g] = m ? r[m / 2] : 0;
    }
  return TPR_OK;
}

// Predicts every point, prints the table and (write) DIR/predictions.jsonl;
// *median and *worst: absolute relative error over the points calibration
// did not use.
static tpr_status errors(const char *dir, const tpr_scale_config *cfg, const tpr_scale_point *pts, size_t n,
                         const tpr_scale_hw *hw, bool sync_on_tp, bool write, double *median, double *worst,
                         int *held_out) {
  const bool print = true;
  char path[1200];
  snprintf(path, sizeof path, "%s/predictions.jsonl", dir);
  FILE *f = write ? fopen(path, "w") : NULL;
  if (write && !f) return TPR_FAIL(TPR_ERR_IO, "scale model: cannot write %s", path);
  double *e = calloc(n + 1, sizeof *e), *ew = calloc(n + 1, sizeof *ew);
  int m = 0;
  if (print)
    printf("%-8s %4s %3s %3s %3s %3s  %12s %12s %12s %12s %12s %8s\n", "workload", "np", "tp", "dp", "ep", "etp",
           "measured ms", "IQR ms", "predicted ms", "comm ms", "meas comm ms", "error");
  tpr_status rc = TPR_OK;
  for (size_t i = 0; i < n && rc == TPR_OK; i++) {
    tpr_scale_pred p;
    rc = tpr_scale_predict(cfg, &pts[i].mesh, &pts[i].work, hw, &p);
    if (rc != TPR_OK) break;
    double err = p.step_s / pts[i].step_s - 1;
    bool calib = is_calibration(&pts[i], sync_on_tp);
    if (!calib && e) e[m++] = fabs(err);
    const tpr_scale_mesh *k = &pts[i].mesh;
    // The measured collectives beside the predicted ones: where the model
    // misses (a wait for a peer shows here, not in the alpha-beta terms).
    double meas_comm = 0;
    char meas[32] = "-";
    for (int c = 0; c < TPR_COLL_COUNT; c++) meas_comm += pts[i].coll_s[c];
    if (pts[i].has_coll) snprintf(meas, sizeof meas, "%.3f", meas_comm * 1e3);
    if (print)
      printf("%-8s %4d %3d %3d %3d %3d  %12.3f %12.3f %12.3f %12.3f %12s %+7.1f%%%s\n",
             tpr_workload_name(pts[i].workload), k->world, k->tp, k->dp, k->ep, k->etp, pts[i].step_s * 1e3,
             (pts[i].step_q3 - pts[i].step_q1) * 1e3, p.step_s * 1e3, p.comm_s * 1e3, meas, 100 * err,
             calib ? "  (calibration)" : "");
    if (f) {
      fprintf(f, "{\"workload\":\"%s\",\"np\":%d,\"tp\":%d,\"dp\":%d,\"ep\":%d,\"etp\":%d,\"measured_s\":%.6g,"
              "\"q1_s\":%.6g,\"q3_s\":%.6g,\"predicted_s\":%.6g,\"compute_s\":%.6g,\"comm_s\":%.6g,\"error\":%.6g,"
              "\"calibration\":%s,\"predicted_collective_s\":{", tpr_workload_name(pts[i].workload), k->world, k->tp,
              k->dp, k->ep, k->etp, pts[i].step_s, pts[i].step_q1, pts[i].step_q3, p.step_s, p.compute_s, p.comm_s,
              err, calib ? "true" : "false");
      for (int c = 0; c < TPR_COLL_COUNT; c++)
        fprintf(f, "%s\"%s\":%.6g", c ? "," : "", tpr_coll_name((tpr_coll)c), p.coll_s[c]);
      fprintf(f, "}");
      if (pts[i].has_coll) {
        fprintf(f, ",\"measured_collective_s\":{");
        for (int c = 0; c < TPR_COLL_COUNT; c++)
          fprintf(f, "%s\"%s\":%.6g", c ? "," : "", tpr_coll_name((tpr_coll)c), pts[i].coll_s[c]);
        fprintf(f, "}");
      }
      fprintf(f, "}\n");
    }
  }
  if (f && fclose(f) && rc == TPR_OK) rc = TPR_FAIL(TPR_ERR_IO, "scale model: writing %s", path);
  for (int w = 0; print && rc == TPR_OK && e && ew && w < 3; w++) {  // per workload
    int mw = 0;
    for (size_t i = 0; i < n; i++) {
      tpr_scale_pred p;
      if (pts[i].workload != (tpr_workload)w || is_calibration(&pts[i], sync_on_tp)) continue;
      if (tpr_scale_predict(cfg, &pts[i].mesh, &pts[i].work, hw, &p) == TPR_OK) ew[mw++] = fabs(p.step_s / pts[i].step_s - 1);
    }
    if (!mw) continue;
    qsort(ew, (size_t)mw, sizeof *ew, cmp_d);
    printf("%-8s held out: %d point(s), median absolute error %.1f%%, worst %.1f%%\n", tpr_workload_name((tpr_workload)w),
           mw, 100 * (mw % 2 ? ew[mw / 2] : (ew[mw / 2 - 1] + ew[mw / 2]) / 2), 100 * ew[mw - 1]);
  }
  free(ew);
  if (e && m) qsort(e, (size_t)m, sizeof *e, cmp_d);
  *median = e && m ? (m % 2 ? e[m / 2] : (e[m / 2 - 1] + e[m / 2]) / 2) : 0;
  *worst = e && m ? e[m - 1] : 0;
  *held_out = m;
  free(e);
  return rc;
}

static const char model_usage[] =
    "usage: tpr scale model --calibrate DIR\n\n"
    "Fits the alpha-beta model of every collective to DIR/comm_np*.jsonl (tpr bench comm --json; nccl-tests' bus\n"
    "factors), takes the roofline (sgemm rate, read bandwidth) from DIR/results.jsonl's machine description and\n"
    "the roofline factor (measured / roofline) from its single-rank points, writes DIR/model.json, predicts every\n"
    "measured point\n"
    "from its mesh and config alone (DIR/predictions.jsonl) and prints the error of each, with the median and\n"
    "worst absolute error over the points not used for calibration. By default (--calibrate-on tp) a per-call\n"
    "synchronisation cost per workload at each np is also fitted on the tp = np, ep = 1 meshes, which are then\n"
    "not held out; --calibrate-on single uses the single-rank points only and holds out every point with np > 1.\n"
    "--single-rank-residual per-step: the single-rank points' time beyond the roofline\n"
    "is a fixed cost per step instead of a factor on the work (the model before the factor, for comparison).";

static int cmd_model(int argc, char **argv) {
  const char *dir = NULL;
  const char *on = "tp", *residual = "per-work";
  const tpr_arg args[] = {
      {"calibrate", TPR_ARG_STR, &dir, "sweep directory of tpr scale run"},
      {"calibrate-on", TPR_ARG_STR, &on,
       "tp (default): the single-rank points and the tp = np, ep = 1 meshes (t_sync per workload and np); single: the single-rank points only"},
      {"single-rank-residual", TPR_ARG_STR, &residual,
       "per-work (default): a factor on the roofline time; per-step: a fixed cost per step"},
  };
  tpr_args_result ar = tpr_args_parse(argc, argv, args, 3, model_usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (strcmp(on, "tp") && strcmp(on, "single"))
    return fprintf(stderr, "tpr scale model: --calibrate-on '%s' (tp, single)\n", on), 2;
  bool sync_on_tp = !strcmp(on, "tp");
  if (strcmp(residual, "per-work") && strcmp(residual, "per-step"))
    return fprintf(stderr, "tpr scale model: --single-rank-residual '%s' (per-work, per-step)\n", residual), 2;
  bool additive = !strcmp(residual, "per-step");
  if (!dir) return fprintf(stderr, "tpr scale model: --calibrate DIR is required\n%s\n", model_usage), 2;
  char path[1200];
  snprintf(path, sizeof path, "%s/results.jsonl", dir);
  tpr_scale_point *pts = NULL;
  size_t n = 0;
  tpr_scale_config cfg;
  tpr_scale_hw hw;
  if (tpr_scale_read_results(path, &pts, &n) != TPR_OK || points_config(dir, pts, n, &cfg) != TPR_OK ||
      calibrate(dir, &cfg, pts, n, sync_on_tp, additive, &hw) != TPR_OK) {
    free(pts);
    return fail("model");
  }
  printf("calibrated on %s: sgemm %.1f GFLOP/s, read %.1f GB/s per rank, %.0f cores\n", dir, hw.gemm_flops * 1e-9,
         hw.mem_bw * 1e-9, hw.cores);
  if (additive)
    printf("  single-rank time beyond the roofline, a fixed cost per step: train %.3f ms, prefill %.3f ms, decode "
           "%.3f ms\n", hw.t_fixed[0] * 1e3, hw.t_fixed[1] * 1e3, hw.t_fixed[2] * 1e3);
  else
    printf("  single-rank time over the roofline time (a factor on each rank's work): train %.2f, prefill %.2f, "
           "decode %.2f\n", hw.roofline_factor[0], hw.roofline_factor[1], hw.roofline_factor[2]);
  if (hw.mem_bw_node > 0)
    printf("  every core busy: read %.1f GB/s for the node (shared by its running ranks), sgemm %.1f GFLOP/s per "
           "rank\n", hw.mem_bw_node * 1e-9, hw.gemm_flops_busy * 1e-9);
  for (int w = 0; w < 3; w++)
    for (int g = 2; g < TPR_SCALE_FIT_RANKS; g++)
      if (hw.t_sync[w][g] > 0)
        printf("  synchronisation cost per collective call, %s at np %d: %.1f us\n", tpr_workload_name((tpr_workload)w),
               g, hw.t_sync[w][g] * 1e6);
  printf("%-15s %6s %12s %14s %10s %6s\n", "collective", "ranks", "alpha us", "bus GB/s", "rms resid", "rows");
  for (int k = 0; k < TPR_COLL_COUNT; k++)
    for (int g = 0; g < TPR_SCALE_FIT_RANKS; g++) {
      const tpr_ab *ab = g ? &hw.by_ranks[k][g] : &hw.intra[k];
      char ranks[8] = "all";
      if (g) snprintf(ranks, sizeof ranks, "%d", g);
      if (ab->points)
        printf("%-15s %6s %12.2f %14.3f %9.1f%% %6d\n", tpr_coll_name((tpr_coll)k), ranks, ab->alpha * 1e6,
               1e-9 / ab->beta, 100 * ab->rms_rel, ab->points);
      if (ab->points && ab->split > 0)  // the large-message regime, from `split` bytes on
        printf("%-15s %6s %12.2f %14.3f   from %.0f KiB\n", "", "", ab->alpha_large * 1e6, 1e-9 / ab->beta_large,
               ab->split / 1024);
    }
  double med, worst;
  int held;
  snprintf(path, sizeof path, "%s/model.json", dir);
  if (tpr_scale_hw_write(path, &hw) != TPR_OK || errors(dir, &cfg, pts, n, &hw, sync_on_tp, true, &med, &worst, &held) != TPR_OK) {
    free(pts);
    return fail("model");
  }
  free(pts);
  printf("prediction error on %d point(s) not used for calibration: median %.1f%%, worst %.1f%%\nwrote %s\n", held,
         100 * med, 100 * worst, path);
  return 0;
}

static const char predict_usage[] =
    "usage: tpr scale predict --config F [--np 8..1024] [--gpu h100|cpu] [--network ib-400g|ib-200g|roce-100g]\n"
    "         [--calibration DIR] [--workload train|prefill|decode] [--tp T] [--ep E] [--etp 1] [--seq-len 4096]\n"
    "         [--batch 1] [--prompt-len 1024] [--gen-len 256]\n\n"
    "Step time, tokens/s and the compute/communication split of each mesh (tp = min(T, np), ep = min(E, np),\n"
    "dp = np / tp) from the step-time model: --gpu h100 uses the documented H100 + network preset (docs/scale.md,\n"
    "\"tpr scale predict\"), --gpu cpu this machine's calibration (DIR/model.json of tpr scale model). With\n"
    "--calibration DIR it also prints the model's error on every point DIR measured.";

static int cmd_predict(int argc, char **argv) {
  const char *config = NULL, *np_s = "8..1024", *gpu = "h100", *network = NULL, *dir = NULL, *workload = "train";
  int64_t tp = 8, ep = 0, etp = 1, seq = 4096, batch = 1, prompt = 1024, gen = 256;
  const tpr_arg args[] = {
      {"config", TPR_ARG_STR, &config, "model config.json"},
      {"np", TPR_ARG_STR, &np_s, "rank counts: a list 8,64,1024 or a range 8..1024 (powers of two)"},
      {"gpu", TPR_ARG_STR, &gpu, "h100 | cpu (cpu needs --calibration)"},
      {"network", TPR_ARG_STR, &network, "ib-400g (default) | ib-200g | roce-100g"},
      {"calibration", TPR_ARG_STR, &dir, "a calibrated sweep directory (model.json, results.jsonl)"},
      {"workload", TPR_ARG_STR, &workload, "train | prefill | decode (default train)"},
      {"tp", TPR_ARG_INT, &tp, "tensor-parallel degree, capped at np (default 8: one node)"},
      {"ep", TPR_ARG_INT, &ep, "expert-parallel degree, capped at np (default: the number of experts)"},
      {"etp", TPR_ARG_INT, &etp, "expert tensor-parallel degree (default 1)"},
      {"seq-len", TPR_ARG_SIZE, &seq, "train: tokens per sequence (default 4096)"},
      {"batch", TPR_ARG_SIZE, &batch, "sequences per replica per step (default 1)"},
      {"prompt-len", TPR_ARG_SIZE, &prompt, "prefill/decode prompt tokens (default 1024)"},
      {"gen-len", TPR_ARG_SIZE, &gen, "decode: generated tokens (default 256)"},
  };
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], predict_usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  int nps[32], nnp, wl = tpr_workload_from_name(workload);
  if (!config) return fprintf(stderr, "tpr scale predict: --config is required\n%s\n", predict_usage), 2;
  if (wl < 0) return fprintf(stderr, "tpr scale predict: --workload '%s' (train, prefill, decode)\n", workload), 2;
  if (tp < 1 || ep < 0 || etp < 1 || seq < 2 || batch < 1 || prompt < 1 || gen < 1)
    return fprintf(stderr, "tpr scale predict: --tp, --etp, --batch, --prompt-len, --gen-len >= 1, --seq-len >= 2\n"), 2;
  if ((nnp = tpr_scale_int_list("--np", np_s, nps, 32)) < 0) return 2;
  tpr_scale_config cfg;
  tpr_scale_hw hw;
  char path[1200];
  if (tpr_scale_config_read(config, &cfg) != TPR_OK) return fail("predict");
  if (!strcmp(gpu, "cpu")) {
    if (!dir) return fprintf(stderr, "tpr scale predict: --gpu cpu needs --calibration DIR\n"), 2;
    snprintf(path, sizeof path, "%s/model.json", dir);
    if (tpr_scale_hw_read(path, &hw) != TPR_OK) return fail("predict");
  } else if (tpr_scale_hw_preset(gpu, network, &hw) != TPR_OK) {
    return fail("predict");
  }
  tpr_scale_work w = {.kind = (tpr_workload)wl};
  if (wl == TPR_WL_TRAIN) w.tokens = seq * batch, w.context = seq / 2, w.samples = w.tokens;
  else if (wl == TPR_WL_PREFILL) w.tokens = batch * prompt, w.context = prompt / 2, w.samples = batch;
  else w.tokens = batch, w.context = prompt + gen / 2, w.samples = batch;
  printf("tpr scale predict: %s, %s, %lld tokens per replica per step, hardware %s\n", config, workload,
         (long long)w.tokens, hw.name);
  printf("%5s %3s %4s %4s %3s %4s  %11s %13s %10s %8s %8s  %s\n", "np", "tp", "dp", "ep", "etp", "edp", "step ms",
         "tokens/s", "TFLOP/s/r", "compute", "comm", "comm by kind (ms)");
  for (int i = 0; i < nnp; i++) {
    int np = nps[i], t = (int)(tp < np ? tp : np), e = (int)(ep ? (ep < np ? ep : np) : (cfg.experts < np ? cfg.experts : np));
    tpr_scale_mesh m = {.world = np, .tp = t, .ep = e, .etp = (int)etp};
    if (np % t || np % (e * (int)etp) || tpr_scale_mesh_resolve(&m) != TPR_OK) {
      printf("%5d  (tp %d, ep %d, etp %d do not divide it: skipped)\n", np, t, e, (int)etp);
      continue;
    }
    m.fsdp = wl == TPR_WL_TRAIN && m.dp > 1;
    tpr_scale_pred p;
    if (tpr_scale_predict(&cfg, &m, &w, &hw, &p) != TPR_OK) return fail("predict");
    // TFLOP/s/r: the model's FLOPs per rank over the whole step, the figure
    // training reports quote per GPU (Megatron's "TFLOPS").
    printf("%5d %3d %4d %4d %3d %4d  %11.3f %13.1f %10.3g %7.1f%% %7.1f%% ", np, m.tp, m.dp, m.ep, m.etp,
           np / (m.ep * m.etp), p.step_s * 1e3, p.tokens_per_s, p.flops / p.step_s * 1e-12, 100 * p.compute_s / p.step_s,
           100 * p.comm_s / p.step_s);
    for (int k = 0; k < TPR_COLL_COUNT; k++)
      if (p.coll_s[k] > 0) printf(" %s %.2f", tpr_coll_name((tpr_coll)k), p.coll_s[k] * 1e3);
    printf("\n");
  }
  if (dir) {  // the error on every point that was run, with this machine's calibration
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    tpr_scale_point *pts = NULL;
    size_t n = 0;
    tpr_scale_config pc;
    tpr_scale_hw mh;
    double med, worst;
    int held;
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    tpr_status rc = tpr_scale_read_results(path, &pts, &n);
    if (rc == TPR_OK) rc = points_config(dir, pts, n, &pc);
    if (rc == TPR_OK) {
      snprintf(path, sizeof path, "%s/model.json", dir);
      rc = tpr_scale_hw_read(path, &mh);
    }
    if (rc == TPR_OK) printf("\nthe model on the points measured in %s:\n", dir);
    if (rc == TPR_OK) rc = errors(dir, &pc, pts, n, &mh, mh.sync_on_tp, false, &med, &worst, &held);
    free(pts);
    if (rc != TPR_OK) return fail("predict");
    printf("prediction error on %d point(s) not used for calibration: median %.1f%%, worst %.1f%%\n", held,
           100 * med, 100 * worst);
  }
  return 0;
}

static const tpr_command subs[] = {
    {"run", "launch a sweep of meshes with mpirun; DIR/results.jsonl", tpr_scale_run},
    {"model", "calibrate the step-time model on a sweep (--calibrate DIR); prediction errors", cmd_model},
    {"predict", "step time, tokens/s, compute/comm split of large meshes (hardware presets)", cmd_predict},
    {"plot", "PNGs of a sweep with gnuplot: scaling + ideal, efficiency, breakdown, predicted vs measured", tpr_scale_plot},
};

int tpr_cmd_scale(int argc, char **argv) {
  bool help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"));
  if (argc >= 2 && !help)
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
      if (!strcmp(argv[1], subs[i].name)) return subs[i].run(argc - 1, argv + 1);
  FILE *f = help ? stdout : stderr;
  if (argc >= 2 && !help) fprintf(stderr, "tpr scale: unknown subcommand '%s'\n\n", argv[1]);
  fprintf(f, "usage: tpr scale <subcommand> [options]\n\nsubcommands:\n");
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) fprintf(f, "  %-9s %s\n", subs[i].name, subs[i].summary);
  fprintf(f, "\n'tpr scale <subcommand> --help' describes its options; docs/scale.md the model and the files.\n");
  return help ? 0 : 2;
}
