// The scheduler's and the block pool's API used directly, without the
// fake-model harness of test_scheduler.c: refusals of bad options, submits
// and updates, cancelling and releasing sequences, and the pool's reference
// counts; the pool's prefix cache (keys, LRU eviction, hits) and the
// scheduler's use of it (a repeated prompt starts after its cached blocks
// and never writes them); recurrent state slots (one per running sequence,
// freed on cancel, preemption and finish; no sharing with them); their
// rollback after a verification that rejects a draft (computed back to the
// verification's first position, the kept tokens planned again as the next
// chunk's `recompute`, their blocks kept), none when every draft is accepted.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/block_pool.h"
#include "engine/scheduler.h"
#include "test_util.h"

static tpr_sched_opts opts(int replicas, int64_t pool, int64_t bs, int64_t batch, int64_t tokens, int64_t max_seq) {
  return (tpr_sched_opts){.replicas = replicas, .pool_blocks = pool, .block_size = bs, .max_batch = batch,
                          .max_tokens = tokens, .max_seq = max_seq};
}

static void expect_invalid_status(tpr_status rc, tpr_status want, const char *word) {
  assert_int_equal(rc, want);
  if (!strstr(tpr_last_error(), word)) fail_msg("error '%s' does not name '%s'", tpr_last_error(), word);
}

static void expect_invalid(tpr_status rc, const char *word) { expect_invalid_status(rc, TPR_ERR_INVALID_ARG, word); }

// One step: plan, then apply with token 7 sampled wherever a chunk samples.
static tpr_sched_step plan_and_apply(tpr_sched *s) {
  tpr_sched_step st;
  TT_OK(tpr_sched_next(s, &st));
  int32_t *sampled[1] = {calloc((size_t)(st.n_chunks ? st.n_chunks[0] : 0) + 1, sizeof(int32_t))};
  for (int64_t i = 0; i < (st.n_chunks ? st.n_chunks[0] : 0); i++) sampled[0][i] = 7;
  if (st.tokens > 0) TT_OK(tpr_sched_update(s, &st, (const int32_t *const *)sampled));
  free(sampled[0]);
  return st;
}

// (g) Cancelling: a running sequence returns its blocks at once and is never
// planned again, a waiting one leaves the queue, the others run to their
// end; cancelling while a plan is pending, or an unknown id, is refused.
static void test_cancel(void **state) {
  (void)state;
  tpr_sched *s;
  TT_OK(tpr_sched_new(&(tpr_sched_opts){.replicas = 1, .pool_blocks = 8, .block_size = 4, .max_batch = 2,
                                         .max_tokens = 64, .max_seq = 64},
                      &s));  // 8 blocks of 4, 2 sequences at a time
  int32_t p[12];
  for (int i = 0; i < 12; i++) p[i] = (int32_t)tt_randint(0, 999);
  int64_t id[3];
  for (int i = 0; i < 3; i++) TT_OK(tpr_sched_submit(s, p, 12, 8, -1, &id[i]));
  plan_and_apply(s);  // 0 and 1 admitted (batch 2), 2 waits
  int64_t held = tpr_sched_blocks_in_use(s, 0);
  assert_true(held >= 6);  // 3 blocks of the 12-token prompt each
  tpr_sched_step st;
  TT_OK(tpr_sched_next(s, &st));
  assert_int_equal(tpr_sched_cancel(s, id[0]), TPR_ERR_INVALID_ARG);  // a plan is pending
  int32_t sampled[2] = {7, 7}, *sp[1] = {sampled};
  TT_OK(tpr_sched_update(s, &st, (const int32_t *const *)sp));
  held = tpr_sched_blocks_in_use(s, 0);
  TT_OK(tpr_sched_cancel(s, id[0]));  // running
  int64_t after = tpr_sched_blocks_in_use(s, 0);
  TT_OK(tpr_sched_cancel(s, id[2]));  // waiting: no blocks
  TT_OK(tpr_sched_cancel(s, id[2]));  // again: already finished
  assert_int_equal(tpr_sched_cancel(s, 99), TPR_ERR_INVALID_ARG);
  printf("cancel: blocks in use %lld -> %lld; %lld unfinished left\n", (long long)held, (long long)after,
         (long long)tpr_sched_unfinished(s));
  assert_true(after < held && after >= 3);  // sequence 1 keeps its own
  assert_int_equal(tpr_sched_unfinished(s), 1);
  for (int guard = 0; guard < 50 && tpr_sched_unfinished(s) > 0; guard++) {
    st = plan_and_apply(s);
    for (int64_t i = 0; i < (st.n_chunks ? st.n_chunks[0] : 0); i++)
      assert_int_equal(st.chunks[0][i].seq, id[1]);  // nothing planned for the cancelled ones
  }
  tpr_sched_seq_info si;
  TT_OK(tpr_sched_seq(s, id[1], &si));
  assert_true(si.finished && si.len == 12 + 8);
  TT_OK(tpr_sched_seq(s, id[0], &si));
  assert_true(si.finished && si.len == 12 + 2);  // the tokens it had when cancelled
  assert_int_equal(tpr_sched_blocks_in_use(s, 0), 0);
  tpr_sched_free(s);
}

