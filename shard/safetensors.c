// Opening safetensors files and sets: mmap, header validation, the name index.
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/file_io.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; tpr reads it in place"
#endif

typedef struct st_file {
  char *path;
  const uint8_t *map;  // (size) the whole file, read-only
  size_t size;
  cJSON *meta;  // the header's "__metadata__" object (detached), or NULL
} st_file;

typedef struct st_entry {
  tpr_st_tensor t;      // first, so &entry->t is what the API hands out
  uint64_t begin, end;  // data_offsets, relative to the data section
} st_entry;

struct tpr_st_set {
  st_file *files;
  int nfiles;
  st_entry *entries;  // (n) sorted by name once open finishes
  int n, cap;
  int fp8_rows, fp8_cols;
};

// safetensors dtype names tpr holds; the second table names the rest of the
// format's dtypes, so a valid file gets "unsupported", not "unknown".
static const struct {
  const char *name;
  tpr_dtype dt;
} st_dtypes[] = {{"F32", TPR_F32}, {"BF16", TPR_BF16}, {"F16", TPR_F16}, {"F8_E4M3", TPR_F8E4M3},
                 {"I32", TPR_I32}, {"I64", TPR_I64},   {"U8", TPR_U8}};
static const char *const st_other_dtypes[] = {"BOOL",    "I8",      "I16",     "U16", "U32",     "U64",     "F64",
                                              "F8_E5M2", "F8_E8M0", "F4",      "C64", "F6_E2M3", "F6_E3M2"};

const char *tpr__st_dtype_name(tpr_dtype dt) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
  return NULL;
}

static char *join_path(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (p) snprintf(p, a + b + 2, "%s/%s", dir, name);
  return p;
}

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

// A JSON number that must be a non-negative integer a double holds exactly
// (cJSON keeps numbers as doubles): 0 ok, -1 not an integer, -2 negative,
// -3 above 2^53.
static int json_u64(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  if (d < 0) return -2;
  if (d > 9007199254740992.0) return -3;
  if (d != (double)(uint64_t)d) return -1;
  *out = (uint64_t)d;
  return 0;
}

static const char *json_u64_why(int e) {
  return e == -2 ? "is negative" : e == -3 ? "is above 2^53" : "is not an integer";
}

// Parses one tensor entry of file `f` into *e (name not yet set).
static tpr_status parse_entry(const st_file *f, const char *name, const cJSON *item, uint64_t data_size,
                              st_entry *e) {
  memset(e, 0, sizeof *e);
  if (!cJSON_IsObject(item))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", f->path, name);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsString(dtype))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is missing or not a string", f->path, name);
  if (!cJSON_IsArray(shape))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': \"shape\" is missing or not an array", f->path, name);
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" is missing or not an array of 2", f->path,
                    name);

  int found = 0;
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (!strcmp(dtype->valuestring, st_dtypes[i].name)) e->t.dtype = st_dtypes[i].dt, found = 1;
  if (!found) {
    for (size_t i = 0; i < sizeof st_other_dtypes / sizeof st_other_dtypes[0]; i++)
      if (!strcmp(dtype->valuestring, st_other_dtypes[i]))
        return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: tensor '%s': unsupported dtype %s (tpr reads F32, BF16, F16, "
                        "F8_E4M3, I32, I64, U8)", f->path, name, dtype->valuestring);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%.32s\"", f->path, name,
                    dtype->valuestring);
  }

  int ndim = cJSON_GetArraySize(shape);
  if (ndim > TPR_MAX_DIMS)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': %d dims, more than TPR_MAX_DIMS (%d)", f->path, name, ndim,
                    TPR_MAX_DIMS);
  e->t.ndim = ndim;
  const cJSON *d;
  int i = 0;
  cJSON_ArrayForEach(d, shape) {
    uint64_t v;
    int err = json_u64(d, &v);
    if (err) return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': dim %d %s", f->path, name, i, json_u64_why(err));
    // A dim past the bound is refused even beside a zero dim (an empty
    // tensor): shapes are copied into tensors and programs, whose strides
    // multiply them.
    if (v > (uint64_t)TPR_SHAPE_MAX_NUMEL)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': dim %d is %llu, more than 2^48", f->path, name, i,
                      (unsigned long long)v);
    e->t.shape[i++] = (int64_t)v;
  }
  char what[160];
  snprintf(what, sizeof what, "%s: tensor '%.64s'", f->path, name);
  int64_t checked_numel;
  if (tpr_shape_size_checked(what, e->t.dtype, ndim, e->t.shape, &checked_numel, NULL) != TPR_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tpr_last_error());
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': element count overflows the bound (%s)", f->path, name, why);
  }
  uint64_t numel = (uint64_t)checked_numel;

  uint64_t be[2];
  for (int k = 0; k < 2; k++) {
    int err = json_u64(cJSON_GetArrayItem(offs, k), &be[k]);
    if (err)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': data_offsets[%d] %s", f->path, name, k, json_u64_why(err));
  }
  if (be[0] > be[1])
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu", f->path, name,
                    (unsigned long long)be[0], (unsigned long long)be[1]);
  if (be[1] > data_size)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': data_offsets end %llu is beyond the data section (%llu bytes)",
                    f->path, name, (unsigned long long)be[1], (unsigned long long)data_size);
  uint64_t want;
  if (__builtin_mul_overflow(numel, (uint64_t)tpr_dtype_size(e->t.dtype), &want))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': byte size overflows", f->path, name);
  if (want != be[1] - be[0])
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s': data_offsets span %llu bytes, but %llu %s elements need %llu",
                    f->path, name, (unsigned long long)(be[1] - be[0]), (unsigned long long)numel,
                    dtype->valuestring, (unsigned long long)want);
  e->t.numel = (int64_t)numel;
  e->t.nbytes = (size_t)want;
  e->begin = be[0];
  e->end = be[1];
  e->t.path = f->path;
  return TPR_OK;
}

