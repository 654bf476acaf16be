// Pre-tokenizers (Split, ByteLevel, Metaspace, UnicodeScripts, Sequence) and the PCRE2 regex
// wrapper they and the Replace normalizer share. The reference library runs
// these patterns with Oniguruma; PCRE2 with UTF + UCP gives \p{L}, \p{N}, \s
// and lookahead the same Unicode meaning.
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

// GPT-2's pattern, used by ByteLevel when use_regex is true.
static const char *GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

tpr_status tok_regex_compile(const char *file, const char *what, const char *pattern, bool literal, tok_regex *re) {
  int err;
  PCRE2_SIZE at;
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // UCP is invalid with LITERAL
  char *wide = NULL;  // \p{X} with the reference's newer code points (tok_unicode_compat.c)
  if (!literal) TPR_CHECK(tok_regex_widen(pattern, &wide));
  re->code = pcre2_compile((PCRE2_SPTR)(wide ? wide : pattern), PCRE2_ZERO_TERMINATED, opts, &err, &at, NULL);
  if (!re->code && wide)  // the error (and offset) of the file's own pattern
    re->code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &at, NULL);
  free(wide);
  if (!re->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: %s pattern does not compile at offset %zu: %s", file, what, (size_t)at,
                    (const char *)msg);
  }
  // JIT where the library has it; the interpreter gives the same matches.
  (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
  return TPR_OK;
}

void tok_regex_free(tok_regex *re) {
  if (re->code) pcre2_code_free(re->code);
  re->code = NULL;
}

tpr_status tok_run_init(tok_run *r) {
  memset(r, 0, sizeof *r);
  r->md = pcre2_match_data_create(32, NULL);
  r->mc = pcre2_match_context_create(NULL);
  // Long runs of whitespace recurse deeply in \s*[\r\n]+: a larger JIT stack.
  r->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
  if (!r->md || !r->mc) {
    tok_run_free(r);
    return TPR_FAIL(TPR_ERR_OOM, "tokenizer: PCRE2 match data");
  }
  if (r->js) pcre2_jit_stack_assign(r->mc, NULL, r->js);
  return TPR_OK;
}

void tok_run_free(tok_run *r) {
  if (r->md) pcre2_match_data_free(r->md);
  if (r->mc) pcre2_match_context_free(r->mc);
  if (r->js) pcre2_jit_stack_free(r->js);
  memset(r, 0, sizeof *r);
}

// The calling thread's state: made on first use, freed when the thread exits
// (the key's destructor; the main thread's lives until the process ends).
static pthread_key_t run_key;
static pthread_once_t run_once = PTHREAD_ONCE_INIT;
static bool run_key_ok;
static _Thread_local tok_run *thread_run;

static void run_destroy(void *p) {
  tok_run_free(p);
  free(p);
  thread_run = NULL;
}

static void run_key_create(void) { run_key_ok = pthread_key_create(&run_key, run_destroy) == 0; }

tok_run *tok_run_thread(void) {
  if (thread_run) return thread_run;
  pthread_once(&run_once, run_key_create);
  tok_run *r = malloc(sizeof *r);
  if (!r || !run_key_ok || tok_run_init(r) != TPR_OK) {
    free(r);
    TPR_FAIL(TPR_ERR_OOM, "tokenizer: PCRE2 match state");
    return NULL;
  }
  if (pthread_setspecific(run_key, r) != 0) {
    run_destroy(r);
    TPR_FAIL(TPR_ERR_OOM, "tokenizer: PCRE2 match state");
    return NULL;
  }
  thread_run = r;
  return r;
}

