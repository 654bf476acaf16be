// Lightning attention forward (CPU): the blocked prefill and the decode step
// (ops.h, tpr_lightning_attention) against a double-precision per-token
// recurrence (lightning_ref.h) and against transformers' own
// MiniMaxLightningAttention (tests/fixtures/lightning_attention,
// scripts/reference/make_lightning_attention_fixture.py); a prefill split
// into chunks carrying the state equals one prefill; decode steps equal the
// prefill; negative controls (decay dropped, state not carried across
// blocks, the slope of the wrong head, the wrong layer's slopes) must fail
// the same bounds; the shape rules refuse what does not fit; the engine's
// form (lightning_paged: many sequences' rows, states in slots of a pool
// written in place) equals the reference per sequence across steps. Fresh
// random inputs each run (seed printed).
#include "lightning_ref.h"
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_BOUND 1e-5   // f32 kernel vs double reference, relative to the reference's largest magnitude
#define CTRL_MIN 1e-3    // a control must be off by at least 100x the bound

// A random (T, H, D) problem with its state and slopes, on the host and as tensors.
typedef struct prob {
  int64_t T, H, D;
  float *q, *k, *v, *S0, *sl;  // host copies
  tpr_tensor *tq, *tk, *tv, *tS, *tsl, *qkv;  // qkv: (T, H, 3D) that q, k, v are views of (strided)
} prob;

// q, k, v as column slices of one (T, H, 3D) tensor, as a family splits its
// qkv projection (transformers: per head [q | k | v]); S0 random or zero.
static prob make_prob(int64_t T, int64_t H, int64_t D, bool zero_state, int64_t layer, int64_t n_layers) {
  prob p = {.T = T, .H = H, .D = D};
  float *all;
  p.qkv = tt_random_f32(tt_cpu(), 3, (const int64_t[]){T, H, 3 * D}, &all);
  TT_OK(tpr_tensor_slice(p.qkv, 2, 0, D, &p.tq));
  TT_OK(tpr_tensor_slice(p.qkv, 2, D, D, &p.tk));
  TT_OK(tpr_tensor_slice(p.qkv, 2, 2 * D, D, &p.tv));
  const int64_t n = T * H * D;
  p.q = malloc((size_t)n * sizeof(float)), p.k = malloc((size_t)n * sizeof(float));
  p.v = malloc((size_t)n * sizeof(float));
  for (int64_t r = 0; r < T * H; r++)
    for (int64_t d = 0; d < D; d++) {
      p.q[r * D + d] = all[r * 3 * D + d];
      p.k[r * D + d] = all[r * 3 * D + D + d];
      p.v[r * D + d] = all[r * 3 * D + 2 * D + d];
    }
  free(all);
  p.tS = tt_random_f32(tt_cpu(), 3, (const int64_t[]){H, D, D}, &p.S0);
  if (zero_state) {
    memset(p.S0, 0, (size_t)(H * D * D) * sizeof(float));
    memset(tpr_tensor_data(p.tS), 0, (size_t)(H * D * D) * sizeof(float));
  }
  p.sl = malloc((size_t)H * sizeof(float));
  tpr_lightning_slopes(H, layer, n_layers, p.sl);
  p.tsl = tt_from_host(TPR_F32, 1, (const int64_t[]){H}, p.sl);
  return p;
}

static void free_prob(prob *p) {
  free(p->q), free(p->k), free(p->v), free(p->S0), free(p->sl);
  tpr_tensor_free(p->tq), tpr_tensor_free(p->tk), tpr_tensor_free(p->tv), tpr_tensor_free(p->tS);
  tpr_tensor_free(p->tsl), tpr_tensor_free(p->qkv);
}

// One prefill call; the packed (o | state) result on the host, poisoned with
// NaN first so every element the kernel should write is checked.
static float *prefill(const tpr_tensor *q, const tpr_tensor *k, const tpr_tensor *v, const tpr_tensor *S,
                      const tpr_tensor *sl, int64_t B) {
  const int64_t n = tpr_tensor_numel(q) + tpr_tensor_numel(S);
  tpr_tensor *out = tt_new(TPR_F32, 1, &n);
  float *o = tpr_tensor_data(out);
  for (int64_t i = 0; i < n; i++) o[i] = NAN;
  TT_OK(tpr_lightning_attention(tt_cpu(), q, k, v, S, sl, B, out));
  float *h = tt_to_host(out);
  tpr_tensor_free(out);
  return h;
}

// The reference for p: o (T*H*D) then the final state (H*D*D), in double.
static double *reference(const prob *p, const float *slopes) {
  const int64_t n = p->T * p->H * p->D, ns = p->H * p->D * p->D;
  double *r = malloc((size_t)(n + ns) * sizeof *r);
  for (int64_t e = 0; e < ns; e++) r[n + e] = p->S0[e];
  lref_forward(p->T, p->H, p->D, p->q, p->k, p->v, slopes, r + n, r);
  return r;
}

// The worse of o's and the state's errors, each relative to its own magnitude.
static double packed_err(const float *got, const double *want, int64_t n, int64_t ns) {
  const double eo = n ? tt_max_rel_err(got, want, (size_t)n) : 0, es = tt_max_rel_err(got + n, want + n, (size_t)ns);
  return eo > es ? eo : es;
}

// ---------------------------------------------------------------- prefill vs reference

static void prefill_case(int64_t T, int64_t H, int64_t D, int64_t B, bool zero_state) {
  prob p = make_prob(T, H, D, zero_state, 1, 4);
  float *got = prefill(p.tq, p.tk, p.tv, p.tS, p.tsl, B);
  double *want = reference(&p, p.sl);
  const double err = packed_err(got, want, T * H * D, H * D * D);
  printf("  T %2lld H %lld D %2lld block %2lld %s state: max rel err %.2e (bound %.0e)\n", (long long)T,
         (long long)H, (long long)D, (long long)B, zero_state ? "zero" : "random", err, REF_BOUND);
  assert_true(err <= REF_BOUND);
  free(got), free(want), free_prob(&p);
}

