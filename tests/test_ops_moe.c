// The expert-parallel ops on one process: moe_capacity (a hand-worked case,
// then random routing against a reference written from ops.h's words),
// row_slice, moe_counts, moe_permute / moe_unpermute, and moe_grouped_ffn
// against moe_experts; shape-rule and data errors (all_to_allv's rule is
// checked in test_moe_exchange.c, where it runs). Fresh random inputs each
// run (seed printed; rerun with TPR_TEST_SEED=...); each op also goes once
// through a serialized program (tt_check_roundtrip). Negative controls show
// the comparisons can fail.
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rng.h"

#define U32 0x1p-24

static tpr_tensor *permuted(const tpr_tensor *t, const int *perm) {
  tpr_tensor *v = NULL;
  TT_OK(tpr_tensor_permute(t, perm, &v));
  return v;
}

// Sparse routing G (N, E): each token picks k in [kmin, kmax] distinct
// experts (never `avoid`, if >= 0) with weights in [0.05, 1).
static void random_gates(float *G, int N, int E, int kmin, int kmax, int avoid) {
  memset(G, 0, (size_t)N * E * sizeof *G);
  for (int t = 0; t < N; t++) {
    int k = (int)tt_randint(kmin, kmax);
    for (int j = 0; j < k; j++) {
      int e;
      do e = (int)tt_randint(0, E - 1);
      while (e == avoid || G[t * E + e] != 0);
      G[t * E + e] = (float)tt_uniform(0.05, 1.0);
    }
  }
}

// tt_max_rel_err, but any non-finite value gives infinity (so a NaN can
// never pass as a small error).
static double rel_err(const float *got, const double *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(got[i])) return INFINITY;
  return tt_max_rel_err(got, want, n);
}

static int nnz(const float *G, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) k += G[i] != 0;
  return k;
}

static tpr_status build_capacity(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_moe_capacity(p, in[0], 2, 1.0f, true, 0xfeedfacecafebeefull, out);
}
static tpr_status build_row_slice(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_row_slice(p, in[0], in[1], 3, out);
}
static tpr_status build_counts(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_moe_counts(p, in[0], out);
}
static int64_t permute_rows;
static tpr_status build_permute(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_moe_permute(p, in[0], in[1], permute_rows, out);
}
static tpr_status build_unpermute(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_moe_unpermute(p, in[0], in[1], out);
}
static tpr_status build_grouped(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_moe_grouped_ffn(p, in[0], in[1], in[2], in[3], out);
}

// ---------------------------------------------------------------- moe_capacity

// T = 6, E = 3, top_k = 2, factor 0.75: C = ceil(6*2*0.75/3) = 3.
//   expert 0: t0 .9, t3 .7, t1 .6, t2 .6, t4 .5 -> keeps t0 t3 t1 (the tie at
//             .6 goes to the lower token t1), drops t2 and t4;
//   expert 1: t5 .8, t4 .5, t2 .4, t0 .1 -> drops t0;
//   expert 2: t1 .4, t3 .3 -> load 2, one spare slot.
// Reroute, dropped in token order: (t0, e1) takes the only slot, expert 2
// (t0 does not use it) with its weight .1; (t2, e0) and (t4, e0) find no
// slot and stay dropped -- whatever the seed, as there is one slot.
static void test_capacity_hand(void **state) {
  enum { T = 6, E = 3 };
  const float G[T * E] = {.9f, .1f, 0, .6f, 0, .4f, .6f, .4f, 0, .7f, 0, .3f, .5f, .5f, 0, 0, .8f, 0};
  float drop[T * E], rer[T * E];
  memcpy(drop, G, sizeof G);
  drop[0 * E + 1] = drop[2 * E + 0] = drop[4 * E + 0] = 0;
  memcpy(rer, drop, sizeof drop);
  rer[0 * E + 2] = .1f;
  const int64_t s[] = {T, E};
  tpr_tensor *g = tt_from_host(TPR_F32, 2, s, G), *out = tt_new(TPR_F32, 2, s);
  for (int r = 0; r < 2; r++)
    for (uint64_t seed = 0; seed < 4; seed++) {
      TT_OK(tpr_moe_capacity(tt_cpu(), g, 2, 0.75f, r, seed * 0x9e3779b97f4a7c15ull, out));
      float *got = tt_to_host(out);
      assert_memory_equal(got, r ? rer : drop, sizeof G);
      free(got);
    }
  // factor 1.0 gives C = 4: only expert 0 (5 assignments) drops, its last (t4).
  TT_OK(tpr_moe_capacity(tt_cpu(), g, 2, 1.0f, false, 0, out));
  float *got = tt_to_host(out), want[T * E];
  memcpy(want, G, sizeof G);
  want[4 * E + 0] = 0;
  assert_memory_equal(got, want, sizeof G);
  free(got);
  tpr_tensor_free(g), tpr_tensor_free(out);
}

// The spec of ops.h, written independently of the kernel: top C per expert
// by repeated selection, then the shuffled spare slots.
static void ref_capacity(const float *G, int T, int E, int k, float factor, bool reroute, uint64_t seed, float *out,
                         int *n_drop, int *n_moved) {
  double cd = ceil((double)T * k * (double)factor / E);
  int C = cd >= T ? T : (int)cd, load[64], slots[4096], ns = 0;
  bool *dropped = calloc((size_t)T * E, 1), *picked = calloc((size_t)T, 1);
  memcpy(out, G, (size_t)T * E * sizeof *out);
  *n_drop = *n_moved = 0;
  for (int e = 0; e < E; e++) {
    memset(picked, 0, (size_t)T);
    load[e] = 0;
    for (int c = 0; c < C; c++) {  // the next best: larger weight, then lower token
      int best = -1;
      for (int t = 0; t < T; t++)
        if (G[t * E + e] != 0 && !picked[t] && (best < 0 || G[t * E + e] > G[best * E + e])) best = t;
      if (best < 0) break;
      picked[best] = true, load[e]++;
    }
    for (int t = 0; t < T; t++)
      if (G[t * E + e] != 0 && !picked[t]) out[t * E + e] = 0, dropped[t * E + e] = true, (*n_drop)++;
  }
  for (int e = 0; e < E; e++)
    for (int i = load[e]; i < C; i++) slots[ns++] = e;
  tpr_rng r = {seed};
  for (int i = ns - 1; i > 0; i--) {
    int j = (int)(tpr_rng_next(&r) % (uint64_t)(i + 1)), tmp = slots[i];
    slots[i] = slots[j], slots[j] = tmp;
  }
  for (int t = 0; reroute && t < T; t++)
    for (int e = 0; e < E; e++)
      for (int i = 0; dropped[t * E + e] && i < ns; i++)
        if (slots[i] >= 0 && out[t * E + slots[i]] == 0) {
          out[t * E + slots[i]] = G[t * E + e], slots[i] = -1, (*n_moved)++;
          break;
        }
  free(dropped), free(picked);
}

