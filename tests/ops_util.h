// Helpers shared by the op tests: tensors from and to host memory, and the
// program round trip every op goes through (build -> serialize ->
// deserialize -> run must equal the eager result bit for bit).
#ifndef TPR_OPS_UTIL_H
#define TPR_OPS_UTIL_H

#include "test_util.h"

// A new tensor on tt_cpu(); fails the test on error.
tpr_tensor *tt_new(tpr_dtype dt, int nd, const int64_t *shape);
// The same, filled from host memory h (numel * dtype size bytes).
tpr_tensor *tt_from_host(tpr_dtype dt, int nd, const int64_t *shape, const void *h);
// A malloc'ed host copy of t's elements (contiguous t).
void *tt_to_host(const tpr_tensor *t);

typedef tpr_status (*tt_build_fn)(tpr_program *p, const tpr_value_id *in, tpr_value_id *out);
// A one-op program over inputs shaped like in[] (named in0, in1, ...) is
// serialized, deserialized (the bytes survive a second trip unchanged) and
// run; its output must equal `eager` bit for bit, so the shape rule, the
// attributes and the kernel all round-trip.
void tt_check_roundtrip(tt_build_fn build, int n_in, const tpr_tensor *const *in, const tpr_tensor *eager);

// A little-endian f32 C-order .npy (version 1.0, as numpy writes a fixture)
// of exactly n elements, malloc'ed; fails the test otherwise.
float *tt_read_npy_f32(const char *path, int64_t n);

#endif
