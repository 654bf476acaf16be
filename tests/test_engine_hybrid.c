// The batched engine on a hybrid model: minimax (tests/fixtures/minimax_tiny:
// lightning layers 0, 2, 3 and a softmax layer 1; lightning block 4) and
// minimax_tiny_b (linear, linear, full; block 3), under mpirun at the mesh on
// the command line (--tp/--dp/--ep). A running sequence holds KV blocks for
// its softmax layer and one state slot for its lightning layers
// (docs/engine.md, "Hybrid models"); every check compares each sequence's
// logits with the same sequence alone (tpr_session_forward over its final
// tokens, one call from position 0) within 1e-5 of max |logit|:
//  - mixed batches: random prompt lengths and arrival steps, a random token
//    budget (prefill chunks mixed with decodes at other positions), greedy
//    and sampled sequences; greedy tokens are the alone argmax;
//  - chunk sizes 1 .. block + 1 (the state carried across chunks that end
//    inside and across the lightning blocks and the KV blocks);
//  - preemption (a pool of 10 blocks for 6 long sequences): the same logits,
//    preemptions > 0, and no slot or block left held;
//  - cancel: a sequence cancelled mid-run gives its slot and blocks back at
//    once, the others still equal alone;
//  - the prefix cache is off for a hybrid model (nothing looked up);
//  - negative control: continuing chunks run on the state slot of the step's
//    next chunk must break the bound;
//  - speculative decoding (a verification snapshots its state slot; one that
//    rejects a draft restores it and recomputes the kept tokens): with
//    lookup:2:4 drafts on repetitive prompts, and with an external drafter
//    that proposes the plain run's next tokens spoiled from a random point
//    on (so verifications accept all, some or none), greedy tokens equal
//    the plain run's, every row within the bound of the sequence alone,
//    the external drafter's drafts accepted and rolled back (recomputed);
//    also under preemption;
//    negative control: skipping the restore must break the bound.
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

#define FIX TPR_FIXTURES "/minimax_tiny"
#define FIX_B TPR_FIXTURES "/minimax_tiny_b"
#define V M2_V  // both fixtures' vocabulary too
#define MAX_SEQS 12
#define MAX_SEQ_LEN EM_MAX_SEQ
#define BOUND 1e-5

static tpr_comm_t world;
static int R, dp;

typedef struct workload {
  int n;
  int32_t prompt[MAX_SEQS][MAX_SEQ_LEN];
  int64_t len[MAX_SEQS];
  tpr_gen_params g[MAX_SEQS];
  int arrive_step[MAX_SEQS];  // submitted before this step
} workload;

// Random prompts of 1..16 tokens, 1..6 new ones, odd sequences sampled.
static void make_workload(workload *w, int n, uint64_t seed) {
  tpr_rng rng = {seed};
  memset(w, 0, sizeof *w);
  w->n = n;
  for (int i = 0; i < n; i++) {
    tpr_gen_params *g = &w->g[i];
    g->stop_token = -1;
    g->sampling = (tpr_sampling){.temperature = 0, .top_p = 1, .seed = tpr_rng_next(&rng)};
    w->len[i] = 1 + (int64_t)(tpr_rng_next(&rng) % 16);
    g->max_new = 1 + (int64_t)(tpr_rng_next(&rng) % 6);
    for (int64_t t = 0; t < w->len[i]; t++) w->prompt[i][t] = (int32_t)(tpr_rng_next(&rng) % V);
    if (i % 2) g->sampling.temperature = 0.8, g->sampling.top_k = 20;
    w->arrive_step[i] = i ? w->arrive_step[i - 1] + (int)(tpr_rng_next(&rng) % 2) : 0;
  }
}

typedef struct run_opts {
  int64_t budget;
  const tpr_spec *spec;  // speculative decoding for every sequence (NULL: off)
  bool skip_restore;     // the speculative negative control
  bool wrong_slot;   // the negative control
  int cancel_id;     // >= 0: cancelled before step cancel_step
  int cancel_step;
} run_opts;

typedef struct run_out {
  int64_t preempted, prefix_queried;
  tpr_sched_spec_stats spec;  // drafted, accepted, verifications, rollbacks, recomputed
  int64_t slots_after_cancel;  // rank 0: slots held just after the cancel (-1: none)
  int64_t slots_before_cancel;
} run_out;

// The external drafter's reference: the plain run's tokens of each sequence.
static int32_t REF[MAX_SEQS][MAX_SEQ_LEN];
static int64_t REF_LEN[MAX_SEQS];
static tpr_rng DRAFT_RNG;

