#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/session_impl.h"

// The broadcast plan of a step, int64 words:
//   header  T, N, replicas
//   per replica: n_chunks, then per chunk CHUNK_WORDS words + n tokens + n_blocks blocks
enum { HDR_T, HDR_N, HDR_REPLICAS, HDR_WORDS };
enum { C_SEQ, C_POS0, C_N, C_SAMPLE, C_FIRST, C_NBLOCKS, C_TOP_K, C_TEMP, C_TOP_P, C_SEED, C_GEN, CHUNK_WORDS };

struct tpr_engine {
  tpr_session *s;
  tpr_engine_opts o;
  int rank, replica, replicas;
  tpr_sched *sched;              // rank 0
  tpr_gen_params *params;        // rank 0: (n_params) per sequence id
  int64_t n_params, cap_params;
  int64_t *msg;                  // the step plan
  int64_t msg_cap;
  // This rank's step (its replica's chunks), sized for the largest step.
  int32_t *tokens, *positions, *slots, *seq, *blocks, *rows, *sampled;
  int64_t step_cap;
  float *logits;                 // (B, V)
  void *sample_scratch;
  int32_t *send;                 // (1 + B) this rank's replica, then its sampled tokens
  int32_t *gathered;             // (world * (1 + B)) every rank's send
  int64_t *finished;             // rank 0: (B * replicas)
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t f64_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static double bits_f64(int64_t w) {
  double d;
  memcpy(&d, &w, sizeof d);
  return d;
}

static int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

tpr_status tpr_engine_new(tpr_session *s, const tpr_engine_opts *o, tpr_engine **out) {
  *out = NULL;
  if (s->o.training) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: the session was opened for training");
  if (o->max_tokens_per_step < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: --max-tokens-per-step %lld", (long long)o->max_tokens_per_step);
  tpr_engine *e = calloc(1, sizeof *e);
  if (!e) return TPR_FAIL(TPR_ERR_OOM, "engine");
  e->s = s;
  e->o = *o;
  if (!e->o.max_tokens_per_step) e->o.max_tokens_per_step = 256;
  e->rank = tpr_comm_rank(s->world);
  e->replica = s->mesh.dp_rank;
  e->replicas = s->plan.dp;
  const tpr_session_pool *p = &s->pool;
  const int64_t B = p->batch, V = s->cfg.vocab_size, world = tpr_comm_size(s->world);
  const int64_t T = pow2_at_least(e->o.max_tokens_per_step);
  e->step_cap = T;
  e->tokens = malloc((size_t)(5 * T + B * p->max_blocks) * sizeof(int32_t));
  e->logits = malloc((size_t)(B * V) * sizeof *e->logits);
  e->sample_scratch = malloc(TPR_SAMPLE_SCRATCH_BYTES(V));
  e->send = malloc((size_t)(1 + B) * sizeof *e->send);
  e->gathered = malloc((size_t)(world * (1 + B)) * sizeof *e->gathered);
  e->finished = malloc((size_t)(B * e->replicas) * sizeof *e->finished);
  tpr_status rc = e->tokens && e->logits && e->sample_scratch && e->send && e->gathered && e->finished
                      ? TPR_OK
                      : TPR_FAIL(TPR_ERR_OOM, "engine buffers");
  if (rc == TPR_OK) {
    e->positions = e->tokens + T, e->slots = e->positions + T, e->seq = e->slots + T, e->rows = e->seq + T;
    e->blocks = e->rows + T;
    e->sampled = e->send + 1;
    e->send[0] = e->replica;
  }
  tpr_sched_opts so = {.replicas = e->replicas,
                       .pool_blocks = p->blocks,
                       .block_size = p->block_size,
                       .max_batch = B,
                       .max_tokens = e->o.max_tokens_per_step,
                       .max_seq = s->o.max_seq};
  if (rc == TPR_OK && e->rank == 0) rc = tpr_sched_new(&so, &e->sched);
  if (rc != TPR_OK) {
    tpr_engine_free(e);
    return rc;
  }
  *out = e;
  return TPR_OK;
}

void tpr_engine_free(tpr_engine *e) {
  if (!e) return;
  tpr_sched_free(e->sched);
  free(e->params), free(e->msg), free(e->tokens), free(e->logits), free(e->sample_scratch), free(e->send);
  free(e->gathered);
  free(e->finished);
  free(e);
}

tpr_status tpr_engine_check_prompt(const tpr_engine *e, const int32_t *prompt, int64_t len) {
  const int64_t V = e->s->cfg.vocab_size;
  for (int64_t i = 0; i < len; i++)
    if (prompt[i] < 0 || prompt[i] >= V)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: token id %d at prompt position %lld is outside the vocabulary [0, %lld)",
                      prompt[i], (long long)i, (long long)V);
  return TPR_OK;
}

tpr_status tpr_engine_submit(tpr_engine *e, const int32_t *prompt, int64_t len, const tpr_gen_params *g,
                             int64_t *id) {
  if (!e->sched) return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: sequences are submitted on rank 0");
  TPR_CHECK(tpr_engine_check_prompt(e, prompt, len));
  if (g->stop_token >= e->s->cfg.vocab_size)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "engine: stop token %d is outside the vocabulary", g->stop_token);
  TPR_CHECK(tpr_sampling_check(&g->sampling));
  if (e->n_params == e->cap_params) {
    int64_t cap = e->cap_params ? 2 * e->cap_params : 16;
    tpr_gen_params *p = realloc(e->params, (size_t)cap * sizeof *p);
    if (!p) return TPR_FAIL(TPR_ERR_OOM, "engine: sequence table");
    e->params = p, e->cap_params = cap;
  }
  TPR_CHECK(tpr_sched_submit(e->sched, prompt, len, g->max_new, g->stop_token, id));
  e->params[*id] = *g;
  e->n_params = *id + 1;
  return TPR_OK;
}

