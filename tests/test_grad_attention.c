// Backward of rope and attention (training, CPU): rope_bwd and attention_bwd
// kernels, their shape rules and the backward rules, against central finite
// differences (grad_check.h) and a double-precision attention backward with
// a materialised softmax. Fresh random inputs each run (seed printed).
#include "attention_ref.h"
#include "grad_check.h"
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NMSE_BOUND 1e-6  // smooth ops in f32 with h = 1e-2 (see test_autodiff.c); observed values are printed
#define REF_BOUND 1e-5   // f32 kernel vs double reference, relative to the reference's largest magnitude

static tpr_tensor *rnd(int nd, const int64_t *shape) { return tt_random_f32(tt_cpu(), nd, shape, NULL); }

static tpr_tensor *index1(tpr_dtype dt, int64_t v) {  // a (1) i32/i64 tensor
  int64_t v64 = v;
  int32_t v32 = (int32_t)v;
  return tt_from_host(dt, 1, (const int64_t[]){1}, dt == TPR_I32 ? (const void *)&v32 : (const void *)&v64);
}

// (T) random positions in [0, 5000): not sorted, not contiguous.
static tpr_tensor *positions(tpr_dtype dt, int64_t T) {
  int64_t p64[64];
  int32_t p32[64];
  assert_true(T <= 64);
  for (int64_t t = 0; t < T; t++) p64[t] = p32[t] = (int32_t)tt_randint(0, 4999);
  return tt_from_host(dt, 1, (const int64_t[]){T}, dt == TPR_I32 ? (const void *)p32 : (const void *)p64);
}

static void check_case(tt_grad_case *c) { tt_grad_expect(c, NMSE_BOUND); }

static void free_inputs(tt_grad_case *c) { tt_grad_free_inputs(c); }

// Runs one op eagerly into a new tensor of `out_shape` poisoned with NaN
// first, so every element the kernel should write is checked.
static tpr_tensor *run_op(tpr_op_kind op, const tpr_tensor *const *in, int n_in, const tpr_op_attrs *at, int nd,
                          const int64_t *out_shape) {
  tpr_tensor *out = tt_new(TPR_F32, nd, out_shape);
  float *o = tpr_tensor_data(out);
  for (int64_t i = 0; i < tpr_tensor_numel(out); i++) o[i] = NAN;
  TT_OK(tpr_op_run(tt_cpu(), op, in, n_in, at, out));
  return out;
}

// ---------------------------------------------------------------- rope

static void rope_grad_case(const char *name, int64_t T, int64_t NH, int64_t D, int64_t rd, tpr_dtype pdt) {
  tt_grad_case c = {.name = name, .n_in = 2, .diff = {true, false}, .op = TPR_OP_ROPE,
                    .attrs = {.n_i = 1, .i = {rd}, .n_f = 1, .f = {1e4f}}};
  c.in[0] = rnd(3, (const int64_t[]){T, NH, D});
  c.in[1] = positions(pdt, T);
  check_case(&c);
  free_inputs(&c);
}

static void test_rope_grad(void **state) {
  rope_grad_case("rope partial (rd 6 of 10)", 6, 3, 10, 6, TPR_I32);
  rope_grad_case("rope full (rd = D = 8)", 5, 2, 8, 8, TPR_I64);
}

