// The batched engine's scheduler (policy and API in engine/scheduler.h).
//
// Readings of the header where it leaves room, each chosen as vLLM's
// scheduler does it:
//  - "Too small for one sequence": a sequence of L = len + max_new tokens
//    writes KV rows for its first L - 1 tokens only (the last sampled token is
//    never fed back), so it needs ceil((L - 1) / block_size) blocks. A
//    sequence that fits is always finishable: the running sequence admitted
//    first is preempted last, so it can end up with the whole pool.
//  - A replica that preempted a sequence while planning a step admits no
//    waiting sequence in that step (vLLM V1: `if not preempted_reqs`), so a
//    sequence just preempted is not readmitted at once into the blocks freed
//    for a decode. The exception is a replica with nothing planned yet: a
//    step plans work for every replica that has unfinished sequences.
//  - Chunked prefill shrinks a chunk to the free blocks and never preempts
//    (the header's policy; vLLM preempts for prefills too). That cannot stall
//    a replica: a waiting sequence is admitted only after every earlier chunk
//    of the step ran to its sequence's last token (else the budget or the
//    free blocks are spent), so after any step at most one running sequence
//    per replica is mid-prompt (two or more tokens left). If it gets no
//    block, the others are decodes (which run, preempting if need be), or it
//    runs alone and holds less than a pool, which the submit check grants.
//    A replica with unfinished sequences and an empty plan is therefore a
//    bug, reported as TPR_ERR_INTERNAL.
//  - tpr_sched_next refuses to plan while the last non-empty plan has not been
//    applied: planning admits sequences and takes blocks, so a second plan of
//    the same state would be a different step (vLLM's schedule /
//    update_from_output alternate the same way). An empty plan needs no
//    update.
//  - Sibling groups (the header's policy): the leader's admission check and
//    the sibling's are the same single-sequence check, since a sibling's
//    table counts its shared blocks; "the first admitted is preempted last
//    and can end up with the whole pool" still holds, since once every
//    other holder of a shared block is preempted the block is its own.
//    Preempting a sibling that holds only shared blocks frees none; the
//    decode loop then preempts the next victim, as for any victim whose
//    blocks were not enough.
//  - Prefix cache: a sequence's cache hits are taken at its admission, in
//    plan_replica's step (3) (never for a running sequence), and hits that
//    are cached free count against the free blocks, so at least one free
//    block is left for the chunk that follows them: the stall argument
//    above holds with "free" meaning plain and cached free blocks alike.
//    Blocks are registered in tpr_sched_update, after the step that wrote
//    their last row, so a hit never reads a row of the step being planned.
//  - State rollback (scheduler.h, state_slots): a sequence rolled back is
//    mid-"prompt" again (its kept tokens and the new one are left), so
//    several running sequences may be so at once. The stall argument still
//    holds: it keeps the blocks of its kept rows, so its next chunk gets at
//    least those rows without a free block, and once they are recomputed it
//    is a decode, which may preempt.
//  - tpr_sched_update compares the step it is given (replicas, chunk counts,
//    each chunk's seq, pos0, n, sample) with the last plan, so a step copied
//    or broadcast and rebuilt is accepted, a stale or edited one refused.
#include "engine/scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "engine/block_pool.h"

typedef enum { SEQ_WAITING, SEQ_RUNNING, SEQ_FINISHED } seq_state;

typedef struct seq {
  int32_t *tokens;  // (cap) prompt then generated; len known
  int64_t len, cap, prompt_len;
  int64_t computed;  // tokens whose KV rows are written
  int32_t *blocks;   // (blocks_cap) block table; n_blocks in use
  int64_t n_blocks, blocks_cap;
  seq_state state;
  int replica;
  int64_t admitted;  // admission order (a counter over all replicas), set on each admission
  int64_t generated, max_new;
  int32_t stop;
  int64_t preemptions;
  int64_t leader;  // a sibling not yet admitted: its group's sequence 0; -1 otherwise
  int64_t shared;  // blocks held from the leader since admission (the first `shared` of the table)
  int64_t start;   // computed at admission: the first chunk begins there
  uint64_t *hashes;  // (hashes_cap) prefix cache: chain hashes of the table's first n_hashed blocks
  int64_t n_hashed, hashes_cap;
  int64_t cached;    // prefix-cache hits of the last admission (the first `cached` of the table)
  bool released;   // a tombstone: tokens and table freed (tpr_sched_release)
  int32_t slot;    // the recurrent state slot it holds while running (opts.state_slots), else -1
  int64_t n_draft; // speculative: draft tokens for the next step, at tokens[len..len + n_draft)
  bool drafts_later;  // the engine writes them after planning (tpr_sched_set_draft with NULL)
  // A hybrid model's state rollback (scheduler.h, state_slots): positions
  // [computed, redo) are recomputed from the restored state; 0 when none.
  int64_t redo;
} seq;

// Sequence ids in a fixed order (admission order for running, arrival =
// id order for waiting).
typedef struct id_list {
  int64_t *ids;
  int64_t n, cap;
} id_list;

typedef struct replica {
  tpr_block_pool pool;
  id_list running, waiting;
  int64_t unfinished;
  tpr_sched_chunk *chunks;  // (chunks_cap) the last plan's chunks; n_chunks used
  int64_t n_chunks, chunks_cap;
  int32_t *free_slots;  // (opts.state_slots) free state slots, a LIFO; n_free_slots of them
  int64_t n_free_slots;
} replica;

