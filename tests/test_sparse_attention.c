// InfLLM-v2 sparse attention (ops.h sparse_attention_paged; semantics at
// tpr_pb_sparse_attention_paged) on the CPU, keys and values read in place
// from a paged pool whose blocks are shuffled (unused rows NaN, so a wrong
// read shows).
//
// Against the float64 PyTorch reference (scripts/reference/minicpm_sala_ref.py
// via make_sparse_attention_fixture.py, tests/fixtures/sparse_attention; Hq 4,
// Hkv 2, D 8, kernel 4 stride 2, blocks of 8, topk 3, 1 init block, a window of
// 2 blocks, dense_len 48), within REF_BOUND: a 72-token prefill (sparse), a
// 64-token sequence of exact score ties (the lower blocks win) and a 40-token
// one (dense) in one batch with padded tokens; a 3-token chunk after a 72-row
// cache, and the same 3 tokens as 3 one-token decode calls.
// Negative controls, each off by more than CTRL_MIN: top-k with one block too
// few or too many, the local window one block short or long, RoPE applied to
// q and k (the sparse layers have none), all blocks attended (dense_len past
// the sequence), and the reference's own output with one selected block
// swapped for the next best.
// Fresh random inputs (seed printed): below dense_len, and in sparse mode with
// every block selected, the op equals paged_attention; pool block sizes 4 and
// 16 with different shuffles, each sequence alone or in a batch, 1 or 3
// threads, and a serialized program all give the same bits.
// The prefill-length form: a prompt in calls given its length equals its
// one call; 0 is the plain form; decode rows are unchanged.
// Bad input: shape-rule refusals and out-of-range indices, nothing written.
#include "ops_util.h"
#include "runtime/ops/cpu_kernels.h"
#include "runtime/program/program.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_BOUND 1e-5  // vs the float64 reference, relative to its largest magnitude
#define CTRL_MIN 1e-3   // a control must be off by at least 100x the bound

enum { HQ = 4, HKV = 2, D = 8, QROW = HQ * D, ROW = HKV * D, MAXSEQ = 4 };

#ifndef TPR_FIXTURES
#define TPR_FIXTURES "tests/fixtures"
#endif

static const tpr_sparse_attn FIX_SA = {.kernel_size = 4, .kernel_stride = 2, .block_size = 8, .topk = 3,
                                       .init_blocks = 1, .window_size = 16, .dense_len = 48, .scale = 0.0f};

static tpr_sparse_attn fix_sa(void) {
  tpr_sparse_attn sa = FIX_SA;
  sa.scale = 1.0f / sqrtf((float)D);
  return sa;
}

static float *npy(const char *name, int64_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/sparse_attention/%s.npy", TPR_FIXTURES, name);
  return tt_read_npy_f32(path, n);
}

// One sequence of a call: keys/values of positions [0, L), queries of [p0, L).
typedef struct sseq {
  int L, p0;
  const float *q, *k, *v;  // q (L - p0, HQ, D); k, v (L, HKV, D)
} sseq;

// How a batch is laid out and run.
typedef struct runopt {
  int pbs;        // the pool's block size
  int threads;    // > 0: the CPU kernel directly with this many threads
  int n_pad;      // padded tokens (seq -1) after the sequences' tokens
  bool rope;      // apply RoPE (theta 1e4, positions as the tokens') to q and to every key first
  bool with_pl;     // the prefill-length form, every token's prefill_len `prefill_len`
  int prefill_len;
  tpr_op_kind op;  // TPR_OP_SPARSE_ATTENTION_PAGED or TPR_OP_PAGED_ATTENTION
} runopt;

static tpr_tensor *i32(int nd, const int64_t *shape, const int32_t *h) { return tt_from_host(TPR_I32, nd, shape, h); }

