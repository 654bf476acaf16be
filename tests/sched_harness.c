// The scheduler's test harness (sched_harness.h): the fake model, the
// expected sequences, and the checks of every planned step against a
// simulated paged KV cache. test_scheduler.c says what the checks catch.
#include "sched_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

int32_t fake_next(int64_t id, int64_t pos, int32_t vocab) {
  uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ull + (uint64_t)pos * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E9F8A1C2B3A497ull;
  x ^= x >> 29;
  return (int32_t)(x % (uint64_t)vocab);
}

// Builds the expected tokens of a sequence (id = its index).
void exp_init(exp_seq *e, int64_t id, int64_t prompt_len, int64_t max_new, int32_t stop, int32_t vocab,
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
void exp_init_group(exp_seq *e, int64_t id, int64_t n, int64_t prompt_len, const int64_t *max_new,
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

void h_init(harness *h, tpr_sched_opts o, int64_t n, int32_t vocab) {
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

void h_free(harness *h) {
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
void sync_shadow(harness *h) {
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
const char *check_step(harness *h, const tpr_sched_step *st) {
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
const char *h_step(harness *h) {
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
const char *h_run(harness *h) {
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

tpr_sched_opts sched_opts(int replicas, int64_t pool, int64_t bs, int64_t batch, int64_t tokens, int64_t max_seq) {
  return (tpr_sched_opts){.replicas = replicas, .pool_blocks = pool, .block_size = bs, .max_batch = batch,
                          .max_tokens = tokens, .max_seq = max_seq};
}