tpr_status tok_regex_each(const tok_regex *re, tok_run *run, const char *s, size_t n, tok_match_fn fn, void *ctx) {
  size_t pos = 0;
  while (pos <= n) {
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, run->md, run->mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return TPR_FAIL(TPR_ERR_INTERNAL, "tokenizer: regex match failed at byte %zu: %s", pos, (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(run->md);
    size_t st = ov[0], en = ov[1];
    TPR_CHECK(fn(ctx, st, en));
    if (en == st) {  // an empty match: step over one character
      if (en >= n) break;
      int32_t cp;
      pos = en + (size_t)tok_utf8_next(s + en, n - en, &cp);
    } else pos = en;
  }
  return TPR_OK;
}

// Grows one of a set of parallel arrays to cap elements; on failure *arr is
// left as it was (the caller frees it), so each array of a set can be tried.
static bool grow_array(void **arr, size_t cap, size_t elem) {
  void *p = realloc(*arr, cap * elem);
  if (p) *arr = p;
  return p != NULL;
}

tpr_status tok_words_push(tok_words *w, size_t off, size_t len) {
  if (w->n == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 64;
    bool ok = grow_array((void **)&w->off, cap, sizeof *w->off);
    ok &= grow_array((void **)&w->len, cap, sizeof *w->len);
    if (!ok) return TPR_FAIL(TPR_ERR_OOM, "tokenizer: %zu words", cap);
    w->cap = cap;
  }
  w->off[w->n] = off, w->len[w->n] = len;
  w->n++;
  return TPR_OK;
}

void tok_words_free(tok_words *w) {
  free(w->text.p), free(w->off), free(w->len);
  memset(w, 0, sizeof *w);
}

// Pieces of a buffer: words plus whether each starts the original text
// (Metaspace's prepend_scheme "first").
typedef struct pieces {
  tok_words w;
  bool *first;
  size_t first_cap;
} pieces;

static tpr_status piece_push(pieces *p, size_t off, size_t len, bool first) {
  if (len == 0) return TPR_OK;  // the reference drops empty splits
  TPR_CHECK(tok_words_push(&p->w, off, len));
  if (p->w.n > p->first_cap) {
    size_t cap = p->w.cap;
    bool *f = realloc(p->first, cap);
    if (!f) return TPR_FAIL(TPR_ERR_OOM, "tokenizer: %zu pieces", cap);
    p->first = f, p->first_cap = cap;
  }
  p->first[p->w.n - 1] = first;
  return TPR_OK;
}

typedef struct split_ctx {
  size_t prev, n_m;
  size_t *st, *en;
  bool *is_m;
  size_t cap;
} split_ctx;

static tpr_status split_push(split_ctx *c, size_t st, size_t en, bool m) {
  if (c->n_m == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 64;
    bool ok = grow_array((void **)&c->st, cap, sizeof *c->st);
    ok &= grow_array((void **)&c->en, cap, sizeof *c->en);
    ok &= grow_array((void **)&c->is_m, cap, sizeof *c->is_m);
    if (!ok) return TPR_FAIL(TPR_ERR_OOM, "tokenizer: %zu splits", cap);
    c->cap = cap;
  }
  c->st[c->n_m] = st, c->en[c->n_m] = en, c->is_m[c->n_m] = m;
  c->n_m++;
  return TPR_OK;
}

static tpr_status on_match(void *ctx, size_t st, size_t en) {
  split_ctx *c = ctx;
  if (c->prev != st) TPR_CHECK(split_push(c, c->prev, st, false));
  TPR_CHECK(split_push(c, st, en, true));
  c->prev = en;
  return TPR_OK;
}

// Applies a SplitDelimiterBehavior to the (offsets, is_match) list in c,
// mirroring the reference's fold, and pushes the resulting pieces.
static tpr_status split_fold(split_ctx *c, tok_split_behavior beh, bool invert, size_t off, bool first,
                             pieces *out) {
  if (invert)
    for (size_t i = 0; i < c->n_m; i++) c->is_m[i] = !c->is_m[i];
  size_t k = 0;  // merged splits written in place
  bool prev_m = false;
  switch (beh) {
    case TOK_SPLIT_ISOLATED: k = c->n_m; break;
    case TOK_SPLIT_REMOVED:
      for (size_t i = 0; i < c->n_m; i++)
        if (!c->is_m[i]) c->st[k] = c->st[i], c->en[k] = c->en[i], k++;
      break;
    case TOK_SPLIT_MERGED_PREV:
      for (size_t i = 0; i < c->n_m; i++) {
        if (c->is_m[i] && !prev_m && k > 0) c->en[k - 1] = c->en[i];
        else c->st[k] = c->st[i], c->en[k] = c->en[i], k++;
        prev_m = c->is_m[i];
      }
      break;
    case TOK_SPLIT_MERGED_NEXT:  // the same fold from the right
      for (size_t i = c->n_m; i-- > 0;) {
        size_t j = c->n_m - 1 - k;  // write from the end, in place
        if (c->is_m[i] && !prev_m && k > 0) c->st[j + 1] = c->st[i];
        else c->st[j] = c->st[i], c->en[j] = c->en[i], k++;
        prev_m = c->is_m[i];
      }
      memmove(c->st, c->st + (c->n_m - k), k * sizeof *c->st);
      memmove(c->en, c->en + (c->n_m - k), k * sizeof *c->en);
      break;
    case TOK_SPLIT_CONTIGUOUS:
      for (size_t i = 0; i < c->n_m; i++) {
        if (c->is_m[i] == prev_m && k > 0) c->en[k - 1] = c->en[i];
        else c->st[k] = c->st[i], c->en[k] = c->en[i], k++;
        prev_m = c->is_m[i];
      }
      break;
  }
  for (size_t i = 0; i < k; i++)
    TPR_CHECK(piece_push(out, off + c->st[i], c->en[i] - c->st[i], first && c->st[i] == 0));
  return TPR_OK;
}

// One piece split by a pattern.
static tpr_status split_piece(const tok_regex *re, tok_run *run, tok_split_behavior beh, bool invert,
                              const char *buf, size_t off, size_t len, bool first, split_ctx *c, pieces *out) {
  c->prev = 0, c->n_m = 0;
  TPR_CHECK(tok_regex_each(re, run, buf + off, len, on_match, c));
  if (c->prev != len) TPR_CHECK(split_push(c, c->prev, len, false));
  return split_fold(c, beh, invert, off, first, out);
}

static bool in_class(const tok_pre *p, int32_t cp) {
  switch (p->cc) {
    case TOK_CC_DIGIT: return tok_is_numeric(cp);
    case TOK_CC_PUNCT: return tok_is_punct(cp);
    case TOK_CC_SPACE: return tok_is_whitespace(cp);
    case TOK_CC_DELIM: return cp == p->delim;
  }
  return false;
}

// One piece split by a character class: each matching character is a match
// of its own (the reference's split by a char predicate), then the fold.
static tpr_status split_chars(const tok_pre *p, const char *buf, size_t off, size_t len, bool first, split_ctx *c,
                              pieces *out) {
  c->prev = 0, c->n_m = 0;
  const char *s = buf + off;
  for (size_t i = 0; i < len;) {
    int32_t cp;
    size_t l = (size_t)tok_utf8_next(s + i, len - i, &cp);
    if (in_class(p, cp)) TPR_CHECK(on_match(c, i, i + l));
    i += l;
  }
  if (c->prev != len) TPR_CHECK(split_push(c, c->prev, len, false));
  return split_fold(c, p->behavior, false, off, first, out);
}

// Whitespace (the regex \w+|[^\w\s]+, keeping the matches) and
// BertPreTokenizer (split at whitespace, removed, and around each punctuation
// character) in one pass over the characters.
static tpr_status split_words(bool bert, const char *buf, size_t off, size_t len, bool first, pieces *out) {
  const char *s = buf + off;
  size_t st = 0;
  int cls = 0;  // of the run since st: 0 none, 1 word, 2 other
  for (size_t i = 0; i < len;) {
    int32_t cp;
    size_t l = (size_t)tok_utf8_next(s + i, len - i, &cp);
    int k = tok_is_whitespace(cp) ? 0 : bert ? (tok_is_punct(cp) ? 3 : 1) : tok_is_word_char(cp) ? 1 : 2;
    if (k != cls || k == 3) {  // a punctuation character is always its own piece under Bert
      if (cls) TPR_CHECK(piece_push(out, off + st, i - st, first && st == 0));
      st = i, cls = k;
    }
    i += l;
  }
  if (cls) TPR_CHECK(piece_push(out, off + st, len - st, first && st == 0));
  return TPR_OK;
}

// UnicodeScripts: a new piece before each character with a script (not Any)
// other than the last one seen; Any characters stay in the piece they are in,
// and those before the first character with a script are dropped, as the
// reference's split points start at that character.
static tpr_status split_scripts(const char *buf, size_t off, size_t len, bool first, pieces *out) {
  const char *s = buf + off;
  size_t st = 0;
  int last = TOK_SCRIPT_ANY;
  bool open = false;
  for (size_t i = 0; i < len;) {
    int32_t cp;
    size_t l = (size_t)tok_utf8_next(s + i, len - i, &cp);
    int sc = tok_script(cp);
    if (sc != TOK_SCRIPT_ANY && sc != last) {
      if (open) TPR_CHECK(piece_push(out, off + st, i - st, first && st == 0));
      st = i, open = true, last = sc;
    }
    i += l;
  }
  if (open) TPR_CHECK(piece_push(out, off + st, len - st, first && st == 0));
  return TPR_OK;
}

// ByteLevel with steps after it: the pieces from index `from` rewritten in
// its alphabet, as the reference hands them on.
static tpr_status map_bytes(pieces *b, size_t from, size_t text_from) {
  tok_buf m = {0};
  tpr_status rc = TPR_OK;
  for (size_t i = from; i < b->w.n && rc == TPR_OK; i++) {
    size_t o = b->w.off[i], l = b->w.len[i];
    b->w.off[i] = text_from + m.n;
    char c[4];
    for (size_t k = 0; k < l && rc == TPR_OK; k++)
      rc = tok_buf_put(&m, c, (size_t)tok_utf8_put(tok_byte_char((unsigned char)b->w.text.p[o + k]), c));
    b->w.len[i] = text_from + m.n - b->w.off[i];
  }
  if (rc == TPR_OK) {
    b->w.text.n = text_from;
    rc = tok_buf_put(&b->w.text, m.p, m.n);
  }
  free(m.p);
  return rc;
}

// Back from the ByteLevel alphabet to bytes (the model maps bytes itself).
static tpr_status unmap_bytes(tok_buf *out, const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t l = (size_t)tok_utf8_next(s + i, n - i, &cp);
    int b = tok_char_to_byte(cp);
    unsigned char ch = (unsigned char)b;
    TPR_CHECK(b >= 0 ? tok_buf_put(out, &ch, 1) : tok_buf_put(out, s + i, l));
    i += l;
  }
  return TPR_OK;
}

static bool starts_with(const char *s, size_t n, const char *p) {
  size_t l = strlen(p);
  return n >= l && memcmp(s, p, l) == 0;
}

// Metaspace on one piece: ' ' -> replacement, the prefix by the prepend
// scheme, then (split) a new piece at each replacement.
static tpr_status metaspace_piece(const tok_pre *p, const char *s, size_t n, bool first, pieces *out) {
  tok_buf *b = &out->w.text;
  size_t start = b->n, rl = strlen(p->repl);
  bool starts = starts_with(s, n, p->repl) || (n > 0 && s[0] == ' ');
  if (!starts && (p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && first)))
    TPR_CHECK(tok_buf_put(b, p->repl, rl));
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && s[j] != ' ') j++;
    TPR_CHECK(tok_buf_put(b, s + i, j - i));
    if (j < n) {
      TPR_CHECK(tok_buf_put(b, p->repl, rl));
      j++;
    }
    i = j;
  }
  if (!p->split) return piece_push(out, start, b->n - start, first);
  size_t pstart = start;
  for (size_t i = start; i < b->n;) {
    if (i > pstart && starts_with(b->p + i, b->n - i, p->repl)) {
      TPR_CHECK(piece_push(out, pstart, i - pstart, first && pstart == start));
      pstart = i;
    }
    i++;  // byte steps: the replacement starts with a lead byte
  }
  return piece_push(out, pstart, b->n - pstart, first && pstart == start);
}

