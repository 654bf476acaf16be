// The batched engine's scheduler (engine/scheduler.h) driven by a fake model:
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

#include "engine/scheduler.h"
#include "test_util.h"

static int32_t fake_next(int64_t id, int64_t pos, int32_t vocab) {
  uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ull + (uint64_t)pos * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E9F8A1C2B3A497ull;
  x ^= x >> 29;
  return (int32_t)(x % (uint64_t)vocab);
}

typedef struct exp_seq {
  int32_t *tok;  // prompt then the tokens the fake model generates
  int64_t len, prompt_len, max_new, arrival_step;
  int32_t stop;
  int64_t group_n;  // > 1: this sequence leads a group of group_n submitted together (tpr_sched_submit_n)
  int64_t leader;   // a sibling: its group's leader; -1 otherwise
} exp_seq;

typedef struct harness {
  tpr_sched_opts o;
  tpr_sched *s;
  int32_t vocab;
  int wrong_model;  // negative control: sample the token one position too far
  exp_seq *e;
  int64_t n, submitted;
  int64_t *shadow, *seen_pre, *finish_step;  // (n) computed as the test sees it, preemptions seen, step finished
  bool *running;  // (n) admitted and neither preempted nor finished since
  int32_t **table;  // (n) each live sequence's block table as its last chunk gave it (n_table[i] entries)
  int64_t *n_table, *shared;  // (n) table lengths; leading blocks taken from the leader at admission
  int64_t *kv;  // (replicas, pool_blocks * block_size, 3) seq, position, token; -1 = never written
  int64_t step, steps_run, max_step_tokens, max_step_chunks, preemptions, recompute_generated;
  int64_t shared_admissions, blocks_shared, alone_siblings;  // siblings admitted holding / not holding leader blocks
  int64_t cached_admissions, blocks_cached;  // admissions holding prefix-cache blocks, and those blocks
  int64_t peak_blocks;  // the most blocks in use after a step, over the replicas
  int64_t log_seq, n_log, log[64][3];  // the chunks of sequence log_seq: pos0, n, sample
  // Speculative decoding: drafts of 1..spec_k tokens offered to every
  // sequence before each step (a random prefix of them right); 0: none.
  int64_t spec_k;
  int32_t (*drafts)[8];  // (n) the drafts offered to each sequence for this step
  int64_t drafted, accepted, verifications;
  char err[512];
} harness;

// Builds the expected tokens of a sequence (id = its index).
static void exp_init(exp_seq *e, int64_t id, int64_t prompt_len, int64_t max_new, int32_t stop, int32_t vocab,
                     int64_t arrival_step) {
  *e = (exp_seq){.prompt_len = prompt_len, .max_new = max_new, .stop = stop, .arrival_step = arrival_step,
                 .leader = -1};
  e->tok = malloc((size_t)(prompt_len + max_new) * sizeof *e->tok);
  for (int64_t i = 0; i < prompt_len; i++) e->tok[i] = (int32_t)tt_randint(0, vocab - 1);
  e->len = prompt_len;
  for (int64_t g = 0; g < max_new; g++) {
    int32_t t = fake_next(id, e->len, vocab);
    e->tok[e->len++] = t;
    if (t == stop) break;
  }
}

// A group of n at ids id..id+n-1: the leader's prompt for every sibling,
// each sibling its own generated tokens (the fake model hashes the id).
static void exp_init_group(exp_seq *e, int64_t id, int64_t n, int64_t prompt_len, const int64_t *max_new,
                           int32_t vocab, int64_t arrival_step) {
  exp_init(&e[0], id, prompt_len, max_new[0], -1, vocab, arrival_step);
  e[0].group_n = n;
  for (int64_t i = 1; i < n; i++) {
    exp_seq *s = &e[i];
    *s = (exp_seq){.prompt_len = prompt_len, .max_new = max_new[i], .stop = -1, .arrival_step = arrival_step,
                   .leader = id};
    s->tok = malloc((size_t)(prompt_len + max_new[i]) * sizeof *s->tok);
    memcpy(s->tok, e[0].tok, (size_t)prompt_len * sizeof *s->tok);
    for (s->len = prompt_len; s->len < prompt_len + max_new[i]; s->len++)
      s->tok[s->len] = fake_next(id + i, s->len, vocab);
  }
}

