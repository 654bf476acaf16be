#include "minimax_m2_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/minimax_m2.h"
#include "shard/loader.h"
#include "shard/mesh_comms.h"

#define MAX_PROGRAMS 16  // distinct token counts kept built (prompt lengths + decode)

typedef struct m2_program {
  int64_t T;
  tpr_program *program;
  tpr_exec *exec;
  tpr_tensor *tokens, *positions, *start;  // (T) (T) (1) i32 inputs
} m2_program;

struct tpr_m2_session {
  tpr_m2_session_opts o;
  tpr_backend *be;
  tpr_comm_t world;
  tpr_model_config cfg;
  tpr_shard_plan plan;
  tpr_loader *loader;
  tpr_rank_weights weights;
  tpr_tensor **item_tensors;           // (weights.n) wrapped slices; NULL for expert items
  tpr_tensor **experts;                // (2 * layers) stacked w13, w2 per layer
  tpr_tensor **caches;                 // (2 * layers) k, v per layer: (S, kv_per_rank, D)
  tpr_mesh mesh;
  tpr_mesh_comms comms;
  tpr_exec_collectives hook;
  tpr_tensor *rank;
  m2_program programs[MAX_PROGRAMS];
  int n_programs;
  float *logits_t;                     // (V', T) staging of the gathered logits
  int64_t logits_cap;
  tpr_m2_stats stats;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const tpr_model_config *tpr_m2_session_config(const tpr_m2_session *s) { return &s->cfg; }
const tpr_m2_stats *tpr_m2_session_stats(const tpr_m2_session *s) { return &s->stats; }
int64_t tpr_m2_session_max_seq(const tpr_m2_session *s) { return s->o.max_seq; }

// Stacks a layer's local experts: w13 (E_r, 2F_r, H) = [w1; w3], w2 (E_r, H, F_r).
static tpr_status stack_experts(tpr_m2_session *s, int64_t L) {
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
  tpr_tensor **w13 = &s->experts[2 * L], **w2 = &s->experts[2 * L + 1];
  TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){Er, 2 * Fr, H}, w13));
  TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){Er, H, Fr}, w2));
  size_t blk = (size_t)(Fr * H) * sizeof(float);
  for (int64_t e = 0; e < Er; e++) {
    const tpr_load_item *it1, *it3, *it2;
    TPR_CHECK(tpr_loader_find(s->loader, k1, L, e, &it1));
    TPR_CHECK(tpr_loader_find(s->loader, k3, L, e, &it3));
    TPR_CHECK(tpr_loader_find(s->loader, k2, L, e, &it2));
    const tpr_load_item *base = tpr_loader_item(s->loader, 0);
    char *dst13 = (char *)tpr_tensor_data(*w13) + (size_t)e * 2 * blk, *dst2 = (char *)tpr_tensor_data(*w2) + (size_t)e * blk;
    memcpy(dst13, tpr_rank_weights_data(&s->weights, it1 - base), blk);
    memcpy(dst13 + blk, tpr_rank_weights_data(&s->weights, it3 - base), blk);
    memcpy(dst2, tpr_rank_weights_data(&s->weights, it2 - base), blk);
  }
  return TPR_OK;
}

static tpr_status load_weights(tpr_m2_session *s) {
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
    TPR_CHECK(tpr_tensor_wrap(s->be, TPR_F32, t->ndim, t->rank_shape, tpr_rank_weights_data(&s->weights, i),
                              &s->item_tensors[i]));
  }
  const tpr_attn_plan *a = &s->plan.attn;
  for (int64_t L = 0; L < layers; L++) {
    TPR_CHECK(stack_experts(s, L));
    for (int kv = 0; kv < 2; kv++) {
      TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){s->o.max_seq, a->kv_per_rank, s->cfg.head_dim},
                               &s->caches[2 * L + kv]));
      TPR_CHECK(tpr_tensor_fill_zero(s->caches[2 * L + kv]));
    }
  }
  return TPR_OK;
}

static tpr_status bind_params(tpr_m2_session *s, tpr_exec *e) {
  char name[160];
  for (int64_t i = 0; i < s->weights.n; i++)
    if (s->item_tensors[i]) TPR_CHECK(tpr_exec_bind(e, s->weights.items[i].name, s->item_tensors[i]));
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    tpr_m2_expert_name(L, "w13", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->experts[2 * L]));
    tpr_m2_expert_name(L, "w2", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->experts[2 * L + 1]));
    tpr_m2_cache_name(L, "k", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->caches[2 * L]));
    tpr_m2_cache_name(L, "v", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->caches[2 * L + 1]));
  }
  return tpr_exec_bind(e, "rank", s->rank);
}

