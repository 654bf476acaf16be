#include "world.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool tpr_world_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") || getenv("SLURM_PROCID");
}

tpr_status tpr_world_init(int *argc, char ***argv, tpr_world *w) {
  memset(w, 0, sizeof *w);
  w->mpi = tpr_world_launched();
  if (w->mpi) {
    TPR_CHECK(tpr_comm_mpi_init(argc, argv));
    TPR_CHECK(tpr_comm_init_mpi_world(&w->comm));
  } else {
    TPR_CHECK(tpr_comm_init_self(&w->comm));
  }
  w->rank = tpr_comm_rank(w->comm);
  w->size = tpr_comm_size(w->comm);
  if (w->size > 1) tpr_log_set_rank(w->rank);
  return tpr_backend_cpu_new(NULL, &w->cpu);
}

void tpr_world_finish(tpr_world *w) {
  tpr_backend_free(w->cpu);
  tpr_comm_free(w->comm);
  if (w->mpi) tpr_comm_mpi_finalize();
  memset(w, 0, sizeof *w);
}

tpr_status tpr_world_check_program(tpr_world *w, const tpr_program *p, uint64_t *hash) {
  TPR_CHECK(tpr_program_hash(p, hash));
  uint64_t *all = calloc((size_t)w->size, sizeof *all);
  if (!all) return TPR_FAIL(TPR_ERR_OOM, "program hash gather");
  tpr_status rc = tpr_comm_all_gather(w->comm, hash, all, 1, TPR_I64);
  char bad[512] = "";
  size_t used = 0;
  for (int r = 1; rc == TPR_OK && r < w->size; r++)
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

int tpr_world_fail(tpr_world *w, const char *command) {
  if (w->size > 1)
    fprintf(stderr, "tpr %s: error on rank %d: %s\n", command, w->rank, tpr_last_error());
  else
    fprintf(stderr, "tpr %s: error: %s\n", command, tpr_last_error());
  if (w->mpi && w->size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  tpr_world_finish(w);
  return 1;
}
