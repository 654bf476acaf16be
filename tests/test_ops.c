// CPU op kernels against double-precision references, through the public
// eager API. Inputs are fresh random values each run (seed printed; rerun
// with TPR_TEST_SEED=...). Views (permute/transpose/slice) give strided
// inputs; the references read a host copy materialised by index arithmetic
// written here, independent of the library's stride handling.
//
// Error bounds are worst-case first-order rounding analyses in units of
// u = 2^-24 (f32 unit roundoff), measured as tt_max_rel_err: max abs error
// over max |reference|.
#include "ops_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"

#define U32 0x1p-24

static tpr_tensor *view_permute(const tpr_tensor *t, const int *perm) {
  tpr_tensor *v = NULL;
  TT_OK(tpr_tensor_permute(t, perm, &v));
  return v;
}

static tpr_tensor *view_slice(const tpr_tensor *t, int dim, int64_t start, int64_t len) {
  tpr_tensor *v = NULL;
  TT_OK(tpr_tensor_slice(t, dim, start, len, &v));
  return v;
}

// dst = src (nd, shape) permuted: dst.shape[i] = shape[perm[i]], contiguous.
static void host_permute(const void *src, size_t esz, int nd, const int64_t *shape, const int *perm,
                         void *dst) {
  int64_t sst[TPR_MAX_DIMS], dsh[TPR_MAX_DIMS], idx[TPR_MAX_DIMS] = {0}, n = 1, s = 1;
  for (int d = nd - 1; d >= 0; d--) sst[d] = s, s *= shape[d];
  for (int d = 0; d < nd; d++) dsh[d] = shape[perm[d]], n *= dsh[d];
  for (int64_t k = 0; k < n; k++) {
    int64_t so = 0;
    for (int d = 0; d < nd; d++) so += idx[d] * sst[perm[d]];
    memcpy((char *)dst + k * esz, (const char *)src + so * esz, esz);
    for (int d = nd - 1; d >= 0 && ++idx[d] == dsh[d]; d--) idx[d] = 0;
  }
}

// dst = src (rows, cols) with columns [c0, c0 + len).
static void host_cols(const float *src, int64_t rows, int64_t cols, int64_t c0, int64_t len, float *dst) {
  for (int64_t r = 0; r < rows; r++) memcpy(dst + r * len, src + r * cols + c0, len * sizeof *dst);
}

static float *rand_host(int64_t n, double scale) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  tt_fill_normal(h, (size_t)n, scale);
  return h;
}

// ---------------------------------------------------------------- matmul

// C (batch, M, N) = A (batch, M, K) @ B (K, N) shared, or (batch, K, N).
// sabs_max gets max_ij sum_k |a_ik b_kj| for the error bound.
static void ref_matmul(const float *A, const float *B, int64_t batch, bool b_shared, int64_t M,
                       int64_t N, int64_t K, double *C, double *sabs_max) {
  *sabs_max = 0;
  for (int64_t t = 0; t < batch; t++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        const float *a = A + (t * M + i) * K, *b = B + (b_shared ? 0 : t * K * N) + j;
        double s = 0, sa = 0;
        for (int64_t k = 0; k < K; k++) {
          double p = (double)a[k] * b[k * N];
          s += p;
          sa += fabs(p);
        }
        C[(t * M + i) * N + j] = s;
        if (sa > *sabs_max) *sabs_max = sa;
      }
}

// Runs a (view) @ b (view) with the given flags; A and B are the logical
// operands as contiguous hosts. Bound: any summation order gives
// |err_ij| <= gamma_K sum_k |a_ik b_kj| + u|c_ij| (Higham 3.5), so
// max_rel_err <= (K + 2) u max(sum |a b|) / max|C|. It stays near
// (K + 2) u sqrt(K) for N(0,1) data and is O(1) for any wrong element.
static void check_matmul(const tpr_tensor *a, const tpr_tensor *b, bool ta, bool tb, const float *A,
                         const float *B, int out_nd, const int64_t *out_shape) {
  int64_t M = out_shape[out_nd - 2], N = out_shape[out_nd - 1];
  int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
  int64_t batch = tpr_shape_numel(out_nd - 2, out_shape);
  tpr_tensor *out = tt_new(TPR_F32, out_nd, out_shape);
  TT_OK(tpr_matmul(tt_cpu(), a, b, ta, tb, out));
  float *got = tt_to_host(out);
  size_t n = (size_t)(batch * M * N);
  double *want = malloc(n * sizeof *want), sabs;
  ref_matmul(A, B, batch, b->ndim == 2, M, N, K, want, &sabs);
  double max_ref = 1e-30;
  for (size_t i = 0; i < n; i++) max_ref = fmax(max_ref, fabs(want[i]));
  double err = tt_max_rel_err(got, want, n), bound = (K + 2) * U32 * sabs / max_ref;
  if (!(err <= bound))
    fail_msg("matmul M=%lld N=%lld K=%lld batch=%lld ta=%d tb=%d: rel err %.3g > bound %.3g",
             (long long)M, (long long)N, (long long)K, (long long)batch, ta, tb, err, bound);
  free(got);
  free(want);
  tpr_tensor_free(out);
}

// A stored operand for flag t: shape (..., r, c) with (r, c) = t ? (c_log, r_log)
// : (r_log, c_log); *logical gets the (..., r_log, c_log) host.
static tpr_tensor *stored_operand(int nb, const int64_t *bshape, int64_t r_log, int64_t c_log, bool t,
                                  float **logical) {
  int64_t shape[TPR_MAX_DIMS], n = 1;
  for (int d = 0; d < nb; d++) shape[d] = bshape[d], n *= bshape[d];
  shape[nb] = t ? c_log : r_log;
  shape[nb + 1] = t ? r_log : c_log;
  n *= r_log * c_log;
  float *h;
  tpr_tensor *x = tt_random_f32(tt_cpu(), nb + 2, shape, &h);
  *logical = malloc((n ? n : 1) * sizeof(float));
  int perm[TPR_MAX_DIMS];
  for (int d = 0; d < nb + 2; d++) perm[d] = d;
  if (t) perm[nb] = nb + 1, perm[nb + 1] = nb;
  host_permute(h, sizeof(float), nb + 2, shape, perm, *logical);
  free(h);
  return x;
}

