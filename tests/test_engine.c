// The batched engine (engine/engine.h) on the transformers fixture, under
// mpirun at the mesh given on the command line (--tp/--dp/--ep):
//  - batch invariance: every sequence's logits in a mixed batch (random
//    lengths, random arrival steps, chunked prefills under a random token
//    budget, greedy and sampled sequences) equal the same sequence run alone
//    (tpr_session_forward over its final tokens) within 1e-5 of max |logit|;
//    greedy tokens are the argmax of the alone logits; prompt a generates
//    transformers' greedy tokens;
//  - a negative control: tokens reading the next sequence's block table
//    must break the bound;
//  - preemption: a pool too small for the batch preempts and recomputes,
//    with the same logits; blocks in use return to zero;
//  - a pool too small for one sequence, and bad prompts, are refused.
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
#define MAX_SEQS 12
typedef em_recorded recorded;
#define MAX_SEQ_LEN EM_MAX_SEQ
#define BOUND 1e-5

static tpr_comm_t world;
static int R;
static int tp, dp, ep;
static m2_ref ref;

typedef struct workload {
  int n;
  int32_t prompt[MAX_SEQS][MAX_SEQ_LEN];
  int64_t len[MAX_SEQS];
  tpr_gen_params g[MAX_SEQS];
  int arrive_step[MAX_SEQS];  // submitted before this step
} workload;

// Random prompts (the same on every rank: one seed); sequence 0 is prompt a
// with transformers' greedy length.
static void make_workload(workload *w, int n, uint64_t seed) {
  tpr_rng rng = {seed};
  memset(w, 0, sizeof *w);
  w->n = n;
  for (int i = 0; i < n; i++) {
    tpr_gen_params *g = &w->g[i];
    g->stop_token = -1;
    g->sampling = (tpr_sampling){.temperature = 0, .top_p = 1, .seed = tpr_rng_next(&rng)};
    if (i == 0) {
      memcpy(w->prompt[0], ref.a, sizeof ref.a);
      w->len[0] = M2_TA;
      g->max_new = M2_NG;
      continue;
    }
    w->len[i] = 1 + (int64_t)(tpr_rng_next(&rng) % 16);
    g->max_new = 1 + (int64_t)(tpr_rng_next(&rng) % 6);
    for (int64_t t = 0; t < w->len[i]; t++) w->prompt[i][t] = (int32_t)(tpr_rng_next(&rng) % V);
    if (i % 2) g->sampling.temperature = 0.8, g->sampling.top_k = 20;
    // Arrivals in id order (ids follow submission), spread over the first steps.
    w->arrive_step[i] = w->arrive_step[i - 1] + (int)(tpr_rng_next(&rng) % 2);
  }
}

// Runs the workload through an engine; every rank gets the final token
// lists back (rank 0's scheduler has them) in tokens/len.
static void run_engine(tpr_session *s, const workload *w, int64_t budget, bool wrong_blocks, recorded *rec,
                       int32_t tokens[MAX_SEQS][MAX_SEQ_LEN], int64_t *len, int64_t *preempted) {
  tpr_engine_opts eo = {.max_tokens_per_step = budget, .on_logits = em_on_logits, .ctx = rec,
                        .debug_wrong_blocks = wrong_blocks};
  tpr_engine *e = NULL;
  TT_OK(tpr_engine_new(s, &eo, &e));
  int submitted = 0, finished = 0;
  for (int step = 0;; step++) {
    for (int i = 0; R == 0 && i < w->n; i++)
      if (w->arrive_step[i] == step) {
        int64_t id;
        TT_OK(tpr_engine_submit(e, w->prompt[i], w->len[i], &w->g[i], &id));
        assert_int_equal(id, i);
        submitted++;
      }
    tpr_engine_step_info info;
    TT_OK(tpr_engine_step(e, &info));
    finished += (int)info.n_finished;  // rank 0 hears of each sequence once, as it ends
    if (info.idle && step >= 6) break;
  }
  int64_t pre = 0;
  if (R == 0) {
    assert_int_equal(submitted, w->n);
    assert_int_equal(finished, w->n);
    for (int r = 0; r < dp; r++) assert_int_equal(tpr_engine_blocks_in_use(e, r), 0);
    pre = tpr_engine_preemptions(e);
  }
  TT_OK(tpr_comm_broadcast(world, &pre, &pre, 1, TPR_I64, 0));
  *preempted = pre;
  em_share_results(e, w->n, tokens, len, NULL, NULL);
  tpr_engine_free(e);
}

