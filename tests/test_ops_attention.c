// RoPE, KV-cache attention and cache_write against double-precision
// references written here (the other model ops are in test_ops_model.c).
// Fresh random inputs each run (seed printed; rerun with TPR_TEST_SEED=...).
// Each op also runs once through a serialized and deserialized program, and a
// prefill (T=5) + decode (T=1) pair of program runs sharing bound caches must
// agree with one attention over all 6 tokens.
//
// Bounds are first-order rounding analyses in units of u = 2^-24, checked
// per element. Negative controls show each comparison can fail on the bug
// it guards against (whole-head rotation, non-causal masking, the h % Hkv
// head mapping, the blocked kernel without its accumulator rescale).
// The blocked attention kernel is also checked at odd sizes (T, S off the
// 64-key tile and 256-key chunk grid, D = 13), a 600-token prefill, a decode
// over 1000 keys (split-K), and for the same bits at 1, 2 and 3 threads.
#include "ops_util.h"
#include "runtime/ops/attention/attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define U32 0x1p-24

static tpr_tensor *index1(tpr_dtype dt, int64_t v) {  // a (1) i32/i64 tensor
  int64_t v64 = v;
  int32_t v32 = (int32_t)v;
  return tt_from_host(dt, 1, (const int64_t[]){1}, dt == TPR_I32 ? (const void *)&v32 : (const void *)&v64);
}

static tpr_tensor *permuted(const tpr_tensor *t, const int *perm) {
  tpr_tensor *v = NULL;
  TT_OK(tpr_tensor_permute(t, perm, &v));
  return v;
}

// ---------------------------------------------------------------- program round trip


static tpr_status build_rope(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_rope(p, in[0], in[1], 8, 5e6f, out);
}
static tpr_status build_attention(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_attention(p, in[0], in[1], in[2], in[3], 0.3f, out);
}
static tpr_status build_cache_write(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_cache_write(p, in[0], in[1], in[2], out);
}

// ---------------------------------------------------------------- rope

// The reference takes inv_freq and the angle from the op's definition, which
// is transformers' float32 path (1 / powf(theta, (2d)/rd), then (float)pos *
// inv_freq, both f32): at position 1e5 an f32 angle is off the exact one by
// up to 4e-3 rad, and matching the reference model means matching that.
// Everything after -- cos, sin, the rotation -- is in double. Bound per
// element 6u (|x1| + |x2|): cosf/sinf (1 ulp <= u absolute), two products,
// a sum. Dims past rd must be copied bit for bit. rd_ref != rd rotates with
// the wrong pairing (the negative control); returns the max abs error.
static double rope_err(const float *got, const float *X, const int64_t *P, int T, int NH, int D, int rd, int rd_ref,
                       float theta, bool check) {
  double worst = 0;
  const int half = rd_ref / 2;
  for (int t = 0; t < T; t++)
    for (int h = 0; h < NH; h++) {
      const float *x = X + (t * NH + h) * D, *o = got + (t * NH + h) * D;
      for (int d = 0; d < half; d++) {
        float inv = 1.0f / powf(theta, (float)(2 * d) / (float)rd_ref), a = (float)P[t] * inv;
        double c = cos((double)a), s = sin((double)a), x1 = x[d], x2 = x[d + half];
        double w1 = x1 * c - x2 * s, w2 = x2 * c + x1 * s, b = 6 * U32 * (fabs(x1) + fabs(x2));
        double e = fmax(fabs(o[d] - w1), fabs(o[d + half] - w2));
        if (check && !(e <= b)) fail_msg("rope t=%d h=%d d=%d: err %.3g > bound %.3g", t, h, d, e, b);
        worst = fmax(worst, e);
      }
      for (int d = rd_ref; d < D; d++) {
        if (check && memcmp(&o[d], &x[d], 4)) fail_msg("rope t=%d h=%d: pass-through dim %d changed", t, h, d);
        worst = fmax(worst, fabs(o[d] - x[d]));
      }
    }
  return worst;
}

