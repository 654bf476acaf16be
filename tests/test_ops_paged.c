// paged_cache_write and paged_attention (the engine's paged KV cache).
// Fresh random inputs each run (seed printed; rerun with TPR_TEST_SEED=...).
//
// A random step: B sequences of random context lengths whose blocks are
// shuffled over a pool (non-contiguous, spare blocks and unused rows hold
// NaN so any wrong read shows), and a batch of T tokens mixing prefill
// chunks, single decode tokens and padded tokens (seq = slot = -1), the
// sequences in random order. Checked, for block sizes 4 and 16:
//  (a) paged_attention = the contiguous attention op on each sequence's keys
//      bit for bit (both run ops/attention/flash.c's kernel, keys on the same
//      grid) and a double reference (rel <= 1e-5); padded rows exactly 0; a
//      strided q, and 1 or 3 threads instead of the backend's, give the same
//      bits. Contexts reach 592 keys (several 64-key tiles and 256-key
//      chunks; decode tokens there are split over the keys);
//  (b) paged_cache_write (its token not an output) then paged_attention in one
//      serialized program gives (a)'s output bit for bit and exactly (a)'s
//      pools: addressed rows written, every other row unchanged;
//  (c) batch invariance: each sequence run alone gives its rows bit for bit;
//  (d) negative control: two swapped block table entries fail (a)'s bound;
//  (e) bad indices are TPR_ERR_INVALID_ARG and write nothing; shape rules
//      reject mismatched shapes and dtypes.
#include "ops_util.h"
#include "runtime/ops/cpu_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HQ = 4, HKV = 2, D = 16, NSEQ = 5, MAXLEN = 592, MAXPAD = 4 };  // MAXLEN: whole blocks of 4 and 16
enum { MAXT = NSEQ * MAXLEN + MAXPAD, ROW = HKV * D, QROW = HQ * D };

typedef struct scene {
  int bs, NB, MB, T;
  int len[NSEQ];    // context after the step: positions [0, len)
  int n[NSEQ];      // the step's tokens of s: positions [len - n, len); 0 = absent
  int t0[NSEQ];     // index of s's first token in the batch
  int32_t *bt;      // (NSEQ, MB); -1 where unused (never read)
  int32_t seq[MAXT], pos[MAXT], slot[MAXT];
  float *Q;         // (T, HQ, D)
  float *K, *V;     // (NSEQ, MAXLEN, HKV, D): sequence s's keys, contiguous
  float *kpool, *vpool;    // (NB, bs, HKV, D) after the step; NaN where unaddressed
  float *kpool0, *vpool0;  // before it: the step's rows NaN too
  float *knew, *vnew;      // (T, HKV, D) the step's rows; 7.0 for padded tokens
} scene;

static float scale_of(void) { return 1.0f / sqrtf((float)D); }

static int64_t pool_row(const scene *sc, const int32_t *bt, int s, int p) {
  return (int64_t)bt[s * sc->MB + p / sc->bs] * sc->bs + p % sc->bs;
}

