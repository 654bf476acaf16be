#include "world.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool tpr_world_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") || getenv("SLURM_PROCID");
}

static tpr_status parse_comm(const char *name, bool launched, const char **out) {
  if (!name || !strcmp(name, "auto")) {
    *out = launched ? "mpi" : "self";
    return TPR_OK;
  }
  if (!strcmp(name, "mpi") || !strcmp(name, "nccl") || !strcmp(name, "self")) {
    *out = name;
    return TPR_OK;
  }
  return TPR_FAIL(TPR_ERR_INVALID_ARG, "--comm %s: expected auto, mpi, nccl or self", name);
}

tpr_status tpr_world_init(int *argc, char ***argv, const tpr_world_opts *opts, tpr_world *w) {
  static const tpr_world_opts defaults = TPR_WORLD_OPTS_DEFAULT;
  if (!opts) opts = &defaults;
  memset(w, 0, sizeof *w);
  const char *backend;
  TPR_CHECK(parse_comm(opts->comm, tpr_world_launched(), &backend));
  double timeout = opts->comm_timeout_s > 0 ? opts->comm_timeout_s : TPR_COMM_DEFAULT_TIMEOUT_S;
  if (opts->comm_timeout_s < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--comm-timeout %g: must be > 0 seconds", opts->comm_timeout_s);
  w->mpi = strcmp(backend, "self") != 0;
  if (!w->mpi && tpr_world_launched())
    TPR_LOG_WRN("--comm self under a launcher: every rank runs as its own world of one");
  if (w->mpi) {
    TPR_CHECK(tpr_comm_mpi_init(argc, argv));
    TPR_CHECK(tpr_comm_init_mpi_world(&w->host));
    if (!strcmp(backend, "nccl"))
      TPR_CHECK(tpr_comm_init_nccl(w->host, (int)opts->device, &w->comm));
    else
      w->comm = w->host;
    TPR_CHECK(tpr_comm_watchdog_start(timeout));
  } else {
    TPR_CHECK(tpr_comm_init_self(&w->comm));
    w->host = w->comm;
  }
  w->rank = tpr_comm_rank(w->comm);
  w->size = tpr_comm_size(w->comm);
  if (w->size > 1) tpr_log_set_rank(w->rank);
  return tpr_backend_cpu_new(NULL, &w->cpu);
}

void tpr_world_finish(tpr_world *w) {
  // A rank that finishes early waits for the others here, watched, instead
  // of in MPI_Finalize where a peer stuck in a collective could hang it.
  if (w->host && w->size > 1) tpr_comm_barrier(w->host);
  tpr_comm_watchdog_stop();
  tpr_backend_free(w->cpu);
  if (w->comm != w->host) tpr_comm_free(w->comm);
  tpr_comm_free(w->host);
  if (w->mpi) tpr_comm_mpi_finalize();
  memset(w, 0, sizeof *w);
}

int tpr_world_fail(tpr_world *w, const char *command) {
  if (w->size > 1)
    fprintf(stderr, "tpr %s: error on rank %d: %s\n", command, w->rank, tpr_last_error());
  else
    fprintf(stderr, "tpr %s: error: %s\n", command, tpr_last_error());
  int inited = 0, world_size = 1;
  if (w->mpi) MPI_Initialized(&inited);
  if (inited) MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  tpr_world_finish(w);
  return 1;
}
