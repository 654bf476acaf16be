// sparse_attention_paged with its compressed-key pool (the 7th input, i[7] =
// TPR_SPARSE_CK_POOL; tpr_pb_sparse_attention_paged given a ck_pool,
// program.h): the pool a decode step
// scores from instead of recomputing a sequence's compressed keys.
//
// Fresh random sequences (seed printed) in a shuffled paged pool, advanced by
// a random schedule of calls (prefill chunks of 1 to 40 tokens, decode
// tokens, sequences joining and leaving batches) across dense_len: every
// call's output equals the plain form's (6 inputs, recomputing) bit for bit,
// for pool block sizes 16, 6 and 3 (4, 2 and 1 compressed rows a block; 3 is
// no multiple of the stride). After the schedule each pool row holds its
// chunk's mean (summed in double, rounded to f32), found where program.h
// says: the block of the chunk's last position, row (e % bs) / stride.
// Negative control: a decode call on a pool whose rows are negated picks
// other blocks, so the scoring really reads the pool.
// Bad input: a pool of the wrong shape or dtype, the flag without the input.
#include "ops_util.h"
#include "runtime/program/program.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HQ = 4, HKV = 2, D = 8, QROW = HQ * D, ROW = HKV * D, NSEQ = 3 };

static const tpr_sparse_attn SA = {.kernel_size = 8, .kernel_stride = 4, .block_size = 16, .topk = 3,
                                   .init_blocks = 1, .window_size = 32, .dense_len = 64, .scale = 0.4f};

static tpr_tensor *i32(int nd, const int64_t *shape, const int32_t *h) { return tt_from_host(TPR_I32, nd, shape, h); }

// The sequences' keys, values and queries of every position, laid out in a
// shuffled pool of pbs-row blocks.
typedef struct world {
  int pbs, L[NSEQ], MB, NB;
  float *q[NSEQ], *k[NSEQ], *v[NSEQ];
  int32_t *bt;  // (NSEQ, MB)
  tpr_tensor *kp, *vp, *ck;
} world;

static world make_world(int pbs, int min_len) {
  world w = {.pbs = pbs};
  for (int s = 0; s < NSEQ; s++) {
    w.L[s] = (int)tt_randint(min_len, 260);  // past dense_len
    const int nb = (w.L[s] + pbs - 1) / pbs;
    w.MB = nb > w.MB ? nb : w.MB, w.NB += nb;
    w.q[s] = malloc((size_t)w.L[s] * QROW * 4), w.k[s] = malloc((size_t)w.L[s] * ROW * 4);
    w.v[s] = malloc((size_t)w.L[s] * ROW * 4);
    tt_fill_normal(w.q[s], (size_t)w.L[s] * QROW, 1.0), tt_fill_normal(w.k[s], (size_t)w.L[s] * ROW, 1.0);
    tt_fill_normal(w.v[s], (size_t)w.L[s] * ROW, 1.0);
  }
  w.NB += 2;  // blocks nobody owns
  int *perm = malloc((size_t)w.NB * sizeof *perm);
  for (int i = 0; i < w.NB; i++) perm[i] = i;
  for (int i = w.NB - 1; i > 0; i--) {
    const int j = (int)tt_randint(0, i), x = perm[i];
    perm[i] = perm[j], perm[j] = x;
  }
  const size_t prow = (size_t)w.NB * pbs * ROW;
  float *kp = malloc(prow * 4), *vp = malloc(prow * 4);
  for (size_t i = 0; i < prow; i++) kp[i] = vp[i] = NAN;
  w.bt = malloc((size_t)NSEQ * w.MB * 4);
  for (int s = 0, used = 0; s < NSEQ; s++) {
    for (int j = 0; j < w.MB; j++) w.bt[s * w.MB + j] = j * pbs < w.L[s] ? perm[used++] : 0;
    for (int r = 0; r < w.L[s]; r++) {
      const size_t at = ((size_t)w.bt[s * w.MB + r / pbs] * pbs + r % pbs) * ROW;
      memcpy(kp + at, w.k[s] + (size_t)r * ROW, ROW * 4), memcpy(vp + at, w.v[s] + (size_t)r * ROW, ROW * 4);
    }
  }
  const int64_t ps[] = {w.NB, pbs, HKV, D}, cs[] = {w.NB, tpr_sparse_ck_rows(pbs, SA.kernel_stride), HKV, D};
  w.kp = tt_from_host(TPR_F32, 4, ps, kp), w.vp = tt_from_host(TPR_F32, 4, ps, vp);
  w.ck = tt_new(TPR_F32, 4, cs);
  float *c = tpr_tensor_data(w.ck);
  for (int64_t i = 0; i < cs[0] * cs[1] * cs[2] * cs[3]; i++) c[i] = NAN;  // an unwritten row shows
  free(perm), free(kp), free(vp);
  return w;
}

