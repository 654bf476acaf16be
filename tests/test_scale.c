// tpr scale's model: the alpha-beta fit recovers known alpha and beta from
// noisy synthetic bench comm rows (and a wrong bus factor does not), two
// regimes split at the size where they change, and the
// step-time predictor reproduces step times computed by hand for two tiny
// meshes (docs/scale.md lists the calls counted).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "models/minimax_m2.h"
#include "runtime/ops.h"
#include "scale/alphabeta.h"
#include "scale/hardware.h"
#include "scale/results.h"
#include "scale/stepmodel.h"
#include "test_util.h"

// Rows as bench comm measures them: sizes 8 B .. 64 MiB by 4x at n = 2, 4, 8,
// each time multiplied by (1 + 0.3% noise).
static size_t synth(tpr_coll op, double alpha, double beta, tpr_comm_sample *s) {
  size_t n = 0;
  for (int ranks = 2; ranks <= 8; ranks *= 2)
    for (double size = 8; size <= 64.0 * 1048576; size *= 4) {
      double t = alpha * tpr_scale_latency_steps(ranks) + beta * size * tpr_scale_bus_factor(op, ranks);
      s[n++] = (tpr_comm_sample){.op = op, .ranks = ranks, .size = size, .time_s = t * (1 + 0.003 * tt_normal()),
                                 .transport = "mpi"};
    }
  return n;
}

static double wrong_factor(tpr_coll op, int n) {  // all_reduce's factor without the 2: reduce-scatter's
  return op == TPR_COLL_ALL_REDUCE ? (double)(n - 1) / n : tpr_scale_bus_factor(op, n);
}
static double no_n_factor(tpr_coll op, int n) { return 1; }  // the bus factor forgotten: algbw

static void test_fit_recovers(void **state) {
  tpr_comm_sample s[64];
  for (int op = 0; op < TPR_COLL_COUNT; op++) {
    double alpha = tt_uniform(2e-6, 50e-6), beta = 1 / tt_uniform(1e9, 50e9);
    size_t n = synth((tpr_coll)op, alpha, beta, s);
    tpr_ab ab;
    TT_OK(tpr_scale_fit_ab(s, n, (tpr_coll)op, "mpi", 0, NULL, &ab));
    double ea = fabs(ab.alpha / alpha - 1), eb = fabs(ab.beta / beta - 1);
    printf("  %-15s alpha %.3g s (err %.3f%%), bus bw %.3g GB/s (err %.3f%%), rms residual %.3f%%, %d rows\n",
           tpr_coll_name((tpr_coll)op), ab.alpha, 100 * ea, 1e-9 / ab.beta, 100 * eb, 100 * ab.rms_rel, ab.points);
    assert_true(ea < 0.01);
    assert_true(eb < 0.01);
    assert_int_equal(ab.points, (int)n);
  }
}

