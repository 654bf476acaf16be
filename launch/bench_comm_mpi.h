// tpr bench comm's raw-MPI baseline (--baseline): each collective as a plain
// program calls it, on buffers of its own and MPI_COMM_WORLD, so nothing of
// tpr's (its buffers, their allocation or placement, its communicator)
// enters the reference. Only the process is shared (MPI's thread level,
// tpr's watchdog thread); scripts/bench/comm.sh compares with a separate
// program (scripts/bench/mpi_raw.c) for that.
#ifndef TPR_BENCH_COMM_MPI_H
#define TPR_BENCH_COMM_MPI_H

#include <mpi.h>
#include <stddef.h>

#include "collectives/tpr_comm.h"  // tpr_red_op

typedef enum bench_op {
  OP_ALL_REDUCE,
  OP_ALL_GATHER,
  OP_REDUCE_SCATTER,
  OP_ALL_TO_ALL,
  OP_BROADCAST,
  OP_SENDRECV,
  OP_COUNT
} bench_op;

typedef struct bench_mpi {
  bench_op op;
  int rank, n, root;
  MPI_Datatype dt;
  MPI_Op op_mpi, half_op;  // half_op: the f32-accumulating user op of bf16/f16 (created once)
  const char *call;        // "MPI_Allreduce", ...
  void *send, *recv;       // this size's buffers (malloc'd by bench_mpi_buffers)
} bench_mpi;

// Picks the MPI datatype and reduction for (op, dt, red) on MPI_COMM_WORLD.
void bench_mpi_setup(bench_mpi *m, bench_op op, const char *call, tpr_dtype dt, tpr_red_op red, int root);
// Frees the previous size's buffers and mallocs fresh ones (send_bytes and
// recv_bytes; at least one byte), as a plain program does per size; the
// caller fills send and clears recv (first touch in the program's order).
tpr_status bench_mpi_buffers(bench_mpi *m, size_t send_bytes, size_t recv_bytes);
// One call with `count` (the call's count argument).
tpr_status bench_mpi_run(bench_mpi *m, size_t count);
void bench_mpi_free(bench_mpi *m);

#endif
