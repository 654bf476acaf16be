// The batched engine's step (engine/engine.h): rank 0 plans and encodes the
// step, every rank checks and lays out the broadcast plan, runs the session
// step, samples its replica's rows (with each sequence's logit processing,
// and logprobs of the raw rows), and one all-gather brings every replica's
// tokens and logprob records to rank 0.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_impl.h"
#include "engine/session_impl.h"

// The broadcast plan of a step, int64 words:
//   header    HDR_WORDS words: T, N, replicas, top: the most top_logprobs
//             of any chunk that records logprobs (-1: none does)
//   per replica: n_chunks, then per chunk CHUNK_WORDS words, its n tokens,
//             its n_blocks block ids, then C_EXTRA words: none unless the
//             chunk samples a sequence with logit processing or logprobs;
//             then X_WORDS words and
//               n_bias    (id, f32 bits of the bias) pairs, in request order
//               n_seen    distinct ids of prompt + generated (repetition on)
//               n_gen     (id, count) pairs of the generated tokens
//                         (frequency or presence on)
//               mask      tpr_mask_words(vocab) words of the ids a grammar
//                         allows (X_MASK 1; structured output)
// Other ranks keep no sequence history: the extra words are all they know
// of it. Every rank checks the whole plan (check_plan) before using any.
enum { HDR_T, HDR_N, HDR_REPLICAS, HDR_TOP, HDR_WORDS };
// C_STATE: the sequence's recurrent state slot (a hybrid family's), else -1.
// C_DRAFT: a verification's drafts (its last C_DRAFT tokens; each of its
// last 1 + C_DRAFT rows is sampled), else 0. C_SELF: 1 when every rank of
// its replica drafts them first (self-speculation, self_drafts) over the
// placeholders rank 0 sent. C_RECOMP: its first C_RECOMP tokens run again
// after a state rollback (tpr_sched_chunk.recompute), else 0. C_PROMPT:
// the sequence's prompt length (tpr_step.prefill_lens).
enum { C_SEQ, C_POS0, C_N, C_SAMPLE, C_FIRST, C_NBLOCKS, C_TOP_K, C_TEMP, C_TOP_P, C_SEED, C_GEN, C_STATE, C_DRAFT,
       C_SELF, C_RECOMP, C_PROMPT, C_EXTRA, CHUNK_WORDS };
// X_LOGPROBS: top_logprobs, or -1 (no logprobs); X_MASKED_STOP: the stop
// token while min_new is pending, or -1; penalties as f64 bits.
enum { X_LOGPROBS, X_MASKED_STOP, X_N_BIAS, X_N_SEEN, X_N_GEN, X_REP, X_FREQ, X_PRES, X_MASK, X_WORDS };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t f64_word(double d) {
  int64_t w;
  memcpy(&w, &d, sizeof w);
  return w;
}

static double word_f64(int64_t w) {
  double d;
  memcpy(&d, &w, sizeof d);
  return d;
}

