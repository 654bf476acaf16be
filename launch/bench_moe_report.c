// tpr bench moe: reductions over ranks and the report.
//
// Definitions (ep = the expert-parallel degree):
//  - times: each rank's mean per timed cycle, then the max over the world
//    (the slowest rank sets a layer's pace);
//  - dispatch_bytes: token rows a rank receives x H x 4 (f32), as DeepEP
//    counts them, averaged over the world's ranks; combine_bytes: the same
//    rows sent back (equal by construction). dispatch_gbs = dispatch_bytes /
//    dispatch_s, combine_gbs likewise;
//  - busbw as nccl-tests' all_to_all: (bytes a rank sends) / time x (ep-1)/ep.
//    Summed over ranks the rows sent equal the rows received, so the mean
//    bytes a rank sends are dispatch_bytes (combine_bytes for the combine);
//  - the baseline is tpr_comm_all_to_all over the ep communicator with
//    a2a_count = ceil(dispatch_bytes / ep / 4) f32 per peer (a2a_bytes =
//    a2a_count x ep x 4 per rank); a2a_busbw_gbs = a2a_bytes / a2a_s x
//    (ep-1)/ep; dispatch_vs_a2a = dispatch_busbw_gbs / a2a_busbw_gbs, and so
//    for the combine. The dispatch time includes the counts all_to_all;
//  - a2av_*: the dispatch's own tpr_comm_all_to_allv (the layer's counts)
//    timed alone after a barrier, as the all_to_all baseline is: what the
//    exchange costs without waiting for the slowest rank to arrive;
//  - *_min_s: the same means, min over ranks, and dispatch_counts_s, the
//    counts all_to_all's share of dispatch_s (diagnostics);
//  - grouped_gemm_flops: 6 H Fr per row a rank's local experts run (2 H 2Fr
//    for w13, 2 Fr H for w2), averaged over ranks; grouped_gemm_gflops =
//    flops / grouped_gemm_s; sgemm_gflops = the same flops / sgemm_s, plain
//    cblas_sgemm at the same per-expert shapes; grouped_vs_sgemm = their
//    ratio;
//  - allreduce: no dispatch (every rank holds every token); the combine is
//    the all_reduce over ep of the (T, H) output: combine_bytes = T x H x 4,
//    combine_busbw_gbs = combine_gbs x 2(ep-1)/ep (nccl-tests' all_reduce).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "launch/bench_moe_impl.h"

tpr_status tpr__bm_reduce(bm *b) {
  const int n = b->w->size;
  tpr_comm_t c = b->w->host;
  for (int i = 0; i < b->n_sides; i++) {
    bm_side *s = &b->side[i];
    int64_t ns[2][BM_CATS];
    for (int k = 0; k < BM_CATS; k++) ns[0][k] = ns[1][k] = llround(s->sec[k] / (double)b->iters * 1e9);
    TPR_CHECK(tpr_comm_all_reduce(c, ns[0], ns[0], BM_CATS, TPR_I64, TPR_MAX));
    TPR_CHECK(tpr_comm_all_reduce(c, ns[1], ns[1], BM_CATS, TPR_I64, TPR_MIN));
    for (int k = 0; k < BM_CATS; k++) s->sec[k] = (double)ns[0][k] * 1e-9, s->sec_min[k] = (double)ns[1][k] * 1e-9;
    s->dispatch_rows = calloc((size_t)n, sizeof *s->dispatch_rows);
    s->gemm_rows_all = calloc((size_t)n, sizeof *s->gemm_rows_all);
    if (!s->dispatch_rows || !s->gemm_rows_all) return TPR_FAIL(TPR_ERR_OOM, "bench moe: rows");
    TPR_CHECK(tpr_comm_all_gather(c, &s->recv_rows, s->dispatch_rows, 1, TPR_I64));
    TPR_CHECK(tpr_comm_all_gather(c, &s->gemm_rows, s->gemm_rows_all, 1, TPR_I64));
    double d = 0, g = 0;
    for (int r = 0; r < n; r++) d += (double)s->dispatch_rows[r], g += (double)s->gemm_rows_all[r];
    s->mean_dispatch_rows = d / n, s->mean_gemm_rows = g / n;
  }
  tpr_moe_stats *st = &b->stats;
  TPR_CHECK(tpr_comm_all_reduce(c, st->expert_tokens, st->expert_tokens, (size_t)st->experts, TPR_I64, TPR_SUM));
  TPR_CHECK(tpr_comm_all_reduce(c, st->routed, st->routed, 3, TPR_I64, TPR_SUM));  // routed, dropped, rerouted
  return tpr_comm_all_reduce(c, &st->tokens, &st->tokens, 1, TPR_I64, TPR_SUM);
}