// Random skewed routing (experts 0 and 1 popular), T = 40, E = 8, top_k 2,
// factor 1: C = 10. Checked against ref_capacity bit for bit and against
// the properties that make a reroute valid.
static void test_capacity_random(void **state) {
  enum { T = 40, E = 8, K = 2 };
  float G[T * E] = {0}, want[T * E], plain[T * E];
  for (int t = 0; t < T; t++) {
    int a = (int)tt_randint(0, 3) < 3 ? (int)tt_randint(0, 1) : (int)tt_randint(2, E - 1), b;
    do b = (int)tt_randint(0, E - 1);
    while (b == a);
    G[t * E + a] = (float)tt_uniform(0.5, 1), G[t * E + b] = (float)tt_uniform(0.05, 0.5);
  }
  G[3 * E + 0] = G[4 * E + 0] = G[5 * E + 0] = 0.75f;  // ties on a popular expert
  const int64_t s[] = {T, E};
  const uint64_t seed = tt_next_u64();
  tpr_tensor *g = tt_from_host(TPR_F32, 2, s, G), *out = tt_new(TPR_F32, 2, s);
  int n_drop, n_moved;
  TT_OK(tpr_moe_capacity(tt_cpu(), g, K, 1.0f, false, seed, out));
  float *got0 = tt_to_host(out);
  ref_capacity(G, T, E, K, 1.0f, false, seed, plain, &n_drop, &n_moved);
  assert_memory_equal(got0, plain, sizeof G);
  assert_true(n_drop > 0);  // the skew overflows experts 0 and 1
  TT_OK(tpr_moe_capacity(tt_cpu(), g, K, 1.0f, true, seed, out));
  float *got = tt_to_host(out);
  ref_capacity(G, T, E, K, 1.0f, true, seed, want, &n_drop, &n_moved);
  assert_memory_equal(got, want, sizeof G);
  // Properties, independent of the reference: kept entries stay, a moved
  // weight lands on an expert its token did not use, no expert exceeds C,
  // and each token keeps its weights (sum and count) unless one stayed dropped.
  int load[E] = {0}, moved = 0, lost = 0;
  for (int t = 0; t < T; t++) {
    double sum_in = 0, sum_out = 0;
    for (int e = 0; e < E; e++) {
      float v = got[t * E + e];
      if (plain[t * E + e] != 0) assert_true(v == plain[t * E + e]);
      if (v != 0 && plain[t * E + e] == 0) assert_true(G[t * E + e] == 0), moved++;
      load[e] += v != 0, sum_in += G[t * E + e], sum_out += v;
    }
    int lost_t = nnz(G + t * E, E) - nnz(got + t * E, E);
    lost += lost_t;
    if (lost_t == 0) assert_true(fabs(sum_in - sum_out) <= 1e-6);
  }
  for (int e = 0; e < E; e++) assert_true(load[e] <= T * K / E);
  assert_int_equal(moved, n_moved);
  assert_int_equal(lost, n_drop - n_moved);
  assert_true(moved > 0);
  // Same seed, same result, also from strided gates (a transposed (E, T)
  // buffer); some other seed moves something elsewhere.
  float GT[E * T];
  for (int i = 0; i < T * E; i++) GT[(i % E) * T + i / E] = G[i];
  tpr_tensor *gtt = tt_from_host(TPR_F32, 2, (const int64_t[]){E, T}, GT), *gv = permuted(gtt, (const int[]){1, 0});
  TT_OK(tpr_moe_capacity(tt_cpu(), gv, K, 1.0f, true, seed, out));
  float *again = tt_to_host(out);
  assert_memory_equal(again, got, sizeof G);
  int differ = 0;
  for (uint64_t k = 1; k <= 8 && !differ; k++) {
    TT_OK(tpr_moe_capacity(tt_cpu(), g, K, 1.0f, true, seed + k, out));
    float *o = tt_to_host(out);
    differ = memcmp(o, got, sizeof G) != 0;
    free(o);
  }
  assert_true(differ);
  // Dropless: a huge factor (C clamps to T) and C = T exactly change nothing.
  const float factors[] = {1e30f, (float)E / K};
  for (int i = 0; i < 2; i++)
    for (int r = 0; r < 2; r++) {
      TT_OK(tpr_moe_capacity(tt_cpu(), g, K, factors[i], r, seed, out));
      float *o = tt_to_host(out);
      assert_memory_equal(o, G, sizeof G);
      free(o);
    }
  TT_OK(tpr_moe_capacity(tt_cpu(), g, 2, 1.0f, true, 0xfeedfacecafebeefull, out));
  tt_check_roundtrip(build_capacity, 1, (const tpr_tensor *const[]){g}, out);
  // Attribute errors.
  assert_int_equal(tpr_moe_capacity(tt_cpu(), g, 0, 1.0f, true, seed, out), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_moe_capacity(tt_cpu(), g, E + 1, 1.0f, true, seed, out), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "top_k"));
  assert_int_equal(tpr_moe_capacity(tt_cpu(), g, K, 0.0f, true, seed, out), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_moe_capacity(tt_cpu(), g, K, INFINITY, true, seed, out), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_moe_capacity(tt_cpu(), g, K, NAN, true, seed, out), TPR_ERR_INVALID_ARG);
  free(got0), free(got), free(again);
  tpr_tensor_free(g), tpr_tensor_free(out), tpr_tensor_free(gtt), tpr_tensor_free(gv);
}