static int32_t f32_bits(float f) {
  int32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(int64_t w) {
  int32_t u = (int32_t)w;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static tpr_status msg_reserve(tpr_engine *e, int64_t words) {
  if (words <= e->msg_cap) return TPR_OK;
  int64_t *m = realloc(e->msg, (size_t)words * sizeof *m);
  if (!m) return TPR_FAIL(TPR_ERR_OOM, "engine: step plan");
  e->msg = m, e->msg_cap = words;
  return TPR_OK;
}

// ---- encoding (rank 0)

static bool penalises_counts(const tpr_gen_params *g) { return g->frequency_penalty != 0 || g->presence_penalty != 0; }

// Whether sampling sequence g's token number `gen` needs extra words.
static bool needs_extra(const tpr_gen_params *g, int64_t gen) {
  return g->logprobs || g->n_logit_bias > 0 || (g->stop_token >= 0 && gen < g->min_new) ||
         tpr_repetition_on(g->repetition_penalty) || penalises_counts(g) || g->constraint;
}

// Writes a sampled chunk's extra words at x (room for extra_bound words);
// returns how many.
static int64_t encode_extra(tpr_engine *e, const tpr_gen_params *g, const tpr_sched_seq_info *si, int64_t *x) {
  const int64_t gen = si->len - si->prompt_len;
  x[X_LOGPROBS] = g->logprobs ? g->top_logprobs : -1;
  x[X_MASKED_STOP] = g->stop_token >= 0 && gen < g->min_new ? g->stop_token : -1;
  x[X_REP] = f64_word(g->repetition_penalty), x[X_FREQ] = f64_word(g->frequency_penalty);
  x[X_PRES] = f64_word(g->presence_penalty);
  int64_t at = X_WORDS;
  for (int64_t i = 0; i < g->n_logit_bias; i++) x[at++] = g->logit_bias[i].id, x[at++] = f32_bits(g->logit_bias[i].bias);
  int32_t *ids = e->proc_ids, *counts = ids + si->len;
  x[X_N_SEEN] = tpr_repetition_on(g->repetition_penalty) ? tpr_logit_tally(si->tokens, si->len, e->tally, ids, NULL) : 0;
  for (int64_t i = 0; i < x[X_N_SEEN]; i++) x[at++] = ids[i];
  x[X_N_GEN] = penalises_counts(g) ? tpr_logit_tally(si->tokens + si->prompt_len, gen, e->tally, ids, counts) : 0;
  for (int64_t i = 0; i < x[X_N_GEN]; i++) x[at++] = ids[i], x[at++] = counts[i];
  x[X_N_BIAS] = g->n_logit_bias;
  x[X_MASK] = g->constraint != NULL;
  if (g->constraint) {  // the grammar's mask for the next token, from the tokens generated so far
    const double t0 = now_s();
    tpr_token_constraint_mask(g->constraint, si->tokens + si->prompt_len, gen, (uint64_t *)(x + at));
    e->mask_s += now_s() - t0;
    at += tpr_mask_words(e->vocab);
  }
  return at;
}

// At most the extra words of a sampled chunk of a sequence of len tokens.
static int64_t extra_bound(const tpr_engine *e, const tpr_gen_params *g, int64_t len) {
  return X_WORDS + 2 * g->n_logit_bias + 3 * len + (g->constraint ? tpr_mask_words(e->vocab) : 0);
}

// Rank 0, before planning: each speculating sequence's drafts
// (engine/speculative.h) to the scheduler, which gives them to the step's
// decodes. Sequences that finished leave the list.
static tpr_status propose_drafts(tpr_engine *e) {
  int64_t kept = 0;
  for (int64_t i = 0; i < e->n_spec; i++) {
    const int64_t id = e->spec_ids[i];
    tpr_sched_seq_info si;
    if (e->seqs[id].released) continue;
    TPR_CHECK(tpr_sched_seq(e->sched, id, &si));
    if (si.finished) continue;
    e->spec_ids[kept++] = id;
    const tpr_gen_params *g = &e->seqs[id].g;
    if (needs_extra(g, si.len - si.prompt_len)) continue;  // processed rows are sampled one per step
    if (g->spec.kind == TPR_SPEC_SELF) {  // drafted by the model after planning (self_drafts)
      TPR_CHECK(tpr_sched_set_draft(e->sched, id, NULL, g->spec.k));
      continue;
    }
    int64_t k = g->spec.kind == TPR_SPEC_EXTERNAL
                    ? e->o.draft(e->o.draft_ctx, id, si.tokens, si.len, g->spec.k, e->draft)
                    : tpr_spec_draft(&g->spec, si.tokens, si.len, e->draft);
    if (k < 0 || k > g->spec.k)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: the external drafter gave %lld drafts of %d", (long long)k,
                      g->spec.k);
    for (int64_t j = 0; j < k; j++)
      if (e->draft[j] < 0 || e->draft[j] >= e->vocab)
        return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: draft token %d is outside the vocabulary", e->draft[j]);
    if (k > 0) TPR_CHECK(tpr_sched_set_draft(e->sched, id, e->draft, k));
  }
  e->n_spec = kept;
  return TPR_OK;
}

// Rank 0: the scheduler's plan as words; e->msg_words = 0 when idle.
static tpr_status encode_plan(tpr_engine *e, const tpr_sched_step *st) {
  int64_t n = HDR_WORDS, most = 1, most_samples = 0, B = e->s->pool.batch;
  for (int r = 0; r < st->replicas; r++) {
    int64_t toks = 0, samples = 0;
    n += 1;
    for (int64_t i = 0; i < st->n_chunks[r]; i++) {
      const tpr_sched_chunk *c = &st->chunks[r][i];
      n += CHUNK_WORDS + c->n + c->n_blocks;
      if (c->sample) n += extra_bound(e, &e->seqs[c->seq].g, c->pos0 + c->n);
      toks += c->n;
      samples += c->sample ? 1 + c->n_draft : 0;
    }
    if (toks > most) most = toks;
    if (samples > most_samples) most_samples = samples;
  }
  e->msg_words = 0;
  if (st->tokens == 0) return TPR_OK;
  TPR_CHECK(msg_reserve(e, n));
  int64_t *m = e->msg, T = pow2_at_least(most);
  // Rows sampled: B as always, more (a power of two, <= T) when drafts need them.
  m[HDR_T] = T, m[HDR_N] = most_samples <= B ? (T < B ? T : B) : pow2_at_least(most_samples);
  m[HDR_REPLICAS] = st->replicas, m[HDR_TOP] = -1;
  int64_t at = HDR_WORDS;
  for (int r = 0; r < st->replicas; r++) {
    m[at++] = st->n_chunks[r];
    for (int64_t i = 0; i < st->n_chunks[r]; i++) {
      const tpr_sched_chunk *c = &st->chunks[r][i];
      const tpr_gen_params *g = &e->seqs[c->seq].g;
      tpr_sched_seq_info si;
      TPR_CHECK(tpr_sched_seq(e->sched, c->seq, &si));
      int64_t *w = m + at;
      w[C_SEQ] = c->seq, w[C_POS0] = c->pos0, w[C_N] = c->n, w[C_SAMPLE] = c->sample, w[C_FIRST] = c->first;
      w[C_NBLOCKS] = c->n_blocks, w[C_TOP_K] = g->sampling.top_k;
      w[C_TEMP] = f64_word(g->sampling.temperature), w[C_TOP_P] = f64_word(g->sampling.top_p);
      w[C_SEED] = (int64_t)g->sampling.seed, w[C_GEN] = si.len - si.prompt_len, w[C_STATE] = c->state_slot;
      w[C_DRAFT] = c->n_draft, w[C_SELF] = c->drafts_later, w[C_RECOMP] = c->recompute, w[C_PROMPT] = si.prompt_len;
      at += CHUNK_WORDS;
      for (int64_t j = 0; j < c->n; j++) m[at++] = c->tokens[j];
      for (int64_t j = 0; j < c->n_blocks; j++) m[at++] = c->blocks[j];
      w[C_EXTRA] = c->sample && needs_extra(g, w[C_GEN]) ? encode_extra(e, g, &si, m + at) : 0;
      if (w[C_EXTRA] && m[at + X_LOGPROBS] > m[HDR_TOP]) m[HDR_TOP] = m[at + X_LOGPROBS];
      at += w[C_EXTRA];
    }
  }
  e->msg_words = at;
  return TPR_OK;
}

// ---- checking and walking (every rank)

#define PLAN_BAD(...) TPR_FAIL(TPR_ERR_INTERNAL, "engine: malformed step plan: " __VA_ARGS__)

static bool ids_in(const int64_t *x, int64_t n, int64_t stride, int64_t lo, int64_t hi) {
  for (int64_t i = 0; i < n; i++)
    if (x[i * stride] < lo || x[i * stride] >= hi) return false;
  return true;
}

// A chunk's extra section of `words` words.
static tpr_status check_extra(const tpr_engine *e, const int64_t *x, int64_t words, int64_t top) {
  const int64_t V = e->vocab, max_seq = e->limits.max_seq;
  if (words < X_WORDS) return PLAN_BAD("an extra section of %lld words", (long long)words);
  const int64_t nb = x[X_N_BIAS], ns = x[X_N_SEEN], ng = x[X_N_GEN];
  if (x[X_LOGPROBS] < -1 || x[X_LOGPROBS] > top || x[X_MASKED_STOP] < -1 || x[X_MASKED_STOP] >= V ||
      nb < 0 || nb > TPR_MAX_LOGIT_BIAS || ns < 0 || ns > max_seq || ng < 0 || ng > max_seq ||
      (x[X_MASK] != 0 && x[X_MASK] != 1) ||
      words != X_WORDS + 2 * nb + ns + 2 * ng + x[X_MASK] * tpr_mask_words(V))
    return PLAN_BAD("extra section (logprobs %lld, stop %lld, %lld bias, %lld seen, %lld generated) in %lld words",
                    (long long)x[X_LOGPROBS], (long long)x[X_MASKED_STOP], (long long)nb, (long long)ns,
                    (long long)ng, (long long)words);
  const int64_t *bias = x + X_WORDS, *seen = bias + 2 * nb, *gen = seen + ns;
  if (!ids_in(bias, nb, 2, 0, V) || !ids_in(seen, ns, 1, 0, V) || !ids_in(gen, ng, 2, 0, V) ||
      !ids_in(gen + 1, ng, 2, 1, max_seq + 1))
    return PLAN_BAD("an id outside the vocabulary or a count outside [1, max_seq] in an extra section");
  for (int64_t i = 0; i < nb; i++)
    if (!isfinite(bits_f32(bias[2 * i + 1]))) return PLAN_BAD("a bias that is not finite");
  if (!isfinite(word_f64(x[X_REP])) || !isfinite(word_f64(x[X_FREQ])) || !isfinite(word_f64(x[X_PRES])))
    return PLAN_BAD("a penalty that is not finite");
  return TPR_OK;
}

// Every count, range and length of the broadcast plan, before any is used.
static tpr_status check_plan(const tpr_engine *e) {
  const tpr_session_pool *p = &e->s->pool;
  const int64_t *m = e->msg, words = e->msg_words, B = p->batch;
  if (words < HDR_WORDS) return PLAN_BAD("%lld words", (long long)words);
  const int64_t T = m[HDR_T], N = m[HDR_N], top = m[HDR_TOP];
  if (T < 1 || T > e->step_cap || N < 0 || N > e->sample_cap || N > T || m[HDR_REPLICAS] != e->replicas || top < -1 ||
      top > TPR_MAX_TOP_LOGPROBS)
    return PLAN_BAD("header T %lld N %lld replicas %lld top %lld", (long long)T, (long long)N,
                    (long long)m[HDR_REPLICAS], (long long)top);
  int64_t at = HDR_WORDS, most_top = -1;
  for (int r = 0; r < e->replicas; r++) {
    if (at >= words || m[at] < 0 || m[at] > B) return PLAN_BAD("replica %d's chunk count", r);
    int64_t n_chunks = m[at++], tokens = 0, samples = 0;
    for (int64_t i = 0; i < n_chunks; i++) {
      if (words - at < CHUNK_WORDS) return PLAN_BAD("replica %d chunk %lld is cut short", r, (long long)i);
      const int64_t *w = m + at, n = w[C_N], nb = w[C_NBLOCKS], extra = w[C_EXTRA];
      if (w[C_SEQ] < 0 || w[C_POS0] < 0 || n < 1 || n > T || nb < 0 || nb > p->max_blocks ||
          w[C_POS0] > nb * p->block_size - n || (w[C_SAMPLE] != 0 && w[C_SAMPLE] != 1) || extra < 0 ||
          (extra > 0 && !w[C_SAMPLE]) || w[C_GEN] < 0 || extra > words - at - CHUNK_WORDS - n - nb ||
          words - at - CHUNK_WORDS < n + nb ||
          (p->state_slots ? w[C_STATE] < 0 || w[C_STATE] >= p->state_slots : w[C_STATE] != -1) ||
          w[C_DRAFT] < 0 || w[C_DRAFT] > e->o.max_draft || w[C_DRAFT] >= n ||
          (w[C_SELF] != 0 && w[C_SELF] != 1) || (w[C_SELF] && (!w[C_DRAFT] || !e->o.draft_layers)) ||
          (w[C_DRAFT] > 0 && (!w[C_SAMPLE] || extra > 0)) || w[C_RECOMP] < 0 || w[C_RECOMP] > n ||
          (w[C_RECOMP] > 0 && (!p->state_slots || w[C_DRAFT] > 0)) || w[C_PROMPT] < 1 ||
          w[C_PROMPT] > p->max_blocks * p->block_size)
        return PLAN_BAD("replica %d chunk %lld: pos0 %lld n %lld blocks %lld extra %lld state slot %lld drafts %lld",
                        r, (long long)i, (long long)w[C_POS0], (long long)n, (long long)nb, (long long)extra,
                        (long long)w[C_STATE], (long long)w[C_DRAFT]);
      const int64_t *tok = w + CHUNK_WORDS, *blk = tok + n;
      if (!ids_in(tok, n, 1, 0, e->vocab) || !ids_in(blk, nb, 1, 0, p->blocks))
        return PLAN_BAD("replica %d chunk %lld: a token or block id out of range", r, (long long)i);
      if (extra > 0) {
        TPR_CHECK(check_extra(e, blk + nb, extra, top));
        if (blk[nb + X_LOGPROBS] > most_top) most_top = blk[nb + X_LOGPROBS];
      }
      tokens += n, samples += w[C_SAMPLE] ? 1 + w[C_DRAFT] : 0;
      at += CHUNK_WORDS + n + nb + extra;
    }
    if (tokens > T || samples > N)
      return PLAN_BAD("replica %d runs %lld tokens, %lld samples in a step of %lld, %lld", r, (long long)tokens,
                      (long long)samples, (long long)T, (long long)N);
  }
  if (at != words || most_top != top)
    return PLAN_BAD("%lld words used of %lld; top %lld, chunks record up to %lld", (long long)at, (long long)words,
                    (long long)top, (long long)most_top);
  return TPR_OK;
}

// One chunk of a checked plan, as plan_next walks them in order.
typedef struct plan_chunk {
  int replica;
  int64_t index, n_chunks;                  // its place in its replica's chunks
  const int64_t *w, *tokens, *blocks, *extra;  // CHUNK_WORDS words, n tokens, n_blocks ids, w[C_EXTRA] words
} plan_chunk;

typedef struct plan_cursor {
  const int64_t *m;
  int64_t at, index, n_chunks;
  int replica;
} plan_cursor;

static plan_cursor plan_begin(const tpr_engine *e) {
  return (plan_cursor){.m = e->msg, .at = HDR_WORDS, .replica = -1};
}

static bool plan_next(plan_cursor *c, plan_chunk *out) {
  while (c->index == c->n_chunks) {
    if (++c->replica >= c->m[HDR_REPLICAS]) return false;
    c->n_chunks = c->m[c->at++], c->index = 0;
  }
  const int64_t *w = c->m + c->at;
  *out = (plan_chunk){.replica = c->replica, .index = c->index++, .n_chunks = c->n_chunks, .w = w,
                      .tokens = w + CHUNK_WORDS, .blocks = w + CHUNK_WORDS + w[C_N],
                      .extra = w + CHUNK_WORDS + w[C_N] + w[C_NBLOCKS]};
  c->at += CHUNK_WORDS + w[C_N] + w[C_NBLOCKS] + w[C_EXTRA];
  return true;
}

// The negative control of the state slots: the chunks that continue a
// sequence (not from position 0) take each other's slots in turn (each the
// next such chunk's, the last the first's), as debug_wrong_blocks does with
// block tables; every slot is still used once. (A fixed permutation of
// every chunk's slot would be consistent from step to step, and right.)
static void wrong_state_slots(int32_t *ss, const int32_t *pos, int64_t n) {
  int32_t *orig = malloc((size_t)(n ? n : 1) * sizeof *orig);
  int64_t *start = malloc((size_t)(n + 1) * sizeof *start), m = 0;  // the continuing chunks' first rows
  if (!orig || !start) goto done;  // test only: the control is then not applied (and the test fails)
  memcpy(orig, ss, (size_t)n * sizeof *orig);
  for (int64_t t = 0, u; t < n; t = u) {
    for (u = t; u < n && orig[u] == orig[t];) u++;
    if (pos[t] > 0) start[m++] = t;
  }
  for (int64_t i = 0; m > 1 && i < m; i++)
    for (int64_t k = start[i]; k < n && orig[k] == orig[start[i]]; k++) ss[k] = orig[start[(i + 1) % m]];
done:
  free(orig), free(start);
}

static tpr_status copy_state(tpr_engine *e, int64_t slot, bool save);

// Self-speculation (every rank): the C_SELF chunks of this rank's replica
// get their drafts, written over rank 0's placeholders in the plan words.
// Round i runs one row per such chunk with drafts left -- its token at
// position pos0 + i: the chunk's first token, then draft i - 1 -- through
// the first draft_layers layers (their KV rows written in the chunk's own
// blocks, which the plan took for every draft), and draft i is the row's
// argmax. Every replica runs the same rounds at the same shape, so the
// programs' collectives pair up.
static tpr_status self_drafts(tpr_engine *e) {
  const tpr_session_pool *p = &e->s->pool;
  const int64_t V = e->vocab, MB = p->max_blocks, bs = p->block_size;
  int64_t rounds = 0, most = 0, count = 0;
  int replica = -1;
  plan_cursor cur = plan_begin(e);
  plan_chunk c;
  while (plan_next(&cur, &c)) {
    if (c.replica != replica) replica = c.replica, count = 0;
    if (!c.w[C_SELF]) continue;
    most = ++count > most ? count : most;
    rounds = c.w[C_DRAFT] > rounds ? c.w[C_DRAFT] : rounds;
  }
  const int64_t T = pow2_at_least(most);
  for (int64_t i = 0; i < rounds; i++) {
    memset(e->blocks, 0, (size_t)(p->batch * MB) * sizeof *e->blocks);
    tpr_step st = {.T = T, .N = T, .tokens = e->tokens, .positions = e->positions, .slots = e->slots, .seq = e->seq,
                   .block_tables = e->blocks, .sample_rows = e->rows, .layers = e->o.draft_layers,
                   .state_slots = p->state_slots ? e->state_slots : NULL, .prefill_lens = e->prefill_lens};
    for (cur = plan_begin(e); plan_next(&cur, &c);) {
      const int64_t *w = c.w;
      if (c.replica != e->replica || !w[C_SELF] || w[C_DRAFT] <= i) continue;
      const int64_t t = st.n_tokens++, pos = w[C_POS0] + i;
      for (int64_t b = 0; b < w[C_NBLOCKS]; b++) e->blocks[c.index * MB + b] = (int32_t)c.blocks[b];
      e->tokens[t] = (int32_t)c.tokens[i], e->positions[t] = (int32_t)pos, e->seq[t] = (int32_t)c.index;
      e->slots[t] = (int32_t)(c.blocks[pos / bs] * bs + pos % bs);
      e->state_slots[t] = (int32_t)w[C_STATE];  // a hybrid model's: one row per slot, read then written
      e->prefill_lens[t] = (int32_t)w[C_PROMPT];
      e->rows[st.n_samples++] = (int32_t)t;
      e->draft_words[t] = (int64_t *)(c.tokens + 1 + i);  // the plan's own copy on this rank
    }
    TPR_CHECK(tpr_session_step(e->s, &st, e->logits));
    for (int64_t t = 0; t < st.n_samples; t++) *e->draft_words[t] = tpr_sample_argmax(e->logits + t * V, V);
  }
  // A hybrid model: the draft rounds moved the first layers' states through
  // the drafts; the verification starts from the state before them (the
  // step's snapshot, taken before the drafts and kept for the rollback).
  for (cur = plan_begin(e); e->snap && !e->o.debug_skip_state_restore && rounds > 0 && plan_next(&cur, &c);)
    if (c.replica == e->replica && c.w[C_SELF]) TPR_CHECK(copy_state(e, c.w[C_STATE], false));
  return TPR_OK;
}

// Lays this rank's replica's chunks out as a session step; fills info.
static void decode_plan(tpr_engine *e, tpr_step *st, tpr_engine_step_info *info) {
  const tpr_session_pool *p = &e->s->pool;
  const int64_t *m = e->msg, MB = p->max_blocks, bs = p->block_size;
  memset(e->blocks, 0, (size_t)(p->batch * MB) * sizeof *e->blocks);
  *st = (tpr_step){.T = m[HDR_T], .N = m[HDR_N], .tokens = e->tokens, .positions = e->positions, .slots = e->slots,
                   .seq = e->seq, .block_tables = e->blocks, .sample_rows = e->rows,
                   .state_slots = p->state_slots ? e->state_slots : NULL, .prefill_lens = e->prefill_lens};
  info->program_tokens = m[HDR_T];
  plan_cursor cur = plan_begin(e);
  plan_chunk c;
  while (plan_next(&cur, &c)) {
    const int64_t *w = c.w, n = w[C_N], i = c.index;
    const int64_t fresh = n - w[C_DRAFT] - w[C_RECOMP];  // rows run for the first time, drafts apart
    info->tokens += fresh;
    info->sequences++;
    info->draft_tokens += w[C_DRAFT];
    info->recomputed_tokens += w[C_RECOMP];
    if (fresh == 1 && !w[C_FIRST])  // a decode (after its recomputed rows), or a verification of its drafts
      info->decode_tokens++;
    else
      info->prefill_tokens += fresh;
    if (c.replica != e->replica) continue;
    for (int64_t b = 0; b < w[C_NBLOCKS]; b++) e->blocks[i * MB + b] = (int32_t)c.blocks[b];
    for (int64_t j = 0; j < n; j++) {
      int64_t t = st->n_tokens++, pos = w[C_POS0] + j;
      int64_t row = e->o.debug_wrong_blocks ? (i + 1) % c.n_chunks : i;  // negative control
      e->tokens[t] = (int32_t)c.tokens[j], e->positions[t] = (int32_t)pos, e->seq[t] = (int32_t)row;
      e->slots[t] = (int32_t)(c.blocks[pos / bs] * bs + pos % bs);
      e->state_slots[t] = (int32_t)w[C_STATE];
      e->prefill_lens[t] = (int32_t)w[C_PROMPT];
    }
    for (int64_t j = w[C_SAMPLE] ? w[C_DRAFT] : -1; j >= 0; j--)  // a verification samples its last 1 + drafts rows
      e->rows[st->n_samples++] = (int32_t)(st->n_tokens - 1 - j);
  }
  if (e->o.debug_wrong_state_slot && p->state_slots) wrong_state_slots(e->state_slots, e->positions, st->n_tokens);
}

// ---- a hybrid model's state rollback (speculative decoding; every rank)

// Copies state slot `slot` of every recurrent layer's pool to its snapshot
// (save) or back. Each rank copies its own heads' share of the state (tp
// shards it by heads); a backend copy, so the state never leaves the device.
static tpr_status copy_state(tpr_engine *e, int64_t slot, bool save) {
  tpr_session *s = e->s;
  const int64_t NS = s->pool.state_slots;
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    if (!e->snap[L]) continue;
    const size_t bytes = (size_t)(tpr_tensor_numel(s->states[L]) / NS) * sizeof(float);
    char *live = (char *)tpr_tensor_data(s->states[L]) + (size_t)slot * bytes;
    char *kept = (char *)tpr_tensor_data(e->snap[L]) + (size_t)slot * bytes;
    TPR_CHECK(s->be->vt->copy_device(s->be->ctx, save ? kept : live, save ? live : kept, bytes));
  }
  return TPR_OK;
}

