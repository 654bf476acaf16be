// Numerical proof of the attention sharding plan (docs/architecture.md section 5): in
// double precision, MiniMax-M2 attention (QK-norm over the full projection,
// partial RoPE, causal GQA) computed unsharded equals the sum over simulated
// ranks of the sharded computation the plan describes: local Q/K/V rows with
// padded and replicated heads, local norm-weight slices, sums of squares
// "all-reduced" across ranks and divided by the plan's divisors, local
// attention through the plan's local Q->KV mapping, o_proj over padded input
// columns. Negative controls show the comparison can fail: the wrong k
// divisor, every rank using rank 0's norm slice (the bug architecture.md section 1 describes), Q
// padded at the tail while KV is replicated, per-rank norms without the
// all-reduce.
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shard/shard_plan.h"

typedef struct problem {
  int T, H, nq, nkv, D, R;  // tokens, hidden, heads, head_dim, rotary dims
  double eps, theta;
  double *x;       // (T, H)
  double *wq;      // (nq*D, H)
  double *wk, *wv; // (nkv*D, H)
  double *wo;      // (H, nq*D)
  double *qn;      // (nq*D) q_norm weight
  double *kn;      // (nkv*D) k_norm weight
} problem;

// What a simulated run may get wrong on purpose (all zero: the plan as is).
typedef struct sabotage {
  int64_t k_divisor;        // nonzero: divide the k sum of squares by this instead
  bool rank0_norm_slice;    // every rank uses rank 0's q_norm / k_norm slice
  const int32_t *q_map;     // non-NULL: this Q head layout instead of the plan's
  bool local_norm;          // normalise per rank: no all-reduce, divisor = local size
} sabotage;

static double *randn(size_t n, double scale, double offset) {
  double *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = offset + scale * tt_normal();
  return v;
}

static problem make_problem(int T, int H, int nq, int nkv, int D, int R) {
  problem p = {.T = T, .H = H, .nq = nq, .nkv = nkv, .D = D, .R = R, .eps = 1e-6, .theta = 10000};
  double s = 1 / sqrt((double)H);
  p.x = randn((size_t)T * H, 1, 0);
  p.wq = randn((size_t)nq * D * H, s, 0);
  p.wk = randn((size_t)nkv * D * H, s, 0);
  p.wv = randn((size_t)nkv * D * H, s, 0);
  p.wo = randn((size_t)H * nq * D, 1 / sqrt((double)nq * D), 0);
  // Norm weights far from 1 so that a wrong slice is visible.
  p.qn = randn((size_t)nq * D, 0.5, 1);
  p.kn = randn((size_t)nkv * D, 0.5, 1);
  return p;
}

static void free_problem(problem *p) {
  free(p->x), free(p->wq), free(p->wk), free(p->wv), free(p->wo), free(p->qn), free(p->kn);
}

// y (T, out) = x (T, in) . w^T, w (out, in).
static void linear(const double *x, const double *w, int T, int in, int out, double *y) {
  for (int t = 0; t < T; t++)
    for (int o = 0; o < out; o++) {
      double acc = 0;
      for (int i = 0; i < in; i++) acc += x[(size_t)t * in + i] * w[(size_t)o * in + i];
      y[(size_t)t * out + o] = acc;
    }
}

static void sum_squares(const double *v, int T, int n, double *out) {  // out (T)
  for (int t = 0; t < T; t++) {
    double s = 0;
    for (int j = 0; j < n; j++) s += v[(size_t)t * n + j] * v[(size_t)t * n + j];
    out[t] = s;
  }
}

// v (T, n) *= w / sqrt(sumsq / divisor + eps), per token.
static void rms_apply(double *v, int T, int n, const double *sumsq, double divisor, double eps, const double *w) {
  for (int t = 0; t < T; t++) {
    double r = 1 / sqrt(sumsq[t] / divisor + eps);
    for (int j = 0; j < n; j++) v[(size_t)t * n + j] *= r * w[j];
  }
}

// NeoX rotate-half RoPE on the first R dims of every head of v (T, heads*D):
// pairs (i, i + R/2), angle = t * theta^(-2i/R).
static void rope(double *v, int T, int heads, int D, int R, double theta) {
  for (int t = 0; t < T; t++)
    for (int h = 0; h < heads; h++) {
      double *e = v + (size_t)t * heads * D + (size_t)h * D;
      for (int i = 0; i < R / 2; i++) {
        double a = t * pow(theta, -2.0 * i / R), c = cos(a), s = sin(a);
        double x0 = e[i], x1 = e[i + R / 2];
        e[i] = x0 * c - x1 * s;
        e[i + R / 2] = x1 * c + x0 * s;
      }
    }
}