// Up to k of the reference's next tokens, each from a random point on
// replaced by another id (a cut at k: all right; at 0: all wrong), so
// verifications accept every draft, some or none. Past the reference (a
// sampled sequence that went its own way): whatever the spoiled ids are.
static int64_t spoiled_drafter(void *ctx, int64_t seq, const int32_t *tokens, int64_t len, int64_t k, int32_t *draft) {
  (void)ctx, (void)tokens;
  const int64_t cut = (int64_t)(tpr_rng_next(&DRAFT_RNG) % (uint64_t)(k + 1));
  for (int64_t j = 0; j < k; j++) {
    const int32_t ref = len + j < REF_LEN[seq] ? REF[seq][len + j] : (int32_t)(j * 7 % V);
    draft[j] = j < cut ? ref : (ref + 1 + (int32_t)(tpr_rng_next(&DRAFT_RNG) % (V - 1))) % V;
  }
  return k;
}

// Runs the workload; every rank gets the final token lists back.
static void run_engine(tpr_session *s, const workload *w, const run_opts *ro, em_recorded *rec,
                       int32_t tokens[MAX_SEQS][MAX_SEQ_LEN], int64_t *len, run_out *out) {
  tpr_engine_opts eo = {.max_tokens_per_step = ro->budget, .on_logits = em_on_logits, .ctx = rec,
                        .debug_wrong_state_slot = ro->wrong_slot,  // the prefix cache left on: the engine turns it off
                        .max_draft = ro->spec ? ro->spec->k : 0, .draft = spoiled_drafter,
                        .draft_layers = ro->spec && ro->spec->kind == TPR_SPEC_SELF ? ro->spec->n : 0,
                        .debug_skip_state_restore = ro->skip_restore};
  tpr_engine *e = NULL;
  TT_OK(tpr_engine_new(s, &eo, &e));
  *out = (run_out){.slots_after_cancel = -1, .slots_before_cancel = -1};
  int64_t NS = tpr_session_pool_info(s).state_slots;
  for (int step = 0;; step++) {
    for (int i = 0; R == 0 && i < w->n; i++)
      if (w->arrive_step[i] == step) {
        int64_t id;
        tpr_gen_params g = w->g[i];
        if (ro->spec) g.spec = *ro->spec;
        TT_OK(tpr_engine_submit(e, w->prompt[i], w->len[i], &g, &id));
        assert_int_equal(id, i);
      }
    if (R == 0 && step == ro->cancel_step && ro->cancel_id >= 0) {
      tpr_sched_seq_info si;
      TT_OK(tpr_engine_result(e, ro->cancel_id, &si));
      int r = si.replica;
      out->slots_before_cancel = tpr_engine_state_slots_in_use(e, r);
      TT_OK(tpr_engine_cancel(e, ro->cancel_id));
      out->slots_after_cancel = tpr_engine_state_slots_in_use(e, r);
    }
    tpr_engine_step_info info;
    TT_OK(tpr_engine_step(e, &info));
    for (int r = 0; R == 0 && r < dp; r++) assert_true(tpr_engine_state_slots_in_use(e, r) <= NS);
    if (info.idle && step >= 8) break;
  }
  if (R == 0) {
    for (int r = 0; r < dp; r++) {
      assert_int_equal(tpr_engine_blocks_in_use(e, r), 0);
      assert_int_equal(tpr_engine_state_slots_in_use(e, r), 0);
    }
    out->preempted = tpr_engine_preemptions(e);
    out->prefix_queried = tpr_engine_prefix(e).queried_tokens;
    out->spec = tpr_engine_spec(e);
  }
  int64_t words[7] = {out->preempted,        out->prefix_queried,    out->spec.drafted,   out->spec.accepted,
                      out->spec.verifications, out->spec.rollbacks, out->spec.recomputed};
  TT_OK(tpr_comm_broadcast(world, words, words, 7, TPR_I64, 0));
  out->preempted = words[0], out->prefix_queried = words[1];
  out->spec = (tpr_sched_spec_stats){words[2], words[3], words[4], words[5], words[6]};
  em_share_results(e, w->n, tokens, len, NULL, NULL);
  tpr_engine_free(e);
}

static int64_t argmax(const float *x) {
  int64_t b = 0;
  for (int64_t v = 1; v < V; v++)
    if (x[v] > x[b]) b = v;
  return b;
}

