// tpr_comm: the collective layer, NCCL-shaped.
//
// A communicator is a group of ranks with a backend behind a vtable: `self`
// (a world of one, no MPI needed) and `mpi` (host buffers over an MPI
// communicator). Every call returns a tpr_status. Counts are in elements of
// `dtype`, per rank, as in nccl.h.
#ifndef TPR_COMM_H
#define TPR_COMM_H

#include <stddef.h>

#include "runtime/tpr_runtime.h"

typedef enum tpr_red_op { TPR_SUM = 0, TPR_MAX = 1, TPR_MIN = 2 } tpr_red_op;

typedef struct tpr_comm_s *tpr_comm_t;

typedef struct tpr_comm_vtable {
  const char *name;
  tpr_status (*all_reduce)(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, tpr_red_op op);
  tpr_status (*all_gather)(void *ctx, const void *send, void *recv, size_t send_count, tpr_dtype dt);
  tpr_status (*barrier)(void *ctx);
  void (*destroy)(void *ctx);
} tpr_comm_vtable;

// A world of one: every collective is a copy (or nothing, in place).
tpr_status tpr_comm_init_self(tpr_comm_t *out);
// A communicator over MPI_COMM_WORLD. MPI must be initialised by the caller
// (tpr_comm_mpi_init_world does it); the comm duplicates the MPI communicator.
tpr_status tpr_comm_init_mpi_world(tpr_comm_t *out);
// MPI_Init (if needed) with MPI errors returned, not fatal. Safe without mpirun
// (Open MPI then runs as a singleton world of one).
tpr_status tpr_comm_mpi_init(int *argc, char ***argv);
tpr_status tpr_comm_mpi_finalize(void);
void tpr_comm_free(tpr_comm_t c);

int tpr_comm_rank(tpr_comm_t c);
int tpr_comm_size(tpr_comm_t c);
const char *tpr_comm_backend(tpr_comm_t c);

// recv[i] = op over ranks of send[i], i < count, on every rank. In place when
// send == recv. Supports f32, bf16 and f16 (summed in f32), i32, i64.
tpr_status tpr_comm_all_reduce(tpr_comm_t c, const void *send, void *recv, size_t count, tpr_dtype dt,
                               tpr_red_op op);
// recv (size * send_count) = concatenation of every rank's send (send_count),
// ordered by rank. In place when send == recv + rank * send_count.
tpr_status tpr_comm_all_gather(tpr_comm_t c, const void *send, void *recv, size_t send_count, tpr_dtype dt);
tpr_status tpr_comm_barrier(tpr_comm_t c);

// Internal: builds a communicator around a backend.
tpr_status tpr__comm_new(const tpr_comm_vtable *vt, void *ctx, int rank, int size, tpr_comm_t *out);

#endif
