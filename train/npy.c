// The .npy format (numpy/lib/format.py): "\x93NUMPY", major, minor, the
// header length (u16 LE in 1.0, u32 LE in 2.0/3.0), the header (a Python
// dict literal ending in '\n'), then the raw array.
#define _GNU_SOURCE  // mkstemp, fsync, dirname
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/tensor.h"

enum npy_kind { NPY_U1, NPY_U2, NPY_U4, NPY_I4, NPY_I8 };

struct tpr_npy {
  char *path;
  const uint8_t *map;  // the whole file
  size_t map_len;
  const uint8_t *data;  // map + header
  int64_t n;
  int itemsize;
  enum npy_kind kind;
  char descr[4];
};

// ---- header dict parser ------------------------------------------------

typedef struct hdr {
  const char *s, *end, *path;
} hdr;

#define HDR_FAIL(h, ...) hdr_fail((h), __FILE__, __LINE__, __VA_ARGS__)
__attribute__((format(printf, 4, 5))) static tpr_status hdr_fail(const hdr *h, const char *file, int line,
                                                                 const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tpr__fail(TPR_ERR_FORMAT, file, line, "%s: malformed .npy header: %s", h->path, msg);
}

static void skip_ws(hdr *h) {
  while (h->s < h->end && (*h->s == ' ' || *h->s == '\t')) h->s++;
}

static bool eat(hdr *h, char c) {
  skip_ws(h);
  if (h->s < h->end && *h->s == c) {
    h->s++;
    return true;
  }
  return false;
}

// A quoted string without escapes (np.save never writes any).
static tpr_status parse_str(hdr *h, char *out, size_t cap) {
  skip_ws(h);
  if (h->s >= h->end || (*h->s != '\'' && *h->s != '"')) return HDR_FAIL(h, "expected a quoted string");
  char q = *h->s++;
  const char *start = h->s;
  while (h->s < h->end && *h->s != q) {
    if (*h->s == '\\' || *h->s == '\n') return HDR_FAIL(h, "unsupported character in a string");
    h->s++;
  }
  if (h->s >= h->end) return HDR_FAIL(h, "unterminated string");
  size_t len = (size_t)(h->s - start);
  h->s++;
  if (len + 1 > cap) return HDR_FAIL(h, "string '%.*s' too long", (int)(len < 32 ? len : 32), start);
  memcpy(out, start, len);
  out[len] = 0;
  return TPR_OK;
}

static tpr_status parse_bool(hdr *h, bool *v) {
  skip_ws(h);
  size_t left = (size_t)(h->end - h->s);
  if (left >= 4 && !memcmp(h->s, "True", 4)) *v = true, h->s += 4;
  else if (left >= 5 && !memcmp(h->s, "False", 5)) *v = false, h->s += 5;
  else return HDR_FAIL(h, "fortran_order must be True or False");
  return TPR_OK;
}

// A Python tuple of non-negative ints: (), (n,), (n, m), (n, m,).
static tpr_status parse_shape(hdr *h, int64_t *dims, int *ndim) {
  *ndim = 0;
  if (!eat(h, '(')) return HDR_FAIL(h, "shape must be a tuple");
  bool need_comma = false;  // (n) is an int in Python, not a tuple
  for (;;) {
    if (eat(h, ')')) break;
    skip_ws(h);
    if (h->s >= h->end || *h->s < '0' || *h->s > '9') return HDR_FAIL(h, "shape holds a non-integer");
    int64_t d = 0;
    while (h->s < h->end && *h->s >= '0' && *h->s <= '9') {
      if (d > (INT64_MAX - 9) / 10) return HDR_FAIL(h, "shape dimension too large");
      d = d * 10 + (*h->s++ - '0');
    }
    if (*ndim == 8) return HDR_FAIL(h, "shape has too many dimensions");
    dims[(*ndim)++] = d;
    need_comma = *ndim == 1;
    if (eat(h, ',')) {
      need_comma = false;
      continue;
    }
    if (!eat(h, ')')) return HDR_FAIL(h, "shape tuple is not closed");
    break;
  }
  if (need_comma) return HDR_FAIL(h, "shape (%lld) is not a tuple (numpy writes (n,))", (long long)dims[0]);
  return TPR_OK;
}

