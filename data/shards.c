// The token shards of one split (docs/data.md): ids streamed into a .npy
// whose header is rewritten with the final length when the shard closes;
// document offsets kept in memory and written as their own .npy then.
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"

void data_npy_header(char h[DATA_NPY_HEADER], const char *descr, int64_t n) {
  memset(h, ' ', DATA_NPY_HEADER);
  memcpy(h, "\x93NUMPY\x01\x00", 8);
  h[8] = (char)(DATA_NPY_HEADER - 10);  // header length, little-endian u16
  h[9] = 0;
  char dict[DATA_NPY_HEADER];
  int k = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", descr,
                   (long long)n);
  memcpy(h + 10, dict, (size_t)k);  // k <= 80 for any n < 2^63
  h[DATA_NPY_HEADER - 1] = '\n';
}

void data_split_init(data_split *s, const char *prefix, const char *name, int item_bytes, bool with_mask,
                     int64_t shard_tokens) {
  memset(s, 0, sizeof *s);
  s->prefix = prefix;
  s->name = name;
  s->item_bytes = item_bytes;
  s->with_mask = with_mask;
  s->shard_tokens = shard_tokens;
  s->shards = cJSON_CreateArray();
}

static char *shard_path(const data_split *s, const char *suffix) {
  size_t len = strlen(s->prefix) + strlen(s->name) + strlen(suffix) + 16;
  char *p = malloc(len);
  if (p) snprintf(p, len, "%s.%s.%05d%s", s->prefix, s->name, s->shard_index, suffix);
  return p;
}

static const char *base(const char *p) {
  const char *slash = strrchr(p, '/');
  return slash ? slash + 1 : p;
}

static FILE *open_npy(const char *path, const char *descr) {
  FILE *f = fopen(path, "wb");
  if (!f) return NULL;
  char h[DATA_NPY_HEADER];
  data_npy_header(h, descr, 0);  // rewritten with the length at close
  if (fwrite(h, 1, sizeof h, f) != sizeof h) {
    fclose(f);
    return NULL;
  }
  return f;
}

static tpr_status open_shard(data_split *s) {
  s->tok_path = shard_path(s, ".npy");
  s->mask_path = s->with_mask ? shard_path(s, ".mask.npy") : NULL;
  if (!s->tok_path || (s->with_mask && !s->mask_path)) return TPR_FAIL(TPR_ERR_OOM, "data prepare: shard path");
  s->tok = open_npy(s->tok_path, s->item_bytes == 2 ? "<u2" : "<u4");
  if (!s->tok) return TPR_FAIL(TPR_ERR_IO, "%s: cannot create: %s", s->tok_path, strerror(errno));
  if (s->with_mask && !(s->mask = open_npy(s->mask_path, "|u1")))
    return TPR_FAIL(TPR_ERR_IO, "%s: cannot create: %s", s->mask_path, strerror(errno));
  s->n = 0;
  s->n_offsets = 0;
  return TPR_OK;
}

static tpr_status push_offset(data_split *s, int64_t v) {
  if (s->n_offsets == s->cap_offsets) {
    size_t cap = s->cap_offsets ? s->cap_offsets * 2 : 1024;
    int64_t *o = realloc(s->offsets, cap * sizeof *o);
    if (!o) return TPR_FAIL(TPR_ERR_OOM, "data prepare: document offsets");
    s->offsets = o;
    s->cap_offsets = cap;
  }
  s->offsets[s->n_offsets++] = v;
  return TPR_OK;
}

// Rewrites f's header for n items and closes it.
static tpr_status close_npy(FILE **f, const char *path, const char *descr, int64_t n) {
  char h[DATA_NPY_HEADER];
  data_npy_header(h, descr, n);
  bool ok = fflush(*f) == 0 && fseek(*f, 0, SEEK_SET) == 0 && fwrite(h, 1, sizeof h, *f) == sizeof h;
  ok = (fclose(*f) == 0) && ok;
  *f = NULL;
  return ok ? TPR_OK : TPR_FAIL(TPR_ERR_IO, "%s: write failed: %s", path, strerror(errno));
}

