// Decoders and tpr_tokenizer_decode: ids -> token strings -> the decoder
// chain (each stage maps a list of strings to a list of strings, as in the
// reference) -> the strings joined.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

typedef tok_words toks;  // strings in one buffer

static tpr_status push(toks *o, const char *s, size_t n) {
  size_t off = o->text.n;
  TPR_CHECK(tok_buf_put(&o->text, s, n));
  return tok_words_push(o, off, n);
}

// Appends to the last string of o (opened by push(o, "", 0)).
static tpr_status append(toks *o, const char *s, size_t n) {
  TPR_CHECK(tok_buf_put(&o->text, s, n));
  o->len[o->n - 1] += n;
  return TPR_OK;
}

static tpr_status flush_bytes(toks *o, const unsigned char *b, size_t nb) {
  if (!nb) return TPR_OK;
  if (tok_utf8_valid_prefix((const char *)b, nb) == nb) return push(o, (const char *)b, nb);
  for (size_t i = 0; i < nb; i++) TPR_CHECK(push(o, "\xEF\xBF\xBD", 3));  // one U+FFFD per byte token
  return TPR_OK;
}

static int hexv(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Every occurrence of pat in b replaced by rep, left to right (str::replace).
static tpr_status replace_all(tok_buf *b, tok_buf *tmp, const char *pat, const char *rep) {
  size_t pl = strlen(pat), rl = strlen(rep);
  tmp->n = 0;
  for (size_t k = 0; k < b->n;) {
    bool hit = b->n - k >= pl && !memcmp(b->p + k, pat, pl);
    TPR_CHECK(hit ? tok_buf_put(tmp, rep, rl) : tok_buf_put(tmp, b->p + k, 1));
    k += hit ? pl : 1;
  }
  tok_buf t = *b;
  *b = *tmp, *tmp = t;
  return TPR_OK;
}

// WordPiece: a token after the first loses its prefix ("##") if it has it,
// else is preceded by a space; cleanup then undoes the tokenizer's spaces
// around punctuation and English contractions, token by token as the reference does.
static tpr_status wordpiece(const tok_dec *d, const toks *in, toks *o) {
  static const char *const fix[][2] = {{" .", "."},        {" ?", "?"},     {" !", "!"},   {" ,", ","},
                                       {" ' ", "'"},       {" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"},
                                       {" 's", "'s"},      {" 've", "'ve"}, {" 're", "'re"}};
  size_t pl = strlen(d->content);
  tok_buf b = {0}, tmp = {0};
  tpr_status rc = TPR_OK;
  for (size_t i = 0; i < in->n && rc == TPR_OK; i++) {
    const char *s = in->text.p + in->off[i];
    size_t n = in->len[i];
    b.n = 0;
    if (i && n >= pl && !memcmp(s, d->content, pl)) s += pl, n -= pl;
    else if (i) rc = tok_buf_put(&b, " ", 1);
    if (rc == TPR_OK) rc = tok_buf_put(&b, s, n);
    for (size_t k = 0; d->cleanup && k < sizeof fix / sizeof fix[0] && rc == TPR_OK; k++)
      rc = replace_all(&b, &tmp, fix[k][0], fix[k][1]);
    if (rc == TPR_OK) rc = push(o, b.p ? b.p : "", b.n);
  }
  free(b.p), free(tmp.p);
  return rc;
}

// BPEDecoder: each end-of-word suffix becomes a space, or nothing in the last token.
static tpr_status bpe_suffix(const tok_dec *d, const toks *in, toks *o) {
  tok_buf b = {0}, tmp = {0};
  tpr_status rc = TPR_OK;
  for (size_t i = 0; i < in->n && rc == TPR_OK; i++) {
    b.n = 0;
    rc = tok_buf_put(&b, in->text.p + in->off[i], in->len[i]);
    if (rc == TPR_OK && d->content[0]) rc = replace_all(&b, &tmp, d->content, i + 1 == in->n ? "" : " ");
    if (rc == TPR_OK) rc = push(o, b.p ? b.p : "", b.n);
  }
  free(b.p), free(tmp.p);
  return rc;
}

static tpr_status stage(const tok_dec *d, const toks *in, toks *o) {
  if (d->kind == TOK_DEC_WORDPIECE) return wordpiece(d, in, o);
  if (d->kind == TOK_DEC_BPE) return bpe_suffix(d, in, o);
  if (d->kind == TOK_DEC_BYTELEVEL || d->kind == TOK_DEC_FUSE) {
    tok_buf raw = {0};
    tpr_status rc = TPR_OK;
    for (size_t i = 0; i < in->n && rc == TPR_OK; i++) {
      const char *s = in->text.p + in->off[i];
      size_t n = in->len[i];
      if (d->kind == TOK_DEC_FUSE) {
        rc = tok_buf_put(&raw, s, n);
        continue;
      }
      size_t mark = raw.n;  // a token with a character outside the map stays as its own bytes
      for (size_t k = 0; k < n && rc == TPR_OK;) {
        int32_t cp;
        k += (size_t)tok_utf8_next(s + k, n - k, &cp);
        int b = tok_char_to_byte(cp);
        if (b < 0) {
          raw.n = mark;
          rc = tok_buf_put(&raw, s, n);
          break;
        }
        unsigned char c = (unsigned char)b;
        rc = tok_buf_put(&raw, &c, 1);
      }
    }
    if (rc == TPR_OK) {
      rc = push(o, "", 0);
      if (rc == TPR_OK && d->kind == TOK_DEC_FUSE) rc = append(o, raw.p ? raw.p : "", raw.n);
      else if (rc == TPR_OK) {
        tok_buf lossy = {0};
        rc = tok_utf8_lossy(&lossy, (const unsigned char *)(raw.p ? raw.p : ""), raw.n);
        if (rc == TPR_OK) rc = append(o, lossy.p ? lossy.p : "", lossy.n);
        free(lossy.p);
      }
    }
    free(raw.p);
    return rc;
  }
  if (d->kind == TOK_DEC_BYTEFALLBACK) {
    unsigned char bytes[256];
    size_t nb = 0;
    tok_buf big = {0};  // for runs of more than 256 byte tokens
    tpr_status rc = TPR_OK;
    for (size_t i = 0; i < in->n && rc == TPR_OK; i++) {
      const char *s = in->text.p + in->off[i];
      size_t n = in->len[i];
      if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexv(s[3]) >= 0 && hexv(s[4]) >= 0) {
        unsigned char c = (unsigned char)(hexv(s[3]) * 16 + hexv(s[4]));
        if (nb < sizeof bytes) bytes[nb++] = c;
        else rc = tok_buf_put(&big, &c, 1);
        continue;
      }
      if (nb) {
        if (big.n) {
          tok_buf all = {0};
          rc = tok_buf_put(&all, bytes, nb);
          if (rc == TPR_OK) rc = tok_buf_put(&all, big.p, big.n);
          if (rc == TPR_OK) rc = flush_bytes(o, (const unsigned char *)all.p, all.n);
          free(all.p);
          big.n = 0;
        } else rc = flush_bytes(o, bytes, nb);
        nb = 0;
      }
      if (rc == TPR_OK) rc = push(o, s, n);
    }
    if (rc == TPR_OK && nb) {
      tok_buf all = {0};
      rc = tok_buf_put(&all, bytes, nb);
      if (rc == TPR_OK && big.n) rc = tok_buf_put(&all, big.p, big.n);
      if (rc == TPR_OK) rc = flush_bytes(o, (const unsigned char *)all.p, all.n);
      free(all.p);
    }
    free(big.p);
    return rc;
  }
  size_t pl = d->pattern ? strlen(d->pattern) : 0, cl = d->content ? strlen(d->content) : 0;
  size_t rl = strlen(d->repl);
  for (size_t i = 0; i < in->n; i++) {
    const char *s = in->text.p + in->off[i];
    size_t n = in->len[i];
    TPR_CHECK(push(o, "", 0));
    if (d->kind == TOK_DEC_REPLACE) {
      size_t k = 0;
      while (k < n) {
        if (pl && n - k >= pl && !memcmp(s + k, d->pattern, pl)) {
          TPR_CHECK(append(o, d->content, cl));
          k += pl;
        } else {
          TPR_CHECK(append(o, s + k, 1));
          k++;
        }
      }
    } else if (d->kind == TOK_DEC_METASPACE) {
      for (size_t k = 0; k < n;) {
        if (n - k >= rl && !memcmp(s + k, d->repl, rl)) {
          if (!(i == 0 && d->prepend != TOK_PREPEND_NEVER)) TPR_CHECK(append(o, " ", 1));
          k += rl;
        } else {
          TPR_CHECK(append(o, s + k, 1));
          k++;
        }
      }
    } else {  // Strip: up to start leading and stop trailing copies of one character
      size_t a = 0, b = n;
      for (int c = 0; c < d->start && b - a >= cl && !memcmp(s + a, d->content, cl); c++) a += cl;
      for (int c = 0; c < d->stop && b - a >= cl && !memcmp(s + b - cl, d->content, cl); c++) b -= cl;
      TPR_CHECK(append(o, s + a, b - a));
    }
  }
  return TPR_OK;
}

