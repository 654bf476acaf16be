// Attention's document form (ops.h: i[0] = 1, + lo (T) i32; query t sees
// keys [lo[t], start + t]), the block-diagonal causal mask of packed training
// sequences (docs/training.md "Packed sequences"): the forward and
// attention_bwd kernels against a double-precision reference written here,
// the backward rule against central finite differences, the same bits at 1
// and 3 threads, the program round trip, and the refusals. Fresh random
// inputs and document boundaries each run (seed printed; TPR_TEST_SEED=...).
//
// Negative controls: the plain causal op (no lo) must miss the reference by
// far, forward and backward.
#include "attention_ref.h"
#include "grad_check.h"
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FWD_BOUND 2e-6  // max |got - want| / max |want|: f32 softmax and p @ v over <= 700 keys (seen ~2e-7)
#define BWD_BOUND 1e-5  // the same for dq, dk, dv: two more sgemm chains in f32 (seen ~6e-7)
#define FD_BOUND 1e-6   // finite differences' NMSE (as test_grad_attention.c)

typedef struct dims {
  int64_t T, S, Hq, Hkv, D, start;
  float scale;
} dims;

static tpr_tensor *index1(int64_t v) {
  int32_t v32 = (int32_t)v;
  return tt_from_host(TPR_I32, 1, (const int64_t[]){1}, &v32);
}

// lo (T): random document starts in [0, start + T): query t's bound is the
// last start <= start + t (0 before the first), as a packed window gives.
// At least 3 documents when there is room.
static int32_t *random_lo(const dims *a) {
  const int64_t L = a->start + a->T;
  int32_t *lo = malloc((size_t)a->T * sizeof *lo);
  char *begins = calloc((size_t)L, 1);
  const int n_docs = L > 8 ? 2 + (int)tt_randint(0, 3) : 1;
  for (int i = 0; i < n_docs; i++) begins[tt_randint(1, L - 1)] = 1;
  int64_t cur = 0;
  for (int64_t j = 0; j < L; j++) {
    if (begins[j]) cur = j;
    if (j >= a->start) lo[j - a->start] = (int32_t)cur;
  }
  free(begins);
  return lo;
}

// Probabilities (S) of query t, head h over keys [lo, start + t], in double.
static void ref_probs(const dims *a, const float *Q, const float *K, const int32_t *lo, int64_t t, int64_t h,
                      double *p) {
  const int64_t g = h / (a->Hq / a->Hkv), j0 = lo ? lo[t] : 0, n = a->start + t + 1, D = a->D;
  double m = -INFINITY, sum = 0;
  for (int64_t j = j0; j < n; j++) {
    double s = 0;
    for (int64_t d = 0; d < D; d++) s += (double)Q[(t * a->Hq + h) * D + d] * K[(j * a->Hkv + g) * D + d];
    p[j] = s * a->scale;
    m = fmax(m, p[j]);
  }
  for (int64_t j = 0; j < a->S; j++) p[j] = j >= j0 && j < n ? exp(p[j] - m) : 0;
  for (int64_t j = j0; j < n; j++) sum += p[j];
  for (int64_t j = j0; j < n; j++) p[j] /= sum;
}

// out (T, Hq, D), and for cotangent dO: dQ, dK, dV, in double.
static void ref_attention(const dims *a, const float *Q, const float *K, const float *V, const int32_t *lo,
                          const float *dO, double *out, double *dQ, double *dK, double *dV) {
  const int64_t D = a->D;
  memset(dQ, 0, (size_t)(a->T * a->Hq * D) * sizeof *dQ);
  memset(dK, 0, (size_t)(a->S * a->Hkv * D) * sizeof *dK);
  memset(dV, 0, (size_t)(a->S * a->Hkv * D) * sizeof *dV);
  double *p = malloc((size_t)a->S * sizeof *p), *dp = malloc((size_t)a->S * sizeof *dp);
  for (int64_t t = 0; t < a->T; t++)
    for (int64_t h = 0; h < a->Hq; h++) {
      const int64_t g = h / (a->Hq / a->Hkv), qo = (t * a->Hq + h) * D, n = a->start + t + 1;
      ref_probs(a, Q, K, lo, t, h, p);
      for (int64_t d = 0; d < D; d++) {
        double o = 0;
        for (int64_t j = 0; j < n; j++) o += p[j] * V[(j * a->Hkv + g) * D + d];
        out[qo + d] = o;
      }
      ref_attention_row_backward(n, D, a->Hkv, g, a->scale, p, Q + qo, K, V, dO + qo, dQ + qo, dK, dV, dp);
    }
  free(p), free(dp);
}

