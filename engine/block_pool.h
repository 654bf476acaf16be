// One dp replica's pool of KV blocks: a free list of block ids with
// deterministic LIFO reuse (the block freed last is handed out first, so the
// same request stream always gets the same block ids). Blocks are reference
// counted so that sequences can hold the same blocks together
// (tpr_block_pool_share, tpr_block_pool_hit): a block is free again when its
// last holder gives it back. The count also catches double frees and
// foreign ids, which would otherwise let two sequences write the same KV rows.
//
// Prefix cache (vLLM's automatic prefix caching; on after
// tpr_block_pool_cache_init): a full block whose KV rows are written can be
// registered under its key, (the hash of every token before it, its own
// block_size token ids). A registered block freed by its last holder keeps
// its rows and its key: it is "cached free", counted as free, and a later
// sequence whose prompt has the same prefix takes it back
// (tpr_block_pool_lookup, tpr_block_pool_hit) instead of recomputing it.
// Taking a block for new rows uses plain free blocks first (LIFO, as
// without a cache), then evicts the least recently freed cached block (its
// key is dropped). A lookup matches the key exactly: the parent hash and
// every token id, so two prefixes are confused only if their 64-bit chain
// hashes collide.
#ifndef TPR_ENGINE_BLOCK_POOL_H
#define TPR_ENGINE_BLOCK_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr_block_pool {
  int32_t *free_ids;  // (n_blocks) stack of plain free blocks; the top is free_ids[n_free - 1]
  int32_t *refs;      // (n_blocks) holders of each block; 0: free
  int64_t n_free, n_blocks;
  // Prefix cache (block_size 0: off, every array NULL).
  int64_t block_size;
  uint64_t *hash, *parent;  // (n_blocks) a registered block's key hash and its parent's
  int32_t *key;             // (n_blocks, block_size) a registered block's token ids
  bool *registered;         // (n_blocks)
  int32_t *bucket;          // (n_buckets) first registered block of each hash chain; -1: none
  int32_t *chain;           // (n_blocks) next registered block of the same bucket; -1: none
  int64_t n_buckets, n_registered;
  int32_t *lru_prev, *lru_next;  // (n_blocks) cached free blocks, least recently freed first; -1: none
  int32_t lru_head, lru_tail;
  int64_t n_lru;
  // Test only (a negative control): keys hold a block's first token id
  // alone, so blocks that begin alike match whatever follows.
  bool debug_first_token_only;
} tpr_block_pool;

// n_blocks in [1, INT32_MAX]: ids are int32 in block tables. Fresh pools
// hand out 0, 1, 2, ... in order.
tpr_status tpr_block_pool_init(tpr_block_pool *p, int64_t n_blocks);
// Turns the prefix cache on for keys of block_size tokens (>= 1), before
// any block is taken.
tpr_status tpr_block_pool_cache_init(tpr_block_pool *p, int64_t block_size);
void tpr_block_pool_destroy(tpr_block_pool *p);

// Blocks a take can hand out: plain free ones and cached free ones.
static inline int64_t tpr_block_pool_free(const tpr_block_pool *p) { return p->n_free + p->n_lru; }
// Blocks held by at least one holder (a shared block counts once).
static inline int64_t tpr_block_pool_used(const tpr_block_pool *p) { return p->n_blocks - tpr_block_pool_free(p); }
// Registered blocks (held or cached free).
static inline int64_t tpr_block_pool_cached(const tpr_block_pool *p) { return p->n_registered; }
// Holders of block id (0: free; -1: not a block of this pool).
static inline int32_t tpr_block_pool_refs(const tpr_block_pool *p, int32_t id) {
  return id >= 0 && id < p->n_blocks ? p->refs[id] : -1;
}

// Takes one free block, its only holder (TPR_ERR_INTERNAL when none is free:
// callers check first). A cached free block taken this way is evicted.
tpr_status tpr_block_pool_take(tpr_block_pool *p, int32_t *id);
// One more holder of a block in use (TPR_ERR_INTERNAL for an id out of
// range or free: sharing a free block would hand it out twice).
tpr_status tpr_block_pool_share(tpr_block_pool *p, int32_t id);
// One holder lets go; the last one frees the block: a registered block
// becomes cached free (newest in the LRU order), any other one plain free
// (TPR_ERR_INTERNAL for an id out of range or not in use).
tpr_status tpr_block_pool_give(tpr_block_pool *p, int32_t id);

// The chain hash of a block: parent (0 for a sequence's first block) and its
// block_size token ids.
uint64_t tpr_block_pool_hash(const tpr_block_pool *p, uint64_t parent, const int32_t *tokens);
// The registered block of key (parent, tokens) with hash h
// (= tpr_block_pool_hash(p, parent, tokens)); -1: none (or no cache).
int32_t tpr_block_pool_lookup(const tpr_block_pool *p, uint64_t h, uint64_t parent, const int32_t *tokens);
// One more holder of a registered block found by lookup, held or cached
// free (the latter leaves the LRU order).
tpr_status tpr_block_pool_hit(tpr_block_pool *p, int32_t id);
// Registers block id (in use, its block_size rows written with these
// tokens) under key (parent, tokens) with hash h. Nothing happens when the
// cache is off, the block is registered already, or another block holds
// the key (the first keeps it). TPR_ERR_INTERNAL for a block not in use.
tpr_status tpr_block_pool_register(tpr_block_pool *p, int32_t id, uint64_t h, uint64_t parent, const int32_t *tokens);

#endif