// Two regimes, as an MPI library switching algorithm at 1 MiB gives: below,
// alpha1 and beta1; from 1 MiB on, a larger alpha2 and a 3x slower beta2. The
// fit finds the split (2 MiB: the first row size past the change, the sizes
// going 512 KiB, 2 MiB), recovers both regimes within 1%, and predicts a
// 64 MiB call within 1%, where the small regime's line alone (the control) is
// off by far more.
static void test_fit_two_regimes(void **state) {
  tpr_comm_sample s[64];
  for (int op = 0; op < TPR_COLL_COUNT; op++) {
    double a1 = tt_uniform(2e-6, 20e-6), b1 = 1 / tt_uniform(5e9, 20e9), a2 = tt_uniform(50e-6, 200e-6), b2 = 3 * b1;
    size_t n = 0;
    for (int ranks = 2; ranks <= 8; ranks *= 2)
      for (double size = 8; size <= 64.0 * 1048576; size *= 4) {
        bool large = size >= 1048576;
        double t = (large ? a2 : a1) * tpr_scale_latency_steps(ranks) +
                   (large ? b2 : b1) * size * tpr_scale_bus_factor((tpr_coll)op, ranks);
        s[n++] = (tpr_comm_sample){.op = (tpr_coll)op, .ranks = ranks, .size = size,
                                   .time_s = t * (1 + 0.003 * tt_normal()), .transport = "mpi"};
      }
    tpr_ab ab;
    TT_OK(tpr_scale_fit_ab(s, n, (tpr_coll)op, "mpi", 0, NULL, &ab));
    double e1 = fmax(fabs(ab.alpha / a1 - 1), fabs(ab.beta / b1 - 1));
    // The large regime's alpha is a small part of its calls' time (2 MiB and up), so it is known less
    // well than its beta: 5% for alpha, 1% for beta.
    double ea2 = fabs(ab.alpha_large / a2 - 1), e2 = fabs(ab.beta_large / b2 - 1);
    double big = 64.0 * 1048576, want = a2 * 3 + b2 * big * tpr_scale_bus_factor((tpr_coll)op, 8);
    tpr_ab line = {.alpha = ab.alpha, .beta = ab.beta, .points = ab.points};  // the small regime's line alone
    double err_two = fabs(tpr_ab_time(&ab, (tpr_coll)op, 8, big) / want - 1);
    double err_line = fabs(tpr_ab_time(&line, (tpr_coll)op, 8, big) / want - 1);
    printf("  %-15s split %.0f KiB, small regime err %.3f%%, large alpha %.3f%% beta %.3f%%; 64 MiB at 8 ranks: "
           "%.3f%% (one line %.0f%%), rms %.2f%%\n", tpr_coll_name((tpr_coll)op), ab.split / 1024, 100 * e1, 100 * ea2,
           100 * e2, 100 * err_two,
           100 * err_line, 100 * ab.rms_rel);
    assert_true(ab.split == 2 * 1048576.0);
    assert_true(e1 < 0.01 && ea2 < 0.05 && e2 < 0.01 && err_two < 0.01);
    assert_true(err_line > 0.5);
  }
  // One regime stays one: the synthetic rows of test_fit_recovers give no split.
  tpr_ab ab;
  size_t n = synth(TPR_COLL_ALL_GATHER, 5e-6, 1e-10, s);
  TT_OK(tpr_scale_fit_ab(s, n, TPR_COLL_ALL_GATHER, "mpi", 0, NULL, &ab));
  assert_true(ab.split == 0);
}

// bench comm's rows of count 0 (a gather's 8- and 32-byte sizes round to no
// element per rank) return in ~0.05 us having moved nothing. The fit leaves
// them out; weighted by 1/time^2 they would outweigh every real row, and the
// control (the same rows given a size of 1 byte, so the fit takes them) shows
// alpha collapsing.
static void test_fit_skips_empty_rows(void **state) {
  tpr_comm_sample s[80];
  double alpha = tt_uniform(2e-6, 50e-6), beta = 1 / tt_uniform(1e9, 50e9);
  size_t n = synth(TPR_COLL_ALL_GATHER, alpha, beta, s), real = n;
  for (int ranks = 2; ranks <= 8; ranks *= 2)
    for (int k = 0; k < 2; k++)
      s[n++] = (tpr_comm_sample){.op = TPR_COLL_ALL_GATHER, .ranks = ranks, .size = 0,
                                 .time_s = tt_uniform(0.04e-6, 0.1e-6), .transport = "mpi"};
  tpr_ab ab, control;
  TT_OK(tpr_scale_fit_ab(s, n, TPR_COLL_ALL_GATHER, "mpi", 0, NULL, &ab));
  for (size_t i = real; i < n; i++) s[i].size = 1;
  TT_OK(tpr_scale_fit_ab(s, n, TPR_COLL_ALL_GATHER, "mpi", 0, NULL, &control));
  double ea = fabs(ab.alpha / alpha - 1), ec = fabs(control.alpha / alpha - 1);
  printf("  alpha with 6 empty rows: err %.3f%% (%d rows used); control (taken as 1-byte rows): err %.1f%%\n",
         100 * ea, ab.points, 100 * ec);
  assert_int_equal(ab.points, (int)real);
  assert_true(ea < 0.01 && fabs(ab.beta / beta - 1) < 0.01);
  assert_true(ec > 0.5);
}

