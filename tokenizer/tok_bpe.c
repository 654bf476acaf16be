// The BPE model on one pre-tokenized word: characters (or, after ByteLevel,
// bytes) to initial ids with byte fallback / unk, then merges applied lowest
// rank first, leftmost on ties, with a binary heap over a linked list of
// symbols: the reference's algorithm, step for step (stale heap entries are
// recognised the same way, by the merged id of the pair now at that place).
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

typedef struct merge_item {
  int32_t rank, pos, new_id;
} merge_item;

tpr_status tok_ids_push(tok_ids *v, int32_t id) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 64;
    int32_t *p = realloc(v->p, cap * sizeof *p);
    if (!p) return TPR_FAIL(TPR_ERR_OOM, "tokenizer: %zu ids", cap);
    v->p = p, v->cap = cap;
  }
  v->p[v->n++] = id;
  return TPR_OK;
}

static tpr_status scratch_reserve(tok_bpe_scratch *s, size_t n) {
  if (n <= s->cap) return TPR_OK;
  size_t cap = s->cap ? s->cap : 64;
  while (cap < n) cap *= 2;
  tok_bpe_scratch g = {malloc(cap * sizeof(int32_t)), malloc(cap * sizeof(int32_t)), malloc(cap * sizeof(int32_t)),
                       malloc(cap * sizeof(int32_t)), malloc(2 * cap * sizeof(merge_item)), cap};
  tok_bpe_scratch_free(s);
  *s = g;
  if (!g.id || !g.prev || !g.next || !g.len || !g.heap) {
    tok_bpe_scratch_free(s);
    return TPR_FAIL(TPR_ERR_OOM, "tokenizer: BPE scratch for a word of %zu symbols", n);
  }
  return TPR_OK;
}

void tok_bpe_scratch_free(tok_bpe_scratch *s) {
  free(s->id), free(s->prev), free(s->next), free(s->len), free(s->heap);
  memset(s, 0, sizeof *s);
}

