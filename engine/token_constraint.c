// token_constraint.h: a mask is a depth-first walk of a byte trie of the
// vocabulary (built once per tpr_vocab_bytes) from the automaton's state:
// each trie edge's byte is fed once for all the tokens that share the
// prefix it ends, a subtree is skipped as soon as its byte is refused, and
// the state is copied only where the walk branches (a node with siblings
// after it); down a last child the parent's copy is fed in place. The mask
// is the one that feeding every token's bytes to its own copy of the state
// gives (test_json_grammar keeps that as its reference and compares), since
// the automaton's next state is a function of its state and the byte. The
// last few masks are kept by the state's key (json_grammar.h): a state
// that recurs as far as what may follow goes (inside a long string, most
// steps) copies its mask instead of walking.
#define _GNU_SOURCE
#include "engine/token_constraint.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct tpr_vocab_bytes {
  int64_t n;
  int64_t *off;  // (n + 1) offsets into bytes; an id without bytes has off[id] == off[id + 1]
  char *bytes;
  // The trie of the ids with bytes, its nodes in preorder (node 0 the root,
  // the empty prefix; children in byte order). Node i (i >= 1) is the prefix
  // its parent's plus edge[i]; its subtree is [i, skip[i]); the ids whose
  // bytes are exactly that prefix are ids[first[i], first[i + 1]).
  int32_t n_nodes;
  unsigned char *edge;  // [n_nodes]
  int32_t *skip;        // [n_nodes]
  int32_t *first;       // [n_nodes + 1]
  int32_t *ids;         // [ids with bytes], sorted by bytes
  int32_t max_len;      // the longest token's bytes: the walk's stack depth
};

// ---- the trie ------------------------------------------------------------------------------

static int cmp_ids(const void *a, const void *b, void *ctx) {
  const tpr_vocab_bytes *v = ctx;
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  const int64_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
  const int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], (size_t)(lx < ly ? lx : ly));
  if (c) return c;
  if (lx != ly) return lx < ly ? -1 : 1;  // a prefix first: preorder
  return x < y ? -1 : x > y;
}

// From the ids sorted by bytes, each one's new nodes are its prefixes
// longer than what it shares with the previous id: created in that order
// they are the trie in preorder, and an id ends on the last node created.
static bool build_trie(tpr_vocab_bytes *v) {
  int64_t m = 0, total = 0;
  for (int64_t id = 0; id < v->n; id++) {
    const int64_t len = v->off[id + 1] - v->off[id];
    if (len) m++, total += len;
    if (len > INT32_MAX / 2) return false;
    if (len > v->max_len) v->max_len = (int32_t)len;
  }
  if (total + 1 > INT32_MAX || v->n > INT32_MAX) return false;
  v->ids = malloc((size_t)(m ? m : 1) * sizeof *v->ids);
  int32_t *depth = malloc((size_t)(total + 1) * sizeof *depth), *open = malloc((size_t)(v->max_len + 1) * sizeof *open);
  int32_t *end = malloc((size_t)(m ? m : 1) * sizeof *end);  // the node each sorted id ends on
  v->edge = malloc((size_t)total + 1), v->skip = malloc((size_t)(total + 1) * sizeof *v->skip);
  bool ok = v->ids && depth && open && end && v->edge && v->skip;
  if (ok) {
    m = 0;
    for (int64_t id = 0; id < v->n; id++)
      if (v->off[id + 1] > v->off[id]) v->ids[m++] = (int32_t)id;
    qsort_r(v->ids, (size_t)m, sizeof *v->ids, cmp_ids, v);
    int32_t n = 1;
    v->edge[0] = 0, depth[0] = 0;
    const char *prev = NULL;
    int64_t prev_len = 0;
    for (int64_t k = 0; k < m; k++) {
      const char *b = v->bytes + v->off[v->ids[k]];
      const int64_t len = v->off[v->ids[k] + 1] - v->off[v->ids[k]];
      int64_t l = 0;
      while (prev && l < len && l < prev_len && prev[l] == b[l]) l++;
      for (int64_t j = l; j < len; j++) v->edge[n] = (unsigned char)b[j], depth[n] = (int32_t)(j + 1), n++;
      end[k] = n - 1;
      prev = b, prev_len = len;
    }
    v->n_nodes = n;
    // skip[i]: the next node no deeper than i (a stack of the open nodes).
    int32_t top = 0;
    for (int32_t i = 0; i < n; i++) {
      while (top > 0 && depth[open[top - 1]] >= depth[i]) v->skip[open[--top]] = i;
      open[top++] = i;
    }
    while (top > 0) v->skip[open[--top]] = n;
    ok = (v->first = malloc((size_t)(n + 1) * sizeof *v->first)) != NULL;
    for (int32_t i = 0, k = 0; ok && i <= n; i++) {  // end[] does not decrease
      while (k < m && end[k] < i) k++;
      v->first[i] = k;
    }
  }
  free(depth), free(open), free(end);
  return ok;
}