// rope_bwd exactly: pass-through dims are dy bit for bit; it inverts rope
// (rope_bwd(rope(x)) = x), while the forward used as its own backward (a
// plausible wrong rule) does not; a strided dy gives the same bits.
static void test_rope_bwd_exact(void **state) {
  const int64_t T = 7, NH = 3, D = 12, rd = 8, shape[3] = {T, NH, D};
  tpr_op_attrs at = {.n_i = 1, .i = {rd}, .n_f = 1, .f = {1e4f}};
  tpr_tensor *x = rnd(3, shape), *pos = positions(TPR_I32, T);
  tpr_tensor *y = run_op(TPR_OP_ROPE, (const tpr_tensor *const[]){x, pos}, 2, &at, 3, shape);
  tpr_tensor *back = run_op(TPR_OP_ROPE_BWD, (const tpr_tensor *const[]){y, pos}, 2, &at, 3, shape);
  tpr_tensor *twice = run_op(TPR_OP_ROPE, (const tpr_tensor *const[]){y, pos}, 2, &at, 3, shape);
  const float *xd = tpr_tensor_data(x), *yd = tpr_tensor_data(y), *bd = tpr_tensor_data(back),
              *wd = tpr_tensor_data(twice);
  double xmax = 0, err = 0, wrong = 0;
  int64_t copied = 0;
  for (int64_t i = 0; i < T * NH * D; i++) {
    xmax = fmax(xmax, fabs(xd[i]));
    err = fmax(err, fabs((double)bd[i] - xd[i]));
    wrong = fmax(wrong, fabs((double)wd[i] - xd[i]));
    if (i % D >= rd) {  // pass-through: dx = dy exactly
      assert_memory_equal(&bd[i], &yd[i], sizeof(float));
      copied++;
    }
  }
  err /= xmax, wrong /= xmax;
  printf("  rope_bwd(rope(x)) vs x: max rel err %.3e (bound %.0e); rope(rope(x)) (wrong rule): %.3e; "
         "%lld pass-through elements exact\n", err, REF_BOUND, wrong, (long long)copied);
  assert_true(err < REF_BOUND);
  assert_true(wrong > 1e-1);

  // Strided dy: a (NH, T, D) tensor viewed as (T, NH, D).
  tpr_tensor *base = rnd(3, (const int64_t[]){NH, T, D}), *dy = NULL;
  TT_OK(tpr_tensor_permute(base, (const int[]){1, 0, 2}, &dy));
  tpr_tensor *dyc = tt_new(TPR_F32, 3, shape);
  TT_OK(tpr_cast(tt_cpu(), dy, dyc));
  tpr_tensor *g1 = run_op(TPR_OP_ROPE_BWD, (const tpr_tensor *const[]){dy, pos}, 2, &at, 3, shape);
  tpr_tensor *g2 = run_op(TPR_OP_ROPE_BWD, (const tpr_tensor *const[]){dyc, pos}, 2, &at, 3, shape);
  assert_memory_equal(tpr_tensor_data(g1), tpr_tensor_data(g2), tpr_tensor_nbytes(g2));

  tpr_tensor *ts[] = {x, pos, y, back, twice, base, dy, dyc, g1, g2};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) tpr_tensor_free(ts[i]);
}

// ---------------------------------------------------------------- attention reference

typedef struct attn_dims {
  int64_t T, S, Hq, Hkv, D, start;
  float scale;
} attn_dims;

// The KV head query head h reads: the real mapping, or h % Hkv (a plausible
// bug for the negative control).
static int64_t kv_head(const attn_dims *a, int64_t h, bool wrong) {
  return wrong ? h % a->Hkv : h / (a->Hq / a->Hkv);
}

// Materialised softmax in double: probabilities (L) of query t, head h.
static void ref_probs(const attn_dims *a, const float *Q, const float *K, int64_t t, int64_t h, bool wrong,
                      double *p) {
  const int64_t L = a->start + t + 1, g = kv_head(a, h, wrong), D = a->D;
  double m = -INFINITY, sum = 0;
  for (int64_t j = 0; j < L; j++) {
    double s = 0;
    for (int64_t d = 0; d < D; d++) s += (double)Q[(t * a->Hq + h) * D + d] * K[(j * a->Hkv + g) * D + d];
    p[j] = s * a->scale;
    m = fmax(m, p[j]);
  }
  for (int64_t j = 0; j < L; j++) sum += p[j] = exp(p[j] - m);
  for (int64_t j = 0; j < L; j++) p[j] /= sum;
}

