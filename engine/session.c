#include "engine/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "models/family.h"
#include "engine/session_impl.h"
#include "engine/weight_dtype.h"
#include "runtime/host_mem.h"
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
tpr_session_pool tpr_session_pool_info(const tpr_session *s) { return s->pool; }

double tpr_session_weight_element_bytes(const tpr_session *s, const char *kind) {
  for (int k = 0; s->kind_dtype && k < s->plan.n_tensors; k++)
    if (strstr(s->plan.tensors[k].name, kind))
      return (double)tpr_dtype_size(s->kind_dtype[k]) + (s->kind_block[k] > 0 ? 4.0 / s->kind_block[k] : 0.0);
  return 4.0;
}

// The weights' indices of layer L's local expert e in the kinds k (gate, up,
// down).
static tpr_status expert_items(tpr_session *s, int64_t L, int64_t e, const int *k, int64_t *idx) {
  const tpr_load_item *base = tpr_loader_item(s->loader, 0);
  for (int j = 0; j < 3; j++) {
    const tpr_load_item *it;
    TPR_CHECK(tpr_loader_find(s->loader, k[j], L, e, &it));
    idx[j] = it - base;
  }
  return TPR_OK;
}

// FP8 experts: their scales stacked like the weights, s13 (E_r, 2F_r,
// ceil(H / block)) = [s1; s3], s2 (E_r, H, ceil(F_r / block)).
static tpr_status stack_expert_scales(tpr_session *s, int64_t L, int k1, int k3, int k2) {
  const int64_t Er = s->plan.experts_per_rank, Fr = s->plan.expert_inter_per_rank, H = s->cfg.hidden_size;
  const int block = s->kind_block[k1];
  const int64_t n13 = (H + block - 1) / block, n2 = (Fr + block - 1) / block;
  const size_t b1 = (size_t)(Fr * n13) * sizeof(float), b2 = (size_t)(H * n2) * sizeof(float);
  tpr_tensor **sc = s->experts + 2 * s->cfg.num_layers + 2 * L;
  TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){Er, 2 * Fr, n13}, &sc[0]));
  TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 3, (const int64_t[]){Er, H, n2}, &sc[1]));
  char *h13 = malloc((size_t)Er * 2 * b1 + 1), *h2 = malloc((size_t)Er * b2 + 1);
  tpr_status rc = h13 && h2 ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "session: expert scale staging");
  int64_t idx[3];
  for (int64_t e = 0; rc == TPR_OK && e < Er; e++) {
    if ((rc = expert_items(s, L, e, (const int[]){k1, k3, k2}, idx)) != TPR_OK) break;
    memcpy(h13 + (size_t)e * 2 * b1, s->weights.scales[idx[0]], b1);
    memcpy(h13 + (size_t)e * 2 * b1 + b1, s->weights.scales[idx[1]], b1);
    memcpy(h2 + (size_t)e * b2, s->weights.scales[idx[2]], b2);
  }
  if (rc == TPR_OK) rc = tpr_tensor_from_host(sc[0], h13, (size_t)Er * 2 * b1);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(sc[1], h2, (size_t)Er * b2);
  free(h13), free(h2);
  return rc;
}

