// The SPMD check of docs/architecture.md section 1: every rank hashes its serialized
// program and the hashes are compared, so a rank number that leaked into a
// program is an error instead of silently wrong results.
#include <stdio.h>
#include <stdlib.h>

#include "tpr_comm.h"

tpr_status tpr_comm_check_program(tpr_comm_t c, const tpr_program *p, uint64_t *hash) {
  TPR_CHECK(tpr_program_hash(p, hash));
  int n = tpr_comm_size(c);
  uint64_t *all = calloc((size_t)n, sizeof *all);
  if (!all) return TPR_FAIL(TPR_ERR_OOM, "program hash gather");
  tpr_status rc = tpr_comm_all_gather(c, hash, all, 1, TPR_I64);
  char bad[512] = "";
  size_t used = 0;
  for (int r = 1; rc == TPR_OK && r < n; r++)
    if (all[r] != all[0] && used + 16 < sizeof bad) used += (size_t)snprintf(bad + used, sizeof bad - used, " %d", r);
  free(all);
  TPR_CHECK(rc);
  if (used)
    return TPR_FAIL(TPR_ERR_INTERNAL,
                    "the program differs across ranks (ranks%s disagree with rank 0): a rank number leaked into "
                    "the program instead of coming from the rank tensor",
                    bad);
  return TPR_OK;
}
