// Lightning attention's document form (ops.h, tpr_lightning_attention_docs:
// packed training sequences) on the CPU: the prefill and its backward
// against the double-precision recurrence (lightning_ref.h) run on each
// document separately -- the first from the given state, every later one
// from zeros -- over random document layouts (starts inside a block, on a
// block's edge, one-token documents, a single document); the backward rule
// through a program against central finite differences; negative controls:
// the state carried across document starts (the reference over the whole
// window, and the op's plain form) must fail the same bound; the shape rules
// and the run-time check of lo refuse what is not a document layout. Fresh
// random inputs each run (seed printed).
#include "grad_check.h"
#include "lightning_ref.h"
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_BOUND 1e-5   // f32 kernel vs double reference, relative to each part's largest magnitude
#define CTRL_MIN 1e-3    // a control must be off by at least 100x the bound
#define NMSE_BOUND 1e-6  // finite differences, h = 1e-2: the op is linear in each of q, k, v and the state

// A random problem: q, k, v (T, H, D), S0 (H, D, D), slopes (H), dy packed
// (d o | d final state), lo (T) i32 each token's document start.
typedef struct dcase {
  int64_t T, H, D, B, n_docs;
  int64_t starts[32];
  float *q, *k, *v, *S0, *sl, *dy;
  int32_t *lo;
  tpr_tensor *t[7];  // q, k, v, S0, slopes, dy, lo
} dcase;

// Documents: `starts` (ascending, starts[0] = 0) given, or random (n < 0).
static dcase make_case(int64_t T, int64_t H, int64_t D, int64_t B, const int64_t *starts, int n) {
  dcase c = {.T = T, .H = H, .D = D, .B = B};
  if (n > 0) {
    memcpy(c.starts, starts, (size_t)n * sizeof *starts);
    c.n_docs = n;
  } else {  // each token after the first starts a document with chance 1/4
    c.starts[c.n_docs++] = 0;
    for (int64_t t = 1; t < T && c.n_docs < 32; t++)
      if (tt_randint(0, 3) == 0) c.starts[c.n_docs++] = t;
  }
  const int64_t s3[3] = {T, H, D}, sS[3] = {H, D, D}, nd = T * H * D + H * D * D;
  c.t[0] = tt_random_f32(tt_cpu(), 3, s3, &c.q);
  c.t[1] = tt_random_f32(tt_cpu(), 3, s3, &c.k);
  c.t[2] = tt_random_f32(tt_cpu(), 3, s3, &c.v);
  c.t[3] = tt_random_f32(tt_cpu(), 3, sS, &c.S0);
  c.sl = malloc((size_t)H * sizeof *c.sl);
  tpr_lightning_slopes(H, 1, 4, c.sl);
  c.t[4] = tt_from_host(TPR_F32, 1, &H, c.sl);
  c.t[5] = tt_random_f32(tt_cpu(), 1, &nd, &c.dy);
  c.lo = malloc((size_t)(T ? T : 1) * sizeof *c.lo);
  for (int64_t d = 0, t = 0; t < T; t++) {
    if (d + 1 < c.n_docs && c.starts[d + 1] == t) d++;
    c.lo[t] = (int32_t)c.starts[d];
  }
  c.t[6] = tt_from_host(TPR_I32, 1, &T, c.lo);
  return c;
}

static void free_case(dcase *c) {
  free(c->q), free(c->k), free(c->v), free(c->S0), free(c->sl), free(c->dy), free(c->lo);
  for (int i = 0; i < 7; i++) tpr_tensor_free(c->t[i]);
}

static int64_t doc_len(const dcase *c, int64_t d) { return (d + 1 < c->n_docs ? c->starts[d + 1] : c->T) - c->starts[d]; }