// batch dims (nb, bshape) for a; b gets them too unless b_2d.
static void matmul_case(int nb, const int64_t *bshape, bool b_2d, int64_t M, int64_t N, int64_t K,
                        bool ta, bool tb) {
  float *A, *B;
  tpr_tensor *a = stored_operand(nb, bshape, M, K, ta, &A);
  tpr_tensor *b = stored_operand(b_2d ? 0 : nb, bshape, K, N, tb, &B);
  int64_t oshape[TPR_MAX_DIMS];
  for (int d = 0; d < nb; d++) oshape[d] = bshape[d];
  oshape[nb] = M, oshape[nb + 1] = N;
  check_matmul(a, b, ta, tb, A, B, nb + 2, oshape);
  free(A), free(B);
  tpr_tensor_free(a), tpr_tensor_free(b);
}

static void test_matmul_2d_transposes(void **state) {
  static const int64_t sizes[][3] = {{1, 1, 1}, {7, 33, 5}, {33, 7, 33}, {1, 33, 7}, {33, 1, 1}, {64, 48, 96}};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (int f = 0; f < 4; f++) matmul_case(0, NULL, true, sizes[s][0], sizes[s][1], sizes[s][2], f & 1, f >> 1);
}

static void test_matmul_batched(void **state) {
  const int64_t b3[] = {3}, b4[] = {2, 3};
  for (int f = 0; f < 4; f++) {
    matmul_case(1, b3, false, 7, 5, 33, f & 1, f >> 1);  // 3-D b
    matmul_case(1, b3, true, 7, 5, 33, f & 1, f >> 1);   // 2-D b shared (folds into M if !ta)
    matmul_case(2, b4, false, 1, 7, 33, f & 1, f >> 1);
    matmul_case(2, b4, true, 33, 1, 7, f & 1, f >> 1);
  }
}

static void test_matmul_views(void **state) {
  const int64_t M = 7, N = 9, K = 33, B = 3;
  float *P, *Q, *A = malloc(B * M * K * sizeof *A), *Bh = malloc(B * K * N * sizeof *Bh);
  // a: (M, B, K) permuted to (B, M, K): batch stride K does not chain with M.
  const int64_t ps[] = {M, B, K}, qs[] = {N, K};
  const int p102[] = {1, 0, 2}, p10[] = {1, 0};
  tpr_tensor *pt = tt_random_f32(tt_cpu(), 3, ps, &P), *qt = tt_random_f32(tt_cpu(), 2, qs, &Q);
  tpr_tensor *a = view_permute(pt, p102), *b = view_permute(qt, p10);  // b (K, N) column-major
  host_permute(P, 4, 3, ps, p102, A);
  host_permute(Q, 4, 2, qs, p10, Bh);
  const int64_t o1[] = {B, M, N};
  check_matmul(a, b, false, false, A, Bh, 3, o1);
  tpr_tensor_free(a), tpr_tensor_free(b), tpr_tensor_free(pt), tpr_tensor_free(qt), free(P), free(Q);

  // A column-major a used with trans_a (folds), and one with trans_a off.
  const int64_t ts[] = {B, M, K};
  const int p021[] = {0, 2, 1};
  pt = tt_random_f32(tt_cpu(), 3, ts, &P);
  a = view_permute(pt, p021);  // (B, K, M), unit stride along K
  qt = stored_operand(0, NULL, K, N, false, &Q);
  check_matmul(a, qt, true, false, P, Q, 3, o1);
  free(Q), tpr_tensor_free(qt);
  const int64_t o2[] = {B, K, K};
  qt = stored_operand(0, NULL, M, K, false, &Q);  // (M, K) logical b
  host_permute(P, 4, 3, ts, p021, A);             // logical a = the (B, K, M) view
  check_matmul(a, qt, false, false, A, Q, 3, o2);
  tpr_tensor_free(a), tpr_tensor_free(pt), tpr_tensor_free(qt), free(P), free(Q);

  // Rows padded to K + 3 (a column slice): batch and row strides still chain,
  // so with a 2-D b this is one GEMM over B*M rows with lda = K + 3.
  const int64_t pads[] = {B, M, K + 3};
  pt = tt_random_f32(tt_cpu(), 3, pads, &P);
  a = view_slice(pt, 2, 1, K);
  host_cols(P, B * M, K + 3, 1, K, A);
  qt = stored_operand(0, NULL, K, N, false, &Q);
  check_matmul(a, qt, false, false, A, Q, 3, o1);
  tpr_tensor_free(a), tpr_tensor_free(pt), tpr_tensor_free(qt), free(P), free(Q);

  // Neither unit stride: (M, K, 2) permuted to (2, M, K) has strides (1, 2K, 2).
  const int64_t rs[] = {M, K, 2}, ss[] = {K, N, 2}, o3[] = {2, M, N};
  const int p201[] = {2, 0, 1};
  pt = tt_random_f32(tt_cpu(), 3, rs, &P), qt = tt_random_f32(tt_cpu(), 3, ss, &Q);
  a = view_permute(pt, p201), b = view_permute(qt, p201);
  host_permute(P, 4, 3, rs, p201, A), host_permute(Q, 4, 3, ss, p201, Bh);
  check_matmul(a, b, false, false, A, Bh, 3, o3);
  tpr_tensor_free(a), tpr_tensor_free(b), tpr_tensor_free(pt), tpr_tensor_free(qt), free(P), free(Q);
  free(A), free(Bh);
}