// max |got - want| / max |want| over n elements (infinite if got has a NaN).
static double rel_err(const float *got, const double *want, int64_t n) {
  double e = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    e = fmax(e, isfinite(got[i]) ? fabs(got[i] - want[i]) : INFINITY);
    m = fmax(m, fabs(want[i]));
  }
  return e / m;
}

// Runs the op (forward or attention_bwd) on be, documents on or off; a host copy of its output.
static float *run(tpr_backend *be, bool bwd, bool docs, const dims *a, const float *Q, const float *K,
                  const float *V, const int32_t *lo, const float *dO) {
  const int64_t qs[3] = {a->T, a->Hq, a->D}, ks[3] = {a->S, a->Hkv, a->D};
  const int64_t nq = a->T * a->Hq * a->D, nk = a->S * a->Hkv * a->D, npk = nq + 2 * nk;
  tpr_tensor *t[6] = {0}, *out = NULL;
  const int32_t s32 = (int32_t)a->start;
  TT_OK(tpr_tensor_new(be, TPR_F32, 3, qs, &t[0]));
  TT_OK(tpr_tensor_new(be, TPR_F32, 3, ks, &t[1]));
  TT_OK(tpr_tensor_new(be, TPR_F32, 3, ks, &t[2]));
  TT_OK(tpr_tensor_new(be, TPR_I32, 1, (const int64_t[]){1}, &t[3]));
  TT_OK(tpr_tensor_from_host(t[0], Q, (size_t)nq * 4));
  TT_OK(tpr_tensor_from_host(t[1], K, (size_t)nk * 4));
  TT_OK(tpr_tensor_from_host(t[2], V, (size_t)nk * 4));
  TT_OK(tpr_tensor_from_host(t[3], &s32, 4));
  int n = 4;
  if (bwd) {
    TT_OK(tpr_tensor_new(be, TPR_F32, 3, qs, &t[n]));
    TT_OK(tpr_tensor_from_host(t[n++], dO, (size_t)nq * 4));
  }
  if (docs) {
    TT_OK(tpr_tensor_new(be, TPR_I32, 1, (const int64_t[]){a->T}, &t[n]));
    TT_OK(tpr_tensor_from_host(t[n++], lo, (size_t)a->T * 4));
  }
  tpr_op_attrs at = {.n_i = docs, .i = {1}, .n_f = 1, .f = {a->scale}};
  if (bwd) TT_OK(tpr_tensor_new(be, TPR_F32, 1, &npk, &out));
  else TT_OK(tpr_tensor_new(be, TPR_F32, 3, qs, &out));
  TT_OK(tpr_op_run(be, bwd ? TPR_OP_ATTENTION_BWD : TPR_OP_ATTENTION, (const tpr_tensor *const *)t, n, &at, out));
  const int64_t m = bwd ? npk : nq;
  float *h = malloc((size_t)m * sizeof *h);
  TT_OK(tpr_tensor_to_host(out, h, (size_t)m * sizeof *h));
  for (int i = 0; i < n; i++) tpr_tensor_free(t[i]);
  tpr_tensor_free(out);
  return h;
}