// Before the step: the state slot of each verification of this rank's
// replica, as it is before its k + 1 rows run (they absorb every draft).
static tpr_status snapshot_states(tpr_engine *e) {
  if (!e->snap) return TPR_OK;
  const double t0 = now_s();
  plan_cursor cur = plan_begin(e);
  plan_chunk c;
  while (plan_next(&cur, &c))
    if (c.replica == e->replica && c.w[C_DRAFT] > 0) TPR_CHECK(copy_state(e, c.w[C_STATE], true));
  e->state_copy_s += now_s() - t0;
  return TPR_OK;
}

// After sampling (every rank of a replica has the same tokens): a
// verification that rejected a draft gets its slot's state back from the
// snapshot; the scheduler has the kept tokens recomputed from it in the next
// step (scheduler.h, state_slots). One that accepted every draft keeps its
// state: it has absorbed exactly the tokens kept.
static tpr_status restore_states(tpr_engine *e) {
  if (!e->snap || e->o.debug_skip_state_restore) return TPR_OK;  // the negative control skips it
  const double t0 = now_s();
  plan_cursor cur = plan_begin(e);
  plan_chunk c;
  int64_t k = 0;
  while (plan_next(&cur, &c)) {
    const int64_t nd = c.w[C_DRAFT];
    if (c.replica != e->replica || !c.w[C_SAMPLE]) continue;
    int64_t m = 0;  // tokens the verification gives (sample_replica's layout: -1 after the last)
    while (m <= nd && e->sampled[k + m] >= 0) m++;
    if (nd > 0 && m - 1 < nd) TPR_CHECK(copy_state(e, c.w[C_STATE], false));
    k += 1 + nd;
  }
  e->state_copy_s += now_s() - t0;
  return TPR_OK;
}