static void test_matmul_k0(void **state) {
  const int64_t as[] = {3, 0}, bs[] = {0, 4}, os[] = {3, 4};
  tpr_tensor *a = tt_new(TPR_F32, 2, as), *b = tt_new(TPR_F32, 2, bs), *out = tt_new(TPR_F32, 2, os);
  float junk[12];
  for (int i = 0; i < 12; i++) junk[i] = NAN;
  TT_OK(tpr_tensor_from_host(out, junk, sizeof junk));
  TT_OK(tpr_matmul(tt_cpu(), a, b, false, false, out));
  float *got = tt_to_host(out);
  for (int i = 0; i < 12; i++) assert_true(got[i] == 0.0f);  // an empty sum is 0
  free(got);
  tpr_tensor_free(a), tpr_tensor_free(b), tpr_tensor_free(out);
}

// The comparison can fail: the same output against the reference for the
// other trans_b must be far outside the bound (a wrong element is O(1)).
static void test_matmul_negative_control(void **state) {
  const int64_t n = 17, s[] = {n, n};
  float *A, *B;
  tpr_tensor *a = tt_random_f32(tt_cpu(), 2, s, &A), *b = tt_random_f32(tt_cpu(), 2, s, &B);
  tpr_tensor *out = tt_new(TPR_F32, 2, s);
  TT_OK(tpr_matmul(tt_cpu(), a, b, false, false, out));
  float *got = tt_to_host(out), *Bt = malloc(n * n * sizeof *Bt);
  const int p10[] = {1, 0};
  host_permute(B, 4, 2, s, p10, Bt);
  double want[17 * 17], sabs;
  ref_matmul(A, B, 1, true, n, n, n, want, &sabs);
  double good = tt_max_rel_err(got, want, n * n);
  ref_matmul(A, Bt, 1, true, n, n, n, want, &sabs);
  double bad = tt_max_rel_err(got, want, n * n);
  assert_true(good < 1e-5);
  assert_true(bad > 0.1);
  free(got), free(Bt), free(A), free(B);
  tpr_tensor_free(a), tpr_tensor_free(b), tpr_tensor_free(out);
}


// ---------------------------------------------------------------- add, mul

// h (nd, shape) contiguous, read broadcast at output index oidx (ond dims).
static double bget(const float *h, int nd, const int64_t *shape, int ond, const int64_t *oidx) {
  int64_t off = 0;
  for (int d = 0; d < nd; d++) off = off * shape[d] + (shape[d] == 1 ? 0 : oidx[d + ond - nd]);
  return h[off];
}

// out = a + b and a * b for views a, b with logical hosts A, B.
// Bound 0: f32 add and mul are correctly rounded, and the exact double
// result rounded once to f32 is the same value (53 >= 2*24 + 2 bits), so
// every element must match bit for bit.
static void check_binary(const tpr_tensor *a, const float *A, const tpr_tensor *b, const float *B) {
  int ond = a->ndim > b->ndim ? a->ndim : b->ndim;
  int64_t os[TPR_MAX_DIMS];
  for (int d = 0; d < ond; d++) {
    int da = d - (ond - a->ndim), db = d - (ond - b->ndim);
    int64_t x = da >= 0 ? a->shape[da] : 1, y = db >= 0 ? b->shape[db] : 1;
    os[d] = x == 1 ? y : x;
  }
  for (int op = 0; op < 2; op++) {
    tpr_tensor *out = tt_new(TPR_F32, ond, os);
    TT_OK(op ? tpr_mul(tt_cpu(), a, b, out) : tpr_add(tt_cpu(), a, b, out));
    float *got = tt_to_host(out);
    int64_t n = tpr_tensor_numel(out), idx[TPR_MAX_DIMS] = {0};
    for (int64_t k = 0; k < n; k++) {
      double x = bget(A, a->ndim, a->shape, ond, idx), y = bget(B, b->ndim, b->shape, ond, idx);
      float want = (float)(op ? x * y : x + y);
      if (got[k] != want) fail_msg("%s element %lld: got %.9g want %.9g", op ? "mul" : "add", (long long)k, got[k], want);
      for (int d = ond - 1; d >= 0 && ++idx[d] == os[d]; d--) idx[d] = 0;
    }
    free(got);
    tpr_tensor_free(out);
  }
}

static void binary_case(int na, const int64_t *sa, int nb, const int64_t *sb) {
  float *A, *B;
  tpr_tensor *a = tt_random_f32(tt_cpu(), na, sa, &A), *b = tt_random_f32(tt_cpu(), nb, sb, &B);
  check_binary(a, A, b, B);
  free(A), free(B);
  tpr_tensor_free(a), tpr_tensor_free(b);
}

static void test_add_mul_broadcast(void **state) {
  const int64_t m57[] = {5, 7}, r7[] = {7}, c5[] = {5, 1}, one[] = {1};
  const int64_t t357[] = {3, 5, 7}, t317[] = {3, 1, 7}, t151[] = {1, 5, 1};
  binary_case(2, m57, 2, m57);   // same shape
  binary_case(2, m57, 1, r7);    // row vector
  binary_case(2, m57, 2, c5);    // column vector
  binary_case(2, m57, 1, one);   // scalar-like
  binary_case(1, one, 2, m57);   // scalar-like on the left
  binary_case(3, t357, 3, t317); // 3-D, middle dim broadcast
  binary_case(3, t151, 3, t317); // both broadcast
  binary_case(1, r7, 3, t357);   // lower rank on the left
}

