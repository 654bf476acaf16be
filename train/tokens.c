// Token streams: the spec's items expanded into a list of files, each
// opened (train/npy.h, memory-mapped), checked, and placed at its start
// offset in the concatenation.
#define _GNU_SOURCE  // strdup, strndup
#include "tokens.h"

#include <cjson/cJSON.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/file_io.h"
#include "train/npy.h"

typedef struct shard {
  tpr_npy *tokens, *mask;  // mask NULL unless asked for
  int64_t start;           // offset of the file's first token in the stream
} shard;

struct tpr_tokens {
  char *spec;
  shard *s;
  int n, cap;
  int64_t len;
  bool masks;
  bool docs_wanted, docs;  // docs: every file's document offsets were found
  int64_t *starts;         // (n_starts) stream positions where a document starts, ascending
  int64_t n_starts, cap_starts;
};

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !memcmp(s + a - b, suffix, b);
}

static bool is_token_dtype(const char *d) {
  return !strcmp(d, "<u2") || !strcmp(d, "<u4") || !strcmp(d, "<i4") || !strcmp(d, "<i8");
}

// A loss mask beside its token file: '|u1', one value per token, each 0 or 1.
static tpr_status open_mask(const char *path, const tpr_npy *tokens, tpr_npy **out) {
  tpr_status rc = tpr_npy_open(path, out);
  if (rc != TPR_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tpr_last_error());
    return TPR_FAIL(rc, "the loss mask of %s (for --sft): %s", tpr_npy_path(tokens), why);
  }
  const tpr_npy *m = *out;
  if (strcmp(tpr_npy_descr(m), "|u1"))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: a loss mask must be '|u1', this one is '%s'", path, tpr_npy_descr(m));
  if (tpr_npy_len(m) != tpr_npy_len(tokens))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: %lld mask values for the %lld tokens of %s", path,
                    (long long)tpr_npy_len(m), (long long)tpr_npy_len(tokens), tpr_npy_path(tokens));
  for (int64_t i = 0; i < tpr_npy_len(m); i++) {
    int64_t v;
    TPR_CHECK(tpr_npy_get(m, i, &v));
    if (v > 1)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: mask value %lld at position %lld (want 0 or 1)", path, (long long)v,
                      (long long)i);
  }
  return TPR_OK;
}

// A file's document offsets ('<i8', shape (documents + 1,): 0, the starts,
// its token count; non-decreasing), appended to t->starts as stream
// positions (empty documents start nowhere).
static tpr_status add_docs(tpr_tokens *t, const char *path, int64_t file_start, int64_t file_len) {
  tpr_npy *d = NULL;
  TPR_CHECK(tpr_npy_open(path, &d));
  int64_t n = tpr_npy_len(d), prev = 0, v = 0;
  tpr_status rc = strcmp(tpr_npy_descr(d), "<i8")
                      ? TPR_FAIL(TPR_ERR_FORMAT, "%s: document offsets must be '<i8', this is '%s'", path,
                                 tpr_npy_descr(d))
                  : n < 1 ? TPR_FAIL(TPR_ERR_FORMAT, "%s: no document offsets", path)
                          : TPR_OK;
  for (int64_t k = 0; rc == TPR_OK && k < n; k++) {
    if ((rc = tpr_npy_get(d, k, &v)) != TPR_OK) break;
    if ((k == 0 && v != 0) || v < prev || v > file_len || (k == n - 1 && v != file_len)) {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: offset %lld at %lld (want 0 first, non-decreasing, %lld last: the tokens "
                    "of its shard)", path, (long long)v, (long long)k, (long long)file_len);
      break;
    }
    if (k < n - 1 && (k == 0 || v > prev)) {  // a document starts here (the first always)
      if (t->n_starts == t->cap_starts) {
        int64_t cap = t->cap_starts ? 2 * t->cap_starts : 1024;
        int64_t *s = realloc(t->starts, (size_t)cap * sizeof *s);
        if (!s) {
          rc = TPR_FAIL(TPR_ERR_OOM, "%s: out of memory", path);
          break;
        }
        t->starts = s, t->cap_starts = cap;
      }
      if (t->n_starts == 0 || t->starts[t->n_starts - 1] < file_start + v) t->starts[t->n_starts++] = file_start + v;
    }
    prev = v;
  }
  tpr_npy_close(d);
  return rc;
}