static void h_init(harness *h, tpr_sched_opts o, int64_t n, int32_t vocab) {
  memset(h, 0, sizeof *h);
  h->o = o;
  h->vocab = vocab;
  h->n = n;
  h->log_seq = -1;
  TT_OK(tpr_sched_new(&o, &h->s));
  h->e = calloc((size_t)n, sizeof *h->e);
  h->shadow = calloc((size_t)n, sizeof(int64_t));
  h->seen_pre = calloc((size_t)n, sizeof(int64_t));
  h->finish_step = malloc((size_t)n * sizeof(int64_t));
  h->running = calloc((size_t)n, sizeof(bool));
  h->table = calloc((size_t)n, sizeof(int32_t *));
  h->n_table = calloc((size_t)n, sizeof(int64_t));
  h->shared = calloc((size_t)n, sizeof(int64_t));
  h->drafts = calloc((size_t)n, sizeof *h->drafts);
  for (int64_t i = 0; i < n; i++) h->finish_step[i] = -1;
  size_t rows = (size_t)o.replicas * (size_t)o.pool_blocks * (size_t)o.block_size;
  h->kv = malloc(rows * 3 * sizeof(int64_t));
  memset(h->kv, 0xff, rows * 3 * sizeof(int64_t));
}

static void h_free(harness *h) {
  tpr_sched_free(h->s);
  for (int64_t i = 0; i < h->n; i++) free(h->e[i].tok), free(h->table[i]);
  free(h->e);
  free(h->table);
  free(h->n_table);
  free(h->shared);
  free(h->shadow);
  free(h->seen_pre);
  free(h->finish_step);
  free(h->running);
  free(h->drafts);
  free(h->kv);
}

#define FAIL_IF(cond, ...)                                   \
  do {                                                       \
    if (cond) {                                              \
      snprintf(h->err, sizeof h->err, __VA_ARGS__);          \
      return h->err;                                         \
    }                                                        \
  } while (0)

// A sequence that left the pool (preempted, finished) holds no block.
static void forget_table(harness *h, int64_t i) { h->n_table[i] = h->shared[i] = 0; }

// A preempted sequence restarts from position 0.
static void sync_shadow(harness *h) {
  for (int64_t i = 0; i < h->submitted; i++) {
    tpr_sched_seq_info in;
    TT_OK(tpr_sched_seq(h->s, i, &in));
    if (in.preemptions != h->seen_pre[i]) {
      h->shadow[i] = 0, h->seen_pre[i] = in.preemptions, h->running[i] = false;
      forget_table(h, i);
    }
  }
}

// A live sequence other than `self` whose table (as the harness saw it)
// holds block b of replica r; -1: none.
static int64_t other_holder(const harness *h, int r, int32_t b, int64_t self) {
  for (int64_t i = 0; i < h->submitted; i++) {
    if (i == self || h->n_table[i] == 0) continue;
    tpr_sched_seq_info in;
    TT_OK(tpr_sched_seq(h->s, i, &in));
    if (in.replica != r) continue;
    for (int64_t k = 0; k < h->n_table[i]; k++)
      if (h->table[i][k] == b) return i;
  }
  return -1;
}

static int64_t *kv_row(harness *h, int r, int64_t block, int64_t p) {
  return h->kv + (((int64_t)r * h->o.pool_blocks + block) * h->o.block_size + p % h->o.block_size) * 3;
}