static void test_add_mul_strided(void **state) {
  // a: (7, 5) transposed to (5, 7); b: columns [2, 9) of (5, 11).
  const int64_t ps[] = {7, 5}, qs[] = {5, 11}, rs[] = {7, 3, 5}, ws[] = {1, 12};
  const int p10[] = {1, 0}, p120[] = {1, 2, 0};
  float *P, *Q, *R, *W, A[5 * 7], B[5 * 7], C[3 * 5 * 7], Wv[7];
  tpr_tensor *pt = tt_random_f32(tt_cpu(), 2, ps, &P), *qt = tt_random_f32(tt_cpu(), 2, qs, &Q);
  tpr_tensor *a = view_permute(pt, p10), *b = view_slice(qt, 1, 2, 7);
  host_permute(P, 4, 2, ps, p10, A);
  host_cols(Q, 5, 11, 2, 7, B);
  check_binary(a, A, b, B);
  check_binary(b, B, a, A);
  // (7, 3, 5) permuted to (3, 5, 7) plus a sliced row vector (1, 7).
  tpr_tensor *rt = tt_random_f32(tt_cpu(), 3, rs, &R), *wt = tt_random_f32(tt_cpu(), 2, ws, &W);
  tpr_tensor *c = view_permute(rt, p120), *w = view_slice(wt, 1, 3, 7);
  host_permute(R, 4, 3, rs, p120, C);
  host_cols(W, 1, 12, 3, 7, Wv);
  check_binary(c, C, w, Wv);
  check_binary(w, Wv, a, A);
  free(P), free(Q), free(R), free(W);
  tpr_tensor *ts[] = {pt, qt, a, b, rt, wt, c, w};
  for (int i = 0; i < 8; i++) tpr_tensor_free(ts[i]);
}

// ---------------------------------------------------------------- rms_norm, softmax, swiglu

// x (view) with logical host X (rows, H). Bound (H/16 + 8)u: each of the 8
// f32 partial sums of squares adds H/8 + 1 rounded terms, the 3 combining
// adds, /H and +eps are 5 more; sqrt halves that relative error, and
// sqrt, 1/, x*inv and *w add one rounding each.
static void check_rms_norm(const tpr_tensor *x, const float *X, int64_t rows, int64_t H) {
  float *W;
  const float eps = 1e-5f;
  tpr_tensor *w = tt_random_f32(tt_cpu(), 1, &H, &W), *out = tt_new(TPR_F32, x->ndim, x->shape);
  TT_OK(tpr_rms_norm(tt_cpu(), x, w, eps, out));
  float *got = tt_to_host(out);
  double *want = malloc(rows * H * sizeof *want);
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int64_t i = 0; i < H; i++) ss += (double)X[r * H + i] * X[r * H + i];
    double inv = 1.0 / sqrt(ss / H + eps);
    for (int64_t i = 0; i < H; i++) want[r * H + i] = X[r * H + i] * inv * W[i];
  }
  double err = tt_max_rel_err(got, want, rows * H), bound = (H / 16.0 + 8) * U32;
  if (!(err <= bound)) fail_msg("rms_norm H=%lld: rel err %.3g > bound %.3g", (long long)H, err, bound);
  free(got), free(want), free(W);
  tpr_tensor_free(w), tpr_tensor_free(out);
}

static void test_rms_norm(void **state) {
  const int64_t Hs[] = {1, 7, 64, 256, 1000};
  for (int k = 0; k < 5; k++) {
    int64_t H = Hs[k], s[] = {3, 4, H}, ps[] = {H, 6}, qs[] = {5, 2 * H};
    float *X = rand_host(12 * H, k == 2 ? 30.0 : 1.0), *P, *Q;
    tpr_tensor *x = tt_from_host(TPR_F32, 3, s, X);
    check_rms_norm(x, X, 12, H);
    // Strided rows: a transposed (H, 6) (stride 6 along H), and a column slice.
    const int p10[] = {1, 0};
    tpr_tensor *pt = tt_random_f32(tt_cpu(), 2, ps, &P), *qt = tt_random_f32(tt_cpu(), 2, qs, &Q);
    tpr_tensor *xt = view_permute(pt, p10), *xs = view_slice(qt, 1, H / 2, H);
    float *XT = malloc(6 * H * sizeof *XT), *XS = malloc(5 * H * sizeof *XS);
    host_permute(P, 4, 2, ps, p10, XT);
    host_cols(Q, 5, 2 * H, H / 2, H, XS);
    check_rms_norm(xt, XT, 6, H);
    check_rms_norm(xs, XS, 5, H);
    free(X), free(P), free(Q), free(XT), free(XS);
    tpr_tensor_free(x), tpr_tensor_free(pt), tpr_tensor_free(qt), tpr_tensor_free(xt), tpr_tensor_free(xs);
  }
}

// Bound (N/2 + 10)u, from d_i = m - x_i >= 0: fl(x_i - m) is off by at most
// d_i u, so e_i = exp(..) carries (d_i + 2)u relative error (exp < 1 ulp);
// as e^-d d <= 1/e, the sum S >= 1 carries at most (N/e + 2)u from its terms
// plus (N/8 + 4)u from the 8-lane f32 sum, and out_i = e_i / S one more u.
// Relative to the largest output 1/S that is (N(1/e + 1/8) + 9.4)u.
// An all -inf row gives zeros (the kernel's documented choice).
static void check_softmax(const tpr_tensor *x, const float *X, int64_t rows, int64_t N) {
  tpr_tensor *out = tt_new(TPR_F32, x->ndim, x->shape);
  TT_OK(tpr_softmax(tt_cpu(), x, out));
  float *got = tt_to_host(out);
  double *want = malloc(rows * N * sizeof *want);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = X + r * N;
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < N; i++) m = fmax(m, xr[i]);
    for (int64_t i = 0; i < N; i++) s += m == -INFINITY ? 0 : exp(xr[i] - m);
    for (int64_t i = 0; i < N; i++) {
      want[r * N + i] = m == -INFINITY ? 0 : exp(xr[i] - m) / s;
      if (xr[i] == -INFINITY && got[r * N + i] != 0.0f) fail_msg("softmax: -inf entry gave %g", got[r * N + i]);
    }
  }
  double err = tt_max_rel_err(got, want, rows * N), bound = (N / 2.0 + 10) * U32;
  if (!(err <= bound)) fail_msg("softmax N=%lld: rel err %.3g > bound %.3g", (long long)N, err, bound);
  free(got), free(want);
  tpr_tensor_free(out);
}