static void make_scene(scene *sc, int bs) {
  memset(sc, 0, sizeof *sc);
  sc->bs = bs;
  sc->MB = (MAXLEN + bs - 1) / bs;
  int need = 0;
  for (int s = 0; s < NSEQ; s++) {
    // Sequence 0 fills >= 2 whole blocks (the negative control swaps two;
    // full blocks keep that swap's error finite rather than a NaN read).
    sc->len[s] = s == 0 ? MAXLEN - bs * (int)tt_randint(0, 1) : (int)tt_randint(1, MAXLEN);
    const int kind = s == 0 ? 1 : (int)tt_randint(0, 3);  // 0 decode, 1 chunk, 2 whole prefill, 3 absent
    sc->n[s] = kind == 0 ? 1 : kind == 1 ? (int)tt_randint(s == 0 ? 2 : 1, sc->len[s] < 20 ? sc->len[s] : 20)
               : kind == 2 ? sc->len[s] : 0;
    need += (sc->len[s] + bs - 1) / bs;
  }
  sc->NB = need + 3;  // spare blocks nobody owns
  int perm[NSEQ * MAXLEN + 3];
  for (int i = 0; i < sc->NB; i++) perm[i] = i;
  for (int i = sc->NB - 1; i > 0; i--) {
    int j = (int)tt_randint(0, i), x = perm[i];
    perm[i] = perm[j], perm[j] = x;
  }
  sc->bt = malloc((size_t)NSEQ * sc->MB * sizeof *sc->bt);
  for (int i = 0, b = 0; i < NSEQ * sc->MB; i++) {
    const int s = i / sc->MB, j = i % sc->MB;
    sc->bt[i] = j * bs < sc->len[s] ? perm[b++] : -1;
  }
  const size_t kn = (size_t)NSEQ * MAXLEN * ROW, pn = (size_t)sc->NB * bs * ROW;
  sc->K = malloc(kn * 4), sc->V = malloc(kn * 4);
  tt_fill_normal(sc->K, kn, 1.0), tt_fill_normal(sc->V, kn, 1.0);
  float *pools[4] = {sc->kpool = malloc(pn * 4), sc->vpool = malloc(pn * 4), sc->kpool0 = malloc(pn * 4),
                     sc->vpool0 = malloc(pn * 4)};
  for (int k = 0; k < 4; k++)
    for (size_t i = 0; i < pn; i++) pools[k][i] = NAN;
  for (int s = 0; s < NSEQ; s++)
    for (int p = 0; p < sc->len[s]; p++) {
      const int64_t r = pool_row(sc, sc->bt, s, p);
      const float *k = sc->K + ((size_t)s * MAXLEN + p) * ROW, *v = sc->V + ((size_t)s * MAXLEN + p) * ROW;
      memcpy(sc->kpool + r * ROW, k, ROW * 4), memcpy(sc->vpool + r * ROW, v, ROW * 4);
      if (p < sc->len[s] - sc->n[s]) memcpy(sc->kpool0 + r * ROW, k, ROW * 4), memcpy(sc->vpool0 + r * ROW, v, ROW * 4);
    }
  // The batch: present sequences in random order, padded tokens between.
  int order[NSEQ];
  for (int s = 0; s < NSEQ; s++) order[s] = s;
  for (int i = NSEQ - 1; i > 0; i--) {
    int j = (int)tt_randint(0, i), x = order[i];
    order[i] = order[j], order[j] = x;
  }
  int T = 0, pads = 0;
  for (int i = 0; i <= NSEQ; i++) {
    const int np = (i == NSEQ && pads == 0) ? 1 : (pads < MAXPAD && tt_randint(0, 2) == 0);
    for (int k = 0; k < np; k++, pads++) sc->seq[T] = -1, sc->pos[T] = -1, sc->slot[T++] = -1;
    if (i == NSEQ) break;
    const int s = order[i];
    sc->t0[s] = T;
    for (int k = 0; k < sc->n[s]; k++, T++) {
      sc->seq[T] = s, sc->pos[T] = sc->len[s] - sc->n[s] + k;
      sc->slot[T] = (int32_t)pool_row(sc, sc->bt, s, sc->pos[T]);
    }
  }
  sc->T = T;
  sc->Q = malloc((size_t)T * QROW * 4);
  tt_fill_normal(sc->Q, (size_t)T * QROW, 1.0);
  sc->knew = malloc((size_t)T * ROW * 4), sc->vnew = malloc((size_t)T * ROW * 4);
  for (int t = 0; t < T; t++) {
    const int s = sc->seq[t];
    for (int i = 0; i < ROW; i++) {
      sc->knew[t * ROW + i] = s < 0 ? 7.0f : sc->K[((size_t)s * MAXLEN + sc->pos[t]) * ROW + i];
      sc->vnew[t * ROW + i] = s < 0 ? 7.0f : sc->V[((size_t)s * MAXLEN + sc->pos[t]) * ROW + i];
    }
  }
}

static void free_scene(scene *sc) {
  free(sc->bt), free(sc->Q), free(sc->K), free(sc->V), free(sc->kpool), free(sc->vpool);
  free(sc->kpool0), free(sc->vpool0), free(sc->knew), free(sc->vnew);
}