static void rope_case(int T, int NH, int D, int rd, float theta, tpr_dtype pdt, int64_t max_pos, bool strided) {
  int64_t P[64], xs[] = {T, NH, D}, hs[] = {NH, T, D};
  for (int t = 0; t < T; t++) P[t] = tt_randint(0, max_pos);
  P[0] = max_pos;
  float *X = malloc((size_t)T * NH * D * sizeof *X), *H;
  tpr_tensor *base = NULL, *x;
  if (strided) {  // (heads, T, D) permuted to (T, heads, D)
    base = tt_random_f32(tt_cpu(), 3, hs, &H);
    x = permuted(base, (const int[]){1, 0, 2});
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH; h++) memcpy(X + (t * NH + h) * D, H + (h * T + t) * D, D * sizeof *X);
  } else {
    x = tt_random_f32(tt_cpu(), 3, xs, &H);
    memcpy(X, H, (size_t)T * NH * D * sizeof *X);
  }
  // Positions; when strided, column 1 of a (T, 2) tensor made 1-D by hand.
  void *ph = malloc(T * 16);
  for (int t = 0; t < 2 * T; t++) {
    int64_t v = strided ? (t % 2 ? P[t / 2] : -1) : (t < T ? P[t] : -1);
    pdt == TPR_I32 ? (((int32_t *)ph)[t] = (int32_t)v) : (((int64_t *)ph)[t] = v);
  }
  tpr_tensor *pb = strided ? tt_from_host(pdt, 2, (const int64_t[]){T, 2}, ph) : NULL, *pos = NULL;
  if (strided) {
    TT_OK(tpr_tensor_slice(pb, 1, 1, 1, &pos));
    pos->ndim = 1;
  } else {
    pos = tt_from_host(pdt, 1, (const int64_t[]){T}, ph);
  }
  tpr_tensor *out = tt_new(TPR_F32, 3, xs);
  TT_OK(tpr_rope(tt_cpu(), x, pos, rd, theta, out));
  float *got = tt_to_host(out);
  rope_err(got, X, P, T, NH, D, rd, rd, theta, true);
  if (rd < D) {  // rotating the whole head (the wrong pairing) must fail the comparison
    double bad = rope_err(got, X, P, T, NH, D, rd, D, theta, false);
    assert_true(bad > 0.1);
  }
  if (!strided && pdt == TPR_I64 && rd == 8 && theta == 5e6f)
    tt_check_roundtrip(build_rope, 2, (const tpr_tensor *const[]){x, pos}, out);
  free(got), free(X), free(H), free(ph);
  tpr_tensor_free(x), tpr_tensor_free(pos), tpr_tensor_free(out);
  if (pb) tpr_tensor_free(pb);
  if (base) tpr_tensor_free(base);
}

static void test_rope(void **state) {
  rope_case(5, 3, 16, 16, 10000.0f, TPR_I32, 4096, false);  // full rotation
  rope_case(5, 3, 16, 8, 10000.0f, TPR_I64, 4096, false);   // partial: dims 8..15 pass through
  rope_case(7, 2, 24, 8, 5e6f, TPR_I64, 100000, false);     // MiniMax-M2's theta, long positions
  rope_case(6, 4, 16, 8, 5e6f, TPR_I32, 300, true);         // strided x
  rope_case(3, 2, 10, 2, 10000.0f, TPR_I32, 50, true);      // rotary_dim 2
  // Shape rule: rotary_dim must be even and <= D.
  const int64_t xs[] = {2, 1, 6};
  tpr_tensor *x = tt_random_f32(tt_cpu(), 3, xs, NULL), *pos = NULL, *out = tt_new(TPR_F32, 3, xs);
  TT_OK(tpr_tensor_new(tt_cpu(), TPR_I32, 1, (const int64_t[]){2}, &pos));
  TT_OK(tpr_tensor_fill_zero(pos));
  assert_int_equal(tpr_rope(tt_cpu(), x, pos, 5, 1e4f, out), TPR_ERR_SHAPE);
  assert_int_equal(tpr_rope(tt_cpu(), x, pos, 8, 1e4f, out), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "rotary_dim 8"));
  tpr_tensor_free(x), tpr_tensor_free(pos), tpr_tensor_free(out);
}

// ---------------------------------------------------------------- attention