static void softmax_case(int nd, const int64_t *shape, double scale, double offset, double p_neg_inf) {
  int64_t n = tpr_shape_numel(nd, shape), N = shape[nd - 1];
  float *X = rand_host(n, scale);
  for (int64_t i = 0; i < n; i++) {
    X[i] += (float)offset;
    if (tt_uniform(0, 1) < p_neg_inf) X[i] = -INFINITY;
  }
  if (p_neg_inf > 0 && n / N >= 3) {
    for (int64_t i = 0; i < N; i++) X[N + i] = X[2 * N + i] = -INFINITY;  // row 1 fully masked
    X[2 * N + N / 2] = 1.5f;                                               // row 2 has one entry
  }
  tpr_tensor *x = tt_from_host(TPR_F32, nd, shape, X);
  check_softmax(x, X, n / N, N);
  free(X);
  tpr_tensor_free(x);
}

static void test_softmax(void **state) {
  const int64_t a[] = {4, 7}, b[] = {3, 5, 33}, c[] = {2, 1000}, d[] = {6, 17}, e[] = {3, 1};
  softmax_case(2, a, 1, 0, 0);
  softmax_case(3, b, 3, 0, 0);
  softmax_case(2, c, 1, 0, 0);
  softmax_case(2, e, 1, 0, 0);
  softmax_case(3, b, 1000, 1e4, 0);   // exp(1e4) overflows unless the max is subtracted
  softmax_case(3, b, 1000, -1e4, 0);  // and exp(-1e4) underflows
  softmax_case(2, d, 2, 0, 0.3);      // -inf entries, a fully masked row
  // Strided: (33, 5) transposed to (5, 33).
  const int64_t ps[] = {33, 5};
  const int p10[] = {1, 0};
  float *P, XT[5 * 33];
  tpr_tensor *pt = tt_random_f32(tt_cpu(), 2, ps, &P), *xt = view_permute(pt, p10);
  host_permute(P, 4, 2, ps, p10, XT);
  check_softmax(xt, XT, 5, 33);
  free(P);
  tpr_tensor_free(pt), tpr_tensor_free(xt);
}

// Bound 10u: exp (< 1 ulp, at most 2u relative), 1 + e, the division, and
// the two products each round once; 1 + e >= 1 keeps e's error from growing.
static void check_swiglu(const tpr_tensor *g, const float *G, const tpr_tensor *u, const float *Uh) {
  tpr_tensor *out = tt_new(TPR_F32, g->ndim, g->shape);
  TT_OK(tpr_swiglu(tt_cpu(), g, u, out));
  float *got = tt_to_host(out);
  int64_t n = tpr_tensor_numel(out);
  double *want = malloc(n * sizeof *want);
  for (int64_t i = 0; i < n; i++) want[i] = G[i] / (1.0 + exp(-(double)G[i])) * Uh[i];
  double err = tt_max_rel_err(got, want, n);
  if (!(err <= 10 * U32)) fail_msg("swiglu: rel err %.3g > bound %.3g", err, 10 * U32);
  free(got), free(want);
  tpr_tensor_free(out);
}

static void test_swiglu(void **state) {
  const int64_t s[] = {4, 33}, s2[] = {3, 65}, ps[] = {33, 4}, qs[] = {4, 40};
  for (int k = 0; k < 2; k++) {  // k = 1: |gate| up to ~100, where naive exp(-g) overflows for g << 0
    float *G = rand_host(3 * 65, k ? 30.0 : 1.0), *U;
    tpr_tensor *g = tt_from_host(TPR_F32, 2, k ? s2 : s, G), *u = tt_random_f32(tt_cpu(), 2, k ? s2 : s, &U);
    check_swiglu(g, G, u, U);
    free(G), free(U);
    tpr_tensor_free(g), tpr_tensor_free(u);
  }
  const int p10[] = {1, 0};
  float *P, *Q, GT[4 * 33], US[4 * 33];
  tpr_tensor *pt = tt_random_f32(tt_cpu(), 2, ps, &P), *qt = tt_random_f32(tt_cpu(), 2, qs, &Q);
  tpr_tensor *g = view_permute(pt, p10), *u = view_slice(qt, 1, 5, 33);
  host_permute(P, 4, 2, ps, p10, GT);
  host_cols(Q, 4, 40, 5, 33, US);
  check_swiglu(g, GT, u, US);
  free(P), free(Q);
  tpr_tensor_free(pt), tpr_tensor_free(qt), tpr_tensor_free(g), tpr_tensor_free(u);
}

// sigmoid and sigmoid_bwd against double references, element by element:
// x from N(0, 1), N(0, 30) and the edges +-100 (where a naive exp(-x)
// overflows f32), +-88, 0 and +-17.5 (where f32's s * (1 - s) would be 0, a
// relative error of 1: the control on the backward's form). Bound 8u
// relative: exp (< 1 ulp), 1 + e, a product and a division each round once,
// and 1 + e >= 1 keeps e's error from growing; plus 2 subnormal steps
// (2^-148) for results below f32's normal range (x < -87).
static void check_sigmoid(const tpr_tensor *x, const float *X, const tpr_tensor *dy, const float *DY) {
  const int64_t n = tpr_tensor_numel(x);
  tpr_tensor *s = tt_new(TPR_F32, x->ndim, x->shape), *dx = tt_new(TPR_F32, x->ndim, x->shape);
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_SIGMOID, (const tpr_tensor *[]){x}, 1, NULL, s));
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_SIGMOID_BWD, (const tpr_tensor *[]){x, dy}, 2, NULL, dx));
  float *gs = tt_to_host(s), *gd = tt_to_host(dx);
  const double floor = 0x1p-148;
  for (int64_t i = 0; i < n; i++) {
    // s (1 - s) as e / (1 + e)^2, e = exp(-|x|): 1 - s would cancel even in double.
    const double xv = X[i], sv = 1.0 / (1.0 + exp(-xv)), e = exp(-fabs(xv)), dref = DY[i] * e / ((1 + e) * (1 + e));
    if (!(isfinite(gs[i]) && fabs(gs[i] - sv) <= 8 * U32 * sv + floor))
      fail_msg("sigmoid(%.9g) = %.9g, want %.9g", xv, (double)gs[i], sv);
    if (!(isfinite(gd[i]) && fabs(gd[i] - dref) <= 8 * U32 * fabs(dref) + floor * (1 + fabs(DY[i]))))
      fail_msg("sigmoid_bwd(%.9g, dy %.9g) = %.9g, want %.9g", xv, (double)DY[i], (double)gd[i], dref);
    if (xv >= 100) assert_true(gs[i] == 1.0f);
  }
  free(gs), free(gd);
  tpr_tensor_free(s), tpr_tensor_free(dx);
}

