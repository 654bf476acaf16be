// tpr data prepare (data/data.h): inputs -> records -> (workers) ids -> shards.
//
// One thread reads the inputs line by line and cuts them into records,
// collected into a batch of about 2 MiB per worker; the batch's records are
// then validated, parsed and tokenized by `workers` OpenMP threads, each
// record on its own (dynamic schedule, results in the record's slot), and
// the reading thread writes the results in record order. Only the writing
// order decides the output, so it is the same at any worker count.
#define _GNU_SOURCE  // getline
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/data.h"
#include "data/data_impl.h"

bool tpr_data_utf8_valid(const char *str, size_t len, size_t *bad_at) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < len) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;  // the first continuation byte's range
    if (c >= 0xC2 && c <= 0xDF) k = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
      k = 2;
      if (c == 0xE0) lo = 0xA0;       // overlong
      else if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      k = 3;
      if (c == 0xF0) lo = 0x90;       // overlong
      else if (c == 0xF4) hi = 0x8F;  // > U+10FFFF
    } else {
      if (bad_at) *bad_at = i;
      return false;
    }
    if (i + k >= len) {  // truncated sequence
      if (bad_at) *bad_at = i;
      return false;
    }
    for (size_t j = 1; j <= k; j++) {
      unsigned b = s[i + j];
      unsigned l = j == 1 ? lo : 0x80, h = j == 1 ? hi : 0xBF;
      if (b < l || b > h) {
        if (bad_at) *bad_at = i;
        return false;
      }
    }
    i += k + 1;
  }
  return true;
}

tpr_data_format tpr_data_format_of(tpr_data_format given, const char *path) {
  if (given != TPR_DATA_AUTO) return given;
  const char *dot = strrchr(path, '.');
  const char *slash = strrchr(path, '/');
  if (dot && (!slash || dot > slash) && (strcmp(dot, ".jsonl") == 0 || strcmp(dot, ".json") == 0))
    return TPR_DATA_JSONL;
  return TPR_DATA_TXT;
}

static uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool tpr_data_is_val(uint64_t seed, int64_t k, double val_fraction) {
  if (val_fraction <= 0) return false;
  if (val_fraction >= 1) return true;
  // val_fraction * 2^64 < 2^64 here, and exact in long double's 64-bit
  // mantissa for the doubles that matter; the comparison is the format's.
  long double threshold = (long double)val_fraction * 18446744073709551616.0L;
  return (long double)splitmix64(seed + (uint64_t)k) < threshold;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// --- a batch of records -------------------------------------------------------
typedef struct rec {
  int input;
  int64_t line;
  size_t off, len;  // in the arena
} rec;

typedef struct result {
  int32_t *ids;
  uint8_t *mask;  // chat only
  size_t n;
  char *err;      // a bad record: why (malloc'ed)
  int64_t line_delta;  // a bad record: its line within the record (a paragraph spans lines)
} result;

typedef struct batch {
  char *arena;
  size_t len, cap;
  rec *recs;
  result *res;
  size_t n, rcap;
  bool oom;
} batch;

static void arena_put(batch *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = (b->len + n + 1) * 2;
    char *a = realloc(b->arena, cap);
    if (!a) {
      b->oom = true;
      return;
    }
    b->arena = a;
    b->cap = cap;
  }
  memcpy(b->arena + b->len, s, n);
  b->len += n;
  b->arena[b->len] = 0;
}

static void add_rec(batch *b, int input, int64_t line, size_t off, size_t len) {
  if (b->oom) return;
  if (b->n == b->rcap) {
    size_t cap = b->rcap ? b->rcap * 2 : 4096;
    rec *r = realloc(b->recs, cap * sizeof *r);
    result *q = r ? realloc(b->res, cap * sizeof *q) : NULL;
    if (r) b->recs = r;
    if (!r || !q) {
      b->oom = true;
      return;
    }
    b->res = q;
    b->rcap = cap;
  }
  b->recs[b->n++] = (rec){input, line, off, len};
}

