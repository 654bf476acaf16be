// Automatic prefix caching in the batched engine (engine/engine.h,
// engine/scheduler.h) on transformers' MiniMax-M2 fixture, under mpirun at
// the mesh given on the command line (--tp/--dp/--ep). Every check runs the
// same workload with the cache on and off and wants the same tokens and the
// same logits (every row on_logits saw, gathered over replicas) within the
// engine's batch-invariance bound, 1e-5 of max |logit|. Not bit for bit:
// a cache hit changes a step's chunks, and the engine's rows are not
// bitwise invariant to the chunks they run in (f32 matmuls of more than
// 16 rows go to sgemm, fewer to the skinny GEMM; test_mixed_arrivals
// prints that the same run without the cache at another token budget
// differs in the last bits too):
//  - mixed arrivals of prompts sharing a prefix of k whole blocks, prefixes
//    ending mid-block, the same prompt twice, greedy and sampled;
//  - hit counts of sequential requests: the same prompt again (all whole
//    blocks but the one holding its last token), a prefix of 2 blocks then
//    other tokens, the prompt cut at a block edge (its last block is
//    recomputed for its logits), another first token (no hit);
//  - eviction in a pool of 10 blocks: a long prompt evicts the least
//    recently freed blocks (the tail of the first prompt, then the rest);
//  - preemption (a pool too small for the batch) and cancel mid-run;
//  - a negative control: keys of a block's first token alone reuse blocks
//    whose tokens differ, and the logits must change.
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
#define BS 4  // block size of every session here
#define BOUND 1e-5  // test_engine's batch-invariance bound: |a - b| <= BOUND * max|logit|

typedef struct request {
  int32_t prompt[L];
  int64_t len;
  tpr_gen_params g;
  int arrive_step;  // submitted before this step; -1: after the previous request finished (sequential)
  int cancel_step;  // cancelled before this step; -1: never
} request;

typedef struct workload {
  request q[EM_MAX_SEQS];
  int n;
} workload;

// What a run gave, on every rank.
typedef struct outcome {
  int32_t tokens[EM_MAX_SEQS][L];
  int64_t len[EM_MAX_SEQS];
  float rows[EM_MAX_SEQS][EM_MAX_GEN][V];  // every replica's rows; -inf: not sampled
  int64_t hit[EM_MAX_SEQS];                // hit tokens counted at each sequential request's submission
  int64_t queried, hits, cached_blocks, preemptions;
} outcome;

static void run_budget(tpr_session *s, const workload *w, bool cache, bool fault, int64_t budget, outcome *out) {
  static em_recorded rec;
  memset(&rec, 0, sizeof rec);
  memset(out, 0, sizeof *out);
  tpr_engine_opts eo = {.max_tokens_per_step = budget, .on_logits = em_on_logits, .ctx = &rec,
                        .no_prefix_cache = !cache, .debug_prefix_first_token = fault};
  tpr_engine *e = NULL;
  TT_OK(tpr_engine_new(s, &eo, &e));
  int next = 0;
  int64_t prev_hits = 0;
  for (int step = 0; step < 400; step++) {
    bool busy = false;
    for (int i = 0; em.R == 0 && i < next; i++) {
      tpr_sched_seq_info si;
      TT_OK(tpr_engine_result(e, i, &si));
      busy |= !si.finished;
      if (w->q[i].cancel_step == step) TT_OK(tpr_engine_cancel(e, i));
    }
    while (em.R == 0 && next < w->n &&
           (w->q[next].arrive_step == step || (w->q[next].arrive_step < 0 && !busy))) {
      int64_t id;
      TT_OK(tpr_engine_submit(e, w->q[next].prompt, w->q[next].len, &w->q[next].g, &id));
      assert_int_equal(id, next);
      busy |= w->q[next].arrive_step < 0;  // the next sequential one waits for this one
      next++;
    }
    tpr_engine_step_info info;
    TT_OK(tpr_engine_step(e, &info));
    if (em.R == 0) {  // hits of a sequential request: it is admitted in the step after its submission
      int64_t h = tpr_engine_prefix(e).hit_tokens;
      if (next > 0) out->hit[next - 1] += h - prev_hits;
      prev_hits = h;
    }
    int64_t done = em.R == 0 && next == w->n && info.idle;
    TT_OK(tpr_comm_broadcast(em.world, &done, &done, 1, TPR_I64, 0));
    if (done) break;
    assert_true(step < 399);
  }
  if (em.R == 0) {
    for (int r = 0; r < em.dp; r++) assert_int_equal(tpr_engine_blocks_in_use(e, r), 0);
    tpr_engine_prefix_stats st = tpr_engine_prefix(e);
    out->queried = st.queried_tokens, out->hits = st.hit_tokens, out->cached_blocks = st.cached_blocks;
    out->preemptions = tpr_engine_preemptions(e);
  }
  TT_OK(tpr_comm_broadcast(em.world, &out->queried, &out->queried, 4, TPR_I64, 0));
  TT_OK(tpr_comm_broadcast(em.world, out->hit, out->hit, EM_MAX_SEQS, TPR_I64, 0));
  em_share_results(e, w->n, out->tokens, out->len, NULL, NULL);
  tpr_engine_free(e);
  // Rows from every replica: the ranks of one replica hold the same row, the others -inf.
  for (int i = 0; i < EM_MAX_SEQS; i++)
    for (int g = 0; g < EM_MAX_GEN; g++)
      for (int v = 0; v < V; v++) out->rows[i][g][v] = rec.have[i][g] ? rec.rows[i][g][v] : -INFINITY;
  TT_OK(tpr_comm_all_reduce(em.world, out->rows, out->rows, sizeof out->rows / sizeof(float), TPR_F32, TPR_MAX));
}