static void test_sigmoid(void **state) {
  const int64_t s[] = {5, 33};
  for (int k = 0; k < 3; k++) {
    float *X = rand_host(5 * 33, k == 1 ? 30.0 : 1.0), *DY = rand_host(5 * 33, 1.0);
    if (k == 2) {
      static const float edge[] = {100.0f, -100.0f, 88.0f, -88.0f, 80.0f, -80.0f, 0.0f, 17.5f, -17.5f};
      memcpy(X, edge, sizeof edge);
    }
    tpr_tensor *x = tt_from_host(TPR_F32, 2, s, X), *dy = tt_from_host(TPR_F32, 2, s, DY);
    check_sigmoid(x, X, dy, DY);
    free(X), free(DY);
    tpr_tensor_free(x), tpr_tensor_free(dy);
  }
  // Strided: x a transposed view, dy every other column of a wider matrix.
  const int64_t ps[] = {33, 4}, qs[] = {4, 40}, os[] = {4, 33};
  const int p10[] = {1, 0};
  float *P, *Q, XT[4 * 33], DS[4 * 33];
  tpr_tensor *pt = tt_random_f32(tt_cpu(), 2, ps, &P), *qt = tt_random_f32(tt_cpu(), 2, qs, &Q);
  tpr_tensor *x = view_permute(pt, p10), *dy = view_slice(qt, 1, 5, 33);
  host_permute(P, 4, 2, ps, p10, XT);
  host_cols(Q, 4, 40, 5, 33, DS);
  check_sigmoid(x, XT, dy, DS);
  // Refusals: an i32 x (the shape rule), dy of another shape, the wrong input count.
  tpr_tensor *ix = tt_new(TPR_I32, 2, os), *o = tt_new(TPR_F32, 2, os), *small = tt_new(TPR_F32, 2, s);
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SIGMOID, (const tpr_tensor *[]){ix}, 1, NULL, o), TPR_ERR_DTYPE);
  assert_non_null(strstr(tpr_last_error(), "sigmoid"));
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SIGMOID_BWD, (const tpr_tensor *[]){x, small}, 2, NULL, o),
                   TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "sigmoid_bwd"));
  assert_int_not_equal(tpr_op_run(tt_cpu(), TPR_OP_SIGMOID_BWD, (const tpr_tensor *[]){x}, 1, NULL, o), TPR_OK);
  free(P), free(Q);
  tpr_tensor *all[] = {pt, qt, x, dy, ix, o, small};
  for (int i = 0; i < 7; i++) tpr_tensor_free(all[i]);
}

// ---------------------------------------------------------------- embedding, index_select

// Host ids (n) of dtype dt from values v.
static void *ids_host(tpr_dtype dt, const int64_t *v, int64_t n) {
  void *h = malloc(n * 8);
  for (int64_t i = 0; i < n; i++) {
    if (dt == TPR_I32) ((int32_t *)h)[i] = (int32_t)v[i];
    else ((int64_t *)h)[i] = v[i];
  }
  return h;
}

// A (V, H) table of dtype dt (bf16 made with tpr_dtype_convert) and its host bytes.
static tpr_tensor *random_table(tpr_dtype dt, int nd, const int64_t *shape, void **bytes) {
  int64_t n = tpr_shape_numel(nd, shape);
  float *f = rand_host(n, 1.0);
  *bytes = malloc(n * tpr_dtype_size(dt));
  tpr_dtype_convert(f, TPR_F32, *bytes, dt, (size_t)n);
  free(f);
  return tt_from_host(dt, nd, shape, *bytes);
}

// Exact: a gather moves bytes, so every output row equals its table row.
// Bits of k: bf16 table, i64 ids, table as a transposed (H, V) view.
static void test_embedding(void **state) {
  enum { V = 11, H = 6 };
  const int64_t ts[] = {V, H}, tts[] = {H, V}, is[] = {3, 2}, os[] = {2, 3, H};
  const int p10[] = {1, 0};
  for (int k = 0; k < 8; k++) {
    tpr_dtype tdt = k & 1 ? TPR_BF16 : TPR_F32, idt = k & 2 ? TPR_I64 : TPR_I32;
    size_t esz = tpr_dtype_size(tdt), isz = tpr_dtype_size(idt);
    void *T, *Tp;
    tpr_tensor *tp = NULL, *table;
    if (k & 4) {
      tp = random_table(tdt, 2, tts, &Tp);
      table = view_permute(tp, p10);
      T = malloc(V * H * esz);
      host_permute(Tp, esz, 2, tts, p10, T);
      free(Tp);
    } else {
      table = random_table(tdt, 2, ts, &T);
    }
    int64_t v[6];
    for (int i = 0; i < 6; i++) v[i] = tt_randint(0, V - 1);
    v[0] = 0, v[5] = V - 1;
    void *ih = ids_host(idt, v, 6);
    // ids (3, 2) transposed: a strided (2, 3) view; logical order from host_permute.
    tpr_tensor *idp = tt_from_host(idt, 2, is, ih), *ids = view_permute(idp, p10);
    char lids[6 * 8];
    host_permute(ih, isz, 2, is, p10, lids);
    tpr_tensor *out = tt_new(tdt, 3, os);
    TT_OK(tpr_embedding(tt_cpu(), table, ids, out));
    char *got = tt_to_host(out);
    for (int p = 0; p < 6; p++) {
      int64_t id = idt == TPR_I32 ? ((int32_t *)lids)[p] : ((int64_t *)lids)[p];
      assert_memory_equal(got + p * H * esz, (char *)T + id * H * esz, H * esz);
    }
    free(got), free(T), free(ih);
    tpr_tensor_free(table), tpr_tensor_free(idp), tpr_tensor_free(ids), tpr_tensor_free(out);
    if (tp) tpr_tensor_free(tp);
  }
}

