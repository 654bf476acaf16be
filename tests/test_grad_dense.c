// Backward rules of the dense ops (rms_norm, swiglu, sigmoid, softmax, embedding,
// embedding_shard, index_select, the views, cast, sum_squares, rms_scale)
// against central finite differences on fresh random inputs (seed printed),
// the distributed QK-norm chain simulated at tp = 2 in one program (with a
// per-rank-norm negative control), exact checks of the scatter kernels, and
// the backward kernels' and shape rules' error paths.
#include "grad_check.h"
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Smooth ops in f32 with h = 1e-2: the central difference's truncation error
// is ~h^2 relative (NMSE ~1e-8) and f32 rounding adds ~1e-10; a wrong term
// in a rule gives NMSE >= 1e-4 (the 1%-corrupt control below).
#define NMSE_BOUND 1e-6

static tpr_tensor *rnd(int nd, const int64_t *shape) { return tt_random_f32(tt_cpu(), nd, shape, NULL); }

static tpr_tensor *f32_from(int nd, const int64_t *shape, const float *h) {
  return tt_from_host(TPR_F32, nd, shape, h);
}

// An i32 or i64 tensor (n) from values.
static tpr_tensor *ids_from(tpr_dtype dt, int nd, const int64_t *shape, const int64_t *v) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  int32_t v32[64];
  assert_true(n <= 64);
  if (dt == TPR_I64) return tt_from_host(dt, nd, shape, v);
  for (int64_t i = 0; i < n; i++) v32[i] = (int32_t)v[i];
  return tt_from_host(dt, nd, shape, v32);
}

static void check_case(tt_grad_case *c) { tt_grad_expect(c, NMSE_BOUND); }

static void free_inputs(tt_grad_case *c) { tt_grad_free_inputs(c); }

static float g_eps;  // eps of the rms_norm graphs below

// ---- rms_norm

// x given as (H, T): rms_norm reads the (T, H) transpose, a strided view,
// and its output is transposed back so its cotangent is strided too (the
// cast copies it contiguous: grad_check reads its output as plain memory).
static tpr_status build_rms_norm_strided(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id xt, y, yt;
  TPR_CHECK(tpr_pb_permute(p, in[0], (const int[]){1, 0}, &xt));
  TPR_CHECK(tpr_pb_rms_norm(p, xt, in[1], g_eps, &y));
  TPR_CHECK(tpr_pb_permute(p, y, (const int[]){1, 0}, &yt));
  return tpr_pb_cast(p, yt, TPR_F32, out);
}

// Rows of x scaled by in[2] (T, 1) (not differentiated) before the norm:
// the norm sees rows of very different magnitude while the probed x stays
// O(1), so one finite-difference step suits every row.
static tpr_status build_rms_norm_scaled(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id xs;
  TPR_CHECK(tpr_pb_mul(p, in[0], in[2], &xs));
  return tpr_pb_rms_norm(p, xs, in[1], g_eps, out);
}

static void test_rms_norm(void **state) {
  for (int k = 0; k < 3; k++) {  // random shapes, 2-D and 3-D
    int64_t T = tt_randint(1, 4), H = tt_randint(3, 9);
    // h 2e-3: a row of norm ~0.1 makes h = 1e-2 a large step (truncation
    // ~(h/|x|)^2); f32 rounding noise stays ~1e-9 NMSE. H >= 3: a random
    // 2-vector is shorter than 0.05 one time in 800 (TPR_TEST_SEED=
    // 433410266898660: NMSE 6.4e-6), a 3-vector one time in 20,000.
    tt_grad_case c = {.name = "rms_norm", .n_in = 2, .diff = {true, true}, .op = TPR_OP_RMS_NORM,
                      .attrs = {.n_f = 1, .f = {1e-5f}}, .h = 2e-3};
    c.in[0] = k == 2 ? rnd(3, (const int64_t[]){2, T, H}) : rnd(2, (const int64_t[]){T, H});
    c.in[1] = rnd(1, (const int64_t[]){H});
    check_case(&c);
    if (k == 0) {  // the bound catches a 1% error in the rule
      c.corrupt = 1.01;
      double bad = tt_grad_check(&c);
      printf("  control: rms_norm gradient off by 1%%: NMSE %.3e (must exceed %.0e)\n", bad, NMSE_BOUND);
      assert_true(bad > NMSE_BOUND);
    }
    free_inputs(&c);
  }
  // Strided x, tiny eps.
  g_eps = 1e-12f;
  tt_grad_case s = {.name = "rms_norm strided, eps 1e-12", .n_in = 2, .diff = {true, true},
                    .build = build_rms_norm_strided};
  s.in[0] = rnd(2, (const int64_t[]){7, 3});
  s.in[1] = rnd(1, (const int64_t[]){7});
  check_case(&s);
  free_inputs(&s);
  // Rows 1e-3 .. 1e3 apart; with eps 1e-6 the 1e-3 row's mean square is
  // about eps, so eps's place in the rule is tested too.
  const float scales[4] = {1e-3f, 1.0f, 1e3f, 3e-2f};
  for (int e = 0; e < 2; e++) {
    g_eps = e ? 1e-6f : 1e-12f;
    tt_grad_case c = {.name = e ? "rms_norm row scales, eps 1e-6" : "rms_norm row scales, eps 1e-12", .n_in = 3,
                      .diff = {true, true, false}, .build = build_rms_norm_scaled};
    c.in[0] = rnd(2, (const int64_t[]){4, 6});
    c.in[1] = rnd(1, (const int64_t[]){6});
    c.in[2] = f32_from(2, (const int64_t[]){4, 1}, scales);
    check_case(&c);
    free_inputs(&c);
  }
}