// ---------------------------------------------------------------- row_slice

// Exact copies: parts of T rows in n pieces of ceil(T/n), zero past T.
static void check_row_slice(const tpr_tensor *x, const int32_t *X, int64_t T, int64_t C, int64_t n, tpr_dtype pdt) {
  const int64_t Ts = (T + n - 1) / n, os[] = {Ts, C};
  tpr_tensor *out = tt_new(TPR_I32, 2, os), *part = tt_new(pdt, 1, (const int64_t[]){1});
  int32_t *junk = malloc((size_t)(Ts * C + 1) * sizeof *junk);
  for (int64_t p = 0; p < n; p++) {
    int64_t pv = p;
    int32_t p32 = (int32_t)p;
    TT_OK(tpr_tensor_from_host(part, pdt == TPR_I64 ? (void *)&pv : (void *)&p32, tpr_dtype_size(pdt)));
    for (int64_t i = 0; i < Ts * C; i++) junk[i] = -12345;  // every element must be written
    TT_OK(tpr_tensor_from_host(out, junk, tpr_tensor_nbytes(out)));
    TT_OK(tpr_row_slice(tt_cpu(), x, part, n, out));
    int32_t *got = tt_to_host(out);
    for (int64_t r = 0; r < Ts; r++)
      for (int64_t c = 0; c < C; c++) {
        int64_t src = p * Ts + r;
        int32_t want = src < T ? X[src * C + c] : 0;
        if (got[r * C + c] != want)
          fail_msg("row_slice T=%lld n=%lld part %lld (%lld, %lld): got %d want %d", (long long)T, (long long)n,
                   (long long)p, (long long)r, (long long)c, got[r * C + c], want);
      }
    free(got);
  }
  for (int k = 0; k < 2; k++) {  // part outside [0, n)
    int64_t pv = k ? n : -1;
    int32_t p32 = (int32_t)pv;
    TT_OK(tpr_tensor_from_host(part, pdt == TPR_I64 ? (void *)&pv : (void *)&p32, tpr_dtype_size(pdt)));
    assert_int_equal(tpr_row_slice(tt_cpu(), x, part, n, out), TPR_ERR_INVALID_ARG);
    assert_non_null(strstr(tpr_last_error(), "part"));
  }
  free(junk);
  tpr_tensor_free(out), tpr_tensor_free(part);
}

static void test_row_slice(void **state) {
  const int64_t cases[][3] = {{7, 5, 3}, {7, 5, 4}, {5, 3, 4}, {6, 4, 3}, {4, 2, 1}, {2, 3, 5}};
  for (int i = 0; i < 6; i++) {
    const int64_t T = cases[i][0], C = cases[i][1], n = cases[i][2], s[] = {T, C}, st[] = {C, T};
    int32_t *X = malloc((size_t)(T * C) * sizeof *X), *XT = malloc((size_t)(T * C) * sizeof *XT);
    for (int64_t j = 0; j < T * C; j++) X[j] = (int32_t)tt_randint(1, 1 << 30);  // i32: any dtype
    for (int64_t r = 0; r < T; r++)
      for (int64_t c = 0; c < C; c++) XT[c * T + r] = X[r * C + c];
    tpr_tensor *x = tt_from_host(TPR_I32, 2, s, X), *xt = tt_from_host(TPR_I32, 2, st, XT);
    tpr_tensor *xv = permuted(xt, (const int[]){1, 0});  // (T, C) with strides (1, T)
    check_row_slice(x, X, T, C, n, i % 2 ? TPR_I64 : TPR_I32);
    check_row_slice(xv, X, T, C, n, i % 2 ? TPR_I32 : TPR_I64);
    free(X), free(XT);
    tpr_tensor_free(x), tpr_tensor_free(xt), tpr_tensor_free(xv);
  }
  // f32 through a program: part 1 of 3.
  float *F;
  tpr_tensor *x = tt_random_f32(tt_cpu(), 2, (const int64_t[]){8, 3}, &F), *out = tt_new(TPR_F32, 2, (const int64_t[]){3, 3});
  tpr_tensor *part = tt_from_host(TPR_I32, 1, (const int64_t[]){1}, (const int32_t[]){1});
  TT_OK(tpr_row_slice(tt_cpu(), x, part, 3, out));
  float *got = tt_to_host(out);
  assert_memory_equal(got, F + 3 * 3, 9 * sizeof *got);
  tt_check_roundtrip(build_row_slice, 2, (const tpr_tensor *const[]){x, part}, out);
  assert_int_equal(tpr_row_slice(tt_cpu(), x, part, 0, out), TPR_ERR_INVALID_ARG);  // n = 0
  free(F), free(got);
  tpr_tensor_free(x), tpr_tensor_free(out), tpr_tensor_free(part);
}

// ---------------------------------------------------------------- counts, permute, unpermute

enum { PN = 11, PH = 6, PE = 5 };