// Stacks a layer's local experts: w13 (E_r, 2F_r, H) = [w1; w3], w2 (E_r, H, F_r),
// built in host memory and copied to the backend.
static tpr_status stack_experts(tpr_session *s, int64_t L) {
  const tpr_shard_plan *p = &s->plan;
  int64_t Er = p->experts_per_rank, Fr = p->expert_inter_per_rank, H = s->cfg.hidden_size;
  int k1 = -1, k3 = -1, k2 = -1;
  for (int i = 0; i < p->n_tensors; i++) {
    const char *n = p->tensors[i].name;
    if (strstr(n, s->family->expert_gate)) k1 = i;
    if (strstr(n, s->family->expert_up)) k3 = i;
    if (strstr(n, s->family->expert_down)) k2 = i;
  }
  if (k1 < 0 || k3 < 0 || k2 < 0) return TPR_FAIL(TPR_ERR_INTERNAL, "%s: plan without expert weights", s->family->name);
  tpr_dtype dt = s->kind_dtype[k1];  // weight_dtype.c: one dtype for the three kinds
  size_t blk = (size_t)(Fr * H) * tpr_dtype_size(dt);
  char *h13 = malloc((size_t)Er * 2 * blk + 1), *h2 = malloc((size_t)Er * blk + 1);
  tpr_status rc = h13 && h2 ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "minimax_m2: expert staging");
  int64_t idx[3];
  for (int64_t e = 0; rc == TPR_OK && e < Er; e++) {
    if ((rc = expert_items(s, L, e, (const int[]){k1, k3, k2}, idx)) != TPR_OK) break;
    memcpy(h13 + (size_t)e * 2 * blk, tpr_rank_weights_data(&s->weights, idx[0]), blk);
    memcpy(h13 + (size_t)e * 2 * blk + blk, tpr_rank_weights_data(&s->weights, idx[1]), blk);
    memcpy(h2 + (size_t)e * blk, tpr_rank_weights_data(&s->weights, idx[2]), blk);
  }
  tpr_tensor **w13 = &s->experts[2 * L], **w2 = &s->experts[2 * L + 1];
  if (rc == TPR_OK) rc = tpr_tensor_new(s->be, dt, 3, (const int64_t[]){Er, 2 * Fr, H}, w13);
  if (rc == TPR_OK) rc = tpr_tensor_new(s->be, dt, 3, (const int64_t[]){Er, H, Fr}, w2);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(*w13, h13, (size_t)Er * 2 * blk);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(*w2, h2, (size_t)Er * blk);
  free(h13), free(h2);
  if (rc == TPR_OK && s->kind_block[k1] > 0) rc = stack_expert_scales(s, L, k1, k3, k2);
  return rc;
}

// A weight slice as a tensor on the backend: the loaded host bytes wrapped
// in place on the CPU, copied to a device otherwise.
static tpr_status weight_tensor(tpr_session *s, const tpr_shard_tensor *t, tpr_dtype dt, const void *host,
                                tpr_tensor **out) {
  if (s->be->vt->host_addressable) return tpr_tensor_wrap(s->be, dt, t->ndim, t->rank_shape, (void *)host, out);
  TPR_CHECK(tpr_tensor_new(s->be, dt, t->ndim, t->rank_shape, out));
  return tpr_tensor_from_host(*out, host, tpr_tensor_nbytes(*out));
}

// The FP8 scale block each plan kind can be held at, agreed over the ranks
// (the smallest; collective: every rank reaches it once the open agreed).
static tpr_status agree_fp8_blocks(tpr_session *s) {
  int n = s->plan.n_tensors;
  int64_t *b = malloc((size_t)(n + 1) * sizeof *b);
  if (!b) return TPR_FAIL(TPR_ERR_OOM, "session: FP8 blocks");
  for (int k = 0; k < n; k++) b[k] = tpr_loader_fp8_block(s->loader, k);
  tpr_status rc = tpr_comm_all_reduce(s->world, b, b, (size_t)n, TPR_I64, TPR_MIN);
  for (int k = 0; rc == TPR_OK && k < n; k++) s->kind_block[k] = (int)b[k];
  free(b);
  return rc;
}

// The scales of FP8 weights, as tensors: item i's (R, ceil(C / block)).
static tpr_status scale_tensor(tpr_session *s, const tpr_shard_tensor *t, int64_t i, tpr_tensor **out) {
  int block = s->weights.block[i];
  const int64_t shape[2] = {t->rank_shape[0], (t->rank_shape[1] + block - 1) / block};
  if (s->be->vt->host_addressable) return tpr_tensor_wrap(s->be, TPR_F32, 2, shape, s->weights.scales[i], out);
  TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 2, shape, out));
  return tpr_tensor_from_host(*out, s->weights.scales[i], tpr_tensor_nbytes(*out));
}

// The dtype each plan kind is held in (no collective).
static tpr_status weight_dtypes(tpr_session *s) {
  const char *const expert_kinds[3] = {s->family->expert_gate, s->family->expert_up, s->family->expert_down};
  return tpr_weight_dtypes(s->loader, &s->plan, s->o.training ? TPR_F32 : s->o.weight_dtype,
                           s->be->vt->host_addressable, expert_kinds, s->kind_dtype, s->kind_block);
}