// (g) Bad options, submits and updates are refused with a clear message.
static void test_bad_args(void **state) {
  (void)state;
  tpr_sched *s = NULL;
  const tpr_sched_opts good = opts(2, 4, 4, 2, 8, 32);
  struct { tpr_sched_opts o; const char *word; } bad_opts[] = {
      {opts(0, 4, 4, 2, 8, 32), "replicas"},   {opts(2, 0, 4, 2, 8, 32), "pool_blocks"},
      {opts(2, 1ll << 40, 4, 2, 8, 32), "pool_blocks"}, {opts(2, 4, 0, 2, 8, 32), "block_size"},
      {opts(2, 4, 4, -1, 8, 32), "max_batch"}, {opts(2, 4, 4, 2, 0, 32), "max_tokens"},
      {opts(2, 4, 4, 2, 8, 0), "max_seq"}};
  for (size_t i = 0; i < sizeof bad_opts / sizeof *bad_opts; i++) {
    expect_invalid(tpr_sched_new(&bad_opts[i].o, &s), bad_opts[i].word);
    assert_null(s);
  }
  TT_OK(tpr_sched_new(&good, &s));
  int32_t p[32] = {0};
  int64_t id = -1;
  expect_invalid(tpr_sched_submit(s, p, 0, 4, -1, &id), "empty prompt");
  expect_invalid(tpr_sched_submit(s, NULL, 3, 4, -1, &id), "NULL prompt");
  expect_invalid(tpr_sched_submit(s, p, 3, 0, -1, &id), "max_new");
  expect_invalid(tpr_sched_submit(s, p, 3, 4, -2, &id), "stop_token");
  expect_invalid(tpr_sched_submit(s, p, 20, 13, -1, &id), "max_seq");
  // 4 blocks x 4 = 16 rows: 16 + 1 tokens fit (16 rows), 16 + 2 do not.
  expect_invalid(tpr_sched_submit(s, p, 16, 2, -1, &id), "too small for one sequence");
  expect_invalid(tpr_sched_submit(s, p, 17, 1, -1, &id), "too small for one sequence");
  assert_int_equal(tpr_sched_unfinished(s), 0);
  TT_OK(tpr_sched_submit(s, p, 16, 1, -1, &id));
  assert_int_equal(id, 0);
  TT_OK(tpr_sched_submit(s, p, 3, 4, -1, &id));
  assert_int_equal(id, 1);
  tpr_sched_seq_info in;
  expect_invalid(tpr_sched_seq(s, 2, &in), "id 2");
  assert_int_equal(tpr_sched_blocks_in_use(s, 2), -1);

  tpr_sched_step st, none = {.replicas = 2};
  expect_invalid(tpr_sched_update(s, &(tpr_sched_step){.replicas = 2, .tokens = 1}, NULL), "no planned step");
  TT_OK(tpr_sched_next(s, &st));
  assert_int_equal(st.tokens, 8 + 3);  // seq 0 chunked to max_tokens on replica 0, seq 1 whole on replica 1
  expect_invalid(tpr_sched_next(s, &none), "not applied");
  // A copy with one chunk changed is not the planned step.
  tpr_sched_chunk edited[1] = {st.chunks[0][0]};
  edited[0].n--;
  const tpr_sched_chunk *ptrs[2] = {edited, st.chunks[1]};
  tpr_sched_step copy = st;
  copy.chunks = ptrs;
  expect_invalid(tpr_sched_update(s, &copy, NULL), "differs from the last plan");
  expect_invalid(tpr_sched_update(s, &st, NULL), "no sampled tokens");  // seq 1 samples
  int32_t t1 = 7;
  const int32_t *sampled[2] = {NULL, &t1};
  edited[0].n++;  // an exact copy is accepted
  TT_OK(tpr_sched_update(s, &copy, sampled));
  TT_OK(tpr_sched_seq(s, 1, &in));
  assert_int_equal(in.len, 4);
  assert_int_equal(in.tokens[3], 7);
  tpr_sched_free(s);
  printf("bad args: %zu option errors, 7 submit errors, 4 update/next errors refused with their messages\n",
         sizeof bad_opts / sizeof *bad_opts);
}