static void test_counts_permute(void **state) {
  float G[PN * PE], *X;
  random_gates(G, PN, PE, 1, 3, 2);  // expert 2 gets nothing
  memset(G + 4 * PE, 0, PE * sizeof *G);  // token 4 goes nowhere
  const int total = nnz(G, PN * PE), R = total + 3;
  const int64_t gs[] = {PN, PE}, gts[] = {PE, PN}, xs[] = {PN, PH}, rs[] = {R, PH};
  float GT[PE * PN];
  for (int t = 0; t < PN; t++)
    for (int e = 0; e < PE; e++) GT[e * PN + t] = G[t * PE + e];
  tpr_tensor *g = tt_from_host(TPR_F32, 2, gs, G), *gtt = tt_from_host(TPR_F32, 2, gts, GT);
  tpr_tensor *gv = permuted(gtt, (const int[]){1, 0}), *x = tt_random_f32(tt_cpu(), 2, xs, &X);
  // moe_counts, contiguous and strided gates.
  tpr_tensor *cnt = tt_new(TPR_I32, 1, (const int64_t[]){PE});
  for (int k = 0; k < 2; k++) {
    TT_OK(tpr_moe_counts(tt_cpu(), k ? gv : g, cnt));
    int32_t *c = tt_to_host(cnt);
    for (int e = 0; e < PE; e++) {
      int want = 0;
      for (int t = 0; t < PN; t++) want += G[t * PE + e] != 0;
      assert_int_equal(c[e], want);
    }
    assert_int_equal(c[2], 0);
    free(c);
  }
  tt_check_roundtrip(build_counts, 1, (const tpr_tensor *const[]){g}, cnt);
  // moe_permute: expert-major rows; rows past `total` keep their bytes.
  tpr_tensor *perm = tt_new(TPR_F32, 2, rs), *back = tt_new(TPR_F32, 2, xs);
  float *sentinel = malloc((size_t)R * PH * sizeof *sentinel);
  for (int i = 0; i < R * PH; i++) sentinel[i] = -777.0f;
  for (int k = 0; k < 2; k++) {
    TT_OK(tpr_tensor_from_host(perm, sentinel, tpr_tensor_nbytes(perm)));
    TT_OK(tpr_moe_permute(tt_cpu(), x, k ? gv : g, perm));
    float *P = tt_to_host(perm);
    int row = 0;
    for (int e = 0; e < PE; e++)
      for (int t = 0; t < PN; t++)
        if (G[t * PE + e] != 0) assert_memory_equal(P + (row++) * PH, X + t * PH, PH * sizeof *P);
    for (int i = total * PH; i < R * PH; i++) assert_true(P[i] == -777.0f);
    // unpermute(permute(x)) = x * (sum of the token's gates), added in f32
    // in ascending expert order: 2u per term bounds the difference.
    TT_OK(tpr_moe_unpermute(tt_cpu(), perm, k ? gv : g, back));
    float *B = tt_to_host(back);
    for (int t = 0; t < PN; t++)
      for (int j = 0; j < PH; j++) {
        double want = 0, mag = 0;
        for (int e = 0; e < PE; e++) want += (double)G[t * PE + e] * X[t * PH + j], mag += fabs(G[t * PE + e] * X[t * PH + j]);
        if (!(fabs(B[t * PH + j] - want) <= PE * 2 * U32 * mag))
          fail_msg("unpermute (%d, %d): got %.9g want %.17g", t, j, B[t * PH + j], want);
      }
    for (int j = 0; j < PH; j++) assert_true(B[4 * PH + j] == 0.0f);  // token 4: no experts
    free(P), free(B);
  }
  // Negative control: rows 0 and r of two different tokens trade places.
  float *P = tt_to_host(perm), tmp[PH];
  int row_tok[PN * PE], n_rows = 0, r = 1;
  for (int e = 0; e < PE; e++)
    for (int t = 0; t < PN; t++)
      if (G[t * PE + e] != 0) row_tok[n_rows++] = t;
  while (row_tok[r] == row_tok[0]) r++;
  memcpy(tmp, P, sizeof tmp), memcpy(P, P + r * PH, sizeof tmp), memcpy(P + r * PH, tmp, sizeof tmp);
  TT_OK(tpr_tensor_from_host(perm, P, tpr_tensor_nbytes(perm)));
  TT_OK(tpr_moe_unpermute(tt_cpu(), perm, g, back));
  float *B = tt_to_host(back);
  double bad = 0;
  for (int t = 0; t < PN; t++)
    for (int j = 0; j < PH; j++) {
      double s = 0;
      for (int e = 0; e < PE; e++) s += G[t * PE + e];
      bad = fmax(bad, fabs(B[t * PH + j] - s * X[t * PH + j]));
    }
  assert_true(bad > 1e-3);
  free(P), free(B);
  // Too few rows: an error naming the numbers, nothing written.
  tpr_tensor *small = tt_new(TPR_F32, 2, (const int64_t[]){total - 1, PH});
  float *before = tt_to_host(small);
  assert_int_equal(tpr_moe_permute(tt_cpu(), x, g, small), TPR_ERR_INVALID_ARG);
  char num[32];
  snprintf(num, sizeof num, "%d", total);
  assert_non_null(strstr(tpr_last_error(), num));
  float *after = tt_to_host(small);
  assert_memory_equal(before, after, tpr_tensor_nbytes(small));
  assert_int_equal(tpr_moe_unpermute(tt_cpu(), small, g, back), TPR_ERR_INVALID_ARG);
  // Round trips with R = total (a program's rows past the count are not defined).
  tpr_tensor *exact = tt_new(TPR_F32, 2, (const int64_t[]){total, PH});
  TT_OK(tpr_moe_permute(tt_cpu(), x, g, exact));
  permute_rows = total;
  tt_check_roundtrip(build_permute, 2, (const tpr_tensor *const[]){x, g}, exact);
  TT_OK(tpr_moe_unpermute(tt_cpu(), exact, g, back));
  tt_check_roundtrip(build_unpermute, 2, (const tpr_tensor *const[]){exact, g}, back);
  // Shape rules.
  tpr_op_attrs neg = {.n_i = 1, .i = {-1}};
  tpr_tensor d;
  assert_int_equal(tpr__op_infer(TPR_OP_MOE_PERMUTE, (const tpr_tensor *const[]){x, g}, 2, &neg, &d),
                   TPR_ERR_INVALID_ARG);
  tpr_tensor *g_short = NULL;
  TT_OK(tpr_tensor_slice(g, 0, 0, PN - 1, &g_short));
  assert_int_equal(tpr_moe_permute(tt_cpu(), x, g_short, exact), TPR_ERR_SHAPE);  // gates (N-1, E)
  assert_non_null(strstr(tpr_last_error(), "gates have"));
  tpr_tensor_free(g_short);
  assert_int_equal(tpr_moe_counts(tt_cpu(), cnt, cnt), TPR_ERR_DTYPE);
  free(X), free(sentinel), free(before), free(after);
  tpr_tensor *all[] = {g, gtt, gv, x, cnt, perm, back, small, exact};
  for (int i = 0; i < 9; i++) tpr_tensor_free(all[i]);
}