// Opens one token file (and its mask) and appends it. want_descr: the
// index's dtype, or NULL; want_len: the index's token count, or -1.
static tpr_status add_file(tpr_tokens *t, const char *path, const char *mask_path, const char *docs_path,
                           const char *want_descr, int64_t want_len) {
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 8;
    shard *s = realloc(t->s, (size_t)cap * sizeof *s);
    if (!s) return TPR_FAIL(TPR_ERR_OOM, "%s: out of memory", path);
    t->s = s, t->cap = cap;
  }
  shard *sh = &t->s[t->n];
  *sh = (shard){0};
  tpr_status rc = tpr_npy_open(path, &sh->tokens);
  if (rc == TPR_OK && !is_token_dtype(tpr_npy_descr(sh->tokens)))
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: token dtype '%s' (want '<u2', '<u4', '<i4' or '<i8')", path,
                  tpr_npy_descr(sh->tokens));
  if (rc == TPR_OK && want_descr && strcmp(tpr_npy_descr(sh->tokens), want_descr))
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: dtype '%s', but its index says '%s'", path, tpr_npy_descr(sh->tokens),
                  want_descr);
  if (rc == TPR_OK && want_len >= 0 && tpr_npy_len(sh->tokens) != want_len)
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: shape (%lld,), but its index says %lld tokens", path,
                  (long long)tpr_npy_len(sh->tokens), (long long)want_len);
  if (rc == TPR_OK && t->masks) rc = open_mask(mask_path, sh->tokens, &sh->mask);
  if (rc == TPR_OK && t->docs_wanted && t->docs) {
    if (docs_path && access(docs_path, F_OK) == 0) rc = add_docs(t, docs_path, t->len, tpr_npy_len(sh->tokens));
    else t->docs = false;  // one file without offsets: the stream has none
  }
  if (rc != TPR_OK) {
    tpr_npy_close(sh->tokens);
    tpr_npy_close(sh->mask);
    return rc;
  }
  sh->start = t->len;
  t->len += tpr_npy_len(sh->tokens);
  t->n++;
  return TPR_OK;
}

// X.npy's mask: X.mask.npy, its document offsets X.docs.npy (a name
// without .npy gets .mask.npy / .docs.npy appended).
static tpr_status add_npy(tpr_tokens *t, const char *path) {
  size_t n = strlen(path) - (ends_with(path, ".npy") ? 4 : 0);
  char *mask = malloc(n + 10), *docs = malloc(n + 10);
  tpr_status rc = mask && docs ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "%s: out of memory", path);
  if (rc == TPR_OK) {
    snprintf(mask, n + 10, "%.*s.mask.npy", (int)n, path);
    snprintf(docs, n + 10, "%.*s.docs.npy", (int)n, path);
    rc = add_file(t, path, mask, docs, NULL, -1);
  }
  free(mask), free(docs);
  return rc;
}

static tpr_status add_glob(tpr_tokens *t, const char *pattern) {
  glob_t g;
  int r = glob(pattern, GLOB_ERR, NULL, &g);  // sorted: no GLOB_NOSORT
  if (r == GLOB_NOMATCH) return TPR_FAIL(TPR_ERR_INVALID_ARG, "data pattern '%s' matches no file", pattern);
  if (r != 0) {
    globfree(&g);
    return TPR_FAIL(TPR_ERR_IO, "data pattern '%s': %s", pattern, r == GLOB_NOSPACE ? "out of memory" : "read error");
  }
  tpr_status rc = TPR_OK;
  int used = 0;
  for (size_t i = 0; rc == TPR_OK && i < g.gl_pathc; i++) {
    const char *p = g.gl_pathv[i];
    if (ends_with(p, ".mask.npy") || ends_with(p, ".docs.npy")) continue;  // a shard's companions
    rc = add_npy(t, p);
    used++;
  }
  globfree(&g);
  if (rc == TPR_OK && !used)
    rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "data pattern '%s' matches only .mask.npy / .docs.npy files", pattern);
  return rc;
}

// ---- the index (PREFIX.json) ---------------------------------------------

static const cJSON *key(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

// A file name inside the index: a plain name, resolved in the index's folder.
static tpr_status index_file(const char *index, const cJSON *v, const char *what, int i, char **out) {
  *out = NULL;
  if (!cJSON_IsString(v) || !v->valuestring[0])
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: shard %d has no \"%s\" string", index, i, what);
  if (strchr(v->valuestring, '/'))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: shard %d's %s '%s' is not a plain file name", index, i, what,
                    v->valuestring);
  const char *slash = strrchr(index, '/');
  size_t dl = slash ? (size_t)(slash - index + 1) : 0;
  size_t n = dl + strlen(v->valuestring) + 1;
  if (!(*out = malloc(n))) return TPR_FAIL(TPR_ERR_OOM, "%s: out of memory", index);
  snprintf(*out, n, "%.*s%s", (int)dl, index, v->valuestring);
  return TPR_OK;
}