static tpr_status parse_header(hdr *h, char descr[16], bool *fortran, int64_t *dims, int *ndim) {
  // np.save pads with spaces and ends the header with one newline.
  if (h->end == h->s || h->end[-1] != '\n') return HDR_FAIL(h, "header does not end with a newline");
  h->end--;
  while (h->end > h->s && h->end[-1] == ' ') h->end--;
  if (!eat(h, '{')) return HDR_FAIL(h, "header is not a dict");
  bool have_descr = false, have_fortran = false, have_shape = false;
  for (;;) {
    if (eat(h, '}')) break;
    char key[32];
    TPR_CHECK(parse_str(h, key, sizeof key));
    if (!eat(h, ':')) return HDR_FAIL(h, "expected ':' after key '%s'", key);
    bool *seen;
    if (!strcmp(key, "descr")) {
      seen = &have_descr;
      TPR_CHECK(parse_str(h, descr, 16));
    } else if (!strcmp(key, "fortran_order")) {
      seen = &have_fortran;
      TPR_CHECK(parse_bool(h, fortran));
    } else if (!strcmp(key, "shape")) {
      seen = &have_shape;
      TPR_CHECK(parse_shape(h, dims, ndim));
    } else {
      return HDR_FAIL(h, "unexpected key '%s'", key);
    }
    if (*seen) return HDR_FAIL(h, "key '%s' given twice", key);
    *seen = true;
    if (eat(h, ',')) continue;
    if (!eat(h, '}')) return HDR_FAIL(h, "expected ',' or '}' after '%s'", key);
    break;
  }
  skip_ws(h);
  if (h->s != h->end) return HDR_FAIL(h, "trailing characters after the dict");
  if (!have_descr || !have_fortran || !have_shape)
    return HDR_FAIL(h, "missing key '%s'", !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
  return TPR_OK;
}

// ---- open / access -----------------------------------------------------

static tpr_status check_layout(tpr_npy *t, const uint8_t *b, size_t len) {
  const char *path = t->path;
  static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (memcmp(b, magic, len < 6 ? len : 6) != 0)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: not a .npy file (bad magic)", path);
  if (len < 10) return TPR_FAIL(TPR_ERR_FORMAT, "%s: truncated .npy header (%zu bytes)", path, len);
  int major = b[6], minor = b[7];
  size_t pre, hlen;
  if (major == 1 && minor == 0) {
    pre = 10;
    hlen = (size_t)b[8] | (size_t)b[9] << 8;
  } else if ((major == 2 || major == 3) && minor == 0) {
    if (len < 12) return TPR_FAIL(TPR_ERR_FORMAT, "%s: truncated .npy header (%zu bytes)", path, len);
    pre = 12;
    hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
  } else {
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: unsupported .npy format version %d.%d", path, major, minor);
  }
  if (hlen > len - pre)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: .npy header length %zu runs past the end of the file (%zu bytes)", path,
                    hlen, len);
  hdr h = {(const char *)b + pre, (const char *)b + pre + hlen, path};
  char descr[16];
  bool fortran = false;
  int64_t dims[8];
  int ndim = 0;
  TPR_CHECK(parse_header(&h, descr, &fortran, dims, &ndim));
  if (!strcmp(descr, "|u1")) t->kind = NPY_U1, t->itemsize = 1;
  else if (!strcmp(descr, "<u2")) t->kind = NPY_U2, t->itemsize = 2;
  else if (!strcmp(descr, "<u4")) t->kind = NPY_U4, t->itemsize = 4;
  else if (!strcmp(descr, "<i4")) t->kind = NPY_I4, t->itemsize = 4;
  else if (!strcmp(descr, "<i8")) t->kind = NPY_I8, t->itemsize = 8;
  else
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: dtype '%s' not supported (want '<u2', '<u4', '<i4', '<i8' or '|u1')", path,
                    descr);
  memcpy(t->descr, descr, 4);
  if (fortran) return TPR_FAIL(TPR_ERR_FORMAT, "%s: fortran_order True not supported", path);
  if (ndim != 1) return TPR_FAIL(TPR_ERR_FORMAT, "%s: token array must be 1-D, shape has %d dimensions", path, ndim);
  t->n = dims[0];
  size_t data_len = len - pre - hlen;
  int64_t need;  // the checked size helper: the shape is the file's word, the byte count must not overflow
  if (tpr_size_mul_checked(path, t->n, t->itemsize, TPR_SHAPE_MAX_BYTES, &need) != TPR_OK)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: shape (%lld,) of %s is too large for a token file", path, (long long)t->n,
                    descr);
  if (data_len != (uint64_t)need)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: %zu bytes of data, but shape (%lld,) of %s needs %lld", path, data_len,
                    (long long)t->n, descr, (long long)need);
  t->data = b + pre + hlen;
  return TPR_OK;
}

tpr_status tpr_npy_open(const char *path, tpr_npy **out) {
  *out = NULL;
  tpr_npy *t = calloc(1, sizeof *t);
  if (!t || !(t->path = strdup(path))) {
    free(t);
    return TPR_FAIL(TPR_ERR_OOM, "opening %s: out of memory", path);
  }
  tpr_status rc = TPR_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (fd < 0) {
    rc = TPR_FAIL(TPR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    goto fail;
  }
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    rc = TPR_FAIL(TPR_ERR_IO, "%s: not a regular file", path);
    goto fail;
  }
  if (sb.st_size == 0) {
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: empty file, not a .npy", path);
    goto fail;
  }
  void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED) {
    rc = TPR_FAIL(TPR_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    goto fail;
  }
  close(fd);
  fd = -1;
  t->map = m;
  t->map_len = (size_t)sb.st_size;
  TPR_CHECK_GOTO(check_layout(t, t->map, t->map_len), rc, fail);
  *out = t;
  return TPR_OK;
fail:
  if (fd >= 0) close(fd);
  tpr_npy_close(t);
  return rc;
}