// Reference counts: a block shared by three holders returns to the free
// list with the last give only; giving a free block, sharing a free block
// and foreign ids are refused; LIFO order holds.
static void test_block_pool_refs(void **state) {
  (void)state;
  tpr_block_pool p;
  TT_OK(tpr_block_pool_init(&p, 4));
  int32_t a, b;
  TT_OK(tpr_block_pool_take(&p, &a));
  TT_OK(tpr_block_pool_take(&p, &b));
  assert_true(a == 0 && b == 1);
  TT_OK(tpr_block_pool_share(&p, a));
  TT_OK(tpr_block_pool_share(&p, a));
  assert_int_equal(tpr_block_pool_refs(&p, a), 3);
  assert_int_equal(tpr_block_pool_used(&p), 2);
  TT_OK(tpr_block_pool_give(&p, a));
  TT_OK(tpr_block_pool_give(&p, a));
  assert_int_equal(tpr_block_pool_free(&p), 2);  // still held once
  TT_OK(tpr_block_pool_give(&p, a));
  assert_int_equal(tpr_block_pool_free(&p), 3);
  expect_invalid_status(tpr_block_pool_give(&p, a), TPR_ERR_INTERNAL, "not in use");   // double free
  expect_invalid_status(tpr_block_pool_share(&p, a), TPR_ERR_INTERNAL, "not in use");  // sharing a free block
  expect_invalid_status(tpr_block_pool_give(&p, 4), TPR_ERR_INTERNAL, "not in use");   // foreign id
  expect_invalid_status(tpr_block_pool_give(&p, -1), TPR_ERR_INTERNAL, "not in use");
  assert_int_equal(tpr_block_pool_refs(&p, 9), -1);
  int32_t c;
  TT_OK(tpr_block_pool_take(&p, &c));
  assert_int_equal(c, a);  // the block freed last comes back first
  tpr_block_pool_destroy(&p);
}

// Releasing: a finished sequence's results are refused afterwards, an
// unfinished one cannot be released, ids are never reused.
// Plans a step (its chunks readable until apply_planned), then applies it.
static tpr_sched_step plan_only(tpr_sched *s) {
  tpr_sched_step st;
  TT_OK(tpr_sched_next(s, &st));
  return st;
}
static void apply_planned(tpr_sched *s, const tpr_sched_step *st) {
  int32_t sampled[64], *sp[1] = {sampled};
  for (int i = 0; i < 64; i++) sampled[i] = 7;
  TT_OK(tpr_sched_update(s, st, (const int32_t *const *)sp));
}