// x (n, heads, D) rotated at positions p0 .. p0 + n - 1, in place (tpr's rope op).
static void rope_rows(float *x, int n, int heads, int p0) {
  if (n == 0) return;
  int32_t *pos = malloc((size_t)n * sizeof *pos);
  for (int i = 0; i < n; i++) pos[i] = p0 + i;
  const int64_t shape[] = {n, heads, D};
  tpr_tensor *t = tt_from_host(TPR_F32, 3, shape, x), *tp = i32(1, (const int64_t[]){n}, pos), *o = tt_new(TPR_F32, 3, shape);
  TT_OK(tpr_rope(tt_cpu(), t, tp, D, 1e4f, o));
  memcpy(x, tpr_tensor_data(o), (size_t)n * heads * D * sizeof *x);
  tpr_tensor_free(t), tpr_tensor_free(tp), tpr_tensor_free(o), free(pos);
}

// Runs the op on n sequences laid out in a shuffled pool; *rc gets the
// status. Returns the malloc'ed (T, HQ, D) output (T: every query token, then
// the padded ones), NaN-poisoned before the run.
static float *run(const sseq *ss, int n, const tpr_sparse_attn *sa, const runopt *o, tpr_status *rc) {
  int MB = 1, T = o->n_pad, NB = 2;  // 2 spare blocks nobody owns
  for (int s = 0; s < n; s++) {
    const int nb = (ss[s].L + o->pbs - 1) / o->pbs;
    MB = nb > MB ? nb : MB, NB += nb, T += ss[s].L - ss[s].p0;
  }
  int *perm = malloc((size_t)NB * sizeof *perm);
  for (int i = 0; i < NB; i++) perm[i] = i;
  for (int i = NB - 1; i > 0; i--) {
    const int j = (int)tt_randint(0, i), x = perm[i];
    perm[i] = perm[j], perm[j] = x;
  }
  const size_t prow = (size_t)NB * o->pbs * ROW;
  float *kp = malloc(prow * sizeof *kp), *vp = malloc(prow * sizeof *vp);
  for (size_t i = 0; i < prow; i++) kp[i] = vp[i] = NAN;
  int32_t *bt = malloc((size_t)n * MB * sizeof *bt), *seq = malloc((size_t)(T + 1) * 4), *pos = malloc((size_t)(T + 1) * 4);
  float *q = malloc((size_t)(T + 1) * QROW * sizeof *q);
  int used = 0, t = 0;
  for (int s = 0; s < n; s++) {
    float *k = malloc((size_t)ss[s].L * ROW * sizeof *k);
    memcpy(k, ss[s].k, (size_t)ss[s].L * ROW * sizeof *k);
    if (o->rope) rope_rows(k, ss[s].L, HKV, 0);
    for (int j = 0; j < MB; j++) bt[s * MB + j] = j * o->pbs < ss[s].L ? perm[used++] : -1;
    for (int r = 0; r < ss[s].L; r++) {
      const size_t at = ((size_t)bt[s * MB + r / o->pbs] * o->pbs + r % o->pbs) * ROW;
      memcpy(kp + at, k + (size_t)r * ROW, ROW * sizeof *kp);
      memcpy(vp + at, ss[s].v + (size_t)r * ROW, ROW * sizeof *vp);
    }
    const int nq = ss[s].L - ss[s].p0;
    memcpy(q + (size_t)t * QROW, ss[s].q, (size_t)nq * QROW * sizeof *q);
    if (o->rope) rope_rows(q + (size_t)t * QROW, nq, HQ, ss[s].p0);
    for (int i = 0; i < nq; i++, t++) seq[t] = s, pos[t] = ss[s].p0 + i;
    free(k);
  }
  for (int i = 0; i < o->n_pad; i++, t++) {
    seq[t] = -1, pos[t] = 0;
    for (int e = 0; e < QROW; e++) q[(size_t)t * QROW + e] = 7.0f;
  }
  const int64_t qs[] = {T, HQ, D}, ps[] = {NB, o->pbs, HKV, D};
  tpr_tensor *tq = tt_from_host(TPR_F32, 3, qs, q), *tk = tt_from_host(TPR_F32, 4, ps, kp);
  tpr_tensor *tv = tt_from_host(TPR_F32, 4, ps, vp), *tb = i32(2, (const int64_t[]){n, MB}, bt);
  tpr_tensor *tsq = i32(1, (const int64_t[]){T}, seq), *tpo = i32(1, (const int64_t[]){T}, pos);
  tpr_tensor *out = tt_new(TPR_F32, 3, qs);
  float *od = tpr_tensor_data(out);
  for (int64_t i = 0; i < (int64_t)T * QROW; i++) od[i] = NAN;
  tpr_op_attrs at = o->op == TPR_OP_PAGED_ATTENTION ? (tpr_op_attrs){.n_f = 1, .f = {sa->scale}}
                                                     : tpr_sparse_attn_attrs(sa);
  int32_t *pl = malloc((size_t)(T + 1) * sizeof *pl);  // the prefill-length form's (T) input
  for (int i = 0; i < T; i++) pl[i] = o->prefill_len;
  tpr_tensor *tpl = i32(1, (const int64_t[]){T}, pl);
  if (o->with_pl) at.n_i = 8, at.i[7] = TPR_SPARSE_PREFILL_LEN;
  const tpr_tensor *const in[7] = {tq, tk, tv, tb, tsq, tpo, tpl};
  const int n_in = o->with_pl ? 7 : 6;
  tpr_cpu_ctx ctx = {.n_threads = o->threads};
  *rc = o->threads > 0 ? tt_cpu()->vt->kernels[o->op](&ctx, in, n_in, &at, out)
                       : tpr_op_run(tt_cpu(), o->op, in, n_in, &at, out);
  tpr_tensor_free(tpl), free(pl);
  float *h = tt_to_host(out);
  tpr_tensor_free(tq), tpr_tensor_free(tk), tpr_tensor_free(tv), tpr_tensor_free(tb), tpr_tensor_free(tsq);
  tpr_tensor_free(tpo), tpr_tensor_free(out);
  free(perm), free(kp), free(vp), free(bt), free(seq), free(pos), free(q);
  return h;
}