// Rates of one side; NAN where a figure does not apply.
typedef struct metrics {
  double disp_bytes, comb_bytes, disp_gbs, comb_gbs, disp_busbw, comb_busbw;
  double a2a_bytes, a2a_busbw, disp_vs, comb_vs, a2av_busbw, a2av_vs;
  double flops, gemm_gflops, sgemm_gflops, gemm_vs;
} metrics;

static double rate(double amount, double s) { return s > 0 && amount > 0 ? amount / s * 1e-9 : NAN; }

static metrics metrics_of(const bm *b, const bm_side *s) {
  const double ep = b->plan.ep, f = (ep - 1) / ep;
  metrics m = {.disp_bytes = NAN, .comb_bytes = NAN, .a2a_bytes = NAN};
  if (ep > 1 && s->dispatch == TPR_MOE_DISPATCH_ALLTOALL) {
    m.disp_bytes = m.comb_bytes = s->mean_dispatch_rows * (double)b->H * 4.0;
    m.a2a_bytes = (double)b->a2a_count * ep * 4.0;
  } else if (ep > 1) {
    m.disp_bytes = 0, m.comb_bytes = (double)b->T * (double)b->H * 4.0;
  }
  m.disp_gbs = rate(m.disp_bytes, s->sec[BM_DISPATCH]), m.comb_gbs = rate(m.comb_bytes, s->sec[BM_COMBINE]);
  m.disp_busbw = m.disp_gbs * f;
  m.comb_busbw = m.comb_gbs * (s->dispatch == TPR_MOE_DISPATCH_ALLTOALL ? f : 2 * f);
  m.a2a_busbw = rate(m.a2a_bytes, s->sec[BM_A2A]) * f;
  m.disp_vs = m.disp_busbw / m.a2a_busbw, m.comb_vs = m.comb_busbw / m.a2a_busbw;
  m.a2av_busbw = isfinite(m.a2a_bytes) ? rate(m.disp_bytes, s->sec[BM_A2AV]) * f : NAN;
  m.a2av_vs = m.a2av_busbw / m.a2a_busbw;
  m.flops = s->mean_gemm_rows * 6.0 * (double)b->H * (double)b->Fr;
  m.gemm_gflops = rate(m.flops, s->sec[BM_GEMM]), m.sgemm_gflops = rate(m.flops, s->sec[BM_SGEMM]);
  m.gemm_vs = m.gemm_gflops / m.sgemm_gflops;
  return m;
}

// ---- JSON ------------------------------------------------------------------------

static bool first_key;
static void key(const char *k) {
  printf("%s\"%s\":", first_key ? "" : ",", k);
  first_key = false;
}
static void num(const char *k, double v) {  // %.6g: ratios recompute from the printed rates
  key(k);
  isfinite(v) ? printf("%.6g", v) : printf("null");
}
static void exact(const char *k, double v) {  // byte and row counts
  key(k);
  isfinite(v) ? printf("%.15g", v) : printf("null");
}
static void rows(const char *k, const int64_t *v, int n, bool present) {
  key(k);
  if (!present) {
    printf("null");
    return;
  }
  for (int i = 0; i < n; i++) printf("%s%lld", i ? "," : "[", (long long)v[i]);
  printf("]");
}

