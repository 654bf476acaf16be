// Shared tokenizer helpers: growable buffers, the string -> id and merge-pair
// hash maps, UTF-8 handling and GPT-2's byte <-> character table.
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_impl.h"

tpr_status tok_buf_put(tok_buf *b, const void *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return TPR_FAIL(TPR_ERR_OOM, "tokenizer: buffer of %zu bytes", cap);
    b->p = p;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return TPR_OK;
}

// FNV-1a: deterministic, good enough for token strings.
static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static tpr_status map_grow(tok_map *m) {
  size_t cap = m->cap ? m->cap * 2 : 1024;
  tok_map g = {calloc(cap, sizeof(char *)), calloc(cap, sizeof(uint32_t)), calloc(cap, sizeof(int32_t)), cap, 0};
  if (!g.keys || !g.lens || !g.vals) {
    free(g.keys), free(g.lens), free(g.vals);
    return TPR_FAIL(TPR_ERR_OOM, "tokenizer: vocab map of %zu slots", cap);
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = hash_bytes(m->keys[i], m->lens[i]) & (cap - 1);
    while (g.keys[j]) j = (j + 1) & (cap - 1);
    g.keys[j] = m->keys[i], g.lens[j] = m->lens[i], g.vals[j] = m->vals[i];
    g.n++;
  }
  free(m->keys), free(m->lens), free(m->vals);
  *m = g;
  return TPR_OK;
}

tpr_status tok_map_put(tok_map *m, const char *key, size_t len, int32_t val) {
  if ((m->n + 1) * 2 > m->cap) TPR_CHECK(map_grow(m));
  size_t j = hash_bytes(key, len) & (m->cap - 1);
  while (m->keys[j]) {
    if (m->lens[j] == len && memcmp(m->keys[j], key, len) == 0) {
      m->vals[j] = val;
      return TPR_OK;
    }
    j = (j + 1) & (m->cap - 1);
  }
  char *k = malloc(len + 1);
  if (!k) return TPR_FAIL(TPR_ERR_OOM, "tokenizer: token of %zu bytes", len);
  memcpy(k, key, len);
  k[len] = 0;
  m->keys[j] = k, m->lens[j] = (uint32_t)len, m->vals[j] = val;
  m->n++;
  return TPR_OK;
}

int32_t tok_map_get(const tok_map *m, const char *key, size_t len) {
  if (!m->cap) return -1;
  size_t j = hash_bytes(key, len) & (m->cap - 1);
  while (m->keys[j]) {
    if (m->lens[j] == len && memcmp(m->keys[j], key, len) == 0) return m->vals[j];
    j = (j + 1) & (m->cap - 1);
  }
  return -1;
}

void tok_map_free(tok_map *m) {
  for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
  free(m->keys), free(m->lens), free(m->vals);
  memset(m, 0, sizeof *m);
}

static uint64_t hash_u64(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

tpr_status tok_merges_put(tok_merges *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
  if ((m->n + 1) * 2 > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    tok_merges g = {malloc(cap * sizeof(uint64_t)), malloc(cap * sizeof(int32_t)), malloc(cap * sizeof(int32_t)),
                    cap, 0};
    if (!g.keys || !g.rank || !g.merged) {
      free(g.keys), free(g.rank), free(g.merged);
      return TPR_FAIL(TPR_ERR_OOM, "tokenizer: merge map of %zu slots", cap);
    }
    memset(g.keys, 0xff, cap * sizeof(uint64_t));
    for (size_t i = 0; i < m->cap; i++) {
      if (m->keys[i] == UINT64_MAX) continue;
      size_t j = hash_u64(m->keys[i]) & (cap - 1);
      while (g.keys[j] != UINT64_MAX) j = (j + 1) & (cap - 1);
      g.keys[j] = m->keys[i], g.rank[j] = m->rank[i], g.merged[j] = m->merged[i];
      g.n++;
    }
    tok_merges_free(m);
    *m = g;
  }
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  size_t j = hash_u64(key) & (m->cap - 1);
  while (m->keys[j] != UINT64_MAX) {
    if (m->keys[j] == key) return TPR_OK;  // the first (lowest-rank) occurrence wins, as in the reference
    j = (j + 1) & (m->cap - 1);
  }
  m->keys[j] = key, m->rank[j] = rank, m->merged[j] = merged;
  m->n++;
  return TPR_OK;
}

bool tok_merges_get(const tok_merges *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
  if (!m->cap) return false;
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  size_t j = hash_u64(key) & (m->cap - 1);
  while (m->keys[j] != UINT64_MAX) {
    if (m->keys[j] == key) {
      *rank = m->rank[j], *merged = m->merged[j];
      return true;
    }
    j = (j + 1) & (m->cap - 1);
  }
  return false;
}

void tok_merges_free(tok_merges *m) {
  free(m->keys), free(m->rank), free(m->merged);
  memset(m, 0, sizeof *m);
}

// Length of the valid UTF-8 sequence at s (1..4), 0 if s does not start one.
// A multi-byte lead byte c: the sequence length and the range its second
// byte must lie in (no overlongs, no surrogates, nothing past U+10FFFF);
// false when c leads no sequence.
static bool lead_byte(unsigned c, size_t *len, unsigned *lo, unsigned *hi) {
  *lo = 0x80, *hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) *len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    *len = 3;
    if (c == 0xE0) *lo = 0xA0;
    if (c == 0xED) *hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    *len = 4;
    if (c == 0xF0) *lo = 0x90;
    if (c == 0xF4) *hi = 0x8F;
  } else return false;
  return true;
}