// Causal attention: Q head h reads KV head kv_of[h]. q (T, nqh*D), k/v (T,
// nkvh*D), o (T, nqh*D).
static void attend(const double *q, const double *k, const double *v, int T, int nqh, int nkvh, int D,
                   const int64_t *kv_of, double *o) {
  double *p = malloc((size_t)T * sizeof *p);
  for (int h = 0; h < nqh; h++)
    for (int i = 0; i < T; i++) {
      const double *qi = q + (size_t)i * nqh * D + (size_t)h * D;
      double mx = -INFINITY, z = 0;
      for (int j = 0; j <= i; j++) {
        const double *kj = k + (size_t)j * nkvh * D + (size_t)kv_of[h] * D;
        double s = 0;
        for (int d = 0; d < D; d++) s += qi[d] * kj[d];
        p[j] = s / sqrt((double)D);
        mx = fmax(mx, p[j]);
      }
      for (int j = 0; j <= i; j++) z += p[j] = exp(p[j] - mx);
      double *oi = o + (size_t)i * nqh * D + (size_t)h * D;
      for (int d = 0; d < D; d++) {
        double acc = 0;
        for (int j = 0; j <= i; j++) acc += p[j] * v[(size_t)j * nkvh * D + (size_t)kv_of[h] * D + d];
        oi[d] = acc / z;
      }
    }
  free(p);
}

// The unsharded model: y (T, H).
static void reference(const problem *p, double *y) {
  int T = p->T, H = p->H, D = p->D, nq = p->nq, nkv = p->nkv;
  double *q = calloc((size_t)T * nq * D, sizeof(double)), *k = calloc((size_t)T * nkv * D, sizeof(double));
  double *v = calloc((size_t)T * nkv * D, sizeof(double)), *o = calloc((size_t)T * nq * D, sizeof(double));
  double *ss = calloc((size_t)T, sizeof(double));
  int64_t *kv_of = calloc((size_t)nq, sizeof(int64_t));
  linear(p->x, p->wq, T, H, nq * D, q);
  linear(p->x, p->wk, T, H, nkv * D, k);
  linear(p->x, p->wv, T, H, nkv * D, v);
  sum_squares(q, T, nq * D, ss);
  rms_apply(q, T, nq * D, ss, nq * D, p->eps, p->qn);
  sum_squares(k, T, nkv * D, ss);
  rms_apply(k, T, nkv * D, ss, nkv * D, p->eps, p->kn);
  rope(q, T, nq, D, p->R, p->theta);
  rope(k, T, nkv, D, p->R, p->theta);
  for (int h = 0; h < nq; h++) kv_of[h] = h / (nq / nkv);
  attend(q, k, v, T, nq, nkv, D, kv_of, o);
  linear(o, p->wo, T, nq * D, H, y);
  free(q), free(k), free(v), free(o), free(ss), free(kv_of);
}

// Copies D-long head blocks: dst head j <- src head map[j], zeros for -1.
// Used for weight rows (stride H) and norm weights (stride 1).
static void gather_heads(const double *src, const int32_t *map, int64_t from, int64_t n, int D, int stride,
                         double *dst) {
  for (int64_t j = 0; j < n; j++) {
    int32_t h = map[from + j];
    for (size_t e = 0; e < (size_t)D * stride; e++)
      dst[(size_t)j * D * stride + e] = h >= 0 ? src[(size_t)h * D * stride + e] : 0;
  }
}

