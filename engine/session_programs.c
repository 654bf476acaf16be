// The program cache: one step program and its exec per step shape (T, N,
// layers),
// built on first use (rank 0's bytes broadcast, or every rank's own build
// with the hashes compared), at most MAX_PROGRAMS of them.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/session_impl.h"

// A name the exec's program lacks is skipped when `partial` (a draft's
// program of the first layers declares only what it reads), else an error.
static tpr_status bind(tpr_exec *e, bool partial, const char *name, const tpr_tensor *t) {
  return partial && !tpr_exec_has(e, name) ? TPR_OK : tpr_exec_bind(e, name, t);
}

static tpr_status bind_params(tpr_session *s, tpr_exec *e, bool partial) {
  char name[160];
  for (int64_t i = 0; i < s->weights.n; i++) {
    if (s->item_tensors[i]) TPR_CHECK(bind(e, partial, s->weights.items[i].name, s->item_tensors[i]));
    if (!s->item_scales || !s->item_scales[i]) continue;
    snprintf(name, sizeof name, "%s.scale", s->weights.items[i].name);
    TPR_CHECK(bind(e, partial, name, s->item_scales[i]));
  }
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    // Released experts (tpr__session_release_weights) are bound by the caller.
    tpr_family_expert_name(L, "w13", name, sizeof name);
    if (s->experts[2 * L]) TPR_CHECK(bind(e, partial, name, s->experts[2 * L]));
    tpr_family_expert_name(L, "w2", name, sizeof name);
    if (s->experts[2 * L + 1]) TPR_CHECK(bind(e, partial, name, s->experts[2 * L + 1]));
    tpr_tensor **sc = s->experts + 2 * s->cfg.num_layers + 2 * L;  // FP8: the stacked scales
    tpr_family_expert_name(L, "w13.scale", name, sizeof name);
    if (sc[0]) TPR_CHECK(bind(e, partial, name, sc[0]));
    tpr_family_expert_name(L, "w2.scale", name, sizeof name);
    if (sc[1]) TPR_CHECK(bind(e, partial, name, sc[1]));
    if (!s->o.training && s->states && s->states[L]) {  // a recurrent layer's state slots
      tpr_family_state_name(L, name, sizeof name);
      TPR_CHECK(bind(e, partial, name, s->states[L]));
    }
    if (s->o.training || !s->pools[2 * L]) continue;  // training programs and lightning layers hold no KV pool
    tpr_family_pool_name(L, "k", name, sizeof name);
    TPR_CHECK(bind(e, partial, name, s->pools[2 * L]));
    tpr_family_pool_name(L, "v", name, sizeof name);
    TPR_CHECK(bind(e, partial, name, s->pools[2 * L + 1]));
    tpr_family_pool_name(L, "ck", name, sizeof name);
    // A program that recomputes its compressed keys (a parity control) reads no such pool.
    if (s->ck_pools && s->ck_pools[L] && tpr_exec_has(e, name)) TPR_CHECK(bind(e, true, name, s->ck_pools[L]));
  }
  for (int i = 0; i < s->consts.n; i++) TPR_CHECK(bind(e, partial, s->consts.names[i], s->consts.t[i]));
  return bind(e, partial, "rank", s->rank);
}

tpr_status tpr__session_bind_params(tpr_session *s, tpr_exec *e) { return bind_params(s, e, false); }

// Rank 0 builds and serializes; everyone receives the bytes and deserializes.
static tpr_status receive_program(tpr_session *s, tpr__build_fn build, const void *opts, tpr_program **out) {
  uint8_t *bytes = NULL;
  size_t len = 0;
  tpr_status rc = TPR_OK;
  if (tpr_comm_rank(s->world) == 0) {
    tpr_program *p = NULL;
    rc = build(&s->plan, opts, &p);
    if (rc == TPR_OK) rc = tpr_program_serialize(p, &bytes, &len);
    tpr_program_free(p);
  }
  int64_t n = rc == TPR_OK ? (int64_t)len : -1;
  TPR_CHECK(tpr_comm_broadcast(s->world, &n, &n, 1, TPR_I64, 0));
  if (n < 0) return rc != TPR_OK ? rc : TPR_FAIL(TPR_ERR_INTERNAL, "rank 0 could not build the program");
  if (!bytes && !(bytes = malloc((size_t)n ? (size_t)n : 1))) return TPR_FAIL(TPR_ERR_OOM, "program bytes");
  rc = tpr_comm_broadcast(s->world, bytes, bytes, (size_t)n, TPR_U8, 0);
  if (rc == TPR_OK) rc = tpr_program_deserialize(bytes, (size_t)n, out);
  free(bytes);
  return rc;
}

