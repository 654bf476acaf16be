// Internals of the mpi backend shared by its blocking (comm_mpi.c) and
// nonblocking (comm_mpi_nb.c) entries.
#ifndef TPR_COMM_MPI_IMPL_H
#define TPR_COMM_MPI_IMPL_H

#include <stdbool.h>

#include "comm_mpi.h"
#include "comm_stage.h"

typedef struct mpi_ctx {
  tpr_stage_ctx stage;  // first: comm_stage.c sees the context as a tpr_stage_ctx
  MPI_Comm comm;
  int rank, size;
  void *scratch;  // see CHUNK_BYTES in comm_mpi.c (up to that much is kept between calls)
  size_t scratch_cap;
} mpi_ctx;

// `count` elements of dt as (n, t) for one MPI call: (count, element type)
// up to the int limit, else one element of a committed contiguous type.
typedef struct span {
  int n;
  MPI_Datatype t;
  bool owned;
} span;
tpr_status tpr__mpi_span_make(size_t count, tpr_dtype dt, span *s);
void tpr__mpi_span_free(span *s);

// TPR_ERR_COMM with MPI's message.
tpr_status tpr__mpi_fail(int err, const char *what);
size_t tpr__mpi_max_count(void);  // see tpr__comm_mpi_set_max_count
MPI_Datatype tpr__mpi_reduce_type(tpr_dtype dt);  // f32 for bf16/f16 (they reduce in f32)
MPI_Op tpr__mpi_op(tpr_red_op op);

// The nonblocking entries (comm_mpi_nb.c).
tpr_status tpr__mpi_ibroadcast(void *ctx, void *buf, size_t count, tpr_dtype dt, int root, void **req);
tpr_status tpr__mpi_iall_gather(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, void **req);
tpr_status tpr__mpi_ireduce_scatter(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                    tpr_red_op op, void **req);
tpr_status tpr__mpi_test(void *ctx, void *req, bool *done);
tpr_status tpr__mpi_wait(void *ctx, void *req);

#endif