static void run(tpr_session *s, const workload *w, bool cache, bool fault, outcome *out) {
  run_budget(s, w, cache, fault, 16, out);
}

// Sequences whose tokens differ between a and b, or whose rows differ by
// more than BOUND * max|logit| (a cancelled one is compared over the tokens
// both runs generated); *worst: the largest relative difference of rows,
// *bitwise: sequences whose rows differ in any bit.
static int differing(const workload *w, const outcome *a, const outcome *b, double *worst, int *bitwise) {
  int bad = 0;
  *worst = 0, *bitwise = 0;
  for (int i = 0; i < w->n; i++) {
    int64_t n = a->len[i] < b->len[i] ? a->len[i] : b->len[i];
    bool same = (w->q[i].cancel_step >= 0 || a->len[i] == b->len[i]) &&
                memcmp(a->tokens[i], b->tokens[i], (size_t)n * sizeof(int32_t)) == 0;
    double d = 0, m = 0;
    bool bits = true;
    for (int64_t g = 0; g < n - w->q[i].len && g < EM_MAX_GEN; g++) {
      bits &= memcmp(a->rows[i][g], b->rows[i][g], sizeof a->rows[i][g]) == 0;
      for (int v = 0; v < V; v++) {
        d = fmax(d, fabs((double)a->rows[i][g][v] - b->rows[i][g][v]));
        m = fmax(m, fabs((double)b->rows[i][g][v]));
      }
    }
    if (m > 0) *worst = fmax(*worst, d / m);
    same &= d <= BOUND * m;
    if (!same && em.R == 0)
      printf("#   seq %d differs: len %lld vs %lld, max |d logit| %.3g of %.3g\n", i, (long long)a->len[i],
             (long long)b->len[i], d, m);
    bad += !same;
    *bitwise += !bits;
  }
  return bad;
}

static void random_tokens(tpr_rng *rng, int32_t *t, int64_t n) {
  for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(tpr_rng_next(rng) % V);
}

static tpr_gen_params gen(tpr_rng *rng, int64_t max_new, bool sampled) {
  return (tpr_gen_params){.max_new = max_new, .stop_token = -1,
                          .sampling = {.temperature = sampled ? 0.9 : 0, .top_k = sampled ? 40 : 0, .top_p = 1,
                                       .seed = tpr_rng_next(rng)}};
}

// Request i: prefix[0, keep) then random tokens up to len.
static void shared_prompt(workload *w, int i, tpr_rng *rng, const int32_t *prefix, int64_t keep, int64_t len) {
  request *q = &w->q[i];
  memcpy(q->prompt, prefix, (size_t)keep * sizeof *prefix);
  random_tokens(rng, q->prompt + keep, len - keep);
  q->len = len;
  q->cancel_step = -1;
}

