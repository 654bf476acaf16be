#include "file_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tpr_status tpr_file_read(const char *path, uint8_t **bytes, size_t *len) {
  *bytes = NULL;
  *len = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return TPR_FAIL(TPR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  // Read in chunks rather than trusting ftell, so pipes and /proc files work.
  size_t cap = 1 << 16, n = 0, got;
  uint8_t *buf = malloc(cap);
  while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (n + 1 == cap) {
      uint8_t *grown = realloc(buf, cap *= 2);
      if (!grown) free(buf);
      buf = grown;
    }
  }
  int err = ferror(f);
  fclose(f);
  if (!buf) return TPR_FAIL(TPR_ERR_OOM, "reading %s: out of memory after %zu bytes", path, n);
  if (err) {
    free(buf);
    return TPR_FAIL(TPR_ERR_IO, "cannot read %s", path);
  }
  buf[n] = 0;
  *bytes = buf;
  *len = n;
  return TPR_OK;
}

tpr_status tpr_file_write(const char *path, const uint8_t *bytes, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return TPR_FAIL(TPR_ERR_IO, "cannot create %s: %s", path, strerror(errno));
  size_t put = fwrite(bytes, 1, len, f);
  if (fclose(f) != 0 || put != len) return TPR_FAIL(TPR_ERR_IO, "cannot write %s", path);
  return TPR_OK;
}
