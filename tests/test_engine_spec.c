// Speculative decoding in the batched engine (engine/engine.h,
// engine/speculative.h) on transformers' MiniMax-M2 fixture, under mpirun at
// the mesh given on the command line (--tp/--dp/--ep):
//  - greedy: every sequence's tokens equal the same workload without
//    speculation, token for token, and every row on_logits saw (gathered
//    over replicas) within the engine's batch-invariance bound, for
//    lookup:n:k drafters of several n and k, with staggered arrivals, a
//    pool small enough to preempt, and a cancel mid-run; drafts were
//    verified and some accepted (else the check would be empty);
//  - after every step, the blocks in use are at most the non-speculative
//    count (each running sequence's ceil((len - 1) / block_size)): rejected
//    drafts' blocks went back to the pool;
//  - sampled (temperature, top-k): the first verified token's distribution,
//    over many seeds, passes a chi-square test against the target's own
//    distribution (from the row on_logits saw);
//  - negative controls: accepting every draft unverified changes the
//    tokens; keeping rejected drafts' blocks breaks the block count; and
//    accepting every draft fails the chi-square test.
// The seed is fresh each run (printed; TPR_TEST_SEED reproduces it).
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine_fixture.h"
#include "m2_ref.h"
#include "mpi_util.h"

#define V M2_V
#define L EM_MAX_SEQ
#define BS 4
#define BOUND 1e-5  // test_engine's batch-invariance bound: |a - b| <= BOUND * max|logit|

typedef struct request {
  int32_t prompt[L];
  int64_t len;
  tpr_gen_params g;
  int arrive_step;  // submitted before this step
  int cancel_step;  // cancelled before this step; -1: never
} request;

typedef struct workload {
  request q[EM_MAX_SEQS];
  int n;
} workload;

typedef struct controls {
  bool accept_all, keep_blocks;
} controls;

typedef struct outcome {
  int32_t tokens[EM_MAX_SEQS][L];
  int64_t len[EM_MAX_SEQS];
  float rows[EM_MAX_SEQS][EM_MAX_GEN][V];  // every replica's rows; -inf: not sampled
  int64_t drafted, accepted, verifications, preemptions;
  int64_t excess_blocks;  // the most blocks in use past the non-speculative count, over every step
} outcome;

// Blocks a non-speculative run holds for rank 0's unfinished sequences.
static int64_t plain_blocks(const tpr_engine *e, int n, int replica) {
  int64_t b = 0;
  for (int i = 0; i < n; i++) {
    tpr_sched_seq_info si;
    TT_OK(tpr_engine_result(e, i, &si));
    if (!si.finished && si.replica == replica) b += (si.len - 1 + BS - 1) / BS;
  }
  return b;
}

static void run(tpr_session *s, const workload *w, const tpr_spec *spec, controls c, outcome *out) {
  static em_recorded rec;
  memset(&rec, 0, sizeof rec);
  memset(out, 0, sizeof *out);
  tpr_engine_opts eo = {.max_tokens_per_step = 16, .on_logits = em_on_logits, .ctx = &rec,
                        .max_draft = spec ? spec->k : 0,
                        .draft_layers = spec && spec->kind == TPR_SPEC_SELF ? spec->n : 0,
                        .debug_accept_all_drafts = c.accept_all,
                        .debug_keep_rejected_blocks = c.keep_blocks};
  tpr_engine *e = NULL;
  TT_OK(tpr_engine_new(s, &eo, &e));
  int next = 0;
  for (int step = 0; step < 400; step++) {
    for (int i = 0; em.R == 0 && i < next; i++)
      if (w->q[i].cancel_step == step) TT_OK(tpr_engine_cancel(e, i));
    while (em.R == 0 && next < w->n && w->q[next].arrive_step <= step) {
      tpr_gen_params g = w->q[next].g;
      if (spec) g.spec = *spec;
      int64_t id;
      TT_OK(tpr_engine_submit(e, w->q[next].prompt, w->q[next].len, &g, &id));
      assert_int_equal(id, next);
      next++;
    }
    tpr_engine_step_info info;
    TT_OK(tpr_engine_step(e, &info));
    for (int r = 0; em.R == 0 && r < em.dp; r++) {
      int64_t excess = tpr_engine_blocks_in_use(e, r) - plain_blocks(e, next, r);
      if (excess > out->excess_blocks) out->excess_blocks = excess;
    }
    int64_t done = em.R == 0 && next == w->n && info.idle;
    TT_OK(tpr_comm_broadcast(em.world, &done, &done, 1, TPR_I64, 0));
    if (done) break;
    assert_true(step < 399);
  }
  if (em.R == 0) {
    for (int r = 0; r < em.dp; r++) assert_int_equal(tpr_engine_blocks_in_use(e, r), 0);
    tpr_sched_spec_stats st = tpr_engine_spec(e);
    out->drafted = st.drafted, out->accepted = st.accepted, out->verifications = st.verifications;
    out->preemptions = tpr_engine_preemptions(e);
  }
  TT_OK(tpr_comm_broadcast(em.world, &out->drafted, &out->drafted, 5, TPR_I64, 0));
  em_share_results(e, w->n, out->tokens, out->len, NULL, NULL);
  tpr_engine_free(e);
  for (int i = 0; i < EM_MAX_SEQS; i++)
    for (int g = 0; g < EM_MAX_GEN; g++)
      for (int v = 0; v < V; v++) out->rows[i][g][v] = rec.have[i][g] ? rec.rows[i][g][v] : -INFINITY;
  TT_OK(tpr_comm_all_reduce(em.world, out->rows, out->rows, sizeof out->rows / sizeof(float), TPR_F32, TPR_MAX));
}