static void free_world(world *w) {
  for (int s = 0; s < NSEQ; s++) free(w->q[s]), free(w->k[s]), free(w->v[s]);
  free(w->bt), tpr_tensor_free(w->kp), tpr_tensor_free(w->vp), tpr_tensor_free(w->ck);
}

// One call: sequence s's positions [from[s], to[s]) (none when equal).
// with_ck: the 7-input form on w->ck. Returns the (T, HQ, D) output.
static float *call(world *w, const int *from, const int *to, bool with_ck, int *T_out) {
  int T = 0;
  for (int s = 0; s < NSEQ; s++) T += to[s] - from[s];
  int32_t *seq = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4);
  float *q = malloc((size_t)T * QROW * 4);
  for (int s = 0, t = 0; s < NSEQ; s++)
    for (int p = from[s]; p < to[s]; p++, t++) {
      seq[t] = s, pos[t] = p;
      memcpy(q + (size_t)t * QROW, w->q[s] + (size_t)p * QROW, QROW * 4);
    }
  const int64_t qs[] = {T, HQ, D};
  tpr_tensor *tq = tt_from_host(TPR_F32, 3, qs, q), *tb = i32(2, (const int64_t[]){NSEQ, w->MB}, w->bt);
  tpr_tensor *tsq = i32(1, (const int64_t[]){T}, seq), *tpo = i32(1, (const int64_t[]){T}, pos);
  tpr_tensor *out = tt_new(TPR_F32, 3, qs);
  tpr_op_attrs at = tpr_sparse_attn_attrs(&SA);
  if (with_ck) at.n_i = 8, at.i[7] = TPR_SPARSE_CK_POOL;
  const tpr_tensor *const in[7] = {tq, w->kp, w->vp, tb, tsq, tpo, w->ck};
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in, with_ck ? 7 : 6, &at, out));
  float *h = tt_to_host(out);
  tpr_tensor_free(tq), tpr_tensor_free(tb), tpr_tensor_free(tsq), tpr_tensor_free(tpo), tpr_tensor_free(out);
  free(seq), free(pos), free(q);
  *T_out = T;
  return h;
}

static void check_pool_rows(const world *w) {
  const int64_t R = tpr_sparse_ck_rows(w->pbs, SA.kernel_stride);
  const float *c = tpr_tensor_data(w->ck);
  int rows = 0;
  for (int s = 0; s < NSEQ; s++)
    for (int64_t j = 0; j * SA.kernel_stride + SA.kernel_size <= w->L[s]; j++) {
      const int64_t e = j * SA.kernel_stride + SA.kernel_size - 1, b = w->bt[s * w->MB + e / w->pbs];
      for (int g = 0; g < HKV; g++)
        for (int d = 0; d < D; d++) {
          double sum = 0;
          for (int64_t r = j * SA.kernel_stride; r <= e; r++) sum += w->k[s][r * ROW + g * D + d];
          const float want = (float)(sum / (double)SA.kernel_size);
          assert_true(c[((b * R + (e % w->pbs) / SA.kernel_stride) * HKV + g) * D + d] == want);
        }
      rows++;
    }
  printf("    %d compressed rows where program.h puts them, each its chunk's mean\n", rows);
}

static void test_schedule_equals_plain(void **state) {
  (void)state;
  const int sizes[] = {16, 6, 3};
  for (int si = 0; si < 3; si++) {
    world w = make_world(sizes[si], 70);
    int done[NSEQ] = {0}, calls = 0, tokens = 0;
    for (;;) {
      int from[NSEQ], to[NSEQ], any = 0;
      for (int s = 0; s < NSEQ; s++) {
        from[s] = to[s] = done[s];
        if (done[s] == w.L[s] || tt_randint(0, 3) == 0) continue;  // finished, or sits this call out
        const int n = tt_randint(0, 1) ? 1 : (int)tt_randint(1, 40);
        to[s] = done[s] + n < w.L[s] ? done[s] + n : w.L[s];
        any = 1;
      }
      int finished = 1;
      for (int s = 0; s < NSEQ; s++) finished &= done[s] == w.L[s];
      if (finished) break;
      if (!any) continue;
      int T, T2;
      float *plain = call(&w, from, to, false, &T), *cached = call(&w, from, to, true, &T2);
      for (int i = 0; i < T * QROW; i++) assert_true(isfinite(cached[i]));
      assert_memory_equal(plain, cached, (size_t)T * QROW * 4);
      free(plain), free(cached);
      for (int s = 0; s < NSEQ; s++) done[s] = to[s];
      calls++, tokens += T;
    }
    printf("  pool blocks of %d rows: %d calls, %d tokens (lengths %d, %d, %d): the pool's form = the plain form, "
           "bit for bit\n", w.pbs, calls, tokens, w.L[0], w.L[1], w.L[2]);
    check_pool_rows(&w);
    free_world(&w);
  }
}

