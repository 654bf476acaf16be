// The training losses (runtime/program/loss.h): vocab-parallel cross-entropy and the
// MoE auxiliary load-balancing loss. Values against double-precision
// references written here (log-softmax over the real vocabulary;
// transformers' load_balancing_loss_func), a 2-shard vocab-parallel run
// simulated in one program, every backward rule against central finite
// differences, the padded-vocab mask, and run-time target checks. Fresh
// random inputs each run (seed printed).
#include "grad_check.h"
#include "ops_util.h"
#include "runtime/program/loss.h"
#include "runtime/ops/rule_checks.h"
#include "runtime/program/program_impl.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// f32 gradients through exp/log with h = 1e-2 (observed ~1e-8 .. 1e-6; the
// controls below give >= 1e-1).
#define NMSE_BOUND 1e-5
#define VALUE_REL 1e-6

static void check_case(tt_grad_case *c) { tt_grad_expect(c, NMSE_BOUND); }

// A negative control: the same case with the analytic gradient scaled must fail.
static void check_control(tt_grad_case *c, double corrupt) {
  tt_grad_case bad = *c;
  bad.corrupt = corrupt;
  double nmse = tt_grad_check(&bad);
  printf("  control %s (gradient x%.2f): NMSE %.3e (must exceed 1e-2)\n", c->name, corrupt, nmse);
  assert_true(nmse > 1e-2);
}

static void free_inputs(tt_grad_case *c) { tt_grad_free_inputs(c); }

static tpr_tensor *scalar_i32(int32_t v) { return tt_from_host(TPR_I32, 1, (const int64_t[]){1}, &v); }

// logits (T, C) with N(0, scale^2) real columns and padding (c >= V) set to
// `pad`, large enough to win any max or dominate any sum it leaked into.
static float *make_logits(int64_t T, int64_t C, int64_t V, double scale, float pad) {
  float *h = malloc((size_t)(T * C) * sizeof *h);
  tt_fill_normal(h, (size_t)(T * C), scale);
  for (int64_t t = 0; t < T; t++)
    for (int64_t c = V; c < C; c++) h[t * C + c] = pad;
  return h;
}

// Targets in [0, V) with positions `ignored` (a list ending in -1) = -100.
static int32_t *make_targets(int64_t T, int64_t V, const int *ignored) {
  int32_t *y = malloc((size_t)T * sizeof *y);
  for (int64_t t = 0; t < T; t++) y[t] = (int32_t)tt_randint(0, V - 1);
  for (int i = 0; ignored && ignored[i] >= 0; i++) y[ignored[i]] = -100;
  return y;
}

// The reference: mean over t with y_t != -100 of logsumexp(l[t, :V]) - l[t, y_t].
static double ref_xent(const float *l, int64_t T, int64_t C, int64_t V, const int32_t *y) {
  double acc = 0;
  int64_t n = 0;
  for (int64_t t = 0; t < T; t++) {
    if (y[t] == -100) continue;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < V; c++) m = fmax(m, l[t * C + c]);
    for (int64_t c = 0; c < V; c++) s += exp(l[t * C + c] - m);
    acc += log(s) + m - l[t * C + y[t]];
    n++;
  }
  return n ? acc / (double)n : 0;
}

// Runs p (inputs named by names[]) once and returns output "loss".
static double run_loss(tpr_program *p, int n, const char *const *names, tpr_tensor *const *ts) {
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  for (int i = 0; i < n; i++) TT_OK(tpr_exec_bind(e, names[i], ts[i]));
  TT_OK(tpr_exec_run(e));
  const tpr_tensor *out;
  TT_OK(tpr_exec_output(e, "loss", &out));
  double v = ((const float *)tpr_tensor_data(out))[0];
  tpr_exec_free(e);
  return v;
}

// ---- The 2-shard simulation in one program. The all-reduce max of two (T, 1)
// values is a tiny graph: stack them into (T, 2) as m0 * [1 0] + m1 * [0 1]
// (exact: x*1 + (-0) is x, and -FLT_MAX*0 is -0) and take xent_max of that
// with shard 0 and V = 2. The sums are adds.
static int64_t g_V, g_Vl;