static tpr_status add_split(tpr_tokens *t, const char *index, const cJSON *root, const char *split) {
  const cJSON *f = key(root, "format"), *ver = key(root, "version"), *dt = key(root, "dtype");
  if (!cJSON_IsString(f) || strcmp(f->valuestring, "tpr-token-shards"))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"format\" is %s, want \"tpr-token-shards\"", index,
                    cJSON_IsString(f) ? f->valuestring : "missing or not a string");
  if (!cJSON_IsNumber(ver) || ver->valuedouble != 1)
    return cJSON_IsNumber(ver) ? TPR_FAIL(TPR_ERR_FORMAT, "%s: \"version\" %g is not supported (want 1)", index,
                                          ver->valuedouble)
                               : TPR_FAIL(TPR_ERR_FORMAT, "%s: \"version\" is missing or not a number", index);
  const char *descr = NULL;
  if (cJSON_IsString(dt) && !strcmp(dt->valuestring, "uint16")) descr = "<u2";
  else if (cJSON_IsString(dt) && !strcmp(dt->valuestring, "uint32")) descr = "<u4";
  else return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"dtype\" must be \"uint16\" or \"uint32\"", index);
  const cJSON *sp = key(key(root, "splits"), split);
  if (!cJSON_IsObject(sp)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: no split \"%s\" under \"splits\"", index, split);
  const cJSON *shards = key(sp, "shards"), *total = key(sp, "tokens");
  if (!cJSON_IsArray(shards)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: split \"%s\" has no \"shards\" list", index, split);
  if (cJSON_GetArraySize(shards) == 0 || (cJSON_IsNumber(total) && total->valuedouble == 0))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: split \"%s\" is empty (no tokens)", index, split);
  int64_t before = t->len;
  int i = 0;
  for (const cJSON *e = shards->child; e; e = e->next, i++) {
    const cJSON *n = key(e, "tokens");
    if (!cJSON_IsNumber(n) || n->valuedouble < 0)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: shard %d of split \"%s\" has no \"tokens\" count", index, i, split);
    char *tok = NULL, *mask = NULL, *docs = NULL;
    tpr_status rc = index_file(index, key(e, "tokens_file"), "tokens_file", i, &tok);
    if (rc == TPR_OK && t->docs_wanted && key(e, "docs_file")) rc = index_file(index, key(e, "docs_file"), "docs_file", i, &docs);
    if (rc == TPR_OK && t->masks && !key(e, "mask_file"))
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: shard %d has no \"mask_file\" (an index without \"chat\" has no loss "
                    "masks), and --sft needs them", index, i);
    if (rc == TPR_OK && t->masks) rc = index_file(index, key(e, "mask_file"), "mask_file", i, &mask);
    if (rc == TPR_OK && (rc = add_file(t, tok, mask, docs, descr, (int64_t)n->valuedouble)) != TPR_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", tpr_last_error());
      rc = TPR_FAIL(rc, "%s (shard %d of split \"%s\" of %s)", why, i, split, index);
    }
    free(tok), free(mask), free(docs);
    TPR_CHECK(rc);
  }
  if (cJSON_IsNumber(total) && (int64_t)total->valuedouble != t->len - before)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: split \"%s\" says %lld tokens, its shards hold %lld", index, split,
                    (long long)total->valuedouble, (long long)(t->len - before));
  return TPR_OK;
}

// item: PREFIX.json, optionally ":train" / ":val".
static tpr_status add_index(tpr_tokens *t, const char *item, const char *split) {
  char *path = strdup(item);
  if (!path) return TPR_FAIL(TPR_ERR_OOM, "%s: out of memory", item);
  char *colon = strrchr(path, ':');
  if (colon && ends_with(path, ":train")) *colon = 0, split = "train";
  else if (colon && ends_with(path, ":val")) *colon = 0, split = "val";
  else if (!ends_with(path, ".json")) {
    tpr_status rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "data '%s': unknown split '%s' (want PREFIX.json, PREFIX.json:train "
                             "or PREFIX.json:val)", item, colon ? colon + 1 : "");
    free(path);
    return rc;
  }
  uint8_t *bytes = NULL;
  size_t len = 0;
  tpr_status rc = tpr_file_read(path, &bytes, &len);
  cJSON *root = rc == TPR_OK ? cJSON_ParseWithLength((const char *)bytes, len) : NULL;
  if (rc == TPR_OK && !cJSON_IsObject(root))
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: not a JSON object (a token-shard index)", path);
  if (rc == TPR_OK) rc = add_split(t, path, root, split);
  cJSON_Delete(root);
  free(bytes);
  free(path);
  return rc;
}

// ---- the stream ------------------------------------------------------------