tpr_status tok_pretokenize(const tpr_tokenizer *t, tok_run *run, const char *s, size_t n, bool at_start,
                           tok_words *w) {
  pieces a = {0}, b = {0};
  split_ctx sc = {0};
  tpr_status rc = TPR_OK;
  TPR_CHECK_GOTO(tok_buf_put(&a.w.text, s, n), rc, done);
  TPR_CHECK_GOTO(piece_push(&a, 0, n, at_start), rc, done);
  for (int k = 0; k < t->n_pres; k++) {
    const tok_pre *p = &t->pres[k];
    b.w.n = 0, b.w.text.n = 0;
    bool same_buf = true;
    for (size_t i = 0; i < a.w.n; i++) {
      const char *ps = a.w.text.p + a.w.off[i];
      size_t pl = a.w.len[i];
      if (p->kind == TOK_PRE_SPLIT) {
        TPR_CHECK_GOTO(split_piece(&p->re, run, p->behavior, p->invert, a.w.text.p, a.w.off[i], pl, a.first[i], &sc,
                                   &b), rc, done);
      } else if (p->kind == TOK_PRE_CHARS) {
        TPR_CHECK_GOTO(split_chars(p, a.w.text.p, a.w.off[i], pl, a.first[i], &sc, &b), rc, done);
      } else if (p->kind == TOK_PRE_WHITESPACE || p->kind == TOK_PRE_BERT) {
        TPR_CHECK_GOTO(split_words(p->kind == TOK_PRE_BERT, a.w.text.p, a.w.off[i], pl, a.first[i], &b), rc, done);
      } else if (p->kind == TOK_PRE_SCRIPTS) {
        TPR_CHECK_GOTO(split_scripts(a.w.text.p, a.w.off[i], pl, a.first[i], &b), rc, done);
      } else if (p->kind == TOK_PRE_BYTELEVEL) {
        same_buf = false;
        size_t off = b.w.text.n, from = b.w.n;
        if (p->add_prefix_space && !(pl > 0 && ps[0] == ' ')) TPR_CHECK_GOTO(tok_buf_put(&b.w.text, " ", 1), rc, done);
        TPR_CHECK_GOTO(tok_buf_put(&b.w.text, ps, pl), rc, done);
        if (p->use_regex) {
          TPR_CHECK_GOTO(split_piece(&p->re, run, TOK_SPLIT_ISOLATED, false, b.w.text.p, off, b.w.text.n - off,
                                     a.first[i], &sc, &b), rc, done);
        } else TPR_CHECK_GOTO(piece_push(&b, off, b.w.text.n - off, a.first[i]), rc, done);
        if (p->map_bytes) TPR_CHECK_GOTO(map_bytes(&b, from, off), rc, done);
      } else {
        same_buf = false;
        TPR_CHECK_GOTO(metaspace_piece(p, ps, pl, a.first[i], &b), rc, done);
      }
    }
    if (same_buf) TPR_CHECK_GOTO(tok_buf_put(&b.w.text, a.w.text.p, a.w.text.n), rc, done);
    pieces tmp = a;
    a = b, b = tmp;
  }
  for (size_t i = 0; i < a.w.n; i++) {
    size_t off = w->text.n;
    if (t->byte_map) TPR_CHECK_GOTO(unmap_bytes(&w->text, a.w.text.p + a.w.off[i], a.w.len[i]), rc, done);
    else TPR_CHECK_GOTO(tok_buf_put(&w->text, a.w.text.p + a.w.off[i], a.w.len[i]), rc, done);
    TPR_CHECK_GOTO(tok_words_push(w, off, w->text.n - off), rc, done);
  }
done:
  tok_words_free(&a.w), tok_words_free(&b.w);
  free(a.first), free(b.first);
  free(sc.st), free(sc.en), free(sc.is_m);
  return rc;
}

