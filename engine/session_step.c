// One step on a session: its inputs checked on the host, padded to the
// program's shape and uploaded; the program run; the sampled rows' logits
// read back. tpr_session_forward is a step of one sequence.
#include <stdlib.h>
#include <string.h>

#include "engine/session_impl.h"

// Every index of a step checked on the host before anything runs.
static tpr_status check_step(const tpr_session *s, const tpr_step *st) {
  const tpr_session_pool *p = &s->pool;
  const int64_t V = s->cfg.vocab_size, rows = p->blocks * p->block_size, span = p->max_blocks * p->block_size;
  if (st->n_tokens < 0 || st->n_tokens > st->T || st->n_samples < 0 || st->n_samples > st->N || st->N < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "step: %lld tokens in a program of %lld rows, %lld samples of %lld",
                    (long long)st->n_tokens, (long long)st->T, (long long)st->n_samples, (long long)st->N);
  for (int64_t t = 0; t < st->n_tokens; t++) {
    if (st->tokens[t] < 0 || st->tokens[t] >= V)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "token id %d at row %lld is outside the vocabulary [0, %lld)",
                      st->tokens[t], (long long)t, (long long)V);
    if (st->positions[t] < 0 || st->positions[t] >= span)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "position %d at row %lld is outside a sequence's %lld rows (max_seq)",
                      st->positions[t], (long long)t, (long long)span);
    if (st->slots[t] < 0 || st->slots[t] >= rows || st->seq[t] < 0 || st->seq[t] >= p->batch)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "row %lld: pool row %d of [0, %lld) or sequence %d of [0, %lld)",
                      (long long)t, st->slots[t], (long long)rows, st->seq[t], (long long)p->batch);
  }
  // A recurrent family's state slots (the op checks that a slot's rows are
  // one run of consecutive positions).
  if (p->state_slots && st->n_tokens && !st->state_slots)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "step: %s keeps a recurrent state per sequence: the step gives no state slots",
                    s->family->name);
  for (int64_t t = 0; p->state_slots && t < st->n_tokens; t++)
    if (st->state_slots[t] < 0 || st->state_slots[t] >= p->state_slots)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "row %lld: state slot %d of [0, %lld)", (long long)t, st->state_slots[t],
                      (long long)p->state_slots);
  for (int64_t t = 0; st->prefill_lens && t < st->n_tokens; t++)
    if (st->prefill_lens[t] < 0 || st->prefill_lens[t] > span)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "row %lld: prefill length %d outside [0, %lld] (max_seq)", (long long)t,
                      st->prefill_lens[t], (long long)span);
  for (int64_t i = 0; st->positions_3d && i < 3 * st->n_tokens; i++)
    if (st->positions_3d[i] < 0 || st->positions_3d[i] >= (1 << 24))  // f32 holds them exactly
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "MRoPE position %d (axis %lld, row %lld) is outside [0, 2^24)",
                      st->positions_3d[i], (long long)(i / st->n_tokens), (long long)(i % st->n_tokens));
  for (int64_t i = 0; i < p->batch * p->max_blocks; i++)
    if (st->block_tables[i] < 0 || st->block_tables[i] >= p->blocks)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "block table entry %lld is block %d of a pool of %lld", (long long)i,
                      st->block_tables[i], (long long)p->blocks);
  for (int64_t i = 0; i < st->n_samples; i++)
    if (st->sample_rows[i] < 0 || st->sample_rows[i] >= st->n_tokens)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "sample row %d is not one of the %lld tokens", st->sample_rows[i],
                      (long long)st->n_tokens);
  return TPR_OK;
}

// The step's inputs, padded to the program's shape, onto the backend.
static tpr_status upload_step(tpr_session *s, step_program *m, const tpr_step *st) {
  const int64_t T = m->T, N = m->N, BM = s->pool.batch * s->pool.max_blocks, n = st->n_tokens;
  int64_t need = 4 * T + BM + N + 3 * T + T + T;
  if (need > s->host_in_cap) {
    free(s->host_in);
    s->host_in_cap = 0;
    if (!(s->host_in = malloc((size_t)need * sizeof *s->host_in))) return TPR_FAIL(TPR_ERR_OOM, "step inputs");
    s->host_in_cap = need;
  }
  int32_t *tok = s->host_in, *pos = tok + T, *slot = pos + T, *seq = slot + T, *bt = seq + T, *rows = bt + BM;
  memcpy(tok, st->tokens, (size_t)n * sizeof *tok);
  memcpy(pos, st->positions, (size_t)n * sizeof *pos);
  memcpy(slot, st->slots, (size_t)n * sizeof *slot);
  memcpy(seq, st->seq, (size_t)n * sizeof *seq);
  for (int64_t t = n; t < T; t++) tok[t] = 0, pos[t] = 0, slot[t] = -1, seq[t] = -1;  // padding: attends nothing
  memcpy(bt, st->block_tables, (size_t)BM * sizeof *bt);
  memcpy(rows, st->sample_rows, (size_t)st->n_samples * sizeof *rows);
  for (int64_t i = st->n_samples; i < N; i++) rows[i] = 0;  // unused logits rows
  const int32_t *src[STEP_INPUTS] = {tok, pos, slot, seq, bt, rows};
  for (int i = 0; i < STEP_INPUTS; i++)
    TPR_CHECK(tpr_tensor_from_host(m->in[i], src[i], (size_t)tpr_tensor_numel(m->in[i]) * sizeof(int32_t)));
  if (m->state_slot) {  // padded rows: slot -1, no state touched
    int32_t *ss = rows + N + 3 * T;
    for (int64_t t = 0; t < T; t++) ss[t] = t < n ? st->state_slots[t] : -1;
    TPR_CHECK(tpr_tensor_from_host(m->state_slot, ss, (size_t)T * sizeof *ss));
  }
  if (m->prefill_len) {  // not given, or padded rows: 0, the call decides
    int32_t *pl = rows + N + 4 * T;
    for (int64_t t = 0; t < T; t++) pl[t] = t < n && st->prefill_lens ? st->prefill_lens[t] : 0;
    TPR_CHECK(tpr_tensor_from_host(m->prefill_len, pl, (size_t)T * sizeof *pl));
  }
  if (!m->pos3) return TPR_OK;
  int32_t *p3 = rows + N;  // (3, T): given rows, or the sequence position on every axis (text)
  for (int a = 0; a < 3; a++) {
    for (int64_t t = 0; t < n; t++) p3[a * T + t] = st->positions_3d ? st->positions_3d[a * n + t] : pos[t];
    for (int64_t t = n; t < T; t++) p3[a * T + t] = 0;
  }
  return tpr_tensor_from_host(m->pos3, p3, (size_t)(3 * T) * sizeof *p3);
}

