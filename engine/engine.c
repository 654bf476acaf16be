// The batched engine's request side: creation, request checks, submission,
// results, release (engine/engine.h). The step lives in engine_step.c.
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "engine/session_impl.h"

// Speculative decoding on a hybrid model: a snapshot pool shaped as each
// recurrent layer's state pool (NS slots, this rank's heads), where a
// verification keeps its slot's state from before the step (engine_step.c,
// copy_state). NS = max_batch, so every sequence of a step has its own
// place; a snapshot is only read back in the step that took it.
static tpr_status alloc_snapshots(tpr_engine *e) {
  const tpr_session *s = e->s;
  if (!(e->snap = calloc((size_t)s->cfg.num_layers, sizeof *e->snap)))
    return TPR_FAIL(TPR_ERR_OOM, "engine: state snapshot handles");
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    const tpr_tensor *st = s->states ? s->states[L] : NULL;
    if (!st) continue;
    TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, st->ndim, st->shape, &e->snap[L]));
    TPR_CHECK(tpr_tensor_fill_zero(e->snap[L]));
  }
  return TPR_OK;
}

tpr_status tpr_engine_new(tpr_session *s, const tpr_engine_opts *o, tpr_engine **out) {
  *out = NULL;
  if (s->o.training) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: the session was opened for training");
  if (o->max_tokens_per_step < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: --max-tokens-per-step %lld", (long long)o->max_tokens_per_step);
  if (o->max_draft < 0 || o->max_draft > TPR_SPEC_MAX_K)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: max_draft %lld is outside [0, %d]", (long long)o->max_draft,
                    TPR_SPEC_MAX_K);
  if (o->draft_layers < 0 || o->draft_layers >= s->cfg.num_layers || (o->draft_layers && !o->max_draft))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: self-speculative drafts of %lld layers (the model has %lld; 1 to "
                    "%lld, with max_draft > 0)", (long long)o->draft_layers, (long long)s->cfg.num_layers,
                    (long long)s->cfg.num_layers - 1);
  tpr_engine *e = calloc(1, sizeof *e);
  if (!e) return TPR_FAIL(TPR_ERR_OOM, "engine");
  e->s = s;
  e->o = *o;
  if (!e->o.max_tokens_per_step) e->o.max_tokens_per_step = 256;
  e->rank = tpr_comm_rank(s->world);
  e->replica = s->mesh.dp_rank;
  e->replicas = s->plan.dp;
  const tpr_session_pool *p = &s->pool;
  const int64_t B = p->batch, V = s->cfg.vocab_size, max_seq = s->o.max_seq;
  const int64_t T = pow2_at_least(e->o.max_tokens_per_step);
  e->vocab = V;
  e->limits = (tpr_sched_opts){.replicas = e->replicas,
                               .pool_blocks = p->blocks,
                               .block_size = p->block_size,
                               .max_batch = B,
                               .max_tokens = e->o.max_tokens_per_step,
                               .max_seq = max_seq,
                               // A hybrid model's state slots rule the prefix cache out (scheduler.h).
                               .prefix_cache = !o->no_prefix_cache && !p->state_slots,
                               .state_slots = p->state_slots,
                               .debug_fault = o->debug_prefix_first_token     ? TPR_SCHED_FAULT_PREFIX_FIRST_TOKEN
                                              : o->debug_keep_rejected_blocks ? TPR_SCHED_FAULT_KEEP_REJECTED_BLOCKS
                                                                              : TPR_SCHED_FAULT_NONE};
  e->step_cap = T;
  e->sample_cap = B;
  if (o->max_draft > 0) {
    e->sample_cap = pow2_at_least(B * (1 + o->max_draft));
    if (e->sample_cap > T) e->sample_cap = T > B ? T : B;
  }
  const int64_t S = e->sample_cap;
  e->tokens = malloc((size_t)(7 * T + B * p->max_blocks) * sizeof(int32_t));
  e->logits = malloc((size_t)(S * V) * sizeof *e->logits);
  e->row = malloc((size_t)V * sizeof *e->row);
  e->sample_scratch = malloc(TPR_SAMPLE_SCRATCH_BYTES(V));
  e->proc_bias = malloc(TPR_MAX_LOGIT_BIAS * sizeof *e->proc_bias);
  e->proc_ids = malloc((size_t)(3 * max_seq) * sizeof *e->proc_ids);
  e->send = malloc((size_t)(1 + S * (2 + 2 * TPR_MAX_TOP_LOGPROBS)) * sizeof *e->send);
  e->draft = malloc((size_t)(o->max_draft + 1) * sizeof *e->draft);
  e->draft_words = malloc((size_t)B * sizeof *e->draft_words);
  e->finished = malloc((size_t)(B * e->replicas) * sizeof *e->finished);
  tpr_status rc = e->tokens && e->logits && e->row && e->sample_scratch && e->proc_bias && e->proc_ids && e->send &&
                          e->finished && e->draft && e->draft_words
                      ? TPR_OK
                      : TPR_FAIL(TPR_ERR_OOM, "engine buffers");
  if (rc == TPR_OK) {
    e->positions = e->tokens + T, e->slots = e->positions + T, e->seq = e->slots + T, e->rows = e->seq + T;
    e->state_slots = e->rows + T, e->prefill_lens = e->state_slots + T, e->blocks = e->prefill_lens + T;
    e->sampled = e->send + 1;
    e->send[0] = e->replica;
  }
  if (rc == TPR_OK && e->rank == 0) {
    rc = tpr_sched_new(&e->limits, &e->sched);
    if (rc == TPR_OK && !(e->tally = calloc((size_t)V, sizeof *e->tally))) rc = TPR_FAIL(TPR_ERR_OOM, "engine tally");
  }
  if (rc == TPR_OK && o->max_draft > 0 && p->state_slots) rc = alloc_snapshots(e);
  if (rc != TPR_OK) {
    tpr_engine_free(e);
    return rc;
  }
  *out = e;
  return TPR_OK;
}