// ---- sampling (every rank of a replica alike)

// The logit processing a chunk's extra words describe (ids copied out of
// the words into the engine's scratch).
static tpr_logit_proc read_processing(tpr_engine *e, const int64_t *x) {
  const int64_t nb = x[X_N_BIAS], ns = x[X_N_SEEN], ng = x[X_N_GEN];
  const int64_t *bias = x + X_WORDS, *seen = bias + 2 * nb, *gen = seen + ns;
  int32_t *seen_ids = e->proc_ids, *gen_ids = seen_ids + ns, *gen_counts = gen_ids + ng;
  for (int64_t i = 0; i < nb; i++) e->proc_bias[i] = (tpr_logit_bias){(int32_t)bias[2 * i], bits_f32(bias[2 * i + 1])};
  for (int64_t i = 0; i < ns; i++) seen_ids[i] = (int32_t)seen[i];
  for (int64_t i = 0; i < ng; i++) gen_ids[i] = (int32_t)gen[2 * i], gen_counts[i] = (int32_t)gen[2 * i + 1];
  return (tpr_logit_proc){.allow = x[X_MASK] ? (const uint64_t *)(gen + 2 * ng) : NULL,
                          .bias = e->proc_bias, .n_bias = nb, .masked_stop = (int32_t)x[X_MASKED_STOP],
                          .repetition_penalty = word_f64(x[X_REP]), .seen = seen_ids, .n_seen = ns,
                          .frequency_penalty = word_f64(x[X_FREQ]), .presence_penalty = word_f64(x[X_PRES]),
                          .gen_ids = gen_ids, .gen_counts = gen_counts, .n_gen = ng};
}