// Every rank of the plan, simulated: returns the sum of the partial outputs.
static void sharded(const problem *p, const tpr_attn_plan *a, const sabotage *bad, double *y) {
  int T = p->T, H = p->H, D = p->D, tp = a->tp;
  int qr = (int)a->q_per_rank, kr = (int)a->kv_per_rank;
  const int32_t *qmap = bad->q_map ? bad->q_map : a->q_head_map, *kvmap = a->kv_head_map;
  // The programs hold the full padded / replicated norm weights and select
  // the rank's slice with the rank tensor.
  double *qn_full = malloc(sizeof(double) * a->nq_padded * D), *kn_full = malloc(sizeof(double) * a->nkv_eff * D);
  gather_heads(p->qn, qmap, 0, a->nq_padded, D, 1, qn_full);
  gather_heads(p->kn, kvmap, 0, a->nkv_eff, D, 1, kn_full);
  double *wq = malloc(sizeof(double) * tp * qr * D * H), *wk = malloc(sizeof(double) * tp * kr * D * H);
  double *wv = malloc(sizeof(double) * tp * kr * D * H), *wo = malloc(sizeof(double) * tp * H * qr * D);
  double *q = malloc(sizeof(double) * tp * T * qr * D), *k = malloc(sizeof(double) * tp * T * kr * D);
  double *v = malloc(sizeof(double) * tp * T * kr * D), *o = malloc(sizeof(double) * T * qr * D);
  double *ssq = calloc((size_t)tp * T, sizeof(double)), *ssk = calloc((size_t)tp * T, sizeof(double));
  double *allq = calloc((size_t)T, sizeof(double)), *allk = calloc((size_t)T, sizeof(double));
  double *part = malloc(sizeof(double) * T * H);
  int64_t *kv_of = malloc(sizeof(int64_t) * qr);
  memset(y, 0, sizeof(double) * T * H);
  // Phase 1 on every rank: local projections and local sums of squares.
  for (int r = 0; r < tp; r++) {
    double *wq_r = wq + (size_t)r * qr * D * H, *wk_r = wk + (size_t)r * kr * D * H, *wv_r = wv + (size_t)r * kr * D * H;
    gather_heads(p->wq, qmap, (int64_t)r * qr, qr, D, H, wq_r);  // (qr*D, H)
    gather_heads(p->wk, kvmap, (int64_t)r * kr, kr, D, H, wk_r); // (kr*D, H)
    gather_heads(p->wv, kvmap, (int64_t)r * kr, kr, D, H, wv_r);
    linear(p->x, wq_r, T, H, qr * D, q + (size_t)r * T * qr * D);
    linear(p->x, wk_r, T, H, kr * D, k + (size_t)r * T * kr * D);
    linear(p->x, wv_r, T, H, kr * D, v + (size_t)r * T * kr * D);
    sum_squares(q + (size_t)r * T * qr * D, T, qr * D, ssq + (size_t)r * T);
    sum_squares(k + (size_t)r * T * kr * D, T, kr * D, ssk + (size_t)r * T);
  }
  // The all-reduce over the tp group.
  for (int r = 0; r < tp; r++)
    for (int t = 0; t < T; t++) allq[t] += ssq[(size_t)r * T + t], allk[t] += ssk[(size_t)r * T + t];
  // Phase 2 on every rank: norm, rope, attention, o_proj partial.
  for (int r = 0; r < tp; r++) {
    double *q_r = q + (size_t)r * T * qr * D, *k_r = k + (size_t)r * T * kr * D, *v_r = v + (size_t)r * T * kr * D;
    int slice = bad->rank0_norm_slice ? 0 : r;
    double k_div = bad->k_divisor ? (double)bad->k_divisor : (double)a->k_norm_divisor;
    if (bad->local_norm) {
      rms_apply(q_r, T, qr * D, ssq + (size_t)r * T, qr * D, p->eps, qn_full + (size_t)slice * qr * D);
      rms_apply(k_r, T, kr * D, ssk + (size_t)r * T, kr * D, p->eps, kn_full + (size_t)slice * kr * D);
    } else {
      rms_apply(q_r, T, qr * D, allq, (double)a->q_norm_divisor, p->eps, qn_full + (size_t)slice * qr * D);
      rms_apply(k_r, T, kr * D, allk, k_div, p->eps, kn_full + (size_t)slice * kr * D);
    }
    rope(q_r, T, qr, D, p->R, p->theta);
    rope(k_r, T, kr, D, p->R, p->theta);
    for (int i = 0; i < qr; i++) kv_of[i] = tpr_attn_plan_local_kv(a, r, i);
    attend(q_r, k_r, v_r, T, qr, kr, D, kv_of, o);
    // o_proj input columns padded exactly like the Q heads: (H, qr*D).
    double *wo_r = wo + (size_t)r * H * qr * D;
    for (int h = 0; h < H; h++)
      for (int i = 0; i < qr; i++) {
        int32_t src = qmap[(int64_t)r * qr + i];
        for (int d = 0; d < D; d++)
          wo_r[(size_t)h * qr * D + (size_t)i * D + d] = src >= 0 ? p->wo[(size_t)h * p->nq * D + (size_t)src * D + d] : 0;
      }
    linear(o, wo_r, T, qr * D, H, part);
    for (size_t e = 0; e < (size_t)T * H; e++) y[e] += part[e];  // the o_proj all-reduce
  }
  free(qn_full), free(kn_full), free(wq), free(wk), free(wv), free(wo), free(q), free(k), free(v), free(o);
  free(ssq), free(ssk), free(allq), free(allk), free(part), free(kv_of);
}

static double rel_err(const double *got, const double *want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) num = fmax(num, fabs(got[i] - want[i])), den = fmax(den, fabs(want[i]));
  return num / fmax(den, 1e-300);
}