static tpr_status msg_reserve(tpr_engine *e, int64_t words) {
  if (words <= e->msg_cap) return TPR_OK;
  int64_t *m = realloc(e->msg, (size_t)words * sizeof *m);
  if (!m) return TPR_FAIL(TPR_ERR_OOM, "engine: step plan");
  e->msg = m, e->msg_cap = words;
  return TPR_OK;
}

// Rank 0: the scheduler's plan as words; *words = 0 when idle.
static tpr_status encode_plan(tpr_engine *e, const tpr_sched_step *st, int64_t *words) {
  int64_t n = HDR_WORDS, most = 1, B = e->s->pool.batch;
  for (int r = 0; r < st->replicas; r++) {
    int64_t toks = 0;
    n += 1;
    for (int64_t i = 0; i < st->n_chunks[r]; i++) {
      n += CHUNK_WORDS + st->chunks[r][i].n + st->chunks[r][i].n_blocks;
      toks += st->chunks[r][i].n;
    }
    if (toks > most) most = toks;
  }
  *words = 0;
  if (st->tokens == 0) return TPR_OK;
  TPR_CHECK(msg_reserve(e, n));
  int64_t *m = e->msg, T = pow2_at_least(most);
  m[HDR_T] = T, m[HDR_N] = T < B ? T : B, m[HDR_REPLICAS] = st->replicas;
  int64_t at = HDR_WORDS;
  for (int r = 0; r < st->replicas; r++) {
    m[at++] = st->n_chunks[r];
    for (int64_t i = 0; i < st->n_chunks[r]; i++) {
      const tpr_sched_chunk *c = &st->chunks[r][i];
      const tpr_gen_params *g = &e->params[c->seq];
      tpr_sched_seq_info si;
      TPR_CHECK(tpr_sched_seq(e->sched, c->seq, &si));
      int64_t *w = m + at;
      w[C_SEQ] = c->seq, w[C_POS0] = c->pos0, w[C_N] = c->n, w[C_SAMPLE] = c->sample, w[C_FIRST] = c->first;
      w[C_NBLOCKS] = c->n_blocks, w[C_TOP_K] = g->sampling.top_k;
      w[C_TEMP] = (int64_t)f64_bits(g->sampling.temperature), w[C_TOP_P] = (int64_t)f64_bits(g->sampling.top_p);
      w[C_SEED] = (int64_t)g->sampling.seed, w[C_GEN] = si.len - si.prompt_len;
      at += CHUNK_WORDS;
      for (int64_t j = 0; j < c->n; j++) m[at++] = c->tokens[j];
      for (int64_t j = 0; j < c->n_blocks; j++) m[at++] = c->blocks[j];
    }
  }
  *words = at;
  return TPR_OK;
}

// Lays this rank's replica's chunks out as a session step; fills info.
static tpr_status decode_plan(tpr_engine *e, tpr_step *st, tpr_engine_step_info *info) {
  const tpr_session_pool *p = &e->s->pool;
  const int64_t *m = e->msg, T = m[HDR_T], MB = p->max_blocks, bs = p->block_size;
  if (T > e->step_cap) return TPR_FAIL(TPR_ERR_INTERNAL, "engine: a step of %lld tokens", (long long)T);
  memset(e->blocks, 0, (size_t)(p->batch * MB) * sizeof *e->blocks);
  *st = (tpr_step){.T = T, .N = m[HDR_N], .tokens = e->tokens, .positions = e->positions, .slots = e->slots,
                   .seq = e->seq, .block_tables = e->blocks, .sample_rows = e->rows};
  info->program_tokens = T;
  int64_t at = HDR_WORDS;
  for (int r = 0; r < m[HDR_REPLICAS]; r++) {
    int64_t n_chunks = m[at++];
    for (int64_t i = 0; i < n_chunks; i++) {
      const int64_t *w = m + at, n = w[C_N], nb = w[C_NBLOCKS], *tok = w + CHUNK_WORDS, *blk = tok + n;
      at += CHUNK_WORDS + n + nb;
      info->tokens += n;
      info->sequences++;
      if (n == 1 && !w[C_FIRST])
        info->decode_tokens++;
      else
        info->prefill_tokens += n;
      if (r != e->replica) continue;
      for (int64_t b = 0; b < nb; b++) e->blocks[i * MB + b] = (int32_t)blk[b];
      for (int64_t j = 0; j < n; j++) {
        int64_t t = st->n_tokens++, pos = w[C_POS0] + j;
        int64_t row = e->o.debug_wrong_blocks ? (i + 1) % n_chunks : i;  // negative control
        e->tokens[t] = (int32_t)tok[j], e->positions[t] = (int32_t)pos, e->seq[t] = (int32_t)row;
        e->slots[t] = (int32_t)(blk[pos / bs] * bs + pos % bs);
      }
      if (w[C_SAMPLE]) e->rows[st->n_samples++] = (int32_t)(st->n_tokens - 1);
    }
  }
  return TPR_OK;
}