// Sequences whose tokens differ between a and b, or whose rows differ by
// more than BOUND * max|logit| (a cancelled one over the tokens both have).
static int differing(const workload *w, const outcome *a, const outcome *b, double *worst) {
  int bad = 0;
  *worst = 0;
  for (int i = 0; i < w->n; i++) {
    int64_t n = a->len[i] < b->len[i] ? a->len[i] : b->len[i];
    bool same = (w->q[i].cancel_step >= 0 || a->len[i] == b->len[i]) &&
                memcmp(a->tokens[i], b->tokens[i], (size_t)n * sizeof(int32_t)) == 0;
    double d = 0, m = 0;
    for (int64_t g = 0; same && g < n - w->q[i].len && g < EM_MAX_GEN; g++)
      for (int v = 0; v < V; v++) {
        d = fmax(d, fabs((double)a->rows[i][g][v] - b->rows[i][g][v]));
        m = fmax(m, fabs((double)b->rows[i][g][v]));
      }
    if (m > 0) *worst = fmax(*worst, d / m);
    same &= d <= BOUND * m;
    bad += !same;
  }
  return bad;
}

static void random_tokens(tpr_rng *rng, int32_t *t, int64_t n) {
  for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(tpr_rng_next(rng) % V);
}

// Prompts that repeat themselves (a span of 2..4 tokens 2..3 times, then a
// few random tokens), so prompt lookup finds matches; greedy unless sampled.
static void make_workload(workload *w, tpr_rng *rng, int n, int64_t max_new, bool sampled) {
  memset(w, 0, sizeof *w);
  w->n = n;
  for (int i = 0; i < n; i++) {
    request *q = &w->q[i];
    int64_t span = 2 + (int64_t)(tpr_rng_next(rng) % 3), reps = 2 + (int64_t)(tpr_rng_next(rng) % 2);
    random_tokens(rng, q->prompt, span);
    for (int64_t r = 1; r < reps; r++) memcpy(q->prompt + r * span, q->prompt, (size_t)span * sizeof(int32_t));
    q->len = span * reps + (int64_t)(tpr_rng_next(rng) % 3);
    random_tokens(rng, q->prompt + span * reps, q->len - span * reps);
    q->g = (tpr_gen_params){.max_new = max_new - (int64_t)(tpr_rng_next(rng) % 4), .stop_token = -1,
                            .sampling = {.temperature = sampled ? 0.9 : 0, .top_k = sampled ? 40 : 0, .top_p = 1,
                                         .seed = tpr_rng_next(rng)}};
    q->arrive_step = i == 0 ? 0 : w->q[i - 1].arrive_step + (int)(tpr_rng_next(rng) % 3);
    q->cancel_step = -1;
  }
}