// max |got - want| / max |want| over n; infinity when got has a NaN/inf.
static double rel_err(const float *got, const float *want, size_t n) {
  double e = 0, m = 1e-30;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) return INFINITY;
    e = fmax(e, fabs((double)got[i] - want[i])), m = fmax(m, fabs((double)want[i]));
  }
  return e / m;
}

static tpr_tensor *i32_tensor(int nd, const int64_t *shape, const int32_t *h) {
  return tt_from_host(TPR_I32, nd, shape, h);
}

// paged_attention on the CPU backend; q strided (a (HQ, T, D) permuted view)
// when asked. On success *out_host is malloc'ed (T, HQ, D); the status is returned.
// > 0: run_paged calls the CPU kernel directly with this many threads.
static int g_threads = 0;

static tpr_status run_paged(const scene *sc, const int32_t *bt, const int32_t *seq, const int32_t *pos, int T,
                            const float *Q, bool strided_q, const float *out_init, float **out_host) {
  const int64_t qs[] = {T, HQ, D}, ps[] = {sc->NB, sc->bs, HKV, D}, bs2[] = {NSEQ, sc->MB}, ts[] = {T};
  tpr_tensor *qbase = NULL, *q;
  if (strided_q) {
    float *qp = malloc((size_t)T * QROW * 4 + 4);
    for (int t = 0; t < T; t++)
      for (int h = 0; h < HQ; h++) memcpy(qp + ((size_t)h * T + t) * D, Q + ((size_t)t * HQ + h) * D, D * 4);
    qbase = tt_from_host(TPR_F32, 3, (const int64_t[]){HQ, T, D}, qp);
    free(qp);
    TT_OK(tpr_tensor_permute(qbase, (const int[]){1, 0, 2}, &q));
  } else {
    q = tt_from_host(TPR_F32, 3, qs, Q);
  }
  tpr_tensor *kp = tt_from_host(TPR_F32, 4, ps, sc->kpool), *vp = tt_from_host(TPR_F32, 4, ps, sc->vpool);
  tpr_tensor *tb = i32_tensor(2, bs2, bt), *sq = i32_tensor(1, ts, seq), *po = i32_tensor(1, ts, pos);
  tpr_tensor *out = out_init ? tt_from_host(TPR_F32, 3, qs, out_init) : tt_new(TPR_F32, 3, qs);
  tpr_op_attrs at = {.n_f = 1, .f = {scale_of()}};
  const tpr_tensor *const in[6] = {q, kp, vp, tb, sq, po};
  tpr_cpu_ctx ctx = {.n_threads = g_threads};
  tpr_status rc = g_threads > 0 ? tt_cpu()->vt->kernels[TPR_OP_PAGED_ATTENTION](&ctx, in, 6, &at, out)
                                : tpr_op_run(tt_cpu(), TPR_OP_PAGED_ATTENTION, in, 6, &at, out);
  *out_host = tt_to_host(out);
  tpr_tensor_free(q), tpr_tensor_free(kp), tpr_tensor_free(vp), tpr_tensor_free(tb), tpr_tensor_free(sq);
  tpr_tensor_free(po), tpr_tensor_free(out);
  if (qbase) tpr_tensor_free(qbase);
  return rc;
}

// The contiguous attention op on sequence s's run: q rows [t0, t0 + n),
// caches (len, HKV, D), start = len - n. Returns malloc'ed (n, HQ, D).
static float *contiguous_attention(const scene *sc, int s) {
  const int n = sc->n[s], L = sc->len[s];
  const int64_t qs[] = {n, HQ, D}, cs[] = {L, HKV, D};
  tpr_tensor *q = tt_from_host(TPR_F32, 3, qs, sc->Q + (size_t)sc->t0[s] * QROW);
  tpr_tensor *k = tt_from_host(TPR_F32, 3, cs, sc->K + (size_t)s * MAXLEN * ROW);
  tpr_tensor *v = tt_from_host(TPR_F32, 3, cs, sc->V + (size_t)s * MAXLEN * ROW);
  const int32_t st32 = L - n;
  tpr_tensor *st = i32_tensor(1, (const int64_t[]){1}, &st32), *out = tt_new(TPR_F32, 3, qs);
  TT_OK(tpr_attention(tt_cpu(), q, k, v, st, scale_of(), out));
  float *h = tt_to_host(out);
  tpr_tensor_free(q), tpr_tensor_free(k), tpr_tensor_free(v), tpr_tensor_free(st), tpr_tensor_free(out);
  return h;
}

