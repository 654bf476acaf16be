// Threading helpers for the CPU kernels that are not GEMMs. Every kernel uses
// OpenMP -- the runtime OpenBLAS's OpenMP build uses too (CMakeLists.txt), so
// one pool of threads serves both and no two pools spin against each other.
//
// Rules every threaded kernel keeps:
//   - `#pragma omp parallel ... num_threads(nt) if (nt > 1)` with nt from
//     tpr__cpu_nt: the context's thread count, or 1 when the work is too
//     small to pay for a fork/join (a few microseconds; decode runs at T = 1);
//   - static partitions of rows (or of elements for the elementwise ops) and
//     each output element written by exactly one thread, computed in the same
//     order as on one thread: results are bitwise identical whatever the
//     thread count (tests/test_threads.c checks 1 against 2 threads).
#ifndef TPR_OPS_CPU_THREADS_H
#define TPR_OPS_CPU_THREADS_H

#include <omp.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "strided.h"

// Below this many elements touched a kernel stays on the calling thread.
// Measured on the 2-core dev box (bench kernels): a 2-thread fork/join costs
// ~2-10 us there, about the time one thread needs for 16K elements of the
// cheapest of these kernels (a copy); heavier per-element kernels (exp) win
// from a little less, but one threshold keeps the rule simple.
#define TPR__PAR_MIN_WORK ((int64_t)16384)

// Threads for a loop touching `work` elements: ctx's count (NULL: 1), or 1
// below TPR__PAR_MIN_WORK.
static inline int tpr__cpu_nt(const void *ctx, int64_t work) {
  const int n = ctx ? ((const tpr_cpu_ctx *)ctx)->n_threads : 1;
  return n > 1 && work >= TPR__PAR_MIN_WORK ? n : 1;
}

// This thread's static share [*lo, *hi) of n items in a parallel region
// (the whole range outside one), boundaries on multiples of `align` (a
// multiple of the vector width, so no vector loop is split mid-vector).
static inline void tpr__omp_share(int64_t n, int64_t align, int64_t *lo, int64_t *hi) {
  const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
  const int64_t blocks = (n + align - 1) / align;
  const int64_t b0 = blocks * id / nt, b1 = blocks * (id + 1) / nt;
  *lo = b0 * align < n ? b0 * align : n;
  *hi = b1 * align < n ? b1 * align : n;
}

// Rows an iterator visits: the product of its outer (merged) dims times its
// row length is the whole index space; this is the count of rows.
static inline int64_t tpr__iter_rows(const tpr__iter *it) {
  int64_t r = 1;
  for (int d = 0; d < it->ndim - 1; d++) r *= it->shape[d];
  return r;
}

// Element offset of operand k at flat position q (row-major over the
// iterator's merged dims, q < rows * n): random access for a thread's share.
static inline int64_t tpr__iter_offset_at(const tpr__iter *it, int k, int64_t q) {
  int64_t off = 0;
  for (int d = it->ndim - 1; d >= 0; d--) {
    off += (q % it->shape[d]) * it->stride[k][d];
    q /= it->shape[d];
  }
  return off;
}

// Positions it at the start of row `row` (row-major over its outer dims),
// as if tpr__iter_next had been called `row` times after tpr__iter_init.
static inline void tpr__iter_seek(tpr__iter *it, int64_t row) {
  for (int k = 0; k < it->n_ops; k++) it->off[k] = 0;
  for (int d = it->ndim - 2; d >= 0; d--) {
    it->idx[d] = row % it->shape[d];
    row /= it->shape[d];
    for (int k = 0; k < it->n_ops; k++) it->off[k] += it->idx[d] * it->stride[k][d];
  }
}

// Row-wise kernels over operands shaped (..., N): the rows over the leading
// dims, numbered row-major as a contiguous output stores them -- row r of
// operand k starts at tpr__iter_offset_at(&it, k, r) -- and the threads for
// `rows` rows of `row_len` elements (tpr__cpu_nt).
typedef struct tpr__row_iter {
  tpr__iter it;
  int64_t rows;
  int nt;
} tpr__row_iter;

// Sets r up over the first ndim - 1 dims of shape for n_ops operands with
// element strides stride[k]; false when there is no row.
static inline bool tpr__row_iter_init(tpr__row_iter *r, const void *ctx, int ndim, const int64_t *shape, int n_ops,
                                      const int64_t *const *stride, int64_t row_len) {
  if (!tpr__iter_init(&r->it, ndim - 1, shape, n_ops, stride)) return false;
  r->rows = tpr__iter_rows(&r->it) * r->it.n;
  r->nt = tpr__cpu_nt(ctx, r->rows * row_len);
  return true;
}

// Calls fn(it, col, len, q, arg) for the pieces of rows covering the flat
// element range [lo, hi) of it's index space: it positioned at the piece's
// row, col its first column, q its flat position (row * n + col).
typedef void (*tpr__piece_fn)(const tpr__iter *it, int64_t col, int64_t len, int64_t q, void *arg);
static inline void tpr__iter_range(tpr__iter it, int64_t lo, int64_t hi, tpr__piece_fn fn, void *arg) {
  if (lo >= hi) return;
  tpr__iter_seek(&it, lo / it.n);
  for (int64_t q = lo, col = lo % it.n; q < hi; col = 0) {
    const int64_t len = it.n - col < hi - q ? it.n - col : hi - q;
    fn(&it, col, len, q, arg);
    q += len;
    if (q < hi) tpr__iter_next(&it);
  }
}

// Element-parallel kernels: tpr__iter_range over all of it's space, split
// over ctx's threads in static blocks of 64 elements (a multiple of any
// vector width, whole cache lines of f32); on one thread for small spaces.
static inline void tpr__par_pieces(const void *ctx, const tpr__iter *it, tpr__piece_fn fn, void *arg) {
  const int64_t total = tpr__iter_rows(it) * it->n;
  const int nt = tpr__cpu_nt(ctx, total);
  if (nt == 1) {
    tpr__iter_range(*it, 0, total, fn, arg);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int64_t lo, hi;
    tpr__omp_share(total, 64, &lo, &hi);
    tpr__iter_range(*it, lo, hi, fn, arg);
  }
}

#endif