// T < block, T = block, T not a multiple of block, several blocks, block 1,
// a block longer than T, zero and random initial states.
static void test_prefill_reference(void **state) {
  (void)state;
  const int64_t B = 4;
  const int64_t Ts[] = {1, 3, 4, 5, 8, 11, 17};
  for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) prefill_case(Ts[i], 3, 8, B, false);
  prefill_case(9, 3, 8, B, true);
  prefill_case(7, 2, 16, 1, false);
  prefill_case(6, 2, 16, 64, false);
  prefill_case(37, 4, 16, 8, false);
  prefill_case(0, 2, 4, 4, false);  // no tokens: the state passes through
}

// ---------------------------------------------------------------- chunked prefill and decode

// Chunks of every size c in 1..B+1, the state of each call fed to the next,
// equal one call (to rounding: each call restarts the block grid).
static void test_chunked_prefill(void **state) {
  (void)state;
  const int64_t B = 4, T = 2 * B + 3, H = 3, D = 8, n = T * H * D, ns = H * D * D;
  prob p = make_prob(T, H, D, false, 2, 4);
  float *one = prefill(p.tq, p.tk, p.tv, p.tS, p.tsl, B);
  double *want = malloc((size_t)(n + ns) * sizeof *want);
  for (int64_t i = 0; i < n + ns; i++) want[i] = one[i];
  double worst = 0;
  for (int64_t c = 1; c <= B + 1; c++) {
    float *got = malloc((size_t)(n + ns) * sizeof *got);
    tpr_tensor *S = tt_from_host(TPR_F32, 3, (const int64_t[]){H, D, D}, p.S0);
    for (int64_t t0 = 0; t0 < T; t0 += c) {
      const int64_t len = T - t0 < c ? T - t0 : c;
      tpr_tensor *q, *k, *v;
      TT_OK(tpr_tensor_slice(p.tq, 0, t0, len, &q));
      TT_OK(tpr_tensor_slice(p.tk, 0, t0, len, &k));
      TT_OK(tpr_tensor_slice(p.tv, 0, t0, len, &v));
      float *r = prefill(q, k, v, S, p.tsl, B);
      memcpy(got + t0 * H * D, r, (size_t)(len * H * D) * sizeof *r);
      memcpy(tpr_tensor_data(S), r + len * H * D, (size_t)ns * sizeof *r);  // carried to the next call
      free(r), tpr_tensor_free(q), tpr_tensor_free(k), tpr_tensor_free(v);
    }
    memcpy(got + n, tpr_tensor_data(S), (size_t)ns * sizeof *got);
    const double err = packed_err(got, want, n, ns);
    worst = err > worst ? err : worst;
    assert_true(err <= REF_BOUND);
    free(got), tpr_tensor_free(S);
  }
  // Control: chunks that do not carry the state (each starts from S0) fail.
  tpr_tensor *q, *k, *v;
  TT_OK(tpr_tensor_slice(p.tq, 0, B, T - B, &q));
  TT_OK(tpr_tensor_slice(p.tk, 0, B, T - B, &k));
  TT_OK(tpr_tensor_slice(p.tv, 0, B, T - B, &v));
  float *fresh = prefill(q, k, v, p.tS, p.tsl, B);
  const double bad = tt_max_rel_err(fresh, want + B * H * D, (size_t)((T - B) * H * D));
  printf("  chunks 1..%lld carrying the state vs one call: worst %.2e (bound %.0e); second chunk from S0 "
         "instead: %.2e (must exceed %.0e)\n", (long long)(B + 1), worst, REF_BOUND, bad, CTRL_MIN);
  assert_true(bad > CTRL_MIN);
  free(fresh), tpr_tensor_free(q), tpr_tensor_free(k), tpr_tensor_free(v);
  free(one), free(want), free_prob(&p);
}