// Max relative error of the plan for (nq, nkv, tp) against the reference.
static double run_case(int nq, int nkv, int tp, const sabotage *bad, tpr_kv_strategy *strategy) {
  int T = 6, H = 16, D = 4, R = 2;
  problem p = make_problem(T, H, nq, nkv, D, R);
  tpr_attn_plan a;
  TT_OK(tpr_attn_plan_build(nq, nkv, D, tp, &a));
  if (strategy) *strategy = a.strategy;
  double *want = malloc(sizeof(double) * T * H), *got = malloc(sizeof(double) * T * H);
  reference(&p, want);
  sharded(&p, &a, bad, got);
  double err = rel_err(got, want, (size_t)T * H);
  free(want), free(got);
  tpr_attn_plan_free(&a);
  free_problem(&p);
  return err;
}

static void test_equivalence(void **state) {
  static const struct {
    int nq, nkv, tp;
    tpr_kv_strategy strategy;
  } cases[] = {
      // The MiniMax-M2 table's degrees with M2's head counts.
      {48, 8, 1, TPR_KV_SHARD},           {48, 8, 8, TPR_KV_SHARD},
      {48, 8, 16, TPR_KV_REPLICATE},      {48, 8, 32, TPR_KV_REPLICATE},
      {48, 8, 64, TPR_KV_REPLICATE},      {48, 8, 2, TPR_KV_SHARD},
      // MHA conversion, with and without tail padding.
      {48, 8, 6, TPR_KV_CONVERT_TO_MHA},  {48, 8, 5, TPR_KV_CONVERT_TO_MHA},
      {48, 8, 12, TPR_KV_CONVERT_TO_MHA}, {12, 4, 3, TPR_KV_CONVERT_TO_MHA},
      {12, 4, 8, TPR_KV_REPLICATE},       {6, 2, 4, TPR_KV_REPLICATE},
      // Plain MHA (nq == nkv) through each strategy.
      {8, 8, 2, TPR_KV_SHARD},            {8, 8, 16, TPR_KV_REPLICATE},
      {8, 8, 3, TPR_KV_CONVERT_TO_MHA},   {8, 8, 1, TPR_KV_SHARD},
  };
  const sabotage none = {0};
  double worst = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tpr_kv_strategy s;
    double err = run_case(cases[i].nq, cases[i].nkv, cases[i].tp, &none, &s);
    worst = fmax(worst, err);
    assert_int_equal(s, cases[i].strategy);
    if (!(err < 1e-10))
      fail_msg("nq %d nkv %d tp %d (%s): rel err %.3g vs unsharded", cases[i].nq, cases[i].nkv, cases[i].tp,
               tpr_kv_strategy_name(s), err);
  }
  print_message("%zu plans equal unsharded attention: worst rel err %.3g (bound 1e-10)\n",
                sizeof cases / sizeof cases[0], worst);
}

// Each control must break the equality by far more than rounding.
static void expect_broken(const char *what, double err) {
  if (!(err > 1e-3)) fail_msg("negative control '%s' passed (rel err %.3g): the check cannot fail", what, err);
  print_message("negative control %-45s rel err %.3g (fails the 1e-10 bound, as it must)\n", what, err);
}

static void test_negative_controls(void **state) {
  // Replicating KV but dividing by nkv*D, as if sharded: replication scales the sum by t/nkv.
  for (int tp = 16; tp <= 64; tp *= 2) {
    sabotage wrong_k = {.k_divisor = 8 * 4};
    expect_broken("k divisor nkv*D while replicating", run_case(48, 8, tp, &wrong_k, NULL));
  }
  // Seed 000's bug: the rank baked in as a constant, every rank slicing as rank 0.
  sabotage rank0 = {.rank0_norm_slice = true};
  expect_broken("rank 0's norm slice, shard", run_case(48, 8, 8, &rank0, NULL));
  expect_broken("rank 0's norm slice, replicate", run_case(48, 8, 64, &rank0, NULL));
  expect_broken("rank 0's norm slice, MHA", run_case(48, 8, 6, &rank0, NULL));
  // Q padded at the tail while KV is replicated: rank r's Q heads no longer
  // belong to the KV group it holds.
  int32_t tail[64];
  for (int j = 0; j < 64; j++) tail[j] = j < 48 ? j : -1;
  sabotage tail_q = {.q_map = tail};
  expect_broken("Q tail-padded with KV replicated (t=32)", run_case(48, 8, 32, &tail_q, NULL));
  expect_broken("Q tail-padded with KV replicated (t=64)", run_case(48, 8, 64, &tail_q, NULL));
  // Per-rank normalisation without the all-reduce (some later ports).
  sabotage local = {.local_norm = true};
  expect_broken("per-rank QK-norm, no all-reduce", run_case(48, 8, 8, &local, NULL));
  // And the controls are sabotage, not noise: the same runs without it pass.
  const sabotage none = {0};
  assert_true(run_case(48, 8, 32, &none, NULL) < 1e-10);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equivalence),
      cmocka_unit_test(test_negative_controls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