// Worst rel error of the paged output against the contiguous op over all
// present sequences.
static double err_vs_contiguous(const scene *sc, const float *got) {
  double worst = 0;
  for (int s = 0; s < NSEQ; s++) {
    if (!sc->n[s]) continue;
    float *want = contiguous_attention(sc, s);
    worst = fmax(worst, rel_err(got + (size_t)sc->t0[s] * QROW, want, (size_t)sc->n[s] * QROW));
    free(want);
  }
  return worst;
}

// The definition in double: token t of s attends positions [0, pos[t]].
static double err_vs_double(const scene *sc, const float *got) {
  double worst = 0, m = 1e-30, sc_d = scale_of();
  double sc_buf[MAXLEN];
  for (int t = 0; t < sc->T; t++) {
    const int s = sc->seq[t];
    if (s < 0) continue;
    for (int h = 0; h < HQ; h++) {
      const int g = h / (HQ / HKV), L = sc->pos[t] + 1;
      const float *q = sc->Q + ((size_t)t * HQ + h) * D;
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j < L; j++) {
        const float *k = sc->K + (((size_t)s * MAXLEN + j) * HKV + g) * D;
        double dot = 0;
        for (int d = 0; d < D; d++) dot += (double)q[d] * k[d];
        sc_buf[j] = dot * sc_d, mx = fmax(mx, sc_buf[j]);
      }
      for (int j = 0; j < L; j++) sum += (sc_buf[j] = exp(sc_buf[j] - mx));
      for (int d = 0; d < D; d++) {
        double o = 0;
        for (int j = 0; j < L; j++) o += sc_buf[j] / sum * sc->V[(((size_t)s * MAXLEN + j) * HKV + g) * D + d];
        const float gv = got[((size_t)t * HQ + h) * D + d];
        worst = isfinite(gv) ? fmax(worst, fabs(gv - o)) : INFINITY, m = fmax(m, fabs(o));
      }
    }
  }
  return worst / m;
}

// ---------------------------------------------------------------- (a), (c), (d)