static void forget_seq(engine_seq *q) {
  free(q->bias);
  free(q->lp);
  q->bias = NULL, q->lp = NULL;
  q->n_lp = q->cap_lp = 0;
  q->g.logit_bias = NULL, q->g.n_logit_bias = 0;
}

void tpr_engine_free(tpr_engine *e) {
  if (!e) return;
  tpr_sched_free(e->sched);
  for (int64_t i = 0; i < e->n_seqs; i++) forget_seq(&e->seqs[i]);
  free(e->seqs), free(e->tally), free(e->msg), free(e->tokens), free(e->logits), free(e->row);
  free(e->sample_scratch), free(e->proc_bias), free(e->proc_ids), free(e->send), free(e->gathered);
  free(e->finished), free(e->draft), free(e->draft_words), free(e->spec_ids);
  for (int64_t L = 0; e->snap && L < e->s->cfg.num_layers; L++) tpr_tensor_free(e->snap[L]);
  free(e->snap);
  free(e);
}

int64_t tpr_engine_max_seq(const tpr_engine *e) { return e->limits.max_seq; }
int64_t tpr_engine_vocab(const tpr_engine *e) { return e->vocab; }

tpr_status tpr_engine_check_prompt(const tpr_engine *e, const int32_t *prompt, int64_t len) {
  for (int64_t i = 0; i < len; i++)
    if (prompt[i] < 0 || prompt[i] >= e->vocab)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: token id %d at prompt position %lld is outside the vocabulary [0, %lld)",
                      prompt[i], (long long)i, (long long)e->vocab);
  return TPR_OK;
}

static bool in_range(double x, double lo, double hi) { return x >= lo && x <= hi; }  // false for NaN

// The parameters of engine.h's logit processing and logprobs.
static tpr_status check_processing(const tpr_engine *e, const tpr_gen_params *g) {
  if (g->min_new < 0 || g->min_new > g->max_new)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: min_new %lld is outside [0, max_new %lld]", (long long)g->min_new,
                    (long long)g->max_new);
  if (!in_range(g->frequency_penalty, -2, 2))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: frequency_penalty %g is outside [-2, 2]", g->frequency_penalty);
  if (!in_range(g->presence_penalty, -2, 2))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: presence_penalty %g is outside [-2, 2]", g->presence_penalty);
  if (!(g->repetition_penalty >= 0 && g->repetition_penalty < 0x1p31))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: repetition_penalty %g must be > 0 and < 2^31 (0 or 1: off)",
                    g->repetition_penalty);
  if (g->n_logit_bias < 0 || g->n_logit_bias > TPR_MAX_LOGIT_BIAS)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: %lld logit_bias entries (at most %d)", (long long)g->n_logit_bias,
                    TPR_MAX_LOGIT_BIAS);
  if (g->n_logit_bias > 0 && !g->logit_bias)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: NULL logit_bias with %lld entries", (long long)g->n_logit_bias);
  for (int64_t i = 0; i < g->n_logit_bias; i++) {
    const tpr_logit_bias *b = &g->logit_bias[i];
    if (b->id < 0 || b->id >= e->vocab)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: logit_bias token id %d is outside the vocabulary [0, %lld)", b->id,
                      (long long)e->vocab);
    if (!in_range(b->bias, -100, 100))
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: logit_bias %g for token id %d is outside [-100, 100]",
                      (double)b->bias, b->id);
  }
  if (g->top_logprobs < 0 || g->top_logprobs > TPR_MAX_TOP_LOGPROBS)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: top_logprobs %d is outside [0, %d]", g->top_logprobs,
                    TPR_MAX_TOP_LOGPROBS);
  if (g->top_logprobs > 0 && !g->logprobs)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: top_logprobs %d needs logprobs", g->top_logprobs);
  return TPR_OK;
}

