// Internal: what the rest of tpr needs to know about the mpi backend (the
// watchdog, the nccl bootstrap, the bench's raw-MPI baseline, tests).
#ifndef TPR_COMM_MPI_H
#define TPR_COMM_MPI_H

#include <mpi.h>
#include <stddef.h>

#include "tpr_comm.h"

// The thread support MPI granted at tpr_comm_mpi_init (MPI_THREAD_SINGLE ..
// MPI_THREAD_MULTIPLE; queried when someone else initialised MPI).
// MPI_THREAD_SINGLE while MPI is not initialised. Below MPI_THREAD_MULTIPLE
// no second thread may call MPI while a collective runs, so the watchdog
// must degrade (e.g. time out locally without asking the other ranks).
int tpr__comm_mpi_thread_level(void);

// The MPI communicator behind an mpi communicator; MPI_COMM_NULL for other
// backends (and for NULL). Owned by c: do not free it.
MPI_Comm tpr__comm_mpi_handle(tpr_comm_t c);

// The most elements one MPI call is given (an MPI count is an int):
// INT_MAX unless lowered; 0 restores INT_MAX. Bigger requests are cut into
// chunks (reductions), described by a derived datatype (data movement) or
// exchanged point to point (all_to_allv). Tests lower it to run those paths
// on small buffers. Process-wide; not for use while collectives run.
void tpr__comm_mpi_set_max_count(size_t n);

#endif