static int64_t argmax(const float *x) {
  int64_t b = 0;
  for (int64_t v = 1; v < V; v++)
    if (x[v] > x[b]) b = v;
  return b;
}

// Each sequence alone (a full forward over its final tokens) against what
// the engine saw; returns the largest error over the sequences this rank's
// replica ran, max-reduced over the world.
static double compare_alone(tpr_session *s, const workload *w, const recorded *rec,
                            int32_t tokens[MAX_SEQS][MAX_SEQ_LEN], const int64_t *len, bool check_tokens) {
  static float alone[MAX_SEQ_LEN * V];
  double worst = 0;
  for (int i = 0; i < w->n; i++) {
    int64_t n_gen = len[i] - w->len[i];
    assert_true(n_gen >= 1 && n_gen <= w->g[i].max_new);
    TT_OK(tpr_session_forward(s, tokens[i], len[i] - 1, 0, alone));
    double err = 0, scale = 0;
    int seen = 0;
    for (int64_t g = 0; g < n_gen && g < EM_MAX_GEN; g++) {
      if (!rec->have[i][g]) continue;  // another replica ran it
      const float *want = alone + (w->len[i] - 1 + g) * V, *got = rec->rows[i][g];
      for (int64_t v = 0; v < V; v++) {
        err = fmax(err, fabs((double)got[v] - want[v]));
        scale = fmax(scale, fabs((double)want[v]));
      }
      if (check_tokens && w->g[i].sampling.temperature == 0)
        assert_int_equal(tokens[i][w->len[i] + g], argmax(want));
      seen++;
    }
    if (seen) worst = fmax(worst, err / scale);
  }
  float w32 = (float)worst;  // collectives carry f32
  TT_OK(tpr_comm_all_reduce(world, &w32, &w32, 1, TPR_F32, TPR_MAX));
  return w32;
}

static void test_batch_invariance(void **state) {
  (void)state;
  tpr_session *s = em_open_session(4, 4, 0);
  static workload w;
  static recorded rec;
  static int32_t tokens[MAX_SEQS][MAX_SEQ_LEN];
  int64_t len[MAX_SEQS], preempted;
  for (int round = 0; round < 2; round++) {
    uint64_t seed = em_shared_seed();
    make_workload(&w, 8, seed);
    int64_t budget = 3 + (int64_t)(seed % 22);
    memset(&rec, 0, sizeof rec);
    run_engine(s, &w, budget, false, &rec, tokens, len, &preempted);
    double err = compare_alone(s, &w, &rec, tokens, len, true);
    if (R == 0)
      printf("# tp %d dp %d ep %d, budget %lld tokens/step: batched vs alone max err %.3g (bound %g)\n", tp, dp, ep,
             (long long)budget, err, BOUND);
    assert_true(err <= BOUND);
    for (int g = 0; g < M2_NG; g++) assert_int_equal(tokens[0][M2_TA + g], ref.greedy_a[g]);  // transformers'
  }
  tpr_session_close(s);
}