// One case: forward and backward against the reference, the controls, and
// the same bits at 3 threads as at 1.
static void docs_case(dims a) {
  const int64_t nq = a.T * a.Hq * a.D, nk = a.S * a.Hkv * a.D;
  float *Q = malloc((size_t)nq * 4), *K = malloc((size_t)nk * 4), *V = malloc((size_t)nk * 4);
  float *dO = malloc((size_t)nq * 4);
  tt_fill_normal(Q, nq, 1.0), tt_fill_normal(K, nk, 1.0), tt_fill_normal(V, nk, 1.0), tt_fill_normal(dO, nq, 1.0);
  // Rows past start + T are never read: NaN there would show.
  for (int64_t i = (a.start + a.T) * a.Hkv * a.D; i < nk; i++) K[i] = V[i] = NAN;
  int32_t *lo = random_lo(&a);
  double *out = malloc((size_t)nq * 8), *dq = malloc((size_t)nq * 8), *dk = malloc((size_t)nk * 8);
  double *dv = malloc((size_t)nk * 8);
  ref_attention(&a, Q, K, V, lo, dO, out, dq, dk, dv);
  tpr_backend *be3 = NULL;
  TT_OK(tpr_backend_cpu_new(&(tpr_cpu_options){.n_threads = 3}, &be3));

  float *f = run(tt_cpu(), false, true, &a, Q, K, V, lo, dO), *f3 = run(be3, false, true, &a, Q, K, V, lo, dO);
  float *b = run(tt_cpu(), true, true, &a, Q, K, V, lo, dO);
  float *pf = run(tt_cpu(), false, false, &a, Q, K, V, lo, dO), *pb = run(tt_cpu(), true, false, &a, Q, K, V, lo, dO);
  // dk, dv rows past start + T: zero (the reference's too).
  const double ef = rel_err(f, out, nq), eq = rel_err(b, dq, nq), ek = rel_err(b + nq, dk, nk),
               ev = rel_err(b + nq + nk, dv, nk);
  const double cf = rel_err(pf, out, nq), cq = rel_err(pb, dq, nq), ck = rel_err(pb + nq, dk, nk);
  printf("docs T %lld S %lld start %lld Hq %lld Hkv %lld D %lld, lo[T-1] %d: fwd %.2e, dq %.2e, dk %.2e, dv %.2e; "
         "plain causal (control): fwd %.2e, dq %.2e, dk %.2e\n", (long long)a.T, (long long)a.S, (long long)a.start,
         (long long)a.Hq, (long long)a.Hkv, (long long)a.D, lo[a.T - 1], ef, eq, ek, ev, cf, cq, ck);
  assert_true(ef < FWD_BOUND);
  assert_true(eq < BWD_BOUND && ek < BWD_BOUND && ev < BWD_BOUND);
  assert_true(cf > 0.05);
  assert_true(cq > 0.05 && ck > 0.05);
  assert_memory_equal(f, f3, (size_t)nq * 4);
  free(f), free(f3), free(b), free(pf), free(pb);
  tpr_backend_free(be3);
  free(Q), free(K), free(V), free(dO), free(lo), free(out), free(dq), free(dk), free(dv);
}

static void test_docs_kernels(void **state) {
  docs_case((dims){12, 12, 4, 2, 8, 0, 0.35f});       // a training window: start 0, S = T
  docs_case((dims){150, 150, 6, 2, 13, 0, 0.28f});    // > one 128-query block, odd D, bounds inside key tiles
  docs_case((dims){300, 300, 2, 1, 64, 0, 0.125f});   // crosses the 256-key chunk
  docs_case((dims){20, 40, 4, 4, 16, 15, 0.25f});     // start > 0
  docs_case((dims){3, 700, 4, 2, 16, 650, 0.25f});    // a few queries over many keys: split over the keys
}

