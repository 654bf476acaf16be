// The runs of a lightning_paged step (ops.h), shared by cpu.c and cuda.cu
// so both backends accept and refuse exactly the same steps with the same
// messages. C and C++ (nvcc) alike; a .cu file includes it after
// runtime/ops/cuda_kernels.h, which brings runtime/status.h in with C linkage.
//
// Rows of one state slot form one contiguous run of consecutive positions
// (the engine lays a step out so: one chunk per sequence). A run is a
// prefill from the slot's state -- from zeros when its first position is 0
// -- and leaves the state after its last row in the slot. Rows with slot -1
// are padding.
#ifndef TPR_OPS_LINEAR_ATTENTION_PAGED_RUNS_H
#define TPR_OPS_LINEAR_ATTENTION_PAGED_RUNS_H

#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr__la_run {
  int64_t t0, n, slot;  // first row, rows, state slot
} tpr__la_run;

// slot (T) and pos (T) host i32 with strides ss, ps; runs (T) out, *n_runs
// their count. Every index is checked against the pool of NS slots before
// any kernel writes anything.
static inline tpr_status tpr__la_paged_runs(const int32_t *slot, int64_t ss, const int32_t *pos, int64_t ps,
                                            int64_t T, int64_t NS, tpr__la_run *runs, int64_t *n_runs) {
  const char *op = "lightning_paged";
  int64_t n = 0;
  for (int64_t t = 0; t < T; t++) {
    const int64_t s = slot[t * ss], p = pos[t * ps];
    if (s < 0) continue;
    if (s >= NS || p < 0)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: row %lld has state slot %lld of a pool of %lld, position %lld", op,
                      (long long)t, (long long)s, (long long)NS, (long long)p);
    if (n && runs[n - 1].slot == s && runs[n - 1].t0 + runs[n - 1].n == t) {
      if (p != pos[(t - 1) * ps] + 1)
        return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: row %lld of state slot %lld is position %lld after %d: a slot's "
                        "rows must be consecutive positions", op, (long long)t, (long long)s, (long long)p,
                        pos[(t - 1) * ps]);
      runs[n - 1].n++;
      continue;
    }
    for (int64_t i = 0; i < n; i++)
      if (runs[i].slot == s)
        return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: state slot %lld has two runs of rows (at %lld and %lld): one "
                        "chunk per sequence and step", op, (long long)s, (long long)runs[i].t0, (long long)t);
    runs[n].t0 = t, runs[n].n = 1, runs[n].slot = s;
    n++;
  }
  *n_runs = n;
  return TPR_OK;
}

#endif