// The pool filled by a prefill of all but the last position, then every
// row negated: the last position's decode picks other blocks than the plain
// form (which recomputes), so the scoring really reads the pool. (A NaN pool
// would not show: NaN scores lose every comparison and the lowest blocks win.)
static void test_wrong_pool_shows(void **state) {
  (void)state;
  world w = make_world(16, 200);  // 13+ blocks: 10+ candidates for 2 top-k slots
  int from[NSEQ] = {0}, to[NSEQ] = {0}, T;
  to[0] = w.L[0] - 1;
  free(call(&w, from, to, true, &T));
  float *c = tpr_tensor_data(w.ck);
  for (int64_t i = 0; i < tpr_tensor_numel(w.ck); i++) c[i] = -c[i];
  from[0] = w.L[0] - 1, to[0] = w.L[0];
  float *got = call(&w, from, to, true, &T), *want = call(&w, from, to, false, &T);
  double off = 0, big = 0;
  for (int i = 0; i < T * QROW; i++) {
    off = fmax(off, fabs((double)got[i] - want[i]));
    big = fmax(big, fabs((double)want[i]));
  }
  printf("  decode at %d from a negated pool: off by %.3f of max %.3f (must exceed 1e-3)\n", w.L[0] - 1, off, big);
  assert_true(off > 1e-3 * big);
  free(got), free(want), free_world(&w);
}

static void test_bad_pool(void **state) {
  (void)state;
  world w = make_world(16, 70);
  const int64_t qs[] = {1, HQ, D};
  const int32_t s0 = 0, p0 = 3;
  tpr_tensor *q = tt_random_f32(tt_cpu(), 3, qs, NULL), *out = tt_new(TPR_F32, 3, qs);
  tpr_tensor *tb = i32(2, (const int64_t[]){NSEQ, w.MB}, w.bt), *sq = i32(1, (const int64_t[]){1}, &s0);
  tpr_tensor *po = i32(1, (const int64_t[]){1}, &p0);
  tpr_tensor *wrong_rows = tt_new(TPR_F32, 4, (const int64_t[]){w.NB, 3, HKV, D});  // 16 / 4 = 4 rows
  tpr_tensor *wrong_nb = tt_new(TPR_F32, 4, (const int64_t[]){w.NB - 1, 4, HKV, D});
  tpr_tensor *wrong_dt = tt_new(TPR_I32, 4, (const int64_t[]){w.NB, 4, HKV, D});
  tpr_op_attrs at = tpr_sparse_attn_attrs(&SA);
  at.n_i = 8, at.i[7] = TPR_SPARSE_CK_POOL;
  tpr_tensor *bad[] = {wrong_rows, wrong_nb, wrong_dt};
  for (int i = 0; i < 3; i++) {
    const tpr_tensor *const in[7] = {q, w.kp, w.vp, tb, sq, po, bad[i]};
    assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in, 7, &at, out), TPR_ERR_INVALID_ARG);
    printf("  refused: %s\n", tpr_last_error());
  }
  const tpr_tensor *const in6[6] = {q, w.kp, w.vp, tb, sq, po};
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in6, 6, &at, out), TPR_ERR_INVALID_ARG);
  printf("  refused: %s\n", tpr_last_error());
  const tpr_tensor *const in7[7] = {q, w.kp, w.vp, tb, sq, po, w.ck};
  at.i[7] = 0;
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in7, 7, &at, out), TPR_ERR_INVALID_ARG);
  tpr_tensor *all[] = {q, out, tb, sq, po, wrong_rows, wrong_nb, wrong_dt};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tpr_tensor_free(all[i]);
  free_world(&w);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule_equals_plain),
      cmocka_unit_test(test_wrong_pool_shows),
      cmocka_unit_test(test_bad_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