// --- one record -> ids (a worker) ------------------------------------------------
typedef struct ctx {
  const tpr_data_opts *o;
  const tpr_data_format *formats;  // per input
  int32_t eos;
} ctx;

static char oom_msg[] = "out of memory";  // the message when even it cannot be copied; never freed

static void fail(result *out, const char *fmt, const char *a, size_t b) {
  char msg[200];
  snprintf(msg, sizeof msg, fmt, a, b);
  out->err = strdup(msg);
  if (!out->err) out->err = oom_msg;
}

static void process(const ctx *c, const batch *b, size_t r) {
  const tpr_data_opts *o = c->o;
  const rec *rc = &b->recs[r];
  result *out = &b->res[r];
  memset(out, 0, sizeof *out);
  const char *s = b->arena + rc->off;
  size_t len = rc->len, bad_at;
  if (!tpr_data_utf8_valid(s, len, &bad_at)) {
    size_t line_start = 0;
    for (size_t i = 0; i < bad_at; i++)
      if (s[i] == '\n') {
        out->line_delta++;
        line_start = i + 1;
      }
    fail(out, "invalid UTF-8 at byte %s%zu of the line", "", bad_at - line_start + 1);
    return;
  }
  const char *text = s;
  size_t text_len = len;
  cJSON *j = NULL;
  char err[200];
  if (c->formats[rc->input] == TPR_DATA_JSONL) {
    j = cJSON_ParseWithLength(s, len);
    if (!j) {  // (cJSON_GetErrorPtr is one global, not for threads: no position)
      fail(out, "not valid JSON%s", "", 0);
      return;
    }
    if (!cJSON_IsObject(j)) {
      fail(out, "not a JSON object%s", "", 0);
      goto done;
    }
    if (o->chat) {
      if (!tpr_data_chat_encode(o->tok, &o->chat_template, j, &out->ids, &out->mask, &out->n, err, sizeof err)) {
        fail(out, "%s", err, 0);
        goto done;
      }
      goto eos;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, o->text_key);
    if (!v) {
      fail(out, "no \"%.64s\" key", o->text_key, 0);
      goto done;
    }
    if (!cJSON_IsString(v)) {
      fail(out, "\"%.64s\" is not a string", o->text_key, 0);
      goto done;
    }
    text = v->valuestring;
    text_len = strlen(text);
    // A \ud800-style escape decodes to bytes that are not UTF-8.
    if (!tpr_data_utf8_valid(text, text_len, &bad_at)) {
      fail(out, "\"%.64s\" decodes to invalid UTF-8 (a lone surrogate escape?)", o->text_key, 0);
      goto done;
    }
  }
  if (tpr_tokenizer_encode(o->tok, text, text_len, o->add_special, &out->ids, &out->n) != TPR_OK) {
    fail(out, "tokenizer: %s", tpr_last_error(), 0);
    goto done;
  }
eos:
  if (o->append_eos) {
    int32_t *ids = realloc(out->ids, (out->n + 1) * sizeof *ids);
    if (!ids) {
      fail(out, "out of memory%s", "", 0);
      goto done;
    }
    out->ids = ids;
    out->ids[out->n] = c->eos;
    if (out->mask) {
      uint8_t *m = realloc(out->mask, out->n + 1);
      if (!m) {
        fail(out, "out of memory%s", "", 0);
        goto done;
      }
      out->mask = m;
      // The EOS is learned when it ends an assistant reply (format: the
      // appended EOS is 1 iff the conversation's last message is the assistant's).
      const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
      const cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
      const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
      out->mask[out->n] = cJSON_IsString(role) && strcmp(role->valuestring, "assistant") == 0;
    }
    out->n++;
  }
done:
  if (out->err) {
    free(out->ids);
    free(out->mask);
    out->ids = NULL;
    out->mask = NULL;
    out->n = 0;
  }
  cJSON_Delete(j);
}

static void free_result(result *r) {
  free(r->ids);
  free(r->mask);
  if (r->err != oom_msg) free(r->err);
  memset(r, 0, sizeof *r);
}

