// Loading tokenizer.json (+ tokenizer_config.json) with cJSON: the BPE model,
// the id <-> token tables, the post-processor, and the public lookups.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/file_io.h"
#include "tokenizer/tok_impl.h"

#define TOK_MAX_IDS (1 << 26)  // far above any real vocab; bounds the id tables

static tpr_status parse_json(const char *path, cJSON **out) {
  uint8_t *bytes;
  size_t n;
  TPR_CHECK(tpr_file_read(path, &bytes, &n));
  *out = cJSON_ParseWithLength((const char *)bytes, n);
  if (!*out) {
    const char *at = cJSON_GetErrorPtr();
    size_t off = at && at >= (const char *)bytes && at <= (const char *)bytes + n ? (size_t)(at - (const char *)bytes) : 0;
    free(bytes);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: malformed JSON near byte %zu", path, off);
  }
  free(bytes);
  return TPR_OK;
}

static tpr_status set_id(tpr_tokenizer *t, int32_t id, const char *s, size_t n) {
  free(t->id_tok[id]);
  t->id_tok[id] = malloc(n + 1);
  if (!t->id_tok[id]) return TPR_FAIL(TPR_ERR_OOM, "%s: token %d", t->file, id);
  memcpy(t->id_tok[id], s, n);
  t->id_tok[id][n] = 0;
  t->id_len[id] = (uint32_t)n;
  return TPR_OK;
}

static tpr_status parse_model(tpr_tokenizer *t, const cJSON *m, int32_t *max_id) {
  if (!cJSON_IsObject(m)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: no model object", t->file);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(m, "type");
  if (cJSON_IsString(type) && (!strcmp(type->valuestring, "WordPiece") || !strcmp(type->valuestring, "WordLevel")))
    return tok_parse_wordpiece(t, m, max_id);
  if (cJSON_IsString(type) && !strcmp(type->valuestring, "Unigram")) return tok_parse_unigram(t, m, max_id);
  if (cJSON_IsString(type) && strcmp(type->valuestring, "BPE") != 0)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED,
                    "%s: model type '%s' is not supported (only BPE, WordPiece, WordLevel and Unigram)", t->file,
                    type->valuestring);
  const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  char **dst[] = {&t->bpe_prefix, &t->bpe_suffix};
  for (int i = 0; i < 2; i++) {  // an empty string is the same as none
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, affix[i]);
    if (v && !cJSON_IsNull(v) && !cJSON_IsString(v))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: model BPE %s is not a string", t->file, affix[i]);
    if (cJSON_IsString(v) && v->valuestring[0] && !(*dst[i] = strdup(v->valuestring)))
      return TPR_FAIL(TPR_ERR_OOM, "%s: model BPE %s", t->file, affix[i]);
  }
  size_t plen = t->bpe_prefix ? strlen(t->bpe_prefix) : 0;
  const cJSON *drop = cJSON_GetObjectItemCaseSensitive(m, "dropout");
  if (cJSON_IsNumber(drop) && drop->valuedouble > 0)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: model BPE dropout is not supported", t->file);
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
  if (!cJSON_IsObject(vocab)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: model BPE has no vocab object", t->file);
  const cJSON *e;
  cJSON_ArrayForEach(e, vocab) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= TOK_MAX_IDS || e->valuedouble != e->valueint)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: vocab entry '%s' has no valid id", t->file, e->string);
    TPR_CHECK(tok_map_put(&t->vocab, e->string, strlen(e->string), e->valueint));
    if (e->valueint > *max_id) *max_id = e->valueint;
  }
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
  if (!cJSON_IsArray(merges)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: model BPE has no merges array", t->file);
  int32_t rank = 0;
  tok_buf cat = {0};
  tpr_status rc = TPR_OK;
  cJSON_ArrayForEach(e, merges) {
    const char *a, *b;
    size_t al, bl;
    if (cJSON_IsString(e)) {  // "a b"
      const char *sp = strchr(e->valuestring, ' ');
      if (!sp || strchr(sp + 1, ' ')) {
        rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: merge %d '%s' is not two tokens", t->file, rank, e->valuestring);
        break;
      }
      a = e->valuestring, al = (size_t)(sp - a), b = sp + 1, bl = strlen(b);
    } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(e, 1))) {  // ["a", "b"]
      a = cJSON_GetArrayItem(e, 0)->valuestring, b = cJSON_GetArrayItem(e, 1)->valuestring;
      al = strlen(a), bl = strlen(b);
    } else {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", t->file, rank);
      break;
    }
    int32_t ia = tok_map_get(&t->vocab, a, al), ib = tok_map_get(&t->vocab, b, bl);
    cat.n = 0;
    // The merged token drops the right part's prefix length, as the
    // reference does ("##a" "##b" -> "##ab").
    if (bl < plen) {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: merge %d's right part is shorter than the subword prefix", t->file, rank);
      break;
    }
    if ((rc = tok_buf_put(&cat, a, al)) != TPR_OK || (rc = tok_buf_put(&cat, b + plen, bl - plen)) != TPR_OK) break;
    int32_t im = tok_map_get(&t->vocab, cat.p, cat.n);
    if (ia < 0 || ib < 0 || im < 0) {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: merge %d ('%.*s' + '%.*s') uses a token missing from the vocab", t->file,
                    rank, (int)al, a, (int)bl, b);
      break;
    }
    if ((rc = tok_merges_put(&t->merges, ia, ib, rank, im)) != TPR_OK) break;
    rank++;
  }
  free(cat.p);
  TPR_CHECK(rc);
  const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
  t->unk_id = -1;
  if (cJSON_IsString(unk)) {
    t->unk_id = tok_map_get(&t->vocab, unk->valuestring, strlen(unk->valuestring));
    if (t->unk_id < 0)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: unk_token '%s' is not in the vocab", t->file, unk->valuestring);
  }
  t->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "byte_fallback"));
  t->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "fuse_unk"));
  t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "ignore_merges"));
  for (int b = 0; b < 256; b++) {
    char name[8], c[4];
    snprintf(name, sizeof name, "<0x%02X>", b);
    t->byte_ids[b] = tok_map_get(&t->vocab, name, 6);
    t->bl_ids[b] = tok_map_get(&t->vocab, c, (size_t)tok_utf8_put(tok_byte_char(b), c));
  }
  return TPR_OK;
}

