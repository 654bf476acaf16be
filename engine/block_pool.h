// One dp replica's pool of KV blocks: a free list of block ids with
// deterministic LIFO reuse (the block freed last is handed out first, so the
// same request stream always gets the same block ids). Blocks are reference
// counted so that sequences of one prompt can hold the prompt's blocks
// together (tpr_block_pool_share): a block returns to the free list when its
// last holder gives it back. The count also catches double frees and
// foreign ids, which would otherwise let two sequences write the same KV rows.
#ifndef TPR_ENGINE_BLOCK_POOL_H
#define TPR_ENGINE_BLOCK_POOL_H

#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr_block_pool {
  int32_t *free_ids;  // (n_blocks) stack; the top is free_ids[n_free - 1]
  int32_t *refs;      // (n_blocks) holders of each block; 0: free
  int64_t n_free, n_blocks;
} tpr_block_pool;

// n_blocks in [1, INT32_MAX]: ids are int32 in block tables. Fresh pools
// hand out 0, 1, 2, ... in order.
tpr_status tpr_block_pool_init(tpr_block_pool *p, int64_t n_blocks);
void tpr_block_pool_destroy(tpr_block_pool *p);

static inline int64_t tpr_block_pool_free(const tpr_block_pool *p) { return p->n_free; }
// Blocks held by at least one holder (a shared block counts once).
static inline int64_t tpr_block_pool_used(const tpr_block_pool *p) { return p->n_blocks - p->n_free; }
// Holders of block id (0: free; -1: not a block of this pool).
static inline int32_t tpr_block_pool_refs(const tpr_block_pool *p, int32_t id) {
  return id >= 0 && id < p->n_blocks ? p->refs[id] : -1;
}

// Takes one free block, its only holder (TPR_ERR_INTERNAL when empty:
// callers check first).
tpr_status tpr_block_pool_take(tpr_block_pool *p, int32_t *id);
// One more holder of a block in use (TPR_ERR_INTERNAL for an id out of
// range or free: sharing a free block would hand it out twice).
tpr_status tpr_block_pool_share(tpr_block_pool *p, int32_t id);
// One holder lets go; the last one returns the block to the free list
// (TPR_ERR_INTERNAL for an id out of range or not in use).
tpr_status tpr_block_pool_give(tpr_block_pool *p, int32_t id);

#endif