static size_t utf8_seq(const unsigned char *s, size_t n) {
  if (s[0] < 0x80) return 1;
  size_t len;
  unsigned lo, hi;
  if (!lead_byte(s[0], &len, &lo, &hi)) return 0;
  if (n < 2 || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; i++)
    if (i >= n || (s[i] & 0xC0) != 0x80) return 0;
  return len;
}

size_t tok_utf8_valid_prefix(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    size_t l = utf8_seq(u + i, n - i);
    if (!l) break;
    i += l;
  }
  return i;
}

int tok_utf8_next(const char *s, size_t n, int32_t *cp) {
  const unsigned char *u = (const unsigned char *)s;
  if (u[0] < 0x80 || n < 2) {
    *cp = u[0];
    return 1;
  }
  if (u[0] < 0xE0) {
    *cp = ((u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    return 2;
  }
  if (u[0] < 0xF0 || n < 4) {
    *cp = ((u[0] & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    return 3;
  }
  *cp = ((u[0] & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) | (u[3] & 0x3F);
  return 4;
}

int tok_utf8_put(int32_t cp, char *o) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12)), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (cp >> 18)), o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

// The maximal prefix of an invalid sequence that could still start a valid
// one is replaced by one U+FFFD (Unicode's "substitution of maximal subparts").
static size_t invalid_run(const unsigned char *s, size_t n) {
  size_t len;
  unsigned lo, hi;
  if (!lead_byte(s[0], &len, &lo, &hi)) return 1;
  if (n < 2 || s[1] < lo || s[1] > hi) return 1;
  size_t i = 2;
  while (i < len && i < n && (s[i] & 0xC0) == 0x80) i++;
  return i;
}

tpr_status tok_utf8_lossy(tok_buf *b, const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t start = i;
    while (i < n) {
      size_t l = s[i] < 0x80 ? 1 : utf8_seq(s + i, n - i);
      if (!l) break;
      i += l;
    }
    TPR_CHECK(tok_buf_put(b, s + start, i - start));
    if (i < n) {
      TPR_CHECK(tok_buf_put(b, "\xEF\xBF\xBD", 3));
      i += invalid_run(s + i, n - i);
    }
  }
  return TPR_OK;
}

bool tok_is_whitespace(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Regex \w as the reference's single_word check uses it: letters, marks,
// decimal digits, connector punctuation ('_'), ZWNJ/ZWJ. (No, e.g. '²', is not.)
bool tok_is_word_char(int32_t c) {
  if (c == 0x200C || c == 0x200D) return true;
  utf8proc_category_t k = utf8proc_category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_MN ||
         k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_ND ||
         k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

bool tok_is_numeric(int32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  utf8proc_category_t k = utf8proc_category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

// ASCII punctuation includes symbols such as $ + < = > ^ ` | ~ that Unicode
// files under S*, so both tests are needed.
bool tok_is_punct(int32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                       (c >= 0x7B && c <= 0x7E);
  utf8proc_category_t k = utf8proc_category(c);
  return (k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO) != tok_hf_punct_flip(c);  // the reference's tables
}

// bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other
// 68 bytes to U+0100.. in byte order.
static uint16_t g_b2c[256];
static int16_t g_c2b[0x144];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;  // tokenizers may load on several threads

static void build_once(void) {
  int next = 0x100;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    g_b2c[b] = (uint16_t)(printable ? b : next++);
  }
  for (int c = 0; c < 0x144; c++) g_c2b[c] = -1;
  for (int b = 0; b < 256; b++) g_c2b[g_b2c[b]] = (int16_t)b;
}

static void build_tables(void) { pthread_once(&g_once, build_once); }

int tok_byte_char(int b) {
  build_tables();
  return g_b2c[b];
}

int tok_char_to_byte(int32_t cp) {
  build_tables();
  return cp >= 0 && cp < 0x144 ? g_c2b[cp] : -1;
}

// ---- added-token trie: nodes numbered from 0 (the root), edges in one
// open-addressing table keyed by (node, byte).
static size_t edge_slot(const tok_trie *tr, uint64_t key) {
  size_t j = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (tr->cap - 1);
  while (tr->keys[j] && tr->keys[j] != key) j = (j + 1) & (tr->cap - 1);
  return j;
}

static tpr_status trie_new_node(tok_trie *tr, int32_t *node) {
  if (tr->n_nodes == tr->node_cap) {
    int32_t cap = tr->node_cap ? tr->node_cap * 2 : 64;
    int32_t *p = realloc(tr->term, (size_t)cap * sizeof *p);
    if (!p) return TPR_FAIL(TPR_ERR_OOM, "tokenizer: added-token trie of %d nodes", cap);
    tr->term = p, tr->node_cap = cap;
  }
  tr->term[tr->n_nodes] = -1;
  *node = tr->n_nodes++;
  return TPR_OK;
}

static tpr_status trie_grow(tok_trie *tr) {
  size_t cap = tr->cap ? tr->cap * 2 : 256;
  tok_trie g = *tr;
  g.keys = calloc(cap, sizeof *g.keys), g.child = malloc(cap * sizeof *g.child), g.cap = cap;
  if (!g.keys || !g.child) {
    free(g.keys), free(g.child);
    return TPR_FAIL(TPR_ERR_OOM, "tokenizer: added-token trie of %zu edges", cap);
  }
  for (size_t i = 0; i < tr->cap; i++) {
    if (!tr->keys[i]) continue;
    size_t j = edge_slot(&g, tr->keys[i]);
    g.keys[j] = tr->keys[i], g.child[j] = tr->child[i];
  }
  free(tr->keys), free(tr->child);
  *tr = g;
  return TPR_OK;
}

tpr_status tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t val) {
  int32_t node = 0;
  if (tr->n_nodes == 0) TPR_CHECK(trie_new_node(tr, &node));
  for (size_t i = 0; i < n; i++) {
    if ((tr->n_edges + 1) * 2 > tr->cap) TPR_CHECK(trie_grow(tr));
    uint64_t key = ((uint64_t)node << 8 | (unsigned char)s[i]) + 1;
    size_t j = edge_slot(tr, key);
    if (!tr->keys[j]) {
      int32_t c = 0;
      TPR_CHECK(trie_new_node(tr, &c));
      tr->keys[j] = key, tr->child[j] = c, tr->n_edges++;
    }
    node = tr->child[j];
  }
  if (n) tr->first[(unsigned char)s[0]] = true;
  if (tr->term[node] < 0) tr->term[node] = val;  // the first of equal tokens wins, as in the list
  return TPR_OK;
}

int32_t tok_trie_longest(const tok_trie *tr, const char *s, size_t n, size_t *len) {
  if (n == 0 || !tr->first[(unsigned char)s[0]]) return -1;
  int32_t node = 0, best = -1;
  for (size_t i = 0; i < n; i++) {
    size_t j = edge_slot(tr, ((uint64_t)node << 8 | (unsigned char)s[i]) + 1);
    if (!tr->keys[j]) break;
    node = tr->child[j];
    if (tr->term[node] >= 0) best = tr->term[node], *len = i + 1;
  }
  return best;
}

void tok_trie_free(tok_trie *tr) {
  free(tr->keys), free(tr->child), free(tr->term);
  memset(tr, 0, sizeof *tr);
}