// ---- swiglu: gate and up as the two halves of one (T, 2F) projection
// (strided views, as a fused w13 output gives them).
static tpr_status build_swiglu_fused(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id gate, up;
  tpr_tensor d;
  TPR_CHECK(tpr_program_value(p, in[0], &d));
  int64_t F = d.shape[1] / 2;
  TPR_CHECK(tpr_pb_slice(p, in[0], 1, 0, F, &gate));
  TPR_CHECK(tpr_pb_slice(p, in[0], 1, F, F, &up));
  return tpr_pb_swiglu(p, gate, up, out);
}

static void test_swiglu(void **state) {
  for (int k = 0; k < 2; k++) {
    int64_t T = tt_randint(1, 5), F = tt_randint(1, 8);
    tt_grad_case c = {.name = "swiglu", .n_in = 2, .diff = {true, true}, .op = TPR_OP_SWIGLU};
    const int64_t shape[3] = {2, T, F};
    c.in[0] = rnd(2 + k, k ? shape : shape + 1);
    c.in[1] = rnd(2 + k, k ? shape : shape + 1);
    check_case(&c);
    free_inputs(&c);
  }
  tt_grad_case f = {.name = "swiglu fused halves", .n_in = 1, .diff = {true}, .build = build_swiglu_fused};
  f.in[0] = rnd(2, (const int64_t[]){3, 10});
  check_case(&f);
  free_inputs(&f);
}

// ---- sigmoid: alone, on a transposed view (its output transposed back and
// copied: a strided cotangent), and as minimax's output gate sigmoid(g) * o.
static tpr_status build_sigmoid_strided(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id xt, y, yt;
  TPR_CHECK(tpr_pb_permute(p, in[0], (const int[]){1, 0}, &xt));
  TPR_CHECK(tpr_pb_sigmoid(p, xt, &y));
  TPR_CHECK(tpr_pb_permute(p, y, (const int[]){1, 0}, &yt));
  return tpr_pb_cast(p, yt, TPR_F32, out);
}

static tpr_status build_sigmoid_gate(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id s;
  TPR_CHECK(tpr_pb_sigmoid(p, in[0], &s));
  return tpr_pb_mul(p, s, in[1], out);
}

static void test_sigmoid(void **state) {
  const int64_t shape[3] = {2, tt_randint(1, 5), tt_randint(2, 9)};
  // Inputs N(0, 9): the probed points reach the flat tails (|x| ~ 6, slope ~ 2e-3).
  float *big = malloc((size_t)(shape[0] * shape[1] * shape[2]) * sizeof *big);
  tt_fill_normal(big, (size_t)(shape[0] * shape[1] * shape[2]), 3.0);
  tt_grad_case c = {.name = "sigmoid", .n_in = 1, .diff = {true}, .op = TPR_OP_SIGMOID};
  c.in[0] = f32_from(3, shape, big);
  check_case(&c);
  c.corrupt = 1.01;  // the bound catches a 1% error in the rule
  double bad = tt_grad_check(&c);
  printf("  control: sigmoid gradient off by 1%%: NMSE %.3e (must exceed %.0e)\n", bad, NMSE_BOUND);
  assert_true(bad > NMSE_BOUND);
  free_inputs(&c);
  free(big);
  tt_grad_case s = {.name = "sigmoid strided", .n_in = 1, .diff = {true}, .build = build_sigmoid_strided};
  s.in[0] = rnd(2, (const int64_t[]){7, 3});
  check_case(&s);
  free_inputs(&s);
  tt_grad_case g = {.name = "sigmoid gate", .n_in = 2, .diff = {true, true}, .build = build_sigmoid_gate};
  g.in[0] = rnd(2, shape + 1);
  g.in[1] = rnd(2, shape + 1);
  check_case(&g);
  free_inputs(&g);
}