static void json_side(const bm *b, const bm_side *s) {
  metrics m = metrics_of(b, s);
  first_key = true;
  printf("{");
  num("layer_s", s->sec[BM_LAYER]), num("router_s", s->sec[BM_ROUTER]), num("dispatch_s", s->sec[BM_DISPATCH]);
  num("combine_s", s->sec[BM_COMBINE]), num("permute_s", s->sec[BM_PERMUTE]);
  num("grouped_gemm_s", s->sec[BM_GEMM]), num("tp_etp_collectives_s", s->sec[BM_COLL]);
  num("other_s", s->sec[BM_OTHER]), num("dispatch_counts_s", s->sec[BM_COUNTS]);
  num("dispatch_min_s", s->sec_min[BM_DISPATCH]);
  num("combine_min_s", s->sec_min[BM_COMBINE]);
  rows("dispatch_rows_per_rank", s->dispatch_rows, b->w->size, s->dispatch == TPR_MOE_DISPATCH_ALLTOALL);
  rows("expert_rows_per_rank", s->gemm_rows_all, b->w->size, true);
  exact("dispatch_bytes", m.disp_bytes), exact("combine_bytes", m.comb_bytes);
  num("dispatch_gbs", m.disp_gbs), num("combine_gbs", m.comb_gbs);
  num("dispatch_busbw_gbs", m.disp_busbw), num("combine_busbw_gbs", m.comb_busbw);
  exact("a2a_bytes", m.a2a_bytes), num("a2a_s", isfinite(m.a2a_bytes) ? s->sec[BM_A2A] : NAN);
  num("a2a_min_s", isfinite(m.a2a_bytes) ? s->sec_min[BM_A2A] : NAN), num("a2a_busbw_gbs", m.a2a_busbw);
  num("dispatch_vs_a2a", m.disp_vs), num("combine_vs_a2a", m.comb_vs);
  num("a2av_s", isfinite(m.a2a_bytes) ? s->sec[BM_A2AV] : NAN), num("a2av_busbw_gbs", m.a2av_busbw);
  num("a2av_vs_a2a", m.a2av_vs);
  exact("grouped_gemm_flops", m.flops), num("grouped_gemm_gflops", m.gemm_gflops);
  num("sgemm_s", s->sec[BM_SGEMM]), num("sgemm_gflops", m.sgemm_gflops), num("grouped_vs_sgemm", m.gemm_vs);
  printf("}");
}

static void print_json(const bm *b) {
  const tpr_shard_plan *p = &b->plan;
  printf("{\"command\":\"bench moe\",\"family\":\"%s\",\"world_size\":%d,\"tp\":%d,\"dp\":%d,\"ep\":%d,\"etp\":%d,"
         "\"edp\":%d,\"tokens\":%lld,\"hidden\":%lld,\"experts\":%lld,\"top_k\":%lld,\"expert_inter\":%lld,"
         "\"experts_per_rank\":%lld,\"expert_inter_per_rank\":%lld,\"iters\":%lld,\"warmup\":%lld,"
         "\"capacity_factor\":%.6g,\"alltoall\":",
         tpr_model_family_name(p->config.family), b->w->size, p->tp, p->dp, p->ep, p->etp, p->edp, (long long)b->T,
         (long long)b->H, (long long)b->E, (long long)b->k, (long long)p->config.moe_intermediate_size,
         (long long)b->Er, (long long)b->Fr, (long long)b->iters, (long long)b->warmup, b->opts.capacity_factor);
  json_side(b, &b->side[0]);
  printf(",\"allreduce\":");
  if (b->n_sides > 1) {
    json_side(b, &b->side[1]);
    printf(",\"max_abs_diff\":%.6g", b->max_abs_diff);
  } else {
    printf("null,\"allreduce_note\":\"not applicable: the allreduce dispatcher needs dp = 1 (dp = %d)\"", p->dp);
  }
  printf(",\"moe_stats\":");
  fflush(stdout);
  tpr_moe_stats_json(&b->stats, stdout);
  printf("}\n");
}

// ---- table -----------------------------------------------------------------------

// "%*.*f" or "-" for a figure that does not apply.
static const char *fmt(char *buf, size_t cap, int width, int prec, double v) {
  if (isfinite(v)) snprintf(buf, cap, "%*.*f", width, prec, v);
  else snprintf(buf, cap, "%*s", width, "-");
  return buf;
}

static void table_row(const bm *b, const bm_side *s) {
  metrics m = metrics_of(b, s);
  char c[8][32], vs[48];
  bool a2a = s->dispatch == TPR_MOE_DISPATCH_ALLTOALL, ex = b->plan.ep > 1;  // ex: an exchange to time
  if (isfinite(m.disp_vs)) snprintf(vs, sizeof vs, "%.2f / %.2f", m.disp_vs, m.comb_vs);
  else snprintf(vs, sizeof vs, "-");
  printf("%-10s %9s %11s %7s %10s %7s %10s %17s %9s\n", a2a ? "alltoall" : "allreduce",
         fmt(c[0], 32, 9, 3, s->sec[BM_LAYER] * 1e3), fmt(c[1], 32, 11, 3, a2a && ex ? s->sec[BM_DISPATCH] * 1e3 : NAN),
         fmt(c[2], 32, 7, 2, m.disp_gbs), fmt(c[3], 32, 10, 3, ex ? s->sec[BM_COMBINE] * 1e3 : NAN),
         fmt(c[4], 32, 7, 2, m.comb_gbs), fmt(c[5], 32, 10, 2, m.gemm_gflops), vs, fmt(c[6], 32, 9, 2, m.gemm_vs));
}