static float *run_ok(const sseq *ss, int n, const tpr_sparse_attn *sa, const runopt *o) {
  tpr_status rc;
  float *h = run(ss, n, sa, o, &rc);
  if (rc != TPR_OK) fail_msg("the op failed: %s", tpr_last_error());
  return h;
}

static double err_vs(const float *got, const float *want, int64_t n) {
  double *w = malloc((size_t)n * sizeof *w);
  for (int64_t i = 0; i < n; i++) w[i] = want[i];
  const double e = tt_max_rel_err(got, w, (size_t)n);
  free(w);
  return e;
}

static const runopt DEF = {.pbs = 4, .op = TPR_OP_SPARSE_ATTENTION_PAGED};

// ---------------------------------------------------------------- the PyTorch reference's fixture

typedef struct fixture {
  float *q_a, *q_b, *k_ab, *v_ab, *out_a, *out_b, *out_a_swap;
  float *q_c, *k_c, *v_c, *out_c, *q_d, *k_d, *v_d, *out_d;
} fixture;

static fixture load(void) {
  fixture f = {
      .q_a = npy("q_a", 72 * QROW), .q_b = npy("q_b", 3 * QROW), .k_ab = npy("k_ab", 75 * ROW),
      .v_ab = npy("v_ab", 75 * ROW), .out_a = npy("out_a", 72 * QROW), .out_b = npy("out_b", 3 * QROW),
      .out_a_swap = npy("out_a_swap", 72 * QROW), .q_c = npy("q_c", 64 * QROW), .k_c = npy("k_c", 64 * ROW),
      .v_c = npy("v_c", 64 * ROW), .out_c = npy("out_c", 64 * QROW), .q_d = npy("q_d", 40 * QROW),
      .k_d = npy("k_d", 40 * ROW), .v_d = npy("v_d", 40 * ROW), .out_d = npy("out_d", 40 * QROW)};
  return f;
}

