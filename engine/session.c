#include "engine/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/minimax_m2.h"
#include "engine/session_impl.h"
#include "shard/loader.h"
#include "shard/mesh_comms.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const tpr_model_config *tpr_session_config(const tpr_session *s) { return &s->cfg; }
const tpr_session_info *tpr_session_stats(const tpr_session *s) { return &s->stats; }
const tpr_shard_plan *tpr_session_plan(const tpr_session *s) { return &s->plan; }
const tpr_mesh *tpr_session_mesh(const tpr_session *s) { return &s->mesh; }
const char *tpr_session_model_dir(const tpr_session *s) { return s->o.model_dir; }
int64_t tpr_session_max_seq(const tpr_session *s) { return s->o.max_seq; }

// Stacks a layer's local experts: w13 (E_r, 2F_r, H) = [w1; w3], w2 (E_r, H, F_r),
// built in host memory and copied to the backend.
static tpr_status stack_experts(tpr_session *s, int64_t L) {
  const tpr_shard_plan *p = &s->plan;
  int64_t Er = p->experts_per_rank, Fr = p->expert_inter_per_rank, H = s->cfg.hidden_size;
  int k1 = -1, k3 = -1, k2 = -1;
  for (int i = 0; i < p->n_tensors; i++) {
    const char *n = p->tensors[i].name;
    if (strstr(n, ".w1.weight")) k1 = i;
    if (strstr(n, ".w3.weight")) k3 = i;
    if (strstr(n, ".w2.weight")) k2 = i;
  }
  if (k1 < 0 || k3 < 0 || k2 < 0) return TPR_FAIL(TPR_ERR_INTERNAL, "minimax_m2: plan without expert weights");
  size_t blk = (size_t)(Fr * H) * sizeof(float);
  char *h13 = malloc((size_t)Er * 2 * blk + 1), *h2 = malloc((size_t)Er * blk + 1);
  tpr_status rc = h13 && h2 ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "minimax_m2: expert staging");
  const tpr_load_item *base = tpr_loader_item(s->loader, 0);
  for (int64_t e = 0; rc == TPR_OK && e < Er; e++) {
    const tpr_load_item *it1, *it3, *it2;
    rc = tpr_loader_find(s->loader, k1, L, e, &it1);
    if (rc == TPR_OK) rc = tpr_loader_find(s->loader, k3, L, e, &it3);
    if (rc == TPR_OK) rc = tpr_loader_find(s->loader, k2, L, e, &it2);
    if (rc != TPR_OK) break;
    memcpy(h13 + (size_t)e * 2 * blk, tpr_rank_weights_data(&s->weights, it1 - base), blk);
    memcpy(h13 + (size_t)e * 2 * blk + blk, tpr_rank_weights_data(&s->weights, it3 - base), blk);
    memcpy(h2 + (size_t)e * blk, tpr_rank_weights_data(&s->weights, it2 - base), blk);
  }
  tpr_tensor **w13 = &s->experts[2 * L], **w2 = &s->experts[2 * L + 1];
  if (rc == TPR_OK) rc = tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){Er, 2 * Fr, H}, w13);
  if (rc == TPR_OK) rc = tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){Er, H, Fr}, w2);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(*w13, h13, (size_t)Er * 2 * blk);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(*w2, h2, (size_t)Er * blk);
  free(h13), free(h2);
  return rc;
}

// A weight slice as a tensor on the backend: the loaded host bytes wrapped
// in place on the CPU, copied to a device otherwise.
static tpr_status weight_tensor(tpr_session *s, const tpr_shard_tensor *t, const void *host, tpr_tensor **out) {
  if (s->be->vt->host_addressable)
    return tpr_tensor_wrap(s->be, TPR_F32, t->ndim, t->rank_shape, (void *)host, out);
  TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, t->ndim, t->rank_shape, out));
  return tpr_tensor_from_host(*out, host, (size_t)tpr_tensor_numel(*out) * sizeof(float));
}

