// Model ops of the MiniMax-M2 tensor-parallel forward against double-
// precision references written here: sum_squares + rms_scale (the
// distributed QK-norm), embedding_shard, router_sigmoid_topk and moe_experts
// (rope, attention and cache_write are in test_ops_attention.c). Fresh random
// inputs each run (seed printed; rerun with TPR_TEST_SEED=...). Each op also
// runs once through a program that is serialized and deserialized first.
//
// Bounds are first-order rounding analyses in units of u = 2^-24, checked
// per element where the analysis gives one. Negative controls show that the
// comparisons can fail on the bugs they guard against.
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define U32 0x1p-24

static tpr_tensor *view_slice(const tpr_tensor *t, int dim, int64_t start, int64_t len) {
  tpr_tensor *v = NULL;
  TT_OK(tpr_tensor_slice(t, dim, start, len, &v));
  return v;
}

// ---------------------------------------------------------------- program round trip


static tpr_status build_sum_squares(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_sum_squares(p, in[0], out);
}
static tpr_status build_rms_scale(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_rms_scale(p, in[0], in[1], in[2], 48.0f, 1e-6f, out);
}
static tpr_status build_embedding_shard(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_embedding_shard(p, in[0], in[1], in[2], out);
}
static tpr_status build_router(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_router_sigmoid_topk(p, in[0], in[1], 4, out);
}
static tpr_status build_moe(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_moe_experts(p, in[0], in[1], in[2], in[3], out);
}

// ---------------------------------------------------------------- sum_squares, rms_scale

// Bound 2u per element: the double sum of N positive terms is off by at most
// N 2^-53 relative, far below the final rounding to f32 (u).
static void check_sum_squares(const tpr_tensor *x, const float *X, int64_t rows, int64_t N) {
  int64_t os[TPR_MAX_DIMS];
  memcpy(os, x->shape, sizeof os);
  os[x->ndim - 1] = 1;
  tpr_tensor *out = tt_new(TPR_F32, x->ndim, os);
  TT_OK(tpr_sum_squares(tt_cpu(), x, out));
  float *got = tt_to_host(out);
  for (int64_t r = 0; r < rows; r++) {
    double want = 0;
    for (int64_t i = 0; i < N; i++) want += (double)X[r * N + i] * X[r * N + i];
    if (!(fabs(got[r] - want) <= 2 * U32 * want))
      fail_msg("sum_squares N=%lld row %lld: got %.9g want %.17g", (long long)N, (long long)r, got[r], want);
  }
  free(got);
  tpr_tensor_free(out);
}

static void test_sum_squares(void **state) {
  const int64_t Ns[] = {1, 7, 64, 1000};
  for (int k = 0; k < 4; k++) {
    const int64_t N = Ns[k], s[] = {3, 4, N}, ps[] = {N, 6};
    float *X, *P, *XT = malloc(6 * N * sizeof *XT);
    tpr_tensor *x = tt_random_f32(tt_cpu(), 3, s, &X);
    check_sum_squares(x, X, 12, N);
    // Strided rows: (N, 6) transposed to (6, N).
    tpr_tensor *pt = tt_random_f32(tt_cpu(), 2, ps, &P), *xt = NULL;
    TT_OK(tpr_tensor_transpose(pt, 0, 1, &xt));
    for (int64_t r = 0; r < 6; r++)
      for (int64_t i = 0; i < N; i++) XT[r * N + i] = P[i * 6 + r];
    check_sum_squares(xt, XT, 6, N);
    if (k == 2) {
      const int64_t os[] = {3, 4, 1};
      tpr_tensor *out = tt_new(TPR_F32, 3, os);
      TT_OK(tpr_sum_squares(tt_cpu(), x, out));
      tt_check_roundtrip(build_sum_squares, 1, (const tpr_tensor *const[]){x}, out);
      tpr_tensor_free(out);
    }
    free(X), free(P), free(XT);
    tpr_tensor_free(x), tpr_tensor_free(pt), tpr_tensor_free(xt);
  }
}