static void unload(fixture *f) {
  float *all[] = {f->q_a, f->q_b, f->k_ab, f->v_ab, f->out_a, f->out_b, f->out_a_swap, f->q_c,
                  f->k_c, f->v_c, f->out_c, f->q_d, f->k_d, f->v_d, f->out_d};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

// Cases a, c, d in one batch with 3 padded tokens: each within the bound,
// the padded rows exactly 0.
static void test_reference_batch(void **state) {
  (void)state;
  fixture f = load();
  const tpr_sparse_attn sa = fix_sa();
  const sseq ss[3] = {{72, 0, f.q_a, f.k_ab, f.v_ab}, {64, 0, f.q_c, f.k_c, f.v_c}, {40, 0, f.q_d, f.k_d, f.v_d}};
  runopt o = DEF;
  o.n_pad = 3;
  for (int pbs = 4; pbs <= 16; pbs *= 4) {
    o.pbs = pbs;
    float *got = run_ok(ss, 3, &sa, &o);
    const double ea = err_vs(got, f.out_a, 72 * QROW), ec = err_vs(got + 72 * QROW, f.out_c, 64 * QROW);
    const double ed = err_vs(got + 136 * QROW, f.out_d, 40 * QROW);
    printf("  pool blocks of %2d: prefill 72 (sparse) %.2e, ties 64 %.2e, dense 40 %.2e (bound %.0e)\n", pbs, ea, ec,
           ed, REF_BOUND);
    assert_true(ea <= REF_BOUND && ec <= REF_BOUND && ed <= REF_BOUND);
    for (int e = 0; e < 3 * QROW; e++) assert_true(got[176 * QROW + e] == 0.0f);
    free(got);
  }
  unload(&f);
}

// Case b: 3 tokens after a 72-row cache, as one chunk and as 3 decode calls.
static void test_reference_chunk_and_decode(void **state) {
  (void)state;
  fixture f = load();
  const tpr_sparse_attn sa = fix_sa();
  const sseq chunk = {75, 72, f.q_b, f.k_ab, f.v_ab};
  float *got = run_ok(&chunk, 1, &sa, &DEF);
  const double e = err_vs(got, f.out_b, 3 * QROW);
  double ed = 0;
  for (int i = 0; i < 3; i++) {
    const sseq one = {73 + i, 72 + i, f.q_b + i * QROW, f.k_ab, f.v_ab};
    float *g1 = run_ok(&one, 1, &sa, &DEF);
    const double ei = err_vs(g1, f.out_b + i * QROW, QROW);
    ed = ei > ed ? ei : ed;
    assert_memory_equal(g1, got + i * QROW, QROW * sizeof *g1);  // a decode token = its row of the chunk, bit for bit
    free(g1);
  }
  printf("  chunk of 3 after 72 cached rows %.2e, as 3 decode calls %.2e (bound %.0e)\n", e, ed, REF_BOUND);
  assert_true(e <= REF_BOUND && ed <= REF_BOUND);
  free(got), unload(&f);
}

// The prefill-length form (program.h): case a's 72-token prompt in three
// calls (44, 3 and 25 tokens; the first two end below dense_len) given
// prefill_len 72 equals the one call, bit for bit, and so within the bound
// of the reference; a prefill_len of 0 is the plain form (the call decides).
// Control: the same calls in the plain form are dense in the first two and
// miss the reference. Case b's decode rows after the cache, given 72: as
// their plain one-token calls (their own length already decides).
static void test_prefill_length_form(void **state) {
  (void)state;
  fixture f = load();
  const tpr_sparse_attn sa = fix_sa();
  const sseq whole = {72, 0, f.q_a, f.k_ab, f.v_ab};
  float *one = run_ok(&whole, 1, &sa, &DEF);
  const int cut[4] = {0, 44, 47, 72};
  float *formed = malloc(72 * QROW * sizeof *formed), *plain = malloc(72 * QROW * sizeof *plain);
  float *zero = malloc(72 * QROW * sizeof *zero);
  for (int c = 0; c < 3; c++) {
    const sseq part = {cut[c + 1], cut[c], f.q_a + cut[c] * QROW, f.k_ab, f.v_ab};
    runopt o = DEF;
    o.with_pl = true, o.prefill_len = 72;
    float *g = run_ok(&part, 1, &sa, &o);
    memcpy(formed + cut[c] * QROW, g, (size_t)(cut[c + 1] - cut[c]) * QROW * sizeof *g);
    free(g);
    g = run_ok(&part, 1, &sa, &DEF);
    memcpy(plain + cut[c] * QROW, g, (size_t)(cut[c + 1] - cut[c]) * QROW * sizeof *g);
    free(g);
    o.prefill_len = 0;
    g = run_ok(&part, 1, &sa, &o);
    memcpy(zero + cut[c] * QROW, g, (size_t)(cut[c + 1] - cut[c]) * QROW * sizeof *g);
    free(g);
  }
  const double e = err_vs(formed, f.out_a, 72 * QROW), ec = err_vs(plain, f.out_a, 72 * QROW);
  printf("  72 tokens in calls of 44, 3, 25 given prefill_len 72: %.2e from the reference (bound %.0e); the plain "
         "form: %.2e\n", e, REF_BOUND, ec);
  assert_memory_equal(formed, one, 72 * QROW * sizeof *one);
  assert_memory_equal(zero, plain, 72 * QROW * sizeof *one);
  assert_true(e <= REF_BOUND && ec >= CTRL_MIN);
  for (int i = 0; i < 3; i++) {
    const sseq dec = {73 + i, 72 + i, f.q_b + i * QROW, f.k_ab, f.v_ab};
    runopt o = DEF;
    o.with_pl = true, o.prefill_len = 72;
    float *g = run_ok(&dec, 1, &sa, &o), *h = run_ok(&dec, 1, &sa, &DEF);
    assert_memory_equal(g, h, QROW * sizeof *g);
    free(g), free(h);
  }
  free(one), free(formed), free(plain), free(zero), unload(&f);
}

// Each control changes what case a's bound checks and must fail it.
static void test_negative_controls(void **state) {
  (void)state;
  fixture f = load();
  const sseq a = {72, 0, f.q_a, f.k_ab, f.v_ab};
  struct {
    const char *what;
    tpr_sparse_attn sa;
    bool rope;
  } ctl[] = {{"top-k one block too few", fix_sa(), false}, {"top-k one block too many", fix_sa(), false},
             {"local window one block short", fix_sa(), false}, {"local window one block long", fix_sa(), false},
             {"RoPE in the sparse layer", fix_sa(), true}, {"every block attended", fix_sa(), false}};
  ctl[0].sa.topk--, ctl[1].sa.topk++, ctl[2].sa.window_size -= 8, ctl[3].sa.window_size += 8;
  ctl[5].sa.dense_len = 73;
  for (size_t i = 0; i < sizeof ctl / sizeof *ctl; i++) {
    runopt o = DEF;
    o.rope = ctl[i].rope;
    float *got = run_ok(&a, 1, &ctl[i].sa, &o);
    const double e = err_vs(got, f.out_a, 72 * QROW);
    printf("  control %-30s off by %.3f (must exceed %.0e)\n", ctl[i].what, e, CTRL_MIN);
    assert_true(e > CTRL_MIN);
    free(got);
  }
  const tpr_sparse_attn sa = fix_sa();
  float *got = run_ok(&a, 1, &sa, &DEF);
  const double e = err_vs(got, f.out_a_swap, 72 * QROW);
  printf("  control %-30s off by %.3f (must exceed %.0e)\n", "one selected block swapped", e, CTRL_MIN);
  assert_true(e > CTRL_MIN);
  free(got), unload(&f);
}

// ---------------------------------------------------------------- fresh random inputs

typedef struct rseq {
  sseq s;
  float *q, *k, *v;
} rseq;

static rseq random_seq(int L, int p0) {
  rseq r = {.s = {L, p0}};
  r.q = malloc((size_t)(L - p0 + 1) * QROW * sizeof(float)), r.k = malloc((size_t)L * ROW * sizeof(float));
  r.v = malloc((size_t)L * ROW * sizeof(float));
  tt_fill_normal(r.q, (size_t)(L - p0) * QROW, 1.0), tt_fill_normal(r.k, (size_t)L * ROW, 1.0);
  tt_fill_normal(r.v, (size_t)L * ROW, 1.0);
  r.s.q = r.q, r.s.k = r.k, r.s.v = r.v;
  return r;
}

static void free_seqs(rseq *r, int n) {
  for (int i = 0; i < n; i++) free(r[i].q), free(r[i].k), free(r[i].v);
}

static int total_q(const sseq *ss, int n) {
  int T = 0;
  for (int i = 0; i < n; i++) T += ss[i].L - ss[i].p0;
  return T;
}

// Below dense_len, and sparse with every block selected (topk past the
// block count): paged_attention's result. Random lengths, prefill chunks
// and decode tokens mixed.
static void test_random_dense_equals_paged_attention(void **state) {
  (void)state;
  tpr_sparse_attn sa = {.kernel_size = 8, .kernel_stride = 4, .block_size = 16, .topk = 4, .init_blocks = 1,
                        .window_size = 32, .dense_len = 1 << 20, .scale = 0.4f};
  rseq r[MAXSEQ];
  sseq ss[MAXSEQ];
  for (int i = 0; i < MAXSEQ; i++) {
    const int L = (int)tt_randint(1, 150), kind = (int)tt_randint(0, 2);
    r[i] = random_seq(L, kind == 0 ? 0 : kind == 1 ? L - 1 : (int)tt_randint(0, L - 1));
    ss[i] = r[i].s;
  }
  const int T = total_q(ss, MAXSEQ);
  runopt o = DEF;
  float *got = run_ok(ss, MAXSEQ, &sa, &o);
  o.op = TPR_OP_PAGED_ATTENTION;
  float *want = run_ok(ss, MAXSEQ, &sa, &o);
  const double e = err_vs(got, want, (int64_t)T * QROW);
  sa.dense_len = 0, sa.topk = 1000;  // sparse, but every block selected
  float *all = run_ok(ss, MAXSEQ, &sa, &DEF);
  printf("  dense vs paged_attention %.2e; sparse selecting every block = dense: %s\n", e,
         memcmp(all, got, (size_t)T * QROW * 4) ? "no" : "bit for bit");
  assert_true(e <= REF_BOUND);
  assert_memory_equal(all, got, (size_t)T * QROW * sizeof *got);
  free(got), free(want), free(all), free_seqs(r, MAXSEQ);
}

// Sparse: the pool's block size and shuffle, the batch's other sequences and
// the thread count never change a bit; a program round trip neither.
static tpr_sparse_attn g_sa;
static tpr_status build_sparse(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_sparse_attention_paged(p, in[0], in[1], in[2], -1, in[3], in[4], in[5], -1, &g_sa, out);
}

static void test_random_invariances(void **state) {
  (void)state;
  const tpr_sparse_attn sa = {.kernel_size = 8, .kernel_stride = 4, .block_size = 16, .topk = 3, .init_blocks = 1,
                              .window_size = 32, .dense_len = 64, .scale = 0.4f};
  rseq r[MAXSEQ];
  sseq ss[MAXSEQ];
  for (int i = 0; i < MAXSEQ; i++) {
    const int L = (int)tt_randint(64, 260);  // past dense_len: 4 .. 16 blocks
    r[i] = random_seq(L, i == 0 ? 0 : i == 1 ? L - 1 : (int)tt_randint(0, L - 1));
    ss[i] = r[i].s;
  }
  const int T = total_q(ss, MAXSEQ);
  const size_t nb = (size_t)T * QROW * sizeof(float);
  float *base = run_ok(ss, MAXSEQ, &sa, &DEF);
  for (int64_t i = 0; i < (int64_t)T * QROW; i++) assert_true(isfinite(base[i]));
  runopt o = DEF;
  o.pbs = 16;
  float *b16 = run_ok(ss, MAXSEQ, &sa, &o);
  assert_memory_equal(base, b16, nb);
  for (int nt = 1; nt <= 3; nt += 2) {
    o = DEF, o.threads = nt;
    float *bt = run_ok(ss, MAXSEQ, &sa, &o);
    assert_memory_equal(base, bt, nb);
    free(bt);
  }
  for (int i = 0, t0 = 0; i < MAXSEQ; t0 += ss[i].L - ss[i].p0, i++) {
    float *alone = run_ok(&ss[i], 1, &sa, &DEF);
    assert_memory_equal(alone, base + (size_t)t0 * QROW, (size_t)(ss[i].L - ss[i].p0) * QROW * sizeof(float));
    free(alone);
  }
  // The same op as a serialized program, on sequence 0 alone in a fixed layout.
  const int L = ss[0].L, MB = L;
  float *kp = malloc((size_t)L * ROW * 4), *vp = malloc((size_t)L * ROW * 4);
  memcpy(kp, ss[0].k, (size_t)L * ROW * 4), memcpy(vp, ss[0].v, (size_t)L * ROW * 4);
  int32_t *btab = malloc((size_t)MB * 4), *seq = malloc((size_t)L * 4), *pos = malloc((size_t)L * 4);
  for (int i = 0; i < L; i++) btab[i] = L - 1 - i, seq[i] = 0, pos[i] = i;  // pool blocks of 1 row, reversed
  float *krev = malloc((size_t)L * ROW * 4), *vrev = malloc((size_t)L * ROW * 4);
  for (int i = 0; i < L; i++) {
    memcpy(krev + (size_t)(L - 1 - i) * ROW, kp + (size_t)i * ROW, ROW * 4);
    memcpy(vrev + (size_t)(L - 1 - i) * ROW, vp + (size_t)i * ROW, ROW * 4);
  }
  const int64_t qs[] = {L, HQ, D}, ps[] = {L, 1, HKV, D};
  tpr_tensor *in[6] = {tt_from_host(TPR_F32, 3, qs, ss[0].q), tt_from_host(TPR_F32, 4, ps, krev),
                       tt_from_host(TPR_F32, 4, ps, vrev), i32(2, (const int64_t[]){1, MB}, btab),
                       i32(1, (const int64_t[]){L}, seq), i32(1, (const int64_t[]){L}, pos)};
  tpr_tensor *out = tt_new(TPR_F32, 3, qs);
  const tpr_op_attrs at = tpr_sparse_attn_attrs(&sa);
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, (const tpr_tensor *const *)in, 6, &at, out));
  assert_memory_equal(tpr_tensor_data(out), base, (size_t)L * QROW * 4);  // pool blocks of 1 row: the same bits
  g_sa = sa;
  tt_check_roundtrip(build_sparse, 6, (const tpr_tensor *const *)in, out);
  printf("  %d tokens of %d sparse sequences: pool blocks 4/16/1, alone or batched, 1/3 threads, a program: same bits\n",
         T, MAXSEQ);
  for (int i = 0; i < 6; i++) tpr_tensor_free(in[i]);
  tpr_tensor_free(out);
  free(kp), free(vp), free(btab), free(seq), free(pos), free(krev), free(vrev);
  free(base), free(b16), free_seqs(r, MAXSEQ);
}