// --- the run ---------------------------------------------------------------------
typedef struct run {
  const tpr_data_opts *o;
  ctx c;
  tpr_data_summary *s;
  data_split train, val;
  int64_t k;  // documents written so far (the split's counter)
  int32_t vocab;
  tpr_data_progress p;
  double t0;
} run;

static tpr_status flush(run *R, batch *b) {
  if (b->oom) return TPR_FAIL(TPR_ERR_OOM, "data prepare: a batch of %zu records", b->n);
  const ctx *c = &R->c;
  int workers = R->o->workers;
  long nrec = (long)b->n;
#pragma omp parallel for num_threads(workers) schedule(dynamic, 1)
  for (long r = 0; r < nrec; r++) process(c, b, (size_t)r);
  tpr_status rc = TPR_OK;
  for (size_t r = 0; r < b->n; r++) {
    result *q = &b->res[r];
    if (rc == TPR_OK && q->err) {
      tpr_data_bad bad = {.input = b->recs[r].input, .line = b->recs[r].line + q->line_delta};
      snprintf(bad.reason, sizeof bad.reason, "%s", q->err);
      if (R->s->n_listed < TPR_DATA_BAD_LISTED) R->s->listed[R->s->n_listed++] = bad;
      R->s->bad++;
      if (R->o->on_bad) R->o->on_bad(&bad, R->o->bad_ctx);
    } else if (rc == TPR_OK) {
      for (size_t i = 0; i < q->n; i++)
        if (q->ids[i] < 0 || q->ids[i] >= R->vocab)
          rc = TPR_FAIL(TPR_ERR_INTERNAL, "data prepare: the tokenizer gave id %d outside its vocabulary (%d)",
                        q->ids[i], R->vocab);
      data_split *sp = tpr_data_is_val(R->o->seed, R->k, R->o->val_fraction) ? &R->val : &R->train;
      if (rc == TPR_OK) rc = data_split_add(sp, q->ids, q->mask, q->n);
      R->k++;
    }
    free_result(q);
  }
  b->n = 0;
  b->len = 0;
  R->p.documents = R->train.documents + R->val.documents;
  R->p.tokens = R->train.tokens + R->val.tokens;
  R->p.bad = R->s->bad;
  R->p.seconds = now_s() - R->t0;
  if (rc == TPR_OK && R->o->progress) R->o->progress(&R->p, false, R->o->progress_ctx);
  return rc;
}

static bool blank(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strchr(" \t\r\n\f\v", s[i]) || !s[i]) return false;
  return true;
}