static tpr_status max_of_two(tpr_program *p, tpr_value_id m0, tpr_value_id m1, tpr_value_id eye, tpr_value_id zero,
                             tpr_value_id *out) {
  tpr_value_id e0, e1, a, b, st;
  TPR_CHECK(tpr_pb_slice(p, eye, 0, 0, 1, &e0));  // (1, 2) [1 0]
  TPR_CHECK(tpr_pb_slice(p, eye, 0, 1, 1, &e1));  // (1, 2) [0 1]
  TPR_CHECK(tpr_pb_mul(p, m0, e0, &a));
  TPR_CHECK(tpr_pb_mul(p, m1, e1, &b));
  TPR_CHECK(tpr_pb_add(p, a, b, &st));  // (T, 2)
  return tpr_pb_xent_max(p, st, zero, 2, out);
}

// in: L0, L1 (T, Vl) the two shards, targets (T), shard0, shard1, eye (2, 2).
static tpr_status build_two_shards(tpr_program *p, const tpr_value_id *in, tpr_value_id *loss) {
  tpr_value_id L[2] = {in[0], in[1]}, s[2] = {in[3], in[4]}, m[2], m_all, se[2], tg[2], se_all, tg_all;
  for (int r = 0; r < 2; r++) TPR_CHECK(tpr_pb_xent_max(p, L[r], s[r], g_V, &m[r]));
  TPR_CHECK(max_of_two(p, m[0], m[1], in[5], s[0], &m_all));
  for (int r = 0; r < 2; r++) {
    TPR_CHECK(tpr_pb_xent_sumexp(p, L[r], m_all, s[r], g_V, &se[r]));
    TPR_CHECK(tpr_pb_xent_target(p, L[r], in[2], s[r], g_V, &tg[r]));
  }
  TPR_CHECK(tpr_pb_add(p, se[0], se[1], &se_all));
  TPR_CHECK(tpr_pb_add(p, tg[0], tg[1], &tg_all));
  return tpr_pb_xent_loss(p, se_all, m_all, tg_all, in[2], loss);
}

// The same from one (T, 2*Vl) tensor split with slice (strided shard views).
static tpr_status build_sliced(tpr_program *p, const tpr_value_id *in, tpr_value_id *loss) {
  tpr_value_id v[6] = {-1, -1, in[1], in[2], in[3], in[4]};
  TPR_CHECK(tpr_pb_slice(p, in[0], 1, 0, g_Vl, &v[0]));
  TPR_CHECK(tpr_pb_slice(p, in[0], 1, g_Vl, g_Vl, &v[1]));
  return build_two_shards(p, v, loss);
}

// in: logits (T, C), targets, shard (0): the single-rank composition.
static tpr_status build_tp1(tpr_program *p, const tpr_value_id *in, tpr_value_id *loss) {
  return tpr_build_vocab_parallel_xent(p, in[0], in[1], in[2], g_V, TPR_AXIS_TP, 1, loss);
}

// Loss of one of the builders above over host inputs.
static double loss_of(tt_grad_build_fn build, int n, tpr_tensor *const *ts) {
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  tpr_value_id ids[TPR_OP_MAX_INPUTS], loss;
  char names[TPR_OP_MAX_INPUTS][8];
  const char *np[TPR_OP_MAX_INPUTS];
  for (int i = 0; i < n; i++) {
    snprintf(names[i], sizeof names[i], "in%d", i);
    np[i] = names[i];
    TT_OK(tpr_program_input(p, names[i], ts[i]->dtype, ts[i]->ndim, ts[i]->shape, &ids[i]));
  }
  TT_OK(build(p, ids, &loss));
  TT_OK(tpr_program_output(p, loss, "loss"));
  double v = run_loss(p, n, np, ts);
  tpr_program_free(p);
  return v;
}

static double rel(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-30); }

static tpr_tensor *eye2(void) {
  return tt_from_host(TPR_F32, 2, (const int64_t[]){2, 2}, (const float[]){1, 0, 0, 1});
}