// Double reference for query rows of q (T, Hq, D) at positions start + t
// over k/v (S, Hkv, D); mod_map uses the wrong GQA mapping h % Hkv. Bound per
// element: scores (D + 3)u scale sum|q k| (f32 product chains, then scale);
// softmax relative 4 ds + 2u max|s - m| + (n/8 + 14)u per probability (exp
// within 2 ulp), plus 3u per online rescale (one per 64-key tile and
// 256-key chunk: exp and a product); p @ v adds (L + 2)u, both times
// sum p|v|.
static void ref_attention(const float *Q, const float *K, const float *V, int T, int Hq, int Hkv, int D, int64_t start,
                          float scale, bool mod_map, double *want, double *bound) {
  const int L = (int)start + T;
  double *s = malloc(L * sizeof *s);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < Hq; h++) {
      const int g = mod_map ? h % Hkv : h / (Hq / Hkv), n = (int)start + t + 1;
      const float *q = Q + (t * Hq + h) * D;
      double m = -INFINITY, ds = 0, sum = 0, spread = 0;
      for (int j = 0; j < n; j++) {
        const float *k = K + ((int64_t)j * Hkv + g) * D;
        double dot = 0, ad = 0;
        for (int d = 0; d < D; d++) dot += (double)q[d] * k[d], ad += fabs((double)q[d] * k[d]);
        s[j] = dot * scale;
        ds = fmax(ds, (D + 3) * U32 * fabs(scale) * ad);
        m = fmax(m, s[j]);
      }
      for (int j = 0; j < n; j++) spread = fmax(spread, m - s[j]), sum += (s[j] = exp(s[j] - m));
      const double rescales = 3.0 * ((n + 63) / 64 + (n + 255) / 256);
      const double eps_p = 4 * ds + 2 * U32 * spread + (n / 8.0 + 14 + rescales) * U32 + (L + 2) * U32;
      for (int d = 0; d < D; d++) {
        double o = 0, a = 0;
        for (int j = 0; j < n; j++) {
          double p = s[j] / sum, v = V[((int64_t)j * Hkv + g) * D + d];
          o += p * v, a += p * fabs(v);
        }
        want[((int64_t)t * Hq + h) * D + d] = o;
        bound[((int64_t)t * Hq + h) * D + d] = eps_p * a;
      }
    }
  free(s);
}

// The worst |got - want| / bound (> 1: out of bounds).
static double worst_ratio(const float *got, const double *want, const double *bound, int64_t n) {
  double w = 0;
  for (int64_t i = 0; i < n; i++) w = fmax(w, isfinite(got[i]) ? fabs(got[i] - want[i]) / bound[i] : INFINITY);
  return w;
}

static void check_attention(const float *got, const double *want, const double *bound, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= bound[i]))
      fail_msg("%s element %lld: got %.9g want %.17g bound %.3g", what, (long long)i, got[i], want[i], bound[i]);
}