// Reads input i into records, flushing full batches.
static tpr_status read_input(run *R, batch *b, int i, size_t batch_bytes) {
  const tpr_data_opts *o = R->o;
  const char *path = o->inputs[i];
  FILE *f = fopen(path, "rb");
  if (!f) return TPR_FAIL(TPR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  bool paragraphs = R->c.formats[i] == TPR_DATA_TXT && o->txt_docs == TPR_DATA_BLANK_LINES;
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  int64_t lineno = 0, doc_line = 0;
  bool in_doc = false;
  size_t doc_off = 0;
  tpr_status rc = TPR_OK;
  while (rc == TPR_OK && (got = getline(&line, &cap, f)) > 0) {
    size_t n = (size_t)got;
    lineno++;
    R->p.bytes_read += (int64_t)n;
    bool is_blank = blank(line, n);
    if (paragraphs) {
      if (!is_blank) {
        if (!in_doc) {
          in_doc = true;
          doc_line = lineno;
          doc_off = b->len;
        }
        arena_put(b, line, n);
        continue;
      }
      if (!in_doc) continue;
      in_doc = false;
      size_t len = b->len - doc_off;  // the last line's newline is not the document's
      if (len && b->arena[doc_off + len - 1] == '\n') len--;
      if (len && b->arena[doc_off + len - 1] == '\r') len--;
      add_rec(b, i, doc_line, doc_off, len);
    } else {
      if (is_blank) continue;
      if (line[n - 1] == '\n') n--;
      if (n && line[n - 1] == '\r') n--;
      size_t off = b->len;
      arena_put(b, line, n);
      add_rec(b, i, lineno, off, n);
    }
    if (b->len >= batch_bytes || b->n >= 65536 || b->oom) rc = flush(R, b);
  }
  if (rc == TPR_OK && ferror(f)) rc = TPR_FAIL(TPR_ERR_IO, "%s: read failed: %s", path, strerror(errno));
  if (rc == TPR_OK && in_doc) {
    size_t len = b->len - doc_off;
    if (len && b->arena[doc_off + len - 1] == '\n') len--;
    if (len && b->arena[doc_off + len - 1] == '\r') len--;
    add_rec(b, i, doc_line, doc_off, len);
  }
  free(line);
  fclose(f);
  return rc;
}

static tpr_status mkdir_parents(const char *prefix) {
  char *d = strdup(prefix);
  if (!d) return TPR_FAIL(TPR_ERR_OOM, "data prepare: path");
  char *slash = strrchr(d, '/');
  tpr_status rc = TPR_OK;
  if (slash) {
    *slash = 0;
    for (char *p = d + 1; rc == TPR_OK && p <= d + strlen(d); p++) {
      if (*p != '/' && *p != 0) continue;
      char keep = *p;
      *p = 0;
      struct stat st;
      if (mkdir(d, 0777) != 0 && errno != EEXIST)
        rc = TPR_FAIL(TPR_ERR_IO, "%s: cannot create the output directory: %s", d, strerror(errno));
      else if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
        rc = TPR_FAIL(TPR_ERR_IO, "%s: not a directory (the output prefix's folder)", d);
      *p = keep;
    }
  }
  free(d);
  return rc;
}

static cJSON *split_json(data_split *s) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "tokens", (double)s->tokens);
  cJSON_AddNumberToObject(j, "documents", (double)s->documents);
  cJSON_AddItemToObject(j, "shards", s->shards);
  s->shards = NULL;  // owned by j now
  return j;
}