tpr_status tpr_tokenizer_decode(const tpr_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text,
                                size_t *len) {
  if (!t || (!ids && n) || !text) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_tokenizer_decode: NULL argument");
  *text = NULL;
  if (len) *len = 0;
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= t->n_ids || !t->id_tok[ids[i]])
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_tokenizer_decode: id %d at position %zu is outside the vocab [0, %d)",
                      ids[i], i, t->n_ids);
  toks a = {0}, b = {0};
  tpr_status rc = TPR_OK;
  for (size_t i = 0; i < n && rc == TPR_OK; i++) {
    if (skip_special && t->id_special[ids[i]]) continue;
    rc = push(&a, t->id_tok[ids[i]], t->id_len[ids[i]]);
  }
  for (int k = 0; k < t->n_decs && rc == TPR_OK; k++) {
    b.n = 0, b.text.n = 0;
    rc = stage(&t->decs[k], &a, &b);
    toks tmp = a;
    a = b, b = tmp;
  }
  tok_buf out = {0};
  for (size_t i = 0; i < a.n && rc == TPR_OK; i++) {
    if (i && !t->has_decoder) rc = tok_buf_put(&out, " ", 1);  // the reference joins with spaces then
    if (rc == TPR_OK) rc = tok_buf_put(&out, a.text.p + a.off[i], a.len[i]);
  }
  if (rc == TPR_OK && !out.p) rc = tok_buf_put(&out, "", 0);
  tok_words_free(&a), tok_words_free(&b);
  if (rc != TPR_OK) {
    free(out.p);
    return rc;
  }
  *text = out.p;
  if (len) *len = out.n;
  return TPR_OK;
}