struct tpr_sched {
  tpr_sched_opts o;
  seq *seqs;  // (seqs_cap) indexed by id
  int64_t n_seqs, seqs_cap;
  replica *reps;                  // (replicas)
  int64_t *n_chunks_out;          // (replicas)
  const tpr_sched_chunk **chunks_out;  // (replicas)
  int64_t admit_counter, preemptions, unfinished;
  int64_t prefix_queried, prefix_hit;  // tokens looked up in the prefix cache, and found
  int64_t drafted, accepted, verifications;  // speculative decoding so far (tpr_sched_spec_stats)
  int64_t rollbacks, recomputed;             // state rollbacks, and tokens planned again after them
  bool pending;  // a non-empty plan awaits tpr_sched_update
};

static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// Grows *p (elements of `size` bytes, capacity *cap) to hold at least `need`.
static tpr_status grow(void **p, int64_t *cap, int64_t need, size_t size, const char *what) {
  if (need <= *cap) return TPR_OK;
  int64_t c = *cap ? *cap : 8;
  while (c < need) c = c > INT64_MAX / 2 ? need : c * 2;
  if ((uint64_t)c > SIZE_MAX / size) return TPR_FAIL(TPR_ERR_OOM, "tpr_sched: %s of %lld entries is too large", what, (long long)c);
  void *q = realloc(*p, (size_t)c * size);
  if (!q) return TPR_FAIL(TPR_ERR_OOM, "tpr_sched: no memory for %s of %lld entries", what, (long long)c);
  *p = q;
  *cap = c;
  return TPR_OK;
}

static tpr_status list_insert(id_list *l, int64_t at, int64_t id) {
  TPR_CHECK(grow((void **)&l->ids, &l->cap, l->n + 1, sizeof *l->ids, "a sequence list"));
  memmove(l->ids + at + 1, l->ids + at, (size_t)(l->n - at) * sizeof *l->ids);
  l->ids[at] = id;
  l->n++;
  return TPR_OK;
}

static void list_remove(id_list *l, int64_t id) {
  for (int64_t i = 0; i < l->n; i++)
    if (l->ids[i] == id) {
      memmove(l->ids + i, l->ids + i + 1, (size_t)(l->n - i - 1) * sizeof *l->ids);
      l->n--;
      return;
    }
}

// Waiting queues are ordered by arrival, i.e. by id.
static tpr_status waiting_insert(id_list *l, int64_t id) {
  int64_t at = l->n;
  while (at > 0 && l->ids[at - 1] > id) at--;
  return list_insert(l, at, id);
}