static tpr_status write_index(run *R) {
  const tpr_data_opts *o = R->o;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "format", "tpr-token-shards");
  cJSON_AddNumberToObject(j, "version", 1);
  cJSON_AddStringToObject(j, "tokenizer", o->tokenizer_path);
  cJSON_AddNumberToObject(j, "vocab_size", R->vocab);
  cJSON_AddStringToObject(j, "dtype", R->train.item_bytes == 2 ? "uint16" : "uint32");
  int32_t eos = tpr_tokenizer_eos_id(o->tok);
  if (eos >= 0) cJSON_AddNumberToObject(j, "eos_id", eos);
  else cJSON_AddNullToObject(j, "eos_id");
  cJSON_AddBoolToObject(j, "append_eos", o->append_eos);
  cJSON_AddBoolToObject(j, "chat", o->chat);
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);  // exact: a double would round seeds >= 2^53
  cJSON_AddRawToObject(j, "seed", seed);
  cJSON_AddNumberToObject(j, "val_fraction", o->val_fraction);
  cJSON *splits = cJSON_AddObjectToObject(j, "splits");
  cJSON_AddItemToObject(splits, "train", split_json(&R->train));
  cJSON_AddItemToObject(splits, "val", split_json(&R->val));
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (!text) return TPR_FAIL(TPR_ERR_OOM, "data prepare: the index");
  // Written beside, then renamed: a reader never sees half an index.
  char tmp[sizeof R->s->index_path + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", R->s->index_path);
  tpr_status rc = TPR_OK;
  FILE *f = fopen(tmp, "wb");
  if (!f) rc = TPR_FAIL(TPR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  else {
    bool ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    ok = fclose(f) == 0 && ok;
    if (!ok) rc = TPR_FAIL(TPR_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    else if (rename(tmp, R->s->index_path) != 0)
      rc = TPR_FAIL(TPR_ERR_IO, "%s: cannot rename to %s: %s", tmp, R->s->index_path, strerror(errno));
  }
  free(text);
  return rc;
}

tpr_status tpr_data_prepare(const tpr_data_opts *o, tpr_data_summary *s) {
  memset(s, 0, sizeof *s);
  if (!o || !o->tok || !o->output || !o->inputs || o->n_inputs < 1 || o->workers < 1 || o->shard_tokens < 1 ||
      !(o->val_fraction >= 0 && o->val_fraction <= 1) || (!o->chat && (!o->text_key || !o->text_key[0])))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_data_prepare: bad options");
  if (snprintf(s->index_path, sizeof s->index_path, "%s.json", o->output) >= (int)sizeof s->index_path)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "data prepare: --output is too long");
  run R = {.o = o, .s = s, .t0 = now_s()};
  R.c.o = o;
  R.c.eos = tpr_tokenizer_eos_id(o->tok);
  R.vocab = tpr_tokenizer_vocab_size(o->tok);
  if (o->append_eos && R.c.eos < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "data prepare: --append-eos, but the tokenizer declares no EOS (tokenizer_config.json's "
                    "eos_token beside %s)",
                    o->tokenizer_path);
  tpr_data_format *formats = calloc((size_t)o->n_inputs, sizeof *formats);
  if (!formats) return TPR_FAIL(TPR_ERR_OOM, "data prepare: inputs");
  R.c.formats = formats;
  tpr_status rc = TPR_OK;
  // Every input is checked before anything is written.
  for (int i = 0; rc == TPR_OK && i < o->n_inputs; i++) {
    struct stat st;
    formats[i] = tpr_data_format_of(o->format, o->inputs[i]);
    if (stat(o->inputs[i], &st) != 0 || access(o->inputs[i], R_OK) != 0)
      rc = TPR_FAIL(TPR_ERR_IO, "%s: cannot read: %s", o->inputs[i], strerror(errno));
    else if (S_ISDIR(st.st_mode))
      rc = TPR_FAIL(TPR_ERR_IO, "%s: is a directory, not an input file", o->inputs[i]);
    else if (S_ISREG(st.st_mode))
      R.p.bytes_total += st.st_size;
    if (rc == TPR_OK && o->chat && formats[i] != TPR_DATA_JSONL)
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: --chat reads JSONL conversations, and this input is read as text",
                    o->inputs[i]);
  }
  if (rc == TPR_OK) rc = mkdir_parents(o->output);
  if (rc == TPR_OK && unlink(s->index_path) != 0 && errno != ENOENT)
    rc = TPR_FAIL(TPR_ERR_IO, "%s: cannot remove the old index: %s", s->index_path, strerror(errno));
  int item = R.vocab <= 65536 ? 2 : 4;
  data_split_init(&R.train, o->output, "train", item, o->chat, o->shard_tokens);
  data_split_init(&R.val, o->output, "val", item, o->chat, o->shard_tokens);
  batch b = {0};
  size_t batch_bytes = (size_t)2 << 20;
  batch_bytes *= (size_t)o->workers;
  for (int i = 0; rc == TPR_OK && i < o->n_inputs; i++) rc = read_input(&R, &b, i, batch_bytes);
  if (rc == TPR_OK) rc = flush(&R, &b);
  if (rc == TPR_OK) rc = data_split_finish(&R.train);
  if (rc == TPR_OK) rc = data_split_finish(&R.val);
  s->train = (tpr_data_split_summary){R.train.documents, R.train.tokens, R.train.shard_index};
  s->val = (tpr_data_split_summary){R.val.documents, R.val.tokens, R.val.shard_index};
  if (rc == TPR_OK) rc = write_index(&R);
  s->bytes = R.p.bytes_read;
  s->seconds = now_s() - R.t0;
  R.p.seconds = s->seconds;
  if (rc == TPR_OK && o->progress) o->progress(&R.p, true, o->progress_ctx);
  free(b.arena);  // a batch left unflushed after an error has no results to free
  free(b.recs);
  free(b.res);
  data_split_free(&R.train);
  data_split_free(&R.val);
  free(formats);
  return rc;
}
