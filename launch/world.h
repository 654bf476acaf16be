// The process's place in the job: communicator, rank, backend. Commands
// start here so every one of them runs the same under mpirun and alone.
#ifndef TPR_WORLD_H
#define TPR_WORLD_H

#include <stdbool.h>

#include "collectives/tpr_comm.h"

typedef struct tpr_world {
  tpr_comm_t comm;     // mpi when launched by mpirun/srun, else self
  bool mpi;
  int rank, size;
  tpr_backend *cpu;
} tpr_world;

// True when a launcher (mpirun, srun) started this process.
bool tpr_world_launched(void);
tpr_status tpr_world_init(int *argc, char ***argv, tpr_world *w);
void tpr_world_finish(tpr_world *w);

// All-gathers every rank's program hash; a difference is an error naming
// the ranks that disagree with rank 0 (DESIGN.md section 1).
tpr_status tpr_world_check_program(tpr_world *w, const tpr_program *p, uint64_t *hash);

// Ends a failed command: prints the error on this rank; under MPI with more
// than one rank it aborts the job so no peer waits forever in a collective.
int tpr_world_fail(tpr_world *w, const char *command);

#endif
