// The batched engine's scheduler (engine/scheduler.h) driven by a fake model
// (the harness: tests/sched_harness.c):
// the token after position p of sequence id is a hash of (id, p), so every
// sequence's final token list is known before it is submitted. A harness
// checks each planned step (budgets, chunk positions, block tables, the
// decode-first order) and keeps a simulated paged KV cache: each chunk
// writes (seq, position, token) into the rows its block table names and
// first reads back every earlier row of its sequence, so a block handed to
// two sequences, or a table that lost a block, shows up as a wrong row.
// Sibling groups (tpr_sched_submit_n) share their prompt's leading blocks:
// the harness keeps every live sequence's block table as it last saw it and
// checks that no chunk writes a row into a block another live sequence
// holds, that a block handed out fresh is held by nobody, that a sibling
// takes exactly its leader's computed leading blocks, and that the pool's
// reference count of every block equals the holders the harness sees.
// With the prefix cache on, prompts copy prefixes of earlier sequences
// (generated tokens included): a sequence's leading cached blocks count as
// shared, every KV row it reads must have been written by a sequence whose
// tokens up to that row equal its own, and no chunk may write into a block
// another live sequence holds (a cached block is never written again).
// The API used directly (refusals, cancel, release, the pool's reference
// counts, the cache's keys and eviction) is tested in test_scheduler_api.c.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_harness.h"
#include "test_util.h"

// (a), (b): random configurations, arrivals spread over the first steps;
// with_groups: about a third of the sequences lead a sibling group of 2-4;
// prefix: the prefix cache on, and two thirds of the prompts begin with a
// prefix of an earlier sequence's tokens (its prompt and generated ones).
static void random_runs(bool with_groups, bool prefix, int64_t spec_k) {
  int64_t steps = 0, pre = 0, max_tok = 0, max_ch = 0, recompute = 0, seqs = 0, shared = 0, saved = 0, alone = 0;
  int64_t cached = 0, cached_blocks = 0, drafted = 0, accepted = 0, verifications = 0;
  for (int run = 0; run < 60; run++) {
    int64_t n = tt_randint(1, 16), bs = tt_randint(1, 16);
    int32_t vocab = (int32_t)tt_randint(2, 60);
    harness h;
    tpr_sched_opts o = sched_opts((int)tt_randint(1, 3), 1, bs, tt_randint(1, 8), tt_randint(1, 64), 1);
    int64_t lens[16], news[16], stops[16], arr[16], group[16] = {0}, max_rows = 1, max_seq = 1, t = 0;
    for (int64_t i = 0; i < n; i++) {
      lens[i] = tt_randint(1, 40), news[i] = tt_randint(1, 20);
      stops[i] = tt_randint(0, 2) == 0 ? tt_randint(0, vocab - 1) : -1;
      t += tt_randint(0, 3) == 0 ? tt_randint(0, 6) : 0;
      arr[i] = t;
      if (with_groups && i + 1 < n && tt_randint(0, 2) == 0) {
        group[i] = tt_randint(2, n - i < 4 ? n - i : 4);
        for (int64_t j = 1; j < group[i]; j++) lens[i + j] = lens[i], news[i + j] = tt_randint(1, 20), arr[i + j] = t;
        i += group[i] - 1;
      }
    }
    for (int64_t i = 0; i < n; i++) {
      if (lens[i] + news[i] - 1 > max_rows) max_rows = lens[i] + news[i] - 1;
      if (lens[i] + news[i] > max_seq) max_seq = lens[i] + news[i];
    }
    int64_t min_blocks = (max_rows + bs - 1) / bs;
    o.pool_blocks = tt_randint(0, 2) == 0 ? min_blocks : min_blocks + tt_randint(0, 3 * min_blocks);
    o.max_seq = max_seq + tt_randint(0, 5);
    o.prefix_cache = prefix;
    h_init(&h, o, n, vocab);
    h.spec_k = spec_k;
    for (int64_t i = 0; i < n; i++) {
      if (group[i] > 1) {
        exp_init_group(&h.e[i], i, group[i], lens[i], news + i, vocab, arr[i]);
        i += group[i] - 1;
      } else {
        exp_init(&h.e[i], i, lens[i], news[i], (int32_t)stops[i], vocab, arr[i]);
      }
    }
    // The fake model's tokens hash (id, position) alone, so a prompt can be
    // rewritten after the fact; a group's siblings take the leader's.
    for (int64_t i = 1; prefix && i < n; i++) {
      exp_seq *e = &h.e[i];
      if (e->leader >= 0) {
        memcpy(e->tok, h.e[e->leader].tok, (size_t)e->prompt_len * sizeof *e->tok);
        continue;
      }
      if (tt_randint(0, 2) == 0) continue;
      const exp_seq *from = &h.e[tt_randint(0, i - 1)];
      int64_t k = tt_randint(1, e->prompt_len);
      memcpy(e->tok, from->tok, (size_t)(k < from->len ? k : from->len) * sizeof *e->tok);
    }
    const char *bad = h_run(&h);
    if (bad)
      fail_msg("run %d (replicas %d pool %lld bs %lld batch %lld tokens %lld, %lld seqs): %s", run, o.replicas,
               (long long)o.pool_blocks, (long long)bs, (long long)o.max_batch, (long long)o.max_tokens,
               (long long)n, bad);
    steps += h.steps_run, pre += h.preemptions, recompute += h.recompute_generated, seqs += n;
    shared += h.shared_admissions, saved += h.blocks_shared, alone += h.alone_siblings;
    cached += h.cached_admissions, cached_blocks += h.blocks_cached;
    drafted += h.drafted, accepted += h.accepted, verifications += h.verifications;
    if (h.max_step_tokens > max_tok) max_tok = h.max_step_tokens;
    if (h.max_step_chunks > max_ch) max_ch = h.max_step_chunks;
    h_free(&h);
  }
  printf("random%s: 60 runs, %lld sequences, %lld steps, %lld preemptions (%lld recompute chunks over generated "
         "tokens), max %lld tokens and %lld chunks per replica step; all tokens exact, pools empty at the end\n",
         spec_k ? " with drafts" : prefix ? " with the prefix cache" : with_groups ? " with sibling groups" : "",
         (long long)seqs, (long long)steps, (long long)pre,
         (long long)recompute, (long long)max_tok, (long long)max_ch);
  assert_true(pre > 0);
  if (spec_k) {
    printf("  %lld drafts in %lld verifications, %lld accepted; rejected drafts' rows never read again\n",
           (long long)drafted, (long long)verifications, (long long)accepted);
    assert_true(verifications > 0 && accepted > 0 && accepted < drafted);
  }
  if (prefix) {
    printf("  %lld admissions took %lld cached blocks\n", (long long)cached, (long long)cached_blocks);
    assert_true(cached > 0);
  }
  if (with_groups) {
    printf("  %lld siblings admitted sharing %lld leader blocks, %lld admitted alone (a prompt under one block, "
           "the leader preempted or finished, or the sibling readmitted after its own preemption)\n",
           (long long)shared, (long long)saved, (long long)alone);
    assert_true(shared > 0 && alone > 0);
  }
}