// Decode steps of NS sequences at once, each with its own state, equal a
// prefill of each sequence alone and the reference.
static void test_decode(void **state) {
  (void)state;
  enum { NS = 3 };
  const int64_t T = 6, H = 3, D = 8, n = T * H * D, ns = H * D * D;
  prob p[NS];
  float *S = malloc((size_t)(NS * ns) * sizeof *S);  // (NS, H, D, D)
  for (int s = 0; s < NS; s++) {
    p[s] = make_prob(T, H, D, s == 0, 1, 3);
    memcpy(S + s * ns, p[s].S0, (size_t)ns * sizeof *S);
  }
  float *o = malloc((size_t)(NS * n) * sizeof *o);  // (NS, T, H, D)
  float *q = malloc((size_t)(3 * NS * H * D) * sizeof *q), *k = q + NS * H * D, *v = k + NS * H * D;
  const int64_t xs[3] = {NS, H, D}, ss[4] = {NS, H, D, D}, npk = NS * H * D + NS * ns;
  for (int64_t t = 0; t < T; t++) {
    for (int s = 0; s < NS; s++) {
      memcpy(q + s * H * D, p[s].q + t * H * D, (size_t)(H * D) * sizeof *q);
      memcpy(k + s * H * D, p[s].k + t * H * D, (size_t)(H * D) * sizeof *k);
      memcpy(v + s * H * D, p[s].v + t * H * D, (size_t)(H * D) * sizeof *v);
    }
    tpr_tensor *tq = tt_from_host(TPR_F32, 3, xs, q), *tk = tt_from_host(TPR_F32, 3, xs, k);
    tpr_tensor *tv = tt_from_host(TPR_F32, 3, xs, v), *tS = tt_from_host(TPR_F32, 4, ss, S);
    tpr_tensor *out = tt_new(TPR_F32, 1, &npk);
    TT_OK(tpr_lightning_decode(tt_cpu(), tq, tk, tv, tS, p[0].tsl, out));
    const float *r = tpr_tensor_data(out);
    for (int s = 0; s < NS; s++) memcpy(o + s * n + t * H * D, r + s * H * D, (size_t)(H * D) * sizeof *o);
    memcpy(S, r + NS * H * D, (size_t)(NS * ns) * sizeof *S);
    tpr_tensor_free(tq), tpr_tensor_free(tk), tpr_tensor_free(tv), tpr_tensor_free(tS), tpr_tensor_free(out);
  }
  double worst_pf = 0, worst_ref = 0;
  for (int s = 0; s < NS; s++) {
    float *pf = prefill(p[s].tq, p[s].tk, p[s].tv, p[s].tS, p[s].tsl, 4);
    double *want = reference(&p[s], p[s].sl), *pfd = malloc((size_t)(n + ns) * sizeof *pfd);
    for (int64_t i = 0; i < n + ns; i++) pfd[i] = pf[i];
    float *got = malloc((size_t)(n + ns) * sizeof *got);
    memcpy(got, o + s * n, (size_t)n * sizeof *got);
    memcpy(got + n, S + s * ns, (size_t)ns * sizeof *got);
    const double e1 = packed_err(got, pfd, n, ns), e2 = packed_err(got, want, n, ns);
    worst_pf = e1 > worst_pf ? e1 : worst_pf, worst_ref = e2 > worst_ref ? e2 : worst_ref;
    free(pf), free(want), free(pfd), free(got);
  }
  printf("  %d sequences x %lld decode steps: vs prefill %.2e, vs reference %.2e (bound %.0e)\n", NS, (long long)T,
         worst_pf, worst_ref, REF_BOUND);
  assert_true(worst_pf <= REF_BOUND && worst_ref <= REF_BOUND);
  for (int s = 0; s < NS; s++) free_prob(&p[s]);
  free(S), free(o), free(q);
}

// ---------------------------------------------------------------- negative controls

// Each a plausible wrong kernel, built from the op itself, must fail the
// reference bound by far: (1) decay dropped (slopes 0), (2) the state not
// carried across blocks (each block a call from the initial state), (3) the
// slope of the wrong head (slopes rotated by one head).
static void test_controls(void **state) {
  (void)state;
  const int64_t B = 4, T = 3 * B + 2, H = 4, D = 8, n = T * H * D, ns = H * D * D;
  prob p = make_prob(T, H, D, false, 0, 4);
  double *want = reference(&p, p.sl);
  float *good = prefill(p.tq, p.tk, p.tv, p.tS, p.tsl, B);
  const double ok = packed_err(good, want, n, ns);
  assert_true(ok <= REF_BOUND);

  float zero[4] = {0}, rot[4];
  for (int64_t h = 0; h < H; h++) rot[h] = p.sl[(h + 1) % H];
  tpr_tensor *tz = tt_from_host(TPR_F32, 1, &H, zero), *tr = tt_from_host(TPR_F32, 1, &H, rot);
  float *nodecay = prefill(p.tq, p.tk, p.tv, p.tS, tz, B), *wrong = prefill(p.tq, p.tk, p.tv, p.tS, tr, B);
  const double e_decay = packed_err(nodecay, want, n, ns), e_head = packed_err(wrong, want, n, ns);

  float *blocks = malloc((size_t)n * sizeof *blocks);  // o of each block computed from S0
  for (int64_t t0 = 0; t0 < T; t0 += B) {
    const int64_t len = T - t0 < B ? T - t0 : B;
    tpr_tensor *q, *k, *v;
    TT_OK(tpr_tensor_slice(p.tq, 0, t0, len, &q));
    TT_OK(tpr_tensor_slice(p.tk, 0, t0, len, &k));
    TT_OK(tpr_tensor_slice(p.tv, 0, t0, len, &v));
    float *r = prefill(q, k, v, p.tS, p.tsl, B);
    memcpy(blocks + t0 * H * D, r, (size_t)(len * H * D) * sizeof *r);
    free(r), tpr_tensor_free(q), tpr_tensor_free(k), tpr_tensor_free(v);
  }
  const double e_carry = tt_max_rel_err(blocks, want, (size_t)n);
  printf("  op %.2e (bound %.0e); controls: decay dropped %.2e, state not carried across blocks %.2e, slope of the "
         "wrong head %.2e (each must exceed %.0e)\n", ok, REF_BOUND, e_decay, e_carry, e_head, CTRL_MIN);
  assert_true(e_decay > CTRL_MIN && e_carry > CTRL_MIN && e_head > CTRL_MIN);
  free(want), free(good), free(nodecay), free(wrong), free(blocks);
  tpr_tensor_free(tz), tpr_tensor_free(tr), free_prob(&p);
}

// ---------------------------------------------------------------- transformers' fixture

#ifndef TPR_FIXTURES
#define TPR_FIXTURES "tests/fixtures"
#endif
#define FIX TPR_FIXTURES "/lightning_attention/"