static tpr_status add_item(tpr_tokens *t, const char *item, const char *split) {
  if (!*item) return TPR_FAIL(TPR_ERR_INVALID_ARG, "data '%s': an empty item in the list", t->spec);
  if (ends_with(item, ".json") || strstr(item, ".json:")) return add_index(t, item, split);
  if (strpbrk(item, "*?[")) return add_glob(t, item);
  return add_npy(t, item);
}

tpr_status tpr_tokens_open(const char *spec, const tpr_tokens_opts *o, tpr_tokens **out) {
  *out = NULL;
  const char *split = o && o->split ? o->split : "train";
  if (strcmp(split, "train") && strcmp(split, "val"))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "data split '%s': want train or val", split);
  tpr_tokens *t = calloc(1, sizeof *t);
  char *items = strdup(spec);
  if (!t || !items || !(t->spec = strdup(spec))) {
    free(items);
    tpr_tokens_close(t);
    return TPR_FAIL(TPR_ERR_OOM, "data %s: out of memory", spec);
  }
  t->masks = o && o->masks;
  t->docs_wanted = t->docs = o && o->docs;
  tpr_status rc = TPR_OK;
  for (char *item = items, *next; rc == TPR_OK && item; item = next) {
    next = strchr(item, ',');
    if (next) *next++ = 0;
    rc = add_item(t, item, split);
  }
  free(items);
  if (rc != TPR_OK) {
    tpr_tokens_close(t);
    return rc;
  }
  *out = t;
  return TPR_OK;
}

void tpr_tokens_close(tpr_tokens *t) {
  if (!t) return;
  for (int i = 0; i < t->n; i++) tpr_npy_close(t->s[i].tokens), tpr_npy_close(t->s[i].mask);
  free(t->s);
  free(t->spec);
  free(t->starts);
  free(t);
}

int64_t tpr_tokens_len(const tpr_tokens *t) { return t->len; }
const char *tpr_tokens_spec(const tpr_tokens *t) { return t->spec; }
int tpr_tokens_files(const tpr_tokens *t) { return t->n; }
const char *tpr_tokens_file(const tpr_tokens *t, int i) { return tpr_npy_path(t->s[i].tokens); }
bool tpr_tokens_has_masks(const tpr_tokens *t) { return t->masks; }
bool tpr_tokens_has_docs(const tpr_tokens *t) { return t->docs_wanted && t->docs; }

tpr_status tpr_tokens_doc_starts(const tpr_tokens *t, int64_t start, int64_t count, uint8_t *out) {
  if (!tpr_tokens_has_docs(t)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: no document offsets", t->spec);
  if (start < 0 || count < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: document starts of a negative range", t->spec);
  memset(out, 0, (size_t)count);
  int64_t lo = 0, hi = t->n_starts;  // the first start >= start
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (t->starts[mid] < start) lo = mid + 1;
    else hi = mid;
  }
  for (int64_t k = lo; k < t->n_starts && t->starts[k] < start + count; k++) out[t->starts[k] - start] = 1;
  return TPR_OK;
}

// The file holding stream position pos (< len): the last one starting at or
// before it (empty files start where the next one does and are passed over).
static int file_at(const tpr_tokens *t, int64_t pos) {
  int lo = 0, hi = t->n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (t->s[mid].start <= pos) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

static tpr_status read_range(const tpr_tokens *t, int64_t start, int64_t count, int32_t *out, bool mask) {
  if (start < 0 || count < 0 || start > t->len || count > t->len - start)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: tokens [%lld, %lld + %lld) outside [0, %lld)", t->spec,
                    (long long)start, (long long)start, (long long)count, (long long)t->len);
  if (mask && !t->masks) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: opened without loss masks", t->spec);
  while (count > 0) {
    int k = file_at(t, start);
    const shard *s = &t->s[k];
    const tpr_npy *f = mask ? s->mask : s->tokens;
    int64_t off = start - s->start, take = tpr_npy_len(s->tokens) - off;
    if (take > count) take = count;
    TPR_CHECK(tpr_npy_read_i32(f, off, take, out));
    start += take, count -= take, out += take;
  }
  return TPR_OK;
}

tpr_status tpr_tokens_read_i32(const tpr_tokens *t, int64_t start, int64_t count, int32_t *out) {
  return read_range(t, start, count, out, false);
}

tpr_status tpr_tokens_read_mask(const tpr_tokens *t, int64_t start, int64_t count, int32_t *out) {
  return read_range(t, start, count, out, true);
}

tpr_status tpr_tokens_check_range(const tpr_tokens *t, int64_t vocab) {
  for (int i = 0; i < t->n; i++) TPR_CHECK(tpr_npy_check_range(t->s[i].tokens, vocab));
  return TPR_OK;
}
