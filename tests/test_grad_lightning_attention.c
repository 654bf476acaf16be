// Lightning attention backward (training, CPU): lightning_attention_bwd (the
// chunked form: block-start states, no (T, T) buffer) against a double
// reverse-mode recurrence (lightning_ref.h) at several T around the block
// size, with the initial state's and the final state's gradients; the
// backward rule against central finite differences (grad_check.h), alone and
// when a graph uses only o (the final state's cotangent then zero through
// the slice); negative controls. Fresh random inputs each run (seed printed).
#include "grad_check.h"
#include "lightning_ref.h"
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_BOUND 1e-5   // f32 kernel vs double reference, relative to each gradient's largest magnitude
#define CTRL_MIN 1e-3    // a control must be off by at least 100x the bound
#define NMSE_BOUND 1e-6  // finite differences, h = 1e-2: the op is linear in each of q, k, v and the state

// Inputs of one case: host copies and contiguous tensors.
typedef struct gcase {
  int64_t T, H, D, B;
  float *q, *k, *v, *S0, *sl, *dy;  // dy: packed (d o (T*H*D) | d final state (H*D*D))
  tpr_tensor *t[6];                 // q, k, v, S0, slopes, dy
} gcase;

static gcase make_case(int64_t T, int64_t H, int64_t D, int64_t B) {
  gcase c = {.T = T, .H = H, .D = D, .B = B};
  const int64_t s3[3] = {T, H, D}, sS[3] = {H, D, D}, nd = T * H * D + H * D * D;
  c.t[0] = tt_random_f32(tt_cpu(), 3, s3, &c.q);
  c.t[1] = tt_random_f32(tt_cpu(), 3, s3, &c.k);
  c.t[2] = tt_random_f32(tt_cpu(), 3, s3, &c.v);
  c.t[3] = tt_random_f32(tt_cpu(), 3, sS, &c.S0);
  c.sl = malloc((size_t)H * sizeof *c.sl);
  tpr_lightning_slopes(H, 1, 4, c.sl);
  c.t[4] = tt_from_host(TPR_F32, 1, &H, c.sl);
  c.t[5] = tt_random_f32(tt_cpu(), 1, &nd, &c.dy);
  return c;
}

static void free_case(gcase *c) {
  free(c->q), free(c->k), free(c->v), free(c->S0), free(c->sl), free(c->dy);
  for (int i = 0; i < 6; i++) tpr_tensor_free(c->t[i]);
}

// The op's packed (dq | dk | dv | dS0) for inputs in[0..6), block B.
static float *run_bwd(const tpr_tensor *const *in, int64_t B, int64_t n_out) {
  tpr_tensor *out = tt_new(TPR_F32, 1, &n_out);
  float *o = tpr_tensor_data(out);
  for (int64_t i = 0; i < n_out; i++) o[i] = NAN;
  const tpr_op_attrs at = {.n_i = 1, .i = {B}};
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_LIGHTNING_ATTENTION_BWD, in, 6, &at, out));
  float *h = tt_to_host(out);
  tpr_tensor_free(out);
  return h;
}

// The worst of the four gradients' errors, each relative to its own magnitude.
static double grads_err(const float *got, const double *want, int64_t n, int64_t ns) {
  double worst = 0;
  for (int g = 0; g < 4; g++) {
    const double e = tt_max_rel_err(got + g * n, want + g * n, (size_t)(g < 3 ? n : ns));
    worst = e > worst ? e : worst;
  }
  return worst;
}

// The reference gradients (dq | dk | dv | dS0) for dy, in double.
static double *ref_grads(const gcase *c, const float *slopes, const float *dy) {
  const int64_t n = c->T * c->H * c->D, ns = c->H * c->D * c->D;
  double *r = malloc((size_t)(3 * n + ns) * sizeof *r);
  lref_backward(c->T, c->H, c->D, c->q, c->k, c->v, slopes, c->S0, dy, dy + n, r, r + n, r + 2 * n, r + 3 * n);
  return r;
}

