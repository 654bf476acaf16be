#include "world.h"

#include <mpi.h>
#include <errno.h>

#include "runtime/backend_cuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

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

// --device: "cpu" -> *gpu = -2; "cuda" -> -1 (the node-local choice); "cuda:N" -> N.
static tpr_status parse_device(const char *s, int *gpu) {
  if (!s || !strcmp(s, "cpu")) {
    *gpu = -2;
    return TPR_OK;
  }
  if (!strcmp(s, "cuda")) {
    *gpu = -1;
    return TPR_OK;
  }
  char *end;
  errno = 0;
  long n = strncmp(s, "cuda:", 5) ? -1 : strtol(s + 5, &end, 10);
  if (n < 0 || errno || *end || end == s + 5 || n > 1024)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--device %s: expected cpu, cuda or cuda:N", s);
  *gpu = (int)n;
  return TPR_OK;
}

// This rank's index among the ranks on its node (0 without MPI).
static int node_local_rank(tpr_world *w) {
  int local = 0;
  MPI_Comm node;
  if (w->mpi && MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
  }
  return local;
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
  int gpu = -2;
  TPR_CHECK(parse_device(opts->device, &gpu));
  w->mpi = strcmp(backend, "self") != 0;
  w->device = -1;
  if (!w->mpi && tpr_world_launched())
    TPR_LOG_WRN("--comm self under a launcher: every rank runs as its own world of one");
  if (w->mpi) {
    TPR_CHECK(tpr_comm_mpi_init(argc, argv));
    TPR_CHECK(tpr_comm_init_mpi_world(&w->host));
    if (gpu >= -1 || !strcmp(backend, "nccl")) {  // one GPU per rank: the given one, else by node-local rank
      int n = tpr_cuda_device_count(), local = node_local_rank(w);
      w->device = gpu >= 0 ? gpu : n > 0 ? local % n : local;
    }
    if (!strcmp(backend, "nccl"))
      TPR_CHECK(tpr_comm_init_nccl(w->host, w->device, &w->comm));
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
  TPR_CHECK(tpr_backend_cpu_new(NULL, &w->cpu));
  w->be = w->cpu;
  if (gpu >= -1) {
    if (w->device < 0) w->device = gpu >= 0 ? gpu : 0;  // alone: the given GPU, else the first
    TPR_CHECK(tpr_backend_cuda_new(w->device, &w->be));
  }
  return TPR_OK;
}

void tpr_world_finish(tpr_world *w) {
  // A rank that finishes early waits for the others here, watched, instead
  // of in MPI_Finalize where a peer stuck in a collective could hang it.
  if (w->host && w->size > 1) tpr_comm_barrier(w->host);
  tpr_comm_watchdog_stop();
  if (w->be != w->cpu) tpr_backend_free(w->be);
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

tpr_status tpr_world_peak_rss(tpr_world *w, int64_t *per_rank) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  int64_t mine = (int64_t)ru.ru_maxrss * 1024;  // KiB on Linux
  return tpr_comm_all_gather(w->host, &mine, per_rank, 1, TPR_I64);
}