static tpr_status parse_post(tpr_tokenizer *t, const cJSON *p) {
  if (!p || cJSON_IsNull(p)) return TPR_OK;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
  const char *ty = cJSON_IsString(type) ? type->valuestring : "(none)";
  if (!strcmp(ty, "ByteLevel")) return TPR_OK;  // offsets only: ids unchanged
  if (!strcmp(ty, "Sequence")) {
    const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(p, "processors");
    if (!cJSON_IsArray(list)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: post_processor Sequence has no processors", t->file);
    cJSON_ArrayForEach(e, list) TPR_CHECK(parse_post(t, e));
    return TPR_OK;
  }
  bool bert = !strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing");
  if (strcmp(ty, "TemplateProcessing") != 0 && !bert)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: post_processor type '%s' is not supported", t->file, ty);
  if (t->post_pre || t->post_post)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: more than one TemplateProcessing is not supported", t->file);
  if (bert) {  // "cls": [token, id], "sep": [token, id]; single is cls $A sep (Roberta's offsets aside)
    const cJSON *cls = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "cls"), 1);
    const cJSON *sep = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "sep"), 1);
    if (!cJSON_IsNumber(cls) || !cJSON_IsNumber(sep) || cls->valuedouble < 0 || sep->valuedouble < 0 ||
        cls->valuedouble >= TOK_MAX_IDS || sep->valuedouble >= TOK_MAX_IDS)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: %s needs cls and sep as [token, id]", t->file, ty);
    t->post_pre = malloc(sizeof(int32_t)), t->post_post = malloc(sizeof(int32_t));
    if (!t->post_pre || !t->post_post) return TPR_FAIL(TPR_ERR_OOM, "%s: BertProcessing", t->file);
    t->post_pre[t->n_post_pre++] = cls->valueint;
    t->post_post[t->n_post_post++] = sep->valueint;
    return TPR_OK;
  }
  const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
  const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
  if (!cJSON_IsArray(single)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: TemplateProcessing has no single template", t->file);
  int cap = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, specials) {
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(e, "ids");
    cap += cJSON_GetArraySize(ids);
  }
  cap = cap * cJSON_GetArraySize(single) + 1;
  t->post_pre = calloc((size_t)cap, sizeof(int32_t));
  t->post_post = calloc((size_t)cap, sizeof(int32_t));
  if (!t->post_pre || !t->post_post) return TPR_FAIL(TPR_ERR_OOM, "%s: template", t->file);
  bool seen_a = false;
  cJSON_ArrayForEach(e, single) {
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
    if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) {
      if (seen_a) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: TemplateProcessing with $A twice", t->file);
      seen_a = true;
      continue;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
    const cJSON *def = cJSON_IsString(name) ? cJSON_GetObjectItemCaseSensitive(specials, name->valuestring) : NULL;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids"), *id;
    if (!cJSON_IsArray(ids))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: TemplateProcessing special token %s has no ids", t->file,
                      cJSON_IsString(name) ? name->valuestring : "(unnamed)");
    cJSON_ArrayForEach(id, ids) {
      if (!cJSON_IsNumber(id) || id->valueint < 0 || id->valueint >= TOK_MAX_IDS)
        return TPR_FAIL(TPR_ERR_FORMAT, "%s: TemplateProcessing id out of range", t->file);
      if (seen_a) t->post_post[t->n_post_post++] = id->valueint;
      else t->post_pre[t->n_post_pre++] = id->valueint;
    }
  }
  return TPR_OK;
}