// ---- softmax: over a transposed x, with the output transposed back so the
// backward sees a strided cotangent too (then copied contiguous by a cast:
// grad_check reads its output as contiguous memory).
static tpr_status build_softmax_strided(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id xt, y, yt;
  TPR_CHECK(tpr_pb_permute(p, in[0], (const int[]){1, 0}, &xt));
  TPR_CHECK(tpr_pb_softmax(p, xt, &y));
  TPR_CHECK(tpr_pb_permute(p, y, (const int[]){1, 0}, &yt));
  return tpr_pb_cast(p, yt, TPR_F32, out);
}

static void test_softmax(void **state) {
  for (int k = 0; k < 2; k++) {
    int64_t T = tt_randint(1, 4), N = tt_randint(2, 9);
    tt_grad_case c = {.name = "softmax", .n_in = 1, .diff = {true}, .op = TPR_OP_SOFTMAX};
    c.in[0] = k ? rnd(3, (const int64_t[]){2, T, N}) : rnd(2, (const int64_t[]){T, N});
    check_case(&c);
    free_inputs(&c);
  }
  tt_grad_case s = {.name = "softmax strided", .n_in = 1, .diff = {true}, .build = build_softmax_strided};
  s.in[0] = rnd(2, (const int64_t[]){6, 3});
  check_case(&s);
  free_inputs(&s);
}

// ---- embedding, embedding_shard, index_select (repeated ids)

static void test_embedding(void **state) {
  int64_t V = 5, H = 3;
  const int64_t ids1[7] = {4, 1, 1, 0, 4, 4, 2};  // repeats; row 3 unused (zero gradient)
  tt_grad_case c = {.name = "embedding i32", .n_in = 2, .diff = {true, false}, .op = TPR_OP_EMBEDDING};
  c.in[0] = rnd(2, (const int64_t[]){V, H});
  c.in[1] = ids_from(TPR_I32, 1, (const int64_t[]){7}, ids1);
  check_case(&c);
  free_inputs(&c);
  const int64_t ids2[6] = {2, 0, 2, 3, 2, 0};
  tt_grad_case d = {.name = "embedding i64 (2, 3)", .n_in = 2, .diff = {true, false}, .op = TPR_OP_EMBEDDING};
  d.in[0] = rnd(2, (const int64_t[]){4, 5});
  d.in[1] = ids_from(TPR_I64, 2, (const int64_t[]){2, 3}, ids2);
  check_case(&d);
  free_inputs(&d);
}

static void test_embedding_shard(void **state) {
  // Vl = 4, shard 1 owns ids [4, 8): ids 0..3 and 8..11 belong to other
  // shards and must add nothing; 5 and 6 repeat; local row 3 (id 7) unused.
  int64_t Vl = 4, H = 3;
  const int64_t ids[9] = {5, 0, 6, 9, 5, 4, 11, 6, 5}, one = 1;
  tt_grad_case c = {.name = "embedding_shard", .n_in = 3, .diff = {true, false, false},
                    .op = TPR_OP_EMBEDDING_SHARD};
  c.in[0] = rnd(2, (const int64_t[]){Vl, H});
  c.in[1] = ids_from(TPR_I32, 1, (const int64_t[]){9}, ids);
  c.in[2] = ids_from(TPR_I64, 1, (const int64_t[]){1}, &one);
  check_case(&c);
  free_inputs(&c);
}