tpr_status tpr_engine_check_request(const tpr_engine *e, const int32_t *prompt, int64_t len,
                                    const tpr_gen_params *g) {
  if (!g) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: NULL generation parameters");
  if (prompt) TPR_CHECK(tpr_engine_check_prompt(e, prompt, len));
  if (g->stop_token >= e->vocab)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: stop token %d is outside the vocabulary", g->stop_token);
  TPR_CHECK(tpr_sampling_check(&g->sampling));
  TPR_CHECK(check_processing(e, g));
  TPR_CHECK(tpr_spec_check(&g->spec));
  if (g->spec.kind == TPR_SPEC_SELF && g->spec.n != e->o.draft_layers)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: self-speculative drafts of %d layers; this engine drafts with %lld "
                    "(--speculative self:N:k sets it; 0: none)", g->spec.n, (long long)e->o.draft_layers);
  if (g->spec.kind == TPR_SPEC_EXTERNAL && !e->o.draft)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: an external drafter was asked for, the engine has none");
  if (g->spec.kind != TPR_SPEC_NONE && g->spec.k > e->o.max_draft)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: speculative decoding with %d drafts per step; this engine verifies "
                    "at most %lld (--speculative's k sets it)", g->spec.k, (long long)e->o.max_draft);
  // Length, max_new, stop token's floor and the pool: the scheduler's own
  // check, on the engine's copy of its options.
  return tpr_sched_check_submit(&e->limits, prompt, len, g->max_new, g->stop_token);
}

tpr_status tpr_engine_submit(tpr_engine *e, const int32_t *prompt, int64_t len, const tpr_gen_params *g,
                             int64_t *id) {
  return tpr_engine_submit_n(e, prompt, len, g, 1, id);
}

// q's parameters, the bias entries copied (the caller's array may go).
static tpr_status keep_params(engine_seq *q, const tpr_gen_params *g) {
  *q = (engine_seq){.g = *g};
  if (g->n_logit_bias > 0) {
    q->bias = malloc((size_t)g->n_logit_bias * sizeof *q->bias);
    if (!q->bias) return TPR_FAIL(TPR_ERR_OOM, "engine: logit_bias of %lld entries", (long long)g->n_logit_bias);
    memcpy(q->bias, g->logit_bias, (size_t)g->n_logit_bias * sizeof *q->bias);
  }
  q->g.logit_bias = q->bias;
  return TPR_OK;
}

