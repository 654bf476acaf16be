// Added tokens and tpr_tokenizer_encode: the reference's pipeline
//   raw text --split by non-normalized added tokens--> segments
//   segment  --normalize--> --split by normalized added tokens--> pieces
//   piece    --pre-tokenize--> words --BPE--> ids
// then the post-processor's template when add_special is set.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

tpr_status tok_parse_added(tpr_tokenizer *t, const void *json) {
  const cJSON *list = json, *e;
  if (!list || cJSON_IsNull(list)) return TPR_OK;
  if (!cJSON_IsArray(list)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: added_tokens is not an array", t->file);
  int n = cJSON_GetArraySize(list);
  t->added = calloc((size_t)n + 1, sizeof *t->added);
  if (!t->added) return TPR_FAIL(TPR_ERR_OOM, "%s: %d added tokens", t->file, n);
  cJSON_ArrayForEach(e, list) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id"), *c = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (!cJSON_IsNumber(id) || id->valueint < 0 || id->valueint >= t->n_ids || !cJSON_IsString(c) ||
        !c->valuestring[0])
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: added token %d has no valid id and content", t->file, t->n_added);
    tok_added *a = &t->added[t->n_added];
    a->content = strdup(c->valuestring);
    if (!a->content) return TPR_FAIL(TPR_ERR_OOM, "%s: added token", t->file);
    t->n_added++;
    a->len = (uint32_t)strlen(a->content);
    a->id = id->valueint;
    a->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
    a->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "lstrip"));
    a->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "rstrip"));
    a->single_word = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "single_word"));
    a->normalized = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "normalized"));
    if (tok_utf8_valid_prefix(a->content, a->len) != a->len)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: added token %d is not UTF-8", t->file, a->id);
  }
  // A normalized token is matched in normalized text: normalize its content.
  tok_run run;
  TPR_CHECK(tok_run_init(&run));
  tpr_status rc = TPR_OK;
  tok_buf b = {0};
  for (int i = 0; i < t->n_added && rc == TPR_OK; i++) {
    tok_added *a = &t->added[i];
    if (!a->normalized || t->n_norms == 0) continue;
    rc = tok_normalize(t, &run, a->content, a->len, &b);
    if (rc == TPR_OK && b.n > 0) {
      char *s = realloc(a->content, b.n + 1);
      if (!s) rc = TPR_FAIL(TPR_ERR_OOM, "%s: added token", t->file);
      else memcpy(s, b.p, b.n + 1), a->content = s, a->len = (uint32_t)b.n;
    }
  }
  free(b.p);
  tok_run_free(&run);
  for (int i = 0; i < t->n_added && rc == TPR_OK; i++)
    rc = tok_trie_add(&t->added_trie[t->added[i].normalized], t->added[i].content, t->added[i].len, i);
  return rc;
}

// The leftmost, then longest, added token of the given kind at or after pos:
// one trie walk per position, bounded by the longest token.
static const tok_added *find_token(const tpr_tokenizer *t, bool normalized, const char *s, size_t n, size_t pos,
                                   size_t *at) {
  const tok_trie *tr = &t->added_trie[normalized];
  if (tr->n_nodes == 0) return NULL;
  for (size_t i = pos; i < n; i++) {
    size_t len;
    int32_t k = tok_trie_longest(tr, s + i, n - i, &len);
    if (k >= 0) {
      *at = i;
      return &t->added[k];
    }
  }
  return NULL;
}

static int32_t last_cp(const char *s, size_t n) {
  size_t i = n;
  while (i > 0 && (s[i - 1] & 0xC0) == 0x80) i--;
  if (i == 0) return -1;
  int32_t cp;
  tok_utf8_next(s + i - 1, n - i + 1, &cp);
  return cp;
}

typedef struct enc {
  const tpr_tokenizer *t;
  tok_run run;
  tok_bpe_scratch bpe;
  tok_buf norm;  // scratch of the WordPiece and Unigram models
  tok_words words;
  tok_ids ids;
} enc;

// Pre-tokenize and run the model on s[0..n) (no added tokens left in it).
static tpr_status model_piece(enc *e, const char *s, size_t n, bool at_start) {
  if (n == 0) return TPR_OK;
  e->words.n = 0, e->words.text.n = 0;
  TPR_CHECK(tok_pretokenize(e->t, &e->run, s, n, at_start, &e->words));
  for (size_t i = 0; i < e->words.n; i++) {
    const char *w = e->words.text.p + e->words.off[i];
    tok_model_kind k = e->t->model;
    if (k == TOK_MODEL_WORDPIECE || k == TOK_MODEL_WORDLEVEL)
      TPR_CHECK(tok_wordpiece_word(e->t, &e->norm, w, e->words.len[i], &e->ids));
    else if (e->t->model == TOK_MODEL_UNIGRAM) TPR_CHECK(tok_unigram_word(e->t, &e->norm, w, e->words.len[i], &e->ids));
    else TPR_CHECK(tok_bpe_word(e->t, &e->bpe, w, e->words.len[i], &e->ids));
  }
  return TPR_OK;
}