// Words per rank of the step's all-gather: the replica, B sampled tokens,
// then when any chunk records logprobs (top >= 0) B records of
// 1 + 2 * top words (the logprob's f32 bits, then top (id, f32 bits) pairs).
static int64_t record_words(int64_t top) { return 1 + 2 * top; }
static int64_t gather_words(const tpr_engine *e) {
  const int64_t N = e->msg[HDR_N], top = e->msg[HDR_TOP];
  return 1 + N + (top >= 0 ? N * record_words(top) : 0);
}

// Sample slot k's logprob record from the raw row (n_top < 0: none asked).
static void put_record(tpr_engine *e, int64_t k, const float *raw, int32_t token, int32_t n_top) {
  const int64_t N = e->msg[HDR_N], top = e->msg[HDR_TOP];
  int32_t *r = e->send + 1 + N + k * record_words(top);
  tpr_token_logprob rec = {0};
  if (n_top >= 0) tpr_logprobs_of(raw, e->vocab, token, n_top, &rec);
  r[0] = f32_bits(rec.logprob);
  for (int32_t j = 0; j < top; j++)
    r[1 + 2 * j] = j < rec.n_top ? rec.top_ids[j] : -1, r[2 + 2 * j] = f32_bits(rec.top_logprobs[j]);
}