// The pool's prefix cache: lookups match whole keys only; a registered
// block freed by its last holder stays free-but-cached; takes use plain
// free blocks first, then evict the least recently freed cached block; a
// hit revives a cached free block or adds a holder to a held one; a second
// block with a key already registered is not registered.
static void test_block_pool_cache(void **state) {
  (void)state;
  tpr_block_pool p;
  TT_OK(tpr_block_pool_init(&p, 4));
  TT_OK(tpr_block_pool_cache_init(&p, 2));
  int32_t t[3][2] = {{1, 2}, {3, 4}, {5, 6}}, b[4];
  for (int i = 0; i < 3; i++) TT_OK(tpr_block_pool_take(&p, &b[i]));  // 0, 1, 2
  uint64_t h0 = tpr_block_pool_hash(&p, 0, t[0]), h1 = tpr_block_pool_hash(&p, h0, t[1]);
  uint64_t h2 = tpr_block_pool_hash(&p, h1, t[2]);
  TT_OK(tpr_block_pool_register(&p, b[0], h0, 0, t[0]));
  TT_OK(tpr_block_pool_register(&p, b[1], h1, h0, t[1]));
  TT_OK(tpr_block_pool_register(&p, b[2], h1, h0, t[1]));  // the same key again: b[1] keeps it
  assert_int_equal(tpr_block_pool_cached(&p), 2);
  assert_int_equal(tpr_block_pool_lookup(&p, h1, h0, t[1]), b[1]);
  assert_int_equal(tpr_block_pool_lookup(&p, h0, 0, t[0]), b[0]);
  assert_int_equal(tpr_block_pool_lookup(&p, tpr_block_pool_hash(&p, 0, t[1]), 0, t[1]), -1);  // another parent
  int32_t other[2] = {1, 3};
  assert_int_equal(tpr_block_pool_lookup(&p, tpr_block_pool_hash(&p, 0, other), 0, other), -1);  // another token
  assert_int_equal(tpr_block_pool_lookup(&p, h2, h1, t[2]), -1);  // never registered
  assert_int_equal(tpr_block_pool_register(&p, 3, h2, h1, t[2]), TPR_ERR_INTERNAL);  // block 3 is free
  // Freed: 1 then 0 become cached free (LRU: 1, 0), 2 plain free.
  for (int i = 2; i >= 0; i--) TT_OK(tpr_block_pool_give(&p, b[i]));
  assert_int_equal(tpr_block_pool_free(&p), 4);
  assert_int_equal(tpr_block_pool_used(&p), 0);
  assert_int_equal(tpr_block_pool_cached(&p), 2);
  // A hit on cached free block 0: one holder, no longer free; a second hit shares it.
  TT_OK(tpr_block_pool_hit(&p, b[0]));
  assert_int_equal(tpr_block_pool_refs(&p, b[0]), 1);
  assert_int_equal(tpr_block_pool_free(&p), 3);
  TT_OK(tpr_block_pool_hit(&p, b[0]));
  assert_int_equal(tpr_block_pool_refs(&p, b[0]), 2);
  assert_int_equal(tpr_block_pool_hit(&p, b[2]), TPR_ERR_INTERNAL);  // not registered
  // Takes: the plain free ones first (2, then 3), then evict block 1 (LRU).
  TT_OK(tpr_block_pool_take(&p, &b[3]));
  assert_int_equal(b[3], b[2]);
  TT_OK(tpr_block_pool_take(&p, &b[3]));
  assert_int_equal(b[3], 3);
  assert_int_equal(tpr_block_pool_lookup(&p, h1, h0, t[1]), b[1]);
  TT_OK(tpr_block_pool_take(&p, &b[3]));
  assert_int_equal(b[3], b[1]);
  assert_int_equal(tpr_block_pool_lookup(&p, h1, h0, t[1]), -1);  // evicted
  assert_int_equal(tpr_block_pool_cached(&p), 1);
  assert_int_equal(tpr_block_pool_take(&p, &b[3]), TPR_ERR_INTERNAL);  // block 0 is held: nothing left
  tpr_block_pool_destroy(&p);
}