static void test_random_runs(void **state) {
  (void)state;
  random_runs(false, false, 0);
}

static void test_random_runs_with_groups(void **state) {
  (void)state;
  random_runs(true, false, 0);
}

static void test_random_runs_with_prefix_cache(void **state) {
  (void)state;
  random_runs(true, true, 0);
}

// Speculative decoding: random drafts (a random prefix right) before every
// step, with sibling groups and the prefix cache: every token still exact,
// every KV row read holding its own sequence's token (a rejected draft's row
// would hold the draft), tables at the kept rows' blocks after each step.
static void test_random_runs_with_drafts(void **state) {
  (void)state;
  random_runs(true, true, 6);
}

// (c) A pool that fits one sequence but not the batch: preemption by
// recompute, tokens still exact.
static void test_preemption(void **state) {
  (void)state;
  for (int replicas = 1; replicas <= 2; replicas++) {
    harness h;
    h_init(&h, sched_opts(replicas, 8, 2, 8, 64, 64), 4 * replicas, 1000);
    for (int64_t i = 0; i < h.n; i++) exp_init(&h.e[i], i, 5, 8, -1, 1000, 0);  // 12 rows = 6 blocks each
    const char *bad = h_run(&h);
    if (bad) fail_msg("%s", bad);
    printf("preemption (replicas %d, pool 8 x 2, %lld sequences of 5 + 8): %lld steps, %lld preemptions, %lld "
           "recompute chunks over generated tokens\n",
           replicas, (long long)h.n, (long long)h.steps_run, (long long)h.preemptions, (long long)h.recompute_generated);
    assert_true(h.preemptions > 0 && h.recompute_generated > 0);
    assert_int_equal(tpr_sched_preemptions(h.s), h.preemptions);
    h_free(&h);
  }
  // Exactly one pool's worth: 8 + 1 = 9 tokens, 8 KV rows = 2 blocks of 4.
  harness h;
  h_init(&h, sched_opts(1, 2, 4, 4, 16, 64), 3, 1000);
  exp_init(&h.e[0], 0, 8, 1, -1, 1000, 0);
  exp_init(&h.e[1], 1, 5, 4, -1, 1000, 0);
  exp_init(&h.e[2], 2, 1, 8, -1, 1000, 1);
  const char *bad = h_run(&h);
  if (bad) fail_msg("%s", bad);
  printf("pool of exactly one sequence: %lld steps, %lld preemptions\n", (long long)h.steps_run,
         (long long)h.preemptions);
  h_free(&h);
}