// Each sequence alone (one forward from position 0 over its final tokens)
// against what the engine saw; the largest relative error over the world.
// skip: a sequence not compared (cancelled: it may have generated nothing).
static double compare_alone(tpr_session *s, const workload *w, const em_recorded *rec,
                            int32_t tokens[MAX_SEQS][MAX_SEQ_LEN], const int64_t *len, bool check_tokens, int skip) {
  static float alone[MAX_SEQ_LEN * V];
  double worst = 0;
  for (int i = 0; i < w->n; i++) {
    int64_t n_gen = len[i] - w->len[i];
    if (i == skip) continue;
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
  float w32 = (float)worst;
  TT_OK(tpr_comm_all_reduce(world, &w32, &w32, 1, TPR_F32, TPR_MAX));
  return w32;
}

static workload W;
static em_recorded REC;
static int32_t TOKENS[MAX_SEQS][MAX_SEQ_LEN];
static int64_t LEN[MAX_SEQS];

static double run_and_compare(tpr_session *s, const run_opts *ro, bool check_tokens, run_out *out) {
  memset(&REC, 0, sizeof REC);
  run_engine(s, &W, ro, &REC, TOKENS, LEN, out);
  return compare_alone(s, &W, &REC, TOKENS, LEN, check_tokens, ro->cancel_id);
}

static void test_mixed_batches(void **state) {
  (void)state;
  const char *dirs[2] = {FIX, FIX_B};
  for (int f = 0; f < 2; f++) {
    tpr_session *s = em_open_session_dir(dirs[f], 4, 4, 0);
    assert_int_equal(tpr_session_pool_info(s).state_slots, 4);
    for (int round = 0; round < 2; round++) {
      uint64_t seed = em_shared_seed();
      make_workload(&W, 8, seed);
      run_opts ro = {.budget = 3 + (int64_t)(seed % 22), .cancel_id = -1};
      run_out out;
      double err = run_and_compare(s, &ro, true, &out);
      if (R == 0)
        printf("# %s, budget %lld tokens/step: batched vs alone max err %.3g (bound %g); prefix lookups %lld\n",
               dirs[f] + strlen(TPR_FIXTURES) + 1, (long long)ro.budget, err, BOUND, (long long)out.prefix_queried);
      assert_true(err <= BOUND);
      assert_int_equal(out.prefix_queried, 0);  // no prefix caching for a hybrid model
    }
    tpr_session_close(s);
  }
}

// Two long prompts together under every budget from 1 to block + 1 tokens.
static void test_chunk_sizes(void **state) {
  (void)state;
  tpr_session *s = em_open_session_dir(FIX, 2, 4, 0);
  make_workload(&W, 2, em_shared_seed());
  for (int i = 0; i < 2; i++) W.len[i] = 13 + i, W.g[i].max_new = 4, W.arrive_step[i] = i;
  double worst = 0;
  for (int64_t budget = 1; budget <= 5; budget++) {
    run_opts ro = {.budget = budget, .cancel_id = -1};
    run_out out;
    double err = run_and_compare(s, &ro, true, &out);
    if (R == 0) printf("# chunks of at most %lld tokens: max err %.3g\n", (long long)budget, err);
    worst = fmax(worst, err);
  }
  assert_true(worst <= BOUND);
  tpr_session_close(s);
}

static void test_preemption(void **state) {
  (void)state;
  tpr_session *probe = em_open_session_dir(FIX, 1, 4, 0);
  tpr_session_pool p = tpr_session_pool_info(probe);
  tpr_session_close(probe);
  uint64_t per_block = p.bytes / (uint64_t)p.blocks;
  // 10 blocks of 4 rows: one whole sequence (at most 8 blocks) fits, the batch does not.
  tpr_session *s = em_open_session_dir(FIX, 4, 4, (int64_t)(10 * per_block));
  assert_int_equal(tpr_session_pool_info(s).blocks, 10);
  make_workload(&W, 6, em_shared_seed());
  for (int i = 0; i < W.n; i++) W.len[i] = 12 + i, W.g[i].max_new = 6, W.arrive_step[i] = 0;
  run_opts ro = {.budget = 32, .cancel_id = -1};
  run_out out;
  double err = run_and_compare(s, &ro, true, &out);
  if (R == 0) printf("# pool of 10 blocks for 6 sequences: %lld preemptions, max err %.3g\n", (long long)out.preempted, err);
  assert_true(out.preempted > 0);
  assert_true(err <= BOUND);
  tpr_session_close(s);
}

static void test_cancel(void **state) {
  (void)state;
  tpr_session *s = em_open_session_dir(FIX, 4, 4, 0);
  make_workload(&W, 4, em_shared_seed());
  for (int i = 0; i < W.n; i++) W.len[i] = 9 + i, W.g[i].max_new = 6, W.arrive_step[i] = 0;
  run_opts ro = {.budget = 8, .cancel_id = 1, .cancel_step = 3};  // sequence 1 is running by then
  run_out out;
  double err = run_and_compare(s, &ro, true, &out);
  if (R == 0) {
    printf("# cancel at step 3: state slots %lld -> %lld, the others' max err %.3g\n",
           (long long)out.slots_before_cancel, (long long)out.slots_after_cancel, err);
    assert_int_equal(out.slots_after_cancel, out.slots_before_cancel - 1);
  }
  assert_true(err <= BOUND);
  tpr_session_close(s);
}

static void test_wrong_slot_caught(void **state) {
  (void)state;
  tpr_session *s = em_open_session_dir(FIX, 4, 4, 0);
  make_workload(&W, 4, em_shared_seed());
  for (int i = 0; i < W.n; i++) W.len[i] = 6 + i, W.arrive_step[i] = 0, W.g[i].max_new = 4;
  run_opts ro = {.budget = 16, .wrong_slot = true, .cancel_id = -1};  // chunks continue from another's state
  run_out out;
  double err = run_and_compare(s, &ro, false, &out);
  if (R == 0) printf("# negative control (chunks on the next chunk's state slot): err %.3g, must exceed %g\n", err, BOUND);
  assert_true(err > 1e-3);
  tpr_session_close(s);
}

static int64_t LOOKUP_DRAFTED;  // lookup drafts verified over spec_round calls
// The spoiled drafter's totals over spec_round calls: a run of few
// verifications (a small pool) can draw every cut at 0 by chance.
static tpr_sched_spec_stats SPOILED;

// Speculative decoding on the workload W (set by the caller): a plain run
// first (the reference: its tokens feed the external drafter), then each
// drafter; greedy tokens equal the plain run's, every row within the bound
// of the sequence alone. Returns the worst error over the drafters.
static double spec_round(tpr_session *s, int64_t budget, const char *what, bool want_preempted) {
  run_opts plain = {.budget = budget, .cancel_id = -1};
  run_out out;
  double err = run_and_compare(s, &plain, true, &out);
  assert_true(err <= BOUND);
  memcpy(REF, TOKENS, sizeof REF), memcpy(REF_LEN, LEN, sizeof REF_LEN);
  const tpr_spec specs[3] = {{TPR_SPEC_LOOKUP, 2, 4}, {TPR_SPEC_EXTERNAL, 0, 3}, {TPR_SPEC_SELF, 1, 3}};
  double worst = 0;
  for (int d = 0; d < 3; d++) {
    DRAFT_RNG = (tpr_rng){em_shared_seed()};
    run_opts ro = {.budget = budget, .spec = &specs[d], .cancel_id = -1};
    err = run_and_compare(s, &ro, true, &out);
    int same = 0, greedy = 0;
    for (int i = 0; i < W.n; i++) {
      if (W.g[i].sampling.temperature != 0) continue;
      greedy++;
      same += LEN[i] == REF_LEN[i] && memcmp(TOKENS[i], REF[i], (size_t)LEN[i] * sizeof(int32_t)) == 0;
    }
    if (R == 0)
      printf("# %s, %s: %d/%d greedy sequences equal plain; %lld drafted, %lld accepted in %lld verifications, "
             "%lld rolled back, %lld tokens recomputed, %lld preemptions; max err %.3g (bound %g)\n",
             what, d == 2 ? "self:1:3" : d ? "external (spoiled)" : "lookup:2:4", same, greedy, (long long)out.spec.drafted,
             (long long)out.spec.accepted, (long long)out.spec.verifications, (long long)out.spec.rollbacks,
             (long long)out.spec.recomputed, (long long)out.preempted, err, BOUND);
    assert_int_equal(same, greedy);
    if (d == 0) LOOKUP_DRAFTED += out.spec.drafted;  // few on a random model: summed by the caller
    // The spoiled drafter's drafts are right up to their cut: some accepted, some rejected.
    if (d == 1) {
      // Each rollback recomputes its kept tokens, unless the sequence is
      // preempted first (it then recomputes everything as a prefill).
      assert_true(out.spec.drafted > 0 && (out.preempted > 0 || out.spec.recomputed >= out.spec.rollbacks));
      SPOILED.accepted += out.spec.accepted, SPOILED.rollbacks += out.spec.rollbacks;
    }
    if (d == 2) assert_true(out.spec.drafted > 0 && out.spec.verifications > 0);  // every decode drafts by the model
    if (want_preempted) assert_true(out.preempted > 0);
    worst = fmax(worst, err);
  }
  return worst;
}

// Prompts of a repeated 3-token pattern (lookup finds drafts), mostly greedy.
static void repetitive_prompts(int n, int64_t len, int64_t max_new) {
  make_workload(&W, n, em_shared_seed());
  for (int i = 0; i < W.n; i++) {
    W.len[i] = len + i % 3, W.g[i].max_new = max_new, W.arrive_step[i] = i / 2;
    for (int64_t t = 3; t < W.len[i]; t++) W.prompt[i][t] = W.prompt[i][t - 3];
    if (i % 4 != 3) W.g[i].sampling.temperature = 0;  // one sampled sequence in four
  }
}

static void test_speculative(void **state) {
  (void)state;
  const char *dirs[2] = {FIX, FIX_B};
  LOOKUP_DRAFTED = 0;
  SPOILED = (tpr_sched_spec_stats){0};
  for (int f = 0; f < 2; f++) {
    tpr_session *s = em_open_session_dir(dirs[f], 4, 4, 0);
    repetitive_prompts(8, 7, 9);
    double err = spec_round(s, 5 + (int64_t)(em_shared_seed() % 20), dirs[f] + strlen(TPR_FIXTURES) + 1, false);
    assert_true(err <= BOUND);
    tpr_session_close(s);
  }
  assert_true(LOOKUP_DRAFTED > 0);  // the lookup comparisons were not empty
  // The spoiled drafter's drafts are right up to their cut: some accepted, some rolled back.
  assert_true(SPOILED.accepted > 0 && SPOILED.rollbacks > 0);
}

static void test_speculative_preemption(void **state) {
  (void)state;
  tpr_session *probe = em_open_session_dir(FIX, 1, 4, 0);
  tpr_session_pool p = tpr_session_pool_info(probe);
  tpr_session_close(probe);
  // 8 blocks of 4 rows: one whole sequence (at most 5 blocks) fits, the batch does not.
  tpr_session *s = em_open_session_dir(FIX, 4, 4, (int64_t)(8 * (p.bytes / (uint64_t)p.blocks)));
  assert_int_equal(tpr_session_pool_info(s).blocks, 8);
  repetitive_prompts(5, 9, 9);
  for (int i = 0; i < W.n; i++) W.arrive_step[i] = 0;
  double err = spec_round(s, 32, "pool of 8 blocks", true);
  assert_true(err <= BOUND);
  tpr_session_close(s);
}

static void test_speculative_skip_restore_caught(void **state) {
  (void)state;
  tpr_session *s = em_open_session_dir(FIX, 4, 4, 0);
  repetitive_prompts(4, 7, 9);
  run_opts plain = {.budget = 16, .cancel_id = -1};
  run_out out;
  run_and_compare(s, &plain, true, &out);
  memcpy(REF, TOKENS, sizeof REF), memcpy(REF_LEN, LEN, sizeof REF_LEN);
  const tpr_spec ext = {TPR_SPEC_EXTERNAL, 0, 3};
  DRAFT_RNG = (tpr_rng){em_shared_seed()};
  run_opts ro = {.budget = 16, .spec = &ext, .skip_restore = true, .cancel_id = -1};
  double err = run_and_compare(s, &ro, false, &out);
  if (R == 0)
    printf("# negative control (no state restore after %lld rollbacks): err %.3g, must exceed %g\n",
           (long long)out.spec.rollbacks, err, BOUND);
  assert_true(out.spec.rollbacks > 0);
  assert_true(err > 1e-3);
  // Self drafts move the first layers' states before the verification: the
  // same control skips putting them back too.
  const tpr_spec self = {TPR_SPEC_SELF, 1, 3};
  run_opts rs = {.budget = 16, .spec = &self, .skip_restore = true, .cancel_id = -1};
  err = run_and_compare(s, &rs, false, &out);
  if (R == 0) printf("# negative control, self:1:3 without the restores: err %.3g, must exceed %g\n", err, BOUND);
  assert_true(err > 1e-3);
  tpr_session_close(s);
}

int main(int argc, char **argv) {
  em_init(&argc, &argv);
  world = em.world, R = em.R, dp = em.dp;
  if (R == 0) tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mixed_batches), cmocka_unit_test(test_chunk_sizes), cmocka_unit_test(test_preemption),
      cmocka_unit_test(test_cancel),        cmocka_unit_test(test_wrong_slot_caught),
      cmocka_unit_test(test_speculative),   cmocka_unit_test(test_speculative_preemption),
      cmocka_unit_test(test_speculative_skip_restore_caught),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(world, failed);
}