// Rows whose latency jumps at 8 ranks (ranks outnumbering cores): the fit at
// ranks = 8 alone recovers that alpha; the pooled fit cannot.
static void test_fit_by_ranks(void **state) {
  tpr_comm_sample s[64];
  double alpha = tt_uniform(2e-6, 50e-6), beta = 1 / tt_uniform(1e9, 50e9);
  size_t n = synth(TPR_COLL_ALL_GATHER, alpha, beta, s);
  for (size_t i = 0; i < n; i++)
    if (s[i].ranks == 8) s[i].time_s += 9 * alpha * tpr_scale_latency_steps(8);  // alpha x 10 at n = 8
  tpr_ab at8, pooled;
  TT_OK(tpr_scale_fit_ab(s, n, TPR_COLL_ALL_GATHER, "mpi", 8, NULL, &at8));
  TT_OK(tpr_scale_fit_ab(s, n, TPR_COLL_ALL_GATHER, "mpi", 0, NULL, &pooled));
  double e8 = fabs(at8.alpha / (10 * alpha) - 1), ep = fabs(pooled.alpha / (10 * alpha) - 1);
  printf("  alpha at 8 ranks: fit at 8 err %.3f%% (%d rows), pooled err %.1f%%\n", 100 * e8, at8.points, 100 * ep);
  assert_true(e8 < 0.01 && fabs(at8.beta / beta - 1) < 0.01);
  assert_int_equal(at8.points, (int)n / 3);
  assert_true(ep > 0.1);
}

// Negative control: all_reduce rows fitted with a wrong bus factor must not
// recover beta within 1% (it is what makes the fit specific to the op).
static void test_fit_wrong_factor(void **state) {
  tpr_comm_sample s[64];
  double alpha = tt_uniform(2e-6, 50e-6), beta = 1 / tt_uniform(1e9, 50e9);
  size_t n = synth(TPR_COLL_ALL_REDUCE, alpha, beta, s);
  tpr_bus_factor_fn wrong[] = {wrong_factor, no_n_factor};
  for (int i = 0; i < 2; i++) {
    tpr_ab ab;
    TT_OK(tpr_scale_fit_ab(s, n, TPR_COLL_ALL_REDUCE, "mpi", 0, wrong[i], &ab));
    double eb = fabs(ab.beta / beta - 1);
    printf("  wrong factor %d: beta err %.1f%%, rms residual %.2f%%\n", i, 100 * eb, 100 * ab.rms_rel);
    assert_true(eb > 0.05);
  }
  // One size at one rank count cannot separate alpha from beta; another transport has no rows.
  tpr_ab ab;
  for (size_t i = 0; i < n; i++) s[i].size = 1024, s[i].ranks = 4;
  assert_int_equal(tpr_scale_fit_ab(s, n, TPR_COLL_ALL_REDUCE, "mpi", 0, NULL, &ab), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_scale_fit_ab(s, n, TPR_COLL_ALL_REDUCE, "nccl", 0, NULL, &ab), TPR_ERR_INVALID_ARG);
}

// Round numbers: every collective alpha 10 us per round, 1 ns per bus byte;
// 1 GFLOP/s and 1 GB/s; f32 everywhere.
static const tpr_scale_config tiny = {.hidden = 4, .layers = 1, .heads = 2, .kv_heads = 1, .head_dim = 2,
                                      .expert_ffn = 4, .experts = 2, .top_k = 1, .vocab = 8};
static tpr_scale_hw round_hw(void) {
  tpr_scale_hw hw = {.name = "round", .gemm_flops = 1e9, .mem_bw = 1e9, .ranks_per_node = 8, .param_bytes = 4,
                     .act_bytes = 4};
  for (int k = 0; k < TPR_COLL_COUNT; k++) hw.intra[k] = hw.inter[k] = (tpr_ab){.alpha = 1e-5, .beta = 1e-9, .points = 1};
  return hw;
}