// The scheduler with the cache: a prompt run again starts after its whole
// cached blocks (at least its last token is computed), holding the first
// run's blocks; a third copy admitted while the second runs shares them too
// and neither writes below its start; without the cache nothing is reused.
static void test_sched_prefix_cache(void **state) {
  (void)state;
  for (int cache = 0; cache < 2; cache++) {
    tpr_sched_opts o = opts(1, 16, 4, 4, 64, 64);
    o.prefix_cache = cache;
    tpr_sched *s;
    TT_OK(tpr_sched_new(&o, &s));
    int32_t p[14];
    for (int i = 0; i < 14; i++) p[i] = (int32_t)tt_randint(0, 999);
    int64_t id[3];
    TT_OK(tpr_sched_submit(s, p, 14, 2, -1, &id[0]));
    while (tpr_sched_unfinished(s) > 0) plan_and_apply(s);
    int64_t q, h;
    tpr_sched_prefix_stats(s, &q, &h);
    assert_int_equal(q, cache ? 14 : 0);
    assert_int_equal(h, 0);
    assert_int_equal(tpr_sched_cached_blocks(s, 0), cache ? 3 : 0);  // 15 rows written: 3 whole blocks
    assert_int_equal(tpr_sched_blocks_in_use(s, 0), 0);
    TT_OK(tpr_sched_submit(s, p, 14, 3, -1, &id[1]));
    tpr_sched_step st = plan_only(s);
    assert_int_equal(st.n_chunks[0], 1);
    assert_int_equal(st.chunks[0][0].pos0, cache ? 12 : 0);  // floor(13 / 4) = 3 blocks cached
    apply_planned(s, &st);
    tpr_sched_seq_info in;
    TT_OK(tpr_sched_seq(s, id[1], &in));
    assert_int_equal(in.cached_blocks, cache ? 3 : 0);
    TT_OK(tpr_sched_submit(s, p, 14, 3, -1, &id[2]));
    st = plan_only(s);  // id[1] decodes, id[2] is admitted on the same blocks
    assert_int_equal(st.n_chunks[0], 2);
    for (int64_t i = 0; i < st.n_chunks[0]; i++) {
      const tpr_sched_chunk *c = &st.chunks[0][i];
      assert_true(c->pos0 >= (cache ? 12 : 0));  // nobody writes below its cached blocks
      if (c->seq != id[2]) continue;
      assert_int_equal(c->pos0, cache ? 12 : 0);
      for (int64_t b = 0; cache && b < 3; b++) assert_int_equal(tpr_sched_block_refs(s, 0, c->blocks[b]), 2);
    }
    apply_planned(s, &st);
    tpr_sched_prefix_stats(s, &q, &h);
    assert_int_equal(h, cache ? 24 : 0);
    while (tpr_sched_unfinished(s) > 0) plan_and_apply(s);
    assert_int_equal(tpr_sched_blocks_in_use(s, 0), 0);
    tpr_sched_free(s);
  }
}

static void test_release(void **state) {
  (void)state;
  tpr_sched *s;
  TT_OK(tpr_sched_new(&(tpr_sched_opts){.replicas = 1, .pool_blocks = 8, .block_size = 4, .max_batch = 2,
                                         .max_tokens = 64, .max_seq = 64},
                      &s));
  int32_t p[5] = {1, 2, 3, 4, 5};
  int64_t a, b, c;
  TT_OK(tpr_sched_submit(s, p, 5, 1, -1, &a));
  TT_OK(tpr_sched_submit(s, p, 5, 3, -1, &b));
  plan_and_apply(s);  // a finishes (max_new 1), b goes on
  expect_invalid(tpr_sched_release(s, b), "not finished");
  TT_OK(tpr_sched_release(s, a));
  tpr_sched_seq_info in;
  expect_invalid(tpr_sched_seq(s, a, &in), "released");
  expect_invalid(tpr_sched_release(s, a), "released");
  expect_invalid(tpr_sched_release(s, 7), "no sequence");
  TT_OK(tpr_sched_cancel(s, a));  // finished: left as it is
  TT_OK(tpr_sched_submit(s, p, 5, 1, -1, &c));
  assert_int_equal(c, 2);  // a's id stays taken
  while (tpr_sched_unfinished(s) > 0) plan_and_apply(s);
  TT_OK(tpr_sched_release(s, b));
  TT_OK(tpr_sched_release(s, c));
  assert_int_equal(tpr_sched_blocks_in_use(s, 0), 0);
  tpr_sched_free(s);
  printf("release: results refused after, unfinished refused, ids kept increasing (next id %lld)\n", (long long)c);
}