static int cmp_begin(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

// Two non-empty tensors of one file may not share a byte: a writer bug
// that would make one tensor's update silently change another.
static tpr_status check_overlaps(const st_file *f, st_entry *e, int n) {
  if (n < 2) return TPR_OK;  // (and e may be NULL)
  qsort(e, (size_t)n, sizeof *e, cmp_begin);
  const st_entry *last = NULL;  // the non-empty tensor reaching furthest so far
  for (int i = 0; i < n; i++) {
    if (e[i].begin == e[i].end) continue;
    if (last && e[i].begin < last->end)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", f->path,
                      last->t.name, (unsigned long long)last->begin, (unsigned long long)last->end, e[i].t.name,
                      (unsigned long long)e[i].begin, (unsigned long long)e[i].end);
    if (!last || e[i].end > last->end) last = &e[i];
  }
  return TPR_OK;
}

static tpr_status parse_header(tpr_st_set *s, st_file *f) {
  uint64_t hlen = le64(f->map);
  if (hlen > TPR_ST_MAX_HEADER)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: header length %llu is over the %u-byte limit (corrupt file?)", f->path,
                    (unsigned long long)hlen, TPR_ST_MAX_HEADER);
  if (hlen > f->size - 8)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", f->path,
                    (unsigned long long)hlen, f->size);
  const char *text = (const char *)f->map + 8, *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
  if (!root)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: header is not valid JSON (at byte %td of %llu)", f->path,
                    end ? end - text : (ptrdiff_t)0, (unsigned long long)hlen);
  // The reference writer pads with spaces; anything else after the object is corrupt.
  for (; end < text + hlen; end++)
    if (!strchr(" \t\r\n", *end) || !*end) {
      cJSON_Delete(root);
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: header has bytes after its JSON object (at byte %td)", f->path,
                      end - text);
    }
  tpr_status rc = TPR_OK;
  if (!cJSON_IsObject(root)) {
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    goto done;
  }
  uint64_t data_size = f->size - 8 - hlen;
  const uint8_t *data = f->map + 8 + hlen;
  int first = s->n;
  for (cJSON *item = root->child; item; item = item->next) {
    const char *name = item->string;
    if (!strcmp(name, "__metadata__")) {
      if (cJSON_IsNull(item)) continue;
      const cJSON *kv;
      int ok = cJSON_IsObject(item);
      cJSON_ArrayForEach(kv, item) ok = ok && cJSON_IsString(kv);
      if (!ok) {
        rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: \"__metadata__\" is not an object of strings", f->path);
        goto done;
      }
      continue;
    }
    if (s->n == s->cap) {
      int cap = s->cap ? 2 * s->cap : 64;
      st_entry *grown = realloc(s->entries, (size_t)cap * sizeof *grown);
      if (!grown) {
        rc = TPR_FAIL(TPR_ERR_OOM, "%s: out of memory indexing tensors", f->path);
        goto done;
      }
      s->entries = grown, s->cap = cap;
    }
    st_entry *e = &s->entries[s->n];
    if (tpr_name_check(f->path, name, strlen(name)) != TPR_OK) {
      rc = TPR_ERR_FORMAT;
      goto done;
    }
    TPR_CHECK_GOTO(parse_entry(f, name, item, data_size, e), rc, done);
    if (!(e->t.name = strdup(name))) {
      rc = TPR_FAIL(TPR_ERR_OOM, "%s: out of memory indexing tensors", f->path);
      goto done;
    }
    e->t.data = data + e->begin;
    s->n++;
  }
  TPR_CHECK_GOTO(check_overlaps(f, s->entries + first, s->n - first), rc, done);
  f->meta = cJSON_DetachItemFromObjectCaseSensitive(root, "__metadata__");