tpr_status tpr_sched_new(const tpr_sched_opts *o, tpr_sched **out) {
  if (!o || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_new: NULL %s", o ? "out" : "options");
  *out = NULL;
  if (o->replicas < 1 || o->replicas > 65536)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_new: replicas %d not in [1, 65536]", o->replicas);
  if (o->pool_blocks < 1 || o->pool_blocks > INT32_MAX)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_new: pool_blocks %lld not in [1, %d] (block ids are int32)",
                    (long long)o->pool_blocks, INT32_MAX);
  if (o->block_size < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_new: block_size %lld must be >= 1", (long long)o->block_size);
  if (o->max_batch < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_new: max_batch %lld must be >= 1", (long long)o->max_batch);
  if (o->max_tokens < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_new: max_tokens %lld must be >= 1", (long long)o->max_tokens);
  if (o->max_seq < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_new: max_seq %lld must be >= 1", (long long)o->max_seq);
  if (o->state_slots < 0 || o->state_slots > INT32_MAX)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_new: state_slots %lld not in [0, %d]", (long long)o->state_slots,
                    INT32_MAX);
  if (o->state_slots > 0 && o->prefix_cache)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_new: the prefix cache with recurrent state slots (a cached "
                    "block holds KV rows, not the state at its end: a hybrid model runs without prefix caching)");
  tpr_sched *s = calloc(1, sizeof *s);
  if (!s) return TPR_FAIL(TPR_ERR_OOM, "tpr_sched_new: no memory");
  s->o = *o;
  s->reps = calloc((size_t)o->replicas, sizeof *s->reps);
  s->n_chunks_out = calloc((size_t)o->replicas, sizeof *s->n_chunks_out);
  s->chunks_out = calloc((size_t)o->replicas, sizeof *s->chunks_out);
  if (!s->reps || !s->n_chunks_out || !s->chunks_out) {
    tpr_sched_free(s);
    return TPR_FAIL(TPR_ERR_OOM, "tpr_sched_new: no memory for %d replicas", o->replicas);
  }
  for (int r = 0; r < o->replicas; r++) {
    tpr_status rc = tpr_block_pool_init(&s->reps[r].pool, o->pool_blocks);
    if (rc == TPR_OK && o->state_slots > 0) {
      replica *rp = &s->reps[r];
      if (!(rp->free_slots = malloc((size_t)o->state_slots * sizeof *rp->free_slots)))
        rc = TPR_FAIL(TPR_ERR_OOM, "tpr_sched_new: state slots");
      // Highest first, so slot 0 is handed out first.
      for (int64_t i = 0; rc == TPR_OK && i < o->state_slots; i++) rp->free_slots[i] = (int32_t)(o->state_slots - 1 - i);
      rp->n_free_slots = o->state_slots;
    }
    if (rc == TPR_OK && o->prefix_cache) {
      rc = tpr_block_pool_cache_init(&s->reps[r].pool, o->block_size);
      s->reps[r].pool.debug_first_token_only = o->debug_fault == TPR_SCHED_FAULT_PREFIX_FIRST_TOKEN;
    }
    if (rc != TPR_OK) {
      tpr_sched_free(s);
      return tpr__propagate(rc, __FILE__, __LINE__);
    }
  }
  *out = s;
  return TPR_OK;
}

void tpr_sched_free(tpr_sched *s) {
  if (!s) return;
  for (int64_t i = 0; i < s->n_seqs; i++) {
    free(s->seqs[i].tokens);
    free(s->seqs[i].blocks);
    free(s->seqs[i].hashes);
  }
  free(s->seqs);
  if (s->reps)
    for (int r = 0; r < s->o.replicas; r++) {
      tpr_block_pool_destroy(&s->reps[r].pool);
      free(s->reps[r].running.ids);
      free(s->reps[r].waiting.ids);
      free(s->reps[r].chunks);
      free(s->reps[r].free_slots);
    }
  free(s->reps);
  free(s->n_chunks_out);
  free(s->chunks_out);
  free(s);
}

tpr_status tpr_sched_check_submit(const tpr_sched_opts *o, const int32_t *prompt, int64_t len, int64_t max_new,
                                  int32_t stop_token) {
  if (len < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_submit: empty prompt (len %lld)", (long long)len);
  if (!prompt) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_submit: NULL prompt of len %lld", (long long)len);
  if (max_new < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_submit: max_new %lld must be >= 1", (long long)max_new);
  if (stop_token < -1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_submit: stop_token %d must be >= 0, or -1 for none", stop_token);
  if (len > o->max_seq || max_new > o->max_seq - len)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_submit: prompt len %lld + max_new %lld exceeds max_seq %lld",
                    (long long)len, (long long)max_new, (long long)o->max_seq);
  int64_t rows = len + max_new - 1;  // KV rows ever written: the last sampled token is never fed
  if (ceil_div(rows, o->block_size) > o->pool_blocks)
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "tpr_sched_submit: the KV pool of %lld blocks x %lld tokens is too small for one sequence of "
                    "%lld tokens (prompt %lld + max_new %lld needs %lld blocks)",
                    (long long)o->pool_blocks, (long long)o->block_size, (long long)(len + max_new), (long long)len,
                    (long long)max_new, (long long)ceil_div(rows, o->block_size));
  return TPR_OK;
}

tpr_status tpr_sched_submit(tpr_sched *s, const int32_t *prompt, int64_t len, int64_t max_new, int32_t stop_token,
                            int64_t *id) {
  return tpr_sched_submit_n(s, prompt, len, &max_new, &stop_token, 1, id);
}

tpr_status tpr_sched_submit_n(tpr_sched *s, const int32_t *prompt, int64_t len, const int64_t *max_new,
                              const int32_t *stop_token, int64_t n, int64_t *first_id) {
  if (!s || !first_id || !max_new || !stop_token)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_submit: NULL %s", s ? "argument" : "scheduler");
  if (n < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_submit_n: n %lld must be >= 1", (long long)n);
  for (int64_t i = 0; i < n; i++) TPR_CHECK(tpr_sched_check_submit(&s->o, prompt, len, max_new[i], stop_token[i]));
  // The group goes where its first sequence would: siblings share its pool.
  int best = 0;
  for (int r = 1; r < s->o.replicas; r++)
    if (s->reps[r].unfinished < s->reps[best].unfinished) best = r;
  replica *rp = &s->reps[best];
  // Everything that can fail is allocated before anything is added.
  TPR_CHECK(grow((void **)&s->seqs, &s->seqs_cap, s->n_seqs + n, sizeof *s->seqs, "the sequence table"));
  TPR_CHECK(grow((void **)&rp->waiting.ids, &rp->waiting.cap, rp->waiting.n + n, sizeof *rp->waiting.ids,
                 "a sequence list"));
  seq *added = s->seqs + s->n_seqs;
  for (int64_t i = 0; i < n; i++) {
    added[i] = (seq){.len = len, .prompt_len = len, .state = SEQ_WAITING, .replica = best, .admitted = -1, .slot = -1,
                     .max_new = max_new[i], .stop = stop_token[i], .leader = i > 0 ? s->n_seqs : -1};
    int64_t first_cap = len + (max_new[i] < 16 ? max_new[i] : 16);
    tpr_status rc = grow((void **)&added[i].tokens, &added[i].cap, first_cap, sizeof *added[i].tokens, "a token list");
    if (rc != TPR_OK) {
      while (i-- > 0) free(added[i].tokens);
      return tpr__propagate(rc, __FILE__, __LINE__);
    }
    memcpy(added[i].tokens, prompt, (size_t)len * sizeof *prompt);
  }
  *first_id = s->n_seqs;
  for (int64_t i = 0; i < n; i++) TPR_CHECK(waiting_insert(&rp->waiting, s->n_seqs++));  // room reserved: cannot fail
  rp->unfinished += n;
  s->unfinished += n;
  return TPR_OK;
}

static tpr_status release_blocks(tpr_sched *s, seq *q) {
  tpr_block_pool *pool = &s->reps[q->replica].pool;
  // Given back last to first so the LIFO hands them out again in table order.
  for (int64_t i = q->n_blocks - 1; i >= 0; i--) {
    if (s->o.debug_fault == TPR_SCHED_FAULT_FREE_SHARED)  // negative control: drop the other holders too
      while (tpr_block_pool_refs(pool, q->blocks[i]) > 1) TPR_CHECK(tpr_block_pool_give(pool, q->blocks[i]));
    TPR_CHECK(tpr_block_pool_give(pool, q->blocks[i]));
  }
  q->n_blocks = 0;
  q->shared = q->cached = q->n_hashed = 0;
  return TPR_OK;
}

// A running sequence's state slot back to its replica's free slots.
static void release_slot(tpr_sched *s, seq *q) {
  if (q->slot < 0) return;
  replica *rp = &s->reps[q->replica];
  rp->free_slots[rp->n_free_slots++] = q->slot;
  q->slot = -1;
}

// Preemption by recompute: the KV rows and the state are dropped, the tokens kept.
static tpr_status preempt(tpr_sched *s, int64_t id) {
  seq *q = &s->seqs[id];
  replica *rp = &s->reps[q->replica];
  TPR_CHECK(release_blocks(s, q));
  release_slot(s, q);
  q->computed = q->start = q->redo = 0;
  q->leader = -1;  // recomputes its whole prompt as any sequence does
  q->state = SEQ_WAITING;
  q->preemptions++;
  s->preemptions++;
  list_remove(&rp->running, id);
  return waiting_insert(&rp->waiting, id);
}

// The most tokens (<= want) of q's next chunk that its blocks plus `free`
// more hold. Written to avoid (n_blocks + free) * block_size overflowing.
static int64_t fit_tokens(const seq *q, int64_t want, int64_t free, int64_t bs) {
  int64_t need = ceil_div(q->computed + want, bs) - q->n_blocks;
  if (need <= free) return want;
  // (n_blocks + free) * bs < computed + want here, so no overflow.
  return (q->n_blocks + free) * bs - q->computed;
}

// Appends q's next chunk of n tokens, taking the blocks it needs.
static tpr_status add_chunk(tpr_sched *s, replica *rp, int64_t id, int64_t n) {
  seq *q = &s->seqs[id];
  int64_t nb = ceil_div(q->computed + n, s->o.block_size);
  TPR_CHECK(grow((void **)&q->blocks, &q->blocks_cap, nb, sizeof *q->blocks, "a block table"));
  while (q->n_blocks < nb) TPR_CHECK(tpr_block_pool_take(&rp->pool, &q->blocks[q->n_blocks++]));
  TPR_CHECK(grow((void **)&rp->chunks, &rp->chunks_cap, rp->n_chunks + 1, sizeof *rp->chunks, "a step's chunks"));
  const int64_t redo = q->redo > q->computed ? (q->redo - q->computed < n ? q->redo - q->computed : n) : 0;
  s->recomputed += redo;
  rp->chunks[rp->n_chunks++] = (tpr_sched_chunk){
      .seq = id, .pos0 = q->computed, .n = n, .tokens = q->tokens + q->computed,
      .sample = q->computed + n == q->len, .first = q->computed == q->start, .blocks = q->blocks, .n_blocks = q->n_blocks,
      .state_slot = q->slot, .recompute = redo};
  return TPR_OK;
}

// A sibling at the head of the waiting queue (scheduler.h): the leader's
// blocks it takes on admission (> 0), SIBLING_WAITS while the leader has not
// computed them yet, or 0: it runs as an ordinary sequence from now on.
enum { SIBLING_WAITS = -1 };
static int64_t sibling_share(tpr_sched *s, seq *q) {
  if (q->leader < 0) return 0;
  if (s->o.state_slots > 0) {  // the leader's blocks come without the state at their end
    q->leader = -1;
    return 0;
  }
  const seq *l = &s->seqs[q->leader];
  const int64_t k = (q->prompt_len - 1) / s->o.block_size;
  // A leader waiting and never preempted would be ahead of its sibling in
  // the queue (lower id), so it is not waited on: that is never needed.
  if (k == 0 || l->state != SEQ_RUNNING || l->preemptions > 0) {
    q->leader = -1;
    return 0;
  }
  return l->computed >= k * s->o.block_size ? k : SIBLING_WAITS;
}

// Admits q holding its leader's first k blocks, computed = k * block_size.
static tpr_status admit_sharing(tpr_sched *s, replica *rp, seq *q, int64_t k) {
  const seq *l = &s->seqs[q->leader];
  TPR_CHECK(grow((void **)&q->blocks, &q->blocks_cap, k, sizeof *q->blocks, "a block table"));
  for (int64_t b = 0; b < k; b++) {
    TPR_CHECK(tpr_block_pool_share(&rp->pool, l->blocks[b]));
    q->blocks[b] = l->blocks[b];
  }
  q->n_blocks = q->shared = k;
  q->computed = k * s->o.block_size;
  if (s->o.debug_fault == TPR_SCHED_FAULT_WRITE_SHARED) q->computed--;  // negative control
  q->leader = -1;
  return TPR_OK;
}

// Prefix cache: admits q (computed 0) holding the registered blocks of the
// longest prefix of its first floor((len - 1) / block_size) whole blocks,
// keeping one free block for the rest of its tokens (scheduler.h).
static tpr_status admit_cached(tpr_sched *s, replica *rp, seq *q) {
  const int64_t bs = s->o.block_size, k = (q->len - 1) / bs;
  tpr_block_pool *pool = &rp->pool;
  TPR_CHECK(grow((void **)&q->blocks, &q->blocks_cap, k, sizeof *q->blocks, "a block table"));
  TPR_CHECK(grow((void **)&q->hashes, &q->hashes_cap, k, sizeof *q->hashes, "a hash list"));
  int64_t hits = 0, free_hits = 0;
  for (uint64_t parent = 0; hits < k; hits++) {
    const int32_t *toks = q->tokens + hits * bs;
    uint64_t h = tpr_block_pool_hash(pool, parent, toks);
    int32_t id = tpr_block_pool_lookup(pool, h, parent, toks);
    if (id < 0) break;
    q->blocks[hits] = id, q->hashes[hits] = parent = h;
    free_hits += tpr_block_pool_refs(pool, id) == 0;
  }
  // Cached free blocks taken here are no longer free: leave one for the rest.
  while (hits > 0 && tpr_block_pool_free(pool) - free_hits < 1)
    free_hits -= tpr_block_pool_refs(pool, q->blocks[--hits]) == 0;
  for (int64_t b = 0; b < hits; b++) TPR_CHECK(tpr_block_pool_hit(pool, q->blocks[b]));
  q->n_blocks = q->n_hashed = q->cached = hits;
  q->computed = hits * bs;
  s->prefix_queried += q->len;
  s->prefix_hit += q->computed;
  return TPR_OK;
}

// Prefix cache: registers q's blocks whose rows are all written by now.
static tpr_status register_full(tpr_sched *s, seq *q) {
  const int64_t bs = s->o.block_size;
  tpr_block_pool *pool = &s->reps[q->replica].pool;
  for (int64_t b = q->n_hashed; (b + 1) * bs <= q->computed; b = ++q->n_hashed) {
    TPR_CHECK(grow((void **)&q->hashes, &q->hashes_cap, b + 1, sizeof *q->hashes, "a hash list"));
    const uint64_t parent = b ? q->hashes[b - 1] : 0;
    q->hashes[b] = tpr_block_pool_hash(pool, parent, q->tokens + b * bs);
    TPR_CHECK(tpr_block_pool_register(pool, q->blocks[b], q->hashes[b], parent, q->tokens + b * bs));
  }
  return TPR_OK;
}

static tpr_status plan_replica(tpr_sched *s, replica *rp, int64_t *preempted) {
  const int64_t bs = s->o.block_size, max_batch = s->o.max_batch;
  int64_t rep_preempted = 0, budget = s->o.max_tokens;
  rp->n_chunks = 0;
  // (1) decodes, in admission order. Victims are taken from the end of the
  // running list (the most recently admitted), so they are never a
  // sequence already planned in this loop, and index i stays valid.
  for (int64_t i = 0; i < rp->running.n && rp->n_chunks < max_batch && budget > 0; i++) {
    int64_t id = rp->running.ids[i];
    seq *q = &s->seqs[id];
    if (q->len - q->computed != 1) continue;
    bool self = false;
    while (ceil_div(q->computed + 1, bs) - q->n_blocks > tpr_block_pool_free(&rp->pool)) {
      int64_t victim = rp->running.ids[rp->running.n - 1];
      TPR_CHECK(preempt(s, victim));
      rep_preempted++;
      if (victim == id) {
        self = true;
        break;
      }
    }
    if (self) continue;  // it was last in the list: the loop ends
    TPR_CHECK(add_chunk(s, rp, id, 1));
    budget--;
  }
  // (1b) speculative decoding: each planned decode with drafts takes as
  // many as the budget and the free blocks allow (never preempting for one).
  for (int64_t i = 0; i < rp->n_chunks && budget > 0; i++) {
    tpr_sched_chunk *c = &rp->chunks[i];
    seq *q = &s->seqs[c->seq];
    int64_t k = q->n_draft < budget ? q->n_draft : budget;
    if (k < 1) continue;
    k = fit_tokens(q, 1 + k, tpr_block_pool_free(&rp->pool), bs) - 1;
    if (k < 1) continue;
    int64_t nb = ceil_div(q->computed + 1 + k, bs);
    TPR_CHECK(grow((void **)&q->blocks, &q->blocks_cap, nb, sizeof *q->blocks, "a block table"));
    while (q->n_blocks < nb) TPR_CHECK(tpr_block_pool_take(&rp->pool, &q->blocks[q->n_blocks++]));
    c->n = 1 + k, c->n_draft = k, c->blocks = q->blocks, c->n_blocks = q->n_blocks, c->drafts_later = q->drafts_later;
    budget -= k;
  }
  // (2) running sequences still prefilling, in admission order.
  for (int64_t i = 0; i < rp->running.n && rp->n_chunks < max_batch && budget > 0; i++) {
    int64_t id = rp->running.ids[i];
    seq *q = &s->seqs[id];
    int64_t left = q->len - q->computed;
    if (left < 2) continue;
    int64_t n = fit_tokens(q, left < budget ? left : budget, tpr_block_pool_free(&rp->pool), bs);
    if (n < 1) continue;  // no free block; a later one may still fit in its own last block
    TPR_CHECK(add_chunk(s, rp, id, n));
    budget -= n;
  }
  // (3) waiting sequences, first come first served.
  if (!(rep_preempted > 0 && rp->n_chunks > 0)) {
    while (rp->waiting.n > 0 && rp->n_chunks < max_batch && budget > 0 && tpr_block_pool_free(&rp->pool) > 0 &&
           (s->o.state_slots == 0 || rp->n_free_slots > 0)) {
      int64_t id = rp->waiting.ids[0];
      seq *q = &s->seqs[id];
      int64_t share = sibling_share(s, q);
      if (share == SIBLING_WAITS) break;  // FCFS: the sequences behind it wait too
      // A sibling takes its leader's blocks even with the prefix cache: a
      // leader's block that duplicated one registered before stays
      // unregistered, and the cache misses it once that one is evicted.
      if (share > 0) {
        TPR_CHECK(admit_sharing(s, rp, q, share));
        if (s->o.prefix_cache) s->prefix_queried += q->len, s->prefix_hit += q->computed;
      } else if (s->o.prefix_cache) {
        TPR_CHECK(admit_cached(s, rp, q));
      }
      q->start = q->computed;
      int64_t left = q->len - q->computed;
      int64_t n = fit_tokens(q, left < budget ? left : budget, tpr_block_pool_free(&rp->pool), bs);
      list_remove(&rp->waiting, id);
      TPR_CHECK(list_insert(&rp->running, rp->running.n, id));
      q->state = SEQ_RUNNING;
      q->admitted = s->admit_counter++;
      if (s->o.state_slots > 0) q->slot = rp->free_slots[--rp->n_free_slots];
      TPR_CHECK(add_chunk(s, rp, id, n));
      budget -= n;
    }
  }
  if (rp->n_chunks == 0 && rp->unfinished > 0)
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_sched_next: replica %d planned nothing for %lld unfinished sequences",
                    (int)(rp - s->reps), (long long)rp->unfinished);
  *preempted += rep_preempted;
  return TPR_OK;
}

tpr_status tpr_sched_next(tpr_sched *s, tpr_sched_step *out) {
  if (!s || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_next: NULL %s", s ? "out" : "scheduler");
  if (s->pending)
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "tpr_sched_next: the last planned step was not applied (call tpr_sched_update first)");
  int64_t tokens = 0, preempted = 0;
  for (int r = 0; r < s->o.replicas; r++) {
    replica *rp = &s->reps[r];
    TPR_CHECK(plan_replica(s, rp, &preempted));
    for (int64_t i = 0; i < rp->n_chunks; i++) tokens += rp->chunks[i].n;
    s->n_chunks_out[r] = rp->n_chunks;
    s->chunks_out[r] = rp->chunks;
  }
  if (tokens == 0 && s->unfinished > 0)
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_sched_next: planned nothing for %lld unfinished sequences",
                    (long long)s->unfinished);
  // Drafts are for one step: the next one gets fresh ones (tpr_sched_set_draft).
  for (int r = 0; r < s->o.replicas; r++)
    for (int64_t i = 0; i < s->reps[r].running.n; i++) s->seqs[s->reps[r].running.ids[i]].n_draft = 0;
  s->pending = tokens > 0;
  *out = (tpr_sched_step){.replicas = s->o.replicas, .n_chunks = s->n_chunks_out,
                          .chunks = (const tpr_sched_chunk *const *)s->chunks_out, .tokens = tokens,
                          .preempted = preempted};
  return TPR_OK;
}

static tpr_status finish(tpr_sched *s, seq *q, int64_t id) {
  replica *rp = &s->reps[q->replica];
  TPR_CHECK(release_blocks(s, q));
  release_slot(s, q);
  list_remove(&rp->running, id);
  q->state = SEQ_FINISHED;
  rp->unfinished--;
  s->unfinished--;
  return TPR_OK;
}

tpr_status tpr_sched_cancel(tpr_sched *s, int64_t id) {
  if (!s || id < 0 || id >= s->n_seqs)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_cancel: no sequence %lld", (long long)id);
  if (s->pending)  // the planned step holds the sequence's chunks and blocks
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_cancel: a planned step is waiting (cancel between steps)");
  seq *q = &s->seqs[id];
  if (q->state == SEQ_FINISHED) return TPR_OK;
  if (q->state == SEQ_RUNNING) return finish(s, q, id);
  replica *rp = &s->reps[q->replica];  // waiting: it holds no blocks
  list_remove(&rp->waiting, id);
  q->state = SEQ_FINISHED;
  rp->unfinished--;
  s->unfinished--;
  return TPR_OK;
}

// Speculative decoding: the tokens a verification gives (out: 1 + n_draft
// entries, the accepted drafts then the target's own token, -1 after).
static int64_t verified_tokens(const int32_t *out, int64_t n_draft) {
  int64_t m = 0;
  while (m <= n_draft && out[m] >= 0) m++;
  return n_draft > 0 ? m : 1;
}

// A verification's tokens agree with its drafts: at least one token, the
// first m - 1 equal to the drafts, nothing after a -1.
static tpr_status check_verified(const tpr_sched_chunk *c, const int32_t *out, int r, int64_t i) {
  const int64_t m = verified_tokens(out, c->n_draft);
  bool ok = m >= 1;
  for (int64_t j = 0; ok && !c->drafts_later && j + 1 < m; j++) ok = out[j] == c->tokens[1 + j];
  for (int64_t j = m; ok && j <= c->n_draft; j++) ok = out[j] == -1;
  if (!ok)
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "tpr_sched_update: replica %d chunk %lld (seq %lld): %lld verified tokens that are not its "
                    "accepted drafts then one more, -1 after",
                    r, (long long)i, (long long)c->seq, (long long)m);
  return TPR_OK;
}

// Rollback of rejected drafts: blocks past the ones holding q's first
// `rows` rows go back to the pool (only q held them: positions >= computed
// at planning time are never in a shared or cached block).
static tpr_status drop_blocks_past(tpr_sched *s, seq *q, int64_t rows) {
  tpr_block_pool *pool = &s->reps[q->replica].pool;
  const int64_t keep = ceil_div(rows, s->o.block_size);
  if (s->o.debug_fault == TPR_SCHED_FAULT_KEEP_REJECTED_BLOCKS) return TPR_OK;  // negative control
  while (q->n_blocks > keep) TPR_CHECK(tpr_block_pool_give(pool, q->blocks[--q->n_blocks]));
  return TPR_OK;
}

tpr_status tpr_sched_update(tpr_sched *s, const tpr_sched_step *step, const int32_t *const *sampled) {
  if (!s || !step) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_update: NULL %s", s ? "step" : "scheduler");
  if (!s->pending) {
    if (step->tokens == 0) return TPR_OK;  // an empty plan changes nothing
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_update: no planned step is waiting (call tpr_sched_next first)");
  }
  if (step->replicas != s->o.replicas || !step->n_chunks || !step->chunks)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_update: the step (%d replicas) is not the last planned one (%d)",
                    step->replicas, s->o.replicas);
  // Check everything before changing anything.
  for (int r = 0; r < s->o.replicas; r++) {
    const replica *rp = &s->reps[r];
    if (step->n_chunks[r] != rp->n_chunks)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_update: replica %d has %lld chunks, the last plan %lld", r,
                      (long long)step->n_chunks[r], (long long)rp->n_chunks);
    if (rp->n_chunks > 0 && !step->chunks[r])
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_update: replica %d's chunks are NULL", r);
    int64_t n_sample = 0;
    for (int64_t i = 0; i < rp->n_chunks; i++) {
      const tpr_sched_chunk *a = &step->chunks[r][i], *b = &rp->chunks[i];
      if (a->seq != b->seq || a->pos0 != b->pos0 || a->n != b->n || a->sample != b->sample || a->n_draft != b->n_draft)
        return TPR_FAIL(TPR_ERR_INVALID_ARG,
                        "tpr_sched_update: replica %d chunk %lld (seq %lld, pos0 %lld, n %lld, sample %d) differs "
                        "from the last plan (seq %lld, pos0 %lld, n %lld, sample %d)",
                        r, (long long)i, (long long)a->seq, (long long)a->pos0, (long long)a->n, a->sample,
                        (long long)b->seq, (long long)b->pos0, (long long)b->n, b->sample);
      if (b->n_draft > 0 && sampled && sampled[r]) TPR_CHECK(check_verified(b, sampled[r] + n_sample, r, i));
      n_sample += b->sample ? 1 + b->n_draft : 0;
    }
    if (n_sample > 0 && (!sampled || !sampled[r]))
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_update: replica %d has %lld sampled chunks but no sampled tokens",
                      r, (long long)n_sample);
  }
  for (int r = 0; r < s->o.replicas; r++) {
    replica *rp = &s->reps[r];
    int64_t k = 0;
    for (int64_t i = 0; i < rp->n_chunks; i++) {
      const tpr_sched_chunk *c = &rp->chunks[i];
      seq *q = &s->seqs[c->seq];
      // The sampled tokens first: a stop token or max_new ends the sequence
      // at its j-th verified token, and the later ones are dropped.
      const int32_t *out = c->sample ? sampled[r] + k : NULL;
      const int64_t m = c->sample ? verified_tokens(out, c->n_draft) : 0;
      int64_t kept = m;
      bool done = false;
      if (c->sample) {
        k += 1 + c->n_draft;
        TPR_CHECK(grow((void **)&q->tokens, &q->cap, q->len + m, sizeof *q->tokens, "a token list"));
        for (int64_t j = 0; j < m && !done; j++) {
          q->tokens[q->len++] = out[j];
          q->generated++;
          done = q->generated >= q->max_new || (q->stop >= 0 && out[j] == q->stop);
          kept = j + 1;
        }
      }
      // A verification keeps the rows of its first token and of the accepted
      // drafts the sequence kept (kept - 1): the others' rows are rolled back,
      // so every row below computed holds a token of the sequence (and the
      // prefix cache registers nothing else).
      q->computed = c->pos0 + (c->n_draft > 0 ? kept : c->n);
      if (c->n_draft > 0) TPR_CHECK(drop_blocks_past(s, q, q->computed));
      // A hybrid model's state absorbed every draft: unless all were
      // accepted, the engine restored the slot's state from before the step
      // (its snapshot) and the kept rows [pos0, pos0 + m) run again from it
      // in the next chunk (their KV rows rewritten with the same values).
      if (!done && c->n_draft > 0 && s->o.state_slots > 0 && m - 1 < c->n_draft) {
        q->redo = q->computed, q->computed = c->pos0;
        s->rollbacks++;
      }
      if (s->o.prefix_cache) TPR_CHECK(register_full(s, q));
      if (done) TPR_CHECK(finish(s, q, c->seq));
      if (c->n_draft > 0) s->drafted += c->n_draft, s->accepted += m - 1, s->verifications++;
    }
    rp->n_chunks = 0;  // the plan is spent; its pointers are no longer valid
    s->n_chunks_out[r] = 0;
  }
  s->pending = false;
  return TPR_OK;
}