static void test_predict_by_hand(void **state) {
  tpr_scale_hw hw = round_hw();
  tpr_scale_pred p;
  // Mesh A: decode, world 2 = tp 2 (etp 2, ep 1: the all-reduce dispatcher), one token, context 3.
  // Calls (n = 2: one round; all_reduce 1 bus byte per byte, all_gather 1/2):
  //   all_reduce: embedding 16 B, qk-norm 2 x 4 B, o_proj 16 B, expert output over etp 16 B -> 5 rounds, 56 B
  //   all_gather: logits 8 x 1 x 4 = 32 B -> 1 round, 16 bus bytes
  //   comm = 6 x 10 us + 72 ns
  // Compute: the rank's query head and the one KV head (replicated: kv_heads 1 < tp 2).
  //   FLOPs 88 (attention: 2x4x2x(1+2) projections, 2x2x4 o_proj, 4x2x3 scores) + 16 (router)
  //   + 96/2 (expert) + 64/2 (head) = 184;
  //   bytes (dense 32 + 8 + 8 = 48, head slice 16, the token's embedding row slice 2, the expert
  //   hit with probability 1 - (1 - 1/2)^1 = 1/2 of 48 = 24) x 4 = 360 -> 360 ns.
  tpr_scale_mesh a = {.world = 2, .tp = 2};
  TT_OK(tpr_scale_mesh_resolve(&a));
  assert_int_equal(a.etp, 2);
  tpr_scale_work wa = {.kind = TPR_WL_DECODE, .tokens = 1, .context = 3, .samples = 1};
  TT_OK(tpr_scale_predict(&tiny, &a, &wa, &hw, &p));
  double want_a = 360e-9 + 6e-5 + 72e-9;
  printf("  mesh A (decode tp2): %.6g s (hand %.6g), flops %.0f, bytes %.0f\n", p.step_s, want_a, p.flops, p.bytes);
  assert_true(fabs(p.flops - 184) < 1e-9 && fabs(p.bytes - 360) < 1e-9);
  assert_true(fabs(p.step_s / want_a - 1) < 1e-12);
  // Mesh B: train, world 2 = dp 2 = ep 2 (etp 1, edp 1), FSDP, 2 tokens, context 1.
  //   all_to_all: counts 8 B x 1, tokens 32 B x 4 (dispatch, combine, both backward) -> 5 rounds, 68 bus bytes
  //   all_reduce over the world: 12 B + 16 B -> 2 rounds, 28 B
  //   FSDP over dp 2, one call per trained tensor, each gathered twice (the head, used last in
  //     forward, once) and scattered once; bus bytes are half of each size:
  //     the layer's 9 tensors, 64 params (256 B, 256/9 each): 18 gathers + 9 scatters of 256/9 B
  //     embedding and head, 32 params (128 B) each: 3 gathers + 2 scatters of 128 B
  //     the final norm, 4 params (16 B): 2 gathers + 1 scatter of 16 B
  //     -> 35 rounds, (768 + 640 + 48) / 2 = 728 bus bytes (the experts: edp 1, nothing)
  //   comm = 42 x 10 us + (68 + 28 + 728) ns
  // Compute: forward 224 + 32 + 192 + 128 = 576 FLOPs, x3 = 1728; bytes 3 x 176 x 4 + 7 x 4 x 88 = 4576 -> 4576 ns.
  tpr_scale_mesh b = {.world = 2, .dp = 2, .ep = 2, .fsdp = true};
  TT_OK(tpr_scale_mesh_resolve(&b));
  assert_int_equal(b.tp, 1);
  assert_int_equal(b.etp, 1);
  tpr_scale_work wb = {.kind = TPR_WL_TRAIN, .tokens = 2, .context = 1, .samples = 2};
  TT_OK(tpr_scale_predict(&tiny, &b, &wb, &hw, &p));
  double want_b = 4576e-9 + 4.2e-4 + (96 + 728) * 1e-9;
  printf("  mesh B (train dp2 ep2 fsdp): %.6g s (hand %.6g), flops %.0f, bytes %.0f, %.0f all_to_all calls\n",
         p.step_s, want_b, p.flops, p.bytes, p.coll_calls[TPR_COLL_ALL_TO_ALL]);
  assert_true(fabs(p.flops - 1728) < 1e-9 && fabs(p.bytes - 4576) < 1e-9);
  assert_true(fabs(p.step_s / want_b - 1) < 1e-12);
  assert_true(fabs(p.tokens_per_s - 4 / want_b) < 1e-6 * p.tokens_per_s);
  // The node's rates: 2 cores, both ranks of mesh A running. Their shared
  // read bandwidth 1.5 GB/s gives each 0.75 (below the solo 1): bytes take
  // 360 / 0.75 ns = 480 ns; the busy GEMM rate 0.5 GFLOP/s at a = cores
  // gives 184 / 0.5 = 368 ns, still under the memory time.
  tpr_scale_hw busy = hw;
  busy.cores = 2, busy.mem_bw_node = 1.5e9, busy.gemm_flops_busy = 0.5e9;
  TT_OK(tpr_scale_predict(&tiny, &a, &wa, &busy, &p));
  printf("  mesh A, 2 ranks sharing 1.5 GB/s: compute %.6g s (hand 480e-9)\n", p.compute_s);
  assert_true(fabs(p.compute_s / 480e-9 - 1) < 1e-12);
  busy.gemm_flops_busy = 0.25e9;  // now the GEMMs bound it: 184 / 0.25 = 736 ns
  TT_OK(tpr_scale_predict(&tiny, &a, &wa, &busy, &p));
  assert_true(fabs(p.compute_s / 736e-9 - 1) < 1e-12);
  // One rank alone (world 1) streams at the solo rate whatever the node's.
  tpr_scale_mesh one = {.world = 1};
  TT_OK(tpr_scale_mesh_resolve(&one));
  tpr_scale_pred alone, shared;
  TT_OK(tpr_scale_predict(&tiny, &one, &wa, &hw, &alone));
  TT_OK(tpr_scale_predict(&tiny, &one, &wa, &busy, &shared));
  assert_true(alone.compute_s == shared.compute_s);
  // The synchronisation cost (--calibrate-on tp): a call pays t_sync at its
  // group's size, not the world's. World 4 = tp 2 x dp 2 (etp 4, the
  // all-to-all dispatcher) issues calls over groups of 2 (tp) and 4 (etp,
  // the world); with t_sync 1 ms at 2 and 3 ms at 4 the sync share is the
  // sum over the call list of count x t_sync[group].
  tpr_scale_mesh c4 = {.world = 4, .tp = 2, .dp = 2};
  TT_OK(tpr_scale_mesh_resolve(&c4));
  tpr_scale_work wc = {.kind = TPR_WL_DECODE, .tokens = 2, .context = 3, .samples = 2};
  tpr_scale_call calls[TPR_SCALE_MAX_CALLS];
  int nc = tpr_scale_step_calls(&tiny, &c4, &wc, &hw, calls);
  double by_group = 0, by_world = 0, in2 = 0, in4 = 0;
  for (int i = 0; i < nc; i++) {
    by_group += calls[i].count * (calls[i].group == 2 ? 1e-3 : calls[i].group == 4 ? 3e-3 : 0);
    by_world += calls[i].count * 3e-3;
    if (calls[i].group == 2) in2 += calls[i].count;
    if (calls[i].group == 4) in4 += calls[i].count;
  }
  tpr_scale_hw sync = hw;
  sync.t_sync[TPR_WL_DECODE][2] = 1e-3, sync.t_sync[TPR_WL_DECODE][4] = 3e-3;
  sync.t_sync[TPR_WL_TRAIN][2] = sync.t_sync[TPR_WL_TRAIN][4] = 1;  // another workload's: not charged here
  TT_OK(tpr_scale_predict(&tiny, &c4, &wc, &sync, &p));
  printf("  world 4 (tp 2 x dp 2): %.0f calls over 2 ranks, %.0f over 4: sync %.6g s (by group %.6g, by world %.6g)\n",
         in2, in4, p.sync_s, by_group, by_world);
  assert_true(in2 > 0 && in4 > 0);
  assert_true(fabs(p.sync_s / by_group - 1) < 1e-12);
  assert_true(fabs(p.sync_s / by_world - 1) > 0.1);  // the world's t_sync for every call would differ
  // model.json keeps t_sync per workload: read back, decode pays decode's,
  // training its own (1 s a call: the control that the two stay apart).
  char path[] = "/tmp/tpr_test_scale_hw_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  TT_OK(tpr_scale_hw_write(path, &sync));
  tpr_scale_hw back;
  TT_OK(tpr_scale_hw_read(path, &back));
  unlink(path);
  for (int w = 0; w < 3; w++)
    for (int g = 2; g < TPR_SCALE_FIT_RANKS; g++) assert_true(back.t_sync[w][g] == sync.t_sync[w][g]);
  tpr_scale_pred q;
  TT_OK(tpr_scale_predict(&tiny, &c4, &wc, &back, &q));
  assert_true(fabs(q.sync_s / by_group - 1) < 1e-12);
  tpr_scale_work wt = wc;
  wt.kind = TPR_WL_TRAIN;
  TT_OK(tpr_scale_predict(&tiny, &c4, &wt, &back, &q));
  assert_true(q.sync_s > 1);
  // Negative control: all_reduce with a wrong bus factor changes mesh A by more than the tolerance.
  hw.intra[TPR_COLL_ALL_REDUCE].beta *= 2;
  TT_OK(tpr_scale_predict(&tiny, &a, &wa, &hw, &p));
  printf("  mesh A with all_reduce's bus bytes doubled: %.9g s vs %.9g\n", p.step_s, want_a);
  assert_true(fabs(p.step_s / want_a - 1) > 1e-4);
}

