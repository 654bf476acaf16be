#include "engine/block_pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

tpr_status tpr_block_pool_init(tpr_block_pool *p, int64_t n_blocks) {
  *p = (tpr_block_pool){.lru_head = -1, .lru_tail = -1};
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

tpr_status tpr_block_pool_cache_init(tpr_block_pool *p, int64_t block_size) {
  if (block_size < 1 || block_size > INT32_MAX / 4)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_block_pool_cache_init: block_size %lld not in [1, %d]",
                    (long long)block_size, INT32_MAX / 4);
  if (p->block_size || p->n_free != p->n_blocks)
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_block_pool_cache_init: the pool is in use or has a cache already");
  const size_t n = (size_t)p->n_blocks;
  if ((uint64_t)n > SIZE_MAX / sizeof(int32_t) / (size_t)block_size)
    return TPR_FAIL(TPR_ERR_OOM, "tpr_block_pool_cache_init: %lld keys of %lld tokens are too large",
                    (long long)n, (long long)block_size);
  p->n_buckets = 1;
  while (p->n_buckets < p->n_blocks) p->n_buckets *= 2;  // load <= 1
  p->block_size = block_size;
  p->hash = malloc(n * sizeof *p->hash);
  p->parent = malloc(n * sizeof *p->parent);
  p->key = malloc(n * (size_t)block_size * sizeof *p->key);
  p->registered = calloc(n, sizeof *p->registered);
  p->bucket = malloc((size_t)p->n_buckets * sizeof *p->bucket);
  p->chain = malloc(n * sizeof *p->chain);
  p->lru_prev = malloc(n * sizeof *p->lru_prev);
  p->lru_next = malloc(n * sizeof *p->lru_next);
  if (!p->hash || !p->parent || !p->key || !p->registered || !p->bucket || !p->chain || !p->lru_prev ||
      !p->lru_next) {
    int64_t keep = p->n_blocks;
    tpr_block_pool_destroy(p);
    return TPR_FAIL(TPR_ERR_OOM, "tpr_block_pool_cache_init: no memory for the keys of %lld blocks", (long long)keep);
  }
  for (int64_t b = 0; b < p->n_buckets; b++) p->bucket[b] = -1;
  return TPR_OK;
}

void tpr_block_pool_destroy(tpr_block_pool *p) {
  free(p->free_ids);
  free(p->refs);
  free(p->hash);
  free(p->parent);
  free(p->key);
  free(p->registered);
  free(p->bucket);
  free(p->chain);
  free(p->lru_prev);
  free(p->lru_next);
  *p = (tpr_block_pool){.lru_head = -1, .lru_tail = -1};
}

// ---- the LRU list of cached free blocks

static void lru_remove(tpr_block_pool *p, int32_t id) {
  int32_t a = p->lru_prev[id], b = p->lru_next[id];
  if (a >= 0) p->lru_next[a] = b; else p->lru_head = b;
  if (b >= 0) p->lru_prev[b] = a; else p->lru_tail = a;
  p->n_lru--;
}

static void lru_append(tpr_block_pool *p, int32_t id) {
  p->lru_prev[id] = p->lru_tail, p->lru_next[id] = -1;
  if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = id; else p->lru_head = id;
  p->lru_tail = id;
  p->n_lru++;
}

// ---- the key table

// splitmix64's finalizer: every input bit reaches every output bit.
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t tpr_block_pool_hash(const tpr_block_pool *p, uint64_t parent, const int32_t *tokens) {
  uint64_t h = mix(parent);
  for (int64_t i = 0; i < (p->debug_first_token_only ? 1 : p->block_size); i++) h = mix(h ^ (uint32_t)tokens[i]);
  return h;
}

static bool key_equal(const tpr_block_pool *p, int32_t id, uint64_t h, uint64_t parent, const int32_t *tokens) {
  const size_t n = p->debug_first_token_only ? 1 : (size_t)p->block_size;
  return p->hash[id] == h && p->parent[id] == parent &&
         memcmp(p->key + (size_t)id * (size_t)p->block_size, tokens, n * sizeof *tokens) == 0;
}

int32_t tpr_block_pool_lookup(const tpr_block_pool *p, uint64_t h, uint64_t parent, const int32_t *tokens) {
  if (!p->block_size) return -1;
  for (int32_t id = p->bucket[h & (uint64_t)(p->n_buckets - 1)]; id >= 0; id = p->chain[id])
    if (key_equal(p, id, h, parent, tokens)) return id;
  return -1;
}

static void unregister(tpr_block_pool *p, int32_t id) {
  int32_t *at = &p->bucket[p->hash[id] & (uint64_t)(p->n_buckets - 1)];
  while (*at != id) at = &p->chain[*at];
  *at = p->chain[id];
  p->registered[id] = false;
  p->n_registered--;
}

tpr_status tpr_block_pool_register(tpr_block_pool *p, int32_t id, uint64_t h, uint64_t parent, const int32_t *tokens) {
  if (tpr_block_pool_refs(p, id) < 1)
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_block_pool_register: block %d is not in use in a pool of %lld", id,
                    (long long)p->n_blocks);
  if (!p->block_size || p->registered[id] || tpr_block_pool_lookup(p, h, parent, tokens) >= 0) return TPR_OK;
  p->hash[id] = h, p->parent[id] = parent;
  memcpy(p->key + (size_t)id * (size_t)p->block_size, tokens, (size_t)p->block_size * sizeof *tokens);
  int32_t *head = &p->bucket[h & (uint64_t)(p->n_buckets - 1)];
  p->chain[id] = *head;
  *head = id;
  p->registered[id] = true;
  p->n_registered++;
  return TPR_OK;
}

// ---- holders

tpr_status tpr_block_pool_take(tpr_block_pool *p, int32_t *id) {
  int32_t b;
  if (p->n_free > 0) {
    b = p->free_ids[--p->n_free];
  } else if (p->n_lru > 0) {  // evict the least recently freed cached block
    b = p->lru_head;
    lru_remove(p, b);
    unregister(p, b);
  } else {
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_block_pool_take: no free block of %lld", (long long)p->n_blocks);
  }
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

tpr_status tpr_block_pool_hit(tpr_block_pool *p, int32_t id) {
  if (tpr_block_pool_refs(p, id) < 0 || !p->block_size || !p->registered[id])
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_block_pool_hit: block %d is not a cached block of a pool of %lld", id,
                    (long long)p->n_blocks);
  if (p->refs[id] == 0) {
    lru_remove(p, id);
    p->refs[id] = 1;
    return TPR_OK;
  }
  return tpr_block_pool_share(p, id);
}

tpr_status tpr_block_pool_give(tpr_block_pool *p, int32_t id) {
  if (tpr_block_pool_refs(p, id) < 1)
    return TPR_FAIL(TPR_ERR_INTERNAL, "tpr_block_pool_give: block %d is not in use in a pool of %lld", id,
                    (long long)p->n_blocks);
  if (--p->refs[id] == 0) {
    if (p->block_size && p->registered[id])
      lru_append(p, id);
    else
      p->free_ids[p->n_free++] = id;
  }
  return TPR_OK;
}