tpr_status tpr_session_step(tpr_session *s, const tpr_step *st, float *logits) {
  if (s->o.training) return TPR_FAIL(TPR_ERR_INVALID_ARG, "step: the session was opened for training");
  TPR_CHECK(check_step(s, st));
  step_program *m;
  if (st->layers < 0 || st->layers > s->cfg.num_layers)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "step: %lld layers of %lld", (long long)st->layers,
                    (long long)s->cfg.num_layers);
  const int64_t layers = st->layers == s->cfg.num_layers ? 0 : st->layers;
  TPR_CHECK(tpr__session_program_for(s, st->T, st->N, layers, &m));
  TPR_CHECK(upload_step(s, m, st));
  TPR_CHECK(tpr_exec_run(m->exec));
  if (s->o.moe_stats && !layers) TPR_CHECK(tpr__session_count_routing(s, m, st->n_tokens));
  if (!logits || st->n_samples == 0) return TPR_OK;
  const int64_t V = s->cfg.vocab_size, Vp = s->plan.vocab_padded, N = m->N;
  const tpr_tensor *out;
  TPR_CHECK(tpr_exec_output(m->exec, "logits_t", &out));  // (V', N)
  if (Vp * N > s->logits_cap) {
    free(s->logits_t);
    s->logits_cap = 0;
    if (!(s->logits_t = malloc((size_t)(Vp * N) * sizeof *s->logits_t))) return TPR_FAIL(TPR_ERR_OOM, "logits");
    s->logits_cap = Vp * N;
  }
  TPR_CHECK(tpr_tensor_to_host(out, s->logits_t, (size_t)(Vp * N) * sizeof *s->logits_t));
  for (int64_t i = 0; i < st->n_samples; i++)
    for (int64_t v = 0; v < V; v++) logits[i * V + v] = s->logits_t[v * N + i];
  return TPR_OK;
}

tpr_status tpr_session_forward(tpr_session *s, const int32_t *tokens, int64_t T, int64_t start, float *logits) {
  return tpr_session_forward_3d(s, tokens, T, start, NULL, logits);
}

int64_t tpr_mrope_next_position(const int32_t *pos3, int64_t T) {
  int64_t mx = -1;
  for (int64_t i = 0; i < 3 * T; i++) mx = pos3[i] > mx ? pos3[i] : mx;
  return mx + 1;
}

tpr_status tpr_session_forward_3d(tpr_session *s, const int32_t *tokens, int64_t T, int64_t start,
                                  const int32_t *pos3, float *logits) {
  if (pos3 && !s->cfg.mrope_layout)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: 3-D positions given, but %s has no MRoPE",
                    tpr_model_family_name(s->cfg.family));
  if (s->o.training) return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: the session was opened for training");
  const tpr_session_pool *p = &s->pool;
  if (T < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: no tokens");
  if (start < 0 || start + T > s->o.max_seq)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: positions %lld..%lld do not fit the KV cache of %lld rows",
                    (long long)start, (long long)(start + T - 1), (long long)s->o.max_seq);
  if (p->blocks < p->max_blocks)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: a whole sequence needs %lld KV blocks, the pool holds %lld",
                    (long long)p->max_blocks, (long long)p->blocks);
  // Row 0 of the block tables holds blocks 0..MB-1 in order, so position j is
  // pool row j; the other rows are never read.
  int64_t BM = p->batch * p->max_blocks;
  int32_t *buf = malloc((size_t)(4 * T + BM) * sizeof *buf);
  if (!buf) return TPR_FAIL(TPR_ERR_OOM, "forward inputs");
  int32_t *pos = buf, *seq = pos + T, *rows = seq + T, *bt = rows + T;
  // seq doubles as the state slots: the sequence is row 0 and slot 0.
  for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(start + t), seq[t] = 0, rows[t] = (int32_t)t;
  for (int64_t i = 0; i < BM; i++) bt[i] = (int32_t)(i % p->max_blocks);
  tpr_step st = {.T = T, .N = logits ? T : 1, .n_tokens = T, .tokens = tokens, .positions = pos, .slots = pos,
                 .seq = seq, .block_tables = bt, .state_slots = seq, .n_samples = logits ? T : 0, .sample_rows = rows,
                 .positions_3d = pos3};
  tpr_status rc = tpr_session_step(s, &st, logits);
  free(buf);
  return rc;
}