static void test_bad_inputs(void **state) {
  tpr_scale_mesh m = {.world = 6, .tp = 4};
  assert_int_equal(tpr_scale_mesh_resolve(&m), TPR_ERR_INVALID_ARG);
  m = (tpr_scale_mesh){.world = 4, .tp = 2, .ep = 3};
  assert_int_equal(tpr_scale_mesh_resolve(&m), TPR_ERR_INVALID_ARG);
  tpr_scale_hw hw = round_hw();
  hw.intra[TPR_COLL_ALL_GATHER].points = 0;  // no fit: refused, not a zero-cost collective
  m = (tpr_scale_mesh){.world = 2, .tp = 2};
  TT_OK(tpr_scale_mesh_resolve(&m));
  tpr_scale_work w = {.kind = TPR_WL_DECODE, .tokens = 1, .context = 1, .samples = 1};
  tpr_scale_pred p;
  assert_int_equal(tpr_scale_predict(&tiny, &m, &w, &hw, &p), TPR_ERR_INVALID_ARG);
  hw = round_hw();
  m.dp = 2;  // world 2 = tp 2 x dp 2 is no mesh
  assert_int_equal(tpr_scale_predict(&tiny, &m, &w, &hw, &p), TPR_ERR_INVALID_ARG);
}

// A results.jsonl line as tpr scale run writes it (docs/scale.md).
static const char good_line[] =
    "{\"schema\":\"tpr.scale.v1\",\"workload\":\"train\",\"config\":\"c.json\",\"mode\":\"weak\",\"np\":4,\"tp\":2,"
    "\"dp\":2,\"ep\":2,\"etp\":2,\"tokens_per_step\":32,\"context\":16,\"samples\":32,\"repeats\":3,"
    "\"step_s\":{\"median\":0.004,\"q1\":0.0038,\"q3\":0.0045},\"tokens_per_s\":{\"median\":16000,\"q1\":15000,"
    "\"q3\":17000},\"phases_s\":{\"compute\":0.003},\"bytes_per_step\":{\"all_reduce\":1024},"
    "\"collective_s\":{\"all_reduce\":0.0004,\"all_to_all\":0.0002},"
    "\"peak_rss_bytes\":2e7,\"machine\":{\"cores\":2,\"sgemm_gflops\":80,\"read_gbs\":15,\"mpi\":\"Open MPI\"},"
    "\"command\":\"tpr train\"}";

