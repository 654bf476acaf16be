// .npy token files: open, range check against a vocabulary, read as int32.
#include <stdlib.h>

#include "fuzz_common.h"
#include "train/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tpr_npy *t = NULL;
  if (tpr_npy_open(fz_write("tokens.npy", data, size), &t) != TPR_OK) return 0;
  int64_t n = tpr_npy_len(t);
  fz_require(n >= 0, "length is non-negative");
  (void)tpr_npy_check_range(t, 1000);
  int64_t v;
  if (n > 0) (void)tpr_npy_get(t, n - 1, &v);
  fz_require(tpr_npy_get(t, n, &v) != TPR_OK && tpr_npy_get(t, -1, &v) != TPR_OK, "index past the end refused");
  int64_t count = n < 4096 ? n : 4096;
  int32_t *out = malloc((size_t)(count ? count : 1) * sizeof *out);
  if (!out) abort();
  (void)tpr_npy_read_i32(t, n - count, count, out);
  fz_require(tpr_npy_read_i32(t, n, 1, out) != TPR_OK, "read past the end refused");
  free(out);
  tpr_npy_close(t);
  return 0;
}