// sum over (t, h, d) of out * R, the grad check's loss, in double.
static double ref_loss(const attn_dims *a, const float *Q, const float *K, const float *V, const float *R,
                       bool wrong) {
  double *p = malloc((size_t)a->S * sizeof *p), loss = 0;
  for (int64_t t = 0; t < a->T; t++)
    for (int64_t h = 0; h < a->Hq; h++) {
      ref_probs(a, Q, K, t, h, wrong, p);
      const int64_t g = kv_head(a, h, wrong);
      for (int64_t d = 0; d < a->D; d++) {
        double o = 0;
        for (int64_t j = 0; j <= a->start + t; j++) o += p[j] * V[(j * a->Hkv + g) * a->D + d];
        loss += o * R[(t * a->Hq + h) * a->D + d];
      }
    }
  free(p);
  return loss;
}

// dQ (T*Hq*D), dK, dV (S*Hkv*D) of attention for cotangent dO, in double.
static void ref_backward(const attn_dims *a, const float *Q, const float *K, const float *V, const float *dO,
                         double *dQ, double *dK, double *dV) {
  const int64_t D = a->D;
  memset(dQ, 0, (size_t)(a->T * a->Hq * D) * sizeof *dQ);
  memset(dK, 0, (size_t)(a->S * a->Hkv * D) * sizeof *dK);
  memset(dV, 0, (size_t)(a->S * a->Hkv * D) * sizeof *dV);
  double *p = malloc((size_t)a->S * sizeof *p), *dp = malloc((size_t)a->S * sizeof *dp);
  for (int64_t t = 0; t < a->T; t++)
    for (int64_t h = 0; h < a->Hq; h++) {
      const int64_t L = a->start + t + 1, g = kv_head(a, h, false), qo = (t * a->Hq + h) * D;
      ref_probs(a, Q, K, t, h, false, p);
      ref_attention_row_backward(L, D, a->Hkv, g, a->scale, p, Q + qo, K, V, dO + qo, dQ + qo, dK, dV, dp);
    }
  free(p), free(dp);
}

// ---------------------------------------------------------------- attention gradient checks

static void attn_grad_case(const char *name, attn_dims a, bool dq, bool dkv, int max_points) {
  tt_grad_case c = {.name = name, .n_in = 4, .diff = {dq, dkv, dkv, false}, .op = TPR_OP_ATTENTION,
                    .attrs = {.n_f = 1, .f = {a.scale}}, .max_points = max_points};
  c.in[0] = rnd(3, (const int64_t[]){a.T, a.Hq, a.D});
  c.in[1] = rnd(3, (const int64_t[]){a.S, a.Hkv, a.D});
  c.in[2] = rnd(3, (const int64_t[]){a.S, a.Hkv, a.D});
  c.in[3] = index1(TPR_I32, a.start);
  check_case(&c);
  free_inputs(&c);
}

static void test_attention_grad(void **state) {
  const float s8 = 1.0f / sqrtf(8.0f);
  attn_grad_case("attention GQA 6/2", (attn_dims){5, 5, 6, 2, 8, 0, s8}, true, true, 0);
  attn_grad_case("attention start 3, S 9", (attn_dims){4, 9, 6, 2, 8, 3, s8}, true, true, 0);
  attn_grad_case("attention MHA 3/3", (attn_dims){5, 5, 3, 3, 8, 0, s8}, true, true, 0);
  attn_grad_case("attention MHA, only k/v", (attn_dims){5, 5, 3, 3, 8, 0, s8}, false, true, 0);
  attn_grad_case("attention T 33, D 16", (attn_dims){33, 33, 4, 2, 16, 0, 0.25f}, true, true, 16);
}

