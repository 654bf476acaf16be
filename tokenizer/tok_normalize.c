// Normalizers: Unicode normal forms (utf8proc), Prepend, Replace, Lowercase,
// Strip, StripAccents, BertNormalizer, Nmt, Precompiled (tok_precompiled.c) and Sequence, applied to each text
// segment between added tokens.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_impl.h"

typedef struct repl_ctx {
  const char *s;
  const char *with;
  size_t prev;
  tok_buf *out;
} repl_ctx;

static tpr_status on_repl(void *ctx, size_t st, size_t en) {
  repl_ctx *c = ctx;
  TPR_CHECK(tok_buf_put(c->out, c->s + c->prev, st - c->prev));
  TPR_CHECK(tok_buf_put(c->out, c->with, strlen(c->with)));
  c->prev = en;
  return TPR_OK;
}

// BERT's "Chinese character" blocks (CJK ideographs), which it splits apart.
static bool is_cjk(int32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BertNormalizer in one pass per step: clean_text drops NUL, U+FFFD and
// "other" characters (Cc, Cf, Co but tab, CR, LF; not unassigned ones, which
// the reference keeps although its comment names Cn) and turns the
// remaining whitespace into spaces; CJK ideographs get a space either side;
// strip_accents is NFD then no nonspacing marks (Mn only, unlike
// StripAccents); lowercase as Lowercase.
static tpr_status bert(const tok_norm *nm, const char *in, size_t n, tok_buf *out) {
  tok_buf a = {0};
  tpr_status rc = TPR_OK;
  for (size_t i = 0; i < n && rc == TPR_OK;) {
    int32_t cp;
    i += (size_t)tok_utf8_next(in + i, n - i, &cp);
    char c[8];
    if (nm->clean_text) {
      utf8proc_category_t k = utf8proc_category(cp);
      bool other = k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CO ||
                   k == UTF8PROC_CATEGORY_CS;
      other = other != tok_hf_other_flip(cp);  // the reference's older tables
      if (cp == 0 || cp == 0xFFFD || (other && cp != '\t' && cp != '\n' && cp != '\r')) continue;
      if (tok_is_whitespace(cp)) cp = ' ';
    }
    bool pad = nm->chinese_chars && is_cjk(cp);
    if (pad) rc = tok_buf_put(&a, " ", 1);
    if (rc == TPR_OK) rc = tok_buf_put(&a, c, (size_t)tok_utf8_put(cp, c));
    if (pad && rc == TPR_OK) rc = tok_buf_put(&a, " ", 1);
  }
  const char *s = a.p ? a.p : "";
  size_t sn = a.n;
  tok_buf d = {0};
  if (rc == TPR_OK && nm->strip_accents) {
    rc = tok_nf_map(s, sn, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, &d);
    s = d.p ? d.p : "", sn = d.n;
  }
  for (size_t i = 0; i < sn && rc == TPR_OK;) {
    int32_t cp;
    i += (size_t)tok_utf8_next(s + i, sn - i, &cp);
    if (nm->strip_accents && tok_hf_is_mn(cp)) continue;
    char c[8];
    int cl;
    if (!nm->lowercase) cl = tok_utf8_put(cp, c);
    else if (cp == 0x130) cl = tok_utf8_put('i', c), cl += tok_utf8_put(0x307, c + cl);  // as Lowercase
    else cl = tok_utf8_put(utf8proc_tolower(cp), c);
    rc = tok_buf_put(out, c, (size_t)cl);
  }
  free(d.p);
  free(a.p);
  return rc;
}

static tpr_status apply(const tok_norm *nm, tok_run *run, const char *in, size_t n, tok_buf *out) {
  out->n = 0;
  switch (nm->kind) {
    case TOK_NORM_BERT:
      return bert(nm, in, n, out);
    case TOK_NORM_NMT:  // SentencePiece's nmt rules: some controls dropped, some spaces
      for (size_t i = 0; i < n;) {
        int32_t cp;
        int l = tok_utf8_next(in + i, n - i, &cp);
        i += (size_t)l;
        if ((cp >= 1 && cp <= 8) || cp == 0xB || (cp >= 0xE && cp <= 0x1F) || cp == 0x7F || cp == 0x8F || cp == 0x9F)
          continue;
        bool sp = cp == 9 || cp == 0xA || cp == 0xC || cp == 0xD || cp == 0x1680 || (cp >= 0x200B && cp <= 0x200F) ||
                  cp == 0x2028 || cp == 0x2029 || cp == 0x2581 || cp == 0xFEFF || cp == 0xFFFD;
        TPR_CHECK(sp ? tok_buf_put(out, " ", 1) : tok_buf_put(out, in + i - l, (size_t)l));
      }
      return TPR_OK;
    case TOK_NORM_PRECOMPILED:
      return nm->pc ? tok_precompiled_apply(nm, in, n, out) : tok_buf_put(out, in, n);
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD: {
      int opts = UTF8PROC_STABLE | (nm->kind == TOK_NORM_NFC || nm->kind == TOK_NORM_NFKC ? UTF8PROC_COMPOSE
                                                                                          : UTF8PROC_DECOMPOSE);
      if (nm->kind == TOK_NORM_NFKC || nm->kind == TOK_NORM_NFKD) opts |= UTF8PROC_COMPAT;
      return tok_nf_map(in, n, opts, out);
    }
    case TOK_NORM_PREPEND:
      if (n) TPR_CHECK(tok_buf_put(out, nm->str, strlen(nm->str)));  // the reference skips empty text
      return tok_buf_put(out, in, n);
    case TOK_NORM_REPLACE: {
      repl_ctx c = {in, nm->str, 0, out};
      TPR_CHECK(tok_regex_each(&nm->re, run, in, n, on_repl, &c));
      return tok_buf_put(out, in + c.prev, n - c.prev);
    }
    case TOK_NORM_STRIP: {
      size_t a = 0, b = n;
      int32_t cp;
      while (nm->left && a < b) {
        int l = tok_utf8_next(in + a, b - a, &cp);
        if (!tok_is_whitespace(cp)) break;
        a += (size_t)l;
      }
      while (nm->right && b > a) {
        size_t k = b - 1;
        while (k > a && (in[k] & 0xC0) == 0x80) k--;
        tok_utf8_next(in + k, b - k, &cp);
        if (!tok_is_whitespace(cp)) break;
        b = k;
      }
      return tok_buf_put(out, in + a, b - a);
    }
    case TOK_NORM_LOWERCASE:
    case TOK_NORM_STRIP_ACCENTS:
      for (size_t i = 0; i < n;) {
        int32_t cp;
        int l = tok_utf8_next(in + i, n - i, &cp);
        char c[8];
        int cl = 0;
        if (nm->kind == TOK_NORM_STRIP_ACCENTS) {
          // Drops every mark (Mn, Mc, Me), as the reference's filter does (with its tables).
          if (!tok_hf_is_mark(cp)) cl = tok_utf8_put(cp, c);
        } else if (cp == 0x130) {  // the one full lowercase mapping longer than a character
          cl = tok_utf8_put('i', c);
          cl += tok_utf8_put(0x307, c + cl);
        } else cl = tok_utf8_put(utf8proc_tolower(cp), c);
        TPR_CHECK(tok_buf_put(out, c, (size_t)cl));
        i += (size_t)l;
      }
      return TPR_OK;
  }
  return TPR_OK;
}

tpr_status tok_normalize(const tpr_tokenizer *t, tok_run *run, const char *in, size_t n, tok_buf *out) {
  out->n = 0;
  if (t->n_norms == 0) return tok_buf_put(out, in, n);
  tok_buf tmp = {0};
  tpr_status rc = TPR_OK;
  // Ping-pong between out and tmp so the last stage writes into out.
  const char *src = in;
  size_t sn = n;
  for (int i = 0; i < t->n_norms; i++) {
    tok_buf *dst = ((t->n_norms - 1 - i) % 2 == 0) ? out : &tmp;
    TPR_CHECK_GOTO(apply(&t->norms[i], run, src, sn, dst), rc, done);
    src = dst->p ? dst->p : "";
    sn = dst->n;
  }
done:
  free(tmp.p);
  return rc;
}

static tpr_status parse_one(tpr_tokenizer *t, const cJSON *j, tok_norm *nm) {
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
  const char *ty = cJSON_IsString(type) ? type->valuestring : "(none)";
  memset(nm, 0, sizeof *nm);
  if (!strcmp(ty, "NFC")) nm->kind = TOK_NORM_NFC;
  else if (!strcmp(ty, "NFD")) nm->kind = TOK_NORM_NFD;
  else if (!strcmp(ty, "NFKC")) nm->kind = TOK_NORM_NFKC;
  else if (!strcmp(ty, "NFKD")) nm->kind = TOK_NORM_NFKD;
  else if (!strcmp(ty, "Lowercase")) nm->kind = TOK_NORM_LOWERCASE;
  else if (!strcmp(ty, "StripAccents")) nm->kind = TOK_NORM_STRIP_ACCENTS;
  else if (!strcmp(ty, "Nmt")) nm->kind = TOK_NORM_NMT;
  else if (!strcmp(ty, "Precompiled")) {
    nm->kind = TOK_NORM_PRECOMPILED;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "precompiled_charsmap");
    if (cJSON_IsString(m) && m->valuestring[0]) return tok_precompiled_parse(t->file, m->valuestring, nm);
    if (!cJSON_IsNull(m) && !cJSON_IsString(m))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: normalizer Precompiled has no precompiled_charsmap", t->file);
    return TPR_OK;  // an empty charsmap changes nothing
  } else if (!strcmp(ty, "BertNormalizer")) {
    nm->kind = TOK_NORM_BERT;
    // Each flag defaults to true when absent; strip_accents null follows lowercase.
    nm->clean_text = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "clean_text"));
    nm->chinese_chars = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "handle_chinese_chars"));
    nm->lowercase = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "lowercase"));
    const cJSON *sa = cJSON_GetObjectItemCaseSensitive(j, "strip_accents");
    nm->strip_accents = cJSON_IsBool(sa) ? cJSON_IsTrue(sa) : nm->lowercase;
  }
  else if (!strcmp(ty, "Strip")) {
    nm->kind = TOK_NORM_STRIP;
    nm->left = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "strip_left"));
    nm->right = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "strip_right"));
  } else if (!strcmp(ty, "Prepend")) {
    nm->kind = TOK_NORM_PREPEND;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prepend");
    if (!cJSON_IsString(p)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: normalizer Prepend has no prepend string", t->file);
    nm->str = strdup(p->valuestring);
  } else if (!strcmp(ty, "Replace")) {
    nm->kind = TOK_NORM_REPLACE;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    if ((!cJSON_IsString(re) && !cJSON_IsString(str)) || !cJSON_IsString(c))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: normalizer Replace needs pattern.String or pattern.Regex and content",
                      t->file);
    nm->str = strdup(c->valuestring);
    TPR_CHECK(tok_regex_compile(t->file, "normalizer Replace",
                                cJSON_IsString(re) ? re->valuestring : str->valuestring, !cJSON_IsString(re),
                                &nm->re));
  } else return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: normalizer type '%s' is not supported", t->file, ty);
  if ((nm->kind == TOK_NORM_PREPEND || nm->kind == TOK_NORM_REPLACE) && !nm->str)
    return TPR_FAIL(TPR_ERR_OOM, "%s: normalizer string", t->file);
  return TPR_OK;
}

tpr_status tok_parse_normalizer(tpr_tokenizer *t, const void *json) {
  const cJSON *j = json;
  if (!j || cJSON_IsNull(j)) return TPR_OK;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
  bool seq = cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0;
  const cJSON *list = seq ? cJSON_GetObjectItemCaseSensitive(j, "normalizers") : NULL;
  if (seq && !cJSON_IsArray(list))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: normalizer Sequence has no normalizers array", t->file);
  int n = seq ? cJSON_GetArraySize(list) : 1;
  t->norms = calloc((size_t)n + 1, sizeof *t->norms);
  if (!t->norms) return TPR_FAIL(TPR_ERR_OOM, "%s: %d normalizers", t->file, n);
  for (int i = 0; i < n; i++) {
    const cJSON *e = seq ? cJSON_GetArrayItem(list, i) : j;
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(e, "type");
    if (cJSON_IsString(et) && !strcmp(et->valuestring, "Sequence"))
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: a nested normalizer Sequence is not supported", t->file);
    tpr_status rc = parse_one(t, e, &t->norms[t->n_norms]);
    t->n_norms++;  // counted even on failure so free releases what parse_one made
    TPR_CHECK(rc);
  }
  return TPR_OK;
}
