// tpr bench comm's raw-MPI baseline (see bench_comm_mpi.h).
#include "launch/bench_comm_mpi.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

// MPI has no 16-bit float reductions: the baseline reduces them with a user
// op that adds in f32 and rounds each partial result, as a user of raw MPI
// would. MPI's user ops take no context, hence the statics.
static tpr_dtype half_dt;
static tpr_red_op half_red;
static void half_reduce(void *in, void *inout, int *len, MPI_Datatype *t) {
  const uint16_t *a = in;
  uint16_t *o = inout;
  for (int i = 0; i < *len; i++) {
    float x = half_dt == TPR_BF16 ? tpr_bf16_to_f32(a[i]) : tpr_f16_to_f32(a[i]);
    float y = half_dt == TPR_BF16 ? tpr_bf16_to_f32(o[i]) : tpr_f16_to_f32(o[i]);
    float z = half_red == TPR_SUM ? x + y : half_red == TPR_MAX ? fmaxf(x, y) : fminf(x, y);
    o[i] = half_dt == TPR_BF16 ? tpr_f32_to_bf16(z) : tpr_f32_to_f16(z);
  }
}

void bench_mpi_setup(bench_mpi *m, bench_op op, const char *call, tpr_dtype dt, tpr_red_op red, int root) {
  MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &m->n);
  m->op = op, m->call = call, m->root = root;
  m->dt = dt == TPR_F32 ? MPI_FLOAT : dt == TPR_I32 ? MPI_INT32_T : dt == TPR_I64 ? MPI_INT64_T : MPI_UINT16_T;
  m->op_mpi = red == TPR_MAX ? MPI_MAX : red == TPR_MIN ? MPI_MIN : MPI_SUM;
  if (dt == TPR_BF16 || dt == TPR_F16) {
    half_dt = dt, half_red = red;
    if (m->half_op == MPI_OP_NULL) MPI_Op_create(half_reduce, 1, &m->half_op);
    m->op_mpi = m->half_op;
  }
}

tpr_status bench_mpi_buffers(bench_mpi *m, size_t send_bytes, size_t recv_bytes) {
  free(m->send);
  free(m->recv);
  m->send = malloc(send_bytes ? send_bytes : 1);
  m->recv = malloc(recv_bytes ? recv_bytes : 1);
  if (!m->send || !m->recv)
    return TPR_FAIL(TPR_ERR_OOM, "bench comm: baseline buffers of %zu and %zu bytes", send_bytes, recv_bytes);
  return TPR_OK;
}

static int call(bench_mpi *m, int cnt) {
  MPI_Datatype t = m->dt;
  MPI_Comm w = MPI_COMM_WORLD;
  switch (m->op) {
    case OP_ALL_REDUCE: return MPI_Allreduce(m->send, m->recv, cnt, t, m->op_mpi, w);
    case OP_ALL_GATHER: return MPI_Allgather(m->send, cnt, t, m->recv, cnt, t, w);
    case OP_REDUCE_SCATTER: return MPI_Reduce_scatter_block(m->send, m->recv, cnt, t, m->op_mpi, w);
    case OP_ALL_TO_ALL: return MPI_Alltoall(m->send, cnt, t, m->recv, cnt, t, w);
    case OP_BROADCAST: return MPI_Bcast(m->recv, cnt, t, m->root, w);
    case OP_SENDRECV:
      return MPI_Sendrecv(m->send, cnt, t, (m->rank + 1) % m->n, 0, m->recv, cnt, t, (m->rank + m->n - 1) % m->n, 0,
                          w, MPI_STATUS_IGNORE);
    default: return MPI_ERR_OTHER;
  }
}

tpr_status bench_mpi_run(bench_mpi *m, size_t count) {
  int err = call(m, (int)count);
  if (err == MPI_SUCCESS) return TPR_OK;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  return TPR_FAIL(TPR_ERR_COMM, "baseline %s: %s", m->call, msg);
}

void bench_mpi_free(bench_mpi *m) {
  free(m->send);
  free(m->recv);
  m->send = m->recv = NULL;
  if (m->half_op != MPI_OP_NULL) MPI_Op_free(&m->half_op);
}