static tpr_status parse_behavior(tpr_tokenizer *t, const char *ty, const cJSON *j, tok_pre *p) {
  const cJSON *beh = cJSON_GetObjectItemCaseSensitive(j, "behavior");
  const char *b = cJSON_IsString(beh) ? beh->valuestring : "";
  if (!strcmp(b, "Isolated")) p->behavior = TOK_SPLIT_ISOLATED;
  else if (!strcmp(b, "Removed")) p->behavior = TOK_SPLIT_REMOVED;
  else if (!strcmp(b, "MergedWithPrevious")) p->behavior = TOK_SPLIT_MERGED_PREV;
  else if (!strcmp(b, "MergedWithNext")) p->behavior = TOK_SPLIT_MERGED_NEXT;
  else if (!strcmp(b, "Contiguous")) p->behavior = TOK_SPLIT_CONTIGUOUS;
  else if (!beh && !strcmp(ty, "Punctuation")) p->behavior = TOK_SPLIT_ISOLATED;  // its default
  else return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: pre_tokenizer %s behavior '%s' is not supported", t->file, ty, b);
  return TPR_OK;
}

static tpr_status parse_one(tpr_tokenizer *t, const cJSON *j, tok_pre *p) {
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
  const char *ty = cJSON_IsString(type) ? type->valuestring : "(none)";
  memset(p, 0, sizeof *p);
  if (strcmp(ty, "Split") == 0) {
    p->kind = TOK_PRE_SPLIT;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    if (!cJSON_IsString(re) && !cJSON_IsString(str))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: pre_tokenizer Split has no pattern.Regex or pattern.String", t->file);
    TPR_CHECK(parse_behavior(t, ty, j, p));
    p->invert = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "invert"));
    return tok_regex_compile(t->file, "pre_tokenizer Split", cJSON_IsString(re) ? re->valuestring : str->valuestring,
                             !cJSON_IsString(re), &p->re);
  }
  if (strcmp(ty, "ByteLevel") == 0) {
    p->kind = TOK_PRE_BYTELEVEL;
    p->add_prefix_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space"));
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(j, "use_regex");
    p->use_regex = !cJSON_IsFalse(ur);  // the reference's default is true
    if (p->use_regex) TPR_CHECK(tok_regex_compile(t->file, "ByteLevel", GPT2_PATTERN, false, &p->re));
    return TPR_OK;
  }
  if (strcmp(ty, "Metaspace") == 0) {
    p->kind = TOK_PRE_METASPACE;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "replacement");
    const char *rs = cJSON_IsString(r) ? r->valuestring : "\xE2\x96\x81";
    if (strlen(rs) == 0 || strlen(rs) >= sizeof p->repl || tok_utf8_valid_prefix(rs, strlen(rs)) != strlen(rs))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: Metaspace replacement must be one character", t->file);
    strcpy(p->repl, rs);
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");  // older files
    const char *s = cJSON_IsString(ps) ? ps->valuestring : (cJSON_IsFalse(aps) ? "never" : "always");
    if (!strcmp(s, "always")) p->prepend = TOK_PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) p->prepend = TOK_PREPEND_FIRST;
    else if (!strcmp(s, "never")) p->prepend = TOK_PREPEND_NEVER;
    else return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: Metaspace prepend_scheme '%s' is not supported", t->file, s);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "split");
    p->split = !cJSON_IsFalse(sp);
    return TPR_OK;
  }
  p->kind = TOK_PRE_CHARS;
  if (!strcmp(ty, "Digits")) {
    p->cc = TOK_CC_DIGIT;
    bool each = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "individual_digits"));
    p->behavior = each ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS;
    return TPR_OK;
  }
  if (!strcmp(ty, "Punctuation")) {
    p->cc = TOK_CC_PUNCT;
    return parse_behavior(t, ty, j, p);
  }
  if (!strcmp(ty, "WhitespaceSplit")) {
    p->cc = TOK_CC_SPACE, p->behavior = TOK_SPLIT_REMOVED;
    return TPR_OK;
  }
  if (!strcmp(ty, "CharDelimiterSplit")) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "delimiter");
    size_t dl = cJSON_IsString(d) ? strlen(d->valuestring) : 0;
    if (dl == 0 || tok_utf8_valid_prefix(d->valuestring, dl) != dl ||
        (size_t)tok_utf8_next(d->valuestring, dl, &p->delim) != dl)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: CharDelimiterSplit delimiter must be one character", t->file);
    p->cc = TOK_CC_DELIM, p->behavior = TOK_SPLIT_REMOVED;
    return TPR_OK;
  }
  if (!strcmp(ty, "Whitespace")) {
    p->kind = TOK_PRE_WHITESPACE;
    return TPR_OK;
  }
  if (!strcmp(ty, "UnicodeScripts")) {
    p->kind = TOK_PRE_SCRIPTS;
    return TPR_OK;
  }
  if (!strcmp(ty, "BertPreTokenizer")) {
    p->kind = TOK_PRE_BERT;
    return TPR_OK;
  }
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: pre_tokenizer type '%s' is not supported", t->file, ty);
}

