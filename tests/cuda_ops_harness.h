// The harness of test_cuda_ops.c (tests/cuda_ops_harness.c): the backend
// under test, tensors held until a test ends, inputs on both backends in
// several layouts, and check() / negative() for one op case.
#ifndef TPR_TEST_CUDA_OPS_HARNESS_H
#define TPR_TEST_CUDA_OPS_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "ops_util.h"

extern tpr_backend *gpu;  // the backend under test
extern bool selftest;     // a second CPU backend stands in for the GPU

typedef struct pair {
  tpr_tensor *c, *g;    // the same values on the CPU and on the backend under test
  tpr_tensor *rc, *rg;  // their contiguous base tensors (views share them)
} pair;

// Layouts of an input with a given logical shape (combinable):
enum {
  L_PERM = 1,   // dims stored in reverse order: a transposed view
  L_SLICE = 2,  // last dim padded by 3 and sliced [1, 1 + n): rows longer than n
  L_COL = 4,    // every other element: an extra trailing dim of 2, sliced to 1
  L_SWAP = 8,   // last two dims stored swapped (column-major matrices)
};

typedef struct op_case {
  tpr_op_kind op;
  tpr_op_attrs at;
  int n_in;
  pair in[TPR_OP_MAX_INPUTS], out;
  char what[160];
  void *pool0;  // lightning_paged: its pool (input 3) before any run, restored before each GPU run
} op_case;

enum { N_LAYOUTS = 5 };
extern const int layouts[N_LAYOUTS];  // none, transposed, sliced, every other element, both

// Held until the running test ends (release_all, its teardown).
tpr_tensor *hold(tpr_tensor *t);
void *hold_host(void *p);
int release_all(void **state);
tpr_tensor *view_permute(const tpr_tensor *t, const int *p);
tpr_tensor *view_slice(const tpr_tensor *t, int dim, int64_t start, int64_t len);
// The logical (nd, shape) tensor `data` (row-major, dtype dt) on both
// backends, stored in `layout`; storage outside the view holds 0xff bytes.
pair pair_from(tpr_dtype dt, int nd, const int64_t *shape, int layout, const void *data);
float *rand_f32(int64_t n);
void *rand_any(tpr_dtype dt, int64_t n);  // f32 normals; any other dtype random bytes
void set_id(void *b, tpr_dtype dt, int64_t i, int64_t v);  // element i of an i32/i64 buffer
void *rand_ids(tpr_dtype dt, int64_t n, int64_t lo, int64_t hi);  // values in [lo, hi]
pair rand_pair(int nd, const int64_t *shape, int layout);
pair scalar_pair(tpr_dtype dt, int64_t v);  // (1) i32/i64
double op_bound(tpr_op_kind op);  // max |cuda - cpu| / max |cpu| allowed
double compare(const tpr_tensor *c, const tpr_tensor *g, bool exact);
pair out_pair(tpr_op_kind op, const tpr_tensor *const *cin, int n_in, const tpr_op_attrs *at);
tpr_status run_on(op_case *k, bool on_gpu);
double case_error(const op_case *k);
// Runs op on both backends and checks the outputs agree within the op's
// bound. The case stays valid (for a negative control) until the test ends.
__attribute__((format(printf, 5, 6))) op_case *check(tpr_op_kind op, const tpr_op_attrs *at, int n_in,
                                                     const pair *in, const char *fmt, ...);
// Negative control: logical element `elem` of input `which` changes on the
// GPU side only; the rerun must then fail the comparison.
void negative(op_case *k, int which, int64_t elem, double v);

#endif