// Values: single rank and 2 shards (sliced) against the double reference,
// with padding set to +60; V = 8 of 10 columns, and V = 3 of 6 (shard 1 is
// all padding: its max is the -FLT_MAX sentinel and must lose).
static void test_xent_values(void **state) {
  const int64_t cases[2][2] = {{5, 8}, {3, 3}};  // (Vl, V)
  for (int k = 0; k < 2; k++) {
    int64_t T = 7, Vl = cases[k][0], C = 2 * Vl, V = cases[k][1];
    g_V = V, g_Vl = Vl;
    const int ignored[] = {1, 4, -1};
    float *lh = make_logits(T, C, V, 2.0, 60.0f);
    int32_t *yh = make_targets(T, V, ignored);
    tpr_tensor *l = tt_from_host(TPR_F32, 2, (const int64_t[]){T, C}, lh);
    tpr_tensor *y = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, yh);
    tpr_tensor *s0 = scalar_i32(0), *s1 = scalar_i32(1), *eye = eye2();
    double want = ref_xent(lh, T, C, V, yh);
    double one = loss_of(build_tp1, 3, (tpr_tensor *const[]){l, y, s0});
    double two = loss_of(build_sliced, 5, (tpr_tensor *const[]){l, y, s0, s1, eye});
    // Negative control: with the mask off (V = all columns) the +60 padding wins.
    g_V = C;
    double unmasked = loss_of(build_tp1, 3, (tpr_tensor *const[]){l, y, s0});
    printf("  xent V=%lld of %lld: ref %.9f, tp1 rel err %.2e, 2 shards rel err %.2e (vs tp1 %.2e); "
           "unmasked %.4f\n",
           (long long)V, (long long)C, want, rel(one, want), rel(two, want), rel(two, one), unmasked);
    assert_true(rel(one, want) < VALUE_REL && rel(two, want) < VALUE_REL && rel(two, one) < VALUE_REL);
    assert_true(fabs(unmasked - want) > 10);
    // Every target ignored: the loss is 0, not NaN.
    for (int64_t t = 0; t < T; t++) yh[t] = -100;
    TT_OK(tpr_tensor_from_host(y, yh, T * sizeof *yh));
    g_V = V;
    assert_true(loss_of(build_tp1, 3, (tpr_tensor *const[]){l, y, s0}) == 0.0);
    free(lh), free(yh);
    tpr_tensor_free(l), tpr_tensor_free(y), tpr_tensor_free(s0), tpr_tensor_free(s1), tpr_tensor_free(eye);
  }
}

// FD of the single-rank composition w.r.t. logits, padded columns included
// (their gradient is 0 and so is their FD: the loss ignores them).
static void test_xent_grad_tp1(void **state) {
  int64_t T = 6, C = 10, V = 8;
  g_V = V;
  const int ignored[] = {2, -1};
  float *lh = make_logits(T, C, V, 1.5, 40.0f);
  int32_t *yh = make_targets(T, V, ignored);
  tt_grad_case c = {.name = "xent tp1 (padded V)", .n_in = 3, .diff = {true}, .build = build_tp1, .max_points = 60};
  c.in[0] = tt_from_host(TPR_F32, 2, (const int64_t[]){T, C}, lh);
  c.in[1] = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, yh);
  c.in[2] = scalar_i32(0);
  check_case(&c);
  check_control(&c, 0.5);
  free_inputs(&c);
  free(lh), free(yh);
}

// FD through the simulated 2-shard program w.r.t. both shards' logits.
// (The shards are separate params here: slice has no backward rule yet.)
static void test_xent_grad_two_shards(void **state) {
  int64_t T = 5, Vl = 4, V = 7;
  g_V = V, g_Vl = Vl;
  const int ignored[] = {3, -1};
  float *lh = make_logits(T, 2 * Vl, V, 1.5, 40.0f);
  int32_t *yh = make_targets(T, V, ignored);
  float *h0 = malloc((size_t)(T * Vl) * sizeof *h0), *h1 = malloc((size_t)(T * Vl) * sizeof *h1);
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < Vl; j++) h0[t * Vl + j] = lh[t * 2 * Vl + j], h1[t * Vl + j] = lh[t * 2 * Vl + Vl + j];
  tt_grad_case c = {.name = "xent 2 shards", .n_in = 6, .diff = {true, true}, .build = build_two_shards};
  c.in[0] = tt_from_host(TPR_F32, 2, (const int64_t[]){T, Vl}, h0);
  c.in[1] = tt_from_host(TPR_F32, 2, (const int64_t[]){T, Vl}, h1);
  c.in[2] = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, yh);
  c.in[3] = scalar_i32(0);
  c.in[4] = scalar_i32(1);
  c.in[5] = eye2();
  check_case(&c);
  check_control(&c, -1);
  free_inputs(&c);
  free(lh), free(yh), free(h0), free(h1);
}