static void expect_same(const workload *w, const outcome *on, const outcome *off, const char *what) {
  double worst;
  int bitwise, bad = differing(w, on, off, &worst, &bitwise);
  if (em.R == 0)
    printf("# %s: %d sequences, cache hit %lld of %lld tokens, %lld blocks cached, %lld/%lld preemptions (on/off); "
           "tokens equal, logits within %.3g of max|logit| (bound %g; %d not bitwise equal); %d differ\n", what,
           w->n, (long long)on->hits, (long long)on->queried, (long long)on->cached_blocks, (long long)on->preemptions,
           (long long)off->preemptions, worst, BOUND, bitwise, bad);
  assert_int_equal(bad, 0);
  assert_int_equal(off->queried, 0);
  assert_int_equal(off->hits, 0);
}

static void test_mixed_arrivals(void **state) {
  (void)state;
  tpr_session *s = em_open_session(8, BS, 0);
  static workload w;
  static outcome on, off;
  tpr_rng rng = {em_shared_seed()};
  int32_t sys[L];
  random_tokens(&rng, sys, L);
  memset(&w, 0, sizeof w);
  w.n = 10;
  for (int i = 0; i < w.n; i++) {
    int64_t keep = 1 + (int64_t)(tpr_rng_next(&rng) % 14);  // k whole blocks, or mid-block
    shared_prompt(&w, i, &rng, sys, keep, keep + 1 + (int64_t)(tpr_rng_next(&rng) % 8));
    w.q[i].g = gen(&rng, 2 + (int64_t)(tpr_rng_next(&rng) % 6), i % 2);
    w.q[i].arrive_step = i == 0 ? 0 : w.q[i - 1].arrive_step + (int)(tpr_rng_next(&rng) % 3);
  }
  w.q[4] = w.q[1], w.q[4].g.sampling.seed ^= 1;  // the same prompt twice, after it
  w.q[4].arrive_step = w.q[3].arrive_step;
  run(s, &w, true, false, &on);
  run(s, &w, false, false, &off);
  expect_same(&w, &on, &off, "mixed arrivals sharing a prefix");
  assert_true(on.hits > 0);
  // The engine's own bitwise variance, without the cache: another budget.
  static outcome other;
  run_budget(s, &w, false, false, 5, &other);
  double worst;
  int bitwise, bad = differing(&w, &other, &off, &worst, &bitwise);
  if (em.R == 0)
    printf("# without the cache, budget 5 vs 16 tokens/step: %d sequences not bitwise equal, worst %.3g\n", bitwise,
           worst);
  assert_int_equal(bad, 0);
  tpr_session_close(s);
}

static void test_hit_counts(void **state) {
  (void)state;
  tpr_session *s = em_open_session(4, BS, 0);
  static workload w;
  static outcome on, off;
  tpr_rng rng = {em_shared_seed()};
  int32_t a[L];
  random_tokens(&rng, a, L);
  memset(&w, 0, sizeof w);
  w.n = 5;
  shared_prompt(&w, 0, &rng, a, 13, 13);  // 3 whole blocks and one token
  shared_prompt(&w, 1, &rng, a, 13, 13);  // again: blocks 0-2 hit, the last token computed
  shared_prompt(&w, 2, &rng, a, 9, 15);   // 2 whole blocks and one token of a, then others
  shared_prompt(&w, 3, &rng, a, 12, 12);  // cut at a block edge: block 2 holds its last token, recomputed
  shared_prompt(&w, 4, &rng, a, 13, 13);
  w.q[4].prompt[0] ^= 1;                  // another first token: nothing matches
  const int64_t want[5] = {0, 12, 8, 8, 0};
  for (int i = 0; i < w.n; i++) w.q[i].g = gen(&rng, 3, i % 2), w.q[i].arrive_step = -1;
  run(s, &w, true, false, &on);
  run(s, &w, false, false, &off);
  expect_same(&w, &on, &off, "sequential requests");
  for (int i = 0; i < w.n; i++) {
    if (em.R == 0) printf("#   request %d: %lld hit tokens (want %lld)\n", i, (long long)on.hit[i], (long long)want[i]);
    assert_int_equal(on.hit[i], want[i]);
  }
  assert_int_equal(on.queried, 13 + 13 + 15 + 12 + 13);
  assert_true(on.cached_blocks >= 3 + 2 + 1);  // a's 3 (and 4 with generated rows), 2's own, 4's
  tpr_session_close(s);
}