static void bwd_case(int64_t T, int64_t H, int64_t D, int64_t B) {
  gcase c = make_case(T, H, D, B);
  const int64_t n = T * H * D, ns = H * D * D;
  float *got = run_bwd((const tpr_tensor *const *)c.t, B, 3 * n + ns);
  double *want = ref_grads(&c, c.sl, c.dy);
  const double err = grads_err(got, want, n, ns);
  printf("  T %2lld H %lld D %2lld block %2lld: dq, dk, dv, dstate max rel err %.2e (bound %.0e)\n", (long long)T,
         (long long)H, (long long)D, (long long)B, err, REF_BOUND);
  assert_true(err <= REF_BOUND);
  free(got), free(want), free_case(&c);
}

// T < block, T = block, T not a multiple of block, several blocks, block 1,
// a block longer than T.
static void test_bwd_reference(void **state) {
  (void)state;
  const int64_t Ts[] = {1, 3, 4, 5, 8, 13, 17};
  for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) bwd_case(Ts[i], 3, 8, 4);
  bwd_case(7, 2, 16, 1);
  bwd_case(6, 2, 16, 64);
  bwd_case(37, 4, 16, 8);
}

// Plausible wrong backwards must fail the same bound: (1) d(final state)
// dropped (only d o used), (2) the decay dropped (slopes 0), (3) the
// gradient not carried across blocks (each block's backward from G = 0, i.e.
// from the final state's cotangent only in the last block: the op run block
// by block).
static void test_bwd_controls(void **state) {
  (void)state;
  const int64_t T = 11, H = 3, D = 8, B = 4, n = T * H * D, ns = H * D * D;
  gcase c = make_case(T, H, D, B);
  double *want = ref_grads(&c, c.sl, c.dy);
  float *ok = run_bwd((const tpr_tensor *const *)c.t, B, 3 * n + ns);
  assert_true(grads_err(ok, want, n, ns) <= REF_BOUND);

  float *dy0 = malloc((size_t)(n + ns) * sizeof *dy0);  // the final state's cotangent zeroed
  memcpy(dy0, c.dy, (size_t)n * sizeof *dy0);
  memset(dy0 + n, 0, (size_t)ns * sizeof *dy0);
  tpr_tensor *tdy0 = tt_from_host(TPR_F32, 1, (const int64_t[]){n + ns}, dy0);
  float zero[3] = {0};
  tpr_tensor *tz = tt_from_host(TPR_F32, 1, &H, zero);
  const tpr_tensor *in1[6] = {c.t[0], c.t[1], c.t[2], c.t[3], c.t[4], tdy0};
  const tpr_tensor *in2[6] = {c.t[0], c.t[1], c.t[2], c.t[3], tz, c.t[5]};
  float *nostate = run_bwd(in1, B, 3 * n + ns), *nodecay = run_bwd(in2, B, 3 * n + ns);
  const double e_state = grads_err(nostate, want, n, ns), e_decay = grads_err(nodecay, want, n, ns);
  // block by block, each with the full dy's final-state part: G not carried
  float *blocks = malloc((size_t)(3 * n) * sizeof *blocks);
  for (int64_t t0 = 0; t0 < T; t0 += B) {
    const int64_t len = T - t0 < B ? T - t0 : B, m = len * H * D;
    tpr_tensor *q, *k, *v, *dyb;
    TT_OK(tpr_tensor_slice(c.t[0], 0, t0, len, &q));
    TT_OK(tpr_tensor_slice(c.t[1], 0, t0, len, &k));
    TT_OK(tpr_tensor_slice(c.t[2], 0, t0, len, &v));
    float *d = malloc((size_t)(m + ns) * sizeof *d);
    memcpy(d, c.dy + t0 * H * D, (size_t)m * sizeof *d);
    memcpy(d + m, c.dy + n, (size_t)ns * sizeof *d);
    dyb = tt_from_host(TPR_F32, 1, (const int64_t[]){m + ns}, d);
    float *r = run_bwd((const tpr_tensor *const[]){q, k, v, c.t[3], c.t[4], dyb}, B, 3 * m + ns);
    for (int g = 0; g < 3; g++) memcpy(blocks + g * n + t0 * H * D, r + g * m, (size_t)m * sizeof *r);
    free(d), free(r), tpr_tensor_free(q), tpr_tensor_free(k), tpr_tensor_free(v), tpr_tensor_free(dyb);
  }
  double e_carry = 0;
  for (int g = 0; g < 3; g++) e_carry = fmax(e_carry, tt_max_rel_err(blocks + g * n, want + g * n, (size_t)n));
  printf("  controls: d(final state) dropped %.2e, decay dropped %.2e, gradient not carried across blocks %.2e "
         "(each must exceed %.0e)\n", e_state, e_decay, e_carry, CTRL_MIN);
  assert_true(e_state > CTRL_MIN && e_decay > CTRL_MIN && e_carry > CTRL_MIN);
  free(want), free(ok), free(dy0), free(nostate), free(nodecay), free(blocks);
  tpr_tensor_free(tdy0), tpr_tensor_free(tz), free_case(&c);
}