// ---------------------------------------------------------------- moe_grouped_ffn

enum { FN = 13, FH = 16, FF = 12, FE = 6, IDLE = 5 };

// The dispatcher on one process: token t belongs to source src_of[t]; each
// source's moe_permute rows are stacked in source order with its counts
// (the buffer all_to_allv would deliver), moe_grouped_ffn runs once, and each
// source's block is unpermuted back into out (FN, FH). With swap, the counts
// are shuffled (the negative control).
static void dispatch_ffn(const float *X, const float *G, const int *src_of, int nsrc, const tpr_tensor *w13,
                         const tpr_tensor *w2, bool swap, float *out) {
  float *Xd = malloc(FN * FE * FH * sizeof *Xd), Xs[FN * FH], Gs[FN * FE];
  int32_t counts[FN * FE];
  int tok[FN], off[FN + 1] = {0};
  for (int s = 0; s < nsrc; s++) {
    int n = 0;
    for (int t = 0; t < FN; t++)
      if (src_of[t] == s) {
        memcpy(Xs + n * FH, X + t * FH, FH * sizeof *Xs), memcpy(Gs + n * FE, G + t * FE, FE * sizeof *Gs);
        n++;
      }
    int tot = nnz(Gs, n * FE);
    tpr_tensor *xs = tt_from_host(TPR_F32, 2, (const int64_t[]){n, FH}, Xs);
    tpr_tensor *gs = tt_from_host(TPR_F32, 2, (const int64_t[]){n, FE}, Gs);
    tpr_tensor *ps = tt_new(TPR_F32, 2, (const int64_t[]){tot, FH}), *cs = tt_new(TPR_I32, 1, (const int64_t[]){FE});
    TT_OK(tpr_moe_permute(tt_cpu(), xs, gs, ps));
    TT_OK(tpr_moe_counts(tt_cpu(), gs, cs));
    TT_OK(tpr_tensor_to_host(ps, Xd + off[s] * FH, tpr_tensor_nbytes(ps)));
    TT_OK(tpr_tensor_to_host(cs, counts + s * FE, tpr_tensor_nbytes(cs)));
    off[s + 1] = off[s] + tot;
    tpr_tensor_free(xs), tpr_tensor_free(gs), tpr_tensor_free(ps), tpr_tensor_free(cs);
  }
  if (swap) {  // reverse the counts; if that changes nothing, rotate them by one
    int32_t orig[FN * FE];
    const int L = nsrc * FE;
    memcpy(orig, counts, (size_t)L * sizeof *counts);
    for (int i = 0; i < L; i++) counts[i] = orig[L - 1 - i];
    if (!memcmp(orig, counts, (size_t)L * sizeof *counts))
      for (int i = 0; i < L; i++) counts[i] = orig[(i + 1) % L];
    assert_true(memcmp(orig, counts, (size_t)L * sizeof *counts) != 0);  // IDLE's 0 among nonzero counts
  }
  const int R = off[nsrc];
  tpr_tensor *xd = tt_from_host(TPR_F32, 2, (const int64_t[]){R, FH}, Xd), *y = tt_new(TPR_F32, 2, (const int64_t[]){R, FH});
  tpr_tensor *cd = tt_from_host(TPR_I32, 1, (const int64_t[]){nsrc * FE}, counts);
  TT_OK(tpr_moe_grouped_ffn(tt_cpu(), xd, cd, w13, w2, y));
  float *Y = tt_to_host(y);
  for (int s = 0; s < nsrc; s++) {
    int n = 0, tot = off[s + 1] - off[s];
    for (int t = 0; t < FN; t++)
      if (src_of[t] == s) tok[n] = t, memcpy(Gs + (n++) * FE, G + t * FE, FE * sizeof *Gs);
    tpr_tensor *ys = tt_from_host(TPR_F32, 2, (const int64_t[]){tot, FH}, Y + off[s] * FH);
    tpr_tensor *gs = tt_from_host(TPR_F32, 2, (const int64_t[]){n, FE}, Gs), *os = tt_new(TPR_F32, 2, (const int64_t[]){n, FH});
    TT_OK(tpr_moe_unpermute(tt_cpu(), ys, gs, os));
    float *O = tt_to_host(os);
    for (int i = 0; i < n; i++) memcpy(out + tok[i] * FH, O + i * FH, FH * sizeof *out);
    free(O);
    tpr_tensor_free(ys), tpr_tensor_free(gs), tpr_tensor_free(os);
  }
  free(Xd), free(Y);
  tpr_tensor_free(xd), tpr_tensor_free(y), tpr_tensor_free(cd);
}

