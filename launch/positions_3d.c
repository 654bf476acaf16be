#include "launch/positions_3d.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/file_io.h"
#include "shard/safetensors.h"

// (3, T) values of an i32 (esz 4) or i64 (esz 8) buffer into out, range checked.
static tpr_status take(const char *path, const uint8_t *src, int esz, int64_t T, int32_t *out) {
  for (int64_t i = 0; i < 3 * T; i++) {
    int64_t v;
    if (esz == 4) {
      int32_t w;
      memcpy(&w, src + i * 4, 4);
      v = w;
    } else {
      memcpy(&v, src + i * 8, 8);
    }
    if (v < 0 || v > INT32_MAX)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: position %lld (axis %lld, token %lld) is outside [0, 2^31)", path,
                      (long long)v, (long long)(i / T), (long long)(i % T));
    out[i] = (int32_t)v;
  }
  return TPR_OK;
}

// np.save's header: magic, version, header length, a dict literal with
// 'descr', 'fortran_order' and 'shape' (format 1.0: u16 length; 2.0/3.0: u32).
static tpr_status read_npy(const char *path, const uint8_t *b, size_t n, int64_t T, int32_t *out) {
  if (n < 10 || memcmp(b, "\x93NUMPY", 6) != 0) return TPR_FAIL(TPR_ERR_FORMAT, "%s: not a .npy file", path);
  size_t hl = b[6] == 1 ? (size_t)(b[8] | b[9] << 8) : 0, at = b[6] == 1 ? 10 : 12;
  if (b[6] != 1) {
    if (n < 12) return TPR_FAIL(TPR_ERR_FORMAT, "%s: truncated .npy header", path);
    hl = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
  }
  if (hl > 65536 || at + hl > n) return TPR_FAIL(TPR_ERR_FORMAT, "%s: .npy header length %zu is wrong", path, hl);
  char h[65537];
  memcpy(h, b + at, hl);
  h[hl] = 0;
  for (size_t k = hl; k > 0 && (h[k - 1] == ' ' || h[k - 1] == '\n'); k--) h[k - 1] = 0;  // np.save's padding
  int esz = strstr(h, "'descr': '<i4'") ? 4 : strstr(h, "'descr': '<i8'") ? 8 : 0;
  if (!esz) return TPR_FAIL(TPR_ERR_FORMAT, "%s: positions must be int32 or int64 (descr '<i4' / '<i8'): %s", path, h);
  if (!strstr(h, "'fortran_order': False"))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: a Fortran-order array; save it C-contiguous", path);
  char want[64];
  snprintf(want, sizeof want, "'shape': (3, %lld)", (long long)T);
  if (!strstr(h, want)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: shape must be (3, %lld) for %lld tokens: %s", path,
                                        (long long)T, (long long)T, h);
  if (n - at - hl != (size_t)(3 * T * esz))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: %zu data bytes, (3, %lld) needs %lld", path, n - at - hl, (long long)T,
                    (long long)(3 * T * esz));
  return take(path, b + at + hl, esz, T, out);
}

static tpr_status read_st(const char *path, int64_t T, int32_t *out) {
  tpr_st_set *set = NULL;
  TPR_CHECK(tpr_st_open(path, &set));
  const tpr_st_tensor *t = tpr_st_find(set, "positions_3d");
  if (!t && tpr_st_count(set) == 1) t = tpr_st_get(set, 0);
  tpr_status rc = TPR_OK;
  if (!t) rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: no tensor \"positions_3d\" and not exactly one tensor", path);
  else if (t->dtype != TPR_I32 && t->dtype != TPR_I64)
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: %s is %s; positions must be I32 or I64", path, t->name, tpr_dtype_name(t->dtype));
  else if (!((t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == T) ||
             (t->ndim == 3 && t->shape[0] == 3 && t->shape[1] == 1 && t->shape[2] == T)))
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: %s must be (3, %lld) or (3, 1, %lld) for %lld tokens", path, t->name,
                  (long long)T, (long long)T, (long long)T);
  else
    rc = take(path, t->data, t->dtype == TPR_I32 ? 4 : 8, T, out);
  tpr_st_close(set);
  return rc;
}

tpr_status tpr_positions_3d_read(const char *path, int64_t T, int32_t **out) {
  *out = NULL;
  if (T < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "--positions-3d: no tokens");
  int32_t *p = malloc((size_t)(3 * T) * sizeof *p);
  if (!p) return TPR_FAIL(TPR_ERR_OOM, "positions (3, %lld)", (long long)T);
  size_t len = strlen(path);
  tpr_status rc;
  if (len >= 4 && !strcmp(path + len - 4, ".npy")) {
    uint8_t *b = NULL;
    size_t n = 0;
    rc = tpr_file_read(path, &b, &n);
    if (rc == TPR_OK) rc = read_npy(path, b, n, T, p);
    free(b);
  } else {
    rc = read_st(path, T, p);
  }
  if (rc != TPR_OK) {
    free(p);
    return rc;
  }
  *out = p;
  return TPR_OK;
}