static tpr_status build_index_select_dim(tpr_program *p, const tpr_value_id *in, tpr_value_id *out, int dim) {
  tpr_value_id sel;
  TPR_CHECK(tpr_pb_index_select(p, in[0], dim, in[1], &sel));
  return tpr_pb_mul(p, sel, sel, out);  // nonlinear, so the gradient depends on x
}
static tpr_status build_is0(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return build_index_select_dim(p, in, out, 0);
}
static tpr_status build_is1(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return build_index_select_dim(p, in, out, 1);
}
static tpr_status build_is2(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return build_index_select_dim(p, in, out, 2);
}

static void test_index_select(void **state) {
  const tt_grad_build_fn builds[3] = {build_is0, build_is1, build_is2};
  const int64_t idx[5] = {2, 0, 2, 2, 1};
  for (int dim = 0; dim < 3; dim++) {
    char name[48];
    snprintf(name, sizeof name, "index_select dim %d", dim);
    tt_grad_case c = {.name = name, .n_in = 2, .diff = {true, false}, .build = builds[dim]};
    c.in[0] = rnd(3, (const int64_t[]){3, 3, 3});
    c.in[1] = ids_from(dim == 1 ? TPR_I64 : TPR_I32, 1, (const int64_t[]){dim == 2 ? 3 : 5}, idx);
    check_case(&c);
    free_inputs(&c);
  }
}

// ---- views, cast, sum_squares

static tpr_status build_views(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id a, b, c, d, e;
  TPR_CHECK(tpr_pb_permute(p, in[0], (const int[]){2, 0, 1}, &a));  // (4, 2, 3) strided
  TPR_CHECK(tpr_pb_slice(p, a, 0, 1, 2, &b));                        // (2, 2, 3)
  TPR_CHECK(tpr_pb_cast(p, b, TPR_F32, &c));                         // contiguous copy
  TPR_CHECK(tpr_pb_reshape(p, c, 2, (const int64_t[]){3, 4}, &d));   // (3, 4)
  TPR_CHECK(tpr_pb_slice(p, d, 1, 1, 3, &e));                        // (3, 3) strided
  return tpr_pb_mul(p, e, e, out);
}

static tpr_status build_sum_squares_strided(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id xt;
  TPR_CHECK(tpr_pb_permute(p, in[0], (const int[]){1, 0}, &xt));
  return tpr_pb_sum_squares(p, xt, out);
}

static void test_views_cast_sum_squares(void **state) {
  tt_grad_case v = {.name = "permute/slice/cast/reshape", .n_in = 1, .diff = {true}, .build = build_views};
  v.in[0] = rnd(3, (const int64_t[]){2, 3, 4});
  check_case(&v);
  free_inputs(&v);
  tt_grad_case s = {.name = "sum_squares", .n_in = 1, .diff = {true}, .op = TPR_OP_SUM_SQUARES};
  s.in[0] = rnd(3, (const int64_t[]){2, tt_randint(1, 3), tt_randint(1, 9)});
  check_case(&s);
  free_inputs(&s);
  tt_grad_case t = {.name = "sum_squares strided", .n_in = 1, .diff = {true}, .build = build_sum_squares_strided};
  t.in[0] = rnd(2, (const int64_t[]){5, 3});
  check_case(&t);
  free_inputs(&t);
}

// ---- rms_scale. sumsq must be positive; it is drawn in [1, 3] whatever the
// divisor: out moves by ~h / (2 sumsq) relative when sumsq moves by h, so a
// larger sumsq would drown the central difference in f32 rounding of out,
// and the truncation error 0.625 (h / sumsq)^2 stays below 1e-4.
static tpr_tensor *pos_sumsq(int64_t rows) {
  float h[16];
  for (int64_t i = 0; i < rows; i++) h[i] = (float)tt_uniform(1.0, 3.0);
  return f32_from(2, (const int64_t[]){rows, 1}, h);
}

static tpr_status build_rms_scale_strided(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id xs;
  TPR_CHECK(tpr_pb_slice(p, in[0], 1, 2, 5, &xs));  // (T, 5) of (T, 9)
  return tpr_pb_rms_scale(p, xs, in[1], in[2], 12.0f, 1e-6f, out);
}