static void test_grouped_ffn(void **state) {
  const int64_t xs[] = {FN, FH}, gs[] = {FN, FE}, w13s[] = {FE, 2 * FF, FH}, w2s[] = {FE, FH, FF};
  float *X, *W13, *W2, G[FN * FE];
  tpr_tensor *x = tt_random_f32(tt_cpu(), 2, xs, &X), *w13 = tt_random_f32(tt_cpu(), 3, w13s, &W13);
  tpr_tensor *w2 = tt_random_f32(tt_cpu(), 3, w2s, &W2);
  // The IDLE expert gets no rows: NaN weights would show if it ran.
  for (int i = 0; i < 2 * FF * FH; i++) W13[IDLE * 2 * FF * FH + i] = NAN;
  for (int i = 0; i < FH * FF; i++) W2[IDLE * FH * FF + i] = NAN;
  TT_OK(tpr_tensor_from_host(w13, W13, tpr_tensor_nbytes(w13)));
  TT_OK(tpr_tensor_from_host(w2, W2, tpr_tensor_nbytes(w2)));
  random_gates(G, FN, FE, 1, 3, IDLE);
  memset(G + 7 * FE, 0, FE * sizeof *G);  // a token routed nowhere
  tpr_tensor *g = tt_from_host(TPR_F32, 2, gs, G), *ref = tt_new(TPR_F32, 2, xs);
  TT_OK(tpr_moe_experts(tt_cpu(), x, g, w13, w2, ref));
  float *want = tt_to_host(ref), got[FN * FH];
  double dwant[FN * FH];
  for (int i = 0; i < FN * FH; i++) dwant[i] = want[i];
  // One source, and 3 sources of contiguous token blocks: every expert sees
  // the same rows in the same order as moe_experts, so the result is the same
  // bit for bit. 3 interleaved sources reorder rows within an expert's GEMM:
  // 1e-5 of the output's scale.
  int one[FN] = {0}, blocks[FN], inter[FN];
  for (int t = 0; t < FN; t++) blocks[t] = t < 4 ? 0 : t < 9 ? 1 : 2, inter[t] = t % 3;
  dispatch_ffn(X, G, one, 1, w13, w2, false, got);
  assert_memory_equal(got, want, sizeof got);
  dispatch_ffn(X, G, blocks, 3, w13, w2, false, got);
  assert_memory_equal(got, want, sizeof got);
  dispatch_ffn(X, G, inter, 3, w13, w2, false, got);
  assert_true(rel_err(got, dwant, FN * FH) <= 1e-5);
  // Negative controls: counts out of place send rows to the wrong experts
  // (or to IDLE, whose NaN weights rel_err reports as infinite).
  dispatch_ffn(X, G, inter, 3, w13, w2, true, got);
  assert_true(rel_err(got, dwant, FN * FH) > 1e-2);
  dispatch_ffn(X, G, one, 1, w13, w2, true, got);
  assert_true(rel_err(got, dwant, FN * FH) > 1e-2);
  // Strided weights: w13 a permuted (2F, H, E) buffer (no unit inner stride:
  // the copy path), w2 a transposed (E, F, H) buffer (column-major experts).
  float *P13 = malloc(sizeof(float) * FE * 2 * FF * FH), *P2 = malloc(sizeof(float) * FE * FH * FF);
  for (int e = 0; e < FE; e++)
    for (int r = 0; r < 2 * FF; r++)
      for (int h = 0; h < FH; h++) P13[(r * FH + h) * FE + e] = W13[(e * 2 * FF + r) * FH + h];
  for (int e = 0; e < FE; e++)
    for (int h = 0; h < FH; h++)
      for (int f = 0; f < FF; f++) P2[(e * FF + f) * FH + h] = W2[(e * FH + h) * FF + f];
  tpr_tensor *b13 = tt_from_host(TPR_F32, 3, (const int64_t[]){2 * FF, FH, FE}, P13);
  tpr_tensor *b2 = tt_from_host(TPR_F32, 3, (const int64_t[]){FE, FF, FH}, P2);
  tpr_tensor *v13 = permuted(b13, (const int[]){2, 0, 1}), *v2 = permuted(b2, (const int[]){0, 2, 1});
  dispatch_ffn(X, G, inter, 3, v13, v2, false, got);
  assert_true(rel_err(got, dwant, FN * FH) <= 1e-5);
  TT_OK(tpr_moe_experts(tt_cpu(), x, g, v13, v2, ref));
  float *want_v = tt_to_host(ref);
  dispatch_ffn(X, G, one, 1, v13, v2, false, got);
  assert_memory_equal(got, want_v, sizeof got);  // same weight paths, same rows: same bits
  // Rows past the counted ones are not written; round trip with R = total.
  const int total = nnz(G, FN * FE), R = total + 2;
  tpr_tensor *cnt = tt_new(TPR_I32, 1, (const int64_t[]){FE}), *xd = tt_new(TPR_F32, 2, (const int64_t[]){R, FH});
  tpr_tensor *y = tt_new(TPR_F32, 2, (const int64_t[]){R, FH});
  TT_OK(tpr_moe_counts(tt_cpu(), g, cnt));
  TT_OK(tpr_moe_permute(tt_cpu(), x, g, xd));
  float *sent = malloc((size_t)R * FH * sizeof *sent);
  for (int i = 0; i < R * FH; i++) sent[i] = 555.0f;
  TT_OK(tpr_tensor_from_host(y, sent, tpr_tensor_nbytes(y)));
  TT_OK(tpr_moe_grouped_ffn(tt_cpu(), xd, cnt, w13, w2, y));
  float *Y = tt_to_host(y);
  for (int i = total * FH; i < R * FH; i++) assert_true(Y[i] == 555.0f);
  for (int i = 0; i < total * FH; i++) assert_true(isfinite(Y[i]));
  tpr_tensor *xe = tt_new(TPR_F32, 2, (const int64_t[]){total, FH}), *ye = tt_new(TPR_F32, 2, (const int64_t[]){total, FH});
  TT_OK(tpr_moe_permute(tt_cpu(), x, g, xe));
  TT_OK(tpr_moe_grouped_ffn(tt_cpu(), xe, cnt, w13, w2, ye));
  tt_check_roundtrip(build_grouped, 4, (const tpr_tensor *const[]){xe, cnt, w13, w2}, ye);
  // Bad counts: negative, or adding up past R (data: INVALID_ARG); a length
  // that is no multiple of Er, or i64 (rule: SHAPE, DTYPE).
  int32_t bad[2 * FE];
  for (int k = 0; k < 2; k++) {
    for (int e = 0; e < 2 * FE; e++) bad[e] = 1;
    bad[FE + 2] = k ? R : -1;
    tpr_tensor *bc = tt_from_host(TPR_I32, 1, (const int64_t[]){2 * FE}, bad);
    assert_int_equal(tpr_moe_grouped_ffn(tt_cpu(), xd, bc, w13, w2, y), TPR_ERR_INVALID_ARG);
    assert_non_null(strstr(tpr_last_error(), k ? "past" : "negative"));
    assert_non_null(strstr(tpr_last_error(), "source 1, expert 2"));
    tpr_tensor_free(bc);
  }
  tpr_tensor *c7 = tt_new(TPR_I32, 1, (const int64_t[]){FE + 1}), *c64 = tt_new(TPR_I64, 1, (const int64_t[]){FE});
  assert_int_equal(tpr_moe_grouped_ffn(tt_cpu(), xd, c7, w13, w2, y), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "multiple"));
  assert_int_equal(tpr_moe_grouped_ffn(tt_cpu(), xd, c64, w13, w2, y), TPR_ERR_DTYPE);
  assert_int_equal(tpr_moe_grouped_ffn(tt_cpu(), xd, cnt, w13, w13, y), TPR_ERR_SHAPE);
  free(X), free(W13), free(W2), free(want), free(want_v), free(P13), free(P2), free(sent), free(Y);
  tpr_tensor *all[] = {x, w13, w2, g, ref, b13, b2, v13, v2, cnt, xd, y, xe, ye, c7, c64};
  for (int i = 0; i < 16; i++) tpr_tensor_free(all[i]);
}