tpr_status tpr_sched_release(tpr_sched *s, int64_t id) {
  if (!s || id < 0 || id >= s->n_seqs)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_release: no sequence %lld", (long long)id);
  seq *q = &s->seqs[id];
  if (q->released) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_release: sequence %lld was released", (long long)id);
  if (q->state != SEQ_FINISHED)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_release: sequence %lld is not finished", (long long)id);
  free(q->tokens);
  free(q->blocks);
  free(q->hashes);
  q->tokens = NULL, q->blocks = NULL, q->hashes = NULL;
  q->cap = q->blocks_cap = q->hashes_cap = 0;
  q->released = true;
  return TPR_OK;
}

tpr_status tpr_sched_seq(const tpr_sched *s, int64_t id, tpr_sched_seq_info *out) {
  if (!s || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_seq: NULL %s", s ? "out" : "scheduler");
  if (id < 0 || id >= s->n_seqs)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_seq: id %lld not in [0, %lld)", (long long)id,
                    (long long)s->n_seqs);
  const seq *q = &s->seqs[id];
  if (q->released) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_seq: sequence %lld was released", (long long)id);
  *out = (tpr_sched_seq_info){.tokens = q->tokens, .len = q->len, .prompt_len = q->prompt_len,
                              .replica = q->replica, .finished = q->state == SEQ_FINISHED,
                              .preemptions = q->preemptions, .shared_blocks = q->shared,
                              .cached_blocks = q->cached};
  return TPR_OK;
}

