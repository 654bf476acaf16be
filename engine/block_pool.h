// One dp replica's pool of KV blocks: a free list of block ids with
// deterministic LIFO reuse (the block freed last is handed out first, so the
// same request stream always gets the same block ids). A per-block "in use"
// flag catches double frees and foreign ids, which would otherwise let two
// sequences write the same KV rows.
#ifndef TPR_ENGINE_BLOCK_POOL_H
#define TPR_ENGINE_BLOCK_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr_block_pool {
  int32_t *free_ids;  // (n_blocks) stack; the top is free_ids[n_free - 1]
  bool *in_use;       // (n_blocks)
  int64_t n_free, n_blocks;
} tpr_block_pool;

// n_blocks in [1, INT32_MAX]: ids are int32 in block tables. Fresh pools
// hand out 0, 1, 2, ... in order.
tpr_status tpr_block_pool_init(tpr_block_pool *p, int64_t n_blocks);
void tpr_block_pool_destroy(tpr_block_pool *p);

static inline int64_t tpr_block_pool_free(const tpr_block_pool *p) { return p->n_free; }
static inline int64_t tpr_block_pool_used(const tpr_block_pool *p) { return p->n_blocks - p->n_free; }

// Takes one block (TPR_ERR_INTERNAL when empty: callers check first).
tpr_status tpr_block_pool_take(tpr_block_pool *p, int32_t *id);
// Returns a block (TPR_ERR_INTERNAL for an id out of range or not in use).
tpr_status tpr_block_pool_give(tpr_block_pool *p, int32_t id);

#endif