// Rows [start + T, S) of the caches are NaN: unwritten rows must never be read.
// Returns the worst error / bound.
static double attention_case(int T, int S, int Hq, int Hkv, int D, int64_t start, bool strided_k, bool controls) {
  const int64_t qs[] = {T, Hq, D}, cs[] = {S, Hkv, D}, ks[] = {S, D, Hkv};
  const int64_t nq = (int64_t)T * Hq * D, nc = (int64_t)S * Hkv * D;
  const float scale = 1.0f / sqrtf((float)D);
  float *Q, *K = malloc(nc * sizeof *K), *V, *KT = NULL;
  tpr_tensor *q = tt_random_f32(tt_cpu(), 3, qs, &Q), *kb, *k, *v = tt_random_f32(tt_cpu(), 3, cs, &V);
  if (strided_k) {  // (S, D, Hkv) permuted to (S, Hkv, D): D stride Hkv, read via a scratch copy
    kb = tt_random_f32(tt_cpu(), 3, ks, &KT);
    for (int64_t r = start + T; r < S; r++)
      for (int i = 0; i < Hkv * D; i++) KT[r * Hkv * D + i] = NAN;
    TT_OK(tpr_tensor_from_host(kb, KT, nc * 4));
    k = permuted(kb, (const int[]){0, 2, 1});
    for (int r = 0; r < S; r++)
      for (int g = 0; g < Hkv; g++)
        for (int d = 0; d < D; d++) K[(r * Hkv + g) * D + d] = KT[(r * D + d) * Hkv + g];
  } else {
    kb = NULL;
    k = tt_random_f32(tt_cpu(), 3, cs, &KT);
    for (int64_t i = (start + T) * Hkv * D; i < nc; i++) KT[i] = NAN;
    memcpy(K, KT, nc * sizeof *K);
    TT_OK(tpr_tensor_from_host(k, K, nc * 4));
  }
  for (int64_t i = (start + T) * Hkv * D; i < nc; i++) V[i] = NAN;
  TT_OK(tpr_tensor_from_host(v, V, nc * 4));
  tpr_tensor *st = index1(strided_k ? TPR_I64 : TPR_I32, start), *out = tt_new(TPR_F32, 3, qs);
  TT_OK(tpr_attention(tt_cpu(), q, k, v, st, scale, out));
  float *got = tt_to_host(out);
  double *want = malloc(nq * sizeof *want), *bound = malloc(nq * sizeof *bound);
  ref_attention(Q, K, V, T, Hq, Hkv, D, start, scale, false, want, bound);
  check_attention(got, want, bound, nq, "attention");
  const double ratio = worst_ratio(got, want, bound, nq);
  printf("attention T %d S %d Hq %d Hkv %d D %d start %lld%s: worst error / bound %.3g\n", T, S, Hq, Hkv, D,
         (long long)start, strided_k ? " (strided k)" : "", ratio);
  if (controls) {
    // GQA: the wrong mapping h % Hkv must be far off.
    ref_attention(Q, K, V, T, Hq, Hkv, D, start, scale, true, want, bound);
    assert_true(tt_max_rel_err(got, want, nq) > 0.05);
    // Causal: a row only queries t >= 1 see leaves query 0 bit-identical and
    // moves later ones; a row every query sees moves them all.
    const int64_t rows[2] = {start + 1, 0};
    for (int c = 0; c < 2; c++) {
      float *V2 = malloc(nc * sizeof *V2);
      memcpy(V2, V, nc * sizeof *V2);
      for (int i = 0; i < Hkv * D; i++) V2[rows[c] * Hkv * D + i] += 3.0f;
      tpr_tensor *v2 = tt_from_host(TPR_F32, 3, cs, V2), *o2 = tt_new(TPR_F32, 3, qs);
      TT_OK(tpr_attention(tt_cpu(), q, k, v2, st, scale, o2));
      float *g2 = tt_to_host(o2);
      for (int t = 0; t < T; t++) {
        double diff = 0;
        for (int i = 0; i < Hq * D; i++) diff = fmax(diff, fabs(g2[t * Hq * D + i] - got[t * Hq * D + i]));
        if (c == 0 && t == 0) assert_true(diff == 0);
        else assert_true(diff > 1e-3);
      }
      free(V2), free(g2);
      tpr_tensor_free(v2), tpr_tensor_free(o2);
    }
    tpr_tensor *o3 = tt_new(TPR_F32, 3, qs);
    TT_OK(tpr_attention(tt_cpu(), q, k, v, st, 0.3f, o3));  // build_attention's scale
    tt_check_roundtrip(build_attention, 4, (const tpr_tensor *const[]){q, k, v, st}, o3);
    tpr_tensor_free(o3);
  }
  free(got), free(want), free(bound), free(Q), free(K), free(V), free(KT);
  tpr_tensor_free(q), tpr_tensor_free(k), tpr_tensor_free(v), tpr_tensor_free(st), tpr_tensor_free(out);
  if (kb) tpr_tensor_free(kb);
  return ratio;
}

// attention_case's run and reference without the per-element check: the
// worst error / bound (for negative controls).
static double attention_case_unchecked(int T, int S, int Hq, int Hkv, int D, int64_t start) {
  const int64_t qs[] = {T, Hq, D}, cs[] = {S, Hkv, D}, nq = (int64_t)T * Hq * D;
  float *Q, *K, *V;
  tpr_tensor *q = tt_random_f32(tt_cpu(), 3, qs, &Q), *k = tt_random_f32(tt_cpu(), 3, cs, &K);
  tpr_tensor *v = tt_random_f32(tt_cpu(), 3, cs, &V), *st = index1(TPR_I32, start), *out = tt_new(TPR_F32, 3, qs);
  TT_OK(tpr_attention(tt_cpu(), q, k, v, st, 1.0f / sqrtf((float)D), out));
  float *got = tt_to_host(out);
  double *want = malloc(nq * sizeof *want), *bound = malloc(nq * sizeof *bound);
  ref_attention(Q, K, V, T, Hq, Hkv, D, start, 1.0f / sqrtf((float)D), false, want, bound);
  const double r = worst_ratio(got, want, bound, nq);
  free(got), free(want), free(bound), free(Q), free(K), free(V);
  tpr_tensor_free(q), tpr_tensor_free(k), tpr_tensor_free(v), tpr_tensor_free(st), tpr_tensor_free(out);
  return r;
}