// Each edit breaks one rule of the schema; each must be refused.
static const struct {
  const char *from, *to, *why;
} breaks[] = {
    {"\"schema\":\"tpr.scale.v1\"", "\"schema\":\"tpr.scale.v0\"", "schema version"},
    {"\"step_s\":", "\"steps\":", "step_s missing"},
    {"\"np\":4", "\"np\":\"4\"", "np a string"},
    {"\"tp\":2", "\"tp\":3", "np != dp*tp"},
    {"\"ep\":2,\"etp\":2", "\"ep\":3,\"etp\":1", "ep*etp not dividing np"},
    {"\"q1\":0.0038", "\"q1\":0.0041", "q1 > median"},
    {"\"workload\":\"train\"", "\"workload\":\"serve\"", "unknown workload"},
    {"\"mode\":\"weak\"", "\"mode\":\"both\"", "unknown mode"},
    {"\"cores\":2", "\"cores\":0", "machine.cores 0"},
    {"\"mpi\":\"Open MPI\"", "\"mpi\":7", "machine.mpi a number"},
    {"\"all_to_all\":0.0002", "\"sendrecv\":0.0002", "collective_s: no kind"},
    {"\"all_to_all\":0.0002", "\"all_to_all\":-0.0002", "collective_s negative"},
};

static void test_results_schema(void **state) {
  cJSON *j = cJSON_Parse(good_line);
  assert_non_null(j);
  TT_OK(tpr_scale_result_validate(j));
  tpr_scale_point p;
  TT_OK(tpr_scale_point_from_json(j, &p));
  assert_int_equal(p.mesh.world, 4);
  assert_true(p.mesh.fsdp);
  assert_true(p.step_s == 0.004);
  assert_true(p.has_coll && p.coll_s[TPR_COLL_ALL_REDUCE] == 0.0004 && p.coll_s[TPR_COLL_ALL_TO_ALL] == 0.0002);
  assert_true(p.coll_s[TPR_COLL_ALL_GATHER] == 0);
  cJSON_Delete(j);
  for (size_t i = 0; i < sizeof breaks / sizeof breaks[0]; i++) {
    char line[sizeof good_line + 64];
    const char *at = strstr(good_line, breaks[i].from);
    assert_non_null(at);
    snprintf(line, sizeof line, "%.*s%s%s", (int)(at - good_line), good_line, breaks[i].to,
             at + strlen(breaks[i].from));
    j = cJSON_Parse(line);
    assert_non_null(j);
    tpr_status st = tpr_scale_result_validate(j);
    printf("  %-26s -> %s\n", breaks[i].why, tpr_status_name(st));
    assert_int_equal(st, TPR_ERR_FORMAT);
    cJSON_Delete(j);
  }
}