done:
  cJSON_Delete(root);
  return rc;
}

// Maps `path` (taking ownership of the string) and indexes its tensors.
static tpr_status open_file(tpr_st_set *s, char *path) {
  st_file *grown = realloc(s->files, (size_t)(s->nfiles + 1) * sizeof *grown);
  if (!grown) {
    tpr_status rc = TPR_FAIL(TPR_ERR_OOM, "out of memory opening %s", path);
    free(path);
    return rc;
  }
  s->files = grown;
  st_file *f = &s->files[s->nfiles++];  // owned by the set from here, so close frees it
  *f = (st_file){.path = path};
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return TPR_FAIL(TPR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return TPR_FAIL(TPR_ERR_IO, "%s is not a regular file", path);
  }
  if (st.st_size < 8) {
    close(fd);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: %lld bytes, shorter than the 8-byte header length", path,
                    (long long)st.st_size);
  }
  void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) return TPR_FAIL(TPR_ERR_IO, "cannot mmap %s: %s", path, strerror(err));
  f->map = map;
  f->size = (size_t)st.st_size;
  TPR_CHECK(parse_header(s, f));
  return TPR_OK;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(((const st_entry *)a)->t.name, ((const st_entry *)b)->t.name);
}

// Sorts the entries by name for lookups; a name held twice is an error.
static tpr_status index_names(tpr_st_set *s) {
  if (s->n < 2) return TPR_OK;
  qsort(s->entries, (size_t)s->n, sizeof *s->entries, cmp_name);
  for (int i = 1; i < s->n; i++) {
    const tpr_st_tensor *a = &s->entries[i - 1].t, *b = &s->entries[i].t;
    if (strcmp(a->name, b->name)) continue;
    if (a->path == b->path)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", a->path, a->name);
    return TPR_FAIL(TPR_ERR_FORMAT, "tensor '%s' is in both %s and %s", a->name, a->path, b->path);
  }
  return TPR_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// A weight_map file name must stay inside the checkpoint directory.
static int safe_relative(const char *p) {
  if (!*p || *p == '/') return 0;
  for (const char *c = p; c; c = strchr(c, '/')) {
    if (*c == '/') c++;
    if (!strncmp(c, "..", 2) && (c[2] == '/' || !c[2])) return 0;
  }
  return 1;
}

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: file}}.
static tpr_status open_index(tpr_st_set *s, const char *dir, const char *index_path) {
  uint8_t *bytes;
  size_t len;
  TPR_CHECK(tpr_file_read(index_path, &bytes, &len));
  cJSON *root = cJSON_ParseWithLength((const char *)bytes, len);
  free(bytes);
  tpr_status rc = TPR_OK;
  const char **names = NULL;
  const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (!cJSON_IsObject(map)) {
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: %s", index_path,
                  !root ? "not valid JSON" : "no \"weight_map\" object");
    goto done;
  }
  int n = cJSON_GetArraySize(map), nf = 0;
  names = malloc((size_t)(n ? n : 1) * sizeof *names);
  if (!names) {
    rc = TPR_FAIL(TPR_ERR_OOM, "%s: out of memory", index_path);
    goto done;
  }
  const cJSON *kv;
  cJSON_ArrayForEach(kv, map) {
    if (!cJSON_IsString(kv) || !safe_relative(kv->valuestring)) {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name inside the directory",
                    index_path, kv->string);
      goto done;
    }
    names[nf++] = kv->valuestring;
  }
  qsort(names, (size_t)nf, sizeof *names, cmp_str);
  for (int i = 0; i < nf; i++) {
    if (i && !strcmp(names[i], names[i - 1])) continue;
    char *p = join_path(dir, names[i]);
    struct stat st;
    if (p && stat(p, &st) != 0) {
      rc = TPR_FAIL(TPR_ERR_IO, "%s names %s, which cannot be opened: %s", index_path, p, strerror(errno));
      free(p);
      goto done;
    }
    if (!p) {
      rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
      goto done;
    }
    TPR_CHECK_GOTO(open_file(s, p), rc, done);
  }
  // Sorted and unique now, so every weight_map tensor can be looked up in its file.
  TPR_CHECK_GOTO(index_names(s), rc, done);
  cJSON_ArrayForEach(kv, map) {
    const tpr_st_tensor *t = tpr_st_find(s, kv->string);
    char *want = join_path(dir, kv->valuestring);
    if (!want) {
      rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
      goto done;
    }
    if (!t || strcmp(t->path, want) != 0) {
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s maps tensor '%s' to %s, which does not hold it%s%s%s", index_path,
                    kv->string, want, t ? " (it is in " : "", t ? t->path : "", t ? ")" : "");
      free(want);
      goto done;
    }
    free(want);
  }