// A little-endian f32 C-order .npy (as the generator writes it) of n elements.
static float *read_npy_f32(const char *name, int64_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s%s.npy", FIX, name);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  unsigned char pre[10];
  assert_int_equal(fread(pre, 1, 10, f), 10);
  assert_memory_equal(pre, "\x93NUMPY\x01\x00", 8);  // version 1.0: a 2-byte header length
  const size_t hl = pre[8] | (size_t)pre[9] << 8;
  char *hdr = calloc(hl + 1, 1);
  assert_int_equal(fread(hdr, 1, hl, f), hl);
  assert_non_null(strstr(hdr, "'descr': '<f4'"));
  assert_non_null(strstr(hdr, "'fortran_order': False"));
  const char *sh = strstr(hdr, "'shape': (");
  assert_non_null(sh);
  int64_t numel = 1;
  for (char *e = (char *)sh + 10; *e != ')';) {
    numel *= strtoll(e, &e, 10);
    while (*e == ',' || *e == ' ') e++;
  }
  assert_int_equal(numel, n);
  float *x = malloc((size_t)n * sizeof *x);
  assert_int_equal(fread(x, sizeof *x, (size_t)n, f), (size_t)n);
  fclose(f), free(hdr);
  return x;
}

static double err_vs(const float *got, const float *want, int64_t n) {
  double *w = malloc((size_t)n * sizeof *w);
  for (int64_t i = 0; i < n; i++) w[i] = want[i];
  const double e = tt_max_rel_err(got, w, (size_t)n);
  free(w);
  return e;
}

// transformers' MiniMaxLightningAttention (H 4, D 16, block 4, layer 1 of 3):
// its block loop over T = 19 tokens from the zero state, then its cached path
// over 3 more. The op's prefill and decode give both within 1e-5, with the
// slopes tpr_lightning_slopes computes; layer 0's slopes must fail.
static void test_transformers_fixture(void **state) {
  (void)state;
  const int64_t H = 4, D = 16, B = 4, L = 1, NL = 3, T = 19, T2 = 3, n = T * H * D, n2 = T2 * H * D, ns = H * D * D;
  float *sl_hf = read_npy_f32("slopes", H), sl[4], sl0[4];
  tpr_lightning_slopes(H, L, NL, sl);
  tpr_lightning_slopes(H, 0, NL, sl0);
  const double e_sl = err_vs(sl, sl_hf, H);
  assert_true(e_sl <= 1e-6);
  const int64_t s3[3] = {T, H, D}, s3b[3] = {T2, H, D}, sS[3] = {H, D, D}, one[4] = {1, H, D, D}, h1 = H;
  float *q = read_npy_f32("q", n), *k = read_npy_f32("k", n), *v = read_npy_f32("v", n);
  float *out = read_npy_f32("out", n), *st = read_npy_f32("state", ns);
  float *q2 = read_npy_f32("q2", n2), *k2 = read_npy_f32("k2", n2), *v2 = read_npy_f32("v2", n2);
  float *out2 = read_npy_f32("out2", n2), *st2 = read_npy_f32("state2", ns);
  float *zeros = calloc((size_t)ns, sizeof *zeros);
  tpr_tensor *tq = tt_from_host(TPR_F32, 3, s3, q), *tk = tt_from_host(TPR_F32, 3, s3, k),
             *tv = tt_from_host(TPR_F32, 3, s3, v), *tz = tt_from_host(TPR_F32, 3, sS, zeros),
             *tsl = tt_from_host(TPR_F32, 1, &h1, sl), *tsl0 = tt_from_host(TPR_F32, 1, &h1, sl0);
  // 1. the block loop from the zero state
  float *r = prefill(tq, tk, tv, tz, tsl, B);
  const double e_o = err_vs(r, out, n), e_s = err_vs(r + n, st, ns);
  float *r0 = prefill(tq, tk, tv, tz, tsl0, B);
  const double e_layer = err_vs(r0, out, n);
  // 2. the cached path from call 1's state: decode steps, and one prefill
  tpr_tensor *tq2 = tt_from_host(TPR_F32, 3, s3b, q2), *tk2 = tt_from_host(TPR_F32, 3, s3b, k2),
             *tv2 = tt_from_host(TPR_F32, 3, s3b, v2), *tst = tt_from_host(TPR_F32, 3, sS, st);
  float *r2 = prefill(tq2, tk2, tv2, tst, tsl, B);
  const double e_o2 = err_vs(r2, out2, n2), e_s2 = err_vs(r2 + n2, st2, ns);
  tpr_tensor *S = tt_from_host(TPR_F32, 4, one, st);
  float *dec = malloc((size_t)n2 * sizeof *dec);
  const int64_t npk = H * D + ns;
  for (int64_t t = 0; t < T2; t++) {
    tpr_tensor *a, *b, *c, *o = tt_new(TPR_F32, 1, &npk);  // a, b, c (1, H, D): a batch of one sequence
    TT_OK(tpr_tensor_slice(tq2, 0, t, 1, &a));
    TT_OK(tpr_tensor_slice(tk2, 0, t, 1, &b));
    TT_OK(tpr_tensor_slice(tv2, 0, t, 1, &c));
    TT_OK(tpr_lightning_decode(tt_cpu(), a, b, c, S, tsl, o));
    memcpy(dec + t * H * D, tpr_tensor_data(o), (size_t)(H * D) * sizeof *dec);
    memcpy(tpr_tensor_data(S), (float *)tpr_tensor_data(o) + H * D, (size_t)ns * sizeof *dec);
    tpr_tensor_free(a), tpr_tensor_free(b), tpr_tensor_free(c), tpr_tensor_free(o);
  }
  const double e_do = err_vs(dec, out2, n2), e_ds = err_vs(tpr_tensor_data(S), st2, ns);
  printf("  vs transformers: slopes %.2e; block loop o %.2e, state %.2e; from its state, prefill o %.2e, state %.2e; "
         "decode o %.2e, state %.2e (bound 1e-5); layer 0's slopes instead: %.2e (must exceed %.0e)\n",
         e_sl, e_o, e_s, e_o2, e_s2, e_do, e_ds, e_layer, CTRL_MIN);
  assert_true(e_o <= 1e-5 && e_s <= 1e-5 && e_o2 <= 1e-5 && e_s2 <= 1e-5 && e_do <= 1e-5 && e_ds <= 1e-5);
  assert_true(e_layer > CTRL_MIN);
  free(sl_hf), free(q), free(k), free(v), free(out), free(st), free(q2), free(k2), free(v2), free(out2), free(st2);
  free(zeros), free(r), free(r0), free(r2), free(dec);
  tpr_tensor_free(tq), tpr_tensor_free(tk), tpr_tensor_free(tv), tpr_tensor_free(tz), tpr_tensor_free(tsl);
  tpr_tensor_free(tsl0), tpr_tensor_free(tq2), tpr_tensor_free(tk2), tpr_tensor_free(tv2), tpr_tensor_free(tst);
  tpr_tensor_free(S);
}