// The op (forward, or backward) in the document form (docs) or the plain
// one; the packed output on the host, poisoned with NaN first.
static float *run(bool bwd, bool docs, const dcase *c) {
  const int64_t n = c->T * c->H * c->D, ns = c->H * c->D * c->D, n_out = bwd ? 3 * n + ns : n + ns;
  tpr_tensor *out = tt_new(TPR_F32, 1, &n_out);
  float *o = tpr_tensor_data(out);
  for (int64_t i = 0; i < n_out; i++) o[i] = NAN;
  const tpr_op_attrs at = {.n_i = 2, .i = {c->B, docs}};
  const tpr_tensor *in[7] = {c->t[0], c->t[1], c->t[2], c->t[3], c->t[4], bwd ? c->t[5] : c->t[6], c->t[6]};
  TT_OK(tpr_op_run(tt_cpu(), bwd ? TPR_OP_LIGHTNING_ATTENTION_BWD : TPR_OP_LIGHTNING_ATTENTION, in,
                   5 + bwd + docs, &at, out));
  float *h = tt_to_host(out);
  tpr_tensor_free(out);
  return h;
}

// The reference forward: o (T*H*D) | final state, each document alone
// (separate = false: one recurrence over the whole window, the control).
static double *ref_forward(const dcase *c, bool separate) {
  const int64_t n = c->T * c->H * c->D, ns = c->H * c->D * c->D, w = c->H * c->D;
  double *r = malloc((size_t)(n + ns) * sizeof *r), *S = r + n;
  for (int64_t e = 0; e < ns; e++) S[e] = c->S0[e];
  if (!separate) {
    lref_forward(c->T, c->H, c->D, c->q, c->k, c->v, c->sl, S, r);
    return r;
  }
  for (int64_t d = 0; d < c->n_docs; d++) {
    const int64_t t0 = c->starts[d];
    if (d > 0) memset(S, 0, (size_t)ns * sizeof *S);
    lref_forward(doc_len(c, d), c->H, c->D, c->q + t0 * w, c->k + t0 * w, c->v + t0 * w, c->sl, S, r + t0 * w);
  }
  return r;
}

// The reference backward: dq | dk | dv | dS0, each document alone (its
// start state S0 or zeros; its end state's cotangent d(final) for the last,
// zero for the others), or (separate = false) over the whole window.
static double *ref_backward(const dcase *c, bool separate) {
  const int64_t n = c->T * c->H * c->D, ns = c->H * c->D * c->D, w = c->H * c->D;
  double *r = malloc((size_t)(3 * n + ns) * sizeof *r), *dS = malloc((size_t)ns * sizeof *dS);
  float *zeros = calloc((size_t)ns, sizeof *zeros);
  const int64_t nd = separate ? c->n_docs : 1;
  for (int64_t d = 0; d < nd; d++) {
    const int64_t t0 = separate ? c->starts[d] : 0, len = separate ? doc_len(c, d) : c->T, a = t0 * w;
    lref_backward(len, c->H, c->D, c->q + a, c->k + a, c->v + a, c->sl, d ? zeros : c->S0, c->dy + a,
                  d + 1 == nd ? c->dy + n : zeros, r + a, r + n + a, r + 2 * n + a, dS);
    if (d == 0) memcpy(r + 3 * n, dS, (size_t)ns * sizeof *dS);
  }
  free(dS), free(zeros);
  return r;
}

// The worst of the packed parts' errors (sizes parts[i]), each relative to its own magnitude.
static double parts_err(const float *got, const double *want, const int64_t *parts, int n_parts) {
  double worst = 0;
  for (int i = 0, at = 0; i < n_parts; at += (int)parts[i++])
    if (parts[i]) worst = fmax(worst, tt_max_rel_err(got + at, want + at, (size_t)parts[i]));
  return worst;
}

static void layout_str(const dcase *c, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "starts");
  for (int64_t d = 0; d < c->n_docs && at < cap; d++) at += (size_t)snprintf(buf + at, cap - at, " %lld", (long long)c->starts[d]);
}