// x (4, 5, 6) [or that shape as a permuted view], dims 0/1/2, i32/i64, f32/bf16. Exact.
static void index_select_case(tpr_dtype xdt, tpr_dtype idt, int dim, bool strided) {
  const int64_t ps[] = {6, 4, 5}, xs[] = {4, 5, 6};
  const int p120[] = {1, 2, 0};
  size_t esz = tpr_dtype_size(xdt);
  void *P, *X = malloc(120 * esz);
  tpr_tensor *pt = NULL, *x;
  if (strided) {
    pt = random_table(xdt, 3, ps, &P);
    x = view_permute(pt, p120);
    host_permute(P, esz, 3, ps, p120, X);
    free(P);
  } else {
    x = random_table(xdt, 3, xs, &P);
    memcpy(X, P, 120 * esz);
    free(P);
  }
  enum { n = 7 };
  int64_t v[n];
  for (int i = 0; i < n; i++) v[i] = tt_randint(0, xs[dim] - 1);  // repeats allowed
  v[0] = xs[dim] - 1;
  void *ih = ids_host(idt, v, n);
  const int64_t nn = n;
  tpr_tensor *index = tt_from_host(idt, 1, &nn, ih);
  int64_t os[3] = {4, 5, 6};
  os[dim] = n;
  tpr_tensor *out = tt_new(xdt, 3, os);
  TT_OK(tpr_index_select(tt_cpu(), x, dim, index, out));
  char *got = tt_to_host(out);
  for (int64_t i = 0; i < os[0]; i++)
    for (int64_t j = 0; j < os[1]; j++)
      for (int64_t k = 0; k < os[2]; k++) {
        int64_t src[3] = {i, j, k};
        src[dim] = v[src[dim]];
        assert_memory_equal(got + ((i * os[1] + j) * os[2] + k) * esz,
                            (char *)X + ((src[0] * 5 + src[1]) * 6 + src[2]) * esz, esz);
      }
  free(got), free(X), free(ih);
  tpr_tensor_free(index), tpr_tensor_free(out), tpr_tensor_free(x);
  if (pt) tpr_tensor_free(pt);
}

static void test_index_select(void **state) {
  for (int dim = 0; dim < 3; dim++)
    for (int k = 0; k < 8; k++)
      index_select_case(k & 1 ? TPR_BF16 : TPR_F32, k & 2 ? TPR_I64 : TPR_I32, dim, k & 4);
}

// An out-of-range id fails with TPR_ERR_INVALID_ARG naming it, and writes
// nothing: out lives inside a guard buffer whose every value stays put.
static void test_gather_out_of_range(void **state) {
  enum { V = 11, H = 6, G = 16, NOUT = 2 * 3 * H };
  const int64_t ts[] = {V, H}, is[] = {2, 3}, os[] = {2, 3, H}, n6 = 6, xs[] = {4, 5}, xo[] = {4, 6};
  const float guard = -12345.5f;
  float buf[G + NOUT + G];
  void *T;
  tpr_tensor *table = random_table(TPR_F32, 2, ts, &T);
  for (int k = 0; k < 2; k++) {
    tpr_dtype idt = k ? TPR_I64 : TPR_I32;
    int64_t v[6] = {1, 2, 3, 4, 5, 6};
    v[k ? 0 : 3] = k ? -1 : V;  // i64: a negative id at 0; i32: V at 3
    void *ih = ids_host(idt, v, 6);
    tpr_tensor *ids = tt_from_host(idt, 2, is, ih), *out = NULL;
    for (int i = 0; i < G + NOUT + G; i++) buf[i] = guard;
    TT_OK(tpr_tensor_wrap(tt_cpu(), TPR_F32, 3, os, buf + G, &out));
    assert_int_equal(tpr_embedding(tt_cpu(), table, ids, out), TPR_ERR_INVALID_ARG);
    assert_non_null(strstr(tpr_last_error(), k ? "token id -1 at position 0" : "token id 11 at position 3"));
    for (int i = 0; i < G + NOUT + G; i++) assert_true(buf[i] == guard);
    // A valid call writes exactly out: the guards on both sides stay.
    v[k ? 0 : 3] = 0;
    free(ih);
    ih = ids_host(idt, v, 6);
    TT_OK(tpr_tensor_from_host(ids, ih, tpr_tensor_nbytes(ids)));
    TT_OK(tpr_embedding(tt_cpu(), table, ids, out));
    for (int i = 0; i < G; i++) assert_true(buf[i] == guard && buf[G + NOUT + i] == guard);
    assert_memory_equal(buf + G, (float *)T + v[0] * H, H * sizeof(float));
    free(ih);
    tpr_tensor_free(ids), tpr_tensor_free(out);
  }
  // index_select: index 5 on a dim of size 5.
  float *X;
  tpr_tensor *x = tt_random_f32(tt_cpu(), 2, xs, &X), *out = NULL;
  int64_t v[6] = {0, 4, 5, 1, 2, 3};
  void *ih = ids_host(TPR_I64, v, 6);
  tpr_tensor *index = tt_from_host(TPR_I64, 1, &n6, ih);
  for (int i = 0; i < G + NOUT + G; i++) buf[i] = guard;
  TT_OK(tpr_tensor_wrap(tt_cpu(), TPR_F32, 2, xo, buf + G, &out));
  assert_int_equal(tpr_index_select(tt_cpu(), x, 1, index, out), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "5 at position 2 is out of range [0, 5)"));
  for (int i = 0; i < G + NOUT + G; i++) assert_true(buf[i] == guard);
  free(X), free(ih), free(T);
  tpr_tensor_free(x), tpr_tensor_free(out), tpr_tensor_free(index), tpr_tensor_free(table);
}