tpr_status tpr__session_make_program(tpr_session *s, tpr__build_fn build, const void *opts, tpr_program **out) {
  *out = NULL;
  if (s->o.broadcast_program)
    TPR_CHECK(receive_program(s, build, opts, out));
  else
    TPR_CHECK(build(&s->plan, opts, out));
  return tpr_comm_check_program(s->world, *out, &s->stats.program_hash);
}

static tpr_status build_step(const tpr_shard_plan *plan, const void *opts, tpr_program **out) {
  const tpr_step_build_opts *o = opts;
  const tpr_family *f;
  TPR_CHECK(tpr_family_find(plan->config.family, &f));
  return f->build_step(plan, o, out);
}

static void free_program(step_program *m) {
  tpr_exec_free(m->exec);
  tpr_program_free(m->program);
  for (int i = 0; i < STEP_INPUTS; i++) tpr_tensor_free(m->in[i]);
  tpr_tensor_free(m->pos3);
  tpr_tensor_free(m->state_slot);
  tpr_tensor_free(m->prefill_len);
}

static const char *const step_input_names[STEP_INPUTS] = {"tokens", "positions", "slot_mapping", "seq",
                                                          "block_tables", "sample_rows"};

// The program of step shape (T, N), built on first use. Collective.
tpr_status tpr__session_program_for(tpr_session *s, int64_t T, int64_t N, int64_t layers, step_program **out) {
  for (int i = 0; i < s->n_programs; i++)
    if (s->programs[i].T == T && s->programs[i].N == N && s->programs[i].layers == layers) {
      *out = &s->programs[i];
      return TPR_OK;
    }
  if (s->n_programs == MAX_PROGRAMS) {  // forget the oldest shape (never decode's, built first)
    free_program(&s->programs[1]);
    memmove(&s->programs[1], &s->programs[2], (size_t)(MAX_PROGRAMS - 2) * sizeof s->programs[0]);
    s->n_programs--;
  }
  step_program *m = &s->programs[s->n_programs];
  memset(m, 0, sizeof *m);
  m->T = T, m->N = N, m->layers = layers;
  const tpr_session_pool *pl = &s->pool;
  tpr_step_build_opts bo = {.shape = {.tokens = T,
                                      .samples = N,
                                      .batch = pl->batch,
                                      .max_blocks = pl->max_blocks,
                                      .pool_blocks = pl->blocks,
                                      .block_size = pl->block_size,
                                      .state_slots = pl->state_slots,
                                      .layers = layers},
                            .moe = s->o.moe,
                            .moe_stats = s->o.moe_stats && !layers,  // a draft's routing is not counted
                            .per_rank_qk_norm = s->o.per_rank_qk_norm,
                            .mrope_layout_control = s->o.mrope_layout_control,
                            .family_control = s->o.family_control,
                            .dense_sparse_layers = s->o.dense_sparse_layers,
                            .kind_dtype = s->kind_dtype,
                            .kind_block = s->kind_block};
  tpr_status rc = tpr__session_make_program(s, build_step, &bo, &m->program);
  if (m->program) s->n_programs++;  // owned from here: close frees it
  TPR_CHECK(rc);
  TPR_CHECK(tpr_exec_new(m->program, s->be, &m->exec));
  tpr_exec_set_collectives(m->exec, &s->hook);
  TPR_CHECK(bind_params(s, m->exec, layers > 0));
  for (int i = 0; i < STEP_INPUTS; i++) {
    int64_t shape[2] = {i == STEP_BLOCKS ? pl->batch : i == STEP_SAMPLES ? N : T, pl->max_blocks};
    TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, i == STEP_BLOCKS ? 2 : 1, shape, &m->in[i]));
    TPR_CHECK(tpr_exec_bind(m->exec, step_input_names[i], m->in[i]));
  }
  if (s->cfg.mrope_layout) {
    TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 2, (const int64_t[]){3, T}, &m->pos3));
    TPR_CHECK(tpr_exec_bind(m->exec, "positions_3d", m->pos3));
  }
  if (pl->state_slots) {
    TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){T}, &m->state_slot));
    TPR_CHECK(tpr_exec_bind(m->exec, "state_slot", m->state_slot));
  }
  if (tpr_exec_has(m->exec, "prefill_len")) {  // a family whose rows depend on their prompt's length
    TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){T}, &m->prefill_len));
    TPR_CHECK(tpr_exec_bind(m->exec, "prefill_len", m->prefill_len));
  }
  *out = m;
  return TPR_OK;
}

void tpr__session_free_programs(tpr_session *s) {
  for (int i = 0; i < s->n_programs; i++) free_program(&s->programs[i]);
}