// The ranks of one node share its memory: `bytes` (this rank's ask) times
// the node's ranks against MemAvailable, every rank's figures read before
// any allocates (collective: the largest ask and the smallest MemAvailable,
// so every rank reaches the same verdict).
static tpr_status check_node_memory(tpr_session *s, uint64_t bytes, const char *what) {
  uint64_t avail = tpr_host_mem_available();
  int64_t v[2] = {avail > INT64_MAX ? INT64_MAX : (int64_t)avail, bytes > INT64_MAX ? -INT64_MAX : -(int64_t)bytes};
  TPR_CHECK(tpr_comm_all_reduce(s->world, v, v, 2, TPR_I64, TPR_MIN));
  return tpr_host_mem_check_node((uint64_t)-v[1], tpr_local_ranks_from_env(), (uint64_t)v[0], what);
}

static tpr_status check_weights_memory(tpr_session *s) {
  char what[96];
  snprintf(what, sizeof what, "rank %d: loading its weights%s", s->mesh.world_rank,
           s->mesh.world_size > 1 ? " (the largest share of any rank)" : "");
  return check_node_memory(s, tpr_loader_arena_bytes(s->loader, TPR_F32, s->kind_dtype), what);
}

static tpr_status load_weights(tpr_session *s) {
  TPR_CHECK(tpr_loader_load_all_as(s->loader, TPR_F32, s->kind_dtype, s->kind_block, &s->weights));
  s->stats.weight_bytes = s->weights.bytes_held;
  s->stats.matrix_dtype = TPR_F32;
  for (int k = 0; k < s->plan.n_tensors; k++)
    if (s->kind_dtype[k] == TPR_F8E4M3 || (s->kind_dtype[k] == TPR_BF16 && s->stats.matrix_dtype == TPR_F32))
      s->stats.matrix_dtype = s->kind_dtype[k];
  s->stats.bytes_read = s->weights.bytes_read;
  int64_t n = s->weights.n, layers = s->cfg.num_layers;
  s->item_tensors = calloc((size_t)n, sizeof *s->item_tensors);
  s->item_scales = calloc((size_t)n, sizeof *s->item_scales);
  s->experts = calloc((size_t)(4 * layers), sizeof *s->experts);  // w13, w2, then their FP8 scales
  s->pools = calloc((size_t)(2 * layers), sizeof *s->pools);
  if (!s->item_tensors || !s->item_scales || !s->experts || !s->pools)
    return TPR_FAIL(TPR_ERR_OOM, "session: weight handles");
  for (int64_t i = 0; i < n; i++) {
    const tpr_load_item *it = &s->weights.items[i];
    if (it->local_expert >= 0) continue;  // stacked per layer below
    const tpr_shard_tensor *t = &s->plan.tensors[it->kind];
    TPR_CHECK(weight_tensor(s, t, s->weights.dtype[i], tpr_rank_weights_data(&s->weights, i), &s->item_tensors[i]));
    if (s->weights.scales[i]) TPR_CHECK(scale_tensor(s, t, i, &s->item_scales[i]));
  }
  for (int64_t L = 0; L < layers; L++)  // dense-MLP layers (qwen3_moe) hold no experts
    if (tpr_model_config_layer_is_moe(&s->cfg, L)) TPR_CHECK(stack_experts(s, L));
  return TPR_OK;
}

// Bytes of one KV block over every layer, K and V, on this rank.
static uint64_t block_bytes(const tpr_session *s) {
  return 2u * (uint64_t)s->cfg.num_layers * (uint64_t)s->pool.block_size * (uint64_t)s->plan.attn.kv_per_rank *
         (uint64_t)s->cfg.head_dim * sizeof(float);
}