static void expect_same(const workload *w, const outcome *spec, const outcome *plain, const char *what) {
  double worst;
  int bad = differing(w, spec, plain, &worst);
  if (em.R == 0)
    printf("# %s: %d sequences, %lld drafts in %lld verifications, %lld accepted (%.0f%%), %lld/%lld preemptions "
           "(spec/plain), blocks past the plain count %lld; tokens equal, rows within %.3g of max|logit| (bound %g); "
           "%d differ\n",
           what, w->n, (long long)spec->drafted, (long long)spec->verifications, (long long)spec->accepted,
           spec->drafted ? 100.0 * (double)spec->accepted / (double)spec->drafted : 0.0, (long long)spec->preemptions,
           (long long)plain->preemptions, (long long)spec->excess_blocks, worst, BOUND, bad);
  assert_int_equal(bad, 0);
  assert_true(spec->verifications > 0 && spec->accepted > 0);
  assert_true(spec->excess_blocks <= 0);
  assert_int_equal(plain->drafted, 0);
}

static void test_greedy_equal(void **state) {
  (void)state;
  tpr_session *s = em_open_session(8, BS, 0);
  static workload w;
  static outcome plain, spec;
  tpr_rng rng = {em_shared_seed()};
  make_workload(&w, &rng, 10, 16, false);
  run(s, &w, NULL, (controls){0}, &plain);
  const tpr_spec drafters[] = {{TPR_SPEC_LOOKUP, 3, 4}, {TPR_SPEC_LOOKUP, 1, 2}, {TPR_SPEC_LOOKUP, 2, 7},
                               {TPR_SPEC_SELF, 1, 3}, {TPR_SPEC_SELF, 1, 1}};
  for (size_t d = 0; d < sizeof drafters / sizeof *drafters; d++) {
    char what[64], name[24];
    snprintf(what, sizeof what, "greedy, %s", tpr_spec_format(&drafters[d], name, sizeof name));
    run(s, &w, &drafters[d], (controls){0}, &spec);
    expect_same(&w, &spec, &plain, what);
  }
  tpr_session_close(s);
}

// A pool of 12 blocks of 4 for 8 sequences of up to 24 tokens: decodes
// preempt; a cancel in the middle of the run.
static void test_preemption_and_cancel(void **state) {
  (void)state;
  tpr_session *s = em_open_session(8, BS, 12 * em_block_bytes());
  static workload w;
  static outcome plain, spec;
  tpr_rng rng = {em_shared_seed()};
  make_workload(&w, &rng, 8, 14, false);
  for (int i = 0; i < w.n; i++) w.q[i].arrive_step = 0;
  w.q[3].cancel_step = 5;
  const tpr_spec d[] = {{TPR_SPEC_LOOKUP, 2, 4}, {TPR_SPEC_SELF, 1, 2}};
  run(s, &w, NULL, (controls){0}, &plain);
  for (int i = 0; i < 2; i++) {
    char what[96], name[24];
    snprintf(what, sizeof what, "greedy under preemption and a cancel, %s", tpr_spec_format(&d[i], name, sizeof name));
    run(s, &w, &d[i], (controls){0}, &spec);
    expect_same(&w, &spec, &plain, what);
  }
  assert_true(plain.preemptions > 0);
  tpr_session_close(s);
}

static void test_negative_controls(void **state) {
  (void)state;
  tpr_session *s = em_open_session(8, BS, 0);
  static workload w;
  static outcome plain, bad;
  tpr_rng rng = {em_shared_seed()};
  make_workload(&w, &rng, 8, 16, false);
  const tpr_spec d = {TPR_SPEC_LOOKUP, 2, 6};
  run(s, &w, NULL, (controls){0}, &plain);
  run(s, &w, &d, (controls){.accept_all = true}, &bad);
  double worst;
  int differ = differing(&w, &bad, &plain, &worst);
  run(s, &w, &d, (controls){.keep_blocks = true}, &bad);
  if (em.R == 0)
    printf("# negative controls: accepting every draft changes %d of %d sequences; keeping rejected drafts' blocks "
           "holds up to %lld blocks past the plain count\n",
           differ, w.n, (long long)bad.excess_blocks);
  assert_true(differ > 0);
  assert_true(bad.excess_blocks > 0);
  tpr_session_close(s);
}

// Sampled: many sequences of one prompt P, each with its own seed,
// max_new 3 at temperature 1 and top-k 8. Gen 0 is sampled from the
// prefill; gen 1 is a verification of one draft from an external drafter
// that, after gen-0 token c, proposes a token of the target's own ranking
// (the most likely, the second, or one outside the top 8 that can never be
// accepted: each path of the rule). Given c, gen 1 must have the target's
// distribution p(. | P c), taken from a forward pass of P c before the
// engine starts. One chi-square test over every c drawn often enough.
#define CANDIDATES 8  // top-k
typedef struct draft_table {
  int32_t draft_of[V];  // after gen-0 token c: the draft
} draft_table;

