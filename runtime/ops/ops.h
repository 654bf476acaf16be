// The op set: one enum shared by the eager API, programs and backends.
//
// Every op has a shape rule (tpr__op_infer, in op_table.c) used both to check
// eager calls and to infer program values, so a shape is decided in one place.
// Kernels live one file per op family (matmul.c, elementwise.c, norm.c,
// softmax.c, gather.c, copy.c), CUDA twins beside them as *.cu.
#ifndef TPR_OPS_H
#define TPR_OPS_H

#include <stdbool.h>

#include "../tensor.h"

// Values are part of the serialized program format: append, never reorder.
typedef enum tpr_op_kind {
  TPR_OP_MATMUL = 0,        // in (a, b); i[0] trans_a, i[1] trans_b
  TPR_OP_ADD = 1,           // in (a, b), numpy broadcasting
  TPR_OP_MUL = 2,           // in (a, b), numpy broadcasting
  TPR_OP_RMS_NORM = 3,      // in (x, weight); f[0] eps
  TPR_OP_SWIGLU = 4,        // in (gate, up): silu(gate) * up
  TPR_OP_SOFTMAX = 5,       // in (x): over the last dim
  TPR_OP_EMBEDDING = 6,     // in (table, ids)
  TPR_OP_INDEX_SELECT = 7,  // in (x, index); i[0] dim
  TPR_OP_CAST = 8,          // in (x); i[0] destination dtype; also a strided copy
  TPR_OP_RESHAPE = 9,       // view; in (x); i[0..n) new shape
  TPR_OP_PERMUTE = 10,      // view; in (x); i[0..n) permutation
  TPR_OP_SLICE = 11,        // view; in (x); i[0] dim, i[1] start, i[2] len
  TPR_OP_KIND_COUNT
} tpr_op_kind;

#define TPR_OP_MAX_INPUTS 4
#define TPR_OP_MAX_IATTRS 8
#define TPR_OP_MAX_FATTRS 4

// Attributes are plain numbers so programs serialize without per-op schemas.
// They may never hold a rank number (see DESIGN.md section 1).
typedef struct tpr_op_attrs {
  int n_i;
  int64_t i[TPR_OP_MAX_IATTRS];
  int n_f;
  float f[TPR_OP_MAX_FATTRS];
} tpr_op_attrs;

const char *tpr_op_name(tpr_op_kind op);  // "matmul", ... ; "?" if invalid
int tpr_op_num_inputs(tpr_op_kind op);
bool tpr_op_is_view(tpr_op_kind op);      // reshape/permute/slice: no kernel, no copy

// Runs one op eagerly on `backend`. `out` must already exist with the shape
// and dtype the op's shape rule gives (a clear TPR_ERR_SHAPE otherwise) and be
// contiguous; every tensor must live on `backend`. View ops are not run here:
// use tpr_tensor_reshape/permute/slice.
tpr_status tpr_op_run(tpr_backend *backend, tpr_op_kind op, const tpr_tensor *const *in, int n_in,
                      const tpr_op_attrs *attrs, tpr_tensor *out);

// Typed wrappers over tpr_op_run. Shapes (f32 unless said otherwise):
// a (..., M, K) [(..., K, M) if trans_a], b (..., K, N) [(..., N, K) if trans_b]
// or b 2-D shared by every batch; out (..., M, N).
tpr_status tpr_matmul(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, bool trans_a,
                      bool trans_b, tpr_tensor *out);
// out = a + b / a * b, a and b broadcast to out's shape numpy-style.
tpr_status tpr_add(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, tpr_tensor *out);
tpr_status tpr_mul(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, tpr_tensor *out);
// x (..., H), weight (H); out (..., H) = x / sqrt(mean(x^2) + eps) * weight.
tpr_status tpr_rms_norm(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *weight, float eps,
                        tpr_tensor *out);
// gate (..., F), up (..., F); out (..., F) = gate * sigmoid(gate) * up.
tpr_status tpr_swiglu(tpr_backend *be, const tpr_tensor *gate, const tpr_tensor *up, tpr_tensor *out);
// x (..., N); out (..., N) softmax over the last dim.
tpr_status tpr_softmax(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out);
// table (V, H) any dtype, ids (...) i32/i64 in [0, V); out (..., H) table's dtype.
tpr_status tpr_embedding(tpr_backend *be, const tpr_tensor *table, const tpr_tensor *ids,
                         tpr_tensor *out);
// x any dtype; index (n) i32/i64 in [0, x.shape[dim]); out = x with shape[dim] = n.
tpr_status tpr_index_select(tpr_backend *be, const tpr_tensor *x, int dim, const tpr_tensor *index,
                            tpr_tensor *out);
// Copies x (any strides) into contiguous out of the same shape, converting
// dtype to out's dtype.
tpr_status tpr_cast(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out);

// Shape rule: fills out's dtype, ndim, shape and strides from the inputs'
// descriptors (storage is ignored). For views the strides and offset are the
// view's own, relative to the input; for other ops out is contiguous.
tpr_status tpr__op_infer(tpr_op_kind op, const tpr_tensor *const *in, int n_in,
                         const tpr_op_attrs *attrs, tpr_tensor *out);

#endif