// Samples each sampled chunk of this rank's replica, in chunk order.
static void sample_replica(tpr_engine *e) {
  const int64_t *m = e->msg, V = e->s->cfg.vocab_size;
  int64_t at = HDR_WORDS, k = 0;
  for (int r = 0; r < m[HDR_REPLICAS]; r++) {
    int64_t n_chunks = m[at++];
    for (int64_t i = 0; i < n_chunks; i++) {
      const int64_t *w = m + at;
      at += CHUNK_WORDS + w[C_N] + w[C_NBLOCKS];
      if (r != e->replica || !w[C_SAMPLE]) continue;
      tpr_sampling smp = {.temperature = bits_f64(w[C_TEMP]), .top_k = w[C_TOP_K], .top_p = bits_f64(w[C_TOP_P]),
                          .seed = (uint64_t)w[C_SEED]};
      // The draw depends on (seed, index of the generated token) only.
      tpr_rng rng = {smp.seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(w[C_GEN] + 1))};
      if (e->o.on_logits) e->o.on_logits(e->o.ctx, w[C_SEQ], w[C_GEN], e->logits + k * V, V);
      e->sampled[k] = (int32_t)tpr_sample(e->logits + k * V, V, &smp, &rng, e->sample_scratch);
      k++;
    }
  }
}

// Rank 0: every replica's sampled tokens back into the scheduler.
static tpr_status collect(tpr_engine *e, const tpr_sched_step *plan, tpr_engine_step_info *info) {
  const int64_t B = e->s->pool.batch, world = tpr_comm_size(e->s->world);
  TPR_CHECK(tpr_comm_all_gather(e->s->world, e->send, e->gathered, (size_t)(1 + B), TPR_I32));
  if (!e->sched) return TPR_OK;
  const int32_t *by_replica[64];
  if (e->replicas > 64) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "engine: more than 64 dp replicas");
  for (int r = 0; r < e->replicas; r++) {
    by_replica[r] = NULL;
    for (int64_t w = 0; w < world && !by_replica[r]; w++)
      if (e->gathered[w * (1 + B)] == r) by_replica[r] = e->gathered + w * (1 + B) + 1;
  }
  // The plan's arrays die with the update: note the sampled sequences first.
  int64_t n = 0;
  for (int r = 0; r < plan->replicas; r++)
    for (int64_t i = 0; i < plan->n_chunks[r]; i++)
      if (plan->chunks[r][i].sample) e->finished[n++] = plan->chunks[r][i].seq;
  TPR_CHECK(tpr_sched_update(e->sched, plan, by_replica));
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
  tpr_sched_step plan = {0};
  int64_t words = 0;
  tpr_status rc = TPR_OK;
  if (e->sched) {
    rc = tpr_sched_next(e->sched, &plan);
    if (rc == TPR_OK) rc = encode_plan(e, &plan, &words);
    if (rc != TPR_OK) words = -1;
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
  tpr_step st;
  TPR_CHECK(decode_plan(e, &st, info));
  for (int64_t i = 0; i < e->s->pool.batch; i++) e->sampled[i] = -1;
  // A replica with nothing to do still runs the (all padded) step: its
  // collectives pair with the other replicas' over ep.
  TPR_CHECK(tpr_session_step(e->s, &st, e->logits));
  sample_replica(e);
  TPR_CHECK(collect(e, &plan, info));
  info->seconds = now_s() - t0;
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

int64_t tpr_engine_blocks_in_use(const tpr_engine *e, int replica) {
  return e->sched ? tpr_sched_blocks_in_use(e->sched, replica) : 0;
}

int64_t tpr_engine_preemptions(const tpr_engine *e) { return e->sched ? tpr_sched_preemptions(e->sched) : 0; }
int64_t tpr_engine_waiting(const tpr_engine *e) { return e->sched ? tpr_sched_waiting(e->sched) : 0; }
