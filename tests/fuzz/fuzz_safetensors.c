// safetensors open + read: the input is a .safetensors file. Every tensor
// that opens is read whole, raw and converted to f32 (FP8 weights with a
// scale_inv tensor dequantize on the way), and the first row as a box.
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "shard/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fz_write("in.safetensors", data, size);
  tpr_st_set *set = NULL;
  if (tpr_st_open(path, &set) != TPR_OK) return 0;
  int n = tpr_st_count(set);
  for (int i = 0; i < n; i++) {
    const tpr_st_tensor *t = tpr_st_get(set, i);
    fz_require(t && t->numel >= 0 && t->nbytes == (size_t)t->numel * tpr_dtype_size(t->dtype), "tensor size");
    // The data section bounds numel except for empty tensors; keep reads small.
    if (t->numel > (1 << 20)) continue;
    void *raw = malloc(t->nbytes ? t->nbytes : 1);
    float *f = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *f);
    if (!raw || !f) abort();
    if (tpr_st_read(set, t->name, NULL, NULL, t->dtype, raw) == TPR_OK)
      fz_require(!t->nbytes || memcmp(raw, t->data, t->nbytes) == 0, "raw read equals the mapped bytes");
    (void)tpr_st_read_f32(set, t->name, NULL, NULL, f);
    if (t->ndim > 0 && t->shape[0] > 0) {
      int64_t start[TPR_MAX_DIMS] = {0}, len[TPR_MAX_DIMS];
      for (int d = 0; d < t->ndim; d++) len[d] = d ? t->shape[d] : 1;
      (void)tpr_st_read_f32(set, t->name, start, len, f);
    }
    free(raw);
    free(f);
  }
  (void)tpr_st_metadata(set, "format");
  tpr_st_close(set);
  return 0;
}