// Each rule alone. xent_sumexp and xent_loss are checked only w.r.t. the
// inputs their rules differentiate (never the max: its partials cancel in
// the composition above, which is where that is proven).
static void test_xent_rules_alone(void **state) {
  int64_t T = 6, Vl = 5, V = 8;  // shard 1: columns 5..9, of which 8, 9 are padding
  float *mh = malloc((size_t)T * sizeof *mh), *seh = malloc((size_t)T * sizeof *seh);
  for (int64_t t = 0; t < T; t++) mh[t] = (float)tt_uniform(0.5, 1.5), seh[t] = (float)tt_uniform(1.0, 4.0);
  const int ignored[] = {0, -1};
  int32_t *yh = make_targets(T, V, ignored);
  tt_grad_case se = {.name = "xent_sumexp", .n_in = 3, .diff = {true}, .op = TPR_OP_XENT_SUMEXP,
                     .attrs = {.n_i = 1, .i = {V}}};
  se.in[0] = tt_random_f32(tt_cpu(), 2, (const int64_t[]){T, Vl}, NULL);
  se.in[1] = tt_from_host(TPR_F32, 2, (const int64_t[]){T, 1}, mh);
  se.in[2] = scalar_i32(1);
  check_case(&se);
  free_inputs(&se);
  tt_grad_case tg = {.name = "xent_target", .n_in = 3, .diff = {true}, .op = TPR_OP_XENT_TARGET,
                     .attrs = {.n_i = 1, .i = {V}}};
  tg.in[0] = tt_random_f32(tt_cpu(), 2, (const int64_t[]){T, Vl}, NULL);
  tg.in[1] = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, yh);
  tg.in[2] = scalar_i32(1);
  check_case(&tg);
  free_inputs(&tg);
  tt_grad_case lo = {.name = "xent_loss", .n_in = 4, .diff = {true, false, true}, .op = TPR_OP_XENT_LOSS};
  lo.in[0] = tt_from_host(TPR_F32, 2, (const int64_t[]){T, 1}, seh);
  lo.in[1] = tt_from_host(TPR_F32, 2, (const int64_t[]){T, 1}, mh);
  lo.in[2] = tt_random_f32(tt_cpu(), 2, (const int64_t[]){T, 1}, NULL);
  lo.in[3] = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, yh);
  check_case(&lo);
  check_control(&lo, 0.5);
  free_inputs(&lo);
  free(mh), free(seh), free(yh);
}

// tp = 2: the builder emits max / sum / sum all-reduces, and the backward
// builds without ever differentiating the max all-reduce (whose rule would
// refuse: only sum has a gradient).
static void test_xent_builder_tp2(void **state) {
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  tpr_value_id l, y, s, loss, grad;
  TT_OK(tpr_program_param(p, "logits", TPR_F32, 2, (const int64_t[]){4, 6}, &l));
  TT_OK(tpr_program_input(p, "targets", TPR_I32, 1, (const int64_t[]){4}, &y));
  TT_OK(tpr_program_input(p, "shard", TPR_I32, 1, (const int64_t[]){1}, &s));
  TT_OK(tpr_build_vocab_parallel_xent(p, l, y, s, 11, TPR_AXIS_TP, 2, &loss));
  int reds[3], n_red = 0;
  for (int n = 0; n < p->n_nodes; n++)
    if (p->nodes[n].op == TPR_OP_ALL_REDUCE && n_red < 3) reds[n_red++] = (int)p->nodes[n].attrs.i[2];
  assert_int_equal(n_red, 3);
  assert_true(reds[0] == 1 && reds[1] == 0 && reds[2] == 0);
  TT_OK(tpr_program_build_backward(p, loss, &l, 1, NULL, &grad));
  assert_true(grad >= 0);
  // V past tp * Vl is refused.
  tpr_value_id bad;
  assert_int_equal(tpr_build_vocab_parallel_xent(p, l, y, s, 13, TPR_AXIS_TP, 2, &bad), TPR_ERR_INVALID_ARG);
  printf("  tp 2 builder: all-reduce ops (max, sum, sum); backward built; V > tp*Vl: %s\n", tpr_last_error());
  tpr_program_free(p);
}

// ---- MoE auxiliary loss.