// Rank 0 builds and serializes; everyone receives the bytes and deserializes.
static tpr_status receive_program(tpr_m2_session *s, const tpr_m2_build_opts *bo, tpr_program **out) {
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

static tpr_status program_for(tpr_m2_session *s, int64_t T, m2_program **out) {
  for (int i = 0; i < s->n_programs; i++)
    if (s->programs[i].T == T) {
      *out = &s->programs[i];
      return TPR_OK;
    }
  if (s->n_programs == MAX_PROGRAMS) {  // forget the oldest prompt length (never decode's, built early)
    m2_program *old = &s->programs[1];
    tpr_exec_free(old->exec);
    tpr_program_free(old->program);
    tpr_tensor_free(old->tokens), tpr_tensor_free(old->positions), tpr_tensor_free(old->start);
    memmove(old, old + 1, (size_t)(MAX_PROGRAMS - 2) * sizeof *old);
    s->n_programs--;
  }
  m2_program *m = &s->programs[s->n_programs];
  memset(m, 0, sizeof *m);
  m->T = T;
  tpr_m2_build_opts bo = {.tokens = T, .max_seq = s->o.max_seq, .per_rank_qk_norm = s->o.per_rank_qk_norm};
  if (s->o.broadcast_program)
    TPR_CHECK(receive_program(s, &bo, &m->program));
  else
    TPR_CHECK(tpr_m2_build(&s->plan, &bo, &m->program));
  s->n_programs++;  // owned from here: close frees it
  TPR_CHECK(tpr_comm_check_program(s->world, m->program, &s->stats.program_hash));
  TPR_CHECK(tpr_exec_new(m->program, s->be, &m->exec));
  tpr_exec_set_collectives(m->exec, &s->hook);
  TPR_CHECK(bind_params(s, m->exec));
  TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){T}, &m->tokens));
  TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){T}, &m->positions));
  TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){1}, &m->start));
  TPR_CHECK(tpr_exec_bind(m->exec, "tokens", m->tokens));
  TPR_CHECK(tpr_exec_bind(m->exec, "positions", m->positions));
  TPR_CHECK(tpr_exec_bind(m->exec, "start", m->start));
  *out = m;
  return TPR_OK;
}

static tpr_status open_session(tpr_m2_session *s) {
  int world = tpr_comm_size(s->world), rank = tpr_comm_rank(s->world);
  TPR_CHECK(tpr_model_config_load(s->o.model_dir, &s->cfg));
  // Issue scope: pure tensor parallelism, experts' width split over the same ranks.
  TPR_CHECK(tpr_shard_plan_build(&s->cfg, world, 1, world, 1, TPR_F32, &s->plan));
  TPR_CHECK(tpr_mesh_init(world, rank, world, 1, world, &s->mesh));
  TPR_CHECK(tpr_mesh_comms_init(s->world, &s->mesh, &s->comms));
  s->hook = tpr_mesh_comms_exec_hook(&s->comms);
  if (s->o.force_tp_rank >= world)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--debug-force-tp-rank %d: the tp group has ranks 0..%d", s->o.force_tp_rank,
                    world - 1);
  tpr_mesh claimed = s->mesh;
  if (s->o.force_tp_rank >= 0) claimed.tp_rank = s->o.force_tp_rank;  // negative control
  TPR_CHECK(tpr_mesh_rank_tensor(&claimed, s->be, &s->rank));
  return load_weights(s);
}

// Agrees on a phase's outcome: a rank that failed alone (a tensor missing
// from its shard, say) must not leave the others waiting in the next
// collective. Every rank returns an error if any failed.
static tpr_status agree(tpr_comm_t world, tpr_status rc) {
  int64_t failed = rc != TPR_OK;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", rc != TPR_OK ? tpr_last_error() : "");
  tpr_status crc = tpr_comm_all_reduce(world, &failed, &failed, 1, TPR_I64, TPR_MAX);
  if (crc != TPR_OK) return crc;
  if (rc != TPR_OK) return TPR_FAIL(rc, "%s", msg);
  if (failed) return TPR_FAIL(TPR_ERR_INVALID_ARG, "another rank failed to open the model (see its message)");
  return TPR_OK;
}

tpr_status tpr_m2_session_open(const tpr_m2_session_opts *o, tpr_comm_t world, tpr_backend *be,
                               tpr_m2_session **out) {
  *out = NULL;
  if (!o->model_dir) return TPR_FAIL(TPR_ERR_INVALID_ARG, "minimax_m2: no model directory");
  if (o->max_seq < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "minimax_m2: max_seq %lld", (long long)o->max_seq);
  tpr_m2_session *s = calloc(1, sizeof *s);
  if (!s) return TPR_FAIL(TPR_ERR_OOM, "session");
  double t0 = now_s();
  s->o = *o;
  s->be = be;
  s->world = world;
  m2_program *decode;
  tpr_status rc = agree(world, open_session(s));
  // Decode's program first: it is never evicted. Building it is collective
  // (hash check, or the broadcast of rank 0's bytes).
  if (rc == TPR_OK) rc = agree(world, program_for(s, 1, &decode));
  if (rc != TPR_OK) {
    tpr_m2_session_close(s);
    return rc;
  }
  s->stats.load_s = now_s() - t0;
  *out = s;
  return TPR_OK;
}

void tpr_m2_session_close(tpr_m2_session *s) {
  if (!s) return;
  for (int i = 0; i < s->n_programs; i++) {
    m2_program *m = &s->programs[i];
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
  free(s->item_tensors), free(s->experts), free(s->caches), free(s->logits_t);
  tpr_tensor_free(s->rank);
  tpr_rank_weights_free(&s->weights);
  tpr_loader_close(s->loader);
  tpr_mesh_comms_free(&s->comms);
  tpr_shard_plan_free(&s->plan);
  free(s);
}

tpr_status tpr_m2_session_forward(tpr_m2_session *s, const int32_t *tokens, int64_t T, int64_t start,
                                  float *logits) {
  int64_t V = s->cfg.vocab_size, Vp = s->plan.vocab_padded;
  if (T < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: no tokens");
  if (start < 0 || start + T > s->o.max_seq)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: positions %lld..%lld do not fit the KV cache of %lld rows",
                    (long long)start, (long long)(start + T - 1), (long long)s->o.max_seq);
  for (int64_t t = 0; t < T; t++)
    if (tokens[t] < 0 || tokens[t] >= V)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "forward: token id %d at position %lld is outside the vocabulary [0, %lld)",
                      tokens[t], (long long)t, (long long)V);
  m2_program *m;
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