// ---- the vocabulary ------------------------------------------------------------------------

static tpr_status vocab_new(int64_t vocab, tpr_vocab_bytes **out) {
  tpr_vocab_bytes *v = calloc(1, sizeof *v);
  if (v) v->off = calloc((size_t)vocab + 1, sizeof *v->off), v->bytes = malloc(1 << 16);
  if (!v || !v->off || !v->bytes) {
    tpr_vocab_bytes_free(v);
    return TPR_FAIL(TPR_ERR_OOM, "structured output: the vocabulary's bytes");
  }
  v->n = vocab;
  *out = v;
  return TPR_OK;
}

// Appends id's bytes (ids in order); false when out of memory.
static bool vocab_put(tpr_vocab_bytes *v, int64_t id, const char *text, size_t n, size_t *cap) {
  const size_t len = (size_t)v->off[id];
  if (len + n > *cap) {
    while (len + n > *cap) *cap *= 2;
    char *b = realloc(v->bytes, *cap);
    if (!b) return false;
    v->bytes = b;
  }
  if (n) memcpy(v->bytes + len, text, n);
  v->off[id + 1] = (int64_t)(len + n);
  return true;
}

static tpr_status vocab_finish(tpr_vocab_bytes *v, tpr_vocab_bytes **out) {
  if (!build_trie(v)) {
    tpr_vocab_bytes_free(v);
    *out = NULL;
    return TPR_FAIL(TPR_ERR_OOM, "structured output: the vocabulary's trie");
  }
  *out = v;
  return TPR_OK;
}

tpr_status tpr_vocab_bytes_new(const tpr_tokenizer *tok, int64_t vocab, tpr_vocab_bytes **out) {
  tpr_vocab_bytes *v = NULL;
  tpr_status rc = vocab_new(vocab, &v);
  if (rc != TPR_OK) return rc;
  size_t cap = 1 << 16;
  for (int64_t id = 0; id < vocab; id++) {
    v->off[id + 1] = v->off[id];
    if (id >= tpr_tokenizer_vocab_size(tok) || tpr_tokenizer_is_special(tok, (int32_t)id)) continue;
    int32_t one = (int32_t)id;
    char *text = NULL;
    size_t n = 0;
    if (tpr_tokenizer_decode_known(tok, &one, 1, false, &text, &n) != TPR_OK) {
      tpr_clear_error();
      continue;
    }
    const bool ok = vocab_put(v, id, text, n, &cap);
    free(text);
    if (!ok) {
      tpr_vocab_bytes_free(v);
      return TPR_FAIL(TPR_ERR_OOM, "structured output: the vocabulary's bytes");
    }
  }
  return vocab_finish(v, out);
}

tpr_status tpr_vocab_bytes_from(int64_t vocab, const char *const *bytes, const size_t *lens, tpr_vocab_bytes **out) {
  tpr_vocab_bytes *v = NULL;
  tpr_status rc = vocab_new(vocab, &v);
  if (rc != TPR_OK) return rc;
  size_t cap = 1 << 16;
  for (int64_t id = 0; id < vocab; id++)
    if (!vocab_put(v, id, bytes[id], bytes[id] ? lens[id] : 0, &cap)) {
      tpr_vocab_bytes_free(v);
      return TPR_FAIL(TPR_ERR_OOM, "structured output: the vocabulary's bytes");
    }
  return vocab_finish(v, out);
}

void tpr_vocab_bytes_free(tpr_vocab_bytes *v) {
  if (!v) return;
  free(v->off), free(v->bytes), free(v->edge), free(v->skip), free(v->first), free(v->ids), free(v);
}