static void test_attention(void **state) {
  attention_case(4, 10, 6, 2, 8, 3, false, true);   // prefill chunk at start 3, GQA groups of 3
  attention_case(1, 9, 4, 4, 16, 8, false, false);  // decode, MHA, the cache full
  attention_case(1, 6, 4, 1, 8, 0, true, false);    // first token, MQA, strided k
  attention_case(150, 160, 2, 1, 4, 7, true, false);  // > one 128-query block
  // start is read at run time and range-checked.
  const int64_t qs[] = {4, 2, 4}, cs[] = {10, 1, 4};
  tpr_tensor *q = tt_random_f32(tt_cpu(), 3, qs, NULL), *k = tt_random_f32(tt_cpu(), 3, cs, NULL);
  tpr_tensor *bad = index1(TPR_I32, 7), *neg = index1(TPR_I64, -1), *out = tt_new(TPR_F32, 3, qs);
  assert_int_equal(tpr_attention(tt_cpu(), q, k, k, bad, 0.5f, out), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "start 7 + T 4 queries exceeds the cache's S = 10 rows"));
  assert_int_equal(tpr_attention(tt_cpu(), q, k, k, neg, 0.5f, out), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "start -1 is negative"));
  // Hq must be a multiple of Hkv.
  const int64_t q3[] = {4, 3, 4}, c2[] = {10, 2, 4};
  tpr_tensor *q3t = tt_random_f32(tt_cpu(), 3, q3, NULL), *k2 = tt_random_f32(tt_cpu(), 3, c2, NULL);
  tpr_tensor *o3 = tt_new(TPR_F32, 3, q3), *zero = index1(TPR_I32, 0);
  assert_int_equal(tpr_attention(tt_cpu(), q3t, k2, k2, zero, 0.5f, o3), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "Hq = 3 query heads is not a multiple of Hkv = 2"));
  tpr_tensor *all[] = {q, k, bad, neg, out, q3t, k2, o3, zero};
  for (int i = 0; i < 9; i++) tpr_tensor_free(all[i]);
}

// The blocked kernel off its grids: T and L = start + T off the 64-key tile
// and 256-key chunk, an odd D (no 8-lane part for its last dims), a long
// prefill, a decode over 1000 keys (split over the keys) and a few-token run
// there (split too); then the negative control: the kernel without its
// accumulator rescale fails the 600-token prefill's bound.
static void test_attention_blocked(void **state) {
  attention_case(70, 150, 4, 2, 64, 45, false, false);   // D = 64, L = 115: one full tile and a partial one
  attention_case(30, 300, 3, 1, 13, 250, false, false);  // odd D, L = 280 crosses a chunk
  attention_case(37, 100, 6, 3, 13, 20, true, false);    // odd D, strided k (copied first)
  attention_case(600, 640, 4, 2, 64, 0, false, false);   // long prefill
  attention_case(1, 1000, 16, 4, 64, 999, false, false); // decode, S = 1000: split-K over 4 chunks
  attention_case(3, 1000, 16, 4, 64, 700, false, false); // a 3-token run, split-K
  tpr__attention_skip_rescale = true;
  const double bad = attention_case_unchecked(600, 640, 4, 2, 64, 0);
  tpr__attention_skip_rescale = false;
  printf("without the accumulator rescale: worst error / bound %.3g\n", bad);
  assert_true(bad > 10);
}

// A (n, H, DD) f32 tensor on backend be holding host rows h.
static tpr_tensor *on(tpr_backend *be, int64_t n, int64_t H, int64_t DD, const float *h) {
  tpr_tensor *t = NULL;
  TT_OK(tpr_tensor_new(be, TPR_F32, 3, (const int64_t[]){n, H, DD}, &t));
  TT_OK(tpr_tensor_from_host(t, h, (size_t)(n * H * DD) * sizeof *h));
  return t;
}

// Attention on backend be of the n queries Q (n, Hq, D) at positions start..
// over the first start + n rows of K, V (.., Hkv, D); returns the host output.
static float *attention_on(tpr_backend *be, const float *Q, const float *K, const float *V, int64_t n, int64_t start,
                           int64_t Hq, int64_t Hkv, int64_t D) {
  tpr_tensor *q = on(be, n, Hq, D, Q), *k = on(be, start + n, Hkv, D, K), *v = on(be, start + n, Hkv, D, V);
  tpr_tensor *st = NULL, *out = NULL;
  const int32_t s32 = (int32_t)start;
  TT_OK(tpr_tensor_new(be, TPR_I32, 1, (const int64_t[]){1}, &st));
  TT_OK(tpr_tensor_from_host(st, &s32, 4));
  TT_OK(tpr_tensor_new(be, TPR_F32, 3, q->shape, &out));
  TT_OK(tpr_attention(be, q, k, v, st, 0.125f, out));
  float *h = malloc((size_t)(n * Hq * D) * sizeof *h);
  TT_OK(tpr_tensor_to_host(out, h, (size_t)(n * Hq * D) * sizeof *h));
  tpr_tensor_free(q), tpr_tensor_free(k), tpr_tensor_free(v), tpr_tensor_free(st), tpr_tensor_free(out);
  return h;
}