// Every invariant of one planned step; NULL when it holds. Reads nothing but
// the step, the scheduler's sequence info and the harness's shadow state.
static const char *check_step(harness *h, const tpr_sched_step *st) {
  const int64_t bs = h->o.block_size;
  FAIL_IF(st->replicas != h->o.replicas, "step has %d replicas, want %d", st->replicas, h->o.replicas);
  bool *in_step = calloc((size_t)h->n + 1, 1), *used = calloc((size_t)h->o.pool_blocks, 1);
  const int32_t **step_blocks = calloc((size_t)h->n + 1, sizeof *step_blocks);  // each planned seq's table
  const char *bad = NULL;
  int64_t total = 0;
  for (int r = 0; r < st->replicas && !bad; r++) {
    memset(used, 0, (size_t)h->o.pool_blocks);
    int64_t tokens = 0;
    bool seen_prefill = false;
    if (st->n_chunks[r] > h->o.max_batch) {
      snprintf(h->err, sizeof h->err, "replica %d: %lld chunks > max_batch %lld", r, (long long)st->n_chunks[r],
               (long long)h->o.max_batch);
      bad = h->err;
    }
    for (int64_t i = 0; i < st->n_chunks[r] && !bad; i++) {
      const tpr_sched_chunk *c = &st->chunks[r][i];
      tpr_sched_seq_info in = {0};
#define BAD(...) { snprintf(h->err, sizeof h->err, __VA_ARGS__); bad = h->err; break; }
      if (c->seq < 0 || c->seq >= h->submitted) BAD("replica %d: unknown seq %lld", r, (long long)c->seq);
      if (in_step[c->seq]) BAD("seq %lld appears twice in one step", (long long)c->seq);
      in_step[c->seq] = true;
      step_blocks[c->seq] = c->blocks;
      TT_OK(tpr_sched_seq(h->s, c->seq, &in));
      const exp_seq *e = &h->e[c->seq];
      if (in.replica != r || in.finished) BAD("seq %lld on replica %d (its own %d, finished %d)", (long long)c->seq, r, in.replica, in.finished);
      // Sharing: what a newly admitted sequence starts from, and where it may write.
      const bool admitted = !h->running[c->seq];
      const int64_t shared = admitted ? in.shared_blocks + in.cached_blocks : h->shared[c->seq];
      const int64_t start = admitted ? shared * bs : h->shadow[c->seq], lead = e->leader;
      for (int64_t b = 0; b < c->n_blocks && !bad; b++) {
        int32_t id = c->blocks[b];
        // A shared leading block is in every holder's table; any other twice is wrong.
        if (id < 0 || id >= h->o.pool_blocks || (used[id] && b >= shared)) BAD("replica %d: block %d out of range or twice", r, id);
        used[id] = true;
      }
      if (bad) break;
      if (admitted && in.cached_blocks > 0 && (!h->o.prefix_cache || in.shared_blocks > 0))
        BAD("seq %lld took %lld cached blocks (prefix cache %d, %lld sibling blocks)", (long long)c->seq,
            (long long)in.cached_blocks, h->o.prefix_cache, (long long)in.shared_blocks);
      if (admitted && in.shared_blocks > 0) {
        // The leader computed them in earlier steps, or (prefix cache) it was
        // admitted earlier in this step holding them as cached blocks.
        tpr_sched_seq_info li = {0};
        if (lead >= 0) TT_OK(tpr_sched_seq(h->s, lead, &li));
        const int32_t *lead_table = lead < 0 ? NULL : h->running[lead] ? h->table[lead] : step_blocks[lead];
        if (lead < 0 || !lead_table ||
            (h->running[lead] ? h->shadow[lead] < shared * bs || h->n_table[lead] < shared
                              : li.cached_blocks < shared))
          BAD("seq %lld took %lld blocks from leader %lld, which has not computed them", (long long)c->seq,
              (long long)shared, (long long)lead);
        if (c->n_blocks < shared || memcmp(c->blocks, lead_table, (size_t)shared * sizeof *c->blocks) != 0)
          BAD("seq %lld: its first %lld blocks are not its leader's", (long long)c->seq, (long long)shared);
      }
      if (admitted && shared == 0 && lead >= 0 && h->seen_pre[c->seq] == 0 && h->seen_pre[lead] == 0 &&
          h->running[lead] && (e->prompt_len - 1) / bs > 0 && h->shadow[lead] >= (e->prompt_len - 1) / bs * bs)
        BAD("seq %lld was admitted alone while its leader %lld held its prompt's blocks", (long long)c->seq,
            (long long)lead);
      for (int64_t p = c->pos0; p < c->pos0 + c->n && p / bs < c->n_blocks; p++) {
        int64_t other = other_holder(h, r, c->blocks[p / bs], c->seq);
        if (other >= 0)
          BAD("seq %lld writes position %lld into block %d, shared with seq %lld", (long long)c->seq, (long long)p,
              c->blocks[p / bs], (long long)other);
      }
      if (bad) break;
      for (int64_t b = admitted ? shared : h->n_table[c->seq]; b < c->n_blocks; b++) {
        int64_t other = other_holder(h, r, c->blocks[b], c->seq);
        if (other >= 0)
          BAD("seq %lld got block %d, still held by seq %lld (freed while referenced)", (long long)c->seq,
              c->blocks[b], (long long)other);
      }
      if (bad) break;
      const int64_t nd = c->n_draft;  // a verification's drafts: its last nd tokens, past the sequence's len
      if (c->n < 1 || c->pos0 != start || c->first != admitted || c->pos0 + c->n - nd > in.len || nd < 0 ||
          nd > h->spec_k || (nd > 0 && c->n - nd != 1))
        BAD("seq %lld: chunk pos0 %lld n %lld first %d, want pos0 %lld (len %lld)", (long long)c->seq,
            (long long)c->pos0, (long long)c->n, c->first, (long long)start, (long long)in.len);
      if (c->sample != (c->pos0 + c->n - nd == in.len)) BAD("seq %lld: sample %d at pos0+n %lld, len %lld", (long long)c->seq, c->sample, (long long)(c->pos0 + c->n), (long long)in.len);
      bool decode = !c->first && in.len - c->pos0 == 1;
      if (decode && seen_prefill) BAD("replica %d: decode of seq %lld after a prefill chunk", r, (long long)c->seq);
      seen_prefill |= !decode;
      tokens += c->n;
      if (c->n_blocks != (c->pos0 + c->n + bs - 1) / bs)
        BAD("seq %lld: %lld blocks for %lld positions of %lld", (long long)c->seq, (long long)c->n_blocks, (long long)(c->pos0 + c->n), (long long)bs);
      for (int64_t p = 0; p < nd; p++)
        if (c->tokens[c->n - nd + p] != h->drafts[c->seq][p])
          BAD("seq %lld: draft %lld is %d, offered %d", (long long)c->seq, (long long)p, c->tokens[c->n - nd + p],
              h->drafts[c->seq][p]);
      for (int64_t p = 0; p < c->n - nd; p++)
        if (c->tokens[p] != e->tok[c->pos0 + p]) BAD("seq %lld: token %lld is %d, want %d", (long long)c->seq, (long long)(c->pos0 + p), c->tokens[p], e->tok[c->pos0 + p]);
      if (bad) break;
      for (int64_t p = 0; p < c->pos0; p++) {
        const int64_t *row = kv_row(h, r, c->blocks[p / bs], p);
        bool writer = row[0] == c->seq || (p < shared * bs && row[0] == lead);  // the leader wrote shared rows
        // A cached row: written by any sequence whose tokens up to it are ours.
        if (!writer && h->o.prefix_cache && p < shared * bs && row[0] >= 0 && row[0] < h->submitted &&
            h->e[row[0]].len > p)
          writer = memcmp(h->e[row[0]].tok, e->tok, (size_t)(p + 1) * sizeof *e->tok) == 0;
        if (!writer || row[1] != p || row[2] != e->tok[p])
          BAD("seq %lld: KV row of position %lld holds (seq %lld, pos %lld, tok %lld)", (long long)c->seq, (long long)p, (long long)row[0], (long long)row[1], (long long)row[2]);
      }
      if (bad) break;
      if (!admitted && (c->n_blocks < h->n_table[c->seq] ||
                        memcmp(c->blocks, h->table[c->seq], (size_t)h->n_table[c->seq] * sizeof *c->blocks) != 0))
        BAD("seq %lld: its block table changed under it", (long long)c->seq);
#undef BAD
    }
    if (!bad && tokens > h->o.max_tokens) {
      snprintf(h->err, sizeof h->err, "replica %d: %lld tokens > max_tokens %lld", r, (long long)tokens, (long long)h->o.max_tokens);
      bad = h->err;
    }
    total += tokens;
  }
  // FCFS: a sequence is admitted only when no waiting one of its replica
  // that arrived earlier (lower id) stays behind in this step.
  for (int r = 0; r < st->replicas && !bad; r++)
    for (int64_t i = 0; i < st->n_chunks[r] && !bad; i++) {
      const tpr_sched_chunk *c = &st->chunks[r][i];
      for (int64_t w = 0; w < c->seq && c->first && !h->running[c->seq] && !bad; w++) {
        tpr_sched_seq_info in;
        TT_OK(tpr_sched_seq(h->s, w, &in));
        if (in.replica == r && !in.finished && !h->running[w] && !in_step[w]) {
          snprintf(h->err, sizeof h->err, "replica %d admitted seq %lld before the earlier waiting seq %lld", r,
                   (long long)c->seq, (long long)w);
          bad = h->err;
        }
      }
    }
  if (!bad && total != st->tokens) {
    snprintf(h->err, sizeof h->err, "step says %lld tokens, chunks hold %lld", (long long)st->tokens, (long long)total);
    bad = h->err;
  }
  free(in_step);
  free(step_blocks);
  free(used);
  return bad;
}