int64_t tpr_vocab_bytes_size(const tpr_vocab_bytes *v) { return v->n; }

const char *tpr_vocab_bytes_token(const tpr_vocab_bytes *v, int64_t id, size_t *len) {
  *len = (size_t)(v->off[id + 1] - v->off[id]);
  return v->bytes + v->off[id];
}

int64_t tpr_vocab_bytes_trie_nodes(const tpr_vocab_bytes *v) { return v->n_nodes; }

// ---- masks ---------------------------------------------------------------------------------

void tpr_token_constraint_init(tpr_token_constraint *c, const tpr_json_grammar *g, const tpr_vocab_bytes *v,
                               int32_t stop_token) {
  memset(c, 0, sizeof *c);
  c->grammar = g, c->vocab = v, c->stop_token = stop_token;
  tpr_json_state_init(&c->state, g);
  c->last_fed = -1;
}

static void feed_token(tpr_token_constraint *c, int32_t id) {
  const tpr_vocab_bytes *v = c->vocab;
  if (id < 0 || id >= v->n) {
    c->state.dead = true;
    return;
  }
  tpr_json_state_feed(&c->state, v->bytes + v->off[id], (size_t)(v->off[id + 1] - v->off[id]));
}

// Copies the part of a state in use: its frames up to depth and the one
// above, the frame popped last, which an object reads on the byte after a
// literal value ended (which name a forced call chose, json_grammar.c's
// O_AFTER); without it the copy would read a stale frame there.
static void copy_state(tpr_json_state *dst, const tpr_json_state *src) {
  const int32_t n = src->depth < TPR_JSON_MAX_DEPTH ? src->depth + 1 : src->depth;
  memcpy(dst, src, offsetof(tpr_json_state, f) + (size_t)n * sizeof src->f[0]);
}

void tpr_token_constraint_advance(tpr_token_constraint *c, const int32_t *gen, int64_t n) {
  // Go on from the cached state when it saw a prefix of gen, else replay.
  if (c->n_fed > n || (c->n_fed > 0 && gen[c->n_fed - 1] != c->last_fed)) {
    tpr_json_state_init(&c->state, c->grammar);
    c->n_fed = 0;
  }
  for (; c->n_fed < n; c->n_fed++) feed_token(c, gen[c->n_fed]);
  c->last_fed = n > 0 ? gen[n - 1] : -1;
}

// The walk: st[sp] is the state after the prefix of the nearest node on the
// path whose subtree is [.., lim[sp]); a node's parent is on top once the
// entries whose subtrees ended are popped. st and lim hold max_len + 1
// entries (NULL: allocated here). Returns how many ids are allowed, or -1
// when out of memory.
static int64_t walk_trie(const tpr_vocab_bytes *v, const tpr_json_state *from, uint64_t *allow, tpr_json_state *st,
                         int32_t *lim) {
  const bool own = !st;
  if (own) st = malloc((size_t)(v->max_len + 1) * sizeof *st), lim = malloc((size_t)(v->max_len + 1) * sizeof *lim);
  if (!st || !lim) return free(st), free(lim), -1;
  int64_t count = 0;
  int sp = 0;
  copy_state(&st[0], from);
  lim[0] = v->n_nodes;
  for (int32_t i = 1; i < v->n_nodes;) {
    while (i >= lim[sp]) sp--;
    tpr_json_state *s = &st[sp];
    if (v->skip[i] != lim[sp]) {  // siblings follow: branch off a copy
      copy_state(&st[sp + 1], s);
      s = &st[++sp], lim[sp] = v->skip[i];
    }
    const char ch = (char)v->edge[i];
    if (!tpr_json_state_feed(s, &ch, 1)) {
      i = v->skip[i];
      continue;
    }
    for (int32_t k = v->first[i]; k < v->first[i + 1]; k++) allow[v->ids[k] / 64] |= 1ull << (v->ids[k] % 64), count++;
    i++;
  }
  if (own) free(st), free(lim);
  return count;
}

// ---- the cache of masks by state key ------------------------------------------------------

#define CACHE_ENTRIES 4

