// The WordPiece model (BERT): each word is split greedily into the longest
// vocab entries from its start, pieces after the first written with the
// continuing-subword prefix ("##"). A word with a part no entry covers, or
// longer than max_input_chars_per_word characters, becomes the one unk token,
// as in the reference. WordLevel, the whole word or unk, shares the loader.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

#define TOK_MAX_IDS (1 << 26)

tpr_status tok_parse_wordpiece(tpr_tokenizer *t, const void *json, int32_t *max_id) {
  const cJSON *m = json, *e;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(m, "type");
  bool level = cJSON_IsString(type) && !strcmp(type->valuestring, "WordLevel");
  t->model = level ? TOK_MODEL_WORDLEVEL : TOK_MODEL_WORDPIECE;
  const char *what = t->model == TOK_MODEL_WORDLEVEL ? "WordLevel" : "WordPiece";
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
  if (!cJSON_IsObject(vocab)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: model %s has no vocab object", t->file, what);
  cJSON_ArrayForEach(e, vocab) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= TOK_MAX_IDS || e->valuedouble != e->valueint)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: vocab entry '%s' has no valid id", t->file, e->string);
    TPR_CHECK(tok_map_put(&t->vocab, e->string, strlen(e->string), e->valueint));
    if (e->valueint > *max_id) *max_id = e->valueint;
  }
  const cJSON *pre = cJSON_GetObjectItemCaseSensitive(m, "continuing_subword_prefix");
  t->wp_prefix = strdup(cJSON_IsString(pre) ? pre->valuestring : "##");
  if (!t->wp_prefix) return TPR_FAIL(TPR_ERR_OOM, "%s: WordPiece prefix", t->file);
  const cJSON *mx = cJSON_GetObjectItemCaseSensitive(m, "max_input_chars_per_word");
  t->wp_max_chars = 100;  // the reference's default
  if (cJSON_IsNumber(mx)) t->wp_max_chars = mx->valuedouble > 1e9 ? 1000000000 : mx->valueint;
  // Every word may fall back to unk, so unlike BPE it must exist.
  const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
  if (!cJSON_IsString(unk)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: model %s has no unk_token", t->file, what);
  t->unk_id = tok_map_get(&t->vocab, unk->valuestring, strlen(unk->valuestring));
  if (t->unk_id < 0)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: unk_token '%s' is not in the vocab", t->file, unk->valuestring);
  return TPR_OK;
}

tpr_status tok_wordpiece_word(const tpr_tokenizer *t, tok_buf *scratch, const char *w, size_t n, tok_ids *out) {
  if (t->model == TOK_MODEL_WORDLEVEL) {
    int32_t id = tok_map_get(&t->vocab, w, n);
    return tok_ids_push(out, id >= 0 ? id : t->unk_id);
  }
  size_t chars = 0;
  for (size_t i = 0; i < n; i++) chars += (w[i] & 0xC0) != 0x80;
  if (chars > (size_t)t->wp_max_chars) return tok_ids_push(out, t->unk_id);
  size_t mark = out->n, pl = strlen(t->wp_prefix);
  for (size_t start = 0; start < n;) {
    int32_t id = -1;
    size_t end = n;
    while (end > start) {
      scratch->n = 0;
      if (start > 0) TPR_CHECK(tok_buf_put(scratch, t->wp_prefix, pl));
      TPR_CHECK(tok_buf_put(scratch, w + start, end - start));
      if ((id = tok_map_get(&t->vocab, scratch->p, scratch->n)) >= 0) break;
      do end--;  // back one character
      while (end > start && (w[end] & 0xC0) == 0x80);
    }
    if (id < 0) {  // the whole word is unknown, not just this part
      out->n = mark;
      return tok_ids_push(out, t->unk_id);
    }
    TPR_CHECK(tok_ids_push(out, id));
    start = end;
  }
  return TPR_OK;
}
