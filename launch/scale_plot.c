// tpr scale plot DIR: PNGs of a sweep through gnuplot (Debian gnuplot-nox):
// step time against ranks with the ideal line, parallel efficiency, the
// per-phase breakdown, and the model's predictions against the
// measurements (with DIR/predictions.jsonl of tpr scale model). The data
// and the gnuplot script stay in DIR/plots/ beside the PNGs, so a plot can
// be restyled by hand.
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "launch/args.h"
#include "launch/scale_run.h"
#include "scale/results.h"

#define MAX_POINTS 512
#define MAX_SERIES 16

typedef struct pt {
  tpr_scale_point p;
  double ph[4];  // compute, grad_sync, optimizer, exposed comm (train); step (inference)
  char series[64];
} pt;

static double num(const cJSON *j, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

// Series: points of one workload, ep and mesh kind (tp = np, dp = np, or a
// fixed tp with dp = np / tp), over np; the single-rank point of the
// workload starts every series of it.
static void series_name(pt *x) {
  const tpr_scale_mesh *m = &x->p.mesh;
  char kind[32];
  if (m->world == 1) snprintf(kind, sizeof kind, "np1");
  else if (m->tp == m->world) snprintf(kind, sizeof kind, "tp=np");
  else if (m->dp == m->world) snprintf(kind, sizeof kind, "dp=np");
  else snprintf(kind, sizeof kind, "tp %d, dp=np/%d", m->tp, m->tp);
  snprintf(x->series, sizeof x->series, "%s, %s, ep %d", tpr_workload_name(x->p.workload), kind, m->ep);
}

static int load(const char *dir, pt *pts, int *n, const char **modes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/results.jsonl", dir);
  FILE *f = fopen(path, "r");
  if (!f) return fprintf(stderr, "tpr scale plot: cannot open %s\n", path), -1;
  static char line[65536];
  int lineno = 0;
  *n = 0;
  while (fgets(line, sizeof line, f) && *n < MAX_POINTS) {
    lineno++;
    cJSON *j = cJSON_Parse(line);
    pt *x = &pts[*n];
    if (!j || tpr_scale_point_from_json(j, &x->p) != TPR_OK) {
      fprintf(stderr, "tpr scale plot: %s:%d: %s\n", path, lineno, j ? tpr_last_error() : "not JSON");
      cJSON_Delete(j);
      fclose(f);
      return -1;
    }
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(j, "phases_s");
    if (x->p.workload == TPR_WL_TRAIN) {
      x->ph[0] = num(ph, "compute"), x->ph[1] = num(ph, "grad_sync"), x->ph[2] = num(ph, "optimizer");
      x->ph[3] = num(ph, "exposed_comm");
    } else {
      x->ph[0] = num(ph, "step");
    }
    modes[*n] = strcmp(cJSON_GetObjectItemCaseSensitive(j, "mode")->valuestring, "strong") ? "weak" : "strong";
    series_name(x);
    cJSON_Delete(j);
    (*n)++;
  }
  fclose(f);
  return *n ? 0 : (fprintf(stderr, "tpr scale plot: %s has no points\n", path), -1);
}

static const char plot_usage[] =
    "usage: tpr scale plot DIR [--gnuplot PATH]\n\n"
    "Writes DIR/plots/{scaling,efficiency,breakdown,predicted}.png from DIR/results.jsonl (and\n"
    "DIR/predictions.jsonl, written by tpr scale model --calibrate DIR) with gnuplot (Debian: gnuplot-nox).\n"
    "Weak scaling's ideal is the single-rank step time at every np; strong scaling's, that time / np.";

int tpr_scale_plot(int argc, char **argv) {
  const char *gp = "gnuplot";
  const tpr_arg args[] = {{"gnuplot", TPR_ARG_STR, &gp, "the gnuplot binary (default gnuplot)"}};
  if (argc < 2 || argv[1][0] == '-') {
    tpr_args_result ar = tpr_args_parse(argc, argv, args, 1, plot_usage);
    if (ar == TPR_ARGS_HELP) return 0;
    return fprintf(stderr, "tpr scale plot: DIR is required\n%s\n", plot_usage), 2;
  }
  const char *dir = argv[1];
  tpr_args_result ar = tpr_args_parse(argc - 1, argv + 1, args, 1, plot_usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (strchr(dir, '\'') || strchr(dir, '"')) return fprintf(stderr, "tpr scale plot: quotes in DIR are not supported\n"), 2;
  static pt pts[MAX_POINTS];
  const char *modes[MAX_POINTS];
  int n;
  if (load(dir, pts, &n, modes)) return 1;
  char pdir[4096], path[4200];
  snprintf(pdir, sizeof pdir, "%s/plots", dir);
  if (mkdir(pdir, 0777) && errno != EEXIST) return fprintf(stderr, "tpr scale plot: cannot create %s\n", pdir), 1;
  // Series: a data file each, points sorted by np (a fixed order).
  char names[MAX_SERIES][64];
  int ns = 0;
  for (int i = 0; i < n; i++) {
    int s = 0;
    while (s < ns && strcmp(names[s], pts[i].series)) s++;
    if (s == ns && ns < MAX_SERIES && pts[i].p.mesh.world > 1) snprintf(names[ns++], 64, "%s", pts[i].series);
  }
  // The single-rank reference of each workload: ideal lines and efficiency.
  double t1[3] = {0};
  for (int i = 0; i < n; i++)
    if (pts[i].p.mesh.world == 1 && (!t1[pts[i].p.workload] || pts[i].p.step_s < t1[pts[i].p.workload]))
      t1[pts[i].p.workload] = pts[i].p.step_s;
  int max_np = 1;
  for (int i = 0; i < n; i++) max_np = pts[i].p.mesh.world > max_np ? pts[i].p.mesh.world : max_np;
  snprintf(path, sizeof path, "%s/plot.gp", pdir);
  FILE *g = fopen(path, "w");
  if (!g) return fprintf(stderr, "tpr scale plot: cannot write %s\n", path), 1;
  fprintf(g, "set terminal pngcairo size 1000,650 font ',11'\nset grid\nset key outside right top\n"
             "set datafile separator '\\t'\n");
  for (int s = 0; s < ns; s++) {
    snprintf(path, sizeof path, "%s/series%d.tsv", pdir, s);
    FILE *f = fopen(path, "w");
    if (!f) return fclose(g), fprintf(stderr, "tpr scale plot: cannot write %s\n", path), 1;
    for (int np = 1; np <= max_np; np++)
      for (int i = 0; i < n; i++) {
        const tpr_scale_point *p = &pts[i].p;
        bool mine = !strcmp(pts[i].series, names[s]) || (p->mesh.world == 1 && strstr(names[s], tpr_workload_name(p->workload)) == names[s]);
        if (!mine || p->mesh.world != np) continue;
        double ideal = t1[p->workload] / (strcmp(modes[i], "strong") ? 1 : np);
        fprintf(f, "%d\t%g\t%g\t%g\t%g\n", np, p->step_s * 1e3, p->step_q1 * 1e3, p->step_q3 * 1e3,
                ideal > 0 ? ideal / p->step_s : 0);
      }
    fclose(f);
  }
  // Ideal lines: one per workload measured at np 1.
  snprintf(path, sizeof path, "%s/ideal.tsv", pdir);
  FILE *f = fopen(path, "w");
  if (!f) return fclose(g), 1;
  for (int np = 1; np <= max_np; np *= 2)
    fprintf(f, "%d\t%g\t%g\t%g\n", np, t1[0] * 1e3, t1[1] * 1e3, t1[2] * 1e3);
  fclose(f);
  bool strong = false;
  for (int i = 0; i < n; i++) strong |= !strcmp(modes[i], "strong");
  fprintf(g, "set output '%s/scaling.png'\nset title '%s scaling: step time against ranks (median, IQR bars)'\n"
             "set xlabel 'ranks (np)'\nset ylabel 'step time (ms)'\nset logscale x 2\nset logscale y\n"
             "plot ", pdir, strong ? "Strong" : "Weak");
  for (int s = 0; s < ns; s++)
    fprintf(g, "'%s/series%d.tsv' using 1:2:3:4 with yerrorlines title '%s', ", pdir, s, names[s]);
  for (int w = 0; w < 3; w++)
    if (t1[w] > 0)
      fprintf(g, "'%s/ideal.tsv' using 1:($%d/%s) with lines dashtype 2 lw 2 title 'ideal (%s)', ", pdir, 2 + w,
              strong ? "$1" : "1", tpr_workload_name((tpr_workload)w));
  fprintf(g, "\nset output '%s/efficiency.png'\nset title 'Parallel efficiency: ideal step time / measured'\n"
             "set ylabel 'efficiency (1 = ideal)'\nunset logscale y\nset yrange [0:*]\nplot ", pdir);
  for (int s = 0; s < ns; s++) fprintf(g, "'%s/series%d.tsv' using 1:5 with linespoints title '%s', ", pdir, s, names[s]);
  fprintf(g, "1 with lines dashtype 2 lw 2 title 'ideal'\n");
  // Breakdown: one stacked bar per point.
  snprintf(path, sizeof path, "%s/breakdown.tsv", pdir);
  if (!(f = fopen(path, "w"))) return fclose(g), 1;
  for (int i = 0; i < n; i++) {
    const tpr_scale_point *p = &pts[i].p;
    double other = p->step_s - pts[i].ph[0] - pts[i].ph[1] - pts[i].ph[2];
    fprintf(f, "%s np%d tp%d dp%d ep%d\t%g\t%g\t%g\t%g\n", tpr_workload_name(p->workload), p->mesh.world, p->mesh.tp,
            p->mesh.dp, p->mesh.ep, pts[i].ph[0] * 1e3, pts[i].ph[1] * 1e3, pts[i].ph[2] * 1e3,
            other > 0 ? other * 1e3 : 0);
  }
  fclose(f);
  fprintf(g, "set output '%s/breakdown.png'\nset key inside left top\nset title 'Where a step goes (rank 0, medians)'\nunset logscale x\nset xlabel ''\nset ylabel 'time per step (ms)'\nset style data "
             "histograms\nset style histogram rowstacked\nset style fill solid 0.8 border -1\nset boxwidth 0.7\n"
             "set xtics rotate by -40\nset yrange [0:*]\n"
             "plot '%s' using 2:xtic(1) title 'compute (forward+backward; inference: whole step)', '' using 3 title "
             "'gradient sync + FSDP exposed', '' using 4 title 'optimizer', '' using 5 title 'rest of the step'\n",
             pdir, path);
  snprintf(path, sizeof path, "%s/predictions.jsonl", dir);
  bool have_pred = (f = fopen(path, "r")) != NULL;
  if (have_pred) {
    char out[4300];
    snprintf(out, sizeof out, "%s/predicted.tsv", pdir);
    FILE *o = fopen(out, "w");
    static char line[4096];
    while (o && fgets(line, sizeof line, f)) {
      cJSON *j = cJSON_Parse(line);
      if (!j) continue;
      const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "calibration");
      fprintf(o, "%g\t%g\t%g\t%g\t%d\n", num(j, "measured_s") * 1e3, num(j, "predicted_s") * 1e3, num(j, "q1_s") * 1e3,
              num(j, "q3_s") * 1e3, cJSON_IsTrue(c) ? 1 : 0);
      cJSON_Delete(j);
    }
    if (o) fclose(o);
    fclose(f);
    fprintf(g, "set output '%s/predicted.png'\nset title 'Step-time model: predicted against measured (IQR bars)'\n"
               "set style data points\nset xtics norotate\nset xlabel 'measured step time (ms)'\n"
               "set ylabel 'predicted step time (ms)'\nset logscale xy\nset yrange [*:*]\nset xrange [*:*]\n"
               "plot '%s' using ($5==0?$1:1/0):2:3:4 with xerrorbars pt 7 title 'held out', "
               "'' using ($5==1?$1:1/0):2 with points pt 5 ps 1.5 title 'calibration (np 1; tp = np, ep 1)', "
               "x with lines dashtype 2 title 'predicted = measured', 1.3*x with lines dashtype 3 lc 'gray' title "
               "'+/-30%%', 0.7*x with lines dashtype 3 lc 'gray' notitle\n", pdir, out);
  }
  fclose(g);
  char cmd[8600];
  snprintf(cmd, sizeof cmd, "'%s' '%s/plot.gp'", gp, pdir);
  int st = system(cmd);
  if (st != 0)
    return fprintf(stderr, "tpr scale plot: %s failed (exit %d; install gnuplot-nox, scripts/setup.sh does)\n", cmd,
                   st), 1;
  printf("wrote %s/scaling.png, efficiency.png, breakdown.png%s\n", pdir, have_pred ? ", predicted.png" : "");
  if (!have_pred) printf("(no %s/predictions.jsonl: run tpr scale model --calibrate %s for predicted.png)\n", dir, dir);
  return 0;
}
