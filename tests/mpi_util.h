// The start and end every test under mpirun shares.
#ifndef TPR_MPI_UTIL_H
#define TPR_MPI_UTIL_H

#include "collectives/tpr_comm.h"

// MPI initialised and a world communicator; on failure prints why and exits 1.
tpr_comm_t tt_mpi_world(int *argc, char ***argv);
// The process's mesh: world, this rank, --tp (default: world size) --dp --ep.
typedef struct tt_mesh {
  tpr_comm_t world;
  int R, tp, dp, ep;
} tt_mesh;
// MPI up (tt_mpi_world) and the mesh read from argv.
tt_mesh tt_mesh_init(int *argc, char ***argv);
// A fresh seed from rank 0's test stream (test_util.h), the same on every rank.
int64_t tt_shared_seed(tpr_comm_t world);

// Every rank must agree on success, or ctest sees only rank 0's view: the
// exit code (0/1) from the failures of all ranks. Frees world and finalizes.
int tt_mpi_finish(tpr_comm_t world, int failed);

#endif