static tpr_status parse_one(tpr_tokenizer *t, const cJSON *j, tok_dec *d) {
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
  const char *ty = cJSON_IsString(type) ? type->valuestring : "(none)";
  memset(d, 0, sizeof *d);
  if (!strcmp(ty, "ByteLevel")) d->kind = TOK_DEC_BYTELEVEL;
  else if (!strcmp(ty, "ByteFallback")) d->kind = TOK_DEC_BYTEFALLBACK;
  else if (!strcmp(ty, "Fuse")) d->kind = TOK_DEC_FUSE;
  else if (!strcmp(ty, "Replace")) {
    d->kind = TOK_DEC_REPLACE;
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "pattern"), "String");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    if (!cJSON_IsString(str) || !cJSON_IsString(c))
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: decoder Replace needs a pattern.String and content", t->file);
    d->pattern = strdup(str->valuestring), d->content = strdup(c->valuestring);
  } else if (!strcmp(ty, "Strip")) {
    d->kind = TOK_DEC_STRIP;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "start"), *sp = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (!cJSON_IsString(c) || !cJSON_IsNumber(st) || !cJSON_IsNumber(sp))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: decoder Strip needs content, start and stop", t->file);
    d->content = strdup(c->valuestring);
    d->start = st->valueint, d->stop = sp->valueint;
  } else if (!strcmp(ty, "Metaspace")) {
    d->kind = TOK_DEC_METASPACE;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "replacement");
    const char *rs = cJSON_IsString(r) ? r->valuestring : "\xE2\x96\x81";
    if (strlen(rs) == 0 || strlen(rs) >= sizeof d->repl)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: decoder Metaspace replacement must be one character", t->file);
    strcpy(d->repl, rs);
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
    const char *s = cJSON_IsString(ps) ? ps->valuestring : (cJSON_IsFalse(aps) ? "never" : "always");
    d->prepend = !strcmp(s, "never") ? TOK_PREPEND_NEVER : !strcmp(s, "first") ? TOK_PREPEND_FIRST : TOK_PREPEND_ALWAYS;
  } else if (!strcmp(ty, "BPEDecoder")) {
    d->kind = TOK_DEC_BPE;
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(j, "suffix");
    d->content = strdup(cJSON_IsString(sf) ? sf->valuestring : "</w>");
  } else if (!strcmp(ty, "WordPiece")) {
    d->kind = TOK_DEC_WORDPIECE;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prefix");
    d->content = strdup(cJSON_IsString(p) ? p->valuestring : "##");
    d->cleanup = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "cleanup"));
  } else return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: decoder type '%s' is not supported", t->file, ty);
  if ((d->kind == TOK_DEC_REPLACE && (!d->pattern || !d->content)) ||
      ((d->kind == TOK_DEC_STRIP || d->kind == TOK_DEC_WORDPIECE || d->kind == TOK_DEC_BPE) &&
       !d->content))
    return TPR_FAIL(TPR_ERR_OOM, "%s: decoder strings", t->file);
  return TPR_OK;
}