// Negative controls. (1) `corrupt`: the checker rejects a gradient off by a
// factor or a sign. (2) The GQA mapping: the op's dK matches finite
// differences of a double forward that reads KV head h / (Hq/Hkv) and fails
// against one that reads h % Hkv -- so a kernel or rule with that mapping
// could not pass these checks.
static void test_attention_controls(void **state) {
  const attn_dims a = {5, 5, 6, 2, 8, 0, 1.0f / sqrtf(8.0f)};
  tt_grad_case c = {.name = "attention GQA (controls)", .n_in = 4, .diff = {true, true, true, false},
                    .op = TPR_OP_ATTENTION, .attrs = {.n_f = 1, .f = {a.scale}}};
  float *Q, *K, *V, *R;
  c.in[0] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.T, a.Hq, a.D}, &Q);
  c.in[1] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.S, a.Hkv, a.D}, &K);
  c.in[2] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.S, a.Hkv, a.D}, &V);
  c.in[3] = index1(TPR_I64, a.start);
  c.corrupt = 0.5;
  double half = tt_grad_check(&c);
  c.corrupt = -1;
  double sign = tt_grad_check(&c);
  printf("  controls: dgrad x0.5 NMSE %.3e, sign error NMSE %.3e (must exceed 1e-2)\n", half, sign);
  assert_true(half > 1e-2 && sign > 1e-2);

  // dK from the op for the loss sum(out * R): dout = R.
  const int64_t nq = a.T * a.Hq * a.D, nk = a.S * a.Hkv * a.D;
  tpr_tensor *r = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.T, a.Hq, a.D}, &R);
  tpr_op_attrs at = {.n_f = 1, .f = {a.scale}};
  tpr_tensor *packed = run_op(TPR_OP_ATTENTION_BWD, (const tpr_tensor *const[]){c.in[0], c.in[1], c.in[2], c.in[3], r},
                              5, &at, 1, (const int64_t[]){nq + 2 * nk});
  const float *dk = (const float *)tpr_tensor_data(packed) + nq;
  double nmse[2];
  for (int wrong = 0; wrong < 2; wrong++) {
    double num = 0, den = 0, h = 1e-4;
    for (int64_t j = 0; j < nk; j++) {
      const float keep = K[j];
      K[j] = keep + (float)h;
      const double hp = (double)K[j] - keep, lp = ref_loss(&a, Q, K, V, R, wrong);
      K[j] = keep - (float)h;
      const double hm = keep - (double)K[j], lm = ref_loss(&a, Q, K, V, R, wrong);
      K[j] = keep;
      const double fd = (lp - lm) / (hp + hm);
      num += (dk[j] - fd) * (dk[j] - fd);
      den += fd * fd;
    }
    nmse[wrong] = num / den;
  }
  printf("  GQA mapping: dk vs FD of h/(Hq/Hkv) forward NMSE %.3e, vs FD of h %% Hkv forward NMSE %.3e\n", nmse[0],
         nmse[1]);
  assert_true(nmse[0] < NMSE_BOUND);
  assert_true(nmse[1] > 1e-2);
  free(Q), free(K), free(V), free(R);
  tpr_tensor_free(r), tpr_tensor_free(packed);
  free_inputs(&c);
}

// ---------------------------------------------------------------- attention_bwd against the double reference