// ---------------------------------------------------------------- moe_experts on threads

// bf16 experts (the engine's row-major layout) on more than one thread run
// one expert a thread (moe_experts_spread in moe/cpu.c): the same bits as
// the serial loop on one thread, for 2 and 3 threads, 1 to 40 tokens; and
// both within 1e-5 of a double reference. An idle expert holds NaN weights
// (it must not run); a token routed nowhere gets zeros. Negative control:
// swapping two experts' gates moves the output past the bound.
static tpr_tensor *on_backend(tpr_backend *be, tpr_dtype dt, int nd, const int64_t *shape, const void *host) {
  tpr_tensor *t = NULL;
  TT_OK(tpr_tensor_new(be, dt, nd, shape, &t));
  if (host) TT_OK(tpr_tensor_from_host(t, host, tpr_tensor_nbytes(t)));
  return t;
}

static void test_experts_spread_bf16(void **state) {
  enum { E = 7, H = 40, F = 24, IDLE_E = 4 };
  // Backends of 1, 2 and 3 threads, then the same with bf16 activations.
  tpr_backend *be[6] = {NULL};
  for (int i = 0; i < 6; i++) TT_OK(tpr_backend_cpu_new(&(tpr_cpu_options){.n_threads = i % 3 + 1}, &be[i]));
  for (int i = 3; i < 6; i++) TT_OK(tpr_backend_cpu_set_bf16_activations(be[i], true));
  uint16_t *W13 = malloc(sizeof(uint16_t) * E * 2 * F * H), *W2 = malloc(sizeof(uint16_t) * E * H * F);
  for (int i = 0; i < E * 2 * F * H; i++) W13[i] = tpr_f32_to_bf16((float)(tt_normal() * 0.2));
  for (int i = 0; i < E * H * F; i++) W2[i] = tpr_f32_to_bf16((float)(tt_normal() * 0.2));
  for (int i = 0; i < 2 * F * H; i++) W13[IDLE_E * 2 * F * H + i] = 0x7fc0;  // NaN
  for (int i = 0; i < H * F; i++) W2[IDLE_E * H * F + i] = 0x7fc0;
  // From decode (one row an expert) to 120 tokens (about 40 rows an expert).
  static const int Ts[] = {1, 2, 5, 40, 120};
  double worst = 0, control = 0, worst16 = 0;
  for (size_t c = 0; c < sizeof Ts / sizeof Ts[0]; c++) {
    const int T = Ts[c];
    float *X = malloc(sizeof(float) * T * H), *G = malloc(sizeof(float) * T * E);
    tt_fill_normal(X, (size_t)(T * H), 1.0);
    random_gates(G, T, E, 1, 3, IDLE_E);
    if (T > 2) memset(G + 1 * E, 0, E * sizeof *G);  // a token routed nowhere
    float *out[6];
    for (int i = 0; i < 6; i++) {
      tpr_tensor *x = on_backend(be[i], TPR_F32, 2, (const int64_t[]){T, H}, X);
      tpr_tensor *g = on_backend(be[i], TPR_F32, 2, (const int64_t[]){T, E}, G);
      tpr_tensor *w13 = on_backend(be[i], TPR_BF16, 3, (const int64_t[]){E, 2 * F, H}, W13);
      tpr_tensor *w2 = on_backend(be[i], TPR_BF16, 3, (const int64_t[]){E, H, F}, W2);
      tpr_tensor *o = on_backend(be[i], TPR_F32, 2, (const int64_t[]){T, H}, NULL);
      TT_OK(tpr_moe_experts(be[i], x, g, w13, w2, o));
      out[i] = tt_to_host(o);
      tpr_tensor_free(x), tpr_tensor_free(g), tpr_tensor_free(w13), tpr_tensor_free(w2), tpr_tensor_free(o);
    }
    for (int i = 1; i < 6; i++) assert_memory_equal(out[i], out[i < 3 ? 0 : 3], sizeof(float) * T * H);
    // The double reference, and the same with experts 0 and 1's gates swapped.
    double *want = calloc((size_t)(T * H), sizeof *want), *swapped = calloc((size_t)(T * H), sizeof *swapped);
    for (int t = 0; t < T; t++)
      for (int e = 0; e < E; e++) {
        for (int s = 0; s < 2; s++) {
          int ge = s == 0 ? e : e == 0 ? 1 : e == 1 ? 0 : e;
          double gate = G[t * E + ge];
          if (gate == 0) continue;
          double act[F];
          for (int f = 0; f < F; f++) {
            double h1 = 0, h3 = 0;
            for (int k = 0; k < H; k++) {
              h1 += tpr_bf16_to_f32(W13[(e * 2 * F + f) * H + k]) * (double)X[t * H + k];
              h3 += tpr_bf16_to_f32(W13[(e * 2 * F + F + f) * H + k]) * (double)X[t * H + k];
            }
            act[f] = h1 / (1 + exp(-h1)) * h3;
          }
          for (int k = 0; k < H; k++) {
            double y = 0;
            for (int f = 0; f < F; f++) y += tpr_bf16_to_f32(W2[(e * H + k) * F + f]) * act[f];
            (s == 0 ? want : swapped)[t * H + k] += gate * y;
          }
        }
      }
    double r = rel_err(out[0], want, (size_t)(T * H));
    float *sw = malloc(sizeof(float) * T * H);
    for (int i = 0; i < T * H; i++) sw[i] = (float)swapped[i];
    double cr = rel_err(sw, want, (size_t)(T * H));
    if (r > worst) worst = r;
    if (T == 40) control = cr;  // every expert but IDLE_E has tokens there
    if (T > 2)
      for (int k = 0; k < H; k++) assert_true(out[0][1 * H + k] == 0.0f);
    float *a16 = out[3];  // bf16 activations: rounded to 8 mantissa bits, close to the exact products
    double r16 = rel_err(a16, want, (size_t)(T * H));
    if (r16 > worst16) worst16 = r16;
    for (int i = 0; i < 6; i++) free(out[i]);
    free(X), free(G), free(want), free(swapped), free(sw);
  }
  printf("moe_experts, bf16 experts: 1, 2 and 3 threads give the same bits, with f32 and with bf16 activations; vs "
         "double %.3g (<= 1e-5), with bf16 activations %.3g (<= 2e-2); 40 tokens with experts 0 and 1's gates "
         "swapped: %.3g (> 1e-2)\n", worst, worst16, control);
  assert_true(worst <= 1e-5);
  assert_true(worst16 > 0 && worst16 <= 2e-2);
  assert_true(control > 1e-2);
  free(W13), free(W2);
  for (int i = 0; i < 6; i++) tpr_backend_free(be[i]);
}

