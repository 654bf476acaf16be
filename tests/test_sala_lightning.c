// MiniCPM-SALA's lightning layers run on tpr's lightning ops (ops.h
// tpr_lightning_attention / tpr_lightning_decode) with ALiBi's slopes
// (tpr_alibi_slopes) and q scaled by 1/sqrt(D), against the float64 PyTorch
// reference (scripts/reference/make_sala_lightning_fixture.py from
// minicpm_sala_ref.py, tests/fixtures/sala_lightning; H 6, D 8): a 19-token
// prefill from the zero state, then 3 tokens from its state as one call and
// as 3 decode steps, outputs and states within REF_BOUND; the slopes for 4, 6
// and 32 heads equal the reference's. Negative controls must be off by more
// than CTRL_MIN: MiniMax's layer-scaled slopes, the scale left out, the
// slopes of the heads reversed.
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_BOUND 1e-5
#define CTRL_MIN 1e-3

enum { H = 6, D = 8, T = 19, T2 = 3, N = T * H * D, N2 = T2 * H * D, NS = H * D * D };

#ifndef TPR_FIXTURES
#define TPR_FIXTURES "tests/fixtures"
#endif

static float *npy(const char *name, int64_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/sala_lightning/%s.npy", TPR_FIXTURES, name);
  return tt_read_npy_f32(path, n);
}

static double err_vs(const float *got, const float *want, int64_t n) {
  double *w = malloc((size_t)n * sizeof *w);
  for (int64_t i = 0; i < n; i++) w[i] = want[i];
  const double e = tt_max_rel_err(got, w, (size_t)n);
  free(w);
  return e;
}

// tpr_lightning_attention on (T, H, D) rows from state S0: packed (o | state), malloc'ed.
static float *prefill(const float *q, const float *k, const float *v, int64_t t, const float *S0, const float *sl,
                      float scale) {
  const int64_t xs[3] = {t, H, D}, ss[3] = {H, D, D}, n = t * H * D + NS;
  float *qs = malloc((size_t)(t * H * D) * sizeof *qs);
  for (int64_t i = 0; i < t * H * D; i++) qs[i] = q[i] * scale;
  tpr_tensor *tq = tt_from_host(TPR_F32, 3, xs, qs), *tk = tt_from_host(TPR_F32, 3, xs, k);
  tpr_tensor *tv = tt_from_host(TPR_F32, 3, xs, v), *tS = tt_from_host(TPR_F32, 3, ss, S0);
  tpr_tensor *tsl = tt_from_host(TPR_F32, 1, (const int64_t[]){H}, sl), *out = tt_new(TPR_F32, 1, &n);
  TT_OK(tpr_lightning_attention(tt_cpu(), tq, tk, tv, tS, tsl, 4, out));
  float *h = tt_to_host(out);
  tpr_tensor_free(tq), tpr_tensor_free(tk), tpr_tensor_free(tv), tpr_tensor_free(tS), tpr_tensor_free(tsl);
  tpr_tensor_free(out), free(qs);
  return h;
}

typedef struct fix {
  float *q, *k, *v, *out, *state, *q2, *k2, *v2, *out2, *state2;
} fix;

static fix load(void) {
  return (fix){npy("q", N), npy("k", N), npy("v", N), npy("out", N), npy("state", NS),
               npy("q2", N2), npy("k2", N2), npy("v2", N2), npy("out2", N2), npy("state2", NS)};
}