// Sizes the pool (the smallest block count any rank affords: collective) and
// allocates it, zero-filled so that no row ever holds garbage.
static tpr_status alloc_pool(tpr_session *s) {
  const tpr_session_opts *o = &s->o;
  tpr_session_pool *p = &s->pool;
  uint64_t per_block = block_bytes(s);
  int64_t blocks;
  // --max-batch x --max-seq from the command line may overflow int64.
  if (__builtin_mul_overflow(p->batch, p->max_blocks, &blocks))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "the KV pool: max_batch %lld x %lld blocks of %lld tokens (max_seq %lld) "
                    "overflows", (long long)p->batch, (long long)p->max_blocks, (long long)p->block_size,
                    (long long)o->max_seq);
  if (o->kv_cache_bytes > 0) {
    blocks = (int64_t)((uint64_t)o->kv_cache_bytes / per_block);
  } else if (o->kv_cache_fraction > 0) {
    // The node's ranks share what is left: each takes its part of the fraction.
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double avail = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    blocks = (int64_t)(o->kv_cache_fraction * avail / tpr_local_ranks_from_env() / (double)per_block);
  }
  TPR_CHECK(tpr_comm_all_reduce(s->world, &blocks, &blocks, 1, TPR_I64, TPR_MIN));
  if (blocks < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "the KV pool holds no block: a block takes %llu bytes on this rank "
                    "(%lld tokens x %d layers x K,V)", (unsigned long long)per_block, (long long)p->block_size,
                    (int)s->cfg.num_layers);
  uint64_t bytes;
  if (__builtin_mul_overflow((uint64_t)blocks, per_block, &bytes)) bytes = UINT64_MAX;
  // Host memory: a pool larger than the machine fails here, on every rank
  // (the caller agrees), rather than in the OOM killer at the zero fill.
  if (s->be->vt->host_addressable) {
    char what[200];
    snprintf(what, sizeof what, "the KV pool (%lld blocks x %llu bytes: %s)", (long long)blocks,
             (unsigned long long)per_block,
             o->kv_cache_bytes > 0 ? "--kv-cache-bytes" : "--max-batch x --max-seq");
    TPR_CHECK(check_node_memory(s, bytes, what));  // every rank reaches it: the same verdict
  }
  p->blocks = blocks;
  p->bytes = bytes;
  const int64_t shape[4] = {blocks, p->block_size, s->plan.attn.kv_per_rank, s->cfg.head_dim};
  for (int64_t i = 0; i < 2 * s->cfg.num_layers; i++) {
    TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 4, shape, &s->pools[i]));
    TPR_CHECK(tpr_tensor_fill_zero(s->pools[i]));
  }
  return TPR_OK;
}

tpr_status tpr__session_bind_params(tpr_session *s, tpr_exec *e) {
  char name[160];
  for (int64_t i = 0; i < s->weights.n; i++) {
    if (s->item_tensors[i]) TPR_CHECK(tpr_exec_bind(e, s->weights.items[i].name, s->item_tensors[i]));
    if (!s->item_scales || !s->item_scales[i]) continue;
    snprintf(name, sizeof name, "%s.scale", s->weights.items[i].name);
    TPR_CHECK(tpr_exec_bind(e, name, s->item_scales[i]));
  }
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    // FSDP training frees the full experts and binds their shards itself.
    tpr_family_expert_name(L, "w13", name, sizeof name);
    if (s->experts[2 * L]) TPR_CHECK(tpr_exec_bind(e, name, s->experts[2 * L]));
    tpr_family_expert_name(L, "w2", name, sizeof name);
    if (s->experts[2 * L + 1]) TPR_CHECK(tpr_exec_bind(e, name, s->experts[2 * L + 1]));
    tpr_tensor **sc = s->experts + 2 * s->cfg.num_layers + 2 * L;  // FP8: the stacked scales
    tpr_family_expert_name(L, "w13.scale", name, sizeof name);
    if (sc[0]) TPR_CHECK(tpr_exec_bind(e, name, sc[0]));
    tpr_family_expert_name(L, "w2.scale", name, sizeof name);
    if (sc[1]) TPR_CHECK(tpr_exec_bind(e, name, sc[1]));
    if (s->o.training) continue;  // training programs hold no KV pool
    tpr_family_pool_name(L, "k", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->pools[2 * L]));
    tpr_family_pool_name(L, "v", name, sizeof name);
    TPR_CHECK(tpr_exec_bind(e, name, s->pools[2 * L + 1]));
  }
  return tpr_exec_bind(e, "rank", s->rank);
}

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
}