int64_t tpr_sched_unfinished(const tpr_sched *s) { return s ? s->unfinished : 0; }

int64_t tpr_sched_waiting(const tpr_sched *s) {
  int64_t n = 0;
  for (int r = 0; s && r < s->o.replicas; r++) n += s->reps[r].waiting.n;
  return n;
}

// -1 for a replica out of range (the header gives this query no status).
int64_t tpr_sched_blocks_in_use(const tpr_sched *s, int replica) {
  if (!s || replica < 0 || replica >= s->o.replicas) return -1;
  return tpr_block_pool_used(&s->reps[replica].pool);
}

int64_t tpr_sched_preemptions(const tpr_sched *s) { return s ? s->preemptions : 0; }

int64_t tpr_sched_state_slots_in_use(const tpr_sched *s, int replica) {
  if (!s || replica < 0 || replica >= s->o.replicas) return -1;
  return s->o.state_slots - s->reps[replica].n_free_slots;
}

void tpr_sched_prefix_stats(const tpr_sched *s, int64_t *queried, int64_t *hit) {
  *queried = s ? s->prefix_queried : 0;
  *hit = s ? s->prefix_hit : 0;
}

int64_t tpr_sched_cached_blocks(const tpr_sched *s, int replica) {
  if (!s || replica < 0 || replica >= s->o.replicas) return -1;
  return tpr_block_pool_cached(&s->reps[replica].pool);
}