// (d) A stop token ends a sequence early; its blocks go back at once (the
// harness checks blocks in use after every step).
static void test_stop_token(void **state) {
  (void)state;
  harness h;
  h_init(&h, sched_opts(1, 64, 4, 4, 64, 128), 2, 1000);
  int32_t stop = fake_next(0, 6 + 3, 1000);
  exp_init(&h.e[0], 0, 6, 20, stop, 1000, 0);
  exp_init(&h.e[1], 1, 6, 20, -1, 1000, 0);
  assert_true(h.e[0].len <= 6 + 4 && h.e[0].tok[h.e[0].len - 1] == stop);
  const char *bad = h_run(&h);
  if (bad) fail_msg("%s", bad);
  printf("stop token: seq 0 finished at step %lld with %lld tokens, seq 1 at step %lld with %lld\n",
         (long long)h.finish_step[0], (long long)h.e[0].len, (long long)h.finish_step[1], (long long)h.e[1].len);
  assert_true(h.finish_step[0] < h.finish_step[1]);
  h_free(&h);
}

// (e) One chunk per step: sequences finish in submission order, also a
// short one submitted after a long one.
static void test_fcfs(void **state) {
  (void)state;
  harness h;
  h_init(&h, sched_opts(1, 64, 4, 1, 64, 128), 6, 1000);
  for (int64_t i = 0; i < h.n; i++) exp_init(&h.e[i], i, tt_randint(1, 30), tt_randint(1, 10), -1, 1000, i < 3 ? 0 : 2);
  const char *bad = h_run(&h);
  if (bad) fail_msg("%s", bad);
  printf("fcfs: finish steps");
  for (int64_t i = 0; i < h.n; i++) printf(" %lld", (long long)h.finish_step[i]);
  printf("\n");
  for (int64_t i = 1; i < h.n; i++) assert_true(h.finish_step[i] > h.finish_step[i - 1]);
  h_free(&h);
}

// (f) A 23-token prompt under max_tokens 5: chunks 5,5,5,5,3, sampled only
// on the last, then decodes.
static void test_chunked_prefill(void **state) {
  (void)state;
  harness h;
  h_init(&h, sched_opts(1, 64, 4, 4, 5, 128), 1, 1000);
  exp_init(&h.e[0], 0, 23, 3, -1, 1000, 0);
  h.log_seq = 0;
  const char *bad = h_run(&h);
  if (bad) fail_msg("%s", bad);
  const int64_t want[7][3] = {{0, 5, 0}, {5, 5, 0}, {10, 5, 0}, {15, 5, 0}, {20, 3, 1}, {23, 1, 1}, {24, 1, 1}};
  assert_int_equal(h.n_log, 7);
  printf("chunked prefill:");
  for (int i = 0; i < 7; i++) {
    printf(" [%lld,+%lld%s]", (long long)h.log[i][0], (long long)h.log[i][1], h.log[i][2] ? " s" : "");
    for (int j = 0; j < 3; j++) assert_int_equal(h.log[i][j], want[i][j]);
  }
  printf("\n");
  h_free(&h);
}