// The distributed QK-norm of docs/architecture.md section 5 on 2 "ranks": each sums
// squares over its column slice of xg (T, G), the partial sums are added (the
// tp all-reduce), and each scales its slice with divisor G. The result must
// be the full-row RMSNorm. Bound 8u per element, relative to |x inv w|: the
// two partials and their sum 2u, / divisor and + eps 2u, sqrt halves that
// and adds u, 1/ u, x * inv and * w 2u.
static void test_rms_scale_distributed(void **state) {
  enum { T = 5, G = 48, N = 24 };
  const float eps = 1e-6f;
  const int64_t xs[] = {T, G}, ws[] = {G, 2}, ss[] = {T, 1}, ls[] = {T, N};
  float *X, *W2, W[G];
  tpr_tensor *xg = tt_random_f32(tt_cpu(), 2, xs, &X), *w2 = tt_random_f32(tt_cpu(), 2, ws, &W2);
  // weight (G) with stride 2: column 1 of w2, made 1-D by hand (no API
  // reshapes a strided view).
  tpr_tensor *w = view_slice(w2, 1, 1, 1);
  w->ndim = 1;
  for (int i = 0; i < G; i++) W[i] = W2[2 * i + 1];
  tpr_tensor *part[2], *xl[2], *wl[2], *out[2], *bad = tt_new(TPR_F32, 2, ls), *sum = tt_new(TPR_F32, 2, ss);
  for (int r = 0; r < 2; r++) {
    xl[r] = view_slice(xg, 1, r * N, N);  // strided: row stride G
    wl[r] = view_slice(w, 0, r * N, N);
    part[r] = tt_new(TPR_F32, 2, ss);
    out[r] = tt_new(TPR_F32, 2, ls);
    TT_OK(tpr_sum_squares(tt_cpu(), xl[r], part[r]));
  }
  TT_OK(tpr_add(tt_cpu(), part[0], part[1], sum));
  double worst = 0, bad_err = 0;
  for (int r = 0; r < 2; r++) {
    TT_OK(tpr_rms_scale(tt_cpu(), xl[r], sum, wl[r], (float)G, eps, out[r]));
    // Negative control: the per-rank divisor N (the bug section 5 warns about).
    TT_OK(tpr_rms_scale(tt_cpu(), xl[r], sum, wl[r], (float)N, eps, bad));
    float *got = tt_to_host(out[r]), *gb = tt_to_host(bad);
    for (int t = 0; t < T; t++) {
      double s = 0;
      for (int i = 0; i < G; i++) s += (double)X[t * G + i] * X[t * G + i];
      double inv = 1.0 / sqrt(s / G + eps);
      for (int i = 0; i < N; i++) {
        int c = r * N + i;
        double want = X[t * G + c] * inv * W[c], err = fabs(got[t * N + i] - want);
        if (!(err <= 8 * U32 * fabs(want)))
          fail_msg("rms_scale rank %d (%d, %d): got %.9g want %.17g", r, t, i, got[t * N + i], want);
        worst = fmax(worst, err / fmax(fabs(want), 1e-30));
        bad_err = fmax(bad_err, fabs(gb[t * N + i] - want) / fmax(fabs(want), 1e-30));
      }
    }
    free(got), free(gb);
  }
  assert_true(worst <= 8 * U32);
  assert_true(bad_err > 0.2);  // sqrt(2) - 1 relative
  // Program round trip on the contiguous row block of rank 0.
  tpr_tensor *xc = tt_new(TPR_F32, 2, ls), *wc = tt_new(TPR_F32, 1, (const int64_t[]){N});
  TT_OK(tpr_cast(tt_cpu(), xl[0], xc));
  TT_OK(tpr_cast(tt_cpu(), wl[0], wc));
  TT_OK(tpr_rms_scale(tt_cpu(), xc, sum, wc, 48.0f, 1e-6f, bad));
  tt_check_roundtrip(build_rms_scale, 3, (const tpr_tensor *const[]){xc, sum, wc}, bad);
  // Shape rule: sumsq must have x's leading dims and a last dim of 1.
  assert_int_equal(tpr_rms_scale(tt_cpu(), xc, xc, wc, 48.0f, eps, bad), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "sumsq"));
  assert_int_equal(tpr_rms_scale(tt_cpu(), xc, sum, wc, 0.0f, eps, bad), TPR_ERR_INVALID_ARG);
  for (int r = 0; r < 2; r++) {
    tpr_tensor *all[] = {part[r], xl[r], wl[r], out[r]};
    for (int i = 0; i < 4; i++) tpr_tensor_free(all[i]);
  }
  tpr_tensor *all[] = {xg, w2, w, bad, sum, xc, wc};
  for (int i = 0; i < 7; i++) tpr_tensor_free(all[i]);
  free(X), free(W2);
}

