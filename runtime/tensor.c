#include "tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

// Storage is shared by a tensor and all its views; the last handle frees it.
struct tpr_storage {
  tpr_backend *backend;
  void *data;
  size_t bytes;
  int refs;
  bool owned;  // allocated by tpr (freed with the last ref) or wrapped
};

tpr_status tpr_shape_check(int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > TPR_MAX_DIMS)
    return TPR_FAIL(TPR_ERR_SHAPE, "ndim %d outside [0, %d]", ndim, TPR_MAX_DIMS);
  if (ndim > 0 && !shape) return TPR_FAIL(TPR_ERR_INVALID_ARG, "NULL shape for %d dims", ndim);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) return TPR_FAIL(TPR_ERR_SHAPE, "dim %d has negative size %lld", i, (long long)shape[i]);
  // A zero dim makes the tensor empty whatever the others are, but each dim
  // alone must still be sane: strides are products of the trailing dims.
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    int64_t d = shape[i] > 0 ? shape[i] : 1;
    if (shape[i] > TPR_SHAPE_MAX_NUMEL || __builtin_mul_overflow(n, d, &n) || n > TPR_SHAPE_MAX_NUMEL)
      return TPR_FAIL(TPR_ERR_SHAPE, "shape has more than 2^48 elements (dim %d is %lld)", i, (long long)shape[i]);
  }
  return TPR_OK;
}

tpr_status tpr_shape_size_checked(const char *what, tpr_dtype dtype, int ndim, const int64_t *shape, int64_t *numel,
                                  size_t *nbytes) {
  if (!what) what = "tensor";
  size_t es = tpr_dtype_size(dtype);
  if (!tpr_dtype_valid(dtype) || es == 0) return TPR_FAIL(TPR_ERR_DTYPE, "%s: invalid dtype %d", what, (int)dtype);
  if (tpr_shape_check(ndim, shape) != TPR_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tpr_last_error());
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %s", what, why);
  }
  int64_t n = tpr_shape_numel(ndim, shape), b;
  if (__builtin_mul_overflow(n, (int64_t)es, &b) || b > TPR_SHAPE_MAX_BYTES)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %lld elements of %zu bytes exceed 2^50 bytes", what, (long long)n, es);
  if (numel) *numel = n;
  if (nbytes) *nbytes = (size_t)b;
  return TPR_OK;
}

tpr_status tpr_size_mul_checked(const char *what, int64_t a, int64_t b, int64_t limit, int64_t *out) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r) || r > limit)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: %lld * %lld is negative or exceeds %lld", what ? what : "size", (long long)a,
                    (long long)b, (long long)limit);
  *out = r;
  return TPR_OK;
}

bool tpr_utf8_valid(const char *str, size_t len) {
  const unsigned char *s = (const unsigned char *)str;
  for (size_t i = 0; i < len;) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    int n = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : -1;
    if (n < 0 || len - i <= (size_t)n) return false;  // a stray continuation, 0xc0/0xc1/0xf5+, or cut short
    // The second byte's range excludes overlong forms, surrogates and > U+10FFFF.
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (s[i + 1] < lo || s[i + 1] > hi) return false;
    for (int k = 2; k <= n; k++)
      if ((s[i + k] & 0xc0) != 0x80) return false;
    i += (size_t)n + 1;
  }
  return true;
}

tpr_status tpr_name_check(const char *what, const char *name, size_t len) {
  if (!what) what = "name";
  if (!name || len == 0) return TPR_FAIL(TPR_ERR_FORMAT, "%s: empty name", what);
  if (len > TPR_NAME_MAX) return TPR_FAIL(TPR_ERR_FORMAT, "%s: name of %zu bytes (limit %d)", what, len, TPR_NAME_MAX);
  if (memchr(name, 0, len)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: name holds a NUL byte", what);
  if (!tpr_utf8_valid(name, len)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: name is not valid UTF-8", what);
  return TPR_OK;
}

int64_t tpr_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++)
    if (shape[i] == 0) return 0;  // empty, however large the other dims
  for (int i = 0; i < ndim; i++)
    if (__builtin_mul_overflow(n, shape[i], &n)) return INT64_MAX;
  return n;
}

void tpr_shape_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    stride[i] = s;
    if (__builtin_mul_overflow(s, shape[i] > 0 ? shape[i] : 1, &s)) s = INT64_MAX;
  }
}