done:
  free(names);
  cJSON_Delete(root);
  return rc;
}

static int is_st_file(const struct dirent *d) {
  size_t n = strlen(d->d_name), k = strlen(".safetensors");
  return n > k && !strcmp(d->d_name + n - k, ".safetensors");
}

// strcmp, not the locale's collation, so the order is the same everywhere.
static int cmp_dirent(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

static tpr_status open_dir(tpr_st_set *s, const char *dir) {
  struct stat st;
  char *p = join_path(dir, "model.safetensors.index.json");
  if (!p) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  if (stat(p, &st) == 0) {
    tpr_status rc = open_index(s, dir, p);
    free(p);
    return rc;
  }
  free(p);
  if (!(p = join_path(dir, "model.safetensors"))) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  if (stat(p, &st) == 0) return open_file(s, p);
  free(p);
  struct dirent **list;
  int n = scandir(dir, &list, is_st_file, cmp_dirent);
  if (n < 0) return TPR_FAIL(TPR_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
  tpr_status rc = n ? TPR_OK : TPR_FAIL(TPR_ERR_IO, "%s holds no .safetensors file", dir);
  for (int i = 0; i < n; i++) {
    if (rc == TPR_OK) {
      p = join_path(dir, list[i]->d_name);
      rc = p ? open_file(s, p) : TPR_FAIL(TPR_ERR_OOM, "out of memory");
    }
    free(list[i]);
  }
  free(list);
  return rc;
}

tpr_status tpr_st_open(const char *path, tpr_st_set **out) {
  if (!out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_st_open: out is NULL");
  *out = NULL;
  if (!path) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_st_open: path is NULL");
  tpr_st_set *s = calloc(1, sizeof *s);
  if (!s) return TPR_FAIL(TPR_ERR_OOM, "out of memory opening %s", path);
  s->fp8_rows = s->fp8_cols = TPR_ST_FP8_BLOCK;
  struct stat st;
  tpr_status rc;
  if (stat(path, &st) != 0) {
    rc = TPR_FAIL(TPR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  } else if (S_ISDIR(st.st_mode)) {
    rc = open_dir(s, path);
  } else {
    char *p = strdup(path);
    rc = p ? open_file(s, p) : TPR_FAIL(TPR_ERR_OOM, "out of memory");
  }
  if (rc == TPR_OK) rc = index_names(s);
  if (rc != TPR_OK) {
    tpr_st_close(s);
    return tpr__propagate(rc, __FILE__, __LINE__);
  }
  *out = s;
  return TPR_OK;
}

void tpr_st_close(tpr_st_set *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) free((char *)s->entries[i].t.name);
  free(s->entries);
  for (int i = 0; i < s->nfiles; i++) {
    if (s->files[i].map) munmap((void *)s->files[i].map, s->files[i].size);
    cJSON_Delete(s->files[i].meta);
    free(s->files[i].path);
  }
  free(s->files);
  free(s);
}

int tpr_st_count(const tpr_st_set *s) { return s ? s->n : 0; }

const tpr_st_tensor *tpr_st_get(const tpr_st_set *s, int i) {
  return s && i >= 0 && i < s->n ? &s->entries[i].t : NULL;
}

const tpr_st_tensor *tpr_st_find(const tpr_st_set *s, const char *name) {
  if (!s || !name) return NULL;
  int lo = 0, hi = s->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(name, s->entries[mid].t.name);
    if (!c) return &s->entries[mid].t;
    if (c < 0) hi = mid - 1;
    else lo = mid + 1;
  }
  return NULL;
}

const char *tpr_st_metadata(const tpr_st_set *s, const char *key) {
  for (int i = 0; s && key && i < s->nfiles; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s->files[i].meta, key);
    if (cJSON_IsString(v)) return v->valuestring;
  }
  return NULL;
}

tpr_status tpr_st_set_fp8_block(tpr_st_set *s, int rows, int cols) {
  if (!s || rows < 1 || cols < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_st_set_fp8_block: block %d x %d must be positive", rows, cols);
  s->fp8_rows = rows, s->fp8_cols = cols;
  return TPR_OK;
}

void tpr__st_fp8_block(const tpr_st_set *s, int *rows, int *cols) {
  *rows = s->fp8_rows;
  *cols = s->fp8_cols;
}