// ---------------------------------------------------------------- embedding_shard

// Vocab V = 3 shards of Vl rows. Exact: rows are copied bytes, other
// shards' ids give zeros, and the sum over shards is the full embedding.
// The shard comes from a slice of a "rank tensor" whose value is changed
// in place between calls: nothing but the tensor's contents selects it.
static void test_embedding_shard(void **state) {
  enum { Vl = 5, NS = 3, H = 6, NI = 8 };
  const int64_t fs[] = {NS * Vl, H}, ts[] = {Vl, H}, is[] = {2, 4}, os[] = {2, 4, H}, rs[] = {4};
  float *full;
  tpr_tensor *ft = tt_random_f32(tt_cpu(), 2, fs, &full);
  int64_t v[NI];
  for (int i = 0; i < NI; i++) v[i] = tt_randint(0, NS * Vl - 1);
  v[0] = 0, v[1] = Vl, v[2] = NS * Vl - 1, v[3] = 1000;  // shard edges, and an id past the vocab
  for (int k = 0; k < 2; k++) {
    tpr_dtype idt = k ? TPR_I64 : TPR_I32;
    void *ih = malloc(NI * 8);
    for (int i = 0; i < NI; i++) k ? (((int64_t *)ih)[i] = v[i]) : (((int32_t *)ih)[i] = (int32_t)v[i]);
    tpr_tensor *ids = tt_from_host(idt, 2, is, ih);
    int32_t rank_h[4] = {7, 9, 0, NS};  // (dp_rank, dp_size, tp_rank, tp_size)
    tpr_tensor *rank = tt_from_host(TPR_I32, 1, rs, rank_h), *shard = view_slice(rank, 0, 2, 1);
    float *sum = calloc(NI * H, sizeof *sum), *prev = NULL;
    for (int s = 0; s < NS; s++) {
      rank_h[2] = s;
      TT_OK(tpr_tensor_from_host(rank, rank_h, sizeof rank_h));
      tpr_tensor *table = view_slice(ft, 0, s * Vl, Vl), *out = tt_new(TPR_F32, 3, os);
      TT_OK(tpr_embedding_shard(tt_cpu(), table, ids, shard, out));
      float *got = tt_to_host(out);
      for (int p = 0; p < NI; p++) {
        bool mine = v[p] >= s * Vl && v[p] < (s + 1) * Vl;
        for (int j = 0; j < H; j++) {
          float want = mine ? full[v[p] * H + j] : 0.0f;
          if (memcmp(&got[p * H + j], &want, 4)) fail_msg("shard %d id %lld col %d", s, (long long)v[p], j);
          sum[p * H + j] += got[p * H + j];
        }
      }
      if (prev) assert_true(memcmp(prev, got, NI * H * 4) != 0);  // another shard value, other output
      if (s == 1 && k == 0) {  // round trip with a contiguous table
        tpr_tensor *tc = tt_new(TPR_F32, 2, ts);
        TT_OK(tpr_cast(tt_cpu(), table, tc));
        tt_check_roundtrip(build_embedding_shard, 3, (const tpr_tensor *const[]){tc, ids, shard}, out);
        tpr_tensor_free(tc);
      }
      free(prev);
      prev = got;
      tpr_tensor_free(table), tpr_tensor_free(out);
    }
    for (int p = 0; p < NI; p++)
      for (int j = 0; j < H; j++)
        assert_true(sum[p * H + j] == (v[p] < NS * Vl ? full[v[p] * H + j] : 0.0f));
    free(prev), free(sum), free(ih);
    tpr_tensor_free(ids), tpr_tensor_free(shard), tpr_tensor_free(rank);
  }
  // A negative id fails naming its position and writes nothing.
  const int64_t n3 = 3;
  int32_t bad[3] = {2, 4, -3}, one = 0;
  float guard[3 * H];
  for (int i = 0; i < 3 * H; i++) guard[i] = -7.5f;
  tpr_tensor *ids = tt_from_host(TPR_I32, 1, &n3, bad), *shard = tt_from_host(TPR_I32, 1, (const int64_t[]){1}, &one);
  tpr_tensor *table = view_slice(ft, 0, 0, Vl), *out = NULL;
  TT_OK(tpr_tensor_wrap(tt_cpu(), TPR_F32, 2, (const int64_t[]){3, H}, guard, &out));
  assert_int_equal(tpr_embedding_shard(tt_cpu(), table, ids, shard, out), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "token id -3 at position 2 is negative"));
  for (int i = 0; i < 3 * H; i++) assert_true(guard[i] == -7.5f);
  tpr_tensor_free(ids), tpr_tensor_free(shard), tpr_tensor_free(table), tpr_tensor_free(out), tpr_tensor_free(ft);
  free(full);
}