// Negative controls: a wrong model and hand-edited steps must be caught.
static void test_negative_controls(void **state) {
  (void)state;
  harness h;
  h_init(&h, sched_opts(1, 32, 4, 8, 64, 64), 3, 1000);
  exp_init(&h.e[0], 0, 3, 6, -1, 1000, 0);
  exp_init(&h.e[1], 1, 9, 6, -1, 1000, 0);
  exp_init(&h.e[2], 2, 7, 6, -1, 1000, 1);
  assert_null(h_step(&h));
  h.submitted = 3;  // step 2 brings seq 2: decodes of 0 and 1, then 2's prefill
  int64_t id;
  TT_OK(tpr_sched_submit(h.s, h.e[2].tok, 7, 6, -1, &id));
  tpr_sched_step st;
  TT_OK(tpr_sched_next(h.s, &st));
  sync_shadow(&h);
  assert_int_equal(st.n_chunks[0], 3);
  assert_null(check_step(&h, &st));
  tpr_sched_chunk c[3];
  const tpr_sched_chunk *cp = c;
  tpr_sched_step t = st;
  t.chunks = &cp;
  struct { int what; const char *word; } cases[] = {{0, "out of range or twice"}, {1, "pos0"}, {2, "after a prefill"}, {3, "appears twice"}, {4, "KV row"}};
  int32_t table[16];
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    memcpy(c, st.chunks[0], sizeof c);
    memcpy(table, c[1].blocks, (size_t)c[1].n_blocks * sizeof *table);
    if (cases[k].what == 0) table[c[1].n_blocks - 1] = c[0].blocks[0], c[1].blocks = table;
    if (cases[k].what == 1) c[1].pos0++;
    if (cases[k].what == 2) c[0] = st.chunks[0][2], c[2] = st.chunks[0][0];
    if (cases[k].what == 3) c[1] = c[0];
    if (cases[k].what == 4) table[0] = 31, c[1].blocks = table;  // a block never written
    const char *bad = check_step(&h, &t);
    if (!bad || !strstr(bad, cases[k].word)) fail_msg("edit %d not caught as '%s': %s", cases[k].what, cases[k].word, bad ? bad : "passed");
  }
  h_free(&h);
  // A model that samples the token one position too far gives other tokens.
  h_init(&h, sched_opts(2, 16, 2, 4, 8, 64), 4, 50);
  for (int64_t i = 0; i < 4; i++) exp_init(&h.e[i], i, 5, 5, -1, 50, 0);
  h.wrong_model = 1;
  const char *bad = h_run(&h);
  assert_non_null(bad);
  printf("negative controls: 5 edited steps caught; wrong model caught: %s\n", bad);
  h_free(&h);
}

// One group of 4 (prompt 10, block 4: k = 2 shared blocks) against the same
// four as separate sequences: the siblings start at position 8, only after
// the leader computed its first 8 rows, and hold fewer blocks at the peak.
// Then a 23-token prompt under a budget of 5 tokens per step: the siblings
// wait out the leader's chunked prefill (k = 5 blocks, 20 rows).
static void test_sibling_group(void **state) {
  (void)state;
  const int64_t news[4] = {5, 5, 5, 5}, n = 4, k = 2;
  harness g, sep;
  h_init(&g, sched_opts(1, 64, 4, 8, 64, 64), n, 1000);
  exp_init_group(g.e, 0, n, 10, news, 1000, 0);
  g.log_seq = 1;
  const char *bad = h_run(&g);
  if (bad) fail_msg("group: %s", bad);
  h_init(&sep, sched_opts(1, 64, 4, 8, 64, 64), n, 1000);
  for (int64_t i = 0; i < n; i++) {  // the same prompt, each its own submission
    exp_init(&sep.e[i], i, 10, 5, -1, 1000, 0);
    memcpy(sep.e[i].tok, g.e[i].tok, (size_t)g.e[i].len * sizeof(int32_t));
  }
  bad = h_run(&sep);
  if (bad) fail_msg("separate: %s", bad);
  printf("sibling group of 4 (prompt 10, blocks of 4): %lld admitted sharing %lld blocks; peak blocks %lld vs %lld "
         "separately (saving %lld, (n-1)*k = %lld); seq 1's chunks:",
         (long long)g.shared_admissions, (long long)g.blocks_shared, (long long)g.peak_blocks,
         (long long)sep.peak_blocks, (long long)(sep.peak_blocks - g.peak_blocks), (long long)((n - 1) * k));
  for (int64_t i = 0; i < g.n_log; i++)
    printf(" [%lld,+%lld%s]", (long long)g.log[i][0], (long long)g.log[i][1], g.log[i][2] ? " s" : "");
  printf("\n");
  assert_int_equal(g.shared_admissions, n - 1);
  assert_int_equal(g.blocks_shared, (n - 1) * k);
  assert_true(g.log[0][0] == 8 && g.log[0][1] == 2 && g.log[0][2]);  // the prompt's rest, then its first token
  int64_t saved = sep.peak_blocks - g.peak_blocks;
  assert_true(saved >= (n - 1) * k - n && saved <= (n - 1) * k + n);
  assert_int_equal(sep.shared_admissions, 0);
  h_free(&g);
  h_free(&sep);

  h_init(&g, sched_opts(1, 64, 4, 8, 5, 64), 3, 1000);
  exp_init_group(g.e, 0, 3, 23, news, 1000, 0);
  g.log_seq = 1;
  bad = h_run(&g);
  if (bad) fail_msg("chunked group: %s", bad);
  printf("sibling group under chunked prefill (prompt 23, budget 5): seq 1's chunks:");
  for (int64_t i = 0; i < g.n_log; i++)
    printf(" [%lld,+%lld%s]", (long long)g.log[i][0], (long long)g.log[i][1], g.log[i][2] ? " s" : "");
  printf("\n");
  assert_int_equal(g.shared_admissions, 2);
  assert_int_equal(g.log[0][0], 20);
  h_free(&g);
}