// ---------------------------------------------------------------- shape rules and bad input

static tpr_status run5(tpr_op_kind op, const tpr_tensor *const *in, int n_in, int64_t block, int64_t n_out) {
  tpr_op_attrs at = {.n_i = 1, .i = {block}};
  tpr_tensor *out = tt_new(TPR_F32, 1, &n_out);
  tpr_status rc = tpr_op_run(tt_cpu(), op, in, n_in, &at, out);
  tpr_tensor_free(out);
  return rc;
}

static void expect_error(tpr_status rc, tpr_status want, const char *msg) {
  assert_int_equal(rc, want);
  if (!strstr(tpr_last_error(), msg)) fail_msg("error '%s' does not say '%s'", tpr_last_error(), msg);
}

static void test_bad_input(void **state) {
  (void)state;
  const int64_t T = 5, H = 2, D = 4, n = T * H * D, ns = H * D * D;
  prob p = make_prob(T, H, D, false, 0, 2);
  tpr_tensor *badS = tt_new(TPR_F32, 3, (const int64_t[]){H, D, D + 1}), *badsl = tt_new(TPR_F32, 1, (const int64_t[]){H + 1});
  tpr_tensor *shortk = tt_new(TPR_F32, 3, (const int64_t[]){T - 1, H, D}), *i32 = tt_new(TPR_I32, 3, (const int64_t[]){T, H, D});
  const tpr_tensor *good[5] = {p.tq, p.tk, p.tv, p.tS, p.tsl};
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION, (const tpr_tensor *const[]){p.tq, p.tk, p.tv, badS, p.tsl}, 5, 4, n + ns),
               TPR_ERR_SHAPE, "state must be (2, 4, 4)");
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION, (const tpr_tensor *const[]){p.tq, p.tk, p.tv, p.tS, badsl}, 5, 4, n + ns),
               TPR_ERR_SHAPE, "slopes must be (H = 2)");
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION, (const tpr_tensor *const[]){p.tq, shortk, p.tv, p.tS, p.tsl}, 5, 4,
                    n + ns), TPR_ERR_SHAPE, "lightning_attention");
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION, (const tpr_tensor *const[]){i32, p.tk, p.tv, p.tS, p.tsl}, 5, 4, n + ns),
               TPR_ERR_DTYPE, "q");
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION, good, 5, 0, n + ns), TPR_ERR_INVALID_ARG, "block size >= 1");
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION, good, 4, 4, n + ns), TPR_ERR_INVALID_ARG, "takes 5 inputs");
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION, good, 5, 4, n), TPR_ERR_SHAPE, "output must be");
  // Slopes are data, checked when the kernel runs: negative or NaN is refused.
  float neg[2] = {0.5f, -0.1f}, nan2[2] = {NAN, 0.5f};
  tpr_tensor *tneg = tt_from_host(TPR_F32, 1, &H, neg), *tnan = tt_from_host(TPR_F32, 1, &H, nan2);
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION, (const tpr_tensor *const[]){p.tq, p.tk, p.tv, p.tS, tneg}, 5, 4, n + ns),
               TPR_ERR_INVALID_ARG, "slopes[1] = -0.1; slopes must be finite and >= 0");
  tpr_tensor *S3 = tt_new(TPR_F32, 4, (const int64_t[]){T, H, D, D});
  memset(tpr_tensor_data(S3), 0, (size_t)(T * ns) * sizeof(float));
  expect_error(run5(TPR_OP_LIGHTNING_DECODE, (const tpr_tensor *const[]){p.tq, p.tk, p.tv, S3, tnan}, 5, 0, n + T * ns),
               TPR_ERR_INVALID_ARG, "slopes must be finite");
  // decode: one state per sequence
  tpr_tensor *S4 = tt_new(TPR_F32, 4, (const int64_t[]){T + 1, H, D, D});
  expect_error(run5(TPR_OP_LIGHTNING_DECODE, (const tpr_tensor *const[]){p.tq, p.tk, p.tv, S4, p.tsl}, 5, 0,
                    n + (T + 1) * ns), TPR_ERR_SHAPE, "state must be (B, 2, 4, 4)");
  // backward: dout packed like the forward's output
  tpr_tensor *dbad = tt_new(TPR_F32, 1, (const int64_t[]){n});
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION_BWD, (const tpr_tensor *const[]){p.tq, p.tk, p.tv, p.tS, p.tsl, dbad}, 6, 4,
                    3 * n + ns), TPR_ERR_SHAPE, "dout (d o | d final state) must be");
  expect_error(run5(TPR_OP_LIGHTNING_ATTENTION_BWD, (const tpr_tensor *const[]){p.tq, p.tk, p.tv, badS, p.tsl, dbad}, 6, 4,
                    3 * n + ns), TPR_ERR_SHAPE, "the forward's inputs do not fit");
  tpr_tensor_free(badS), tpr_tensor_free(badsl), tpr_tensor_free(shortk), tpr_tensor_free(i32), tpr_tensor_free(tneg);
  tpr_tensor_free(tnan), tpr_tensor_free(S3), tpr_tensor_free(S4), tpr_tensor_free(dbad), free_prob(&p);
}