// (s) Recurrent state slots (a hybrid model): a running sequence holds one
// slot, the same in every chunk until it is preempted, cancelled or
// finished; slots in use = running sequences at every step; a waiting
// sequence is admitted only when a slot is free, though the batch has room;
// a cancel frees the slot at once and the next admission takes it; a pool
// too small preempts and frees the victim's slot; siblings share no blocks
// with slots on; the prefix cache with slots is refused.
// One step (plan, check, apply as plan_and_apply does); returns its chunk count.
static int64_t slot_step(tpr_sched *s, int64_t *slot_of, int64_t n_seqs, bool no_sharing) {
  tpr_sched_step st;
  TT_OK(tpr_sched_next(s, &st));
  const int64_t n = st.n_chunks[0];
  bool used[8] = {false};
  for (int64_t i = 0; i < n; i++) {
    const tpr_sched_chunk *c = &st.chunks[0][i];
    assert_true(c->state_slot >= 0 && c->state_slot < 8 && !used[c->state_slot]);
    used[c->state_slot] = true;
    assert_true(c->seq < n_seqs);
    if (c->first) {
      assert_int_equal(c->pos0, 0);  // with slots, every admission starts at position 0
      slot_of[c->seq] = c->state_slot;
    }
    assert_int_equal(c->state_slot, slot_of[c->seq]);
    tpr_sched_seq_info si;
    TT_OK(tpr_sched_seq(s, c->seq, &si));
    if (no_sharing) assert_int_equal(si.shared_blocks, 0);
  }
  assert_int_equal(tpr_sched_state_slots_in_use(s, 0), tpr_sched_unfinished(s) - tpr_sched_waiting(s));
  int32_t sampled[8] = {7, 7, 7, 7, 7, 7, 7, 7};
  const int32_t *sp[1] = {sampled};
  if (st.tokens > 0) TT_OK(tpr_sched_update(s, &st, sp));
  return n;
}

static void test_state_slots(void **state) {
  (void)state;
  tpr_sched_opts o = opts(1, 64, 4, 4, 64, 32);
  o.state_slots = 2;
  o.prefix_cache = true;
  tpr_sched *s = NULL;
  expect_invalid(tpr_sched_new(&o, &s), "prefix cache");
  o.prefix_cache = false;
  o.state_slots = -1;
  expect_invalid(tpr_sched_new(&o, &s), "state_slots");
  o.state_slots = 2;
  TT_OK(tpr_sched_new(&o, &s));
  const int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
  int64_t id, slot_of[8];
  for (int i = 0; i < 3; i++) TT_OK(tpr_sched_submit(s, prompt, 6, 3, -1, &id));
  assert_int_equal(slot_step(s, slot_of, 3, true), 2);  // the third waits for a slot, not for the batch
  assert_int_equal(tpr_sched_waiting(s), 1);
  assert_int_equal(tpr_sched_state_slots_in_use(s, 0), 2);
  int64_t freed = slot_of[0];
  TT_OK(tpr_sched_cancel(s, 0));
  assert_int_equal(tpr_sched_state_slots_in_use(s, 0), 1);
  slot_step(s, slot_of, 3, true);
  assert_int_equal(slot_of[2], freed);  // admitted into the cancelled sequence's slot
  while (tpr_sched_unfinished(s) > 0) slot_step(s, slot_of, 3, true);
  assert_int_equal(tpr_sched_state_slots_in_use(s, 0), 0);
  // Siblings: every one computes its whole prompt (no shared blocks).
  int64_t first;
  const int64_t max_new[3] = {2, 2, 2};
  const int32_t stops[3] = {-1, -1, -1};
  const int32_t long_prompt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  TT_OK(tpr_sched_submit_n(s, long_prompt, 10, max_new, stops, 3, &first));
  int64_t slot_n[8];
  while (tpr_sched_unfinished(s) > 0) slot_step(s, slot_n, 8, true);
  tpr_sched_free(s);
  // A pool of 5 blocks for two sequences of up to 13 tokens: preemption frees the victim's slot.
  o = opts(1, 5, 4, 2, 64, 32);
  o.state_slots = 2;
  TT_OK(tpr_sched_new(&o, &s));
  for (int i = 0; i < 2; i++) TT_OK(tpr_sched_submit(s, long_prompt, 10, 4, -1, &id));
  int64_t slot_p[8];
  while (tpr_sched_unfinished(s) > 0) slot_step(s, slot_p, 2, true);
  printf("state slots: %lld preemptions with 5 blocks, slots in use = running sequences at every step\n",
         (long long)tpr_sched_preemptions(s));
  assert_true(tpr_sched_preemptions(s) > 0);
  assert_int_equal(tpr_sched_state_slots_in_use(s, 0), 0);
  tpr_sched_free(s);
}