// Negative controls of the sharing checks: a sibling rewriting the last
// shared row, and a shared block freed while its siblings still hold it,
// must both be caught by the harness (and the intact scheduler passes the
// same workload, above).
static void test_sharing_faults_caught(void **state) {
  (void)state;
  const int64_t news[3] = {4, 6, 6};
  struct { tpr_sched_fault fault; const char *word; } cases[] = {
      {TPR_SCHED_FAULT_WRITE_SHARED, "shared with"}, {TPR_SCHED_FAULT_FREE_SHARED, "the pool counts"},
      {TPR_SCHED_FAULT_PREFIX_FIRST_TOKEN, "KV row"}, {TPR_SCHED_FAULT_KEEP_REJECTED_BLOCKS, "the pool counts"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    tpr_sched_opts o = sched_opts(1, 32, 4, 8, 64, 64);
    o.debug_fault = cases[i].fault;
    harness h;
    if (cases[i].fault == TPR_SCHED_FAULT_PREFIX_FIRST_TOKEN) {
      // The cache with keys of a block's first token alone: the second
      // prompt begins as the first, then differs; it arrives once the first ended.
      o.prefix_cache = true;
      h_init(&h, o, 2, 1000);
      exp_init(&h.e[0], 0, 11, 4, -1, 1000, 0);
      exp_init(&h.e[1], 1, 11, 4, -1, 1000, 20);
      h.e[1].tok[0] = h.e[0].tok[0];
      h.e[1].tok[1] = (h.e[0].tok[1] + 1) % 1000;
    } else {
      h_init(&h, o, 3, 1000);
      exp_init_group(h.e, 0, 3, 11, news, 1000, 0);
    }
    if (cases[i].fault == TPR_SCHED_FAULT_KEEP_REJECTED_BLOCKS) {  // drafts of 6 in blocks of 4, longer answers
      h_free(&h);
      h_init(&h, o, 3, 1000);
      const int64_t longer[3] = {20, 20, 20};
      exp_init_group(h.e, 0, 3, 11, longer, 1000, 0);
      h.spec_k = 6;
    }
    const char *bad = h_run(&h);
    if (!bad || !strstr(bad, cases[i].word))
      fail_msg("fault %d not caught as '%s': %s", cases[i].fault, cases[i].word, bad ? bad : "passed");
    printf("sharing fault %d caught: %s\n", cases[i].fault, bad);
    h_free(&h);
  }
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunked_prefill), cmocka_unit_test(test_stop_token),
      cmocka_unit_test(test_fcfs),            cmocka_unit_test(test_preemption),
      cmocka_unit_test(test_negative_controls), cmocka_unit_test(test_random_runs),
      cmocka_unit_test(test_random_runs_with_groups), cmocka_unit_test(test_sibling_group),
      cmocka_unit_test(test_sharing_faults_caught), cmocka_unit_test(test_random_runs_with_prefix_cache),
      cmocka_unit_test(test_random_runs_with_drafts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
