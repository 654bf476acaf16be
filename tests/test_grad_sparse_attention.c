// InfLLM-v2 sparse attention's training form (ops.h sparse_attention and
// sparse_attention_bwd; semantics at tpr_pb_sparse_attention) on the CPU.
//
// Against the float64 PyTorch reference's fixture (tests/fixtures/sparse_attention,
// its 72-token prefill, case a: Hq 4, Hkv 2, D 8, kernel 4 stride 2, blocks of
// 8, topk 3, 1 init block, a window of 2 blocks, dense_len 48): the forward
// within REF_BOUND, and off by more than CTRL_MIN from the reference's output
// with one selected block swapped for the next best (the control).
// Fresh random inputs (seed printed), T = 40 (dense), 72 and 100 (sparse):
//   - forward and gradients (dq, dk, dv) against a double reference written
//     here (its own selection: compressed keys, chunk softmax summed over the
//     group, block max, sorted by score then index; masked softmax attention
//     and its reverse mode), within REF_BOUND; the controls (the reference
//     attending every block, or a local window one block short or long) off
//     by more than CTRL_MIN on the sparse lengths;
//   - the forward equals sparse_attention_paged's (the inference op, which
//     shares the selection code) on the same sequence within 1e-6;
//   - 1 and 3 threads give the same bits, forward and backward.
// The backward rule against central finite differences (grad_check.h) on the
// fixture's inputs (fixed, so no perturbation flips a selection), and its
// control (the analytic gradient scaled by 1.01).
// Bad input: the shape rules' refusals.
#include "grad_check.h"
#include "ops_util.h"
#include "runtime/ops/cpu_kernels.h"
#include "runtime/program/program.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_BOUND 1e-5    // vs double, relative to each tensor's largest magnitude
#define CTRL_MIN 1e-3     // a control must be off by at least 100x the bound
#define NMSE_BOUND 1e-5   // finite differences, h = 1e-3 on f32 outputs

enum { HQ = 4, HKV = 2, G = HQ / HKV, D = 8 };
enum { KV_AB = 75 };  // the fixture's k_ab / v_ab rows: case a's 72, then 3 decode tokens (unused here)

#ifndef TPR_FIXTURES
#define TPR_FIXTURES "tests/fixtures"
#endif

static tpr_sparse_attn fix_sa(void) {
  return (tpr_sparse_attn){.kernel_size = 4, .kernel_stride = 2, .block_size = 8, .topk = 3, .init_blocks = 1,
                           .window_size = 16, .dense_len = 48, .scale = 1.0f / sqrtf((float)D)};
}

static float *npy(const char *name, int64_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/sparse_attention/%s.npy", TPR_FIXTURES, name);
  return tt_read_npy_f32(path, n);
}

// ---------------------------------------------------------------- the double reference

// How the reference deviates (the controls).
typedef struct refopt {
  bool all_blocks;  // attend every block (the selection ignored)
  int local_delta;  // blocks added to the local window
} refopt;

