// Tensors: a dtype, an N-d shape with strides (in elements), and a reference
// to storage that some backend allocated or that the caller wraps.
//
// Ownership is explicit: every tpr_tensor handle is freed with
// tpr_tensor_free(). A view is a new handle on the same storage (the storage
// is reference counted and released with its last handle); views never copy.
// Wrapped storage (tpr_tensor_wrap) is never freed by tpr: the caller keeps it
// alive longer than every handle on it (mmapped checkpoints, arena slices).
#ifndef TPR_TENSOR_H
#define TPR_TENSOR_H

#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#define TPR_MAX_DIMS 8

typedef struct tpr_backend tpr_backend;
typedef struct tpr_storage tpr_storage;

typedef struct tpr_tensor {
  tpr_dtype dtype;
  int ndim;                       // 0 (scalar) .. TPR_MAX_DIMS
  int64_t shape[TPR_MAX_DIMS];    // (ndim)
  int64_t stride[TPR_MAX_DIMS];   // (ndim) in elements; 0 broadcasts
  int64_t offset;                 // first element, in elements from storage start
  tpr_storage *storage;
} tpr_tensor;

// A new contiguous (row-major) tensor on `backend`; contents uninitialised.
tpr_status tpr_tensor_new(tpr_backend *backend, tpr_dtype dtype, int ndim, const int64_t *shape,
                          tpr_tensor **out);
// A contiguous tensor over memory the caller owns (host or device memory of
// `backend`). `data` must hold numel * dtype size bytes.
tpr_status tpr_tensor_wrap(tpr_backend *backend, tpr_dtype dtype, int ndim, const int64_t *shape,
                           void *data, tpr_tensor **out);
void tpr_tensor_free(tpr_tensor *t);

// Views (new handles, same storage, no copy).
// reshape: t must be contiguous; numel must match.
tpr_status tpr_tensor_reshape(const tpr_tensor *t, int ndim, const int64_t *shape, tpr_tensor **out);
// permute: out.shape[i] = t.shape[perm[i]]; perm is a permutation of 0..ndim-1.
tpr_status tpr_tensor_permute(const tpr_tensor *t, const int *perm, tpr_tensor **out);
// transpose of two dims.
tpr_status tpr_tensor_transpose(const tpr_tensor *t, int dim0, int dim1, tpr_tensor **out);
// slice [start, start+len) along dim.
tpr_status tpr_tensor_slice(const tpr_tensor *t, int dim, int64_t start, int64_t len, tpr_tensor **out);

int64_t tpr_tensor_numel(const tpr_tensor *t);
size_t tpr_tensor_nbytes(const tpr_tensor *t);  // numel * dtype size
bool tpr_tensor_is_contiguous(const tpr_tensor *t);
bool tpr_tensor_same_shape(const tpr_tensor *a, const tpr_tensor *b);
// Address of element 0 (storage base + offset). Host or device per backend.
void *tpr_tensor_data(const tpr_tensor *t);
tpr_backend *tpr_tensor_backend(const tpr_tensor *t);
// Handles sharing this storage (1 for a fresh tensor, +1 per live view).
int tpr_tensor_storage_refs(const tpr_tensor *t);
// "f32(2,3,4)" into buf; returns buf.
const char *tpr_tensor_describe(const tpr_tensor *t, char *buf, size_t cap);

// Upper bounds on anything described by bytes from outside (programs,
// checkpoint headers, manifests, configs, token files, CLI sizes): far above
// any real tensor (a 1T-parameter model's largest is ~2^32 elements) and far
// below int64 overflow, so sums and products of a few of them stay exact.
#define TPR_SHAPE_MAX_NUMEL (INT64_C(1) << 48)
#define TPR_SHAPE_MAX_BYTES (INT64_C(1) << 50)
#define TPR_NAME_MAX 1024  // bytes of a tensor / value / file-format name

// Row-major strides for a shape. Saturates at INT64_MAX instead of
// overflowing (callers reject such shapes with tpr_shape_check).
void tpr_shape_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
// Product of the dims; INT64_MAX when it would overflow (never UB).
int64_t tpr_shape_numel(int ndim, const int64_t *shape);
// Validates ndim, non-negative dims and numel <= TPR_SHAPE_MAX_NUMEL
// (checked without overflow); a clear error names the bad dim.
tpr_status tpr_shape_check(int ndim, const int64_t *shape);
// The one checked helper for shapes that come from outside: tpr_shape_check
// plus the byte size numel * dtype size <= TPR_SHAPE_MAX_BYTES. `what` names
// the tensor in the error (e.g. "model.safetensors: tensor 'w'"). numel and
// nbytes may be NULL. Errors: TPR_ERR_SHAPE, TPR_ERR_DTYPE.
tpr_status tpr_shape_size_checked(const char *what, tpr_dtype dtype, int ndim, const int64_t *shape, int64_t *numel,
                                  size_t *nbytes);
// a * b for non-negative sizes from outside; TPR_ERR_SHAPE naming `what` if
// the product exceeds `limit` (or overflows).
tpr_status tpr_size_mul_checked(const char *what, int64_t a, int64_t b, int64_t limit, int64_t *out);
// A name from outside: `len` bytes of valid UTF-8 (no overlong forms,
// surrogates or code points past U+10FFFF), no NUL, 1..TPR_NAME_MAX bytes.
// Errors: TPR_ERR_FORMAT naming `what`.
tpr_status tpr_name_check(const char *what, const char *name, size_t len);
// True when s[0..len) is valid UTF-8 (the rule tpr_name_check applies).
bool tpr_utf8_valid(const char *s, size_t len);

// Internal: view geometry rules shared by tensor views and program view ops.
// Each fills desc (same dtype/storage as t) with the view's shape, strides
// and offset; tpr__view_apply copies that geometry onto a handle.
tpr_status tpr__view_reshape(const tpr_tensor *t, int ndim, const int64_t *shape, tpr_tensor *desc);
tpr_status tpr__view_permute(const tpr_tensor *t, const int *perm, tpr_tensor *desc);
tpr_status tpr__view_slice(const tpr_tensor *t, int dim, int64_t start, int64_t len, tpr_tensor *desc);
void tpr__view_apply(tpr_tensor *view, const tpr_tensor *desc);

#endif