static inline bool item_less(const merge_item *a, const merge_item *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(merge_item *h, size_t *n, merge_item it) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!item_less(&it, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = it;
}

static merge_item heap_pop(merge_item *h, size_t *n) {
  merge_item top = h[0], last = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && item_less(&h[c + 1], &h[c])) c++;
    if (!item_less(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = last;
  return top;
}

tpr_status tok_bpe_word(const tpr_tokenizer *t, tok_bpe_scratch *s, const char *w, size_t n, tok_ids *out) {
  if (n == 0) return TPR_OK;
  if (t->ignore_merges && !t->byte_level) {
    int32_t id = tok_map_get(&t->vocab, w, n);
    if (id >= 0) return tok_ids_push(out, id);
  }
  TPR_CHECK(scratch_reserve(s, n + 1));  // at most one symbol per byte
  int32_t *id = s->id, *len = s->len;
  size_t ns = 0;
  if (t->bpe_prefix || t->bpe_suffix) {
    // Each character (byte-level: each byte's character) is looked up with
    // the continuing-subword prefix unless first, the end-of-word suffix if last.
    tok_buf b = {0};
    tpr_status rc = TPR_OK;
    for (size_t i = 0; i < n && rc == TPR_OK;) {
      int32_t cp;
      int cl = t->byte_level ? 1 : tok_utf8_next(w + i, n - i, &cp);
      char c[4];
      b.n = 0;
      if (i > 0 && t->bpe_prefix) rc = tok_buf_put(&b, t->bpe_prefix, strlen(t->bpe_prefix));
      if (rc == TPR_OK && t->byte_level)
        rc = tok_buf_put(&b, c, (size_t)tok_utf8_put(tok_byte_char((unsigned char)w[i]), c));
      else if (rc == TPR_OK) rc = tok_buf_put(&b, w + i, (size_t)cl);
      if (rc == TPR_OK && i + (size_t)cl == n && t->bpe_suffix)
        rc = tok_buf_put(&b, t->bpe_suffix, strlen(t->bpe_suffix));
      int32_t v = rc == TPR_OK ? tok_map_get(&t->vocab, b.p, b.n) : -1;
      bool all = v < 0 && t->byte_fallback;
      for (int k = 0; all && k < cl; k++) all = t->byte_ids[(unsigned char)w[i + k]] >= 0;
      if (v >= 0) id[ns] = v, len[ns] = cl, ns++;
      else if (all)
        for (int k = 0; k < cl; k++) id[ns] = t->byte_ids[(unsigned char)w[i + k]], len[ns] = 1, ns++;
      else if (t->unk_id >= 0) {
        if (t->fuse_unk && ns > 0 && id[ns - 1] == t->unk_id) len[ns - 1] += cl;
        else id[ns] = t->unk_id, len[ns] = cl, ns++;
      }
      i += (size_t)cl;
    }
    free(b.p);
    TPR_CHECK(rc);
  } else if (t->byte_level) {
    if (t->ignore_merges) {  // the whole word, in its byte-level spelling
      tok_buf b = {0};
      char c[4];
      tpr_status rc = TPR_OK;
      for (size_t i = 0; i < n && rc == TPR_OK; i++)
        rc = tok_buf_put(&b, c, (size_t)tok_utf8_put(tok_byte_char((unsigned char)w[i]), c));
      int32_t whole = rc == TPR_OK ? tok_map_get(&t->vocab, b.p, b.n) : -1;
      free(b.p);
      TPR_CHECK(rc);
      if (whole >= 0) return tok_ids_push(out, whole);
    }
    for (size_t i = 0; i < n; i++) {
      int32_t v = t->bl_ids[(unsigned char)w[i]];
      if (v < 0) v = t->unk_id;  // a byte-level vocab lacking a byte: unk, or dropped without one
      if (v < 0) continue;
      if (v == t->unk_id && t->fuse_unk && ns > 0 && id[ns - 1] == t->unk_id) continue;
      id[ns] = v, len[ns] = 1, ns++;
    }
  } else {
    for (size_t i = 0; i < n;) {
      int32_t cp;
      int cl = tok_utf8_next(w + i, n - i, &cp);
      int32_t v = tok_map_get(&t->vocab, w + i, (size_t)cl);
      if (v >= 0) {
        id[ns] = v, len[ns] = cl, ns++;
      } else {
        bool all = t->byte_fallback;
        for (int k = 0; all && k < cl; k++) all = t->byte_ids[(unsigned char)w[i + k]] >= 0;
        if (all) {
          for (int k = 0; k < cl; k++) id[ns] = t->byte_ids[(unsigned char)w[i + k]], len[ns] = 1, ns++;
        } else if (t->unk_id >= 0) {
          if (t->fuse_unk && ns > 0 && id[ns - 1] == t->unk_id) len[ns - 1] += cl;
          else id[ns] = t->unk_id, len[ns] = cl, ns++;
        }
      }
      i += (size_t)cl;
    }
  }
  int32_t *prev = s->prev, *next = s->next;
  merge_item *heap = s->heap;
  size_t hn = 0;
  for (size_t i = 0; i < ns; i++) {
    prev[i] = (int32_t)i - 1;
    next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < ns; i++) {
    int32_t r, m;
    if (tok_merges_get(&t->merges, id[i], id[i + 1], &r, &m)) heap_push(heap, &hn, (merge_item){r, (int32_t)i, m});
  }
  // The heap never holds more than 2 entries per symbol: one pushed per pair
  // at the start, at most two per merge, and each merge removes a symbol.
  while (hn > 0) {
    merge_item top = heap_pop(heap, &hn);
    int32_t p = top.pos;
    if (len[p] == 0 || next[p] < 0) continue;
    int32_t q = next[p], r, m;
    if (!tok_merges_get(&t->merges, id[p], id[q], &r, &m) || m != top.new_id) continue;  // stale
    id[p] = top.new_id;
    len[p] += len[q];
    len[q] = 0;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    if (prev[p] >= 0 && tok_merges_get(&t->merges, id[prev[p]], id[p], &r, &m))
      heap_push(heap, &hn, (merge_item){r, prev[p], m});
    if (next[p] >= 0 && tok_merges_get(&t->merges, id[p], id[next[p]], &r, &m))
      heap_push(heap, &hn, (merge_item){r, p, m});
  }
  for (int32_t i = ns ? 0 : -1; i >= 0; i = next[i]) TPR_CHECK(tok_ids_push(out, id[i]));
  return TPR_OK;
}