// Submits what has arrived, plans, checks, runs the fake model, applies.
static const char *h_step(harness *h) {
  while (h->submitted < h->n && h->e[h->submitted].arrival_step <= h->step) {
    int64_t live[3] = {0}, id = -1;
    for (int64_t i = 0; i < h->submitted; i++) {
      tpr_sched_seq_info in;
      TT_OK(tpr_sched_seq(h->s, i, &in));
      live[in.replica] += !in.finished;
    }
    int want = 0;
    for (int r = 1; r < h->o.replicas; r++)
      if (live[r] < live[want]) want = r;
    const exp_seq *e = &h->e[h->submitted];
    int64_t n = e->group_n > 1 ? e->group_n : 1, max_new[16];
    int32_t stop[16];
    for (int64_t i = 0; i < n; i++) max_new[i] = e[i].max_new, stop[i] = e[i].stop;
    if (n > 1)
      TT_OK(tpr_sched_submit_n(h->s, e->tok, e->prompt_len, max_new, stop, n, &id));
    else
      TT_OK(tpr_sched_submit(h->s, e->tok, e->prompt_len, e->max_new, e->stop, &id));
    FAIL_IF(id != h->submitted, "submit %lld: id %lld", (long long)h->submitted, (long long)id);
    for (int64_t i = 0; i < n; i++) {  // a group goes to its leader's replica, chosen as for one sequence
      tpr_sched_seq_info in;
      TT_OK(tpr_sched_seq(h->s, id + i, &in));
      FAIL_IF(in.replica != want, "submit %lld: replica %d, want replica %d", (long long)(id + i), in.replica, want);
    }
    h->submitted += n;
  }
  h->step++;
  for (int64_t i = 0; h->spec_k > 0 && i < h->submitted; i++) {
    tpr_sched_seq_info in;
    TT_OK(tpr_sched_seq(h->s, i, &in));
    if (in.finished) continue;
    const int64_t k = tt_randint(1, h->spec_k), right = tt_randint(0, k);
    for (int64_t j = 0; j < k; j++) {  // the first `right` are what the fake model will say, the rest not
      const int32_t truth = fake_next(i, in.len + j, h->vocab);
      h->drafts[i][j] = j < right ? truth : (int32_t)((truth + 1 + tt_randint(0, h->vocab - 2)) % h->vocab);
    }
    TT_OK(tpr_sched_set_draft(h->s, i, h->drafts[i], k));
  }
  int64_t pre0 = tpr_sched_preemptions(h->s);
  tpr_sched_step st;
  TT_OK(tpr_sched_next(h->s, &st));
  FAIL_IF(tpr_sched_preemptions(h->s) - pre0 != st.preempted, "step reports %lld preemptions, total grew by %lld",
          (long long)st.preempted, (long long)(tpr_sched_preemptions(h->s) - pre0));
  h->preemptions += st.preempted;
  if (st.tokens == 0) {
    FAIL_IF(tpr_sched_unfinished(h->s) != 0, "empty step with %lld unfinished", (long long)tpr_sched_unfinished(h->s));
    return NULL;
  }
  h->steps_run++;
  sync_shadow(h);
  const char *bad = check_step(h, &st);
  if (bad) return bad;
  int32_t *sampled[3] = {0};
  for (int r = 0; r < st.replicas; r++) {
    int64_t k = 0, tokens = 0;
    int64_t rows = 1;
    for (int64_t i = 0; i < st.n_chunks[r]; i++) rows += 1 + st.chunks[r][i].n_draft;
    sampled[r] = malloc((size_t)rows * sizeof(int32_t));
    if (st.n_chunks[r] > h->max_step_chunks) h->max_step_chunks = st.n_chunks[r];
    for (int64_t i = 0; i < st.n_chunks[r]; i++) {
      const tpr_sched_chunk *c = &st.chunks[r][i];
      tpr_sched_seq_info in;
      TT_OK(tpr_sched_seq(h->s, c->seq, &in));
      if (in.preemptions > 0 && c->first && c->pos0 + c->n > in.prompt_len) h->recompute_generated++;
      if (c->seq == h->log_seq && h->n_log < 64)
        h->log[h->n_log][0] = c->pos0, h->log[h->n_log][1] = c->n, h->log[h->n_log++][2] = c->sample;
      for (int64_t p = c->pos0; p < c->pos0 + c->n; p++) {
        int64_t *row = kv_row(h, r, c->blocks[p / h->o.block_size], p);
        row[0] = c->seq, row[1] = p, row[2] = c->tokens[p - c->pos0];
      }
      // The fake model verifies: row j's token is the one at position
      // pos0 + j + 1; the drafts agreeing with it are kept, then one more.
      int64_t kept = c->n;
      if (c->n_draft > 0) {
        int32_t *out = sampled[r] + k;
        kept = 0;
        for (int64_t j = 0; j <= c->n_draft; j++) {
          out[j] = fake_next(c->seq, c->pos0 + j + 1 + (h->wrong_model ? 1 : 0), h->vocab);
          kept = j + 1;
          if (j == c->n_draft || out[j] != c->tokens[1 + j]) break;
        }
        for (int64_t j = kept; j <= c->n_draft; j++) out[j] = -1;
        h->drafted += c->n_draft, h->accepted += kept - 1, h->verifications++;
      }
      h->shadow[c->seq] = c->pos0 + kept;
      if (!h->running[c->seq]) {
        h->shared[c->seq] = in.shared_blocks + in.cached_blocks;
        h->cached_admissions += in.cached_blocks > 0, h->blocks_cached += in.cached_blocks;
        h->shared_admissions += in.shared_blocks > 0, h->blocks_shared += in.shared_blocks;
        h->alone_siblings += h->e[c->seq].leader >= 0 && in.shared_blocks == 0;
      }
      h->running[c->seq] = true;
      h->table[c->seq] = realloc(h->table[c->seq], (size_t)c->n_blocks * sizeof(int32_t));
      memcpy(h->table[c->seq], c->blocks, (size_t)c->n_blocks * sizeof(int32_t));
      // Rejected drafts' blocks go back: the table holds the kept rows' blocks.
      h->n_table[c->seq] = c->n_draft > 0 ? (h->shadow[c->seq] + h->o.block_size - 1) / h->o.block_size : c->n_blocks;
      tokens += c->n;
      if (c->n_draft > 0)
        k += 1 + c->n_draft;
      else if (c->sample)
        sampled[r][k++] = fake_next(c->seq, c->pos0 + c->n + (h->wrong_model ? 1 : 0), h->vocab);
    }
    if (tokens > h->max_step_tokens) h->max_step_tokens = tokens;
  }
  tpr_status rc = tpr_sched_update(h->s, &st, (const int32_t *const *)sampled);
  for (int r = 0; r < 3; r++) free(sampled[r]);
  FAIL_IF(rc != TPR_OK, "tpr_sched_update: %s", tpr_last_error());
  // Blocks held = exactly what the unfinished sequences' computed rows
  // need, each block as many times as live tables list it.
  for (int64_t i = 0; i < h->submitted; i++) {
    tpr_sched_seq_info in;
    TT_OK(tpr_sched_seq(h->s, i, &in));
    if (in.finished && h->finish_step[i] < 0) h->finish_step[i] = h->step, h->running[i] = false, forget_table(h, i);
    FAIL_IF(!in.finished && h->n_table[i] != (h->shadow[i] + h->o.block_size - 1) / h->o.block_size,
            "seq %lld holds %lld blocks for %lld computed rows", (long long)i, (long long)h->n_table[i],
            (long long)h->shadow[i]);
  }
  for (int r = 0; r < h->o.replicas; r++) {
    int64_t held = 0;
    for (int32_t b = 0; b < h->o.pool_blocks; b++) {
      int32_t holders = 0;
      for (int64_t i = 0; i < h->submitted; i++) {
        tpr_sched_seq_info in;
        TT_OK(tpr_sched_seq(h->s, i, &in));
        for (int64_t k = 0; in.replica == r && k < h->n_table[i]; k++) holders += h->table[i][k] == b;
      }
      FAIL_IF(tpr_sched_block_refs(h->s, r, b) != holders,
              "step %lld replica %d: block %d has %d holders, the pool counts %d (freed while referenced?)",
              (long long)h->step, r, b, holders, tpr_sched_block_refs(h->s, r, b));
      held += holders > 0;
    }
    if (held > h->peak_blocks) h->peak_blocks = held;
    FAIL_IF(tpr_sched_blocks_in_use(h->s, r) != held, "step %lld replica %d: %lld blocks in use, want %lld",
            (long long)h->step, r, (long long)tpr_sched_blocks_in_use(h->s, r), (long long)held);
  }
  return NULL;
}