// Splits s by added tokens of one kind (the reference's find_matches, with
// single_word / lstrip / rstrip); the text between goes to `normalized`
// pieces' next stage: for raw text the normalizer, for normalized text the model.
static tpr_status split_added(enc *e, const char *s, size_t n, bool normalized, bool at_start);

static tpr_status text_segment(enc *e, const char *s, size_t n, bool at_start) {
  if (n == 0) return TPR_OK;
  tok_buf norm = {0};  // own buffer: split_added on it re-enters model_piece, not this
  tpr_status rc = tok_normalize(e->t, &e->run, s, n, &norm);
  if (rc == TPR_OK) rc = split_added(e, norm.p ? norm.p : "", norm.n, true, at_start);
  free(norm.p);
  return rc;
}

static tpr_status split_added(enc *e, const char *s, size_t n, bool normalized, bool at_start) {
  size_t start_off = 0, pos = 0, at;
  const tok_added *a;
  while (pos < n && (a = find_token(e->t, normalized, s, n, pos, &at)) != NULL) {
    size_t st = at, en = at + a->len;
    pos = en;
    if (a->single_word) {
      int32_t before = st > 0 ? last_cp(s, st) : -1, after = -1;
      if (en < n) tok_utf8_next(s + en, n - en, &after);
      if ((before >= 0 && tok_is_word_char(before)) || (after >= 0 && tok_is_word_char(after))) continue;
    }
    if (a->lstrip) {
      size_t ns = st;
      while (ns > 0) {  // back over whitespace characters
        size_t k = ns - 1;
        while (k > 0 && (s[k] & 0xC0) == 0x80) k--;
        int32_t cp;
        tok_utf8_next(s + k, ns - k, &cp);
        if (!tok_is_whitespace(cp)) break;
        ns = k;
      }
      st = ns > start_off ? ns : start_off;
    }
    if (a->rstrip) {
      while (en < n) {
        int32_t cp;
        int l = tok_utf8_next(s + en, n - en, &cp);
        if (!tok_is_whitespace(cp)) break;
        en += (size_t)l;
      }
      pos = en;
    }
    if (st > start_off) {
      if (normalized) TPR_CHECK(model_piece(e, s + start_off, st - start_off, at_start && start_off == 0));
      else TPR_CHECK(text_segment(e, s + start_off, st - start_off, at_start && start_off == 0));
    }
    TPR_CHECK(tok_ids_push(&e->ids, a->id));
    start_off = en;
  }
  if (start_off < n) {
    if (normalized) return model_piece(e, s + start_off, n - start_off, at_start && start_off == 0);
    return text_segment(e, s + start_off, n - start_off, at_start && start_off == 0);
  }
  return TPR_OK;
}

tpr_status tpr_tokenizer_encode(const tpr_tokenizer *t, const char *text, size_t len, bool add_special,
                                int32_t **ids, size_t *n) {
  if (!t || (!text && len) || !ids || !n) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_tokenizer_encode: NULL argument");
  *ids = NULL, *n = 0;
  size_t ok = tok_utf8_valid_prefix(text, len);
  if (ok != len)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_tokenizer_encode: text is not valid UTF-8 at byte %zu of %zu", ok, len);
  enc e = {.t = t};
  tok_run *run = tok_run_thread();
  if (!run) return TPR_ERR_OOM;
  e.run = *run;  // borrowed: the thread keeps it
  tpr_status rc = TPR_OK;
  if (add_special)
    for (int i = 0; i < t->n_post_pre && rc == TPR_OK; i++) rc = tok_ids_push(&e.ids, t->post_pre[i]);
  if (rc == TPR_OK) rc = split_added(&e, text ? text : "", len, false, true);
  if (add_special)
    for (int i = 0; i < t->n_post_post && rc == TPR_OK; i++) rc = tok_ids_push(&e.ids, t->post_post[i]);
  if (rc == TPR_OK && !e.ids.p) rc = tok_ids_push(&e.ids, 0), e.ids.n = 0;  // a non-NULL array for 0 ids
  tok_bpe_scratch_free(&e.bpe);
  free(e.norm.p);
  tok_words_free(&e.words);
  if (rc != TPR_OK) {
    free(e.ids.p);
    return rc;
  }
  *ids = e.ids.p, *n = e.ids.n;
  return TPR_OK;
}