// ---------------------------------------------------------------- programs and threads

static tpr_status build_prefill(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  const tpr_op_attrs at = {.n_i = 1, .i = {3}};
  return tpr_program_op(p, TPR_OP_LIGHTNING_ATTENTION, in, 5, &at, out);
}
static tpr_status build_bwd(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  const tpr_op_attrs at = {.n_i = 1, .i = {3}};
  return tpr_program_op(p, TPR_OP_LIGHTNING_ATTENTION_BWD, in, 6, &at, out);
}
static tpr_status build_decode(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_program_op(p, TPR_OP_LIGHTNING_DECODE, in, 5, NULL, out);
}

// A contiguous copy of host data on backend be.
static tpr_tensor *on(tpr_backend *be, int nd, const int64_t *shape, const float *h) {
  tpr_tensor *t;
  TT_OK(tpr_tensor_new(be, TPR_F32, nd, shape, &t));
  TT_OK(tpr_tensor_from_host(t, h, (size_t)tpr_tensor_numel(t) * sizeof *h));
  return t;
}

// Runs op on be over host inputs; the host result.
static float *run_on(tpr_backend *be, tpr_op_kind op, int n_in, const int *nd, const int64_t (*shape)[4],
                     const float *const *h, int64_t block, int64_t n_out) {
  tpr_tensor *in[6], *out;
  for (int i = 0; i < n_in; i++) in[i] = on(be, nd[i], shape[i], h[i]);
  TT_OK(tpr_tensor_new(be, TPR_F32, 1, &n_out, &out));
  const tpr_op_attrs at = {.n_i = 1, .i = {block}};
  TT_OK(tpr_op_run(be, op, (const tpr_tensor *const *)in, n_in, &at, out));
  float *r = tt_to_host(out);
  for (int i = 0; i < n_in; i++) tpr_tensor_free(in[i]);
  tpr_tensor_free(out);
  return r;
}

// Each op through a serialized program equals the eager run bit for bit, and
// on 2 threads (heads split between them) equals 1 thread bit for bit, at a
// size past the threading threshold.
static void test_programs_and_threads(void **state) {
  (void)state;
  const int64_t T = 40, H = 4, D = 16, B = 3, n = T * H * D, ns = H * D * D;
  prob p = make_prob(T, H, D, false, 1, 2);
  float *dout;
  tpr_tensor *tdo = tt_random_f32(tt_cpu(), 1, (const int64_t[]){n + ns}, &dout);
  const int nd[6] = {3, 3, 3, 3, 1, 1};
  const int64_t shape[6][4] = {{T, H, D}, {T, H, D}, {T, H, D}, {H, D, D}, {H}, {n + ns}};
  const float *h[6] = {p.q, p.k, p.v, p.S0, p.sl, dout};
  const int dnd[5] = {3, 3, 3, 4, 1};
  const int64_t dshape[5][4] = {{T, H, D}, {T, H, D}, {T, H, D}, {T, H, D, D}, {H}};
  float *Sd = malloc((size_t)(T * ns) * sizeof *Sd);
  for (int64_t e = 0; e < T * ns; e++) Sd[e] = (float)tt_normal();
  const float *dh[5] = {p.q, p.k, p.v, Sd, p.sl};

  tpr_backend *be2;
  TT_OK(tpr_backend_cpu_new(&(tpr_cpu_options){.n_threads = 2}, &be2));
  struct {
    tpr_op_kind op;
    int n_in;
    const int *nd;
    const int64_t (*shape)[4];
    const float *const *h;
    int64_t n_out;
    tt_build_fn build;
  } ops[3] = {{TPR_OP_LIGHTNING_ATTENTION, 5, nd, shape, h, n + ns, build_prefill},
              {TPR_OP_LIGHTNING_ATTENTION_BWD, 6, nd, shape, h, 3 * n + ns, build_bwd},
              {TPR_OP_LIGHTNING_DECODE, 5, dnd, dshape, dh, n + T * ns, build_decode}};
  for (int o = 0; o < 3; o++) {
    float *r1 = run_on(tt_cpu(), ops[o].op, ops[o].n_in, ops[o].nd, ops[o].shape, ops[o].h, B, ops[o].n_out);
    float *r2 = run_on(be2, ops[o].op, ops[o].n_in, ops[o].nd, ops[o].shape, ops[o].h, B, ops[o].n_out);
    assert_memory_equal(r1, r2, (size_t)ops[o].n_out * sizeof *r1);
    tpr_tensor *in[6], *eager = tt_from_host(TPR_F32, 1, &ops[o].n_out, r1);
    for (int i = 0; i < ops[o].n_in; i++) in[i] = on(tt_cpu(), ops[o].nd[i], ops[o].shape[i], ops[o].h[i]);
    tt_check_roundtrip(ops[o].build, ops[o].n_in, (const tpr_tensor *const *)in, eager);
    for (int i = 0; i < ops[o].n_in; i++) tpr_tensor_free(in[i]);
    tpr_tensor_free(eager), free(r1), free(r2);
    printf("  %s: program round trip and 2 threads = 1 thread, bit for bit\n", tpr_op_name(ops[o].op));
  }
  tpr_backend_free(be2);
  free(dout), free(Sd), tpr_tensor_free(tdo), free_prob(&p);
}