// A row's bits are one definition: the same at 1, 2 and 3 threads, and the
// same whether the row is in a 600-token prefill, a 10-token chunk, a
// 3-token run (split-K) or a decode (split-K).
static void test_attention_threads(void **state) {
  enum { T = 600, HQ = 16, HKV = 4, DD = 64 };
  float *Q = malloc(sizeof(float) * T * HQ * DD), *K = malloc(sizeof(float) * T * HKV * DD);
  float *V = malloc(sizeof(float) * T * HKV * DD);
  tt_fill_normal(Q, T * HQ * DD, 1.0), tt_fill_normal(K, T * HKV * DD, 1.0), tt_fill_normal(V, T * HKV * DD, 1.0);
  tpr_backend *be[3];
  float *full[3];
  for (int i = 0; i < 3; i++) {
    TT_OK(tpr_backend_cpu_new(&(tpr_cpu_options){.n_threads = i + 1}, &be[i]));
    full[i] = attention_on(be[i], Q, K, V, T, 0, HQ, HKV, DD);
  }
  assert_memory_equal(full[0], full[1], sizeof(float) * T * HQ * DD);
  assert_memory_equal(full[0], full[2], sizeof(float) * T * HQ * DD);
  const int tails[] = {10, 3, 1};
  for (int c = 0; c < 3; c++) {
    const int n = tails[c];
    for (int i = 0; i < 3; i++) {
      float *got = attention_on(be[i], Q + (size_t)(T - n) * HQ * DD, K, V, n, T - n, HQ, HKV, DD);
      assert_memory_equal(got, full[0] + (size_t)(T - n) * HQ * DD, sizeof(float) * n * HQ * DD);
      free(got);
    }
  }
  printf("T %d prefill bit-identical at 1, 2, 3 threads; its last 10, 3 and 1 rows run alone give the same bits\n", T);
  for (int i = 0; i < 3; i++) free(full[i]), tpr_backend_free(be[i]);
  free(Q), free(K), free(V);
}

// ---------------------------------------------------------------- cache_write

// Exact: the written rows are the new rows' bytes, every other byte stays.
// The cache is a strided view (every other KV head of a wider buffer), so
// the kernel must write through the view's strides and nowhere else.
static void test_cache_write(void **state) {
  enum { S = 7, HKV = 2, D = 3, T = 3 };
  const int64_t ws[] = {S, 2 * HKV, D}, ns[] = {T, HKV, D}, one[] = {1};
  float *W, *N;
  tpr_tensor *wide = tt_random_f32(tt_cpu(), 3, ws, &W), *nw = tt_random_f32(tt_cpu(), 3, ns, &N), *cache = NULL;
  TT_OK(tpr_tensor_slice(wide, 1, HKV, HKV, &cache));  // heads [HKV, 2 HKV) of each row
  tpr_tensor *st = index1(TPR_I64, 2), *tok = tt_new(TPR_I32, 1, one);
  TT_OK(tpr_cache_write(tt_cpu(), cache, nw, st, tok));
  float *got = tt_to_host(wide);
  int32_t end;
  TT_OK(tpr_tensor_to_host(tok, &end, 4));
  assert_int_equal(end, 2 + T);
  for (int r = 0; r < S; r++)
    for (int g = 0; g < 2 * HKV; g++)
      for (int d = 0; d < D; d++) {
        int i = (r * 2 * HKV + g) * D + d;
        bool written = r >= 2 && r < 2 + T && g >= HKV;
        float want = written ? N[((r - 2) * HKV + g - HKV) * D + d] : W[i];
        assert_memory_equal(&got[i], &want, 4);
      }
  free(got);
  // Out of range: an error naming the numbers, and the cache keeps its bytes.
  float *before = tt_to_host(wide);
  tpr_tensor *late = index1(TPR_I32, 5), *neg = index1(TPR_I32, -1);
  assert_int_equal(tpr_cache_write(tt_cpu(), cache, nw, late, tok), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "start 5 + T 3 new rows exceeds the cache's S = 7 rows"));
  assert_int_equal(tpr_cache_write(tt_cpu(), cache, nw, neg, tok), TPR_ERR_INVALID_ARG);
  float *after = tt_to_host(wide);
  assert_memory_equal(before, after, tpr_tensor_nbytes(wide));
  // Round trip: the program writes the same rows again through the binding.
  tpr_tensor *cc = tt_new(TPR_F32, 3, (const int64_t[]){S, HKV, D});
  TT_OK(tpr_cast(tt_cpu(), cache, cc));
  TT_OK(tpr_cache_write(tt_cpu(), cc, nw, st, tok));
  tt_check_roundtrip(build_cache_write, 3, (const tpr_tensor *const[]){cc, nw, st}, tok);
  free(W), free(N), free(before), free(after);
  tpr_tensor *all[] = {wide, nw, cache, st, tok, late, neg, cc};
  for (int i = 0; i < 8; i++) tpr_tensor_free(all[i]);
}