// The same spread over threads for f32 experts, forward and backward (the
// training path): moe_experts and moe_experts_bwd on backends of 1, 2 and 3
// threads give the same bits (one thread runs the serial loops), the
// backward's dgates are 0 exactly where the gates are, and the idle expert's
// weight gradients are 0 (the output starts as NaN: the kernel writes each
// slot, the idle expert's too, without clearing the whole output first).
static void test_experts_spread_f32_bwd(void **state) {
  enum { T = 33, E = 6, H = 24, F = 20, IDLE_E = 2 };
  tpr_backend *be[3] = {NULL};
  for (int i = 0; i < 3; i++) TT_OK(tpr_backend_cpu_new(&(tpr_cpu_options){.n_threads = i + 1}, &be[i]));
  float *X = malloc(sizeof(float) * T * H), *G = malloc(sizeof(float) * T * E), *DY = malloc(sizeof(float) * T * H);
  float *W13 = malloc(sizeof(float) * E * 2 * F * H), *W2 = malloc(sizeof(float) * E * H * F);
  tt_fill_normal(X, T * H, 1.0), tt_fill_normal(DY, T * H, 1.0);
  tt_fill_normal(W13, E * 2 * F * H, 0.2), tt_fill_normal(W2, E * H * F, 0.2);
  random_gates(G, T, E, 1, 3, IDLE_E);
  const int64_t packed = T * H + T * E + E * 2 * F * H + E * H * F;
  float *fwd[3], *bwd[3], *poison = malloc(sizeof(float) * packed);
  for (int64_t i = 0; i < packed; i++) poison[i] = NAN;
  for (int i = 0; i < 3; i++) {
    tpr_tensor *x = on_backend(be[i], TPR_F32, 2, (const int64_t[]){T, H}, X);
    tpr_tensor *g = on_backend(be[i], TPR_F32, 2, (const int64_t[]){T, E}, G);
    tpr_tensor *dy = on_backend(be[i], TPR_F32, 2, (const int64_t[]){T, H}, DY);
    tpr_tensor *w13 = on_backend(be[i], TPR_F32, 3, (const int64_t[]){E, 2 * F, H}, W13);
    tpr_tensor *w2 = on_backend(be[i], TPR_F32, 3, (const int64_t[]){E, H, F}, W2);
    tpr_tensor *o = on_backend(be[i], TPR_F32, 2, (const int64_t[]){T, H}, NULL);
    tpr_tensor *p = on_backend(be[i], TPR_F32, 1, (const int64_t[]){packed}, poison);  // every slot must be written
    TT_OK(tpr_moe_experts(be[i], x, g, w13, w2, o));
    const tpr_tensor *in[5] = {x, g, w13, w2, dy};
    TT_OK(tpr_op_run(be[i], TPR_OP_MOE_EXPERTS_BWD, in, 5, NULL, p));
    fwd[i] = tt_to_host(o), bwd[i] = tt_to_host(p);
    tpr_tensor_free(x), tpr_tensor_free(g), tpr_tensor_free(dy), tpr_tensor_free(w13), tpr_tensor_free(w2);
    tpr_tensor_free(o), tpr_tensor_free(p);
  }
  for (int i = 1; i < 3; i++) {
    assert_memory_equal(fwd[i], fwd[0], sizeof(float) * T * H);
    assert_memory_equal(bwd[i], bwd[0], sizeof(float) * packed);
  }
  const float *dg = bwd[0] + T * H, *dw13 = dg + T * E, *dw2 = dw13 + E * 2 * F * H;
  int nonzero = 0;
  for (int i = 0; i < T * E; i++) {
    if (G[i] == 0) assert_true(dg[i] == 0.0f);
    nonzero += dg[i] != 0.0f;
  }
  for (int i = 0; i < 2 * F * H; i++) assert_true(dw13[IDLE_E * 2 * F * H + i] == 0.0f);
  for (int i = 0; i < H * F; i++) assert_true(dw2[IDLE_E * H * F + i] == 0.0f);
  assert_true(nonzero == nnz(G, T * E));
  printf("moe_experts and moe_experts_bwd, f32 experts: 1, 2 and 3 threads give the same bits (%d routed pairs)\n",
         nonzero);
  for (int i = 0; i < 3; i++) free(fwd[i]), free(bwd[i]), tpr_backend_free(be[i]);
  free(X), free(G), free(DY), free(W13), free(W2), free(poison);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capacity_hand),  cmocka_unit_test(test_capacity_random),
      cmocka_unit_test(test_row_slice),      cmocka_unit_test(test_counts_permute),
      cmocka_unit_test(test_grouped_ffn),    cmocka_unit_test(test_experts_spread_bf16),
      cmocka_unit_test(test_experts_spread_f32_bwd),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(tt_cpu());
  return rc;
}
