// Strided N-d iteration for the CPU kernels (elementwise, copy, gather, and
// matmul's scratch copies). Header-only static inline helpers: the kernels
// are the only users and the loops should inline into them.
//
// The iterator walks an index space row by row: adjacent dims that every
// operand can step through with one stride are merged and size-1 dims are
// dropped, so all-contiguous operands become a single row and the caller's
// inner loop (unit stride) is the only loop that runs: the fast path needs
// no separate code.
#ifndef TPR_OPS_STRIDED_H
#define TPR_OPS_STRIDED_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "runtime/tensor.h"

#define TPR__ITER_MAX_OPS 3

typedef struct tpr__iter {
  int n_ops;
  int ndim;                                          // merged dims, >= 1
  int64_t shape[TPR_MAX_DIMS];                       // (ndim)
  int64_t stride[TPR__ITER_MAX_OPS][TPR_MAX_DIMS];   // (n_ops, ndim) in elements
  int64_t idx[TPR_MAX_DIMS];                         // (ndim) position in the outer dims
  int64_t off[TPR__ITER_MAX_OPS];                    // (n_ops) element offset of the current row
  int64_t n;                                         // row length
  int64_t inner[TPR__ITER_MAX_OPS];                  // (n_ops) stride along the row
} tpr__iter;

// Sets up iteration over `shape` (ndim dims) for n_ops operands whose element
// strides are stride[k] (each (ndim)). Returns false when the space is empty;
// otherwise the first row is ready: off[], n and inner[].
// Use: if (tpr__iter_init(...)) do { row } while (tpr__iter_next(&it));
static inline bool tpr__iter_init(tpr__iter *it, int ndim, const int64_t *shape, int n_ops,
                                  const int64_t *const *stride) {
  int nd = 0;
  it->n_ops = n_ops;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 0) return false;
    if (shape[d] == 1) continue;  // a size-1 dim never moves any offset
    bool merge = nd > 0;
    for (int k = 0; merge && k < n_ops; k++)
      merge = it->stride[k][nd - 1] == stride[k][d] * shape[d];
    if (merge) {
      it->shape[nd - 1] *= shape[d];
      for (int k = 0; k < n_ops; k++) it->stride[k][nd - 1] = stride[k][d];
      continue;
    }
    it->shape[nd] = shape[d];
    for (int k = 0; k < n_ops; k++) it->stride[k][nd] = stride[k][d];
    nd++;
  }
  if (nd == 0) {  // a single element (0-d or all dims 1)
    it->shape[0] = 1;
    for (int k = 0; k < n_ops; k++) it->stride[k][0] = 0;
    nd = 1;
  }
  it->ndim = nd;
  memset(it->idx, 0, sizeof it->idx);
  memset(it->off, 0, sizeof it->off);
  it->n = it->shape[nd - 1];
  for (int k = 0; k < n_ops; k++) it->inner[k] = it->stride[k][nd - 1];
  return true;
}

// Advances to the next row (odometer over the outer dims); false at the end.
static inline bool tpr__iter_next(tpr__iter *it) {
  for (int d = it->ndim - 2; d >= 0; d--) {
    for (int k = 0; k < it->n_ops; k++) it->off[k] += it->stride[k][d];
    if (++it->idx[d] < it->shape[d]) return true;
    for (int k = 0; k < it->n_ops; k++) it->off[k] -= it->stride[k][d] * it->shape[d];
    it->idx[d] = 0;
  }
  return false;
}

// Element `off` (in elements from tpr_tensor_data) of an i32 or i64 tensor
// in host memory: the one reader of run-time indices (ids, positions, start,
// shard, targets), by memcpy so any alignment is fine.
static inline int64_t tpr__index_at(const tpr_tensor *t, int64_t off) {
  const char *p = (const char *)tpr_tensor_data(t);
  if (t->dtype == TPR_I32) {
    int32_t v;
    memcpy(&v, p + off * 4, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, p + off * 8, 8);
  return v;
}

// Row-major element strides for a shape.
static inline void tpr__contig_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    stride[d] = s;
    s *= shape[d];
  }
}

// Strides that read t broadcast numpy-style to (ndim, shape): dims align on
// the right; a missing dim or a size-1 dim of t is read with stride 0.
static inline void tpr__broadcast_strides(const tpr_tensor *t, int ndim, const int64_t *shape,
                                          int64_t *stride) {
  for (int d = 0; d < ndim; d++) {
    int td = d - (ndim - t->ndim);
    stride[d] = (td < 0 || (t->shape[td] == 1 && shape[d] != 1)) ? 0 : t->stride[td];
  }
}

// Copies a (ndim, shape) block of esz-byte elements between strided layouts
// (strides in elements). Unit-stride rows become one memcpy.
static inline void tpr__strided_copy(void *dst, const int64_t *dst_stride, const void *src,
                                     const int64_t *src_stride, int ndim, const int64_t *shape,
                                     size_t esz) {
  const int64_t *st[2] = {dst_stride, src_stride};
  tpr__iter it;
  if (!tpr__iter_init(&it, ndim, shape, 2, st)) return;
  do {
    char *d = (char *)dst + it.off[0] * (int64_t)esz;
    const char *s = (const char *)src + it.off[1] * (int64_t)esz;
    int64_t ds = it.inner[0] * (int64_t)esz, ss = it.inner[1] * (int64_t)esz;
    if (ds == (int64_t)esz && ss == (int64_t)esz) {
      memcpy(d, s, (size_t)it.n * esz);
      continue;
    }
    // Constant-size memcpy per element type compiles to a plain load/store.
    switch (esz) {
      case 1: for (int64_t i = 0; i < it.n; i++) memcpy(d + i * ds, s + i * ss, 1); break;
      case 2: for (int64_t i = 0; i < it.n; i++) memcpy(d + i * ds, s + i * ss, 2); break;
      case 4: for (int64_t i = 0; i < it.n; i++) memcpy(d + i * ds, s + i * ss, 4); break;
      case 8: for (int64_t i = 0; i < it.n; i++) memcpy(d + i * ds, s + i * ss, 8); break;
      default: for (int64_t i = 0; i < it.n; i++) memcpy(d + i * ds, s + i * ss, esz); break;
    }
  } while (tpr__iter_next(&it));
}

#endif