static const char *const step_input_names[STEP_INPUTS] = {"tokens", "positions", "slot_mapping", "seq",
                                                          "block_tables", "sample_rows"};

// The program of step shape (T, N), built on first use. Collective.
static tpr_status program_for(tpr_session *s, int64_t T, int64_t N, step_program **out) {
  for (int i = 0; i < s->n_programs; i++)
    if (s->programs[i].T == T && s->programs[i].N == N) {
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
  m->T = T, m->N = N;
  const tpr_session_pool *pl = &s->pool;
  tpr_step_build_opts bo = {.shape = {.tokens = T,
                                      .samples = N,
                                      .batch = pl->batch,
                                      .max_blocks = pl->max_blocks,
                                      .pool_blocks = pl->blocks,
                                      .block_size = pl->block_size},
                            .moe = s->o.moe,
                            .moe_stats = s->o.moe_stats,
                            .per_rank_qk_norm = s->o.per_rank_qk_norm,
                            .mrope_layout_control = s->o.mrope_layout_control,
                            .kind_dtype = s->kind_dtype,
                            .kind_block = s->kind_block};
  tpr_status rc = tpr__session_make_program(s, build_step, &bo, &m->program);
  if (m->program) s->n_programs++;  // owned from here: close frees it
  TPR_CHECK(rc);
  TPR_CHECK(tpr_exec_new(m->program, s->be, &m->exec));
  tpr_exec_set_collectives(m->exec, &s->hook);
  TPR_CHECK(tpr__session_bind_params(s, m->exec));
  for (int i = 0; i < STEP_INPUTS; i++) {
    int64_t shape[2] = {i == STEP_BLOCKS ? pl->batch : i == STEP_SAMPLES ? N : T, pl->max_blocks};
    TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, i == STEP_BLOCKS ? 2 : 1, shape, &m->in[i]));
    TPR_CHECK(tpr_exec_bind(m->exec, step_input_names[i], m->in[i]));
  }
  if (s->cfg.mrope_layout) {
    TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 2, (const int64_t[]){3, T}, &m->pos3));
    TPR_CHECK(tpr_exec_bind(m->exec, "positions_3d", m->pos3));
  }
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
  if (o->moe_stats && s->cfg.num_experts == 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--moe-stats: %s is a dense model (no experts, nothing is routed)",
                    tpr_model_family_name(s->cfg.family));
  if (o->moe_stats)
    TPR_CHECK(tpr_moe_stats_init(&s->moe_stats, s->cfg.num_layers, s->cfg.num_experts, s->plan.ep));
  TPR_CHECK(tpr_family_find(s->cfg.family, &s->family));
  TPR_CHECK(tpr_loader_open(s->o.model_dir, &s->plan, s->mesh.world_rank, &s->loader));
  s->kind_dtype = malloc((size_t)s->plan.n_tensors * sizeof *s->kind_dtype);
  s->kind_block = calloc((size_t)s->plan.n_tensors, sizeof *s->kind_block);
  if (!s->kind_dtype || !s->kind_block) return TPR_FAIL(TPR_ERR_OOM, "session: weight dtypes");
  if (o->training) return TPR_OK;
  s->pool.batch = o->max_batch > 0 ? o->max_batch : 1;
  s->pool.block_size = o->block_size > 0 ? o->block_size : 16;
  s->pool.max_blocks = o->max_seq / s->pool.block_size + (o->max_seq % s->pool.block_size != 0);  // no overflow near INT64_MAX
  return TPR_OK;
}