static void check_eager(int bs) {
  scene sc;
  make_scene(&sc, bs);
  float *got, *got_strided;
  TT_OK(run_paged(&sc, sc.bt, sc.seq, sc.pos, sc.T, sc.Q, false, NULL, &got));
  const double e_contig = err_vs_contiguous(&sc, got), e_double = err_vs_double(&sc, got);
  int pad_rows = 0;
  for (int t = 0; t < sc.T; t++) {
    if (sc.seq[t] >= 0) continue;
    pad_rows++;
    for (int i = 0; i < QROW; i++)
      if (memcmp(&got[(size_t)t * QROW + i], &(float){0.0f}, 4)) fail_msg("padded row %d is not exactly 0", t);
  }
  TT_OK(run_paged(&sc, sc.bt, sc.seq, sc.pos, sc.T, sc.Q, true, NULL, &got_strided));
  assert_memory_equal(got, got_strided, (size_t)sc.T * QROW * 4);
  for (int nt = 1; nt <= 3; nt += 2) {  // the backend runs tt_cpu()'s thread count
    float *other;
    g_threads = nt;
    TT_OK(run_paged(&sc, sc.bt, sc.seq, sc.pos, sc.T, sc.Q, false, NULL, &other));
    g_threads = 0;
    assert_memory_equal(got, other, (size_t)sc.T * QROW * 4);
    free(other);
  }

  // (c) each sequence alone, at batch offset 0 instead of t0[s].
  int alone = 0;
  for (int s = 0; s < NSEQ; s++) {
    if (!sc.n[s]) continue;
    float *one;
    TT_OK(run_paged(&sc, sc.bt, sc.seq + sc.t0[s], sc.pos + sc.t0[s], sc.n[s], sc.Q + (size_t)sc.t0[s] * QROW, false,
                    NULL, &one));
    if (memcmp(one, got + (size_t)sc.t0[s] * QROW, (size_t)sc.n[s] * QROW * 4))
      fail_msg("bs %d: sequence %d alone differs from its rows in the mixed batch", bs, s);
    alone++;
    free(one);
  }

  // (d) swap sequence 0's first and last block table entries (len > bs: two
  // blocks). Swapping two blocks every query sees whole changes nothing
  // (softmax does not care about key order); the last block is only partly
  // visible to the chunk's earlier tokens, so this swap changes what they see.
  int32_t *bad = malloc((size_t)NSEQ * sc.MB * sizeof *bad);
  memcpy(bad, sc.bt, (size_t)NSEQ * sc.MB * sizeof *bad);
  const int last = (sc.len[0] - 1) / bs;
  const int32_t x = bad[0];
  bad[0] = bad[last], bad[last] = x;
  float *swapped;
  TT_OK(run_paged(&sc, bad, sc.seq, sc.pos, sc.T, sc.Q, false, NULL, &swapped));
  const double e_swap = err_vs_contiguous(&sc, swapped);
  printf("bs %2d: T %3d (%d padded), NB %3d, lens %d %d %d %d %d, step tokens %d %d %d %d %d: rel err vs contiguous "
         "op %.3g, vs double %.3g; %d sequences alone and 1, 3 threads bit-identical; swapped blocks -> %.3g\n",
         bs, sc.T, pad_rows, sc.NB, sc.len[0], sc.len[1], sc.len[2], sc.len[3], sc.len[4], sc.n[0], sc.n[1],
         sc.n[2], sc.n[3], sc.n[4], e_contig, e_double, alone, e_swap);
  assert_true(e_contig == 0);  // bit for bit
  assert_true(e_double <= 1e-5);
  assert_true(e_swap > 1e-4);  // the control: a wrong block table is far from the contiguous op
  free(got), free(got_strided), free(swapped), free(bad);
  free_scene(&sc);
}

static void test_paged_attention(void **state) {
  for (int rep = 0; rep < 3; rep++) check_eager(4), check_eager(16);
}

// ---------------------------------------------------------------- (b) one program