// ---------------------------------------------------------------- router_sigmoid_topk

enum { RT = 64, RE = 16, RK = 4 };

// Chosen set (mask) of the k largest of score[E] (strict >, so ties keep the
// lower index), and the gap between the k-th and (k+1)-th largest.
static double topk_mask(const double *score, int E, int k, bool *mask) {
  double kth = INFINITY, next = -INFINITY;
  for (int e = 0; e < E; e++) mask[e] = false;
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++)
      if (!mask[e] && (best < 0 || score[e] > score[best])) best = e;
    mask[best] = true;
    kth = score[best];
  }
  for (int e = 0; e < E; e++)
    if (!mask[e] && score[e] > next) next = score[e];
  return kth - next;
}

// Weights bound (k + 8)u per chosen entry: sigmoid (expf <= 2u, 1 + e, 1/)
// 4u, the k-term sum k u, the division u. Unchosen entries are exactly 0.
static void test_router(void **state) {
  const int64_t ls[] = {RT, RE}, bs[] = {RE};
  float L[RT * RE], B[RE];
  tt_fill_normal(B, RE, 0.3);
  double s[RE], sc[RE];
  bool mask[RE], plain[RE];
  for (int t = 0; t < RT; t++) {
    do {  // redraw rows whose k-th and (k+1)-th scores nearly tie: f32 vs double could pick differently
      tt_fill_normal(L + t * RE, RE, 2.0);
      for (int e = 0; e < RE; e++) s[e] = 1 / (1 + exp(-(double)L[t * RE + e])), sc[e] = s[e] + B[e];
    } while (topk_mask(sc, RE, RK, mask) < 1e-4);
  }
  // Last row: all tied at sigmoid(0) = 1/2 exactly (so 1/k is exact), no bias below.
  for (int e = 0; e < RE; e++) L[(RT - 1) * RE + e] = 0.0f;
  float Bz[RE] = {0};
  tpr_tensor *lg = tt_from_host(TPR_F32, 2, ls, L), *bias = tt_from_host(TPR_F32, 1, bs, B), *out = tt_new(TPR_F32, 2, ls);
  tpr_tensor *zb = tt_from_host(TPR_F32, 1, bs, Bz), *tied = view_slice(lg, 0, RT - 1, 1);
  tpr_tensor *tout = tt_new(TPR_F32, 2, (const int64_t[]){1, RE});
  TT_OK(tpr_router_sigmoid_topk(tt_cpu(), lg, bias, RK, out));
  float *got = tt_to_host(out);
  int changed = 0;
  double bias_in_weights = 0;
  for (int t = 0; t < RT - 1; t++) {
    double sum = 0, bsum = 0, rsum = 0;
    for (int e = 0; e < RE; e++) s[e] = 1 / (1 + exp(-(double)L[t * RE + e])), sc[e] = s[e] + B[e];
    topk_mask(sc, RE, RK, mask);
    topk_mask(s, RE, RK, plain);
    changed += memcmp(mask, plain, sizeof mask) != 0;
    for (int e = 0; e < RE; e++) sum += mask[e] ? s[e] : 0, bsum += mask[e] ? sc[e] : 0;
    for (int e = 0; e < RE; e++) {
      float g = got[t * RE + e];
      if (!mask[e]) {
        if (g != 0.0f) fail_msg("router row %d expert %d: unchosen weight %g", t, e, g);
        continue;
      }
      double want = s[e] / sum;
      if (!(fabs(g - want) <= (RK + 8) * U32 * want))
        fail_msg("router row %d expert %d: got %.9g want %.17g", t, e, g, want);
      bias_in_weights = fmax(bias_in_weights, fabs(g - sc[e] / bsum));
      rsum += g;
    }
    assert_true(fabs(rsum - 1) <= 2 * RK * U32 + 8 * U32);
  }
  assert_true(changed > 0);           // the bias changes the winners of some rows
  assert_true(bias_in_weights > 1e-3);  // and weights computed with the bias would not match
  // Ties go to the lower expert index: all-equal logits pick experts 0..k-1.
  TT_OK(tpr_router_sigmoid_topk(tt_cpu(), tied, zb, RK, tout));
  float *gt = tt_to_host(tout);
  for (int e = 0; e < RE; e++) assert_true(gt[e] == (e < RK ? 1.0f / RK : 0.0f));
  tt_check_roundtrip(build_router, 2, (const tpr_tensor *const[]){lg, bias}, out);
  assert_int_equal(tpr_router_sigmoid_topk(tt_cpu(), lg, bias, RE + 1, out), TPR_ERR_INVALID_ARG);
  free(got), free(gt);
  tpr_tensor *all[] = {lg, bias, out, zb, tied, tout};
  for (int i = 0; i < 6; i++) tpr_tensor_free(all[i]);
}

