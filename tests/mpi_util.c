#include "mpi_util.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

tpr_comm_t tt_mpi_world(int *argc, char ***argv) {
  tpr_comm_t world = NULL;
  if (tpr_comm_mpi_init(argc, argv) != TPR_OK || tpr_comm_init_mpi_world(&world) != TPR_OK) {
    fprintf(stderr, "MPI setup failed: %s\n", tpr_last_error());
    exit(1);
  }
  return world;
}

tt_mesh tt_mesh_init(int *argc, char ***argv) {
  tt_mesh m = {.world = tt_mpi_world(argc, argv), .dp = 1, .ep = 1};
  m.R = tpr_comm_rank(m.world);
  m.tp = tpr_comm_size(m.world);
  for (int i = 1; i + 1 < *argc; i++) {
    if (!strcmp((*argv)[i], "--tp")) m.tp = atoi((*argv)[i + 1]);
    if (!strcmp((*argv)[i], "--dp")) m.dp = atoi((*argv)[i + 1]);
    if (!strcmp((*argv)[i], "--ep")) m.ep = atoi((*argv)[i + 1]);
  }
  return m;
}

int64_t tt_shared_seed(tpr_comm_t world) {
  int64_t seed = tpr_comm_rank(world) == 0 ? (int64_t)(tt_next_u64() >> 1) : 0;
  TT_OK(tpr_comm_broadcast(world, &seed, &seed, 1, TPR_I64, 0));
  return seed;
}

int tt_mpi_finish(tpr_comm_t world, int failed) {
  int any = failed;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  tpr_comm_free(world);
  tpr_comm_mpi_finalize();
  return any ? 1 : 0;
}