static tpr_status tensor_init(tpr_dtype dtype, int ndim, const int64_t *shape, tpr_tensor **out) {
  *out = NULL;
  if (!tpr_dtype_valid(dtype)) return TPR_FAIL(TPR_ERR_DTYPE, "invalid dtype %d", (int)dtype);
  TPR_CHECK(tpr_shape_check(ndim, shape));
  tpr_tensor *t = calloc(1, sizeof *t);
  if (!t) return TPR_FAIL(TPR_ERR_OOM, "tensor handle");
  t->dtype = dtype;
  t->ndim = ndim;
  if (ndim > 0) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  tpr_shape_contiguous_strides(ndim, shape, t->stride);
  *out = t;
  return TPR_OK;
}

static tpr_status attach_storage(tpr_tensor *t, tpr_backend *be, void *data, size_t bytes, bool owned) {
  tpr_storage *s = calloc(1, sizeof *s);
  if (!s) return TPR_FAIL(TPR_ERR_OOM, "tensor storage");
  *s = (tpr_storage){.backend = be, .data = data, .bytes = bytes, .refs = 1, .owned = owned};
  t->storage = s;
  return TPR_OK;
}

tpr_status tpr_tensor_new(tpr_backend *backend, tpr_dtype dtype, int ndim, const int64_t *shape,
                          tpr_tensor **out) {
  if (!backend || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_tensor_new: NULL backend or out");
  tpr_tensor *t;
  TPR_CHECK(tensor_init(dtype, ndim, shape, &t));
  size_t bytes = tpr_tensor_nbytes(t);
  void *data = NULL;
  tpr_status rc = tpr_backend_alloc(backend, bytes, &data);
  if (rc == TPR_OK) rc = attach_storage(t, backend, data, bytes, true);
  if (rc != TPR_OK) {
    if (data) tpr_backend_release(backend, data);
    free(t);
    return rc;
  }
  *out = t;
  return TPR_OK;
}

tpr_status tpr_tensor_wrap(tpr_backend *backend, tpr_dtype dtype, int ndim, const int64_t *shape,
                           void *data, tpr_tensor **out) {
  if (!backend || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_tensor_wrap: NULL backend or out");
  tpr_tensor *t;
  TPR_CHECK(tensor_init(dtype, ndim, shape, &t));
  size_t bytes = tpr_tensor_nbytes(t);
  if (!data && bytes) {
    free(t);
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_tensor_wrap: NULL data for %zu bytes", bytes);
  }
  tpr_status rc = attach_storage(t, backend, data, bytes, false);
  if (rc != TPR_OK) {
    free(t);
    return rc;
  }
  *out = t;
  return TPR_OK;
}

void tpr_tensor_free(tpr_tensor *t) {
  if (!t) return;
  tpr_storage *s = t->storage;
  if (s && --s->refs == 0) {
    if (s->owned && s->data) tpr_backend_release(s->backend, s->data);
    free(s);
  }
  free(t);
}

// A new handle sharing t's storage; geometry is filled in by the caller.
static tpr_status new_view(const tpr_tensor *t, tpr_tensor **out) {
  if (!t || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "view of a NULL tensor");
  tpr_tensor *v = malloc(sizeof *v);
  if (!v) return TPR_FAIL(TPR_ERR_OOM, "view handle");
  *v = *t;
  if (v->storage) v->storage->refs++;
  *out = v;
  return TPR_OK;
}

tpr_status tpr_tensor_reshape(const tpr_tensor *t, int ndim, const int64_t *shape, tpr_tensor **out) {
  tpr_tensor desc;
  TPR_CHECK(tpr__view_reshape(t, ndim, shape, &desc));
  TPR_CHECK(new_view(t, out));
  tpr__view_apply(*out, &desc);
  return TPR_OK;
}

tpr_status tpr_tensor_permute(const tpr_tensor *t, const int *perm, tpr_tensor **out) {
  tpr_tensor desc;
  TPR_CHECK(tpr__view_permute(t, perm, &desc));
  TPR_CHECK(new_view(t, out));
  tpr__view_apply(*out, &desc);
  return TPR_OK;
}

tpr_status tpr_tensor_transpose(const tpr_tensor *t, int dim0, int dim1, tpr_tensor **out) {
  if (!t) return TPR_FAIL(TPR_ERR_INVALID_ARG, "transpose of a NULL tensor");
  if (dim0 < 0 || dim0 >= t->ndim || dim1 < 0 || dim1 >= t->ndim)
    return TPR_FAIL(TPR_ERR_SHAPE, "transpose dims (%d, %d) outside a %d-d tensor", dim0, dim1, t->ndim);
  int perm[TPR_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) perm[i] = i;
  perm[dim0] = dim1;
  perm[dim1] = dim0;
  return tpr_tensor_permute(t, perm, out);
}

tpr_status tpr_tensor_slice(const tpr_tensor *t, int dim, int64_t start, int64_t len, tpr_tensor **out) {
  tpr_tensor desc;
  TPR_CHECK(tpr__view_slice(t, dim, start, len, &desc));
  TPR_CHECK(new_view(t, out));
  tpr__view_apply(*out, &desc);
  return TPR_OK;
}

// View geometry rules, shared with the program builder's view ops so a view
// means the same thing eagerly and inside a program.
tpr_status tpr__view_reshape(const tpr_tensor *t, int ndim, const int64_t *shape, tpr_tensor *desc) {
  if (!t) return TPR_FAIL(TPR_ERR_INVALID_ARG, "reshape of a NULL tensor");
  TPR_CHECK(tpr_shape_check(ndim, shape));
  if (!tpr_tensor_is_contiguous(t))
    return TPR_FAIL(TPR_ERR_SHAPE, "reshape needs a contiguous tensor (cast/copy it first)");
  int64_t n_new = tpr_shape_numel(ndim, shape), n_old = tpr_tensor_numel(t);
  if (n_new != n_old)
    return TPR_FAIL(TPR_ERR_SHAPE, "reshape from %lld to %lld elements", (long long)n_old, (long long)n_new);
  *desc = *t;
  desc->ndim = ndim;
  if (ndim > 0) memcpy(desc->shape, shape, (size_t)ndim * sizeof *shape);
  tpr_shape_contiguous_strides(ndim, shape, desc->stride);
  return TPR_OK;
}

tpr_status tpr__view_permute(const tpr_tensor *t, const int *perm, tpr_tensor *desc) {
  if (!t || !perm) return TPR_FAIL(TPR_ERR_INVALID_ARG, "permute: NULL tensor or perm");
  int seen[TPR_MAX_DIMS] = {0};
  for (int i = 0; i < t->ndim; i++) {
    if (perm[i] < 0 || perm[i] >= t->ndim || seen[perm[i]]++)
      return TPR_FAIL(TPR_ERR_SHAPE, "permute: perm[%d]=%d is not a permutation of 0..%d", i, perm[i], t->ndim - 1);
  }
  *desc = *t;
  for (int i = 0; i < t->ndim; i++) {
    desc->shape[i] = t->shape[perm[i]];
    desc->stride[i] = t->stride[perm[i]];
  }
  return TPR_OK;
}

tpr_status tpr__view_slice(const tpr_tensor *t, int dim, int64_t start, int64_t len, tpr_tensor *desc) {
  if (!t) return TPR_FAIL(TPR_ERR_INVALID_ARG, "slice of a NULL tensor");
  if (dim < 0 || dim >= t->ndim) return TPR_FAIL(TPR_ERR_SHAPE, "slice dim %d outside a %d-d tensor", dim, t->ndim);
  if (start < 0 || len < 0 || start + len > t->shape[dim])
    return TPR_FAIL(TPR_ERR_SHAPE, "slice [%lld, %lld) outside dim %d of size %lld", (long long)start,
                    (long long)(start + len), dim, (long long)t->shape[dim]);
  *desc = *t;
  desc->shape[dim] = len;
  desc->offset = t->offset + start * t->stride[dim];
  return TPR_OK;
}

void tpr__view_apply(tpr_tensor *view, const tpr_tensor *desc) {
  view->ndim = desc->ndim;
  memcpy(view->shape, desc->shape, sizeof view->shape);
  memcpy(view->stride, desc->stride, sizeof view->stride);
  view->offset = desc->offset;
}

int64_t tpr_tensor_numel(const tpr_tensor *t) { return tpr_shape_numel(t->ndim, t->shape); }

size_t tpr_tensor_nbytes(const tpr_tensor *t) {
  return (size_t)tpr_tensor_numel(t) * tpr_dtype_size(t->dtype);
}

bool tpr_tensor_is_contiguous(const tpr_tensor *t) {
  if (tpr_tensor_numel(t) == 0) return true;  // nothing to address (tpr_tensor_new gives (2,0,3) strides (3,3,1))
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] == 1) continue;  // a size-1 dim's stride never matters
    if (t->stride[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

bool tpr_tensor_same_shape(const tpr_tensor *a, const tpr_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

void *tpr_tensor_data(const tpr_tensor *t) {
  if (!t->storage || !t->storage->data) return NULL;
  return (char *)t->storage->data + t->offset * (int64_t)tpr_dtype_size(t->dtype);
}

tpr_backend *tpr_tensor_backend(const tpr_tensor *t) { return t->storage ? t->storage->backend : NULL; }

int tpr_tensor_storage_refs(const tpr_tensor *t) { return t->storage ? t->storage->refs : 0; }

const char *tpr_tensor_describe(const tpr_tensor *t, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "%s(", tpr_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)t->shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, ")");
  return buf;
}