// ---------------------------------------------------------------- moe_experts

enum { MT = 9, MH = 16, MF = 12, ME = 6, IDLE = 4 };

static double silu_d(double g) { return g / (1 + exp(-g)); }

// Per-token reference in double, with a first-order bound per element of
// out: sgemm errors (K + 2)u sum|terms| for w1/w3 (K = H) and w2 (K = F),
// silu (4u) and the product (u) with |silu'| <= 1.1, and the gated sum over
// the token's experts ((n + 1)u). If swap, w1 and w3 trade places (a
// negative control for the [w1; w3] layout of w13).
static void ref_moe(const float *X, const float *G, const float *W13, const float *W2, bool swap, double *want,
                    double *bound) {
  const double u = U32;
  for (int t = 0; t < MT; t++) {
    int n = 0;
    for (int e = 0; e < ME; e++) n += G[t * ME + e] != 0;
    for (int j = 0; j < MH; j++) want[t * MH + j] = bound[t * MH + j] = 0;
    for (int e = 0; e < ME; e++) {
      double gate = G[t * ME + e], act[MF], dact[MF];
      if (gate == 0) continue;
      for (int f = 0; f < MF; f++) {
        double g1 = 0, g3 = 0, a1 = 0, a3 = 0;
        const float *w1 = W13 + ((size_t)e * 2 * MF + f + (swap ? MF : 0)) * MH;
        const float *w3 = W13 + ((size_t)e * 2 * MF + f + (swap ? 0 : MF)) * MH;
        for (int h = 0; h < MH; h++) {
          g1 += (double)w1[h] * X[t * MH + h], a1 += fabs((double)w1[h] * X[t * MH + h]);
          g3 += (double)w3[h] * X[t * MH + h], a3 += fabs((double)w3[h] * X[t * MH + h]);
        }
        double d1 = (MH + 2) * u * a1, d3 = (MH + 2) * u * a3;
        act[f] = silu_d(g1) * g3;
        dact[f] = 1.1 * d1 * fabs(g3) + fabs(silu_d(g1)) * d3 + 1.1 * d1 * d3 + 5 * u * fabs(act[f]);
      }
      for (int j = 0; j < MH; j++) {
        const float *w2 = W2 + ((size_t)e * MH + j) * MF;
        double y = 0, ay = 0, dy = 0;
        for (int f = 0; f < MF; f++) y += w2[f] * act[f], ay += fabs(w2[f] * act[f]), dy += fabs(w2[f]) * dact[f];
        dy += (MF + 2) * u * ay;
        want[t * MH + j] += gate * y;
        bound[t * MH + j] += fabs(gate) * (dy + (n + 1) * u * fabs(y));
      }
    }
  }
}