typedef struct cache_entry {
  uint64_t key[TPR_JSON_KEY_WORDS];
  int n_key;      // 0: empty
  uint64_t used;  // the stamp of its last use (the least recent is replaced)
  int64_t count;  // the walk's count (the stop token's rule not applied)
  uint64_t *mask;
} cache_entry;

struct tpr_mask_cache {
  uint64_t clock;
  cache_entry e[CACHE_ENTRIES];
  tpr_json_state *stack;  // the walk's (max_len + 1 each)
  int32_t *lim;
  uint64_t words[];  // CACHE_ENTRIES masks
};

void tpr_token_constraint_free(tpr_token_constraint *c) {
  if (c->cache) free(c->cache->stack), free(c->cache->lim);
  free(c->cache);
  c->cache = NULL;
}

static struct tpr_mask_cache *cache_of(tpr_token_constraint *c) {
  if (!c->cache) {
    const size_t w = (size_t)tpr_mask_words(c->vocab->n);
    struct tpr_mask_cache *m = calloc(1, sizeof *m + CACHE_ENTRIES * w * sizeof m->words[0]);
    if (!m) return NULL;  // no cache: every mask walks
    for (int i = 0; i < CACHE_ENTRIES; i++) m->e[i].mask = m->words + (size_t)i * w;
    m->stack = malloc((size_t)(c->vocab->max_len + 1) * sizeof *m->stack);
    m->lim = malloc((size_t)(c->vocab->max_len + 1) * sizeof *m->lim);
    if (!m->stack || !m->lim) free(m->stack), free(m->lim), m->stack = NULL, m->lim = NULL;  // the walk allocates its own
    c->cache = m;
  }
  return c->cache;
}

// The allowed ids of the state (the stop token's rule aside) into allow,
// from the cache or a walk; how many, or -1 when out of memory.
static int64_t mask_of(tpr_token_constraint *c, uint64_t *allow) {
  const tpr_vocab_bytes *v = c->vocab;
  const size_t bytes = (size_t)tpr_mask_words(v->n) * sizeof *allow;
  struct tpr_mask_cache *m = cache_of(c);
  uint64_t key[TPR_JSON_KEY_WORDS];
  const int n_key = tpr_json_state_key(&c->state, key);
  cache_entry *lru = NULL;
  for (int i = 0; m && i < CACHE_ENTRIES; i++) {
    cache_entry *e = &m->e[i];
    if (e->n_key == n_key && !memcmp(e->key, key, (size_t)n_key * sizeof key[0])) {
      e->used = ++m->clock;
      memcpy(allow, e->mask, bytes);
      return e->count;
    }
    if (!lru || e->used < lru->used) lru = e;
  }
  memset(allow, 0, bytes);
  const int64_t count = walk_trie(v, &c->state, allow, m ? m->stack : NULL, m ? m->lim : NULL);
  if (lru && count >= 0) {
    memcpy(lru->key, key, (size_t)n_key * sizeof key[0]);
    lru->n_key = n_key, lru->used = ++m->clock, lru->count = count;
    memcpy(lru->mask, allow, bytes);
  }
  return count;
}

int64_t tpr_token_constraint_mask(tpr_token_constraint *c, const int32_t *gen, int64_t n, uint64_t *allow) {
  const tpr_vocab_bytes *v = c->vocab;
  tpr_token_constraint_advance(c, gen, n);
  memset(allow, 0, (size_t)tpr_mask_words(v->n) * sizeof *allow);
  int64_t count = 0;
  if (!c->state.dead && (count = mask_of(c, allow)) < 0) {
    // No memory for the walk's stack: each id against its own copy of the state (the same mask, slower).
    tpr_json_state t;
    count = 0;
    memset(allow, 0, (size_t)tpr_mask_words(v->n) * sizeof *allow);
    for (int64_t id = 0; id < v->n; id++) {
      const int64_t o = v->off[id], len = v->off[id + 1] - o;
      if (!len) continue;
      copy_state(&t, &c->state);
      if (tpr_json_state_feed(&t, v->bytes + o, (size_t)len)) allow[id / 64] |= 1ull << (id % 64), count++;
    }
  }
  const int32_t s = c->stop_token;
  if (s >= 0 && s < v->n && (count == 0 || tpr_json_state_complete(&c->state)) && !(allow[s / 64] >> (s % 64) & 1))
    allow[s / 64] |= 1ull << (s % 64), count++;
  return count;
}