tpr_status tpr_session_open(const tpr_session_opts *o, tpr_comm_t world, tpr_backend *be,
                               tpr_session **out) {
  *out = NULL;
  if (!o->model_dir) return TPR_FAIL(TPR_ERR_INVALID_ARG, "session: no model directory");
  if (!o->training && (o->max_seq < 1 || o->max_batch < 0 || o->block_size < 0 || o->kv_cache_bytes < 0 ||
                       !(o->kv_cache_fraction >= 0 && o->kv_cache_fraction < 1)))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "session: max_seq %lld, max_batch %lld, block_size %lld, kv_cache_bytes %lld, "
                    "kv_cache_fraction %g (need max_seq >= 1, the others >= 0, a fraction below 1)",
                    (long long)o->max_seq, (long long)o->max_batch, (long long)o->block_size,
                    (long long)o->kv_cache_bytes, o->kv_cache_fraction);
  tpr_session *s = calloc(1, sizeof *s);
  if (!s) return TPR_FAIL(TPR_ERR_OOM, "session");
  double t0 = now_s();
  s->o = *o;
  s->be = be;
  s->world = world;
  step_program *decode;
  tpr_status rc = tpr_comm_agree(world, open_session(s));
  if (rc == TPR_OK) rc = tpr_comm_agree(world, agree_fp8_blocks(s));  // collective inside
  if (rc == TPR_OK) rc = tpr_comm_agree(world, weight_dtypes(s));
  if (rc == TPR_OK) rc = tpr_comm_agree(world, check_weights_memory(s));  // collective inside
  if (rc == TPR_OK) rc = tpr_comm_agree(world, load_weights(s));
  if (rc == TPR_OK && !o->training) rc = tpr_comm_agree(world, alloc_pool(s));  // collective inside
  // Decode's program first: it is never evicted. Building it is collective
  // (hash check, or the broadcast of rank 0's bytes).
  if (rc == TPR_OK && !o->training) rc = tpr_comm_agree(world, program_for(s, 1, 1, &decode));
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
  for (int i = 0; i < s->n_programs; i++) free_program(&s->programs[i]);
  int64_t layers = s->cfg.num_layers;
  for (int64_t i = 0; s->item_tensors && i < s->weights.n; i++) tpr_tensor_free(s->item_tensors[i]);
  for (int64_t i = 0; s->item_scales && i < s->weights.n; i++) tpr_tensor_free(s->item_scales[i]);
  for (int64_t i = 0; i < 2 * layers; i++) {
    if (s->experts) tpr_tensor_free(s->experts[i]), tpr_tensor_free(s->experts[2 * layers + i]);
    if (s->pools) tpr_tensor_free(s->pools[i]);
  }
  free(s->item_tensors), free(s->item_scales), free(s->kind_dtype), free(s->kind_block), free(s->experts), free(s->pools), free(s->logits_t), free(s->gates_host), free(s->host_in);
  tpr_moe_stats_free(&s->moe_stats);
  tpr_tensor_free(s->rank);
  tpr_rank_weights_free(&s->weights);
  tpr_loader_close(s->loader);
  tpr_mesh_comms_free(&s->comms);
  tpr_shard_plan_free(&s->plan);
  free(s);
}

// Adds this run's gates of every layer to the statistics.
// Adds the routing of the step's n real tokens (rows past them are padding).
static tpr_status count_routing(tpr_session *s, step_program *m, int64_t n) {
  const int64_t T = m->T;
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
    tpr_moe_stats_add(&s->moe_stats, L, capacity ? g + T * E : NULL, g, n);
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
  int64_t need = 4 * T + BM + N + 3 * T;
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
  TPR_CHECK(program_for(s, st->T, st->N, &m));
  TPR_CHECK(upload_step(s, m, st));
  TPR_CHECK(tpr_exec_run(m->exec));
  if (s->o.moe_stats) TPR_CHECK(count_routing(s, m, st->n_tokens));
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
  for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(start + t), seq[t] = 0, rows[t] = (int32_t)t;
  for (int64_t i = 0; i < BM; i++) bt[i] = (int32_t)(i % p->max_blocks);
  tpr_step st = {.T = T, .N = logits ? T : 1, .n_tokens = T, .tokens = tokens, .positions = pos, .slots = pos,
                 .seq = seq, .block_tables = bt, .n_samples = logits ? T : 0, .sample_rows = rows,
                 .positions_3d = pos3};
  tpr_status rc = tpr_session_step(s, &st, logits);
  free(buf);
  return rc;
}
