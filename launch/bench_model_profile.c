// tpr bench model --profile: per-op-kind time of the prefill and decode
// steps (see bench_model_profile.h).
#include "launch/bench_model_profile.h"

#include <stdio.h>
#include <string.h>

#define TOP_KINDS 12  // the text table's rows; the rest share one line (JSON lists all)

void tpr_bench_profile_start(tpr_bench_profile *p) {
  memset(p, 0, sizeof *p);
  tpr_exec_set_op_profile(&p->step);
}

void tpr_bench_profile_step(tpr_bench_profile *p, bool prefill, double seconds) {
  tpr_bench_phase *ph = prefill ? &p->prefill : &p->decode;
  for (int k = 0; k < TPR_OP_KIND_COUNT; k++) {
    ph->ops.calls[k] += p->step.calls[k];
    ph->ops.seconds[k] += p->step.seconds[k];
  }
  ph->ops.runs += p->step.runs;
  ph->ops.run_seconds += p->step.run_seconds;
  ph->steps++;
  ph->step_seconds += seconds;
  memset(&p->step, 0, sizeof p->step);
}

void tpr_bench_profile_stop(void) { tpr_exec_set_op_profile(NULL); }

// The op kinds that ran, slowest first (ties: kind order, so output is stable).
static int ranked_kinds(const tpr_exec_op_profile *o, int *kinds) {
  int n = 0;
  for (int k = 0; k < TPR_OP_KIND_COUNT; k++)
    if (o->calls[k] > 0) kinds[n++] = k;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && o->seconds[kinds[j]] > o->seconds[kinds[j - 1]]; j--) {
      int t = kinds[j];
      kinds[j] = kinds[j - 1], kinds[j - 1] = t;
    }
  return n;
}

static double ops_seconds(const tpr_exec_op_profile *o) {
  double s = 0;
  for (int k = 0; k < TPR_OP_KIND_COUNT; k++) s += o->seconds[k];
  return s;
}

static void print_phase(const char *name, const tpr_bench_phase *ph, const char *title) {
  if (ph->steps == 0) return;
  double step = ph->step_seconds, ops = ops_seconds(&ph->ops);
  printf("  %s profile (%s; %lld steps, %.3f ms a step)\n", name, title, (long long)ph->steps,
         1e3 * step / (double)ph->steps);
  printf("    %-28s %12s %10s %10s\n", "op kind", "total ms", "% of step", "calls");
  int kinds[TPR_OP_KIND_COUNT], n = ranked_kinds(&ph->ops, kinds);
  double rest_s = 0;
  int64_t rest_calls = 0;
  for (int i = 0; i < n; i++) {
    int k = kinds[i];
    if (i >= TOP_KINDS) {
      rest_s += ph->ops.seconds[k], rest_calls += ph->ops.calls[k];
      continue;
    }
    printf("    %-28s %12.3f %9.1f%% %10lld\n", tpr_op_name((tpr_op_kind)k), 1e3 * ph->ops.seconds[k],
           100 * ph->ops.seconds[k] / step, (long long)ph->ops.calls[k]);
  }
  if (n > TOP_KINDS)
    printf("    %-28s %12.3f %9.1f%% %10lld\n", "(other op kinds)", 1e3 * rest_s, 100 * rest_s / step,
           (long long)rest_calls);
  double exec_gap = ph->ops.run_seconds - ops, engine = step - ph->ops.run_seconds;
  printf("    %-28s %12.3f %9.1f%%            (in the exec between nodes %.3f ms; engine outside runs %.3f ms: "
         "scheduling, inputs, logits, sampling, program setup)\n",
         "other/overhead", 1e3 * (step - ops), 100 * (step - ops) / step, 1e3 * exec_gap, 1e3 * engine);
}

void tpr_bench_profile_print(const tpr_bench_profile *p, const char *title) {
  print_phase("decode", &p->decode, title);
  print_phase("prefill", &p->prefill, title);
}

static void phase_json(const char *name, const tpr_bench_phase *ph) {
  double step = ph->step_seconds, ops = ops_seconds(&ph->ops);
  printf("\"%s\":{\"steps\":%lld,\"step_ms\":%.6g,\"ops_ms\":%.6g,\"exec_runs\":%lld,\"exec_ms\":%.6g,"
         "\"other_ms\":%.6g,\"ops\":[",
         name, (long long)ph->steps, 1e3 * step, 1e3 * ops, (long long)ph->ops.runs, 1e3 * ph->ops.run_seconds,
         1e3 * (step - ops));
  int kinds[TPR_OP_KIND_COUNT], n = ranked_kinds(&ph->ops, kinds);
  for (int i = 0; i < n; i++) {
    int k = kinds[i];
    printf("%s{\"op\":\"%s\",\"ms\":%.6g,\"pct\":%.6g,\"calls\":%lld}", i ? "," : "", tpr_op_name((tpr_op_kind)k),
           1e3 * ph->ops.seconds[k], step > 0 ? 100 * ph->ops.seconds[k] / step : 0, (long long)ph->ops.calls[k]);
  }
  printf("]}");
}

void tpr_bench_profile_print_json(const tpr_bench_profile *p, int rank) {
  printf("\"profile\":{\"rank\":%d,", rank);
  phase_json("decode", &p->decode);
  printf(",");
  phase_json("prefill", &p->prefill);
  printf("}");
}