// The draw for generated token number gen depends on (seed, gen) only.
static tpr_rng token_rng(uint64_t seed, int64_t gen) {
  return (tpr_rng){seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(gen + 1))};
}

// A verification (speculative decoding) at sample slot k: row j's token is
// drawn by the speculative rule against draft j (tpr_sample_verify); the
// first rejection gives the target's own token and ends it, and if every
// draft is accepted the last row gives one more. Slots after the last
// token given hold -1 (tpr_sched_update's layout).
static void verify_chunk(tpr_engine *e, const plan_chunk *c, const tpr_sampling *smp, int64_t k) {
  const int64_t V = e->vocab, *w = c->w, nd = w[C_DRAFT];
  for (int64_t j = 0; j <= nd; j++) {
    const float *raw = e->logits + (k + j) * V;
    tpr_rng rng = token_rng(smp->seed, w[C_GEN] + j);
    if (e->o.on_logits) e->o.on_logits(e->o.ctx, w[C_SEQ], w[C_GEN] + j, raw, V);
    bool accepted = false;
    if (j < nd && e->o.debug_accept_all_drafts) {  // negative control
      e->sampled[k + j] = (int32_t)c->tokens[1 + j];
      continue;
    }
    if (j < nd)
      e->sampled[k + j] = (int32_t)tpr_sample_verify(raw, V, smp, &rng, e->sample_scratch, c->tokens[1 + j], &accepted);
    else
      e->sampled[k + j] = (int32_t)tpr_sample(raw, V, smp, &rng, e->sample_scratch);
    if (!accepted) break;
  }
}