static void check_program(int bs) {
  scene sc;
  make_scene(&sc, bs);
  const int T = sc.T;
  const int64_t qs[] = {T, HQ, D}, ns[] = {T, HKV, D}, ts[] = {T}, ps[] = {sc.NB, bs, HKV, D}, bts[] = {NSEQ, sc.MB};
  tpr_program *p, *p2;
  TT_OK(tpr_program_new(&p));
  tpr_value_id q, kn, vn, sl, bt, sq, po, kp, vp, wk, wv, att;
  TT_OK(tpr_program_input(p, "q", TPR_F32, 3, qs, &q));
  TT_OK(tpr_program_input(p, "k_new", TPR_F32, 3, ns, &kn));
  TT_OK(tpr_program_input(p, "v_new", TPR_F32, 3, ns, &vn));
  TT_OK(tpr_program_input(p, "slot_mapping", TPR_I32, 1, ts, &sl));
  TT_OK(tpr_program_input(p, "block_tables", TPR_I32, 2, bts, &bt));
  TT_OK(tpr_program_input(p, "seq", TPR_I32, 1, ts, &sq));
  TT_OK(tpr_program_input(p, "positions", TPR_I32, 1, ts, &po));
  TT_OK(tpr_program_param(p, "k_pool", TPR_F32, 4, ps, &kp));
  TT_OK(tpr_program_param(p, "v_pool", TPR_F32, 4, ps, &vp));
  // The writes' tokens are outputs of nothing: the nodes must still run.
  TT_OK(tpr_pb_paged_cache_write(p, kp, kn, sl, &wk));
  TT_OK(tpr_pb_paged_cache_write(p, vp, vn, sl, &wv));
  TT_OK(tpr_pb_paged_attention(p, q, kp, vp, bt, sq, po, scale_of(), &att));
  TT_OK(tpr_program_output(p, att, "out"));
  uint8_t *bytes;
  size_t len;
  TT_OK(tpr_program_serialize(p, &bytes, &len));
  TT_OK(tpr_program_deserialize(bytes, len, &p2));
  free(bytes);
  tpr_program_free(p);

  tpr_tensor *t_q = tt_from_host(TPR_F32, 3, qs, sc.Q), *t_kn = tt_from_host(TPR_F32, 3, ns, sc.knew);
  tpr_tensor *t_vn = tt_from_host(TPR_F32, 3, ns, sc.vnew), *t_sl = i32_tensor(1, ts, sc.slot);
  tpr_tensor *t_bt = i32_tensor(2, bts, sc.bt), *t_sq = i32_tensor(1, ts, sc.seq), *t_po = i32_tensor(1, ts, sc.pos);
  tpr_tensor *t_kp = tt_from_host(TPR_F32, 4, ps, sc.kpool0), *t_vp = tt_from_host(TPR_F32, 4, ps, sc.vpool0);
  tpr_exec *e;
  TT_OK(tpr_exec_new(p2, tt_cpu(), &e));
  const char *names[] = {"q", "k_new", "v_new", "slot_mapping", "block_tables", "seq", "positions", "k_pool", "v_pool"};
  tpr_tensor *ts_[] = {t_q, t_kn, t_vn, t_sl, t_bt, t_sq, t_po, t_kp, t_vp};
  for (int i = 0; i < 9; i++) TT_OK(tpr_exec_bind(e, names[i], ts_[i]));
  TT_OK(tpr_exec_run(e));
  const tpr_tensor *out;
  TT_OK(tpr_exec_output(e, "out", &out));
  float *got = tt_to_host(out), *want;
  TT_OK(run_paged(&sc, sc.bt, sc.seq, sc.pos, T, sc.Q, false, NULL, &want));  // (a) on the finished pools
  const size_t pn = (size_t)sc.NB * bs * ROW;
  float *kafter = tt_to_host(t_kp), *vafter = tt_to_host(t_vp);
  int written = 0;
  for (int t = 0; t < T; t++) written += sc.slot[t] >= 0;
  printf("bs %2d program: T %3d, %d rows written into %d-row pools; output and pools vs eager: %s\n", bs, T, written,
         sc.NB * bs,
         !memcmp(got, want, (size_t)T * QROW * 4) && !memcmp(kafter, sc.kpool, pn * 4) &&
                 !memcmp(vafter, sc.vpool, pn * 4)
             ? "bit-identical"
             : "DIFFERENT");
  assert_memory_equal(got, want, (size_t)T * QROW * 4);
  // Addressed rows hold the new rows, every other row (NaN here) is unchanged.
  assert_memory_equal(kafter, sc.kpool, pn * 4);
  assert_memory_equal(vafter, sc.vpool, pn * 4);
  free(got), free(want), free(kafter), free(vafter);
  tpr_exec_free(e);
  tpr_program_free(p2);
  for (int i = 0; i < 9; i++) tpr_tensor_free(ts_[i]);
  free_scene(&sc);
}

static void test_paged_program(void **state) {
  for (int rep = 0; rep < 2; rep++) check_program(4), check_program(16);
}

// A strided new (a (HKV, T, D) permuted view) writes the same rows.
static void test_cache_write_strided(void **state) {
  scene sc;
  make_scene(&sc, 4);
  const int T = sc.T;
  const int64_t ps[] = {sc.NB, 4, HKV, D}, ts[] = {T};
  float *np_ = malloc((size_t)T * ROW * 4);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < HKV; h++) memcpy(np_ + ((size_t)h * T + t) * D, sc.knew + ((size_t)t * HKV + h) * D, D * 4);
  tpr_tensor *base = tt_from_host(TPR_F32, 3, (const int64_t[]){HKV, T, D}, np_), *nw;
  TT_OK(tpr_tensor_permute(base, (const int[]){1, 0, 2}, &nw));
  tpr_tensor *pool = tt_from_host(TPR_F32, 4, ps, sc.kpool0), *sl = i32_tensor(1, ts, sc.slot);
  tpr_tensor *tok = tt_new(TPR_I32, 1, (const int64_t[]){1});
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_PAGED_CACHE_WRITE, (const tpr_tensor *const[]){pool, nw, sl}, 3, NULL, tok));
  float *after = tt_to_host(pool);
  assert_memory_equal(after, sc.kpool, (size_t)sc.NB * 4 * ROW * 4);
  int written = 0;
  for (int t = 0; t < T; t++) written += sc.slot[t] >= 0;
  assert_int_equal(*(const int32_t *)tpr_tensor_data(tok), written);
  printf("strided new: %d rows written, pool as expected\n", written);
  free(np_), free(after);
  tpr_tensor_free(nw), tpr_tensor_free(base), tpr_tensor_free(pool), tpr_tensor_free(sl), tpr_tensor_free(tok);
  free_scene(&sc);
}