// sel[(t * HKV + g) * nb + b] := 1 when query t of KV head g attends block b.
static void ref_select(int T, const float *q, const float *k, const tpr_sparse_attn *sa, const refopt *o,
                       char *sel) {
  const int ks = (int)sa->kernel_size, st = (int)sa->kernel_stride, bs = (int)sa->block_size;
  const int nb = (T + bs - 1) / bs, local = (int)(sa->window_size / bs) + o->local_delta;
  const int nc = T >= ks ? (T - ks) / st + 1 : 0;
  const bool dense = o->all_blocks || T < sa->dense_len;
  double *c = calloc((size_t)(nc * HKV * D + 1), sizeof *c), *S = malloc((size_t)(nc + 1) * sizeof *S);
  double *score = malloc((size_t)nb * sizeof *score);
  int *order = malloc((size_t)nb * sizeof *order);
  for (int j = 0; j < nc; j++)
    for (int g = 0; g < HKV; g++)
      for (int d = 0; d < D; d++) {
        double s = 0;
        for (int r = j * st; r < j * st + ks; r++) s += k[(r * HKV + g) * D + d];
        c[(j * HKV + g) * D + d] = s / ks;
      }
  for (int t = 0; t < T; t++)
    for (int g = 0; g < HKV; g++) {
      char *row = sel + (size_t)(t * HKV + g) * nb;
      const int qb = t / bs;
      memset(row, 0, (size_t)nb);
      for (int b = 0; b <= qb; b++) row[b] = dense || b < sa->init_blocks || b > qb - local;
      if (dense) continue;
      const int nv = t + 1 >= ks ? (t + 1 - ks) / st + 1 : 0;
      for (int j = 0; j < nv; j++) S[j] = 0;
      for (int h = 0; h < G; h++) {
        double m = -INFINITY, z = 0, w[512];
        for (int j = 0; j < nv; j++) {
          w[j] = 0;
          for (int d = 0; d < D; d++) w[j] += (double)q[(t * HQ + g * G + h) * D + d] * c[(j * HKV + g) * D + d];
          w[j] *= sa->scale;
          m = fmax(m, w[j]);
        }
        for (int j = 0; j < nv; j++) z += exp(w[j] - m);
        for (int j = 0; j < nv; j++) S[j] += exp(w[j] - m) / z;
      }
      int n = 0;
      for (int b = 0; b <= qb; b++) {
        if (row[b]) continue;
        score[b] = 0;
        for (int j = b * bs / st - (ks / st - 1); j < (b + 1) * bs / st; j++)
          if (j >= 0 && j < nv) score[b] = fmax(score[b], S[j]);
        order[n++] = b;
      }
      for (int i = 1; i < n; i++)  // insertion sort: score descending, block ascending
        for (int j = i; j > 0 && (score[order[j]] > score[order[j - 1]] ||
                                  (score[order[j]] == score[order[j - 1]] && order[j] < order[j - 1]));
             j--) {
          const int x = order[j];
          order[j] = order[j - 1], order[j - 1] = x;
        }
      for (int i = 0; i < n && i < sa->topk - sa->init_blocks; i++) row[order[i]] = 1;
    }
  free(c), free(S), free(score), free(order);
}

// out (T, HQ, D) and, when dout, the gradients dq (T, HQ, D), dk, dv (T, HKV, D), in double.
static void ref_attend(int T, const float *q, const float *k, const float *v, const float *dout,
                       const tpr_sparse_attn *sa, const refopt *o, double *out, double *dq, double *dk, double *dv) {
  const int bs = (int)sa->block_size, nb = (T + bs - 1) / bs;
  char *sel = malloc((size_t)T * HKV * nb);
  ref_select(T, q, k, sa, o, sel);
  double *P = malloc((size_t)T * sizeof *P);
  if (dout) {
    memset(dq, 0, (size_t)T * HQ * D * sizeof *dq);
    memset(dk, 0, (size_t)T * HKV * D * sizeof *dk);
    memset(dv, 0, (size_t)T * HKV * D * sizeof *dv);
  }
  for (int t = 0; t < T; t++)
    for (int h = 0; h < HQ; h++) {
      const int g = h / G;
      const char *row = sel + (size_t)(t * HKV + g) * nb;
      const float *qh = q + (t * HQ + h) * D;
      double m = -INFINITY, z = 0;
      for (int r = 0; r <= t; r++) {
        if (!row[r / bs]) continue;
        double s = 0;
        for (int d = 0; d < D; d++) s += (double)qh[d] * k[(r * HKV + g) * D + d];
        P[r] = s * sa->scale, m = fmax(m, P[r]);
      }
      for (int r = 0; r <= t; r++)
        if (row[r / bs]) z += (P[r] = exp(P[r] - m));
      double *oh = out + (t * HQ + h) * D;
      for (int d = 0; d < D; d++) oh[d] = 0;
      for (int r = 0; r <= t; r++)
        if (row[r / bs]) {
          P[r] /= z;
          for (int d = 0; d < D; d++) oh[d] += P[r] * v[(r * HKV + g) * D + d];
        }
      if (!dout) continue;
      const float *go = dout + (t * HQ + h) * D;
      double sum = 0;
      for (int d = 0; d < D; d++) sum += go[d] * oh[d];  // sum_r P_r dP_r = dout . out
      for (int r = 0; r <= t; r++) {
        if (!row[r / bs]) continue;
        double dp = 0;
        for (int d = 0; d < D; d++) dp += (double)go[d] * v[(r * HKV + g) * D + d];
        const double dz = P[r] * (dp - sum) * sa->scale;
        for (int d = 0; d < D; d++) {
          dv[(r * HKV + g) * D + d] += P[r] * go[d];
          dq[(t * HQ + h) * D + d] += dz * k[(r * HKV + g) * D + d];
          dk[(r * HKV + g) * D + d] += dz * qh[d];
        }
      }
    }
  free(sel), free(P);
}

// ---------------------------------------------------------------- running the ops