tpr_status tok_parse_decoder(tpr_tokenizer *t, const void *json) {
  const cJSON *j = json;
  if (!j || cJSON_IsNull(j)) return TPR_OK;
  t->has_decoder = true;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
  bool seq = cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0;
  const cJSON *list = seq ? cJSON_GetObjectItemCaseSensitive(j, "decoders") : NULL;
  if (seq && !cJSON_IsArray(list)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: decoder Sequence has no decoders array", t->file);
  int n = seq ? cJSON_GetArraySize(list) : 1;
  t->decs = calloc((size_t)n + 1, sizeof *t->decs);
  if (!t->decs) return TPR_FAIL(TPR_ERR_OOM, "%s: %d decoders", t->file, n);
  for (int i = 0; i < n; i++) {
    tpr_status rc = parse_one(t, seq ? cJSON_GetArrayItem(list, i) : j, &t->decs[t->n_decs]);
    t->n_decs++;  // counted even on failure so free releases its strings
    TPR_CHECK(rc);
  }
  return TPR_OK;
}

tpr_status tpr_tokenizer_decode_known(const tpr_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                                      char **text, size_t *len) {
  const int32_t vocab = tpr_tokenizer_vocab_size(t);
  int32_t *known = malloc((n + 1) * sizeof *known);
  if (!known) return TPR_FAIL(TPR_ERR_OOM, "tpr_tokenizer_decode_known: %zu ids", n);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (ids[i] >= 0 && ids[i] < vocab) known[k++] = ids[i];
  tpr_status rc = tpr_tokenizer_decode(t, known, k, skip_special, text, len);
  free(known);
  return rc;
}