// ---------------------------------------------------------------- bad input

static void test_bad_input(void **state) {
  (void)state;
  const int64_t qs[] = {3, HQ, D}, ps[] = {4, 4, HKV, D};
  tpr_tensor *q = tt_random_f32(tt_cpu(), 3, qs, NULL), *kp = tt_random_f32(tt_cpu(), 4, ps, NULL);
  tpr_tensor *vp = tt_random_f32(tt_cpu(), 4, ps, NULL), *out = tt_new(TPR_F32, 3, qs);
  const int32_t bt_ok[4] = {0, 1, 2, 3}, seq_ok[3] = {0, 0, 0}, pos_ok[3] = {0, 1, 2};
  tpr_tensor *bt = i32(2, (const int64_t[]){1, 4}, bt_ok), *sq = i32(1, (const int64_t[]){3}, seq_ok);
  tpr_tensor *po = i32(1, (const int64_t[]){3}, pos_ok);
  const tpr_tensor *in[6] = {q, kp, vp, bt, sq, po};
  tpr_sparse_attn sa = fix_sa();
  tpr_op_attrs at = tpr_sparse_attn_attrs(&sa);
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in, 6, &at, out));
  // Attributes the rule refuses.
  const struct {
    int a;
    int64_t v;
  } bad[] = {{0, 0}, {1, 0}, {0, 5}, {2, 9}, {3, -1}, {4, -1}, {5, -1}, {6, -1}};  // kernel 5, block 9: not of stride 2
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tpr_op_attrs b = at;
    b.i[bad[i].a] = bad[i].v;
    assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in, 6, &b, out), TPR_ERR_INVALID_ARG);
  }
  tpr_op_attrs few = at;
  few.n_i = 6;
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in, 6, &few, out), TPR_ERR_INVALID_ARG);
  few = at, few.n_f = 0;
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in, 6, &few, out), TPR_ERR_INVALID_ARG);
  // Operands paged_attention's rule refuses: Hq not a multiple of Hkv, an f32 position vector.
  tpr_tensor *q3 = tt_random_f32(tt_cpu(), 3, (const int64_t[]){3, 3, D}, NULL), *o3 = tt_new(TPR_F32, 3, (const int64_t[]){3, 3, D});
  const tpr_tensor *in3[6] = {q3, kp, vp, bt, sq, po};
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in3, 6, &at, o3), TPR_ERR_SHAPE);
  tpr_tensor *pf = tt_random_f32(tt_cpu(), 1, (const int64_t[]){3}, NULL);
  const tpr_tensor *inf[6] = {q, kp, vp, bt, sq, pf};
  assert_int_not_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, inf, 6, &at, out), TPR_OK);
  // The prefill-length form: i[7] a bit set of known inputs only; prefill_len (T) i32.
  tpr_op_attrs form = at;
  form.n_i = 8, form.i[7] = TPR_SPARSE_PREFILL_LEN;
  tpr_tensor *pl_ok = i32(1, (const int64_t[]){3}, (const int32_t[]){3, 3, 3});
  tpr_tensor *pl_short = i32(1, (const int64_t[]){2}, (const int32_t[]){3, 3});
  const tpr_tensor *in_pl[7] = {q, kp, vp, bt, sq, po, pl_ok}, *in_short[7] = {q, kp, vp, bt, sq, po, pl_short};
  const tpr_tensor *in_f32[7] = {q, kp, vp, bt, sq, po, pf};
  TT_OK(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in_pl, 7, &form, out));
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in_pl, 6, &form, out), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in_pl, 7, &at, out), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in_short, 7, &form, out), TPR_ERR_SHAPE);
  assert_int_not_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in_f32, 7, &form, out), TPR_OK);
  form.i[7] = 4;  // no such optional input
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, in_pl, 7, &form, out), TPR_ERR_INVALID_ARG);
  printf("  refused: %s\n", tpr_last_error());
  tpr_tensor_free(pl_ok), tpr_tensor_free(pl_short);
  // Run-time indices: a block id past the pool, a sequence past the table, a position past it; out untouched.
  const int32_t bt_bad[4] = {0, 1, 9, 3}, seq_bad[3] = {0, 1, 0}, pos_bad[3] = {0, 1, 16};
  tpr_tensor *btb = i32(2, (const int64_t[]){1, 4}, bt_bad), *sqb = i32(1, (const int64_t[]){3}, seq_bad);
  tpr_tensor *pob = i32(1, (const int64_t[]){3}, pos_bad), *pos_far = i32(1, (const int64_t[]){3}, (const int32_t[]){0, 1, 9});
  const tpr_tensor *bads[4][6] = {{q, kp, vp, btb, sq, pos_far}, {q, kp, vp, bt, sqb, po}, {q, kp, vp, bt, sq, pob}};
  for (int i = 0; i < 3; i++) {
    float *od = tpr_tensor_data(out);
    for (int e = 0; e < 3 * QROW; e++) od[e] = 5.0f;
    assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_SPARSE_ATTENTION_PAGED, bads[i], 6, &at, out), TPR_ERR_INVALID_ARG);
    for (int e = 0; e < 3 * QROW; e++) assert_true(od[e] == 5.0f);
    printf("  refused: %s\n", tpr_last_error());
  }
  tpr_tensor *all[] = {q, kp, vp, out, bt, sq, po, q3, o3, pf, btb, sqb, pob, pos_far};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tpr_tensor_free(all[i]);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_batch),
      cmocka_unit_test(test_reference_chunk_and_decode),
      cmocka_unit_test(test_prefill_length_form),
      cmocka_unit_test(test_negative_controls),
      cmocka_unit_test(test_random_dense_equals_paged_attention),
      cmocka_unit_test(test_random_invariances),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