// Forward and backward against the per-document reference; with more than
// one document, the controls (the state carried across starts) must fail.
static void check_case(dcase *c) {
  const int64_t n = c->T * c->H * c->D, ns = c->H * c->D * c->D;
  const int64_t fp[2] = {n, ns}, bp[4] = {n, n, n, ns};
  float *fo = run(false, true, c), *bo = run(true, true, c);
  double *fw = ref_forward(c, true), *bw = ref_backward(c, true);
  const double ef = parts_err(fo, fw, fp, 2), eb = parts_err(bo, bw, bp, 4);
  char lay[256];
  layout_str(c, lay, sizeof lay);
  printf("  T %2lld H %lld D %2lld block %lld, %s: forward %.2e, backward %.2e (bound %.0e)", (long long)c->T,
         (long long)c->H, (long long)c->D, (long long)c->B, lay, ef, eb, REF_BOUND);
  assert_true(ef <= REF_BOUND && eb <= REF_BOUND);
  if (c->n_docs > 1) {  // o and dq/dk/dv: the final state of the last document is alike either way only by chance
    double *cf = ref_forward(c, false), *cb = ref_backward(c, false);
    float *pf = run(false, false, c), *pb = run(true, false, c);
    const double e_ref_f = tt_max_rel_err(fo, cf, (size_t)n), e_ref_b = parts_err(bo, cb, bp, 3);
    const double e_op_f = tt_max_rel_err(pf, fw, (size_t)n), e_op_b = parts_err(pb, bw, bp, 3);
    printf("; carried across documents: reference %.2e / %.2e, the plain op %.2e / %.2e (must exceed %.0e)",
           e_ref_f, e_ref_b, e_op_f, e_op_b, CTRL_MIN);
    assert_true(e_ref_f > CTRL_MIN && e_ref_b > CTRL_MIN && e_op_f > CTRL_MIN && e_op_b > CTRL_MIN);
    free(cf), free(cb), free(pf), free(pb);
  }
  printf("\n");
  free(fo), free(bo), free(fw), free(bw);
}

static void test_reference(void **state) {
  (void)state;
  const struct {
    int64_t T, H, D, B;
    int n;
    int64_t starts[6];
  } fixed[] = {
      {11, 3, 8, 4, 3, {0, 4, 8}},       // starts on block edges
      {13, 2, 8, 4, 4, {0, 2, 7, 12}},   // inside blocks, a one-token last document
      {9, 2, 16, 4, 5, {0, 1, 2, 3, 6}}, // one-token documents in a row
      {10, 3, 8, 4, 1, {0}},             // one document: the plain form's result
      {17, 2, 8, 1, 3, {0, 5, 9}},       // block 1
      {12, 2, 8, 64, 3, {0, 3, 10}},     // a block longer than T
  };
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
    dcase c = make_case(fixed[i].T, fixed[i].H, fixed[i].D, fixed[i].B, fixed[i].starts, fixed[i].n);
    check_case(&c);
    free_case(&c);
  }
  for (int r = 0; r < 6; r++) {  // random layouts
    dcase c = make_case(tt_randint(2, 37), tt_randint(1, 4), 8, tt_randint(1, 8), NULL, -1);
    check_case(&c);
    free_case(&c);
  }
}

// ---------------------------------------------------------------- finite differences

static const int64_t FD_T = 9, FD_H = 2, FD_D = 4, FD_B = 3;
static const int32_t FD_LO[9] = {0, 0, 2, 2, 2, 2, 6, 6, 6};  // documents [0, 2), [2, 6), [6, 9)

// o alone through tpr_pb_lightning_attention_docs's view of the packed
// output (the final state's cotangent then zero).
static tpr_status build_o_only(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id st;
  return tpr_pb_lightning_attention_docs(p, in[0], in[1], in[2], in[3], in[4], in[5], FD_B, out, &st);
}

// The op itself (both outputs in the loss), or build's graph.
static double fd(const char *name, tt_grad_build_fn build, double corrupt) {
  tt_grad_case c = {.name = name, .n_in = 6, .diff = {true, true, true, true, false, false},
                    .op = TPR_OP_LIGHTNING_ATTENTION, .attrs = {.n_i = 2, .i = {FD_B, 1}}, .build = build,
                    .corrupt = corrupt};
  for (int i = 0; i < 3; i++) c.in[i] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){FD_T, FD_H, FD_D}, NULL);
  c.in[3] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){FD_H, FD_D, FD_D}, NULL);
  float sl[2];
  tpr_lightning_slopes(FD_H, 0, 2, sl);
  c.in[4] = tt_from_host(TPR_F32, 1, &FD_H, sl);
  c.in[5] = tt_from_host(TPR_I32, 1, &FD_T, FD_LO);
  const double e = tt_grad_check(&c);
  tt_grad_free_inputs(&c);
  return e;
}

