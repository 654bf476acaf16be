#include "mpi_util.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

tpr_comm_t tt_mpi_world(int *argc, char ***argv) {
  tpr_comm_t world = NULL;
  if (tpr_comm_mpi_init(argc, argv) != TPR_OK || tpr_comm_init_mpi_world(&world) != TPR_OK) {
    fprintf(stderr, "MPI setup failed: %s\n", tpr_last_error());
    exit(1);
  }
  return world;
}

int tt_mpi_finish(tpr_comm_t world, int failed) {
  int any = failed;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  tpr_comm_free(world);
  tpr_comm_mpi_finalize();
  return any ? 1 : 0;
}