void tpr_npy_close(tpr_npy *t) {
  if (!t) return;
  if (t->map) munmap((void *)t->map, t->map_len);
  free(t->path);
  free(t);
}

int64_t tpr_npy_len(const tpr_npy *t) { return t->n; }
const char *tpr_npy_descr(const tpr_npy *t) { return t->descr; }
const char *tpr_npy_path(const tpr_npy *t) { return t->path; }

// The data offset need not be aligned (headers of other writers), so
// elements are read with memcpy; x86 and arm64 are little-endian like '<'.
static inline int64_t at(const tpr_npy *t, int64_t i) {
  const uint8_t *p = t->data + (size_t)i * (size_t)t->itemsize;
  switch (t->kind) {
    case NPY_U1: return p[0];
    case NPY_U2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case NPY_U4: { uint32_t v; memcpy(&v, p, 4); return v; }
    case NPY_I4: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
  }
}

tpr_status tpr_npy_get(const tpr_npy *t, int64_t i, int64_t *value) {
  if (i < 0 || i >= t->n)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: token index %lld outside [0, %lld)", t->path, (long long)i,
                    (long long)t->n);
  *value = at(t, i);
  return TPR_OK;
}

tpr_status tpr_npy_read_i32(const tpr_npy *t, int64_t start, int64_t count, int32_t *out) {
  if (start < 0 || count < 0 || start > t->n || count > t->n - start)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: tokens [%lld, %lld + %lld) outside [0, %lld)", t->path,
                    (long long)start, (long long)start, (long long)count, (long long)t->n);
  for (int64_t i = 0; i < count; i++) {
    int64_t v = at(t, start + i);
    if (v < 0 || v > INT32_MAX)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: token at position %lld is %lld, not a valid id", t->path,
                      (long long)(start + i), (long long)v);
    out[i] = (int32_t)v;
  }
  return TPR_OK;
}

tpr_status tpr_npy_check_range(const tpr_npy *t, int64_t vocab) {
  if (vocab <= 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: vocabulary size %lld must be > 0", t->path, (long long)vocab);
  for (int64_t i = 0; i < t->n; i++) {
    int64_t v = at(t, i);
    if (v < 0 || v >= vocab)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: token at position %lld is %lld, outside the vocabulary [0, %lld)",
                      t->path, (long long)i, (long long)v, (long long)vocab);
  }
  return TPR_OK;
}

// ---- writer ------------------------------------------------------------

static bool write_all(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    len -= (size_t)w;
  }
  return true;
}

tpr_status tpr_npy_write_i32(const char *path, const int32_t *v, int64_t n) {
  return tpr_npy_write(path, "<i4", v, n);
}

tpr_status tpr_npy_write(const char *path, const char *descr, const void *v, int64_t n) {
  if (n < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: negative token count %lld", path, (long long)n);
  size_t itemsize;
  if (!strcmp(descr, "|u1")) itemsize = 1;
  else if (!strcmp(descr, "<u2")) itemsize = 2;
  else if (!strcmp(descr, "<u4") || !strcmp(descr, "<i4")) itemsize = 4;
  else if (!strcmp(descr, "<i8")) itemsize = 8;
  else return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: cannot write dtype '%s'", path, descr);
  // Header as np.save writes it: dict, spaces, '\n', total padded to 64.
  char head[128];
  int dl = snprintf(head + 10, sizeof head - 10, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }",
                    descr, (long long)n);
  size_t hlen = (size_t)dl + 1;
  while ((10 + hlen) % 64) hlen++;
  memset(head + 10 + dl, ' ', hlen - (size_t)dl - 1);
  head[10 + hlen - 1] = '\n';
  memcpy(head, "\x93NUMPY\x01\x00", 8);
  head[8] = (char)(hlen & 0xff);
  head[9] = (char)(hlen >> 8);

  size_t plen = strlen(path);
  char *tmp = malloc(plen + 16);
  if (!tmp) return TPR_FAIL(TPR_ERR_OOM, "%s: out of memory", path);
  snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    tpr_status rc = TPR_FAIL(TPR_ERR_IO, "cannot create a temporary file beside %s: %s", path, strerror(errno));
    free(tmp);
    return rc;
  }
  bool ok = write_all(fd, head, 10 + hlen) && write_all(fd, v, (size_t)n * itemsize) && fsync(fd) == 0;
  int err = errno;
  ok = (close(fd) == 0) && ok;
  if (ok && rename(tmp, path) != 0) ok = false, err = errno;
  if (!ok) {
    unlink(tmp);
    free(tmp);
    return TPR_FAIL(TPR_ERR_IO, "cannot write %s: %s", path, strerror(err));
  }
  // Make the rename itself durable; a directory that cannot be synced
  // (some file systems) leaves the file written all the same.
  char *dir = strdup(path);
  if (dir) {
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)fsync(dfd);
      close(dfd);
    }
    free(dir);
  }
  free(tmp);
  return TPR_OK;
}
