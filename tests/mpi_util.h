// The start and end every test under mpirun shares.
#ifndef TPR_MPI_UTIL_H
#define TPR_MPI_UTIL_H

#include "collectives/tpr_comm.h"

// MPI initialised and a world communicator; on failure prints why and exits 1.
tpr_comm_t tt_mpi_world(int *argc, char ***argv);
// Every rank must agree on success, or ctest sees only rank 0's view: the
// exit code (0/1) from the failures of all ranks. Frees world and finalizes.
int tt_mpi_finish(tpr_comm_t world, int failed);

#endif