// threads > 0: the CPU kernel directly with that many threads; else tpr_op_run.
static float *run_op(tpr_op_kind op, int T, const float *q, const float *k, const float *v, const float *dout,
                     const tpr_sparse_attn *sa, int threads) {
  const int64_t qs[3] = {T, HQ, D}, kvs[3] = {T, HKV, D};
  tpr_tensor *in[4] = {tt_from_host(TPR_F32, 3, qs, q), tt_from_host(TPR_F32, 3, kvs, k),
                       tt_from_host(TPR_F32, 3, kvs, v), dout ? tt_from_host(TPR_F32, 3, qs, dout) : NULL};
  const int64_t n = (int64_t)T * HQ * D + (dout ? 2 * (int64_t)T * HKV * D : 0);
  tpr_tensor *out = dout ? tt_new(TPR_F32, 1, &n) : tt_new(TPR_F32, 3, qs);
  float *od = tpr_tensor_data(out);
  for (int64_t i = 0; i < n; i++) od[i] = NAN;
  const tpr_op_attrs at = tpr_sparse_attn_attrs(sa);
  tpr_cpu_ctx ctx = {.n_threads = threads};
  const int n_in = dout ? 4 : 3;
  TT_OK(threads > 0 ? tt_cpu()->vt->kernels[op](&ctx, (const tpr_tensor *const *)in, n_in, &at, out)
                    : tpr_op_run(tt_cpu(), op, (const tpr_tensor *const *)in, n_in, &at, out));
  float *h = tt_to_host(out);
  for (int i = 0; i < 4; i++) tpr_tensor_free(in[i]);
  tpr_tensor_free(out);
  return h;
}

// The inference op on the same sequence: a contiguous pool of blocks of 8, one sequence, positions 0..T-1.
static float *run_paged(int T, const float *q, const float *k, const float *v, const tpr_sparse_attn *sa) {
  const int pbs = 8, NB = (T + pbs - 1) / pbs;
  float *kp = calloc((size_t)NB * pbs * HKV * D, sizeof *kp), *vp = calloc((size_t)NB * pbs * HKV * D, sizeof *vp);
  memcpy(kp, k, (size_t)T * HKV * D * sizeof *kp), memcpy(vp, v, (size_t)T * HKV * D * sizeof *vp);
  int32_t *bt = malloc((size_t)NB * 4), *seq = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4);
  for (int i = 0; i < NB; i++) bt[i] = i;
  for (int t = 0; t < T; t++) seq[t] = 0, pos[t] = t;
  const int64_t qs[3] = {T, HQ, D}, ps[4] = {NB, pbs, HKV, D};
  tpr_tensor *in[6] = {tt_from_host(TPR_F32, 3, qs, q), tt_from_host(TPR_F32, 4, ps, kp),
                       tt_from_host(TPR_F32, 4, ps, vp), tt_from_host(TPR_I32, 2, (const int64_t[]){1, NB}, bt),
                       tt_from_host(TPR_I32, 1, (const int64_t[]){T}, seq),
                       tt_from_host(TPR_I32, 1, (const int64_t[]){T}, pos)};
  tpr_tensor *out = tt_new(TPR_F32, 3, qs);
  const tpr_op_attrs at = tpr_sparse_attn_attrs(sa);
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, (const tpr_tensor *const *)in, 6, &at, out));
  float *h = tt_to_host(out);
  for (int i = 0; i < 6; i++) tpr_tensor_free(in[i]);
  tpr_tensor_free(out), free(kp), free(vp), free(bt), free(seq), free(pos);
  return h;
}

static float *randn(int64_t n) {
  float *x = malloc((size_t)n * sizeof *x);
  for (int64_t i = 0; i < n; i++) x[i] = (float)tt_normal();
  return x;
}

// The worst of the op's three gradients' errors against (dq | dk | dv) in double.
static double grads_err(const float *got, const double *dq, const double *dk, const double *dv, int T) {
  const int64_t nq = (int64_t)T * HQ * D, nk = (int64_t)T * HKV * D;
  return fmax(tt_max_rel_err(got, dq, (size_t)nq),
              fmax(tt_max_rel_err(got + nq, dk, (size_t)nk), tt_max_rel_err(got + nq + nk, dv, (size_t)nk)));
}

// ---------------------------------------------------------------- tests