static void ref_case(const char *name, attn_dims a, tpr_dtype sdt, bool strided) {
  const int64_t nq = a.T * a.Hq * a.D, nk = a.S * a.Hkv * a.D, L = a.start + a.T;
  float *Q, *K, *V, *dO;
  tpr_tensor *qb, *dob, *q, *dout;
  if (strided) {  // q and dout as (Hq, T, D) tensors viewed as (T, Hq, D)
    qb = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.Hq, a.T, a.D}, NULL);
    dob = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.Hq, a.T, a.D}, NULL);
    TT_OK(tpr_tensor_permute(qb, (const int[]){1, 0, 2}, &q));
    TT_OK(tpr_tensor_permute(dob, (const int[]){1, 0, 2}, &dout));
    tpr_tensor *qc = tt_new(TPR_F32, 3, q->shape), *dc = tt_new(TPR_F32, 3, dout->shape);
    TT_OK(tpr_cast(tt_cpu(), q, qc));
    TT_OK(tpr_cast(tt_cpu(), dout, dc));
    Q = tt_to_host(qc), dO = tt_to_host(dc);
    tpr_tensor_free(qc), tpr_tensor_free(dc);
  } else {
    qb = dob = NULL;
    q = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.T, a.Hq, a.D}, &Q);
    dout = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.T, a.Hq, a.D}, &dO);
  }
  tpr_tensor *k = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.S, a.Hkv, a.D}, &K);
  tpr_tensor *v = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.S, a.Hkv, a.D}, &V);
  // Rows past start + T - 1 are never read: NaN there must not leak.
  float *kd = tpr_tensor_data(k), *vd = tpr_tensor_data(v);
  for (int64_t i = L * a.Hkv * a.D; i < nk; i++) kd[i] = vd[i] = K[i] = V[i] = NAN;
  tpr_tensor *st = index1(sdt, a.start);
  tpr_op_attrs at = {.n_f = 1, .f = {a.scale}};
  const tpr_tensor *in[5] = {q, k, v, st, dout};
  tpr_tensor *packed = run_op(TPR_OP_ATTENTION_BWD, in, 5, &at, 1, (const int64_t[]){nq + 2 * nk});
  const float *got = tpr_tensor_data(packed);

  double *dQ = malloc((size_t)nq * sizeof *dQ), *dK = malloc((size_t)nk * sizeof *dK),
         *dV = malloc((size_t)nk * sizeof *dV);
  ref_backward(&a, Q, K, V, dO, dQ, dK, dV);
  const int64_t seen = L * a.Hkv * a.D;  // dk/dv elements of rows [0, L)
  double eq = tt_max_rel_err(got, dQ, (size_t)nq), ek = tt_max_rel_err(got + nq, dK, (size_t)seen),
         ev = tt_max_rel_err(got + nq + nk, dV, (size_t)seen);
  int64_t zeros = 0;
  for (int64_t i = seen; i < nk; i++) {  // exactly zero, not merely small
    assert_true(got[nq + i] == 0.0f && got[nq + nk + i] == 0.0f);
    zeros += 2;
  }
  printf("  attention_bwd %-26s max rel err dq %.3e dk %.3e dv %.3e (bound %.0e); %lld unread-row grads exactly 0\n",
         name, eq, ek, ev, REF_BOUND, (long long)zeros);
  assert_true(eq < REF_BOUND && ek < REF_BOUND && ev < REF_BOUND);

  free(Q), free(K), free(V), free(dO), free(dQ), free(dK), free(dV);
  tpr_tensor *ts[] = {q, k, v, st, dout, packed, qb, dob};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
    if (ts[i]) tpr_tensor_free(ts[i]);
}

static void test_attention_bwd_reference(void **state) {
  const float s8 = 1.0f / sqrtf(8.0f);
  ref_case("GQA 6/2, T 5", (attn_dims){5, 5, 6, 2, 8, 0, s8}, TPR_I32, false);
  ref_case("start 3, S 9 (rows 7, 8)", (attn_dims){4, 9, 6, 2, 8, 3, s8}, TPR_I64, false);
  ref_case("MHA 3/3", (attn_dims){7, 7, 3, 3, 4, 0, 0.5f}, TPR_I32, false);
  ref_case("strided q and dout", (attn_dims){6, 10, 4, 2, 8, 2, s8}, TPR_I32, true);
  ref_case("T 150 (2 query blocks)", (attn_dims){150, 180, 2, 1, 8, 20, s8}, TPR_I32, false);
}

// ---------------------------------------------------------------- shape rules, run-time checks, round trip

static tpr_status build_rope_bwd(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {4}, .n_f = 1, .f = {1e4f}};
  return tpr_program_op(p, TPR_OP_ROPE_BWD, in, 2, &at, out);
}
static tpr_status build_attention_bwd(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {0.3f}};
  return tpr_program_op(p, TPR_OP_ATTENTION_BWD, in, 5, &at, out);
}