// Runs to the end and compares every sequence with its expected tokens.
static const char *h_run(harness *h) {
  while (h->submitted < h->n || tpr_sched_unfinished(h->s) > 0) {
    const char *bad = h_step(h);
    if (bad) return bad;
    FAIL_IF(h->step > 100000, "no end after %lld steps", (long long)h->step);
  }
  for (int64_t i = 0; i < h->n; i++) {
    tpr_sched_seq_info in;
    TT_OK(tpr_sched_seq(h->s, i, &in));
    FAIL_IF(!in.finished || in.len != h->e[i].len || memcmp(in.tokens, h->e[i].tok, (size_t)in.len * 4) != 0,
            "seq %lld: finished %d, len %lld want %lld, or tokens differ", (long long)i, in.finished,
            (long long)in.len, (long long)h->e[i].len);
  }
  for (int r = 0; r < h->o.replicas; r++)
    FAIL_IF(tpr_sched_blocks_in_use(h->s, r) != 0, "replica %d keeps %lld blocks after the end", r,
            (long long)tpr_sched_blocks_in_use(h->s, r));
  return NULL;
}

static tpr_sched_opts opts(int replicas, int64_t pool, int64_t bs, int64_t batch, int64_t tokens, int64_t max_seq) {
  return (tpr_sched_opts){.replicas = replicas, .pool_blocks = pool, .block_size = bs, .max_batch = batch,
                          .max_tokens = tokens, .max_seq = max_seq};
}

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
    tpr_sched_opts o = opts((int)tt_randint(1, 3), 1, bs, tt_randint(1, 8), tt_randint(1, 64), 1);
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
    h_init(&h, opts(replicas, 8, 2, 8, 64, 64), 4 * replicas, 1000);
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
  h_init(&h, opts(1, 2, 4, 4, 16, 64), 3, 1000);
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
  h_init(&h, opts(1, 64, 4, 4, 64, 128), 2, 1000);
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
  h_init(&h, opts(1, 64, 4, 1, 64, 128), 6, 1000);
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
  h_init(&h, opts(1, 64, 4, 4, 5, 128), 1, 1000);
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
  h_init(&h, opts(1, 32, 4, 8, 64, 64), 3, 1000);
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
  h_init(&h, opts(2, 16, 2, 4, 8, 64), 4, 50);
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
  h_init(&g, opts(1, 64, 4, 8, 64, 64), n, 1000);
  exp_init_group(g.e, 0, n, 10, news, 1000, 0);
  g.log_seq = 1;
  const char *bad = h_run(&g);
  if (bad) fail_msg("group: %s", bad);
  h_init(&sep, opts(1, 64, 4, 8, 64, 64), n, 1000);
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

  h_init(&g, opts(1, 64, 4, 8, 5, 64), 3, 1000);
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
    tpr_sched_opts o = opts(1, 32, 4, 8, 64, 64);
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
