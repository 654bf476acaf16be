// Writing safetensors files atomically, byte-compatible with the reference
// writer (the Rust safetensors crate behind the Python package).
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safetensors.h"

// The reference writer orders data by dtype, widest first (its enum order:
// I64, F32, I32, BF16, F16, F8_E4M3, U8), then by name, and lists header
// keys in the same order. Widest first keeps every tensor aligned to its
// element size, since the data section starts 8-byte aligned.
static int dtype_rank(tpr_dtype dt) {
  static const int rank[TPR_DTYPE_COUNT] = {
      [TPR_I64] = 0, [TPR_F32] = 1, [TPR_I32] = 2, [TPR_BF16] = 3, [TPR_F16] = 4, [TPR_F8E4M3] = 5, [TPR_U8] = 6};
  return rank[dt];
}

static int cmp_entry(const void *a, const void *b) {
  const tpr_st_write_entry *x = *(const tpr_st_write_entry *const *)a, *y = *(const tpr_st_write_entry *const *)b;
  int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
  return rx != ry ? rx - ry : strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }


static tpr_status check_entry(const char *path, const tpr_st_write_entry *e, size_t *nbytes) {
  if (!e->name || !*e->name || !strcmp(e->name, "__metadata__"))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: tensor name '%s' is not allowed", path, e->name ? e->name : "(null)");
  if (!tpr_dtype_valid(e->dtype))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: tensor '%s': invalid dtype %d", path, e->name, e->dtype);
  if (e->ndim < 0 || e->ndim > TPR_MAX_DIMS || (e->ndim && !e->shape))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: tensor '%s': ndim %d (0..%d, shape given)", path, e->name, e->ndim,
                    TPR_MAX_DIMS);
  size_t n = tpr_dtype_size(e->dtype);
  for (int d = 0; d < e->ndim; d++)
    if (e->shape[d] < 0 || __builtin_mul_overflow(n, (size_t)e->shape[d], &n))
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: tensor '%s': bad dim %d = %lld", path, e->name, d,
                      (long long)e->shape[d]);
  if (n && !e->data) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: tensor '%s': data is NULL", path, e->name);
  *nbytes = n;
  return TPR_OK;
}

static cJSON *raw_u64(unsigned long long v) {
  char buf[24];
  snprintf(buf, sizeof buf, "%llu", v);
  return cJSON_CreateRaw(buf);  // exact integers: cJSON's doubles could print 1e+17
}

// The header JSON (unpadded) for entries in `order`; NULL when out of memory.
static char *build_header(const tpr_st_write_entry *const *order, const size_t *nbytes, int n, const char **kv,
                          int nkv) {
  cJSON *root = cJSON_CreateObject(), *meta = NULL;
  int ok = root != NULL;
  if (ok && nkv) ok = cJSON_AddItemToObject(root, "__metadata__", meta = cJSON_CreateObject());
  for (int i = 0; ok && i < nkv; i++) ok = cJSON_AddStringToObject(meta, kv[2 * i], kv[2 * i + 1]) != NULL;
  unsigned long long off = 0;
  for (int i = 0; ok && i < n; i++) {
    const tpr_st_write_entry *e = order[i];
    cJSON *t = cJSON_CreateObject();
    if (!(ok = t && cJSON_AddItemToObject(root, e->name, t))) {
      cJSON_Delete(t);
      break;
    }
    cJSON *shape = NULL, *offs = NULL;
    ok = cJSON_AddStringToObject(t, "dtype", tpr__st_dtype_name(e->dtype)) && (shape = cJSON_AddArrayToObject(t, "shape"));
    for (int d = 0; ok && d < e->ndim; d++) ok = cJSON_AddItemToArray(shape, raw_u64((unsigned long long)e->shape[d]));
    ok = ok && (offs = cJSON_AddArrayToObject(t, "data_offsets")) && cJSON_AddItemToArray(offs, raw_u64(off)) &&
         cJSON_AddItemToArray(offs, raw_u64(off + nbytes[i]));
    off += nbytes[i];
  }
  char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  return text;
}