// ---------------------------------------------------------------- cast, errors

// f32 -> bf16 -> f32 of a permuted view equals elementwise conversion bit
// for bit (bound 0: the kernel calls the same conversion), and the round trip
// is within bf16's unit roundoff 2^-8 of the input.
static void test_cast(void **state) {
  const int64_t ps[] = {3, 4, 5}, vs[] = {5, 3, 4};
  const int p201[] = {2, 0, 1};
  float *P, V[60], back[60];
  tpr_tensor *pt = tt_random_f32(tt_cpu(), 3, ps, &P), *x = view_permute(pt, p201);
  for (int i = 0; i < 60; i++) P[i] *= (float)ldexp(1.0, (int)tt_randint(-20, 20));  // many exponents
  TT_OK(tpr_tensor_from_host(pt, P, sizeof V));
  host_permute(P, 4, 3, ps, p201, V);
  tpr_tensor *hb = tt_new(TPR_BF16, 3, vs), *hf = tt_new(TPR_F32, 3, vs), *same = tt_new(TPR_F32, 3, vs);
  TT_OK(tpr_cast(tt_cpu(), x, hb));
  TT_OK(tpr_cast(tt_cpu(), hb, hf));
  TT_OK(tpr_cast(tt_cpu(), x, same));  // same dtype: a strided copy
  uint16_t *gb = tt_to_host(hb);
  float *gf = tt_to_host(hf), *gs = tt_to_host(same);
  for (int i = 0; i < 60; i++) {
    assert_int_equal(gb[i], tpr_f32_to_bf16(V[i]));
    back[i] = tpr_bf16_to_f32(gb[i]);
    assert_memory_equal(&gf[i], &back[i], 4);
    assert_true(fabs((double)gf[i] - V[i]) <= 0x1p-8 * fabs(V[i]));
    assert_memory_equal(&gs[i], &V[i], 4);
  }
  // A strided bf16 source (the gather-then-convert path) back to f32.
  tpr_tensor *hbs = NULL, *out = tt_new(TPR_F32, 3, ps);
  const int p120[] = {1, 2, 0};  // undoes p201
  TT_OK(tpr_tensor_permute(hb, p120, &hbs));
  TT_OK(tpr_cast(tt_cpu(), hbs, out));
  float *go = tt_to_host(out);
  for (int i = 0; i < 60; i++) assert_true(go[i] == tpr_bf16_to_f32(tpr_f32_to_bf16(P[i])));
  free(P), free(gb), free(gf), free(gs), free(go);
  tpr_tensor *all[] = {pt, x, hb, hf, same, hbs, out};
  for (int i = 0; i < 7; i++) tpr_tensor_free(all[i]);
}

static void test_shape_and_dtype_errors(void **state) {
  const int64_t a[] = {3, 4}, b[] = {4, 5}, bad[] = {3, 6}, r[] = {4};
  tpr_tensor *ta = tt_random_f32(tt_cpu(), 2, a, NULL), *tb = tt_random_f32(tt_cpu(), 2, b, NULL);
  tpr_tensor *tr = tt_random_f32(tt_cpu(), 1, r, NULL), *out = tt_new(TPR_F32, 2, bad);
  assert_int_equal(tpr_matmul(tt_cpu(), ta, tb, false, false, out), TPR_ERR_SHAPE);
  assert_int_equal(tpr_add(tt_cpu(), ta, tr, out), TPR_ERR_SHAPE);
  assert_int_equal(tpr_softmax(tt_cpu(), ta, out), TPR_ERR_SHAPE);
  assert_int_equal(tpr_rms_norm(tt_cpu(), ta, tr, 1e-5f, out), TPR_ERR_SHAPE);
  // The kernels themselves refuse a non-f32 input even if a caller skipped
  // the shape rule (defensive check), naming op and dtype.
  tpr_tensor *h = tt_new(TPR_BF16, 2, a), *o = tt_new(TPR_F32, 2, a);
  const tpr_tensor *in[2] = {h, ta};
  const tpr_kernel_fn *cpu = tt_cpu()->vt->kernels;
  assert_int_equal(cpu[TPR_OP_ADD](NULL, in, 2, NULL, o), TPR_ERR_DTYPE);
  assert_non_null(strstr(tpr_last_error(), "add"));
  assert_non_null(strstr(tpr_last_error(), "bf16"));
  assert_int_equal(cpu[TPR_OP_SOFTMAX](NULL, in, 1, NULL, o), TPR_ERR_DTYPE);
  tpr_tensor *all[] = {ta, tb, tr, out, h, o};
  for (int i = 0; i < 6; i++) tpr_tensor_free(all[i]);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul_2d_transposes),
      cmocka_unit_test(test_matmul_batched),
      cmocka_unit_test(test_matmul_views),
      cmocka_unit_test(test_matmul_k0),
      cmocka_unit_test(test_matmul_negative_control),
      cmocka_unit_test(test_add_mul_broadcast),
      cmocka_unit_test(test_add_mul_strided),
      cmocka_unit_test(test_rms_norm),
      cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_sigmoid),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_index_select),
      cmocka_unit_test(test_gather_out_of_range),
      cmocka_unit_test(test_cast),
      cmocka_unit_test(test_shape_and_dtype_errors),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(tt_cpu());
  return rc;
}