static void test_eviction(void **state) {
  (void)state;
  tpr_session *s = em_open_session(4, BS, (int64_t)(10 * em_block_bytes()));
  assert_int_equal(tpr_session_pool_info(s).blocks, 10);
  static workload w;
  static outcome on, off;
  tpr_rng rng = {em_shared_seed()};
  int32_t a[L];
  random_tokens(&rng, a, L);
  memset(&w, 0, sizeof w);
  w.n = 4;
  // a: 13 + 4 generated = 16 rows, 4 blocks cached once it ends. b: 28 + 4
  // (31 rows, 8 blocks) takes the 6 never used and evicts a's last two (a
  // frees its table last to first: its tail is least recent). Then a hits
  // its first 2 blocks; then a's first 16 tokens and others find those 2
  // and the third, which a wrote again (a's fourth block held generated
  // tokens).
  shared_prompt(&w, 0, &rng, a, 13, 13);
  shared_prompt(&w, 1, &rng, a, 0, 28);
  shared_prompt(&w, 2, &rng, a, 13, 13);
  shared_prompt(&w, 3, &rng, a, 16, 20);
  const int64_t want[4] = {0, 0, 8, 12};
  for (int i = 0; i < w.n; i++) w.q[i].g = gen(&rng, 4, i % 2), w.q[i].arrive_step = -1;
  w.q[1].prompt[0] = a[0] ^ 1;  // b shares nothing with a
  run(s, &w, true, false, &on);
  run(s, &w, false, false, &off);
  expect_same(&w, &on, &off, "eviction in a pool of 10 blocks");
  for (int i = 0; i < w.n; i++) {
    if (em.R == 0) printf("#   request %d: %lld hit tokens (want %lld)\n", i, (long long)on.hit[i], (long long)want[i]);
    assert_int_equal(on.hit[i], want[i]);
  }
  assert_true(on.cached_blocks <= 10);
  tpr_session_close(s);
}

static void test_preemption_and_cancel(void **state) {
  (void)state;
  // 10 blocks of 4 rows for 6 sequences of 14..19 prompt tokens + 6: preemptions.
  tpr_session *s = em_open_session(4, BS, (int64_t)(10 * em_block_bytes()));
  static workload w;
  static outcome on, off;
  tpr_rng rng = {em_shared_seed()};
  int32_t sys[L];
  random_tokens(&rng, sys, L);
  memset(&w, 0, sizeof w);
  w.n = 6;
  for (int i = 0; i < w.n; i++) {
    shared_prompt(&w, i, &rng, sys, 6 + 2 * i, 14 + i);
    w.q[i].g = gen(&rng, 6, i % 2);
    w.q[i].arrive_step = i / 2;
  }
  w.q[3].cancel_step = 5;
  run(s, &w, true, false, &on);
  run(s, &w, false, false, &off);
  expect_same(&w, &on, &off, "a pool of 10 blocks, one cancel");
  assert_true(on.preemptions > 0 && off.preemptions > 0);
  assert_true(on.hits > 0);
  tpr_session_close(s);
}

static void test_wrong_key_caught(void **state) {
  (void)state;
  tpr_session *s = em_open_session(4, BS, 0);
  static workload w;
  static outcome on, off;
  tpr_rng rng = {em_shared_seed()};
  int32_t a[L];
  random_tokens(&rng, a, L);
  memset(&w, 0, sizeof w);
  w.n = 2;
  shared_prompt(&w, 0, &rng, a, 10, 10);
  shared_prompt(&w, 1, &rng, a, 1, 10);  // the same first tokens of blocks 0 and 1, others between:
  w.q[1].prompt[4] = a[4];                // no block in common
  for (int i = 0; i < w.n; i++) w.q[i].g = gen(&rng, 3, false), w.q[i].arrive_step = -1;
  run(s, &w, true, true, &on);
  run(s, &w, false, false, &off);
  double worst;
  int bitwise, bad = differing(&w, &on, &off, &worst, &bitwise);
  if (em.R == 0)
    printf("# negative control (keys of a block's first token alone): %lld hit tokens, %d of 2 sequences differ "
           "(by %.3g of max|logit|)\n", (long long)on.hits, bad, worst);
  assert_int_equal(on.hits, 8);
  assert_int_equal(bad, 1);
  tpr_session_close(s);
}

int main(int argc, char **argv) {
  em_init(&argc, &argv);
  if (em.R == 0) tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mixed_arrivals), cmocka_unit_test(test_hit_counts),
      cmocka_unit_test(test_eviction),       cmocka_unit_test(test_preemption_and_cancel),
      cmocka_unit_test(test_wrong_key_caught),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(em.world, failed);
}