static void print_table(const bm *b) {
  const tpr_shard_plan *p = &b->plan;
  const tpr_moe_stats *st = &b->stats;
  printf("tpr bench moe: %s layer, H %lld, %lld experts top-%lld, F %lld (per rank: %lld experts, F %lld)\n",
         tpr_model_family_name(p->config.family), (long long)b->H, (long long)b->E, (long long)b->k,
         (long long)p->config.moe_intermediate_size, (long long)b->Er, (long long)b->Fr);
  printf("  %d rank%s: tp %d dp %d | ep %d etp %d edp %d; %lld tokens per replica; %lld timed cycles after %lld "
         "warm-up; times: mean per cycle, max over ranks\n\n",
         b->w->size, b->w->size > 1 ? "s" : "", p->tp, p->dp, p->ep, p->etp, p->edp, (long long)b->T,
         (long long)b->iters, (long long)b->warmup);
  printf("%-10s %9s %11s %7s %10s %7s %10s %17s %9s\n", "dispatcher", "layer ms", "dispatch ms", "GB/s", "combine ms",
         "GB/s", "GEMM GF/s", "vs a2a busbw d/c", "vs sgemm");
  for (int i = 0; i < b->n_sides; i++) table_row(b, &b->side[i]);
  if (b->n_sides == 1) printf("%-10s not applicable: needs dp = 1 (dp = %d)\n", "allreduce", p->dp);
  printf("\n");
  for (int i = 0; i < b->n_sides; i++) {
    const bm_side *s = &b->side[i];
    metrics m = metrics_of(b, s);
    printf("  %-9s router %.3f, permute/unpermute %.3f, grouped GEMM %.3f, tp/etp collectives %.3f, other %.3f ms; "
           "sgemm at the same shapes %.2f GF/s\n",
           i ? "allreduce:" : "alltoall:", s->sec[BM_ROUTER] * 1e3, s->sec[BM_PERMUTE] * 1e3, s->sec[BM_GEMM] * 1e3,
           s->sec[BM_COLL] * 1e3, s->sec[BM_OTHER] * 1e3, m.sgemm_gflops);
    if (i == 0 && isfinite(m.a2a_busbw))
      printf("  %-9s tpr_comm_all_to_all over ep, %.0f B per rank: %.3f ms, busbw %.3f GB/s (exchange busbw: "
             "dispatch %.3f, combine %.3f)\n  %-9s the dispatch's all_to_allv alone (after a barrier): %.3f ms, busbw "
             "%.3f GB/s, %.2f of all_to_all's\n  %-9s in the layer: counts all_to_all %.3f ms of the dispatch; "
             "min over ranks: dispatch %.3f ms, combine %.3f ms (all_to_all alone %.3f ms)\n", "baseline:", m.a2a_bytes,
             s->sec[BM_A2A] * 1e3, m.a2a_busbw, m.disp_busbw, m.comb_busbw, "", s->sec[BM_A2AV] * 1e3, m.a2av_busbw,
             m.a2av_vs, "", s->sec[BM_COUNTS] * 1e3, s->sec_min[BM_DISPATCH] * 1e3, s->sec_min[BM_COMBINE] * 1e3,
             s->sec_min[BM_A2A] * 1e3);
  }
  printf("  routing:  %lld assignments of %lld tokens (all replicas) x top-%lld; tokens per ep rank",
         (long long)st->routed[0], (long long)st->tokens, (long long)b->k);
  for (int r = 0; r < st->ep; r++) printf(" %lld", (long long)tpr_moe_stats_rank_tokens(st, 0, r));
  printf("; imbalance expert %.2fx, rank %.2fx; dropped %lld, re-routed %lld\n",
         tpr_moe_stats_expert_imbalance(st, 0), tpr_moe_stats_rank_imbalance(st, 0), (long long)st->dropped[0],
         (long long)st->rerouted[0]);
  if (b->n_sides > 1) printf("  check:    the dispatchers' outputs differ by at most %.3g\n", b->max_abs_diff);
}

void tpr__bm_print(const bm *b, bool json) {
  if (json) print_json(b);
  else print_table(b);
  fflush(stdout);
}