static void test_fixture(void **state) {
  (void)state;
  const int T = 72;
  const tpr_sparse_attn sa = fix_sa();
  float *q = npy("q_a", T * HQ * D), *k = npy("k_ab", KV_AB * HKV * D), *v = npy("v_ab", KV_AB * HKV * D);
  float *want = npy("out_a", T * HQ * D), *swap = npy("out_a_swap", T * HQ * D);
  float *got = run_op(TPR_OP_SPARSE_ATTENTION, T, q, k, v, NULL, &sa, 0);
  double *w = malloc((size_t)T * HQ * D * sizeof *w), *s = malloc((size_t)T * HQ * D * sizeof *s);
  for (int i = 0; i < T * HQ * D; i++) w[i] = want[i], s[i] = swap[i];
  const double e = tt_max_rel_err(got, w, (size_t)T * HQ * D), c = tt_max_rel_err(got, s, (size_t)T * HQ * D);
  printf("  fixture (72-token prefill): %.2e (bound %.0e); vs one block swapped: %.2e (must exceed %.0e)\n", e,
         REF_BOUND, c, CTRL_MIN);
  assert_true(e <= REF_BOUND);
  assert_true(c > CTRL_MIN);
  free(q), free(k), free(v), free(want), free(swap), free(got), free(w), free(s);
}

static void random_case(int T) {
  const tpr_sparse_attn sa = fix_sa();
  const int64_t nq = (int64_t)T * HQ * D, nk = (int64_t)T * HKV * D;
  float *q = randn(nq), *k = randn(nk), *v = randn(nk), *dout = randn(nq);
  double *out = malloc((size_t)nq * sizeof *out), *dq = malloc((size_t)nq * sizeof *dq);
  double *dk = malloc((size_t)nk * sizeof *dk), *dv = malloc((size_t)nk * sizeof *dv);
  float *fwd = run_op(TPR_OP_SPARSE_ATTENTION, T, q, k, v, NULL, &sa, 0);
  float *bwd = run_op(TPR_OP_SPARSE_ATTENTION_BWD, T, q, k, v, dout, &sa, 0);
  ref_attend(T, q, k, v, dout, &sa, &(refopt){0}, out, dq, dk, dv);
  const double ef = tt_max_rel_err(fwd, out, (size_t)nq), eb = grads_err(bwd, dq, dk, dv, T);
  // The inference op (the shared selection) on the same sequence.
  float *paged = run_paged(T, q, k, v, &sa);
  double *pd = malloc((size_t)nq * sizeof *pd);
  for (int64_t i = 0; i < nq; i++) pd[i] = paged[i];
  const double ep = tt_max_rel_err(fwd, pd, (size_t)nq);
  // Threads: 1 and 3 give the same bits.
  float *f1 = run_op(TPR_OP_SPARSE_ATTENTION, T, q, k, v, NULL, &sa, 1);
  float *f3 = run_op(TPR_OP_SPARSE_ATTENTION, T, q, k, v, NULL, &sa, 3);
  float *b1 = run_op(TPR_OP_SPARSE_ATTENTION_BWD, T, q, k, v, dout, &sa, 1);
  float *b3 = run_op(TPR_OP_SPARSE_ATTENTION_BWD, T, q, k, v, dout, &sa, 3);
  assert_memory_equal(f1, f3, (size_t)nq * sizeof *f1);
  assert_memory_equal(b1, b3, (size_t)(nq + 2 * nk) * sizeof *b1);
  assert_memory_equal(f1, fwd, (size_t)nq * sizeof *f1);
  printf("  T %d: forward %.2e, gradients %.2e (bound %.0e); vs sparse_attention_paged %.2e", T, ef, eb, REF_BOUND,
         ep);
  assert_true(ef <= REF_BOUND);
  assert_true(eb <= REF_BOUND);
  assert_true(ep <= 1e-6);
  if (T >= sa.dense_len) {  // the controls: the reference with another selection
    const refopt ctl[3] = {{.all_blocks = true}, {.local_delta = -1}, {.local_delta = 1}};
    const char *what[3] = {"every block", "window -1 block", "window +1 block"};
    for (int c = 0; c < 3; c++) {
      ref_attend(T, q, k, v, dout, &sa, &ctl[c], out, dq, dk, dv);
      const double cf = tt_max_rel_err(fwd, out, (size_t)nq), cb = grads_err(bwd, dq, dk, dv, T);
      printf("; control %s: %.2e / %.2e", what[c], cf, cb);
      assert_true(cf > CTRL_MIN);
      assert_true(cb > CTRL_MIN);
    }
  }
  printf("\n");
  free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv), free(fwd), free(bwd);
  free(paged), free(pd), free(f1), free(f3), free(b1), free(b3);
}