static void test_grad_fd(void **state) {
  (void)state;
  const double both = fd("lightning docs T 9 block 3, 3 documents (both outputs)", NULL, 0);
  const double o_only = fd("lightning docs, o only", build_o_only, 0);
  const double half = fd("lightning docs (control x0.5)", NULL, 0.5);
  printf("  finite differences: NMSE %.3e, o only %.3e (bound %.0e); control x0.5 %.3e (must exceed 1e-2)\n", both,
         o_only, NMSE_BOUND, half);
  assert_true(both <= NMSE_BOUND && o_only <= NMSE_BOUND);
  assert_true(half > 1e-2);
}

// ---------------------------------------------------------------- bad input

static void expect_error(tpr_status rc, tpr_status want, const char *msg) {
  assert_int_equal(rc, want);
  if (!strstr(tpr_last_error(), msg)) fail_msg("error '%s' does not say '%s'", tpr_last_error(), msg);
  printf("  refused: %s\n", tpr_last_error());
}

static tpr_status run_with(const dcase *c, bool bwd, const tpr_tensor *lo, int n_in, int64_t flag) {
  const int64_t n = c->T * c->H * c->D, ns = c->H * c->D * c->D, n_out = bwd ? 3 * n + ns : n + ns;
  tpr_tensor *out = tt_new(TPR_F32, 1, &n_out);
  const tpr_op_attrs at = {.n_i = 2, .i = {c->B, flag}};
  const tpr_tensor *in[7] = {c->t[0], c->t[1], c->t[2], c->t[3], c->t[4], bwd ? c->t[5] : lo, lo};
  tpr_status rc = tpr_op_run(tt_cpu(), bwd ? TPR_OP_LIGHTNING_ATTENTION_BWD : TPR_OP_LIGHTNING_ATTENTION, in, n_in,
                             &at, out);
  tpr_tensor_free(out);
  return rc;
}

static void test_bad_input(void **state) {
  (void)state;
  const int64_t T = 6;
  dcase c = make_case(T, 2, 4, 4, (const int64_t[]){0, 3}, 2);
  const int32_t skip[6] = {0, 0, 0, 1, 1, 1}, first[6] = {1, 1, 1, 1, 1, 1}, back[6] = {0, 0, 2, 2, 0, 0};
  tpr_tensor *ts = tt_from_host(TPR_I32, 1, &T, skip), *tf = tt_from_host(TPR_I32, 1, &T, first);
  tpr_tensor *tb = tt_from_host(TPR_I32, 1, &T, back), *f32 = tt_new(TPR_F32, 1, &T);
  tpr_tensor *shrt = tt_from_host(TPR_I32, 1, (const int64_t[]){T - 1}, skip);
  for (int bwd = 0; bwd < 2; bwd++) {
    expect_error(run_with(&c, bwd, ts, 6 + bwd, 1), TPR_ERR_INVALID_ARG, "lo[3] = 1 after lo[2] = 0");
    expect_error(run_with(&c, bwd, tf, 6 + bwd, 1), TPR_ERR_INVALID_ARG, "lo[0] = 1");
    expect_error(run_with(&c, bwd, tb, 6 + bwd, 1), TPR_ERR_INVALID_ARG, "lo[4] = 0 after lo[3] = 2");
    expect_error(run_with(&c, bwd, f32, 6 + bwd, 1), TPR_ERR_DTYPE, "lo");
    expect_error(run_with(&c, bwd, shrt, 6 + bwd, 1), TPR_ERR_SHAPE, "lo must be (T = 6) i32");
    expect_error(run_with(&c, bwd, c.t[6], 5 + bwd, 1), TPR_ERR_INVALID_ARG, "in its document form");
    expect_error(run_with(&c, bwd, c.t[6], 6 + bwd, 2), TPR_ERR_INVALID_ARG, "the document flag is 0 or 1");
  }
  tpr_tensor_free(ts), tpr_tensor_free(tf), tpr_tensor_free(tb), tpr_tensor_free(f32), tpr_tensor_free(shrt);
  free_case(&c);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference),
      cmocka_unit_test(test_grad_fd),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
