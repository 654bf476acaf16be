// Reading and writing safetensors checkpoints (Hugging Face format).
//
// A file is: u64 little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, "name": {"dtype": "BF16", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// then the data section; offsets count from its first byte, tensors are
// row-major little-endian. Files are mmapped read-only, so opening a
// checkpoint costs its headers only and each rank touches just the pages of
// the slices it reads (docs/architecture.md section 7).
//
// Every header is validated on open; a malformed file is a TPR_ERR_FORMAT
// naming the file and the tensor, never a crash.
#ifndef TPR_SAFETENSORS_H
#define TPR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

// Headers larger than this are refused as corrupt (the reference
// implementation's limit too), before any allocation is sized by them.
#define TPR_ST_MAX_HEADER 100000000u

// FP8 block size of the DeepSeek-V3 / MiniMax-M2 releases
// (quantization_config.weight_block_size = [128, 128]).
#define TPR_ST_FP8_BLOCK 128

typedef struct tpr_st_tensor {
  const char *name;
  tpr_dtype dtype;
  int ndim;                     // 0 (scalar) .. TPR_MAX_DIMS
  int64_t shape[TPR_MAX_DIMS];  // (ndim)
  int64_t numel;                // product of shape (1 for a scalar)
  size_t nbytes;                // numel * tpr_dtype_size(dtype)
  // The mapped bytes (nbytes long, read-only, row-major). Not necessarily
  // aligned to the element size: the format does not promise it.
  const void *data;
  const char *path;  // the file holding it
} tpr_st_tensor;

typedef struct tpr_st_set tpr_st_set;

// Opens `path`: a .safetensors file, or a directory holding
// model.safetensors.index.json (a sharded set: every file it names is
// opened, and every tensor of its weight_map must be in the file it names),
// else model.safetensors, else every *.safetensors file in it (by name).
// Tensors of all opened files share one name index; a name held twice is an
// error. Bytes of the data section that no tensor covers (holes, a tail)
// are accepted, though the reference reader refuses them: they cannot
// change a value read. Overlapping tensors are refused.
// The set is read-only after open: reads may run from many threads.
// Errors: TPR_ERR_IO (missing or unreadable file), TPR_ERR_FORMAT (malformed
// header or index), TPR_ERR_UNSUPPORTED (a safetensors dtype tpr has no
// counterpart for, e.g. F64).
tpr_status tpr_st_open(const char *path, tpr_st_set **out);
void tpr_st_close(tpr_st_set *set);  // unmaps everything; NULL is fine

// Tensors sorted by name (strcmp order); index 0 .. count-1.
int tpr_st_count(const tpr_st_set *set);
const tpr_st_tensor *tpr_st_get(const tpr_st_set *set, int i);  // NULL if out of range
const tpr_st_tensor *tpr_st_find(const tpr_st_set *set, const char *name);  // NULL if absent

// A "__metadata__" value: the first file (in open order) holding `key`
// wins; NULL if none does.
const char *tpr_st_metadata(const tpr_st_set *set, const char *key);

// Block size of FP8 scale_inv tensors (default TPR_ST_FP8_BLOCK both ways);
// a checkpoint's config.json says it as weight_block_size.
tpr_status tpr_st_set_fp8_block(tpr_st_set *set, int rows, int cols);

// Reads the box [start, start+len) of tensor `name` (start, len: (ndim),
// either may be NULL for 0 / the full extent) into dst, contiguous row-major
// of shape (len[0], ..., len[ndim-1]) and dtype dst_dt.
// - dst_dt == the tensor's dtype: the raw bytes, no scaling.
// - otherwise values are converted (tpr_dtype_convert rules). An F8E4M3 2-D
//   weight (R, C) with a tensor `<name>_scale_inv` of shape
//   (ceil(R/br), ceil(C/bc)) is dequantized on the way:
//   value[r][c] = f8(x[r][c]) * scale_inv[r/br][c/bc], in f32, then rounded
//   once to dst_dt (DeepSeek-V3 weight_dequant; scale_inv f32, bf16 or f16).
// Errors: TPR_ERR_INVALID_ARG (no such tensor), TPR_ERR_SHAPE (box out of
// bounds), TPR_ERR_FORMAT (a scale_inv of the wrong shape or dtype).
tpr_status tpr_st_read(const tpr_st_set *set, const char *name, const int64_t *start, const int64_t *len,
                       tpr_dtype dst_dt, void *dst);

// tpr_st_read into f32: dst (len[0], ..., len[ndim-1]).
tpr_status tpr_st_read_f32(const tpr_st_set *set, const char *name, const int64_t *start, const int64_t *len,
                           float *dst);

typedef struct tpr_st_write_entry {
  const char *name;
  tpr_dtype dtype;
  int ndim;
  const int64_t *shape;  // (ndim); may be NULL when ndim == 0
  const void *data;      // numel * dtype size bytes, row-major; NULL if empty
} tpr_st_write_entry;

// Writes a safetensors file byte for byte as the reference writer does
// (safetensors' Rust core): "__metadata__" first (keys sorted by name here;
// the reference's order is a hash map's), then tensors ordered by dtype,
// widest first (I64, F32, I32, BF16, F16, F8_E4M3, U8), then by name, which
// keeps each tensor aligned to its element size; data in that order; the
// header padded with spaces to a multiple of 8 bytes. metadata_kv is NULL
// or a NULL-terminated list of key, value pairs.
// Atomic: written to "<path>.tmp.<pid>", fsynced, renamed over path, the
// directory fsynced; on any error the temporary file is removed and path
// is untouched.
tpr_status tpr_st_write(const char *path, const tpr_st_write_entry *entries, int n,
                        const char *const *metadata_kv);

// Internal, shared by the safetensors*.c files.
void tpr__st_fp8_block(const tpr_st_set *set, int *rows, int *cols);
const char *tpr__st_dtype_name(tpr_dtype dt);  // "BF16"; NULL if the format has none

#endif