static tpr_status load_weights(tpr_session *s) {
  TPR_CHECK(tpr_loader_open(s->o.model_dir, &s->plan, s->mesh.world_rank, &s->loader));
  TPR_CHECK(tpr_loader_load_all(s->loader, TPR_F32, &s->weights));
  s->stats.weight_bytes = s->weights.bytes_held;
  s->stats.bytes_read = s->weights.bytes_read;
  int64_t n = s->weights.n, layers = s->cfg.num_layers;
  s->item_tensors = calloc((size_t)n, sizeof *s->item_tensors);
  s->experts = calloc((size_t)(2 * layers), sizeof *s->experts);
  s->caches = calloc((size_t)(2 * layers), sizeof *s->caches);
  if (!s->item_tensors || !s->experts || !s->caches) return TPR_FAIL(TPR_ERR_OOM, "minimax_m2: weight handles");
  for (int64_t i = 0; i < n; i++) {
    const tpr_load_item *it = &s->weights.items[i];
    if (it->local_expert >= 0) continue;  // stacked per layer below
    const tpr_shard_tensor *t = &s->plan.tensors[it->kind];
    TPR_CHECK(weight_tensor(s, t, tpr_rank_weights_data(&s->weights, i), &s->item_tensors[i]));
  }
  const tpr_attn_plan *a = &s->plan.attn;
  for (int64_t L = 0; L < layers; L++) {
    TPR_CHECK(stack_experts(s, L));
    for (int kv = 0; kv < 2 && !s->o.training; kv++) {
      TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){s->o.max_seq, a->kv_per_rank, s->cfg.head_dim},
                               &s->caches[2 * L + kv]));
      TPR_CHECK(tpr_tensor_fill_zero(s->caches[2 * L + kv]));
    }
  }
  return TPR_OK;
}

tpr_status tpr__session_bind_params(tpr_session *s, tpr_exec *e) {
  char name[160];
  for (int64_t i = 0; i < s->weights.n; i++)
    if (s->item_tensors[i]) TPR_CHECK(tpr_exec_bind(e, s->weights.items[i].name, s->item_tensors[i]));
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    tpr_m2_expert_name(L, "w13", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->experts[2 * L]));
    tpr_m2_expert_name(L, "w2", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->experts[2 * L + 1]));
    if (s->o.training) continue;  // training programs hold no caches
    tpr_m2_cache_name(L, "k", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->caches[2 * L]));
    tpr_m2_cache_name(L, "v", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->caches[2 * L + 1]));
  }
  return tpr_exec_bind(e, "rank", s->rank);
}