static void test_quartiles(void **state) {
  double x[] = {5, 1, 4, 2, 3};
  double q1, m, q3;
  tpr_scale_quartiles(x, 5, &q1, &m, &q3);
  printf("  quartiles of 1..5: %g %g %g\n", q1, m, q3);
  assert_true(q1 == 2 && m == 3 && q3 == 4);
  double y[] = {4, 1, 3, 2};
  tpr_scale_quartiles(y, 4, &q1, &m, &q3);
  assert_true(q1 == 1.75 && m == 2.5 && q3 == 3.25);  // numpy.percentile's linear interpolation
}

// Collectives per kind in a program tpr_m2_build emits (all_to_allv counted
// as all_to_all), and the model's inventory for the same mesh.
static void program_counts(const tpr_model_config *mc, int tp, int ep, int etp, int dp, bool training, int skip,
                           bool fsdp, int got[TPR_COLL_COUNT], int *gathers) {
  tpr_shard_plan pl;
  TT_OK(tpr_shard_plan_build(mc, tp, ep, etp, dp, TPR_F32, &pl));
  tpr_m2_build_opts bo = {.tokens = 32, .training = training, .aux_coef = 0.01, .skip_grad_marks = skip,
                          .fsdp = {.on = fsdp, .param_dtype = TPR_F32, .prefetch = true, .reshard = true}};
  if (!training) bo.step = (tpr_step_shape){.tokens = 32, .samples = 1, .batch = 1, .max_blocks = 4, .pool_blocks = 8,
                                            .block_size = 16};
  tpr_program *p;
  TT_OK(tpr_m2_build(&pl, &bo, &p));
  memset(got, 0, TPR_COLL_COUNT * sizeof *got);
  *gathers = 0;
  for (int n = 0; n < tpr_program_num_nodes(p); n++) {
    tpr_op_kind k = tpr_program_node_op(p, n);
    got[TPR_COLL_ALL_REDUCE] += k == TPR_OP_ALL_REDUCE;
    got[TPR_COLL_ALL_GATHER] += k == TPR_OP_ALL_GATHER;
    got[TPR_COLL_REDUCE_SCATTER] += k == TPR_OP_REDUCE_SCATTER;
    got[TPR_COLL_ALL_TO_ALL] += k == TPR_OP_ALL_TO_ALL || k == TPR_OP_ALL_TO_ALLV;
    *gathers += k == TPR_OP_PARAM_GATHER;
  }
  tpr_program_free(p);
  tpr_shard_plan_free(&pl);
}

static void model_counts(const tpr_scale_config *c, int tp, int ep, int etp, int dp, bool training,
                         double want[TPR_COLL_COUNT]) {
  tpr_scale_mesh m = {.world = tp * dp, .tp = tp, .dp = dp, .ep = ep, .etp = etp};
  TT_OK(tpr_scale_mesh_resolve(&m));
  tpr_scale_work w = {.kind = training ? TPR_WL_TRAIN : TPR_WL_DECODE, .tokens = 32, .context = 16, .samples = 1};
  tpr_scale_hw hw = round_hw();
  tpr_scale_call calls[TPR_SCALE_MAX_CALLS];
  int n = tpr_scale_program_calls(c, &m, &w, &hw, calls);
  memset(want, 0, TPR_COLL_COUNT * sizeof *want);
  for (int i = 0; i < n; i++) want[calls[i].op] += calls[i].count;
}

