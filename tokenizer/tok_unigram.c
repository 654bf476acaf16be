// The Unigram model (SentencePiece, T5, ALBERT): each word is split into the
// vocab pieces whose scores (log probabilities) sum highest, by Viterbi over
// byte positions. A character no piece starts with becomes an unknown node
// scored below every piece; neighbouring unknowns fuse into one string,
// which is then the unk id, or its bytes' <0xNN> pieces with byte_fallback,
// as in the reference.
#include <cjson/cJSON.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

#define TOK_MAX_IDS (1 << 26)
#define UNK_PENALTY 10.0  // the reference's: an unknown character costs min score - 10

tpr_status tok_parse_unigram(tpr_tokenizer *t, const void *json, int32_t *max_id) {
  const cJSON *m = json, *e;
  t->model = TOK_MODEL_UNIGRAM;
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
  if (!cJSON_IsArray(vocab)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: model Unigram has no vocab array", t->file);
  int n = cJSON_GetArraySize(vocab);
  if (n >= TOK_MAX_IDS) return TPR_FAIL(TPR_ERR_FORMAT, "%s: model Unigram vocab of %d pieces", t->file, n);
  t->uni_score = calloc((size_t)n + 1, sizeof *t->uni_score);
  if (!t->uni_score) return TPR_FAIL(TPR_ERR_OOM, "%s: Unigram scores", t->file);
  t->uni_min = DBL_MAX;
  int32_t id = 0;
  cJSON_ArrayForEach(e, vocab) {  // [piece, score]; the id is the position
    const cJSON *p = cJSON_GetArrayItem(e, 0), *s = cJSON_GetArrayItem(e, 1);
    if (!cJSON_IsString(p) || !cJSON_IsNumber(s))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: Unigram vocab entry %d is not [piece, score]", t->file, id);
    size_t len = strlen(p->valuestring);
    TPR_CHECK(tok_map_put(&t->vocab, p->valuestring, len, id));
    t->uni_score[id] = s->valuedouble;
    if (s->valuedouble < t->uni_min) t->uni_min = s->valuedouble;
    if (len > t->uni_max_len) t->uni_max_len = len;
    id++;
  }
  *max_id = id - 1;
  if (n == 0) t->uni_min = 0;
  const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_id");
  t->unk_id = -1;
  if (cJSON_IsNumber(unk)) {
    if (unk->valuedouble < 0 || unk->valuedouble >= n)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: Unigram unk_id %g is outside the vocab", t->file, unk->valuedouble);
    t->unk_id = unk->valueint;
  }
  t->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "byte_fallback"));
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    t->byte_ids[b] = tok_map_get(&t->vocab, name, 6);
  }
  return TPR_OK;
}

typedef struct node {  // the best path ending at a byte position
  double score;
  int32_t start;  // -1: not reached yet
  int32_t id;
} node;

// The ids of one piece of the best path (the fused unknowns included).
static tpr_status emit(const tpr_tokenizer *t, const char *s, size_t n, tok_ids *out) {
  int32_t id = tok_map_get(&t->vocab, s, n);
  if (id >= 0) return tok_ids_push(out, id);
  bool bytes = t->byte_fallback;
  for (size_t i = 0; bytes && i < n; i++) bytes = t->byte_ids[(unsigned char)s[i]] >= 0;
  if (bytes) {
    for (size_t i = 0; i < n; i++) TPR_CHECK(tok_ids_push(out, t->byte_ids[(unsigned char)s[i]]));
    return TPR_OK;
  }
  if (t->unk_id < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: text '%.*s' has no Unigram piece and the model no unk_id", t->file,
                    (int)n, s);
  return tok_ids_push(out, t->unk_id);
}

tpr_status tok_unigram_word(const tpr_tokenizer *t, tok_buf *scratch, const char *w, size_t n, tok_ids *out) {
  if (n == 0) return TPR_OK;
  if (n >= INT32_MAX / 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: a word of %zu bytes", t->file, n);
  // scratch holds the lattice: n + 1 nodes, then the backtracked piece ends.
  size_t need = (n + 1) * sizeof(node) + (n + 1) * sizeof(int32_t);
  if (scratch->cap < need) {
    char *p = realloc(scratch->p, need);
    if (!p) return TPR_FAIL(TPR_ERR_OOM, "%s: Unigram lattice of %zu bytes", t->file, n);
    scratch->p = p, scratch->cap = need;
  }
  node *best = (node *)scratch->p;
  int32_t *ends = (int32_t *)(best + n + 1);
  for (size_t i = 0; i <= n; i++) best[i] = (node){0, -1, -1};
  double unk_score = t->uni_min - UNK_PENALTY;
  // Every character boundary is reached: a one-character piece or an
  // unknown node covers each character.
  for (size_t st = 0; st < n;) {
    double here = best[st].score;
    int32_t cp;
    size_t mblen = (size_t)tok_utf8_next(w + st, n - st, &cp);
    bool single = false;
    // Every piece starting here, shortest first (the reference's prefix
    // search order): on equal scores the earlier candidate stays.
    size_t lim = n - st < t->uni_max_len ? n - st : t->uni_max_len;
    for (size_t len = 1; len <= lim; len++) {
      if (st + len < n && (w[st + len] & 0xC0) == 0x80) continue;  // not a character boundary
      int32_t id = tok_map_get(&t->vocab, w + st, len);
      if (id < 0) continue;
      node *tn = &best[st + len];
      double cand = here + t->uni_score[id];
      if (tn->start < 0 || cand > tn->score) *tn = (node){cand, (int32_t)st, id};
      if (len == mblen) single = true;
    }
    if (!single) {
      node *tn = &best[st + mblen];
      double cand = here + unk_score;
      if (tn->start < 0 || cand > tn->score) *tn = (node){cand, (int32_t)st, t->unk_id};
    }
    st += mblen;
  }
  size_t k = 0;
  for (int32_t e = (int32_t)n; e > 0; e = best[e].start) ends[k++] = e;
  // Pieces left to right; a run of unknown nodes (the unk id) is one string.
  int32_t from = 0;
  for (size_t i = k; i-- > 0;) {
    int32_t e = ends[i], s = best[e].start;
    bool unk = t->unk_id >= 0 && best[e].id == t->unk_id;
    bool next_unk = i > 0 && t->unk_id >= 0 && best[ends[i - 1]].id == t->unk_id;
    if (!unk) from = s;
    if (unk && next_unk) continue;
    TPR_CHECK(emit(t, w + from, (size_t)(e - from), out));
    from = e;
  }
  return TPR_OK;
}