static int64_t table_draft(void *ctx, int64_t seq, const int32_t *tokens, int64_t len, int64_t k, int32_t *draft) {
  (void)seq, (void)k;
  draft[0] = ((const draft_table *)ctx)->draft_of[tokens[len - 1]];
  return 1;
}

// Ids of row by descending logit (ties: lower id first).
static void ranking(const float *row, int32_t *ids) {
  for (int v = 0; v < V; v++) ids[v] = v;
  for (int i = 1; i < V; i++)
    for (int j = i; j > 0 && (row[ids[j]] > row[ids[j - 1]] || (row[ids[j]] == row[ids[j - 1]] && ids[j] < ids[j - 1]));
         j--) {
      int32_t t = ids[j];
      ids[j] = ids[j - 1], ids[j - 1] = t;
    }
}

// The chi-square critical value at a one-sided p of 1e-4 (Wilson-Hilferty).
static double chi2_critical(double df) {
  const double z = 3.719, a = 2.0 / (9.0 * df);
  return df * pow(1 - a + z * sqrt(a), 3);
}

typedef struct group {
  int32_t c;                  // gen-0 token
  int32_t ids[CANDIDATES];    // the target's top 8 after P c
  double p[CANDIDATES];       // their probabilities at temperature 1
  int64_t count[V];           // gen-1 tokens drawn after c
  int64_t n, accepted;
} group;

// Chi-square of every group with >= 200 draws (bins of expected count < 5
// pooled); *bad: draws of a token outside the top 8. Returns stat / critical.
static double chi_square(const group *gs, int n_groups, int64_t *bad, double *df_out, int64_t *draws) {
  double stat = 0, df = 0;
  *bad = 0, *draws = 0;
  for (int gi = 0; gi < n_groups; gi++) {
    const group *g = &gs[gi];
    int64_t inside = 0;
    for (int j = 0; j < CANDIDATES; j++) inside += g->count[g->ids[j]];
    *bad += g->n - inside;
    if (g->n < 200) continue;
    *draws += g->n;
    double pooled_o = 0, pooled_e = 0;
    int bins = 0;
    for (int j = 0; j < CANDIDATES; j++) {
      double e = (double)g->n * g->p[j], o = (double)g->count[g->ids[j]];
      if (e < 5) {
        pooled_o += o, pooled_e += e;
        continue;
      }
      stat += (o - e) * (o - e) / e, bins++;
    }
    if (pooled_e > 0) stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, bins++;
    df += bins - 1;
  }
  *df_out = df;
  return df > 0 ? stat / chi2_critical(df) : 0;
}

static void sampled_run(tpr_session *s, const int32_t *prompt, int64_t len, const draft_table *t, bool accept_all,
                        int64_t sequences, group *gs, int n_groups) {
  tpr_engine_opts eo = {.max_tokens_per_step = 512, .max_draft = 1, .draft = table_draft, .draft_ctx = (void *)t,
                        .debug_accept_all_drafts = accept_all};
  tpr_engine *e = NULL;
  TT_OK(tpr_engine_new(s, &eo, &e));
  tpr_rng seeds = {em_shared_seed()};
  for (int64_t done = 0; done < sequences;) {
    int64_t batch = sequences - done < 16 ? sequences - done : 16, first = -1;
    for (int64_t i = 0; em.R == 0 && i < batch; i++) {
      tpr_gen_params g = {.max_new = 3, .stop_token = -1, .spec = {TPR_SPEC_EXTERNAL, 0, 1},
                          .sampling = {.temperature = 1, .top_k = CANDIDATES, .top_p = 1, .seed = tpr_rng_next(&seeds)}};
      int64_t id;
      TT_OK(tpr_engine_submit(e, prompt, len, &g, &id));
      if (i == 0) first = id;
    }
    for (;;) {
      tpr_engine_step_info info;
      TT_OK(tpr_engine_step(e, &info));
      int64_t idle = info.idle;
      TT_OK(tpr_comm_broadcast(em.world, &idle, &idle, 1, TPR_I64, 0));
      if (idle) break;
    }
    for (int64_t i = 0; em.R == 0 && i < batch; i++) {
      tpr_sched_seq_info si;
      TT_OK(tpr_engine_result(e, first + i, &si));
      assert_int_equal(si.len, len + 3);
      for (int gi = 0; gi < n_groups; gi++)
        if (gs[gi].c == si.tokens[len]) {
          gs[gi].count[si.tokens[len + 1]]++, gs[gi].n++;
          gs[gi].accepted += si.tokens[len + 1] == t->draft_of[gs[gi].c];
        }
      TT_OK(tpr_engine_release(e, first + i));
    }
    done += batch;
  }
  if (em.R == 0) {
    tpr_sched_spec_stats st = tpr_engine_spec(e);
    assert_true(st.verifications >= sequences);  // every sequence's gen 1 was a verification
  }
  tpr_engine_free(e);
}