static tpr_status config_id(tpr_tokenizer *t, const char *cfg_path, const cJSON *cfg, const char *key, int32_t *id) {
  *id = -1;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
  if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
  if (!cJSON_IsString(v)) return TPR_OK;
  *id = tpr_tokenizer_token_to_id(t, v->valuestring);
  if (*id < 0) return TPR_FAIL(TPR_ERR_FORMAT, "%s: %s '%s' is not a token of %s", cfg_path, key, v->valuestring, t->file);
  return TPR_OK;
}

static tpr_status load(tpr_tokenizer *t, const char *path) {
  struct stat st;
  bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
  t->file = dir ? tpr_path_join(path, "tokenizer.json") : strdup(path);
  if (!t->file) return TPR_FAIL(TPR_ERR_OOM, "tokenizer: path");
  cJSON *j = NULL, *cfg = NULL;
  char *cfg_path = NULL;
  tpr_status rc = TPR_OK;
  TPR_CHECK_GOTO(parse_json(t->file, &j), rc, done);
  if (!cJSON_IsObject(j)) {
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: not a JSON object", t->file);
    goto done;
  }
  int32_t max_id = -1;
  TPR_CHECK_GOTO(parse_model(t, cJSON_GetObjectItemCaseSensitive(j, "model"), &max_id), rc, done);
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens"), *e;
  cJSON_ArrayForEach(e, added) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
    if (cJSON_IsNumber(id) && id->valueint > max_id && id->valueint < TOK_MAX_IDS) max_id = id->valueint;
  }
  t->n_ids = max_id + 1;
  t->id_tok = calloc((size_t)t->n_ids + 1, sizeof *t->id_tok);
  t->id_len = calloc((size_t)t->n_ids + 1, sizeof *t->id_len);
  t->id_special = calloc((size_t)t->n_ids + 1, sizeof *t->id_special);
  if (!t->id_tok || !t->id_len || !t->id_special) {
    rc = TPR_FAIL(TPR_ERR_OOM, "%s: id tables of %d", t->file, t->n_ids);
    goto done;
  }
  for (size_t i = 0; i < t->vocab.cap; i++)
    if (t->vocab.keys[i]) TPR_CHECK_GOTO(set_id(t, t->vocab.vals[i], t->vocab.keys[i], t->vocab.lens[i]), rc, done);
  TPR_CHECK_GOTO(tok_parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(j, "normalizer")), rc, done);
  TPR_CHECK_GOTO(tok_parse_pretokenizer(t, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer")), rc, done);
  TPR_CHECK_GOTO(tok_parse_decoder(t, cJSON_GetObjectItemCaseSensitive(j, "decoder")), rc, done);
  TPR_CHECK_GOTO(parse_post(t, cJSON_GetObjectItemCaseSensitive(j, "post_processor")), rc, done);
  TPR_CHECK_GOTO(tok_parse_added(t, added), rc, done);
  for (int i = 0; i < t->n_added; i++) {
    TPR_CHECK_GOTO(set_id(t, t->added[i].id, t->added[i].content, t->added[i].len), rc, done);
    t->id_special[t->added[i].id] = t->added[i].special;
  }
  for (int i = 0; i < t->n_post_pre + t->n_post_post; i++) {
    int32_t id = i < t->n_post_pre ? t->post_pre[i] : t->post_post[i - t->n_post_pre];
    if (id >= t->n_ids || !t->id_tok[id]) {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: post_processor id %d is not in the vocab", t->file, id);
      goto done;
    }
  }
  // tokenizer_config.json beside tokenizer.json: optional.
  char *slash = strrchr(t->file, '/');
  if (slash) {
    *slash = 0;
    cfg_path = tpr_path_join(t->file, "tokenizer_config.json");
    *slash = '/';
  } else cfg_path = strdup("tokenizer_config.json");
  t->bos_id = t->eos_id = -1;
  if (cfg_path && stat(cfg_path, &st) == 0) {
    TPR_CHECK_GOTO(parse_json(cfg_path, &cfg), rc, done);
    TPR_CHECK_GOTO(config_id(t, cfg_path, cfg, "bos_token", &t->bos_id), rc, done);
    TPR_CHECK_GOTO(config_id(t, cfg_path, cfg, "eos_token", &t->eos_id), rc, done);
  }
done:
  cJSON_Delete(j);
  cJSON_Delete(cfg);
  free(cfg_path);
  return rc;
}

tpr_status tpr_tokenizer_load(const char *path, tpr_tokenizer **out) {
  if (!path || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_tokenizer_load: NULL argument");
  *out = NULL;
  tpr_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return TPR_FAIL(TPR_ERR_OOM, "tpr_tokenizer_load: %s", path);
  t->unk_id = t->bos_id = t->eos_id = -1;
  tpr_status rc = load(t, path);
  if (rc != TPR_OK) {
    tpr_tokenizer_free(t);
    return rc;
  }
  *out = t;
  return TPR_OK;
}

void tpr_tokenizer_free(tpr_tokenizer *t) {
  if (!t) return;
  tok_map_free(&t->vocab);
  tok_merges_free(&t->merges);
  for (int32_t i = 0; t->id_tok && i < t->n_ids; i++) free(t->id_tok[i]);
  free(t->id_tok), free(t->id_len), free(t->id_special);
  for (int i = 0; i < t->n_norms; i++)
    free(t->norms[i].str), free(t->norms[i].pc), tok_regex_free(&t->norms[i].re);
  for (int i = 0; i < t->n_pres; i++) tok_regex_free(&t->pres[i].re);
  for (int i = 0; i < t->n_decs; i++) free(t->decs[i].pattern), free(t->decs[i].content);
  for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
  tok_trie_free(&t->added_trie[0]), tok_trie_free(&t->added_trie[1]);
  free(t->norms), free(t->pres), free(t->decs), free(t->added);
  free(t->post_pre), free(t->post_post);
  free(t->wp_prefix), free(t->uni_score), free(t->bpe_prefix), free(t->bpe_suffix);
  free(t->file);
  free(t);
}

int32_t tpr_tokenizer_vocab_size(const tpr_tokenizer *t) { return t ? t->n_ids : 0; }

const char *tpr_tokenizer_id_to_token(const tpr_tokenizer *t, int32_t id) {
  return t && id >= 0 && id < t->n_ids ? t->id_tok[id] : NULL;
}

int32_t tpr_tokenizer_token_to_id(const tpr_tokenizer *t, const char *token) {
  if (!t || !token) return -1;
  size_t n = strlen(token);
  for (int i = 0; i < t->n_added; i++)
    if (t->added[i].len == n && !memcmp(t->added[i].content, token, n)) return t->added[i].id;
  return tok_map_get(&t->vocab, token, n);
}

bool tpr_tokenizer_is_special(const tpr_tokenizer *t, int32_t id) {
  return t && id >= 0 && id < t->n_ids && t->id_special[id];
}

int32_t tpr_tokenizer_bos_id(const tpr_tokenizer *t) { return t ? t->bos_id : -1; }
int32_t tpr_tokenizer_eos_id(const tpr_tokenizer *t) { return t ? t->eos_id : -1; }
