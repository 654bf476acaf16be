// The paged KV pool: NB blocks of bs token rows per layer, K and V, sized
// from the options and the memory the ranks have.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/session_impl.h"
#include "runtime/host_mem.h"

tpr_session_pool tpr_session_pool_info(const tpr_session *s) { return s->pool; }

// Layers with a KV cache: all but the lightning (linear attention) ones; at
// least one, so that the pool's sizing stays defined for an all-linear model.
static int64_t kv_layers(const tpr_session *s) {
  int64_t n = s->cfg.num_layers - s->cfg.num_linear_layers;
  return n > 0 ? n : 1;
}

// Bytes of one KV block over every layer that has a KV cache, K and V, on this rank.
static uint64_t block_bytes(const tpr_session *s) {
  return 2u * (uint64_t)kv_layers(s) * (uint64_t)s->pool.block_size * (uint64_t)s->plan.attn.kv_per_rank *
         (uint64_t)s->cfg.head_dim * sizeof(float);
}

// Sizes the pool (the smallest block count any rank affords: collective) and
// allocates it, zero-filled so that no row ever holds garbage.
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
  return TPR_OK;
}