// Rank 0 builds and serializes; everyone receives the bytes and deserializes.
static tpr_status receive_program(tpr_session *s, const tpr_m2_build_opts *bo, tpr_program **out) {
  uint8_t *bytes = NULL;
  size_t len = 0;
  tpr_status rc = TPR_OK;
  if (tpr_comm_rank(s->world) == 0) {
    tpr_program *p = NULL;
    rc = tpr_m2_build(&s->plan, bo, &p);
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

tpr_status tpr__session_make_program(tpr_session *s, const tpr_m2_build_opts *bo, tpr_program **out) {
  *out = NULL;
  if (s->o.broadcast_program)
    TPR_CHECK(receive_program(s, bo, out));
  else
    TPR_CHECK(tpr_m2_build(&s->plan, bo, out));
  return tpr_comm_check_program(s->world, *out, &s->stats.program_hash);
}

static tpr_status program_for(tpr_session *s, int64_t T, step_program **out) {
  for (int i = 0; i < s->n_programs; i++)
    if (s->programs[i].T == T) {
      *out = &s->programs[i];
      return TPR_OK;
    }
  if (s->n_programs == MAX_PROGRAMS) {  // forget the oldest prompt length (never decode's, built early)
    step_program *old = &s->programs[1];
    tpr_exec_free(old->exec);
    tpr_program_free(old->program);
    tpr_tensor_free(old->tokens), tpr_tensor_free(old->positions), tpr_tensor_free(old->start);
    memmove(old, old + 1, (size_t)(MAX_PROGRAMS - 2) * sizeof *old);
    s->n_programs--;
  }
  step_program *m = &s->programs[s->n_programs];
  memset(m, 0, sizeof *m);
  m->T = T;
  tpr_m2_build_opts bo = {.tokens = T,
                          .max_seq = s->o.max_seq,
                          .per_rank_qk_norm = s->o.per_rank_qk_norm,
                          .moe = s->o.moe,
                          .moe_stats = s->o.moe_stats};
  tpr_status rc = tpr__session_make_program(s, &bo, &m->program);
  if (m->program) s->n_programs++;  // owned from here: close frees it
  TPR_CHECK(rc);
  TPR_CHECK(tpr_exec_new(m->program, s->be, &m->exec));
  tpr_exec_set_collectives(m->exec, &s->hook);
  TPR_CHECK(tpr__session_bind_params(s, m->exec));
  TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){T}, &m->tokens));
  TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){T}, &m->positions));
  TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){1}, &m->start));
  TPR_CHECK(tpr_exec_bind(m->exec, "tokens", m->tokens));
  TPR_CHECK(tpr_exec_bind(m->exec, "positions", m->positions));
  TPR_CHECK(tpr_exec_bind(m->exec, "start", m->start));
  *out = m;
  return TPR_OK;
}

// Fills in the mesh sizes left at 0 (see tpr_session_opts).
static tpr_status resolve_mesh(tpr_session_opts *o, int world) {
  if (o->tp < 0 || o->dp < 0 || o->ep < 0 || o->etp < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "mesh sizes must be positive (tp %d, dp %d, ep %d, etp %d)", o->tp, o->dp,
                    o->ep, o->etp);
  if (!o->dp) o->dp = o->tp && world % o->tp == 0 ? world / o->tp : 1;
  if (!o->tp) o->tp = world % o->dp == 0 ? world / o->dp : 0;
  if (o->tp * o->dp != world)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--tp %d x --dp %d must equal the world of %d ranks (mpirun -np)", o->tp,
                    o->dp, world);
  if (!o->ep) o->ep = 1;
  if (!o->etp) o->etp = world % o->ep == 0 ? world / o->ep : 0;
  if (o->etp < 1 || world % (o->ep * o->etp))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--ep %d x --etp %d must divide the world of %d ranks", o->ep, o->etp, world);
  return TPR_OK;
}

static tpr_status open_session(tpr_session *s) {
  int world = tpr_comm_size(s->world), rank = tpr_comm_rank(s->world);
  tpr_session_opts *o = &s->o;
  TPR_CHECK(tpr_model_config_load(o->model_dir, &s->cfg));
  TPR_CHECK(resolve_mesh(o, world));
  TPR_CHECK(tpr_shard_plan_build(&s->cfg, o->tp, o->ep, o->etp, o->dp, TPR_F32, &s->plan));
  TPR_CHECK(tpr_moe_opts_check(&o->moe, &s->plan));
  TPR_CHECK(tpr_mesh_init(world, rank, o->tp, o->ep, o->etp, &s->mesh));
  TPR_CHECK(tpr_mesh_comms_init(s->world, &s->mesh, &s->comms));
  s->hook = tpr_mesh_comms_exec_hook(&s->comms);
  if (o->force_tp_rank >= o->tp)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--debug-force-tp-rank %d: the tp group has ranks 0..%d", o->force_tp_rank,
                    o->tp - 1);
  tpr_mesh claimed = s->mesh;
  if (o->force_tp_rank >= 0) claimed.tp_rank = o->force_tp_rank;  // negative control
  TPR_CHECK(tpr_mesh_rank_tensor(&claimed, s->be, &s->rank));
  if (o->moe_stats)
    TPR_CHECK(tpr_moe_stats_init(&s->moe_stats, s->cfg.num_layers, s->cfg.num_experts, s->plan.ep));
  return load_weights(s);
}


