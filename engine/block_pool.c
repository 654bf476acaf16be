#include "engine/block_pool.h"

#include <stdint.h>
#include <stdlib.h>

tpr_status tpr_block_pool_init(tpr_block_pool *p, int64_t n_blocks) {
  *p = (tpr_block_pool){0};
  if (n_blocks < 1 || n_blocks > INT32_MAX)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_block_pool_init: n_blocks %lld not in [1, %d]", (long long)n_blocks,
                    INT32_MAX);
  p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
  p->refs = calloc((size_t)n_blocks, sizeof *p->refs);
  if (!p->free_ids || !p->refs) {
    tpr_block_pool_destroy(p);
    return TPR_FAIL(TPR_ERR_OOM, "tpr_block_pool_init: no memory for %lld blocks", (long long)n_blocks);
  }
  // Pushed high to low so that the first takes return 0, 1, 2, ...
  for (int64_t i = 0; i < n_blocks; i++) p->free_ids[i] = (int32_t)(n_blocks - 1 - i);
  p->n_free = p->n_blocks = n_blocks;
  return TPR_OK;
}

void tpr_block_pool_destroy(tpr_block_pool *p) {
  free(p->free_ids);
  free(p->refs);
  *p = (tpr_block_pool){0};
}

tpr_status tpr_block_pool_take(tpr_block_pool *p, int32_t *id) {
  if (p->n_free == 0) return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_block_pool_take: no free block of %lld", (long long)p->n_blocks);
  int32_t b = p->free_ids[--p->n_free];
  p->refs[b] = 1;
  *id = b;
  return TPR_OK;
}

tpr_status tpr_block_pool_share(tpr_block_pool *p, int32_t id) {
  if (tpr_block_pool_refs(p, id) < 1)
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_block_pool_share: block %d is not in use in a pool of %lld", id,
                    (long long)p->n_blocks);
  if (p->refs[id] == INT32_MAX)
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_block_pool_share: block %d already has %d holders", id, INT32_MAX);
  p->refs[id]++;
  return TPR_OK;
}

tpr_status tpr_block_pool_give(tpr_block_pool *p, int32_t id) {
  if (tpr_block_pool_refs(p, id) < 1)
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_block_pool_give: block %d is not in use in a pool of %lld", id,
                    (long long)p->n_blocks);
  if (--p->refs[id] == 0) p->free_ids[p->n_free++] = id;
  return TPR_OK;
}