static tpr_status close_shard(data_split *s) {
  tpr_status rc = push_offset(s, s->n);
  if (rc == TPR_OK) rc = close_npy(&s->tok, s->tok_path, s->item_bytes == 2 ? "<u2" : "<u4", s->n);
  if (rc == TPR_OK && s->with_mask) rc = close_npy(&s->mask, s->mask_path, "|u1", s->n);
  char *docs_path = rc == TPR_OK ? shard_path(s, ".docs.npy") : NULL;
  if (rc == TPR_OK && !docs_path) rc = TPR_FAIL(TPR_ERR_OOM, "data prepare: shard path");
  if (rc == TPR_OK) {
    FILE *f = open_npy(docs_path, "<i8");
    if (!f) rc = TPR_FAIL(TPR_ERR_IO, "%s: cannot create: %s", docs_path, strerror(errno));
    // offsets are int64 in this machine's order; the format is little-endian
    // ('<i8'), as every machine tpr builds on is.
    else if (fwrite(s->offsets, sizeof *s->offsets, s->n_offsets, f) != s->n_offsets) {
      fclose(f);
      rc = TPR_FAIL(TPR_ERR_IO, "%s: write failed: %s", docs_path, strerror(errno));
    } else
      rc = close_npy(&f, docs_path, "<i8", (int64_t)s->n_offsets);
  }
  if (rc == TPR_OK) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "tokens_file", base(s->tok_path));
    cJSON_AddStringToObject(e, "docs_file", base(docs_path));
    if (s->with_mask) cJSON_AddStringToObject(e, "mask_file", base(s->mask_path));
    cJSON_AddNumberToObject(e, "tokens", (double)s->n);
    cJSON_AddNumberToObject(e, "documents", (double)(s->n_offsets - 1));
    cJSON_AddItemToArray(s->shards, e);
    s->shard_index++;
  }
  free(docs_path);
  free(s->tok_path);
  free(s->mask_path);
  s->tok_path = s->mask_path = NULL;
  return rc;
}

tpr_status data_split_add(data_split *s, const int32_t *ids, const uint8_t *mask, size_t n) {
  tpr_status rc = TPR_OK;
  if (!s->tok && (rc = open_shard(s)) != TPR_OK) return rc;
  if ((rc = push_offset(s, s->n)) != TPR_OK) return rc;
  const void *out = ids;
  if (s->item_bytes == 2) {  // the caller checked every id < vocab <= 65536
    if (n > s->conv_cap) {
      void *c = realloc(s->conv, n * 2);
      if (!c) return TPR_FAIL(TPR_ERR_OOM, "data prepare: %zu tokens", n);
      s->conv = c;
      s->conv_cap = n;
    }
    uint16_t *c = s->conv;
    for (size_t i = 0; i < n; i++) c[i] = (uint16_t)ids[i];
    out = c;
  }
  if (fwrite(out, (size_t)s->item_bytes, n, s->tok) != n)
    return TPR_FAIL(TPR_ERR_IO, "%s: write failed: %s", s->tok_path, strerror(errno));
  if (s->with_mask && fwrite(mask, 1, n, s->mask) != n)
    return TPR_FAIL(TPR_ERR_IO, "%s: write failed: %s", s->mask_path, strerror(errno));
  s->n += (int64_t)n;
  s->tokens += (int64_t)n;
  s->documents++;
  if (s->n >= s->shard_tokens) rc = close_shard(s);
  return rc;
}

tpr_status data_split_finish(data_split *s) { return s->tok ? close_shard(s) : TPR_OK; }

void data_split_free(data_split *s) {
  if (s->tok) fclose(s->tok);
  if (s->mask) fclose(s->mask);
  free(s->tok_path);
  free(s->mask_path);
  free(s->offsets);
  free(s->conv);
  cJSON_Delete(s->shards);
  memset(s, 0, sizeof *s);
}