static void test_wrong_blocks_caught(void **state) {
  (void)state;
  tpr_session *s = em_open_session(4, 4, 0);
  static workload w;
  static recorded rec;
  static int32_t tokens[MAX_SEQS][MAX_SEQ_LEN];
  int64_t len[MAX_SEQS], preempted;
  make_workload(&w, 8, em_shared_seed());
  for (int i = 0; i < w.n; i++) w.arrive_step[i] = 0;  // all together: steps hold several chunks
  memset(&rec, 0, sizeof rec);
  run_engine(s, &w, 64, true, &rec, tokens, len, &preempted);
  double err = compare_alone(s, &w, &rec, tokens, len, false);
  if (R == 0) printf("# negative control (tokens read the next sequence's blocks): err %.3g, must exceed %g\n", err, BOUND);
  assert_true(err > 1e-3);
  tpr_session_close(s);
}

static void test_preemption(void **state) {
  (void)state;
  uint64_t per_block = em_block_bytes();
  // 10 blocks of 4 rows: one whole sequence (8 blocks) fits, the batch does not.
  tpr_session *s = em_open_session(4, 4, (int64_t)(10 * per_block));
  assert_int_equal(tpr_session_pool_info(s).blocks, 10);
  static workload w;
  static recorded rec;
  static int32_t tokens[MAX_SEQS][MAX_SEQ_LEN];
  int64_t len[MAX_SEQS], preempted;
  make_workload(&w, 6, em_shared_seed());
  for (int i = 1; i < w.n; i++) {  // long prompts, arriving together
    w.len[i] = 12 + i;
    w.g[i].max_new = 6;
    w.arrive_step[i] = 0;
  }
  memset(&rec, 0, sizeof rec);
  run_engine(s, &w, 32, false, &rec, tokens, len, &preempted);
  double err = compare_alone(s, &w, &rec, tokens, len, true);
  if (R == 0) printf("# pool of 10 blocks for 6 sequences: %lld preemptions, max err %.3g\n", (long long)preempted, err);
  assert_true(preempted > 0);
  assert_true(err <= BOUND);
  tpr_session_close(s);
}

static void test_refused(void **state) {
  (void)state;
  uint64_t per_block = em_block_bytes();
  tpr_session *s = em_open_session(2, 4, (int64_t)(3 * per_block));  // 12 token rows
  tpr_engine *e = NULL;
  TT_OK(tpr_engine_new(s, &(tpr_engine_opts){0}, &e));
  if (R == 0) {
    int32_t prompt[20] = {0};
    for (int i = 0; i < 20; i++) prompt[i] = i;
    tpr_gen_params g = {.max_new = 2, .stop_token = -1, .sampling = {.top_p = 1}};
    int64_t id;
    assert_int_equal(tpr_engine_submit(e, prompt, 20, &g, &id), TPR_ERR_INVALID_ARG);
    printf("# a sequence larger than the pool: %s\n", tpr_last_error());
    assert_non_null(strstr(tpr_last_error(), "too small"));
    prompt[3] = V;  // outside the vocabulary
    assert_int_equal(tpr_engine_submit(e, prompt, 4, &g, &id), TPR_ERR_INVALID_ARG);
    assert_int_equal(tpr_engine_submit(e, prompt, 0, &g, &id), TPR_ERR_INVALID_ARG);
    g.max_new = MAX_SEQ_LEN;
    assert_int_equal(tpr_engine_submit(e, prompt, 3, &g, &id), TPR_ERR_INVALID_ARG);  // beyond max_seq
  }
  tpr_engine_step_info info;
  TT_OK(tpr_engine_step(e, &info));  // nothing was queued
  assert_true(info.idle);
  float logits[V];
  assert_int_equal(tpr_session_forward(s, ref.a, 1, 0, logits), TPR_ERR_INVALID_ARG);  // pool < one sequence
  tpr_engine_free(e);
  tpr_session_close(s);
}

int main(int argc, char **argv) {
  em_init(&argc, &argv);
  world = em.world, R = em.R, tp = em.tp, dp = em.dp, ep = em.ep;
  if (R == 0) tt_seed_from_env();
  m2_ref_load(&ref);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_wrong_blocks_caught),
      cmocka_unit_test(test_preemption),
      cmocka_unit_test(test_refused),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(world, failed);
}