tpr_status tpr_engine_submit_n(tpr_engine *e, const int32_t *prompt, int64_t len, const tpr_gen_params *g, int64_t n,
                               int64_t *first_id) {
  if (!e->sched) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: sequences are submitted on rank 0");
  if (n < 1 || !g) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: %lld sequences (n must be >= 1)", (long long)n);
  for (int64_t i = 0; i < n; i++) TPR_CHECK(tpr_engine_check_request(e, prompt, len, &g[i]));
  if (e->n_seqs + n > e->cap_seqs) {
    int64_t cap = e->cap_seqs ? 2 * e->cap_seqs : 16;
    while (cap < e->n_seqs + n) cap *= 2;
    engine_seq *q = realloc(e->seqs, (size_t)cap * sizeof *q);
    if (!q) return TPR_FAIL(TPR_ERR_OOM, "engine: sequence table");
    e->seqs = q, e->cap_seqs = cap;
  }
  if (e->n_spec + n > e->cap_spec) {  // the drafters' list (engine_impl.h), reserved before anything is queued
    int64_t cap = e->cap_spec ? 2 * e->cap_spec : 16;
    while (cap < e->n_spec + n) cap *= 2;
    int64_t *ids = realloc(e->spec_ids, (size_t)cap * sizeof *ids);
    if (!ids) return TPR_FAIL(TPR_ERR_OOM, "engine: the speculating sequences' list");
    e->spec_ids = ids, e->cap_spec = cap;
  }
  int64_t *max_new = malloc((size_t)n * sizeof *max_new);
  int32_t *stop = malloc((size_t)n * sizeof *stop);
  engine_seq *added = e->seqs + e->n_seqs;
  tpr_status rc = max_new && stop ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "engine: %lld sequences", (long long)n);
  int64_t kept = 0;
  for (; rc == TPR_OK && kept < n; kept++) {
    max_new[kept] = g[kept].max_new, stop[kept] = g[kept].stop_token;
    rc = keep_params(&added[kept], &g[kept]);
  }
  if (rc == TPR_OK) rc = tpr_sched_submit_n(e->sched, prompt, len, max_new, stop, n, first_id);
  if (rc == TPR_OK && *first_id != e->n_seqs) rc = TPR_FAIL(TPR_ERR_INTERNAL, "engine: sequence ids out of step");
  free(max_new), free(stop);
  if (rc != TPR_OK) {
    for (int64_t i = 0; i < kept; i++) forget_seq(&added[i]);
    return tpr__propagate(rc, __FILE__, __LINE__);
  }
  for (int64_t i = 0; i < n; i++)  // room reserved above: cannot fail
    if (g[i].spec.kind != TPR_SPEC_NONE) e->spec_ids[e->n_spec++] = e->n_seqs + i;
  e->n_seqs += n;
  return TPR_OK;
}

tpr_status tpr_engine_cancel(tpr_engine *e, int64_t id) {
  if (!e->sched) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: sequences are cancelled on rank 0");
  return tpr_sched_cancel(e->sched, id);
}

tpr_status tpr_engine_result(const tpr_engine *e, int64_t id, tpr_sched_seq_info *out) {
  if (!e->sched) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: results are kept on rank 0");
  return tpr_sched_seq(e->sched, id, out);
}

tpr_status tpr_engine_logprobs(const tpr_engine *e, int64_t id, int64_t i, const tpr_token_logprob **out) {
  *out = NULL;
  if (!e->sched) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: logprobs are kept on rank 0");
  if (id < 0 || id >= e->n_seqs || e->seqs[id].released)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: no sequence %lld (or it was released)", (long long)id);
  const engine_seq *q = &e->seqs[id];
  if (!q->g.logprobs) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: sequence %lld did not ask for logprobs", (long long)id);
  if (i < 0 || i >= q->n_lp)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: sequence %lld has no generated token %lld yet (%lld so far)",
                    (long long)id, (long long)i, (long long)q->n_lp);
  *out = &q->lp[i];
  return TPR_OK;
}

tpr_status tpr_engine_release(tpr_engine *e, int64_t id) {
  if (!e->sched) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: sequences are released on rank 0");
  TPR_CHECK(tpr_sched_release(e->sched, id));  // refuses unknown, unfinished and released ids
  forget_seq(&e->seqs[id]);
  e->seqs[id].released = true;
  return TPR_OK;
}

int64_t tpr_engine_blocks_in_use(const tpr_engine *e, int replica) {
  return e->sched ? tpr_sched_blocks_in_use(e->sched, replica) : 0;
}

int64_t tpr_engine_preemptions(const tpr_engine *e) { return e->sched ? tpr_sched_preemptions(e->sched) : 0; }
tpr_sched_spec_stats tpr_engine_spec(const tpr_engine *e) {
  return e->sched ? tpr_sched_spec(e->sched) : (tpr_sched_spec_stats){0};
}
int64_t tpr_engine_state_slots_in_use(const tpr_engine *e, int replica) {
  return e->sched ? tpr_sched_state_slots_in_use(e->sched, replica) : 0;
}
int tpr_engine_replicas(const tpr_engine *e) { return e->replicas; }
int64_t tpr_engine_waiting(const tpr_engine *e) { return e->sched ? tpr_sched_waiting(e->sched) : 0; }

tpr_engine_prefix_stats tpr_engine_prefix(const tpr_engine *e) {
  tpr_engine_prefix_stats st = {0};
  if (!e->sched) return st;
  tpr_sched_prefix_stats(e->sched, &st.queried_tokens, &st.hit_tokens);
  for (int r = 0; r < e->replicas; r++) st.cached_blocks += tpr_sched_cached_blocks(e->sched, r);
  return st;
}