static void unload(fix *f) {
  float *all[] = {f->q, f->k, f->v, f->out, f->state, f->q2, f->k2, f->v2, f->out2, f->state2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

// The worse of o's and the state's errors against the fixture's.
static double packed_err(const float *got, int64_t n, const float *o, const float *S) {
  const double eo = err_vs(got, o, n), es = err_vs(got + n, S, NS);
  return eo > es ? eo : es;
}

static void test_slopes(void **state) {
  (void)state;
  const int64_t ns[] = {4, 6, 32};
  const char *names[] = {"slopes4", "slopes6", "slopes32"};
  for (int i = 0; i < 3; i++) {
    float *want = npy(names[i], ns[i]), got[32];
    tpr_alibi_slopes(ns[i], got);
    for (int64_t h = 0; h < ns[i]; h++) assert_true(fabsf(got[h] - want[h]) <= 1e-7f * want[h]);
    free(want);
  }
}

static void test_reference(void **state) {
  (void)state;
  fix f = load();
  float sl[H], *zero = calloc(NS, sizeof(float));
  tpr_alibi_slopes(H, sl);
  const float scale = 1.0f / sqrtf((float)D);
  float *a = prefill(f.q, f.k, f.v, T, zero, sl, scale);
  const double ea = packed_err(a, N, f.out, f.state);
  float *b = prefill(f.q2, f.k2, f.v2, T2, f.state, sl, scale);  // from the reference's state
  const double eb = packed_err(b, N2, f.out2, f.state2);
  // The same 3 tokens as decode steps (B = 1), each from the last one's state.
  float *S = malloc(NS * sizeof *S), o2[N2];
  memcpy(S, f.state, NS * sizeof *S);
  for (int t = 0; t < T2; t++) {
    float qs[H * D];
    for (int e = 0; e < H * D; e++) qs[e] = f.q2[t * H * D + e] * scale;
    const int64_t xs[3] = {1, H, D}, ss[4] = {1, H, D, D}, n = H * D + NS;
    tpr_tensor *tq = tt_from_host(TPR_F32, 3, xs, qs), *tk = tt_from_host(TPR_F32, 3, xs, f.k2 + t * H * D);
    tpr_tensor *tv = tt_from_host(TPR_F32, 3, xs, f.v2 + t * H * D), *tS = tt_from_host(TPR_F32, 4, ss, S);
    tpr_tensor *tsl = tt_from_host(TPR_F32, 1, (const int64_t[]){H}, sl), *out = tt_new(TPR_F32, 1, &n);
    TT_OK(tpr_lightning_decode(tt_cpu(), tq, tk, tv, tS, tsl, out));
    const float *od = tpr_tensor_data(out);
    memcpy(o2 + t * H * D, od, H * D * sizeof *od);
    memcpy(S, od + H * D, NS * sizeof *S);
    tpr_tensor_free(tq), tpr_tensor_free(tk), tpr_tensor_free(tv), tpr_tensor_free(tS), tpr_tensor_free(tsl);
    tpr_tensor_free(out);
  }
  const double ed = err_vs(o2, f.out2, N2), eds = err_vs(S, f.state2, NS);
  printf("  prefill 19 %.2e, 3 more from its state %.2e, as decode steps %.2e / state %.2e (bound %.0e)\n", ea, eb,
         ed, eds, REF_BOUND);
  assert_true(ea <= REF_BOUND && eb <= REF_BOUND && ed <= REF_BOUND && eds <= REF_BOUND);
  free(a), free(b), free(S), free(zero), unload(&f);
}

static void test_negative_controls(void **state) {
  (void)state;
  fix f = load();
  float sl[H], mm[H], rev[H], *zero = calloc(NS, sizeof(float));
  tpr_alibi_slopes(H, sl);
  tpr_lightning_slopes(H, 1, 4, mm);  // MiniMax's: a per-layer factor
  for (int h = 0; h < H; h++) rev[h] = sl[H - 1 - h];
  const float scale = 1.0f / sqrtf((float)D);
  struct {
    const char *what;
    const float *sl;
    float scale;
  } ctl[] = {{"MiniMax's layer-scaled slopes", mm, scale}, {"no 1/sqrt(D) scale", sl, 1.0f},
             {"slopes of the heads reversed", rev, scale}};
  for (int i = 0; i < 3; i++) {
    float *a = prefill(f.q, f.k, f.v, T, zero, ctl[i].sl, ctl[i].scale);
    const double e = packed_err(a, N, f.out, f.state);
    printf("  control %-30s off by %.3f (must exceed %.0e)\n", ctl[i].what, e, CTRL_MIN);
    assert_true(e > CTRL_MIN);
    free(a);
  }
  free(zero), unload(&f);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slopes),
      cmocka_unit_test(test_reference),
      cmocka_unit_test(test_negative_controls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