static void test_moe_experts(void **state) {
  const int64_t xs[] = {MT, MH}, gs[] = {MT, ME}, w13s[] = {ME, 2 * MF, MH}, w2s[] = {ME, MH, MF};
  float *X, *W13, *W2, G[MT * ME] = {0};
  tpr_tensor *x = tt_random_f32(tt_cpu(), 2, xs, &X), *w13 = tt_random_f32(tt_cpu(), 3, w13s, &W13);
  tpr_tensor *w2 = tt_random_f32(tt_cpu(), 3, w2s, &W2);
  // Two distinct experts per token, never IDLE; positive weights summing to 1.
  static const int pool[] = {0, 1, 2, 3, 5};  // every expert but IDLE
  for (int t = 0; t < MT; t++) {
    int ia = (int)tt_randint(0, 4), ib = (int)tt_randint(0, 3);
    ib += ib >= ia;
    int a = pool[ia], b = pool[ib];
    double wa = tt_uniform(0.1, 0.9);
    G[t * ME + a] = (float)wa, G[t * ME + b] = (float)(1 - wa);
  }
  G[0 * ME + 5] = 0.25f;  // one token with a third expert
  // IDLE receives no tokens: its weights are NaN, so reading them would show.
  for (int i = 0; i < 2 * MF * MH; i++) W13[IDLE * 2 * MF * MH + i] = NAN;
  for (int i = 0; i < MH * MF; i++) W2[IDLE * MH * MF + i] = NAN;
  TT_OK(tpr_tensor_from_host(w13, W13, tpr_tensor_nbytes(w13)));
  TT_OK(tpr_tensor_from_host(w2, W2, tpr_tensor_nbytes(w2)));
  tpr_tensor *g = tt_from_host(TPR_F32, 2, gs, G), *out = tt_new(TPR_F32, 2, xs);
  TT_OK(tpr_moe_experts(tt_cpu(), x, g, w13, w2, out));
  float *got = tt_to_host(out);
  double want[MT * MH], bound[MT * MH];
  ref_moe(X, G, W13, W2, false, want, bound);
  for (int i = 0; i < MT * MH; i++)
    if (!(fabs(got[i] - want[i]) <= bound[i]))
      fail_msg("moe element %d: got %.9g want %.17g bound %.3g", i, got[i], want[i], bound[i]);
  // The bound is tight enough to catch the w1/w3 order.
  ref_moe(X, G, W13, W2, true, want, bound);
  assert_true(tt_max_rel_err(got, want, MT * MH) > 0.05);
  tt_check_roundtrip(build_moe, 4, (const tpr_tensor *const[]){x, g, w13, w2}, out);
  free(got), free(X), free(W13), free(W2);
  tpr_tensor *all[] = {x, w13, w2, g, out};
  for (int i = 0; i < 5; i++) tpr_tensor_free(all[i]);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sum_squares),
      cmocka_unit_test(test_rms_scale_distributed),
      cmocka_unit_test(test_embedding_shard),
      cmocka_unit_test(test_router),
      cmocka_unit_test(test_moe_experts),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(tt_cpu());
  return rc;
}