// ---------------------------------------------------------------- prefill + decode through programs

enum { PS = 8, PHQ = 4, PHKV = 2, PD = 8, PN = 6 };

// q, k_new, v_new (T, ...) and start are inputs; the caches are params that
// persist across runs. cache_write comes before attention (program order).
static tpr_program *build_step(int T) {
  tpr_program *p, *q;
  TT_OK(tpr_program_new(&p));
  const int64_t qs[] = {T, PHQ, PD}, ns[] = {T, PHKV, PD}, cs[] = {PS, PHKV, PD}, one[] = {1};
  tpr_value_id xq, kn, vn, st, kc, vc, ek, ev, att;
  TT_OK(tpr_program_input(p, "q", TPR_F32, 3, qs, &xq));
  TT_OK(tpr_program_input(p, "k_new", TPR_F32, 3, ns, &kn));
  TT_OK(tpr_program_input(p, "v_new", TPR_F32, 3, ns, &vn));
  TT_OK(tpr_program_input(p, "start", TPR_I32, 1, one, &st));
  TT_OK(tpr_program_param(p, "k_cache", TPR_F32, 3, cs, &kc));
  TT_OK(tpr_program_param(p, "v_cache", TPR_F32, 3, cs, &vc));
  TT_OK(tpr_pb_cache_write(p, kc, kn, st, &ek));
  TT_OK(tpr_pb_cache_write(p, vc, vn, st, &ev));
  TT_OK(tpr_pb_attention(p, xq, kc, vc, st, 1.0f / sqrtf((float)PD), &att));
  TT_OK(tpr_program_output(p, att, "out"));
  TT_OK(tpr_program_output(p, ek, "end"));
  uint8_t *b;  // run the deserialized copy: "compile once, run anywhere"
  size_t len;
  TT_OK(tpr_program_serialize(p, &b, &len));
  TT_OK(tpr_program_deserialize(b, len, &q));
  free(b);
  tpr_program_free(p);
  return q;
}

// Runs tokens [t0, t0 + T) of Qh/Kh/Vh (PN, ...) through a step program with
// the given caches; returns the (T, PHQ, PD) output.
static float *run_step(const tpr_program *p, int t0, int T, const float *Qh, const float *Kh, const float *Vh,
                       tpr_tensor *kc, tpr_tensor *vc) {
  const int64_t qs[] = {T, PHQ, PD}, ns[] = {T, PHKV, PD};
  tpr_tensor *q = tt_from_host(TPR_F32, 3, qs, Qh + t0 * PHQ * PD), *kn = tt_from_host(TPR_F32, 3, ns, Kh + t0 * PHKV * PD);
  tpr_tensor *vn = tt_from_host(TPR_F32, 3, ns, Vh + t0 * PHKV * PD), *st = index1(TPR_I32, t0);
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  TT_OK(tpr_exec_bind(e, "q", q));
  TT_OK(tpr_exec_bind(e, "k_new", kn));
  TT_OK(tpr_exec_bind(e, "v_new", vn));
  TT_OK(tpr_exec_bind(e, "start", st));
  TT_OK(tpr_exec_bind(e, "k_cache", kc));
  TT_OK(tpr_exec_bind(e, "v_cache", vc));
  TT_OK(tpr_exec_run(e));
  const tpr_tensor *out, *end;
  TT_OK(tpr_exec_output(e, "out", &out));
  TT_OK(tpr_exec_output(e, "end", &end));
  assert_int_equal(*(const int32_t *)tpr_tensor_data(end), t0 + T);
  float *h = tt_to_host(out);
  tpr_exec_free(e);
  tpr_tensor_free(q), tpr_tensor_free(kn), tpr_tensor_free(vn), tpr_tensor_free(st);
  return h;
}

