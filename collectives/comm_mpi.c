// The `mpi` backend: host buffers over a duplicated MPI communicator. MPI
// errors are returned (MPI_ERRORS_RETURN), never fatal, and become
// TPR_ERR_COMM with MPI's own message.
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "tpr_comm.h"

typedef struct mpi_ctx {
  MPI_Comm comm;
} mpi_ctx;

static tpr_status mpi_fail(int err, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  return TPR_FAIL(TPR_ERR_COMM, "%s: %s", what, msg);
}

#define MPI_TRY(call, what)                      \
  do {                                           \
    int mpi__err = (call);                       \
    if (mpi__err != MPI_SUCCESS) return mpi_fail(mpi__err, what); \
  } while (0)

static MPI_Datatype mpi_type(tpr_dtype dt) {
  switch (dt) {
    case TPR_F32: return MPI_FLOAT;
    case TPR_I32: return MPI_INT32_T;
    case TPR_I64: return MPI_INT64_T;
    case TPR_BF16:
    case TPR_F16: return MPI_UINT16_T;
    default: return MPI_UINT8_T;
  }
}

static MPI_Op mpi_op(tpr_red_op op) { return op == TPR_MAX ? MPI_MAX : op == TPR_MIN ? MPI_MIN : MPI_SUM; }

// 16-bit floats reduce in f32 (DESIGN.md: reductions accumulate in f32), then round once.
static tpr_status all_reduce_half(mpi_ctx *c, const void *send, void *recv, size_t count, tpr_dtype dt,
                                  tpr_red_op op) {
  float *tmp = malloc((count ? count : 1) * sizeof *tmp);
  if (!tmp) return TPR_FAIL(TPR_ERR_OOM, "all_reduce staging of %zu elements", count);
  tpr_dtype_convert(send, dt, tmp, TPR_F32, count);
  int err = MPI_Allreduce(MPI_IN_PLACE, tmp, (int)count, MPI_FLOAT, mpi_op(op), c->comm);
  if (err == MPI_SUCCESS) tpr_dtype_convert(tmp, TPR_F32, recv, dt, count);
  free(tmp);
  return err == MPI_SUCCESS ? TPR_OK : mpi_fail(err, "MPI_Allreduce");
}

static tpr_status mpi_all_reduce(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                 tpr_red_op op) {
  mpi_ctx *c = ctx;
  if (count > (size_t)INT32_MAX) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "all_reduce: count %zu above 2^31", count);
  if (dt == TPR_BF16 || dt == TPR_F16) return all_reduce_half(c, send, recv, count, dt, op);
  MPI_TRY(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type(dt), mpi_op(op), c->comm),
          "MPI_Allreduce");
  return TPR_OK;
}

static tpr_status mpi_all_gather(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt) {
  mpi_ctx *c = ctx;
  size_t bytes = count * tpr_dtype_size(dt);
  if (bytes > (size_t)INT32_MAX) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "all_gather: %zu bytes above 2^31", bytes);
  int rank;
  MPI_Comm_rank(c->comm, &rank);
  const void *src = send == (const char *)recv + (size_t)rank * bytes ? MPI_IN_PLACE : send;
  MPI_TRY(MPI_Allgather(src, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->comm), "MPI_Allgather");
  return TPR_OK;
}

static tpr_status mpi_barrier(void *ctx) {
  MPI_TRY(MPI_Barrier(((mpi_ctx *)ctx)->comm), "MPI_Barrier");
  return TPR_OK;
}

static void mpi_destroy(void *ctx) {
  mpi_ctx *c = ctx;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&c->comm);
  free(c);
}

static const tpr_comm_vtable mpi_vtable = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .barrier = mpi_barrier,
    .destroy = mpi_destroy,
};

tpr_status tpr_comm_mpi_init(int *argc, char ***argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) MPI_TRY(MPI_Init(argc, argv), "MPI_Init");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return TPR_OK;
}

tpr_status tpr_comm_mpi_finalize(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_TRY(MPI_Finalize(), "MPI_Finalize");
  return TPR_OK;
}

tpr_status tpr_comm_init_mpi_world(tpr_comm_t *out) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return TPR_FAIL(TPR_ERR_COMM, "MPI is not initialised (call tpr_comm_mpi_init first)");
  mpi_ctx *c = calloc(1, sizeof *c);
  if (!c) return TPR_FAIL(TPR_ERR_OOM, "mpi communicator");
  int err = MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
  if (err != MPI_SUCCESS) {
    free(c);
    return mpi_fail(err, "MPI_Comm_dup");
  }
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  int rank, size;
  MPI_Comm_rank(c->comm, &rank);
  MPI_Comm_size(c->comm, &size);
  tpr_status rc = tpr__comm_new(&mpi_vtable, c, rank, size, out);
  if (rc != TPR_OK) mpi_destroy(c);
  return rc;
}