static void test_rms_scale(void **state) {
  int64_t T = tt_randint(3, 6), N = tt_randint(2, 8);  // >= 3 rows: dsumsq of one row can be ~0
  float div = (float)(2 * N);
  tt_grad_case c = {.name = "rms_scale", .n_in = 3, .diff = {true, true, true}, .op = TPR_OP_RMS_SCALE,
                    .attrs = {.n_f = 2, .f = {div, 1e-5f}}};
  c.in[0] = rnd(2, (const int64_t[]){T, N});
  c.in[1] = pos_sumsq(T);
  c.in[2] = rnd(1, (const int64_t[]){N});
  check_case(&c);
  free_inputs(&c);
  tt_grad_case s = {.name = "rms_scale strided", .n_in = 3, .diff = {true, true, true},
                    .build = build_rms_scale_strided};
  s.in[0] = rnd(2, (const int64_t[]){4, 9});
  s.in[1] = pos_sumsq(4);
  s.in[2] = rnd(1, (const int64_t[]){5});
  check_case(&s);
  free_inputs(&s);
}

// ---- The distributed QK-norm (docs/architecture.md section 5) at tp = 2 in one
// program: x (T, 2N) split into the two ranks' halves, each rank's sum of
// squares, their sum (the all-reduce), and each rank's rms_scale with its
// half of the weight picked by index_select from the (2, N) view with a
// run-time index (the rank tensor). in: x (T, 2N), w (2N), ranks (2) i32 =
// {0, 1}, R (T, 2N) a fixed projection (the output is sum_h y_h * R_h).
enum { QK_T = 3, QK_N = 5 };
static const float QK_EPS = 1e-6f;
static bool g_per_rank;  // the negative control: each rank normalises its own half

static tpr_status build_qk_chain(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id wm, xh[2], ss[2], wh[2], total, y[2], proj[2];
  TPR_CHECK(tpr_pb_reshape(p, in[1], 2, (const int64_t[]){2, QK_N}, &wm));
  for (int h = 0; h < 2; h++) {
    tpr_value_id r, sel;
    TPR_CHECK(tpr_pb_slice(p, in[0], 1, h * QK_N, QK_N, &xh[h]));  // (T, N) strided
    TPR_CHECK(tpr_pb_sum_squares(p, xh[h], &ss[h]));               // (T, 1)
    TPR_CHECK(tpr_pb_slice(p, in[2], 0, h, 1, &r));                // this rank's index
    TPR_CHECK(tpr_pb_index_select(p, wm, 0, r, &sel));             // (1, N)
    TPR_CHECK(tpr_pb_reshape(p, sel, 1, (const int64_t[]){QK_N}, &wh[h]));
  }
  TPR_CHECK(tpr_pb_add(p, ss[0], ss[1], &total));
  for (int h = 0; h < 2; h++) {
    tpr_value_id rh;
    if (g_per_rank)
      TPR_CHECK(tpr_pb_rms_scale(p, xh[h], ss[h], wh[h], (float)QK_N, QK_EPS, &y[h]));
    else
      TPR_CHECK(tpr_pb_rms_scale(p, xh[h], total, wh[h], (float)(2 * QK_N), QK_EPS, &y[h]));
    TPR_CHECK(tpr_pb_slice(p, in[3], 1, h * QK_N, QK_N, &rh));
    TPR_CHECK(tpr_pb_mul(p, y[h], rh, &proj[h]));
  }
  return tpr_pb_add(p, proj[0], proj[1], out);
}

// The unsharded reference: rms_norm over the full (T, 2N) row.
static tpr_status build_qk_reference(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id y;
  TPR_CHECK(tpr_pb_rms_norm(p, in[0], in[1], QK_EPS, &y));
  return tpr_pb_mul(p, y, in[3], out);
}

// d sum(build(in)) / d in[0], in[1] as host copies (the caller frees).
static void grads_of(tt_grad_build_fn build, const tpr_tensor *const *in, int n_in, float **g0, float **g1) {
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  tpr_value_id v[4], out, loss, grads[2];
  for (int i = 0; i < n_in; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    TT_OK(tpr_program_param(p, name, in[i]->dtype, in[i]->ndim, in[i]->shape, &v[i]));
  }
  TT_OK(build(p, v, &out));
  TT_OK(tpr_pb_sum_to(p, out, 1, (const int64_t[]){1}, &loss));
  TT_OK(tpr_program_build_backward(p, loss, v, 2, NULL, grads));
  TT_OK(tpr_program_output(p, grads[0], "g0"));
  TT_OK(tpr_program_output(p, grads[1], "g1"));
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  for (int i = 0; i < n_in; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    TT_OK(tpr_exec_bind(e, name, in[i]));
  }
  TT_OK(tpr_exec_run(e));
  const tpr_tensor *t;
  TT_OK(tpr_exec_output(e, "g0", &t));
  *g0 = tt_to_host(t);
  TT_OK(tpr_exec_output(e, "g1", &t));
  *g1 = tt_to_host(t);
  tpr_exec_free(e);
  tpr_program_free(p);
}