// transformers' load_balancing_loss_func (attention_mask None) in double:
// concatenated layers, p = softmax, top-k of p, E * sum_e f_e * P_e with
// f_e = count_e / N and P_e = mean p_e.
static double ref_aux(const float *const *logits, const int64_t *T, int layers, int64_t E, int64_t k) {
  double *cnt = calloc((size_t)E, sizeof *cnt), *ps = calloc((size_t)E, sizeof *ps), *p = malloc((size_t)E * sizeof *p);
  int64_t N = 0;
  for (int l = 0; l < layers; l++)
    for (int64_t t = 0; t < T[l]; t++, N++) {
      const float *row = logits[l] + t * E;
      double m = -INFINITY, s = 0;
      for (int64_t e = 0; e < E; e++) m = fmax(m, row[e]);
      for (int64_t e = 0; e < E; e++) s += (p[e] = exp(row[e] - m));
      for (int64_t e = 0; e < E; e++) ps[e] += p[e] / s;
      for (int64_t e = 0; e < E; e++) {  // rank of e among the row (no ties here)
        int64_t above = 0;
        for (int64_t f = 0; f < E; f++) above += p[f] > p[e];
        cnt[e] += above < k;
      }
    }
  double acc = 0;
  for (int64_t e = 0; e < E; e++) acc += (cnt[e] / N) * (ps[e] / N);
  free(cnt), free(ps), free(p);
  return acc * (double)E;
}

// Router logits whose rows are permutations of well-separated levels
// (spacing 0.7 plus noise below 0.1), so an FD step of 1e-2 never flips the top-k.
static float *router_logits(int64_t T, int64_t E) {
  float *h = malloc((size_t)(T * E) * sizeof *h);
  for (int64_t t = 0; t < T; t++) {
    for (int64_t e = 0; e < E; e++) h[t * E + e] = (float)(0.7 * (double)e - 1.5 + tt_uniform(-0.05, 0.05));
    for (int64_t e = E - 1; e > 0; e--) {
      int64_t j = tt_randint(0, e);
      float x = h[t * E + e];
      h[t * E + e] = h[t * E + j], h[t * E + j] = x;
    }
  }
  return h;
}

static int g_k;
#define AUX_LAYERS 3

static tpr_status build_aux(tpr_program *p, const tpr_value_id *in, tpr_value_id *loss) {
  return tpr_build_moe_aux_loss(p, in, AUX_LAYERS, g_k, loss);
}

static void test_moe_aux(void **state) {
  const int64_t T[AUX_LAYERS] = {5, 6, 4}, E = 6;
  g_k = 2;
  float *h[AUX_LAYERS];
  tt_grad_case c = {.name = "moe aux loss (3 layers)", .n_in = AUX_LAYERS, .diff = {true, true, true},
                    .build = build_aux, .h = 5e-2};  // levels >= 0.6 apart: steps of 0.05 never flip the top-k
  for (int l = 0; l < AUX_LAYERS; l++) {
    h[l] = router_logits(T[l], E);
    c.in[l] = tt_from_host(TPR_F32, 2, (const int64_t[]){T[l], E}, h[l]);
  }
  double want = ref_aux((const float *const *)h, T, AUX_LAYERS, E, g_k);
  double got = loss_of(build_aux, AUX_LAYERS, (tpr_tensor *const *)c.in);
  // Negative control: the mean of per-layer losses (layers not concatenated)
  // is a different number.
  double per_layer = 0;
  for (int l = 0; l < AUX_LAYERS; l++) per_layer += ref_aux((const float *const *)&h[l], &T[l], 1, E, g_k) / AUX_LAYERS;
  printf("  moe aux: ref %.9f, got rel err %.2e; mean of per-layer losses %.9f\n", want, rel(got, want), per_layer);
  assert_true(rel(got, want) < VALUE_REL);
  assert_true(rel(per_layer, want) > 1e-3);
  check_case(&c);
  check_control(&c, 0.5);
  free_inputs(&c);
  for (int l = 0; l < AUX_LAYERS; l++) free(h[l]);

  // Each rule alone: stats (the counts row has FD 0), and the loss w.r.t.
  // both stats rows (its rule is the full derivative).
  tt_grad_case st = {.name = "moe_aux_stats", .n_in = 1, .diff = {true}, .op = TPR_OP_MOE_AUX_STATS,
                     .attrs = {.n_i = 1, .i = {3}}};
  float *r = router_logits(7, E);
  st.in[0] = tt_from_host(TPR_F32, 2, (const int64_t[]){7, E}, r);
  check_case(&st);
  free_inputs(&st);
  free(r);
  float sh[12];
  for (int i = 0; i < 12; i++) sh[i] = (float)tt_uniform(0.5, 3.0);
  tt_grad_case lo = {.name = "moe_aux_loss", .n_in = 1, .diff = {true}, .op = TPR_OP_MOE_AUX_LOSS,
                     .attrs = {.n_i = 1, .i = {9}}};
  lo.in[0] = tt_from_host(TPR_F32, 2, (const int64_t[]){2, E}, sh);
  check_case(&lo);
  free_inputs(&lo);
}