static void test_random_vs_reference(void **state) {
  (void)state;
  const int Ts[] = {40, 72, 100};
  for (int i = 0; i < 3; i++) random_case(Ts[i]);
}

static void fd_case(double corrupt, double *nmse) {
  const int T = 72;
  tt_grad_case c = {.name = corrupt ? "sparse_attention (control: x1.01)" : "sparse_attention", .n_in = 3,
                    .diff = {true, true, true}, .op = TPR_OP_SPARSE_ATTENTION, .h = 1e-3, .corrupt = corrupt};
  const tpr_sparse_attn sa = fix_sa();
  c.attrs = tpr_sparse_attn_attrs(&sa);
  float *q = npy("q_a", T * HQ * D), *k = npy("k_ab", KV_AB * HKV * D), *v = npy("v_ab", KV_AB * HKV * D);
  c.in[0] = tt_from_host(TPR_F32, 3, (const int64_t[]){T, HQ, D}, q);
  c.in[1] = tt_from_host(TPR_F32, 3, (const int64_t[]){T, HKV, D}, k);
  c.in[2] = tt_from_host(TPR_F32, 3, (const int64_t[]){T, HKV, D}, v);
  if (nmse) *nmse = tt_grad_check(&c);
  else tt_grad_expect(&c, NMSE_BOUND);
  tt_grad_free_inputs(&c);
  free(q), free(k), free(v);
}

static void test_finite_differences(void **state) {
  (void)state;
  fd_case(0, NULL);
  double nmse;
  fd_case(1.01, &nmse);
  printf("  control (gradient x 1.01): NMSE %.2e (must exceed %.0e)\n", nmse, NMSE_BOUND);
  assert_true(nmse > NMSE_BOUND);
}

static void expect_refused(tpr_op_kind op, int n_in, const int64_t (*shape)[3], const tpr_op_attrs *at,
                           const char *msg) {
  tpr_tensor *in[4];
  for (int i = 0; i < n_in; i++) in[i] = tt_new(TPR_F32, 3, shape[i]);
  tpr_tensor *out = tt_new(TPR_F32, 1, (const int64_t[]){1});
  const tpr_status rc = tpr_op_run(tt_cpu(), op, (const tpr_tensor *const *)in, n_in, at, out);
  printf("  refused (%s): %s\n", msg, tpr_last_error());
  assert_int_not_equal(rc, TPR_OK);
  for (int i = 0; i < n_in; i++) tpr_tensor_free(in[i]);
  tpr_tensor_free(out);
}

static void test_bad_input(void **state) {
  (void)state;
  tpr_sparse_attn sa = fix_sa();
  const tpr_op_attrs at = tpr_sparse_attn_attrs(&sa);
  expect_refused(TPR_OP_SPARSE_ATTENTION, 3, (const int64_t[][3]){{8, 4, 8}, {9, 2, 8}, {9, 2, 8}}, &at,
                 "k longer than q");
  expect_refused(TPR_OP_SPARSE_ATTENTION, 3, (const int64_t[][3]){{8, 3, 8}, {8, 2, 8}, {8, 2, 8}}, &at,
                 "Hq not a multiple of Hkv");
  expect_refused(TPR_OP_SPARSE_ATTENTION, 3, (const int64_t[][3]){{8, 4, 8}, {8, 2, 4}, {8, 2, 4}}, &at,
                 "head sizes differ");
  expect_refused(TPR_OP_SPARSE_ATTENTION_BWD, 4, (const int64_t[][3]){{8, 4, 8}, {8, 2, 8}, {8, 2, 8}, {8, 2, 8}},
                 &at, "dout not q's shape");
  sa.kernel_stride = 3;
  const tpr_op_attrs bad = tpr_sparse_attn_attrs(&sa);
  expect_refused(TPR_OP_SPARSE_ATTENTION, 3, (const int64_t[][3]){{8, 4, 8}, {8, 2, 8}, {8, 2, 8}}, &bad,
                 "kernel_size not a multiple of the stride");
  sa = fix_sa();
  sa.scale = NAN;
  const tpr_op_attrs nan_scale = tpr_sparse_attn_attrs(&sa);
  expect_refused(TPR_OP_SPARSE_ATTENTION, 3, (const int64_t[][3]){{8, 4, 8}, {8, 2, 8}, {8, 2, 8}}, &nan_scale,
                 "scale not finite");
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixture),
      cmocka_unit_test(test_random_vs_reference),
      cmocka_unit_test(test_finite_differences),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