// ---------------------------------------------------------------- (e) errors

static void expect_attention_rejects(const scene *sc, const int32_t *bt, const int32_t *seq, const int32_t *pos,
                                     const char *what) {
  float *init = malloc((size_t)sc->T * QROW * 4), *got;
  for (int i = 0; i < sc->T * QROW; i++) init[i] = 3.0f;
  tpr_status rc = run_paged(sc, bt, seq, pos, sc->T, sc->Q, false, init, &got);
  printf("  %-40s -> %s: %s\n", what, tpr_status_name(rc), tpr_last_error());
  assert_int_equal(rc, TPR_ERR_INVALID_ARG);
  assert_memory_equal(got, init, (size_t)sc->T * QROW * 4);  // nothing written
  free(init), free(got);
}

static void test_bad_indices(void **state) {
  scene sc;
  make_scene(&sc, 4);
  const int T = sc.T, t = sc.t0[0];  // sequence 0 is always in the batch
  int32_t seq[MAXT], pos[MAXT], *bt = malloc((size_t)NSEQ * sc.MB * sizeof *bt);
  memcpy(seq, sc.seq, sizeof seq), memcpy(pos, sc.pos, sizeof pos);
  seq[t] = NSEQ;
  expect_attention_rejects(&sc, sc.bt, seq, sc.pos, "seq >= B");
  seq[t] = sc.seq[t], pos[t] = sc.MB * sc.bs;
  expect_attention_rejects(&sc, sc.bt, seq, pos, "position = MB*bs");
  pos[t] = -1;
  expect_attention_rejects(&sc, sc.bt, seq, pos, "position -1 of a real token");
  memcpy(bt, sc.bt, (size_t)NSEQ * sc.MB * sizeof *bt);
  bt[0] = sc.NB;  // sequence 0's first block: read by every token of it
  expect_attention_rejects(&sc, bt, sc.seq, sc.pos, "block id = NB");
  bt[0] = -1;
  expect_attention_rejects(&sc, bt, sc.seq, sc.pos, "block id -1 where read");
  free(bt);

  // paged_cache_write: a bad slot after valid ones writes nothing.
  const int64_t ps[] = {sc.NB, 4, HKV, D}, ns[] = {T, HKV, D}, ts[] = {T};
  int32_t slot[MAXT];
  memcpy(slot, sc.slot, sizeof slot);
  slot[T - 1] = sc.NB * 4;
  tpr_tensor *pool = tt_from_host(TPR_F32, 4, ps, sc.kpool0), *nw = tt_from_host(TPR_F32, 3, ns, sc.knew);
  tpr_tensor *sl = i32_tensor(1, ts, slot), *tok = tt_new(TPR_I32, 1, (const int64_t[]){1});
  tpr_status rc = tpr_op_run(tt_cpu(), TPR_OP_PAGED_CACHE_WRITE, (const tpr_tensor *const[]){pool, nw, sl}, 3, NULL,
                             tok);
  printf("  %-40s -> %s: %s\n", "slot = NB*bs (last token)", tpr_status_name(rc), tpr_last_error());
  assert_int_equal(rc, TPR_ERR_INVALID_ARG);
  float *after = tt_to_host(pool);
  assert_memory_equal(after, sc.kpool0, (size_t)sc.NB * 4 * ROW * 4);
  free(after);
  tpr_tensor_free(pool), tpr_tensor_free(nw), tpr_tensor_free(sl), tpr_tensor_free(tok);
  free_scene(&sc);
}