// tpr_pb_lightning_decode's views: o (B, H, D) and the states (B, H, D, D)
// out of a program equal the eager op's packed output, bit for bit.
static void test_decode_builder(void **state) {
  (void)state;
  const int64_t Bn = 3, H = 2, D = 8, x3[3] = {Bn, H, D}, s4[4] = {Bn, H, D, D}, n = Bn * H * D,
                npk = n + Bn * H * D * D;
  tpr_tensor *t[5];
  for (int i = 0; i < 3; i++) t[i] = tt_random_f32(tt_cpu(), 3, x3, NULL);
  t[3] = tt_random_f32(tt_cpu(), 4, s4, NULL);
  float sl[2];
  tpr_lightning_slopes(H, 0, 1, sl);
  t[4] = tt_from_host(TPR_F32, 1, &H, sl);
  tpr_tensor *eager = tt_new(TPR_F32, 1, &npk);
  TT_OK(tpr_lightning_decode(tt_cpu(), t[0], t[1], t[2], t[3], t[4], eager));
  tpr_program *p;
  tpr_value_id in[5], o, st;
  TT_OK(tpr_program_new(&p));
  const char *names[5] = {"q", "k", "v", "state", "slopes"};
  for (int i = 0; i < 5; i++) TT_OK(tpr_program_input(p, names[i], TPR_F32, t[i]->ndim, t[i]->shape, &in[i]));
  TT_OK(tpr_pb_lightning_decode(p, in[0], in[1], in[2], in[3], in[4], &o, &st));
  TT_OK(tpr_program_output(p, o, "o"));
  TT_OK(tpr_program_output(p, st, "state_out"));
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  for (int i = 0; i < 5; i++) TT_OK(tpr_exec_bind(e, names[i], t[i]));
  TT_OK(tpr_exec_run(e));
  const tpr_tensor *go, *gs;
  TT_OK(tpr_exec_output(e, "o", &go));
  TT_OK(tpr_exec_output(e, "state_out", &gs));
  assert_true(tpr_tensor_same_shape(go, t[0]) && tpr_tensor_same_shape(gs, t[3]));
  float *ho = tt_to_host(go), *hs = tt_to_host(gs);
  const float *ref = tpr_tensor_data(eager);
  assert_memory_equal(ho, ref, (size_t)n * sizeof *ho);
  assert_memory_equal(hs, ref + n, (size_t)(npk - n) * sizeof *hs);
  free(ho), free(hs), tpr_exec_free(e), tpr_program_free(p), tpr_tensor_free(eager);
  for (int i = 0; i < 5; i++) tpr_tensor_free(t[i]);
}

// ---------------------------------------------------------------- the engine's form (lightning_paged)

// Three sequences (11, 7 and 5 tokens of random q, k, v) through a pool of
// 4 state slots in two steps, rows of different sequences and positions
// mixed: step 1 runs A 0..5 (slot 2), a padded row, B 0..6 (slot 0), C 0..2
// (slot 3); step 2 runs C 3..4 and A 6..10. The pool starts as random
// garbage: a run at position 0 must start from zeros. Each sequence's rows
// and final state equal the double reference of the whole sequence; the
// padded row is 0; slot 1 is never touched. Control: step 2 with A's and C's
// slots swapped must be off by far. Bad slots and positions are refused.
enum { PG_H = 2, PG_D = 8, PG_NS = 4, PG_T1 = 17, PG_T2 = 7 };

typedef struct pg_step {
  int64_t T;
  float *q, *k, *v;  // (T, H, D)
  int32_t slot[PG_T1], pos[PG_T1];
} pg_step;

// Appends rows [p0, p0 + n) of sequence x (whose q, k, v are (len, H, D)) to st.
static void pg_add(pg_step *st, const float *const *x, int64_t p0, int64_t n, int32_t slot) {
  const int64_t w = PG_H * PG_D;
  for (int64_t i = 0; i < n; i++, st->T++) {
    memcpy(st->q + st->T * w, x[0] + (p0 + i) * w, (size_t)w * sizeof(float));
    memcpy(st->k + st->T * w, x[1] + (p0 + i) * w, (size_t)w * sizeof(float));
    memcpy(st->v + st->T * w, x[2] + (p0 + i) * w, (size_t)w * sizeof(float));
    st->slot[st->T] = slot, st->pos[st->T] = (int32_t)(p0 + i);
  }
}

static void pg_pad(pg_step *st) {
  const int64_t w = PG_H * PG_D;
  for (int64_t e = 0; e < w; e++) st->q[st->T * w + e] = st->k[st->T * w + e] = st->v[st->T * w + e] = 1.0f;
  st->slot[st->T] = -1, st->pos[st->T] = 0, st->T++;
}

// Runs one step on pool; returns o (T, H, D) on the host, or NULL with *rc set.
static float *pg_run(const pg_step *st, tpr_tensor *pool, const tpr_tensor *sl, int64_t block, tpr_status *rc) {
  const int64_t x3[3] = {st->T, PG_H, PG_D};
  tpr_tensor *in[7] = {tt_from_host(TPR_F32, 3, x3, st->q), tt_from_host(TPR_F32, 3, x3, st->k),
                       tt_from_host(TPR_F32, 3, x3, st->v), pool, (tpr_tensor *)sl,
                       tt_from_host(TPR_I32, 1, &st->T, st->slot), tt_from_host(TPR_I32, 1, &st->T, st->pos)};
  tpr_tensor *out = tt_new(TPR_F32, 3, x3);
  tpr_op_attrs at = {.n_i = 1, .i = {block}};
  *rc = tpr_op_run(tt_cpu(), TPR_OP_LIGHTNING_PAGED, (const tpr_tensor *const *)in, 7, &at, out);
  float *o = *rc == TPR_OK ? tt_to_host(out) : NULL;
  for (int i = 0; i < 7; i++)
    if (i != 3 && i != 4) tpr_tensor_free(in[i]);
  tpr_tensor_free(out);
  return o;
}