// Prefill 5 tokens, then decode the 6th in a second program run: both read
// caches the runs wrote (initially all NaN, so a missing write shows), and
// must agree with one 6-token attention and the double reference.
static void test_prefill_decode_program(void **state) {
  const int64_t cs[] = {PS, PHKV, PD}, nq = PN * PHQ * PD, nk = PN * PHKV * PD;
  float Q[PN * PHQ * PD], K[PN * PHKV * PD], V[PN * PHKV * PD], nan_cache[PS * PHKV * PD];
  tt_fill_normal(Q, nq, 1.0), tt_fill_normal(K, nk, 1.0), tt_fill_normal(V, nk, 1.0);
  for (int i = 0; i < PS * PHKV * PD; i++) nan_cache[i] = NAN;
  tpr_tensor *kc = tt_from_host(TPR_F32, 3, cs, nan_cache), *vc = tt_from_host(TPR_F32, 3, cs, nan_cache);
  tpr_tensor *kc6 = tt_from_host(TPR_F32, 3, cs, nan_cache), *vc6 = tt_from_host(TPR_F32, 3, cs, nan_cache);
  tpr_program *prefill = build_step(5), *decode = build_step(1), *all6 = build_step(PN);
  // The caches (values 4 and 5, declared in that order) are params: outside
  // the arena; only the two end tokens and the attention output are in it.
  size_t offsets[16];
  tpr_memory_plan plan;
  assert_true(tpr_program_num_values(prefill) <= 16);
  TT_OK(tpr_program_plan_memory(prefill, &plan, offsets));
  assert_true(offsets[4] == TPR_PLAN_NONE && offsets[5] == TPR_PLAN_NONE);
  tpr_tensor d4;
  TT_OK(tpr_program_value(prefill, 4, &d4));
  assert_true(d4.ndim == 3 && d4.shape[0] == PS && d4.shape[1] == PHKV);
  assert_int_equal(plan.n_buffers, 3);
  float *op = run_step(prefill, 0, 5, Q, K, V, kc, vc);
  float *od = run_step(decode, 5, 1, Q, K, V, kc, vc);
  float *of = run_step(all6, 0, PN, Q, K, V, kc6, vc6);
  float got[PN * PHQ * PD];
  memcpy(got, op, 5 * PHQ * PD * sizeof *got);
  memcpy(got + 5 * PHQ * PD, od, PHQ * PD * sizeof *got);
  double want[PN * PHQ * PD], bound[PN * PHQ * PD];
  ref_attention(Q, K, V, PN, PHQ, PHKV, PD, 0, 1.0f / sqrtf((float)PD), false, want, bound);
  check_attention(got, want, bound, nq, "prefill + decode");
  check_attention(of, want, bound, nq, "one 6-token attention");
  assert_true(tt_max_rel_err(got, want, nq) <= 1e-5);  // and so within 2e-5 of each other
  // The caches hold the 6 tokens' rows, bit for bit, and rows 6..7 are still unwritten.
  float *hk = tt_to_host(kc), *hv = tt_to_host(vc), *hk6 = tt_to_host(kc6);
  assert_memory_equal(hk, K, nk * 4);
  assert_memory_equal(hv, V, nk * 4);
  assert_memory_equal(hk, hk6, nk * 4);
  for (int64_t i = nk; i < PS * PHKV * PD; i++) assert_true(isnan(hk[i]) && isnan(hv[i]));
  free(op), free(od), free(of), free(hk), free(hv), free(hk6);
  tpr_program_free(prefill), tpr_program_free(decode), tpr_program_free(all6);
  tpr_tensor_free(kc), tpr_tensor_free(vc), tpr_tensor_free(kc6), tpr_tensor_free(vc6);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_attention_blocked),
      cmocka_unit_test(test_attention_threads),
      cmocka_unit_test(test_cache_write),
      cmocka_unit_test(test_prefill_decode_program),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(tt_cpu());
  return rc;
}