// Shapes for the rule checks: each field's (ndim, shape, dtype).
typedef struct desc {
  tpr_dtype dt;
  int nd;
  int64_t s[4];
} desc;

// Builds a program with inputs shaped by d[] and appends the op: its status.
static tpr_status build(bool attention, const desc *d) {
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  tpr_value_id v[6], out;
  const int n = attention ? 6 : 3;
  for (int i = 0; i < n; i++) {
    char name[8];
    snprintf(name, sizeof name, "in%d", i);
    TT_OK(tpr_program_input(p, name, d[i].dt, d[i].nd, d[i].s, &v[i]));
  }
  tpr_status rc = attention ? tpr_pb_paged_attention(p, v[0], v[1], v[2], v[3], v[4], v[5], 0.25f, &out)
                            : tpr_pb_paged_cache_write(p, v[0], v[1], v[2], &out);
  printf("  %s -> %s: %s\n", attention ? "paged_attention" : "paged_cache_write", tpr_status_name(rc),
         rc ? tpr_last_error() : "");
  tpr_program_free(p);
  return rc;
}

static void test_shape_rules(void **state) {
  const desc q = {TPR_F32, 3, {5, 4, 8}}, pool = {TPR_F32, 4, {6, 4, 2, 8}}, bt = {TPR_I32, 2, {3, 2}},
             tok = {TPR_I32, 1, {5}}, nw = {TPR_F32, 3, {5, 2, 8}};
  desc a[6] = {q, pool, pool, bt, tok, tok}, w[3] = {pool, nw, tok};
  assert_int_equal(build(true, a), TPR_OK);
  assert_int_equal(build(false, w), TPR_OK);
#define EXPECT(attention, arr, i, field, code)    \
  do {                                            \
    desc saved = arr[i];                          \
    field;                                        \
    assert_int_equal(build(attention, arr), code); \
    arr[i] = saved;                               \
  } while (0)
  EXPECT(true, a, 0, a[0].s[2] = 16, TPR_ERR_SHAPE);           // q's D != the pools'
  EXPECT(true, a, 0, a[0].s[1] = 3, TPR_ERR_SHAPE);            // Hq = 3 not a multiple of Hkv = 2
  EXPECT(true, a, 2, a[2].s[0] = 7, TPR_ERR_SHAPE);            // v_pool != k_pool
  EXPECT(true, a, 1, a[1].nd = 3, TPR_ERR_SHAPE);              // a 3-D pool
  EXPECT(true, a, 4, a[4].s[0] = 4, TPR_ERR_SHAPE);            // seq (4) for T = 5
  EXPECT(true, a, 5, a[5].s[0] = 6, TPR_ERR_SHAPE);            // positions (6) for T = 5
  EXPECT(true, a, 3, a[3].nd = 1, TPR_ERR_SHAPE);              // 1-D block tables
  EXPECT(true, a, 3, a[3].dt = TPR_I64, TPR_ERR_DTYPE);        // i64 block tables
  EXPECT(true, a, 0, a[0].dt = TPR_BF16, TPR_ERR_DTYPE);       // bf16 q
  EXPECT(true, a, 1, a[1].s[1] = 0, TPR_ERR_SHAPE);            // block size 0
  EXPECT(false, w, 1, w[1].s[1] = 3, TPR_ERR_SHAPE);           // new's Hkv != the pool's
  EXPECT(false, w, 1, w[1].s[2] = 4, TPR_ERR_SHAPE);           // new's D != the pool's
  EXPECT(false, w, 2, w[2].s[0] = 6, TPR_ERR_SHAPE);           // slot_mapping (6) for T = 5
  EXPECT(false, w, 2, w[2].dt = TPR_F32, TPR_ERR_DTYPE);       // f32 slot_mapping
  EXPECT(false, w, 0, w[0].dt = TPR_F16, TPR_ERR_DTYPE);       // f16 pool
#undef EXPECT
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paged_attention),  cmocka_unit_test(test_paged_program),
      cmocka_unit_test(test_cache_write_strided), cmocka_unit_test(test_bad_indices),
      cmocka_unit_test(test_shape_rules),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(tt_cpu());
  return rc;
}
