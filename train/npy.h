// Token files: 1-D numpy .npy arrays (np.save of a uint16/uint32/int32/int64
// vector, as nanoGPT's and Megatron's data preparation scripts write them),
// memory-mapped read-only.
//
// Accepted: format versions 1.0, 2.0 and 3.0; descr '<u2', '<u4', '<i4',
// '<i8' or '|u1' (the loss masks of token shards, train/tokens.h); fortran_order False; shape (n,). The header dict is parsed
// strictly (what np.save writes: a Python dict literal with exactly those
// three keys, any order, optional trailing comma, space padding and a final
// newline), and the file size must equal header + n * itemsize. Anything
// else is TPR_ERR_FORMAT naming the file and the problem.
#ifndef TPR_TRAIN_NPY_H
#define TPR_TRAIN_NPY_H

#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr_npy tpr_npy;

tpr_status tpr_npy_open(const char *path, tpr_npy **out);
void tpr_npy_close(tpr_npy *t);

int64_t tpr_npy_len(const tpr_npy *t);
const char *tpr_npy_descr(const tpr_npy *t);  // "<u2", ...
const char *tpr_npy_path(const tpr_npy *t);

// Token i as int64; i outside [0, len) is TPR_ERR_INVALID_ARG.
tpr_status tpr_npy_get(const tpr_npy *t, int64_t i, int64_t *value);

// Tokens [start, start + count) into out as int32: fails on a range past the
// end or a value outside [0, INT32_MAX] (run tpr_npy_check_range first to
// report against the vocabulary instead).
tpr_status tpr_npy_read_i32(const tpr_npy *t, int64_t start, int64_t count, int32_t *out);

// Every id in [0, vocab), or TPR_ERR_INVALID_ARG naming the first offending
// position and its value.
tpr_status tpr_npy_check_range(const tpr_npy *t, int64_t vocab);

// Writes v (n,) as a version-1.0 '<i4' .npy, atomically: a temporary file in
// the same directory, fsync, then rename over path.
tpr_status tpr_npy_write_i32(const char *path, const int32_t *v, int64_t n);
// The same for any descr the reader accepts; v holds n items of that type.
tpr_status tpr_npy_write(const char *path, const char *descr, const void *v, int64_t n);

#endif