// Samples each sampled chunk of this rank's replica, in chunk order.
static void sample_replica(tpr_engine *e) {
  const int64_t V = e->vocab;
  plan_cursor cur = plan_begin(e);
  plan_chunk c;
  int64_t k = 0;
  while (plan_next(&cur, &c)) {
    const int64_t *w = c.w;
    if (c.replica != e->replica || !w[C_SAMPLE]) continue;
    tpr_sampling smp = {.temperature = word_f64(w[C_TEMP]), .top_k = w[C_TOP_K], .top_p = word_f64(w[C_TOP_P]),
                        .seed = (uint64_t)w[C_SEED]};
    if (w[C_DRAFT] > 0) {  // no extras: drafts go only to sequences without processing (propose_drafts)
      verify_chunk(e, &c, &smp, k);
      k += 1 + w[C_DRAFT];
      continue;
    }
    tpr_rng rng = token_rng(smp.seed, w[C_GEN]);
    const float *raw = e->logits + k * V, *row = raw;
    if (e->o.on_logits) e->o.on_logits(e->o.ctx, w[C_SEQ], w[C_GEN], raw, V);
    int32_t n_top = -1;
    if (w[C_EXTRA]) {
      n_top = (int32_t)c.extra[X_LOGPROBS];
      tpr_logit_proc proc = read_processing(e, c.extra);
      if (tpr_logit_proc_active(&proc)) {
        memcpy(e->row, raw, (size_t)V * sizeof *e->row);  // on_logits and logprobs keep the raw row
        tpr_logit_proc_apply(&proc, e->row, V);
        row = e->row;
      }
    }
    e->sampled[k] = (int32_t)tpr_sample(row, V, &smp, &rng, e->sample_scratch);
    if (e->msg[HDR_TOP] >= 0) put_record(e, k, raw, e->sampled[k], n_top);
    k++;
  }
}

// ---- collecting (rank 0)

// Rank 0: sequence seq's record of its generated token gen, from a
// replica's gathered words.
static tpr_status keep_record(tpr_engine *e, int64_t seq, int64_t gen, int32_t token, int32_t n_top,
                              const int32_t *r, int64_t top) {
  engine_seq *q = &e->seqs[seq];
  if (gen != q->n_lp)
    return TPR_FAIL(TPR_ERR_INTERNAL, "engine: sequence %lld's logprobs: token %lld after %lld records", (long long)seq,
                    (long long)gen, (long long)q->n_lp);
  if (q->n_lp == q->cap_lp) {
    int64_t cap = q->cap_lp ? 2 * q->cap_lp : 16;
    tpr_token_logprob *lp = realloc(q->lp, (size_t)cap * sizeof *lp);
    if (!lp) return TPR_FAIL(TPR_ERR_OOM, "engine: logprob records");
    q->lp = lp, q->cap_lp = cap;
  }
  tpr_token_logprob *rec = &q->lp[q->n_lp++];
  *rec = (tpr_token_logprob){.token = token, .logprob = bits_f32(r[0]), .n_top = n_top < e->vocab ? n_top : (int32_t)e->vocab};
  for (int32_t j = 0; j < rec->n_top && j < top; j++)
    rec->top_ids[j] = r[1 + 2 * j], rec->top_logprobs[j] = bits_f32(r[2 + 2 * j]);
  return TPR_OK;
}

