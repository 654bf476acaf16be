// The process's place in the job: communicator, rank, backend. Commands
// start here so every one of them runs the same under mpirun and alone.
#ifndef TPR_WORLD_H
#define TPR_WORLD_H

#include <stdbool.h>

#include "collectives/tpr_comm.h"

#include "launch/args.h"

typedef struct tpr_world {
  tpr_comm_t comm;     // the world: mpi or nccl when launched by mpirun/srun, else self
  tpr_comm_t host;     // the world over host buffers (== comm unless comm is nccl)
  bool mpi;            // MPI is initialised (launched by mpirun/srun)
  int rank, size;
  tpr_backend *cpu;
  tpr_backend *be;     // where programs run (--device): cpu, or a CUDA backend
  int device;          // the GPU this rank uses (--device cuda[:N] or --comm nccl), else -1
} tpr_world;

// The flags every command that talks to other ranks takes.
typedef struct tpr_world_opts {
  const char *comm;       // "auto" (default), "mpi", "nccl", "self"
  double comm_timeout_s;  // watchdog timeout; 0 means the default (300 s)
  const char *device;     // "cpu" (default), "cuda" (the node-local rank's GPU), "cuda:N"
} tpr_world_opts;

#define TPR_WORLD_OPTS_DEFAULT {.comm = "auto", .comm_timeout_s = 0, .device = "cpu"}
// Entries for a command's tpr_arg table: --comm, --comm-timeout, --device.
#define TPR_WORLD_ARGS(o)                                                                                  \
  {"comm", TPR_ARG_STR, &(o).comm, "collective backend: auto|mpi|nccl|self (default auto: mpi under "     \
                                   "mpirun, self alone)"},                                                 \
  {"comm-timeout", TPR_ARG_FLOAT, &(o).comm_timeout_s,                                                     \
   "seconds a collective may take before the watchdog aborts every rank (default 300)"},                 \
  {"device", TPR_ARG_STR, &(o).device,                                                                     \
   "cpu (default) | cuda | cuda:N: where programs run; cuda picks the node-local rank's GPU, which "        \
   "--comm nccl uses too"}

// True when a launcher (mpirun, srun) started this process.
bool tpr_world_launched(void);
// opts NULL: the defaults. Starts the watchdog when the world has > 1 rank.
tpr_status tpr_world_init(int *argc, char ***argv, const tpr_world_opts *opts, tpr_world *w);
void tpr_world_finish(tpr_world *w);

// Collective: every rank's peak resident memory so far (getrusage), in
// bytes, into per_rank (world size entries) on every rank.
tpr_status tpr_world_peak_rss(tpr_world *w, int64_t *per_rank);

// Ends a failed command: prints the error on this rank; under MPI with more
// than one rank it aborts the job so no peer waits forever in a collective.
int tpr_world_fail(tpr_world *w, const char *command);

#endif