tpr_status tok_parse_pretokenizer(tpr_tokenizer *t, const void *json) {
  const cJSON *j = json;
  if (!j || cJSON_IsNull(j)) return TPR_OK;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
  const cJSON *list = j;
  int n = 1;
  bool seq = cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0;
  if (seq) {
    list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
    if (!cJSON_IsArray(list))
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: pre_tokenizer Sequence has no pretokenizers array", t->file);
    n = cJSON_GetArraySize(list);
  }
  t->pres = calloc((size_t)n + 1, sizeof *t->pres);
  if (!t->pres) return TPR_FAIL(TPR_ERR_OOM, "%s: %d pre-tokenizers", t->file, n);
  bool metaspace = false;
  for (int i = 0; i < n; i++) {
    const cJSON *e = seq ? cJSON_GetArrayItem(list, i) : j;
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(e, "type");
    if (cJSON_IsString(et) && !strcmp(et->valuestring, "Sequence"))
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: a nested pre_tokenizer Sequence is not supported", t->file);
    tpr_status rc = parse_one(t, e, &t->pres[t->n_pres]);
    t->n_pres++;  // counted even on failure so free releases what parse_one made
    TPR_CHECK(rc);
    tok_pre *p = &t->pres[t->n_pres - 1];
    metaspace |= p->kind == TOK_PRE_METASPACE;
    if (p->kind != TOK_PRE_BYTELEVEL) continue;
    if (t->byte_level)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: more than one ByteLevel pre_tokenizer is not supported", t->file);
    t->byte_level = true;
    // Steps after ByteLevel see its alphabet (digits and ASCII letters are
    // themselves, a space is 'Ġ'): map there, and back to bytes at the end.
    p->map_bytes = t->byte_map = i + 1 < n;
  }
  // Metaspace inserts characters outside the byte alphabet.
  if (metaspace && t->byte_level)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: pre_tokenizer Metaspace together with ByteLevel is not supported",
                    t->file);
  return TPR_OK;
}