// Every replica's sampled tokens (and logprob records) back to rank 0.
static tpr_status collect(tpr_engine *e, const tpr_sched_step *plan, tpr_engine_step_info *info) {
  const int64_t N = e->msg[HDR_N], world = tpr_comm_size(e->s->world), words = gather_words(e);
  const int64_t top = e->msg[HDR_TOP];
  if (world * words > e->gathered_cap) {
    int32_t *g = realloc(e->gathered, (size_t)(world * words) * sizeof *g);
    if (!g) return TPR_FAIL(TPR_ERR_OOM, "engine: the step's all-gather of %lld words", (long long)(world * words));
    e->gathered = g, e->gathered_cap = world * words;
  }
  TPR_CHECK(tpr_comm_all_gather(e->s->world, e->send, e->gathered, (size_t)words, TPR_I32));
  if (!e->sched) return TPR_OK;
  const int32_t *by_replica[64];
  if (e->replicas > 64) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "engine: more than 64 dp replicas");
  for (int r = 0; r < e->replicas; r++) {
    by_replica[r] = NULL;
    for (int64_t w = 0; w < world && !by_replica[r]; w++)
      if (e->gathered[w * words] == r) by_replica[r] = e->gathered + w * words + 1;
  }
  int64_t k[64] = {0};
  plan_cursor cur = plan_begin(e);
  plan_chunk c;
  while (top >= 0 && plan_next(&cur, &c)) {
    if (!c.w[C_SAMPLE]) continue;
    int64_t slot = k[c.replica];
    k[c.replica] += 1 + c.w[C_DRAFT];
    if (!c.w[C_EXTRA] || c.extra[X_LOGPROBS] < 0) continue;
    const int32_t *toks = by_replica[c.replica];
    TPR_CHECK(keep_record(e, c.w[C_SEQ], c.w[C_GEN], toks[slot], (int32_t)c.extra[X_LOGPROBS],
                          toks + N + slot * record_words(top), top));
  }
  // The plan's arrays die with the update: note the sampled sequences first.
  int64_t n = 0;
  for (int r = 0; r < plan->replicas; r++)
    for (int64_t i = 0; i < plan->n_chunks[r]; i++)
      if (plan->chunks[r][i].sample) e->finished[n++] = plan->chunks[r][i].seq;
  const int64_t accepted = tpr_sched_spec(e->sched).accepted;
  TPR_CHECK(tpr_sched_update(e->sched, plan, by_replica));
  info->accepted = tpr_sched_spec(e->sched).accepted - accepted;
  for (int64_t i = 0; i < n; i++) {
    tpr_sched_seq_info si;
    TPR_CHECK(tpr_sched_seq(e->sched, e->finished[i], &si));
    if (si.finished) e->finished[info->n_finished++] = e->finished[i];
  }
  info->finished = e->finished;
  return TPR_OK;
}

tpr_status tpr_engine_step(tpr_engine *e, tpr_engine_step_info *info) {
  memset(info, 0, sizeof *info);
  double t0 = now_s();
  e->mask_s = 0;
  tpr_sched_step plan = {0};
  int64_t words = 0;
  tpr_status rc = TPR_OK;
  if (e->sched) {
    rc = propose_drafts(e);
    if (rc == TPR_OK) rc = tpr_sched_next(e->sched, &plan);
    if (rc == TPR_OK) rc = encode_plan(e, &plan);
    words = rc == TPR_OK ? e->msg_words : -1;
    info->preempted = plan.preempted;
  }
  TPR_CHECK(tpr_comm_broadcast(e->s->world, &words, &words, 1, TPR_I64, 0));
  if (words < 0) return rc != TPR_OK ? rc : TPR_FAIL(TPR_ERR_INTERNAL, "engine: rank 0 could not plan the step");
  if (words == 0) {
    info->idle = true;
    return TPR_OK;
  }
  TPR_CHECK(msg_reserve(e, words));
  TPR_CHECK(tpr_comm_broadcast(e->s->world, e->msg, e->msg, (size_t)words, TPR_I64, 0));
  e->msg_words = words;
  TPR_CHECK(check_plan(e));
  e->state_copy_s = 0;
  TPR_CHECK(snapshot_states(e));  // before any draft round moves a state
  TPR_CHECK(self_drafts(e));
  tpr_step st;
  decode_plan(e, &st, info);
  for (int64_t i = 0; i < e->msg[HDR_N]; i++) e->sampled[i] = -1;
  // A replica with nothing to do still runs the (all padded) step: its
  // collectives pair with the other replicas' over ep.
  TPR_CHECK(tpr_session_step(e->s, &st, e->logits));
  sample_replica(e);
  TPR_CHECK(restore_states(e));
  TPR_CHECK(collect(e, &plan, info));
  info->seconds = now_s() - t0;
  info->mask_seconds = e->mask_s;
  info->state_copy_seconds = e->state_copy_s;
  return TPR_OK;
}