// The backward rule (autodiff of the document form) against central differences.
static void test_docs_grad(void **state) {
  dims a = {9, 9, 4, 2, 8, 0, 0.35f};
  int32_t *lo = random_lo(&a);
  tt_grad_case c = {.name = "attention, documents", .n_in = 5, .diff = {true, true, true, false, false},
                    .op = TPR_OP_ATTENTION, .attrs = {.n_i = 1, .i = {1}, .n_f = 1, .f = {a.scale}}};
  c.in[0] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.T, a.Hq, a.D}, NULL);
  c.in[1] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.S, a.Hkv, a.D}, NULL);
  c.in[2] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){a.S, a.Hkv, a.D}, NULL);
  c.in[3] = index1(0);
  c.in[4] = tt_from_host(TPR_I32, 1, (const int64_t[]){a.T}, lo);
  tt_grad_expect(&c, FD_BOUND);
  tt_grad_free_inputs(&c);
  free(lo);
}

static tpr_status build_docs(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_attention_docs(p, in[0], in[1], in[2], in[3], in[4], 0.3f, out);
}

// The program form round-trips; bad bounds and shapes are refused by name.
static void test_docs_program_and_refusals(void **state) {
  const int64_t T = 6, qs[3] = {T, 2, 4}, ks[3] = {8, 1, 4};
  tpr_tensor *q = tt_random_f32(tt_cpu(), 3, qs, NULL), *k = tt_random_f32(tt_cpu(), 3, ks, NULL);
  tpr_tensor *st = index1(2), *out = tt_new(TPR_F32, 3, qs);
  int32_t good[6] = {0, 0, 3, 3, 3, 6}, bad[6] = {0, 0, 3, 3, 7, 6}, neg[6] = {0, -1, 0, 0, 0, 0};
  int64_t good64[6] = {0};
  tpr_tensor *lo = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, good);
  TT_OK(tpr_attention_docs(tt_cpu(), q, k, k, st, lo, 0.3f, out));
  tt_check_roundtrip(build_docs, 5, (const tpr_tensor *const[]){q, k, k, st, lo}, out);

  tpr_tensor *lb = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, bad);
  assert_int_equal(tpr_attention_docs(tt_cpu(), q, k, k, st, lb, 0.3f, out), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "lo[4] = 7 outside [0, start + 4 = 6]"));
  tpr_tensor *ln = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, neg);
  assert_int_equal(tpr_attention_docs(tt_cpu(), q, k, k, st, ln, 0.3f, out), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "lo[1] = -1"));
  tpr_tensor *l64 = tt_from_host(TPR_I64, 1, (const int64_t[]){T}, good64);
  assert_int_equal(tpr_attention_docs(tt_cpu(), q, k, k, st, l64, 0.3f, out), TPR_ERR_DTYPE);
  tpr_tensor *lshort = tt_from_host(TPR_I32, 1, (const int64_t[]){T - 1}, good);
  assert_int_equal(tpr_attention_docs(tt_cpu(), q, k, k, st, lshort, 0.3f, out), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "lo must be (T = 6) i32"));
  // The flag without lo, and a flag that is not 0 or 1.
  tpr_op_attrs docs = {.n_i = 1, .i = {1}, .n_f = 1, .f = {0.3f}}, two = {.n_i = 1, .i = {2}, .n_f = 1, .f = {0.3f}};
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_ATTENTION, (const tpr_tensor *const[]){q, k, k, st}, 4, &docs, out),
                   TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "attention takes 5 inputs in its document form"));
  assert_int_equal(
      tpr_op_run(tt_cpu(), TPR_OP_ATTENTION, (const tpr_tensor *const[]){q, k, k, st, lo}, 5, &two, out),
      TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "the document flag is 0 or 1"));
  tpr_tensor *all[] = {q, k, st, out, lo, lb, ln, l64, lshort};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tpr_tensor_free(all[i]);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_docs_kernels),
      cmocka_unit_test(test_docs_grad),
      cmocka_unit_test(test_docs_program_and_refusals),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(tt_cpu());
  return rc;
}