// Writes header and data to the open temporary file; fsyncs it.
static tpr_status write_body(FILE *f, const char *tmp, const char *header,
                             const tpr_st_write_entry *const *order, const size_t *nbytes, int n) {
  size_t hlen = strlen(header), pad = (8 - hlen % 8) % 8;
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)(hlen + pad) >> (8 * i));
  int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen && fwrite("        ", 1, pad, f) == pad;
  for (int i = 0; ok && i < n; i++) ok = fwrite(order[i]->data, 1, nbytes[i], f) == nbytes[i];
  if (!ok || fflush(f) != 0 || fsync(fileno(f)) != 0)
    return TPR_FAIL(TPR_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
  return TPR_OK;
}

// Makes the rename durable. Some file systems cannot fsync a directory
// (EINVAL); the rename itself has happened then, so that is not an error.
static tpr_status sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  tpr_status rc = TPR_OK;
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
    rc = TPR_FAIL(TPR_ERR_IO, "cannot sync directory %s after writing %s: %s", dir, path, strerror(errno));
  if (fd >= 0) close(fd);
  free(dir);
  return rc;
}

tpr_status tpr_st_write(const char *path, const tpr_st_write_entry *entries, int n, const char *const *metadata_kv) {
  if (!path || n < 0 || (n && !entries))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_st_write: path %s, %d entries", path ? path : "NULL", n);
  const tpr_st_write_entry **order = malloc((size_t)(n ? n : 1) * sizeof *order);
  size_t *nbytes = malloc((size_t)(n ? n : 1) * sizeof *nbytes);
  const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
  int nkv = 0;
  while (metadata_kv && metadata_kv[2 * nkv] && metadata_kv[2 * nkv + 1]) nkv++;
  const char **kv = malloc((size_t)(2 * nkv + 1) * sizeof *kv);
  char *header = NULL, *tmp = NULL;
  FILE *f = NULL;
  tpr_status rc = TPR_OK;
  if (!order || !nbytes || !names || !kv) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory writing %s", path);
    goto done;
  }
  if (metadata_kv && metadata_kv[2 * nkv]) {  // stopped at a key, not at the final NULL
    rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: metadata key '%s' has no value", path, metadata_kv[2 * nkv]);
    goto done;
  }
  if (nkv) memcpy(kv, metadata_kv, (size_t)(2 * nkv) * sizeof *kv);
  qsort(kv, (size_t)nkv, 2 * sizeof *kv, cmp_name);  // pairs, by key
  for (int i = 1; i < nkv; i++)
    if (!strcmp(kv[2 * i - 2], kv[2 * i])) {
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: metadata key '%s' given twice", path, kv[2 * i]);
      goto done;
    }
  for (int i = 0; i < n; i++) order[i] = &entries[i];
  // Validated before sorting: the comparison reads names and dtypes.
  for (int i = 0; i < n; i++) TPR_CHECK_GOTO(check_entry(path, order[i], &nbytes[i]), rc, done);
  qsort(order, (size_t)n, sizeof *order, cmp_entry);
  for (int i = 0; i < n; i++) TPR_CHECK_GOTO(check_entry(path, order[i], &nbytes[i]), rc, done);  // in the new order
  // Duplicates sit apart in dtype order, so look for them in name order.
  for (int i = 0; i < n; i++) names[i] = entries[i].name;
  qsort(names, (size_t)n, sizeof *names, cmp_name);
  for (int i = 1; i < n; i++)
    if (!strcmp(names[i - 1], names[i])) {
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: tensor '%s' given twice", path, names[i]);
      goto done;
    }
  if (!(header = build_header(order, nbytes, n, kv, nkv))) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory building the header of %s", path);
    goto done;
  }
  size_t tlen = strlen(path) + 32;
  if (!(tmp = malloc(tlen))) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    goto done;
  }
  snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
  if (!(f = fopen(tmp, "wb"))) {
    rc = TPR_FAIL(TPR_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    goto done;
  }
  TPR_CHECK_GOTO(write_body(f, tmp, header, order, nbytes, n), rc, done);
  int closed = fclose(f);
  f = NULL;
  if (closed != 0) {
    rc = TPR_FAIL(TPR_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    goto done;
  }
  if (rename(tmp, path) != 0) {
    rc = TPR_FAIL(TPR_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    goto done;
  }
  free(tmp);
  tmp = NULL;  // renamed: nothing left to remove
  TPR_CHECK_GOTO(sync_dir(path), rc, done);
done:
  if (f) fclose(f);
  if (tmp && rc != TPR_OK) unlink(tmp);
  free(tmp);
  free(header);
  free(kv);
  free(names);
  free(nbytes);
  free(order);
  return rc;
}