int32_t tpr_sched_block_refs(const tpr_sched *s, int replica, int32_t id) {
  if (!s || replica < 0 || replica >= s->o.replicas) return -1;
  return tpr_block_pool_refs(&s->reps[replica].pool, id);
}

tpr_status tpr_sched_set_draft(tpr_sched *s, int64_t id, const int32_t *draft, int64_t k) {
  if (!s || id < 0 || id >= s->n_seqs)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_set_draft: no sequence %lld", (long long)id);
  if (s->pending) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_set_draft: a planned step is waiting");
  if (k < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_sched_set_draft: %lld drafts", (long long)k);
  seq *q = &s->seqs[id];
  q->n_draft = 0;
  // Only a running decode takes drafts, and no more than leave room for
  // the token the target gives after them (max_new).
  if (q->released || q->state != SEQ_RUNNING || q->len - q->computed != 1) return TPR_OK;
  const int64_t room = q->max_new - q->generated - 1;
  if (k > room) k = room;
  if (k < 1) return TPR_OK;
  TPR_CHECK(grow((void **)&q->tokens, &q->cap, q->len + k, sizeof *q->tokens, "a token list"));
  if (draft)
    memcpy(q->tokens + q->len, draft, (size_t)k * sizeof *draft);
  else
    memset(q->tokens + q->len, 0, (size_t)k * sizeof *q->tokens);  // placeholders until the engine drafts
  q->n_draft = k;
  q->drafts_later = !draft;
  return TPR_OK;
}

tpr_sched_spec_stats tpr_sched_spec(const tpr_sched *s) {
  return s ? (tpr_sched_spec_stats){s->drafted, s->accepted, s->verifications, s->rollbacks, s->recomputed}
           : (tpr_sched_spec_stats){0};
}