// The model's call list against the collectives in tpr's own programs
// (training: forward and backward) on the tiny config, for both MoE
// dispatchers and every axis; FSDP's param gathers and gradient scatters.
static void test_program_counts(void **state) {
  char dir[4096], path[4200];
  tt_configs_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/minimax_m2_tiny.json", dir);
  tpr_model_config mc;
  tpr_scale_config sc;
  TT_OK(tpr_model_config_load(path, &mc));
  TT_OK(tpr_scale_config_read(path, &sc));
  // tp > 1 throughout: at tp 1 the program keeps its tp all-reduces as
  // one-rank identities (nothing moves), which the model leaves out.
  static const int meshes[][4] = {{2, 1, 2, 1}, {4, 1, 4, 1}, {2, 2, 1, 1}, {4, 2, 2, 1}, {2, 2, 1, 2}, {4, 2, 1, 2},
                                  {8, 4, 2, 1}, {2, 1, 1, 2}};  // tp, ep, etp, dp
  int got[TPR_COLL_COUNT], gathers;
  double want[TPR_COLL_COUNT];
  for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++)
    for (int training = 0; training < 2; training++) {
      const int *k = meshes[i];
      program_counts(&mc, k[0], k[1], k[2], k[3], training, 0, false, got, &gathers);
      model_counts(&sc, k[0], k[1], k[2], k[3], training, want);
      printf("  tp %d ep %d etp %d dp %d %-6s program AR %2d AG %d RS %d A2A %d | model %2.0f %.0f %.0f %.0f\n", k[0],
             k[1], k[2], k[3], training ? "train" : "decode", got[0], got[1], got[2], got[3], want[0], want[1], want[2],
             want[3]);
      for (int c = 0; c < TPR_COLL_COUNT; c++) assert_int_equal(got[c], (int)want[c]);
    }
  // Negative control: without the QK-norm marks the program has 4 all-reduces
  // per layer fewer, and the comparison sees it.
  program_counts(&mc, 2, 1, 2, 1, true, TPR_M2_MARKS_QK_NORM, false, got, &gathers);
  model_counts(&sc, 2, 1, 2, 1, true, want);
  printf("  without QK-norm marks: program %d all-reduces, model %.0f\n", got[0], want[0]);
  assert_int_equal((int)want[0] - got[0], 4 * (int)sc.layers);
  // FSDP (dp 2): one gradient reduce-scatter per trained tensor, as counted;
  // one gather per tensor for forward and one more for backward, less the
  // tensor used last in forward (not resharded before its backward).
  tpr_scale_mesh m = {.world = 4, .tp = 2, .dp = 2, .ep = 2, .etp = 1, .fsdp = true};
  TT_OK(tpr_scale_mesh_resolve(&m));
  tpr_scale_work w = {.kind = TPR_WL_TRAIN, .tokens = 32, .context = 16, .samples = 32};
  tpr_scale_hw hw = round_hw();
  tpr_scale_call calls[TPR_SCALE_MAX_CALLS];
  int n = tpr_scale_step_calls(&sc, &m, &w, &hw, calls), n_prog = tpr_scale_program_calls(&sc, &m, &w, &hw, calls + n);
  double ag = 0, rs = 0;
  for (int i = 0; i < n; i++) {
    ag += calls[i].op == TPR_COLL_ALL_GATHER ? calls[i].count : 0;
    rs += calls[i].op == TPR_COLL_REDUCE_SCATTER ? calls[i].count : 0;
  }
  for (int i = n; i < n + n_prog; i++) {  // the program's own, leaving the FSDP ones
    ag -= calls[i].op == TPR_COLL_ALL_GATHER ? calls[i].count : 0;
    rs -= calls[i].op == TPR_COLL_REDUCE_SCATTER ? calls[i].count : 0;
  }
  program_counts(&mc, 2, 2, 1, 2, true, 0, true, got, &gathers);
  int rs_fsdp = got[TPR_COLL_REDUCE_SCATTER];  // the etp = 1 program has no other reduce-scatter
  printf("  FSDP dp 2: program %d param gathers, %d gradient reduce-scatters; model %.0f, %.0f\n", gathers, rs_fsdp, ag, rs);
  assert_int_equal(rs_fsdp, (int)rs);
  assert_int_equal(gathers, (int)ag);
}

int main(void) {
  printf("seed %llu\n", (unsigned long long)tt_seed_from_env());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fit_recovers),
      cmocka_unit_test(test_fit_wrong_factor),
      cmocka_unit_test(test_fit_by_ranks),
      cmocka_unit_test(test_fit_skips_empty_rows),
      cmocka_unit_test(test_fit_two_regimes),
      cmocka_unit_test(test_predict_by_hand),
      cmocka_unit_test(test_bad_inputs),
      cmocka_unit_test(test_results_schema),
      cmocka_unit_test(test_quartiles),
      cmocka_unit_test(test_program_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