static void test_paged(void **state) {
  (void)state;
  const int64_t len[3] = {11, 7, 5}, w = PG_H * PG_D, block = 4;
  float *x[3][3];  // sequence, q|k|v
  for (int s = 0; s < 3; s++)
    for (int j = 0; j < 3; j++) tpr_tensor_free(tt_random_f32(tt_cpu(), 3, (const int64_t[]){len[s], PG_H, PG_D}, &x[s][j]));
  float sl[PG_H];
  tpr_lightning_slopes(PG_H, 1, 4, sl);
  tpr_tensor *tsl = tt_from_host(TPR_F32, 1, (const int64_t[]){PG_H}, sl);
  for (int control = 0; control < 2; control++) {
    float *garbage;
    tpr_tensor *pool = tt_random_f32(tt_cpu(), 4, (const int64_t[]){PG_NS, PG_H, PG_D, PG_D}, &garbage);
    static float buf[2][3][PG_T1 * PG_H * PG_D];
    pg_step s1 = {.q = buf[0][0], .k = buf[0][1], .v = buf[0][2]}, s2 = {.q = buf[1][0], .k = buf[1][1], .v = buf[1][2]};
    pg_add(&s1, (const float *const *)x[0], 0, 6, 2);
    pg_pad(&s1);
    pg_add(&s1, (const float *const *)x[1], 0, 7, 0);
    pg_add(&s1, (const float *const *)x[2], 0, 3, 3);
    pg_add(&s2, (const float *const *)x[2], 3, 2, control ? 2 : 3);
    pg_add(&s2, (const float *const *)x[0], 6, 5, control ? 3 : 2);
    tpr_status rc;
    float *o1 = pg_run(&s1, pool, tsl, block, &rc), *o2 = pg_run(&s2, pool, tsl, block, &rc);
    assert_non_null(o1), assert_non_null(o2);
    for (int64_t e = 0; e < w; e++) assert_true(o1[6 * w + e] == 0.0f);  // the padded row
    const float *P = tpr_tensor_data(pool);
    assert_memory_equal(P + 1 * w * PG_D, garbage + 1 * w * PG_D, (size_t)(w * PG_D) * sizeof(float));  // slot 1
    // Each sequence's rows from the two steps against its reference.
    const int64_t at1[3] = {0, 7, 14}, at2[3] = {2, -1, 0}, n1[3] = {6, 7, 3}, fin_slot[3] = {2, 0, 3};
    double worst = 0;
    for (int s = 0; s < 3; s++) {
      double *o = malloc((size_t)(len[s] * w) * sizeof *o), *S = calloc((size_t)(w * PG_D), sizeof *S);
      float *got = malloc((size_t)(len[s] * w) * sizeof *got);
      lref_forward(len[s], PG_H, PG_D, x[s][0], x[s][1], x[s][2], sl, S, o);
      memcpy(got, o1 + at1[s] * w, (size_t)(n1[s] * w) * sizeof *got);
      if (at2[s] >= 0) memcpy(got + n1[s] * w, o2 + at2[s] * w, (size_t)((len[s] - n1[s]) * w) * sizeof *got);
      worst = fmax(worst, tt_max_rel_err(got, o, (size_t)(len[s] * w)));
      worst = fmax(worst, tt_max_rel_err(P + fin_slot[s] * w * PG_D, S, (size_t)(w * PG_D)));
      free(o), free(S), free(got);
    }
    printf("  lightning_paged, 3 sequences over 2 steps%s: max rel err %.2e (%s %.0e)\n",
           control ? " (control: A and C on each other's slots)" : "", worst, control ? "must exceed" : "bound",
           control ? CTRL_MIN : REF_BOUND);
    if (control)
      assert_true(worst > CTRL_MIN);
    else
      assert_true(worst <= REF_BOUND);
    free(o1), free(o2), free(garbage), tpr_tensor_free(pool);
  }
  // Bad slots and positions: refused, the pool untouched by the refusal's step.
  tpr_tensor *pool = tt_random_f32(tt_cpu(), 4, (const int64_t[]){PG_NS, PG_H, PG_D, PG_D}, NULL);
  static float bq[3][PG_T1 * PG_H * PG_D];
  struct {
    int32_t slot[3], pos[3];
    const char *says;
  } bad[] = {
      {{0, 1, 0}, {0, 0, 1}, "two runs"},
      {{0, 0, 1}, {0, 2, 0}, "consecutive positions"},
      {{0, PG_NS, 1}, {0, 0, 0}, "state slot 4 of a pool of 4"},
      {{0, 1, 2}, {0, -1, 0}, "position -1"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    pg_step st = {.T = 3, .q = bq[0], .k = bq[1], .v = bq[2]};
    memcpy(st.slot, bad[i].slot, sizeof bad[i].slot), memcpy(st.pos, bad[i].pos, sizeof bad[i].pos);
    tpr_status rc;
    float *o = pg_run(&st, pool, tsl, block, &rc);
    assert_null(o);
    expect_error(rc, TPR_ERR_INVALID_ARG, bad[i].says);
    printf("  refused: %s\n", tpr_last_error());
  }
  tpr_tensor_free(pool), tpr_tensor_free(tsl);
  for (int s = 0; s < 3; s++)
    for (int j = 0; j < 3; j++) free(x[s][j]);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefill_reference), cmocka_unit_test(test_chunked_prefill),
      cmocka_unit_test(test_decode),            cmocka_unit_test(test_controls),
      cmocka_unit_test(test_transformers_fixture), cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_programs_and_threads), cmocka_unit_test(test_decode_builder),
      cmocka_unit_test(test_paged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