// Plans one step of a single sequence and applies `out` as its sampled tokens.
static tpr_sched_chunk one_chunk(tpr_sched *s, const int32_t *out) {
  tpr_sched_step st;
  TT_OK(tpr_sched_next(s, &st));
  assert_int_equal(st.n_chunks[0], 1);
  tpr_sched_chunk c = st.chunks[0][0];
  const int32_t *sp[1] = {out};
  TT_OK(tpr_sched_update(s, &st, sp));
  return c;
}

static void test_state_rollback(void **state) {
  (void)state;
  tpr_sched_opts o = opts(1, 64, 4, 1, 64, 32);
  o.state_slots = 1;
  tpr_sched *s = NULL;
  TT_OK(tpr_sched_new(&o, &s));
  const int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
  int64_t id;
  TT_OK(tpr_sched_submit(s, prompt, 6, 12, -1, &id));
  const int32_t first[1] = {7};
  tpr_sched_chunk c = one_chunk(s, first);  // the prompt: len 7, 6 rows computed
  assert_int_equal(c.n, 6);
  // Three drafts, the first accepted, the second rejected (the target gave 99).
  const int32_t drafts[3] = {11, 12, 13}, out[4] = {11, 99, -1, -1};
  TT_OK(tpr_sched_set_draft(s, id, drafts, 3));
  c = one_chunk(s, out);
  assert_int_equal(c.pos0, 6), assert_int_equal(c.n, 4), assert_int_equal(c.n_draft, 3);
  assert_int_equal(c.recompute, 0);
  tpr_sched_spec_stats sp = tpr_sched_spec(s);
  assert_int_equal(sp.rollbacks, 1);
  assert_int_equal(tpr_sched_blocks_in_use(s, 0), 2);  // rows 0..7 (the kept ones) stay: 2 blocks of 4
  // The next chunk runs the kept tokens 7 and 11 again, then the new 99.
  const int32_t next[1] = {5};
  TT_OK(tpr_sched_set_draft(s, id, drafts, 3));  // no drafts for it: it is not a single-token decode
  c = one_chunk(s, next);
  assert_int_equal(c.pos0, 6), assert_int_equal(c.n, 3), assert_int_equal(c.recompute, 2);
  assert_int_equal(c.n_draft, 0), assert_true(c.sample);
  assert_int_equal(c.tokens[0], 7), assert_int_equal(c.tokens[1], 11), assert_int_equal(c.tokens[2], 99);
  assert_int_equal(tpr_sched_spec(s).recomputed, 2);
  // Every draft accepted: no rollback, the next step a plain decode.
  const int32_t d2[2] = {1, 2}, all[3] = {1, 2, 3};
  TT_OK(tpr_sched_set_draft(s, id, d2, 2));
  c = one_chunk(s, all);
  assert_int_equal(c.pos0, 9), assert_int_equal(c.n_draft, 2);
  const int32_t last[1] = {4};
  c = one_chunk(s, last);
  assert_int_equal(c.pos0, 12), assert_int_equal(c.n, 1), assert_int_equal(c.recompute, 0);
  sp = tpr_sched_spec(s);
  assert_int_equal(sp.rollbacks, 1), assert_int_equal(sp.recomputed, 2), assert_int_equal(sp.verifications, 2);
  assert_int_equal(sp.accepted, 3);
  tpr_sched_free(s);
  printf("state rollback: computed back to pos0, 2 kept tokens recomputed; none when every draft is accepted\n");
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_args), cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_block_pool_refs), cmocka_unit_test(test_release),
      cmocka_unit_test(test_block_pool_cache), cmocka_unit_test(test_sched_prefix_cache),
      cmocka_unit_test(test_state_slots), cmocka_unit_test(test_state_rollback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