tpr_status tpr_session_open(const tpr_session_opts *o, tpr_comm_t world, tpr_backend *be,
                               tpr_session **out) {
  *out = NULL;
  if (!o->model_dir) return TPR_FAIL(TPR_ERR_INVALID_ARG, "minimax_m2: no model directory");
  if (o->max_seq < 1 && !o->training) return TPR_FAIL(TPR_ERR_INVALID_ARG, "minimax_m2: max_seq %lld", (long long)o->max_seq);
  tpr_session *s = calloc(1, sizeof *s);
  if (!s) return TPR_FAIL(TPR_ERR_OOM, "session");
  double t0 = now_s();
  s->o = *o;
  s->be = be;
  s->world = world;
  step_program *decode;
  tpr_status rc = tpr_comm_agree(world, open_session(s));
  // Decode's program first: it is never evicted. Building it is collective
  // (hash check, or the broadcast of rank 0's bytes).
  if (rc == TPR_OK && !o->training) rc = tpr_comm_agree(world, program_for(s, 1, &decode));
  if (rc != TPR_OK) {
    tpr_session_close(s);
    return rc;
  }
  s->stats.load_s = now_s() - t0;
  *out = s;
  return TPR_OK;
}

void tpr_session_close(tpr_session *s) {
  if (!s) return;
  tpr__m2_train_free(s->train);
  for (int i = 0; i < s->n_programs; i++) {
    step_program *m = &s->programs[i];
    tpr_exec_free(m->exec);
    tpr_program_free(m->program);
    tpr_tensor_free(m->tokens), tpr_tensor_free(m->positions), tpr_tensor_free(m->start);
  }
  int64_t layers = s->cfg.num_layers;
  for (int64_t i = 0; s->item_tensors && i < s->weights.n; i++) tpr_tensor_free(s->item_tensors[i]);
  for (int64_t i = 0; i < 2 * layers; i++) {
    if (s->experts) tpr_tensor_free(s->experts[i]);
    if (s->caches) tpr_tensor_free(s->caches[i]);
  }
  free(s->item_tensors), free(s->experts), free(s->caches), free(s->logits_t), free(s->gates_host);
  tpr_moe_stats_free(&s->moe_stats);
  tpr_tensor_free(s->rank);
  tpr_rank_weights_free(&s->weights);
  tpr_loader_close(s->loader);
  tpr_mesh_comms_free(&s->comms);
  tpr_shard_plan_free(&s->plan);
  free(s);
}

// Adds this run's gates of every layer to the statistics.
static tpr_status count_routing(tpr_session *s, step_program *m, int64_t T) {
  const int64_t E = s->cfg.num_experts;
  float *g = realloc(s->gates_host, (size_t)(2 * T * E) * sizeof *g);
  if (!g) return TPR_FAIL(TPR_ERR_OOM, "moe stats staging");
  s->gates_host = g;
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    char name[64];
    const tpr_tensor *used, *router;
    snprintf(name, sizeof name, "moe_gates.%lld", (long long)L);
    TPR_CHECK(tpr_exec_output(m->exec, name, &used));
    TPR_CHECK(tpr_tensor_to_host(used, g, (size_t)(T * E) * sizeof *g));
    bool capacity = s->o.moe.capacity_factor > 0;  // only then does the router's own output exist
    if (capacity) {
      snprintf(name, sizeof name, "moe_router.%lld", (long long)L);
      TPR_CHECK(tpr_exec_output(m->exec, name, &router));
      TPR_CHECK(tpr_tensor_to_host(router, g + T * E, (size_t)(T * E) * sizeof *g));
    }
    tpr_moe_stats_add(&s->moe_stats, L, capacity ? g + T * E : NULL, g, T);
  }
  return TPR_OK;
}