// ---- Errors: bad targets and shard at run time, bad shapes at build time.
static void test_errors(void **state) {
  int64_t T = 4, Vl = 5, V = 9;
  tpr_tensor *l = tt_random_f32(tt_cpu(), 2, (const int64_t[]){T, Vl}, NULL);
  tpr_tensor *out = tt_new(TPR_F32, 2, (const int64_t[]){T, 1});
  tpr_tensor *s1 = scalar_i32(1), *sneg = scalar_i32(-1);
  tpr_op_attrs at = {.n_i = 1, .i = {V}};
  const int32_t bad_vals[3] = {9, -101, -1}, ok_vals[2] = {-100, 8};
  for (int k = 0; k < 3; k++) {
    int32_t yh[4] = {0, 3, bad_vals[k], 1};
    tpr_tensor *y = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, yh);
    assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_XENT_TARGET, (const tpr_tensor *const[]){l, y, s1}, 3, &at, out),
                     TPR_ERR_INVALID_ARG);
    printf("  target %d: %s\n", bad_vals[k], tpr_last_error());
    assert_non_null(strstr(tpr_last_error(), "position 2"));
    tpr_tensor_free(y);
  }
  for (int k = 0; k < 2; k++) {
    int32_t yh[4] = {ok_vals[k], 0, 5, 8};
    tpr_tensor *y = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, yh);
    TT_OK(tpr_op_run(tt_cpu(), TPR_OP_XENT_TARGET, (const tpr_tensor *const[]){l, y, s1}, 3, &at, out));
    const float *o = tpr_tensor_data(out), *ld = tpr_tensor_data(l);
    // shard 1 owns 5..9: target 5 -> column 0, 8 -> column 3; 0 and -100 -> 0.
    assert_true(o[0] == (ok_vals[k] == 8 ? ld[0 * Vl + 3] : 0.0f) && o[1] == 0.0f && o[2] == ld[2 * Vl + 0] &&
                o[3] == ld[3 * Vl + 3]);
    assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_XENT_TARGET, (const tpr_tensor *const[]){l, y, sneg}, 3, &at, out),
                     TPR_ERR_INVALID_ARG);
    tpr_tensor_free(y);
  }
  printf("  negative shard: %s\n", tpr_last_error());
  // A bad target also fails a whole program run (not just the eager op).
  {
    tpr_program *p;
    TT_OK(tpr_program_new(&p));
    tpr_value_id li, yi, si, loss;
    TT_OK(tpr_program_input(p, "l", TPR_F32, 2, (const int64_t[]){T, Vl}, &li));
    TT_OK(tpr_program_input(p, "y", TPR_I32, 1, (const int64_t[]){T}, &yi));
    TT_OK(tpr_program_input(p, "s", TPR_I32, 1, (const int64_t[]){1}, &si));
    TT_OK(tpr_build_vocab_parallel_xent(p, li, yi, si, Vl, TPR_AXIS_TP, 1, &loss));
    TT_OK(tpr_program_output(p, loss, "loss"));
    tpr_tensor *y = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, (const int32_t[]){0, 1, 2, 5});
    tpr_tensor *s0 = scalar_i32(0);
    tpr_exec *e;
    TT_OK(tpr_exec_new(p, tt_cpu(), &e));
    TT_OK(tpr_exec_bind(e, "l", l));
    TT_OK(tpr_exec_bind(e, "y", y));
    TT_OK(tpr_exec_bind(e, "s", s0));
    assert_int_equal(tpr_exec_run(e), TPR_ERR_INVALID_ARG);
    printf("  program run, target 5 with V 5: %s\n", tpr_last_error());
    tpr_exec_free(e);
    tpr_program_free(p);
    tpr_tensor_free(y), tpr_tensor_free(s0);
  }
  // Shapes and attributes, at build time.
  tpr_tensor d[4];
  tpr__set_contiguous(&d[0], TPR_F32, 2, (const int64_t[]){T, Vl});
  tpr__set_contiguous(&d[1], TPR_F32, 2, (const int64_t[]){T, 2});  // max of the wrong shape
  tpr__set_contiguous(&d[2], TPR_I32, 1, (const int64_t[]){1});
  tpr_tensor o;
  assert_int_equal(tpr__op_infer(TPR_OP_XENT_SUMEXP, (const tpr_tensor *const[]){&d[0], &d[1], &d[2]}, 3, &at, &o),
                   TPR_ERR_SHAPE);
  printf("  %s\n", tpr_last_error());
  tpr__set_contiguous(&d[1], TPR_I32, 1, (const int64_t[]){T + 1});  // targets of the wrong length
  assert_int_equal(tpr__op_infer(TPR_OP_XENT_TARGET, (const tpr_tensor *const[]){&d[0], &d[1], &d[2]}, 3, &at, &o),
                   TPR_ERR_SHAPE);
  printf("  %s\n", tpr_last_error());
  assert_int_equal(tpr__op_infer(TPR_OP_XENT_MAX, (const tpr_tensor *const[]){&d[0], &d[2]}, 2, NULL, &o),
                   TPR_ERR_INVALID_ARG);  // no V
  printf("  %s\n", tpr_last_error());
  tpr_op_attrs k9 = {.n_i = 1, .i = {9}};
  assert_int_equal(tpr__op_infer(TPR_OP_MOE_AUX_STATS, (const tpr_tensor *const[]){&d[0]}, 1, &k9, &o),
                   TPR_ERR_INVALID_ARG);
  printf("  %s\n", tpr_last_error());
  tpr_tensor_free(l), tpr_tensor_free(out), tpr_tensor_free(s1), tpr_tensor_free(sneg);
}