static void test_errors_and_roundtrip(void **state) {
  const int64_t T = 3, S = 5, Hq = 4, Hkv = 2, D = 6, nq = T * Hq * D, nk = S * Hkv * D;
  tpr_tensor *q = rnd(3, (const int64_t[]){T, Hq, D}), *k = rnd(3, (const int64_t[]){S, Hkv, D}),
             *v = rnd(3, (const int64_t[]){S, Hkv, D}), *dout = rnd(3, (const int64_t[]){T, Hq, D}),
             *bad_dout = rnd(3, (const int64_t[]){T, Hq + 1, D}), *out = tt_new(TPR_F32, 1, (const int64_t[]){nq + 2 * nk});
  tpr_op_attrs at = {.n_f = 1, .f = {0.3f}};
  // dout not q's shape: the shape rule.
  tpr_tensor *st0 = index1(TPR_I32, 0);
  tpr_status rc = tpr_op_run(tt_cpu(), TPR_OP_ATTENTION_BWD, (const tpr_tensor *const[]){q, k, v, st0, bad_dout}, 5, &at, out);
  printf("  bad dout: %s: %s\n", tpr_status_name(rc), tpr_last_error());
  assert_int_equal(rc, TPR_ERR_SHAPE);
  // start out of range at run time: INVALID_ARG, nothing written.
  const int64_t bad_starts[2] = {-1, S - T + 1};
  for (int i = 0; i < 2; i++) {
    tpr_tensor *st = index1(TPR_I64, bad_starts[i]);
    float *o = tpr_tensor_data(out);
    for (int64_t j = 0; j < nq + 2 * nk; j++) o[j] = NAN;
    rc = tpr_op_run(tt_cpu(), TPR_OP_ATTENTION_BWD, (const tpr_tensor *const[]){q, k, v, st, dout}, 5, &at, out);
    printf("  start %lld: %s: %s\n", (long long)bad_starts[i], tpr_status_name(rc), tpr_last_error());
    assert_int_equal(rc, TPR_ERR_INVALID_ARG);
    for (int64_t j = 0; j < nq + 2 * nk; j++) assert_true(isnan(o[j]));
    tpr_tensor_free(st);
  }
  // rope_bwd: odd rotary_dim.
  tpr_tensor *pos = positions(TPR_I32, T), *dx = tt_new(TPR_F32, 3, (const int64_t[]){T, Hq, D});
  tpr_op_attrs rat = {.n_i = 1, .i = {3}, .n_f = 1, .f = {1e4f}};
  rc = tpr_op_run(tt_cpu(), TPR_OP_ROPE_BWD, (const tpr_tensor *const[]){dout, pos}, 2, &rat, dx);
  printf("  rope_bwd rotary_dim 3: %s: %s\n", tpr_status_name(rc), tpr_last_error());
  assert_int_equal(rc, TPR_ERR_SHAPE);

  // Both ops round-trip through a serialized program bit for bit.
  rat.i[0] = 4;
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_ROPE_BWD, (const tpr_tensor *const[]){dout, pos}, 2, &rat, dx));
  tt_check_roundtrip(build_rope_bwd, 2, (const tpr_tensor *const[]){dout, pos}, dx);
  tpr_tensor *st1 = index1(TPR_I32, 1);
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_ATTENTION_BWD, (const tpr_tensor *const[]){q, k, v, st1, dout}, 5, &at, out));
  tt_check_roundtrip(build_attention_bwd, 5, (const tpr_tensor *const[]){q, k, v, st1, dout}, out);

  tpr_tensor *ts[] = {q, k, v, dout, bad_dout, out, st0, pos, dx, st1};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) tpr_tensor_free(ts[i]);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rope_grad),          cmocka_unit_test(test_rope_bwd_exact),
      cmocka_unit_test(test_attention_grad),     cmocka_unit_test(test_attention_controls),
      cmocka_unit_test(test_attention_bwd_reference), cmocka_unit_test(test_errors_and_roundtrip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