tpr_status tpr_session_moe_stats(tpr_session *s, tpr_moe_stats *out) {
  memset(out, 0, sizeof *out);
  if (!s->o.moe_stats) return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe stats: the session was opened without moe_stats");
  const tpr_moe_stats *a = &s->moe_stats;
  TPR_CHECK(tpr_moe_stats_init(out, a->layers, a->experts, a->ep));
  // Each replica counted once: its tp rank 0 contributes, the others add zeros.
  bool mine = s->mesh.tp_rank == 0;
  int64_t nE = a->layers * a->experts, nL = 3 * a->layers, tokens = mine ? a->tokens : 0;
  for (int64_t i = 0; i < nE; i++) out->expert_tokens[i] = mine ? a->expert_tokens[i] : 0;
  for (int64_t i = 0; i < nL; i++) out->routed[i] = mine ? a->routed[i] : 0;
  tpr_status rc = tpr_comm_all_reduce(s->world, out->expert_tokens, out->expert_tokens, (size_t)nE, TPR_I64, TPR_SUM);
  if (rc == TPR_OK) rc = tpr_comm_all_reduce(s->world, out->routed, out->routed, (size_t)nL, TPR_I64, TPR_SUM);
  if (rc == TPR_OK) rc = tpr_comm_all_reduce(s->world, &tokens, &out->tokens, 1, TPR_I64, TPR_SUM);
  if (rc != TPR_OK) tpr_moe_stats_free(out);
  return rc;
}

tpr_status tpr_session_forward(tpr_session *s, const int32_t *tokens, int64_t T, int64_t start,
                                  float *logits) {
  if (s->o.training) return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: the session was opened for training");
  int64_t V = s->cfg.vocab_size, Vp = s->plan.vocab_padded;
  if (T < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: no tokens");
  if (start < 0 || start + T > s->o.max_seq)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: positions %lld..%lld do not fit the KV cache of %lld rows",
                    (long long)start, (long long)(start + T - 1), (long long)s->o.max_seq);
  for (int64_t t = 0; t < T; t++)
    if (tokens[t] < 0 || tokens[t] >= V)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: token id %d at position %lld is outside the vocabulary [0, %lld)",
                      tokens[t], (long long)t, (long long)V);
  step_program *m;
  TPR_CHECK(program_for(s, T, &m));
  int32_t *pos = malloc((size_t)T * sizeof *pos), st = (int32_t)start;
  if (!pos) return TPR_FAIL(TPR_ERR_OOM, "positions");
  for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(start + t);
  tpr_status rc = tpr_tensor_from_host(m->tokens, tokens, (size_t)T * sizeof *tokens);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(m->positions, pos, (size_t)T * sizeof *pos);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(m->start, &st, sizeof st);
  free(pos);
  TPR_CHECK(rc);
  TPR_CHECK(tpr_exec_run(m->exec));
  if (s->o.moe_stats) TPR_CHECK(count_routing(s, m, T));
  if (!logits) return TPR_OK;
  const tpr_tensor *out;
  TPR_CHECK(tpr_exec_output(m->exec, "logits_t", &out));  // (V', T)
  if (Vp * T > s->logits_cap) {
    free(s->logits_t);
    s->logits_cap = 0;
    if (!(s->logits_t = malloc((size_t)(Vp * T) * sizeof *s->logits_t))) return TPR_FAIL(TPR_ERR_OOM, "logits");
    s->logits_cap = Vp * T;
  }
  TPR_CHECK(tpr_tensor_to_host(out, s->logits_t, (size_t)(Vp * T) * sizeof *s->logits_t));
  for (int64_t t = 0; t < T; t++)
    for (int64_t v = 0; v < V; v++) logits[t * V + v] = s->logits_t[v * T + t];
  return TPR_OK;
}