// NMSE of (a0 | a1) against (b0 | b1).
static double nmse2(const float *a0, const float *b0, int64_t n0, const float *a1, const float *b1, int64_t n1) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n0 + n1; i++) {
    double a = i < n0 ? a0[i] : a1[i - n0], b = i < n0 ? b0[i] : b1[i - n0];
    num += (a - b) * (a - b);
    den += b * b;
  }
  return num / den;
}

static void test_qk_norm_chain_tp2(void **state) {
  const int64_t T = QK_T, N2 = 2 * QK_N, ranks[2] = {0, 1};
  float *xh;
  tpr_tensor *x = tt_random_f32(tt_cpu(), 2, (const int64_t[]){T, N2}, &xh);
  for (int64_t t = 0; t < T; t++)  // rank 1's half has 3x the scale: heads differ in norm
    for (int64_t j = QK_N; j < N2; j++) xh[t * N2 + j] *= 3.0f;
  tpr_tensor_free(x);
  x = f32_from(2, (const int64_t[]){T, N2}, xh);
  free(xh);
  tt_grad_case c = {.name = "qk-norm chain tp=2", .n_in = 4, .diff = {true, true, false, false},
                    .build = build_qk_chain};
  c.in[0] = x;
  c.in[1] = rnd(1, (const int64_t[]){N2});
  c.in[2] = ids_from(TPR_I32, 1, (const int64_t[]){2}, ranks);
  c.in[3] = rnd(2, (const int64_t[]){T, N2});
  g_per_rank = false;
  c.max_points = 64;
  check_case(&c);

  // The chain's gradient is the unsharded rms_norm's.
  float *cx, *cw, *rx, *rw, *wx, *ww;
  grads_of(build_qk_chain, c.in, 4, &cx, &cw);
  grads_of(build_qk_reference, c.in, 4, &rx, &rw);
  double vs_ref = nmse2(cx, rx, T * N2, cw, rw, N2);
  // Negative control: per-rank normalisation (sum of squares not summed,
  // divisor N) is a different function with a different gradient.
  g_per_rank = true;
  grads_of(build_qk_chain, c.in, 4, &wx, &ww);
  g_per_rank = false;
  double wrong = nmse2(wx, cx, T * N2, ww, cw, N2);
  printf("  qk-norm chain vs unsharded rms_norm gradient: NMSE %.3e; per-rank norm vs correct: NMSE %.3e\n", vs_ref,
         wrong);
  assert_true(vs_ref < 1e-10);  // same math, double statistics on both sides: only f32 roundings differ
  assert_true(wrong > 1e-2);
  free(cx), free(cw), free(rx), free(rw), free(wx), free(ww);
  free_inputs(&c);
}

// ---- Exact scatter results, program round trips, error paths.

static tpr_op_kind g_op;
static tpr_op_attrs g_at;
static int g_n;
static tpr_status build_one(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_program_op(p, g_op, in, g_n, &g_at, out);
}

// Runs op eagerly into a new out (filled with 7s first); returns its status.
static tpr_status run_op(tpr_op_kind op, const tpr_tensor *const *in, int n, tpr_op_attrs at, tpr_tensor **out) {
  tpr_tensor want;
  TT_OK(tpr__op_infer(op, in, n, &at, &want));
  *out = tt_new(want.dtype, want.ndim, want.shape);
  float *o = tpr_tensor_data(*out);
  for (int64_t i = 0; i < tpr_tensor_numel(*out); i++) o[i] = 7.0f;
  return tpr_op_run(tt_cpu(), op, in, n, &at, *out);
}

static void expect_untouched(const tpr_tensor *t) {
  const float *o = tpr_tensor_data(t);
  for (int64_t i = 0; i < tpr_tensor_numel(t); i++) assert_true(o[i] == 7.0f);
}