static void test_sampling_distribution(void **state) {
  (void)state;
  tpr_session *s = em_open_session(16, BS, 0);
  tpr_rng rng = {em_shared_seed()};
  int32_t prompt[L];
  const int64_t len = 12;
  random_tokens(&rng, prompt, len);
  static float rows[L * V];
  static group gs[CANDIDATES];
  static draft_table t;
  memset(gs, 0, sizeof gs);
  // The target's rows: after P (gen 0's candidates), then after P c for each c.
  TT_OK(tpr_session_forward(s, prompt, len, 0, rows));
  int32_t top0[V], ids[V];
  ranking(rows + (len - 1) * V, top0);
  for (int gi = 0; gi < CANDIDATES; gi++) {
    group *g = &gs[gi];
    g->c = top0[gi];
    prompt[len] = g->c;
    TT_OK(tpr_session_forward(s, prompt, len + 1, 0, rows));
    const float *row = rows + len * V;
    ranking(row, ids);
    double z = 0;
    for (int j = 0; j < CANDIDATES; j++) z += g->p[j] = exp((double)row[ids[j]] - row[ids[0]]);
    for (int j = 0; j < CANDIDATES; j++) g->ids[j] = ids[j], g->p[j] /= z;
    t.draft_of[g->c] = ids[gi % 3 == 2 ? CANDIDATES + 2 : gi % 3];  // the first, the second, or never accepted
  }
  const int64_t sequences = em.tp * em.dp > 1 ? 4000 : 24000;  // fewer where each step costs collectives
  sampled_run(s, prompt, len, &t, false, sequences, gs, CANDIDATES);
  int64_t bad, draws, accepted = 0, rejected = 0;
  double df, ratio = chi_square(gs, CANDIDATES, &bad, &df, &draws);
  for (int gi = 0; gi < CANDIDATES; gi++) accepted += gs[gi].accepted, rejected += gs[gi].n - gs[gi].accepted;
  group controls[CANDIDATES];
  memcpy(controls, gs, sizeof controls);
  for (int gi = 0; gi < CANDIDATES; gi++) memset(controls[gi].count, 0, sizeof controls[gi].count), controls[gi].n = 0;
  sampled_run(s, prompt, len, &t, true, sequences / 4, controls, CANDIDATES);
  int64_t bad_c, draws_c;
  double df_c, ratio_c = chi_square(controls, CANDIDATES, &bad_c, &df_c, &draws_c);
  if (em.R == 0) {
    printf("# sampled (temperature 1, top-k 8): %lld gen-1 draws after %d gen-0 tokens tested, %lld drafts accepted, "
           "%lld rejected; chi-square %.3g of its p = 1e-4 critical value (df %.0f), %lld draws outside the top 8\n",
           (long long)draws, CANDIDATES, (long long)accepted, (long long)rejected, ratio, df, (long long)bad);
    printf("# negative control, every draft accepted: chi-square %.3g of critical (df %.0f, %lld draws), %lld "
           "outside the top 8\n", ratio_c, df_c, (long long)draws_c, (long long)bad_c);
  }
  if (em.R == 0) {
    assert_true(draws >= (em.tp * em.dp > 1 ? 2000 : 20000));
    assert_true(accepted > 0 && rejected > 0);
    assert_int_equal(bad, 0);
    assert_true(ratio < 1);
    assert_true(ratio_c > 1 || bad_c > 0);
  }
  tpr_session_close(s);
}

int main(int argc, char **argv) {
  em_init(&argc, &argv);
  if (em.R == 0) tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy_equal),
      cmocka_unit_test(test_preemption_and_cancel),
      cmocka_unit_test(test_negative_controls),
      cmocka_unit_test(test_sampling_distribution),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(em.world, failed);
}
