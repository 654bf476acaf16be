// Serialized programs (what ranks ship to each other and `tpr program --in`
// reads): deserialize, run the memory planner on what loads, and check that
// it round-trips (serialize -> deserialize -> the same bytes).
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "runtime/program/program.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tpr_program *p = NULL;
  if (tpr_program_deserialize(data, size, &p) != TPR_OK) return 0;
  int nv = tpr_program_num_values(p);
  size_t *offsets = malloc((size_t)(nv ? nv : 1) * sizeof *offsets);
  if (!offsets) abort();
  tpr_memory_plan plan;
  if (tpr_program_plan_memory(p, &plan, offsets) == TPR_OK)
    fz_require(plan.arena_bytes <= plan.naive_bytes, "arena no larger than no reuse");
  free(offsets);
  uint8_t *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  tpr_program *q = NULL;
  fz_require(tpr_program_serialize(p, &a, &na) == TPR_OK, "a loaded program serializes");
  fz_require(tpr_program_deserialize(a, na, &q) == TPR_OK, "a serialized program loads");
  fz_require(tpr_program_serialize(q, &b, &nb) == TPR_OK && na == nb && !memcmp(a, b, na), "round trip is exact");
  free(a);
  free(b);
  tpr_program_free(q);
  tpr_program_free(p);
  return 0;
}