// ---------------------------------------------------------------- finite differences

static void fd_case(const char *name, int64_t T, int64_t H, int64_t D, int64_t B, tt_grad_build_fn build,
                    double corrupt, double *nmse) {
  tt_grad_case c = {.name = name, .n_in = 5, .diff = {true, true, true, true, false},
                    .op = TPR_OP_LIGHTNING_ATTENTION, .attrs = {.n_i = 1, .i = {B}}, .build = build,
                    .corrupt = corrupt};
  c.in[0] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){T, H, D}, NULL);
  c.in[1] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){T, H, D}, NULL);
  c.in[2] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){T, H, D}, NULL);
  c.in[3] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){H, D, D}, NULL);
  float sl[4];
  tpr_lightning_slopes(H, 0, 2, sl);
  c.in[4] = tt_from_host(TPR_F32, 1, &H, sl);
  if (nmse) *nmse = tt_grad_check(&c);
  else tt_grad_expect(&c, NMSE_BOUND);
  tt_grad_free_inputs(&c);
}

// o alone, or the final state alone, through tpr_pb_lightning_attention's
// views of the packed output (the other part's cotangent arrives as zeros).
static tpr_status build_o_only(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id st;
  return tpr_pb_lightning_attention(p, in[0], in[1], in[2], in[3], in[4], 3, out, &st);
}
static tpr_status build_state_only(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id o;
  return tpr_pb_lightning_attention(p, in[0], in[1], in[2], in[3], in[4], 3, &o, out);
}

static void test_grad_fd(void **state) {
  (void)state;
  fd_case("lightning T 7 block 3 (both outputs)", 7, 2, 4, 3, NULL, 0, NULL);
  fd_case("lightning T 3 block 4", 3, 2, 4, 4, NULL, 0, NULL);
  fd_case("lightning T 9 block 3, o only", 9, 2, 4, 3, build_o_only, 0, NULL);
  fd_case("lightning T 8 block 3, state only", 8, 2, 4, 3, build_state_only, 0, NULL);
  double half, sign;
  fd_case("lightning (control x0.5)", 7, 2, 4, 3, NULL, 0.5, &half);
  fd_case("lightning (control sign)", 7, 2, 4, 3, NULL, -1, &sign);
  printf("  controls: gradient x0.5 NMSE %.3e, sign error NMSE %.3e (must exceed 1e-2)\n", half, sign);
  assert_true(half > 1e-2 && sign > 1e-2);
}

// The slopes are constants: asking for their gradient is refused by name.
static void test_slopes_refused(void **state) {
  (void)state;
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  tpr_value_id in[5], out, loss, g;
  const int64_t s3[3] = {4, 2, 4}, sS[3] = {2, 4, 4}, h = 2;
  for (int i = 0; i < 3; i++) {
    char nm[8];
    snprintf(nm, sizeof nm, "x%d", i);
    TT_OK(tpr_program_param(p, nm, TPR_F32, 3, s3, &in[i]));
  }
  TT_OK(tpr_program_param(p, "state", TPR_F32, 3, sS, &in[3]));
  TT_OK(tpr_program_param(p, "slopes", TPR_F32, 1, &h, &in[4]));
  const tpr_op_attrs at = {.n_i = 1, .i = {2}};
  TT_OK(tpr_program_op(p, TPR_OP_LIGHTNING_ATTENTION, in, 5, &at, &out));
  TT_OK(tpr_pb_sum_to(p, out, 1, (const int64_t[]){1}, &loss));
  assert_int_equal(tpr_program_build_backward(p, loss, &in[4], 1, NULL, &g), TPR_ERR_UNSUPPORTED);
  assert_non_null(strstr(tpr_last_error(), "slopes are constants"));
  tpr_program_free(p);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bwd_reference),
      cmocka_unit_test(test_bwd_controls),
      cmocka_unit_test(test_grad_fd),
      cmocka_unit_test(test_slopes_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