static void test_scatter_exact_and_roundtrip(void **state) {
  // embedding_shard_bwd with shard 1 of Vl 3: ids 3..5 are local rows 0..2.
  const int64_t H = 4, ids[8] = {4, 0, 4, 7, 3, 4, 2, 8}, one = 1;
  float *dyh;
  tpr_tensor *dy = tt_random_f32(tt_cpu(), 2, (const int64_t[]){8, H}, &dyh);
  tpr_tensor *idt = ids_from(TPR_I32, 1, (const int64_t[]){8}, ids);
  tpr_tensor *sh = ids_from(TPR_I32, 1, (const int64_t[]){1}, &one), *out;
  const tpr_tensor *in3[3] = {dy, idt, sh};
  tpr_op_attrs at = {.n_i = 1, .i = {3}};
  TT_OK(run_op(TPR_OP_EMBEDDING_SHARD_BWD, in3, 3, at, &out));
  float want[3 * 4] = {0};
  for (int p = 0; p < 8; p++)  // the same f32 adds in token order: bit-exact
    if (ids[p] >= 3 && ids[p] < 6)
      for (int i = 0; i < H; i++) want[(ids[p] - 3) * H + i] += dyh[p * H + i];
  assert_memory_equal(tpr_tensor_data(out), want, sizeof want);
  const float *o = tpr_tensor_data(out);
  for (int i = 0; i < H; i++) assert_true(o[2 * H + i] == 0.0f);  // id 5 never occurs
  g_op = TPR_OP_EMBEDDING_SHARD_BWD, g_at = at, g_n = 3;
  tt_check_roundtrip(build_one, 3, in3, out);
  tpr_tensor_free(out);
  // embedding_bwd over V = 9 and index_select_bwd along dim 0 with n = 9
  // are the same scatter here.
  tpr_tensor *out2;
  const tpr_tensor *in2[2] = {dy, idt};
  TT_OK(run_op(TPR_OP_EMBEDDING_BWD, in2, 2, (tpr_op_attrs){.n_i = 1, .i = {9}}, &out));
  TT_OK(run_op(TPR_OP_INDEX_SELECT_BWD, in2, 2, (tpr_op_attrs){.n_i = 2, .i = {0, 9}}, &out2));
  assert_memory_equal(tpr_tensor_data(out), tpr_tensor_data(out2), tpr_tensor_nbytes(out));
  g_op = TPR_OP_EMBEDDING_BWD, g_at = (tpr_op_attrs){.n_i = 1, .i = {9}}, g_n = 2;
  tt_check_roundtrip(build_one, 2, in2, out);
  g_op = TPR_OP_INDEX_SELECT_BWD, g_at = (tpr_op_attrs){.n_i = 2, .i = {0, 9}};
  tt_check_roundtrip(build_one, 2, in2, out2);
  tpr_tensor_free(out), tpr_tensor_free(out2);
  tpr_tensor_free(dy), tpr_tensor_free(idt), tpr_tensor_free(sh);
  free(dyh);
}

static void expect_error(tpr_op_kind op, const tpr_tensor *const *in, int n, tpr_op_attrs at, tpr_status code) {
  tpr_tensor want;
  tpr_status rc = tpr__op_infer(op, in, n, &at, &want);
  if (rc == TPR_OK) {  // a run-time error: the kernel fails and writes nothing
    tpr_tensor *out;
    rc = run_op(op, in, n, at, &out);
    if (rc != TPR_OK) expect_untouched(out);
    tpr_tensor_free(out);
  }
  printf("  %-20s -> %s: %s\n", tpr_op_name(op), tpr_status_name(rc), rc == TPR_OK ? "" : tpr_last_error());
  assert_int_equal(rc, code);
}

