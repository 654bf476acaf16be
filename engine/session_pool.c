// The paged KV pool: NB blocks of bs token rows per layer, K and V, sized
// from the options and the memory the ranks have; and, for a family with a
// recurrent state (tpr_family.state_shape), NS = B state slots per recurrent
// layer beside it: a running sequence holds one slot (whatever its length)
// and the scheduler hands them out (its state_slots), so NS = B: a step
// holds at most B sequences and a sequence that cannot get a slot waits.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/session_impl.h"
#include "models/minicpm_sala.h"
#include "runtime/host_mem.h"

tpr_session_pool tpr_session_pool_info(const tpr_session *s) { return s->pool; }

// Layers with a KV cache: all but the lightning (linear attention) ones; at
// least one, so that the pool's sizing stays defined for an all-linear model.
static int64_t kv_layers(const tpr_session *s) {
  int64_t n = s->cfg.num_layers - s->cfg.num_linear_layers;
  return n > 0 ? n : 1;
}

// minicpm_sala's compressed-key rows per block of each sparse layer (0: the
// family keeps none): paged beside K and V through the same block tables, so
// a block's bytes (and a sequence's) include them.
static int64_t ck_rows(const tpr_session *s) {
  const tpr_session_pool *p = &s->pool;
  if (!tpr_minicpm_sala_ck_pool(&s->cfg, p->max_blocks * p->block_size, s->o.dense_sparse_layers)) return 0;
  return tpr_sparse_ck_rows(p->block_size, s->cfg.sparse_kernel_stride);
}

// Bytes of one KV block over every layer that has a KV cache, K and V (and
// compressed keys), on this rank.
static uint64_t block_bytes(const tpr_session *s) {
  return (2u * (uint64_t)s->pool.block_size + (uint64_t)ck_rows(s)) * (uint64_t)kv_layers(s) *
         (uint64_t)s->plan.attn.kv_per_rank * (uint64_t)s->cfg.head_dim * sizeof(float);
}

// Sizes the pool (the smallest block count any rank affords: collective) and
// allocates it, zero-filled so that no row ever holds garbage.
// Bytes of one state slot over every recurrent layer on this rank (0: none).
static uint64_t state_slot_bytes(const tpr_session *s) {
  uint64_t n = 0;
  int64_t shape[TPR_MAX_DIMS];
  for (int64_t L = 0; s->family->state_shape && L < s->cfg.num_layers; L++) {
    int nd = s->family->state_shape(&s->plan, L, shape);
    uint64_t e = nd > 0 ? 1 : 0;
    for (int d = 0; d < nd; d++) e *= (uint64_t)shape[d];
    n += e * sizeof(float);
  }
  return n;
}

// The state slots of every recurrent layer, zero-filled.
static tpr_status alloc_states(tpr_session *s) {
  tpr_session_pool *p = &s->pool;
  if (!(p->state_slot_bytes = state_slot_bytes(s))) return TPR_OK;
  p->state_slots = p->batch;
  p->state_bytes = (uint64_t)p->state_slots * p->state_slot_bytes;
  if (s->be->vt->host_addressable)
    TPR_CHECK(tpr__session_check_node_memory(s, p->bytes + p->state_bytes, "the KV pool and the recurrent state slots"));
  if (!(s->states = calloc((size_t)s->cfg.num_layers, sizeof *s->states)))
    return TPR_FAIL(TPR_ERR_OOM, "session: state pool handles");
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    int64_t shape[TPR_MAX_DIMS + 1];
    int nd = s->family->state_shape(&s->plan, L, shape + 1);
    if (nd <= 0) continue;
    shape[0] = p->state_slots;  // (NS, state shape)
    TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, nd + 1, shape, &s->states[L]));
    TPR_CHECK(tpr_tensor_fill_zero(s->states[L]));
  }
  return TPR_OK;
}

tpr_status tpr__session_alloc_pool(tpr_session *s) {
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
    TPR_CHECK(tpr__session_check_node_memory(s, bytes, what));  // every rank reaches it: the same verdict
  }
  p->blocks = blocks;
  p->bytes = bytes;
  s->pools = calloc((size_t)(2 * s->cfg.num_layers), sizeof *s->pools);
  if (!s->pools) return TPR_FAIL(TPR_ERR_OOM, "session: KV pool handles");
  const int64_t shape[4] = {blocks, p->block_size, s->plan.attn.kv_per_rank, s->cfg.head_dim};
  for (int64_t i = 0; i < 2 * s->cfg.num_layers; i++) {
    if (tpr_model_config_layer_is_linear(&s->cfg, i / 2)) continue;  // its state is not a KV cache
    TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 4, shape, &s->pools[i]));
    TPR_CHECK(tpr_tensor_fill_zero(s->pools[i]));
  }
  const int64_t R = ck_rows(s), cshape[4] = {blocks, R, s->plan.attn.kv_per_rank, s->cfg.head_dim};
  if (R && !(s->ck_pools = calloc((size_t)s->cfg.num_layers, sizeof *s->ck_pools)))
    return TPR_FAIL(TPR_ERR_OOM, "session: compressed-key pool handles");
  for (int64_t L = 0; R && L < s->cfg.num_layers; L++) {
    if (tpr_model_config_layer_is_linear(&s->cfg, L)) continue;
    TPR_CHECK(tpr_tensor_new(s->be, TPR_F32, 4, cshape, &s->ck_pools[L]));
    TPR_CHECK(tpr_tensor_fill_zero(s->ck_pools[L]));
  }
  return alloc_states(s);
}