// Serialization round trip of the forward ops (rule, attrs and kernel agree).
static tpr_status build_target_op(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_xent_target(p, in[0], in[1], in[2], 8, out);
}

static tpr_status build_stats_op(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_moe_aux_stats(p, in[0], 2, out);
}

static void test_roundtrip(void **state) {
  tpr_tensor *l = tt_random_f32(tt_cpu(), 2, (const int64_t[]){3, 5}, NULL);
  tpr_tensor *y = tt_from_host(TPR_I64, 1, (const int64_t[]){3}, (const int64_t[]){6, -100, 2});
  tpr_tensor *s = tt_from_host(TPR_I64, 1, (const int64_t[]){1}, (const int64_t[]){1});
  tpr_tensor *o = tt_new(TPR_F32, 2, (const int64_t[]){3, 1});
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_XENT_TARGET, (const tpr_tensor *const[]){l, y, s}, 3,
                   &(tpr_op_attrs){.n_i = 1, .i = {8}}, o));
  tt_check_roundtrip(build_target_op, 3, (const tpr_tensor *const[]){l, y, s}, o);
  tpr_tensor *st = tt_new(TPR_F32, 2, (const int64_t[]){2, 5});
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_MOE_AUX_STATS, (const tpr_tensor *const[]){l}, 1,
                   &(tpr_op_attrs){.n_i = 1, .i = {2}}, st));
  const float *sd = tpr_tensor_data(st);
  double counts = 0, probs = 0;
  for (int e = 0; e < 5; e++) counts += sd[e], probs += sd[5 + e];
  printf("  moe_aux_stats: counts sum %.0f (T*k = 6), probability sum %.7f (T = 3)\n", counts, probs);
  assert_true(counts == 6 && fabs(probs - 3) < 1e-5);
  tt_check_roundtrip(build_stats_op, 1, (const tpr_tensor *const[]){l}, st);
  tpr_tensor_free(l), tpr_tensor_free(y), tpr_tensor_free(s), tpr_tensor_free(o), tpr_tensor_free(st);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_xent_values),      cmocka_unit_test(test_xent_grad_tp1),
      cmocka_unit_test(test_xent_grad_two_shards), cmocka_unit_test(test_xent_rules_alone),
      cmocka_unit_test(test_xent_builder_tp2), cmocka_unit_test(test_moe_aux),
      cmocka_unit_test(test_errors),           cmocka_unit_test(test_roundtrip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