static void test_error_paths(void **state) {
  tpr_tensor *dy = rnd(2, (const int64_t[]){3, 4});
  const int64_t bad_hi[3] = {0, 5, 1}, bad_neg[3] = {1, -1, 0}, ok[3] = {0, 1, 9}, neg1 = -1, zero = 0;
  tpr_tensor *hi = ids_from(TPR_I32, 1, (const int64_t[]){3}, bad_hi);
  tpr_tensor *neg = ids_from(TPR_I64, 1, (const int64_t[]){3}, bad_neg);
  tpr_tensor *okid = ids_from(TPR_I32, 1, (const int64_t[]){3}, ok);
  tpr_tensor *nsh = ids_from(TPR_I32, 1, (const int64_t[]){1}, &neg1);
  tpr_tensor *sh0 = ids_from(TPR_I32, 1, (const int64_t[]){1}, &zero);
  tpr_op_attrs v5 = {.n_i = 1, .i = {5}};
  // Ids out of range at run time: TPR_ERR_INVALID_ARG, out untouched.
  expect_error(TPR_OP_EMBEDDING_BWD, (const tpr_tensor *[]){dy, hi}, 2, v5, TPR_ERR_INVALID_ARG);
  expect_error(TPR_OP_EMBEDDING_BWD, (const tpr_tensor *[]){dy, neg}, 2, v5, TPR_ERR_INVALID_ARG);
  expect_error(TPR_OP_EMBEDDING_SHARD_BWD, (const tpr_tensor *[]){dy, neg, sh0}, 3, v5, TPR_ERR_INVALID_ARG);
  expect_error(TPR_OP_EMBEDDING_SHARD_BWD, (const tpr_tensor *[]){dy, okid, nsh}, 3, v5, TPR_ERR_INVALID_ARG);
  // Ids past the vocabulary belong to no shard: no error, nothing added.
  expect_error(TPR_OP_EMBEDDING_SHARD_BWD, (const tpr_tensor *[]){dy, okid, sh0}, 3, v5, TPR_OK);
  tpr_op_attrs d0n4 = {.n_i = 2, .i = {0, 4}};
  expect_error(TPR_OP_INDEX_SELECT_BWD, (const tpr_tensor *[]){dy, hi}, 2, d0n4, TPR_ERR_INVALID_ARG);
  expect_error(TPR_OP_INDEX_SELECT_BWD, (const tpr_tensor *[]){dy, neg}, 2, d0n4, TPR_ERR_INVALID_ARG);
  // Shape rules.
  tpr_tensor *w3 = rnd(1, (const int64_t[]){3}), *ss = rnd(2, (const int64_t[]){3, 1});
  tpr_tensor *dy2 = rnd(2, (const int64_t[]){2, 4});
  expect_error(TPR_OP_EMBEDDING_BWD, (const tpr_tensor *[]){dy2, okid}, 2, v5, TPR_ERR_SHAPE);
  expect_error(TPR_OP_EMBEDDING_BWD, (const tpr_tensor *[]){dy, okid}, 2, (tpr_op_attrs){0}, TPR_ERR_INVALID_ARG);
  expect_error(TPR_OP_INDEX_SELECT_BWD, (const tpr_tensor *[]){dy, okid}, 2, (tpr_op_attrs){.n_i = 2, .i = {1, 9}},
               TPR_ERR_SHAPE);
  expect_error(TPR_OP_SLICE_BWD, (const tpr_tensor *[]){dy}, 1, (tpr_op_attrs){.n_i = 3, .i = {1, 2, 5}},
               TPR_ERR_SHAPE);
  tpr_op_attrs eps = {.n_f = 1, .f = {1e-6f}}, ds = {.n_f = 2, .f = {4.0f, 1e-6f}};
  expect_error(TPR_OP_RMS_NORM_BWD, (const tpr_tensor *[]){dy, w3, dy}, 3, eps, TPR_ERR_SHAPE);
  expect_error(TPR_OP_SOFTMAX_BWD, (const tpr_tensor *[]){dy, dy2}, 2, (tpr_op_attrs){0}, TPR_ERR_SHAPE);
  expect_error(TPR_OP_SWIGLU_BWD, (const tpr_tensor *[]){dy, dy, dy2}, 3, (tpr_op_attrs){0}, TPR_ERR_SHAPE);
  tpr_tensor *w4 = rnd(1, (const int64_t[]){4});
  expect_error(TPR_OP_RMS_SCALE_BWD, (const tpr_tensor *[]){dy, ss, w4, dy2}, 4, ds, TPR_ERR_SHAPE);
  expect_error(TPR_OP_RMS_SCALE_BWD, (const tpr_tensor *[]){dy, ss, w3, dy}, 4, ds, TPR_ERR_SHAPE);
  tpr_tensor *all[] = {dy, hi, neg, okid, nsh, sh0, w3, ss, dy2, w4};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tpr_tensor_free(all[i]);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rms_norm),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_sigmoid),
      cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_embedding_shard),
      cmocka_unit_test(test_index_select),
      cmocka_unit_test(test_views_cast_sum_squares),
      cmocka_unit_test(test_rms_scale),
      cmocka_unit_test(test_qk_norm_chain_tp2),
      cmocka_unit_test(test_scatter_exact_and_roundtrip),
      cmocka_unit_test(test_error_paths),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
