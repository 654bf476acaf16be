// The mpi backend's nonblocking collectives: MPI_Iallgather and
// MPI_Ireduce_scatter_block on host buffers. MPI makes progress only inside
// MPI calls (no progress thread), so tpr_comm_test is what moves a request
// along between compute pieces.
//
// The MPI calls a rank makes depend only on what every rank shares (count,
// dtype, group size), as in the blocking entries, so outstanding requests
// match across ranks whatever each rank's buffers are. Paths:
//  - all_gather: one MPI_Iallgather (a derived type beyond the int limit);
//  - reduce_scatter of f32/i32/i64 up to the int limit: one
//    MPI_Ireduce_scatter_block, into a private block when in place (MPI's
//    in-place form leaves the result at block 0, not block r), copied to
//    recv on completion;
//  - bf16/f16 (accumulated in f32, rounded once, as the blocking path) and
//    counts beyond the int limit: send is packed at the start into a private
//    buffer (widened to f32 for the 16-bit floats), chunk by chunk, and each
//    chunk is reduce-scattered in place; completion unpacks into recv. The
//    private buffer is n * count elements: the blocking path bounds its
//    scratch, a request cannot (send may change once the start returns).
#include <stdlib.h>
#include <string.h>

#include "comm_mpi_impl.h"

typedef enum finish_kind { FIN_NONE, FIN_COPY, FIN_UNPACK } finish_kind;

typedef struct mpi_req {
  int nreq;
  MPI_Request *req;  // (nreq)
  span s;            // all_gather's element type, freed at the end
  finish_kind fin;
  char *tmp;         // the private buffer of reduce_scatter (see above)
  void *recv;
  size_t count, chunk;
  tpr_dtype dt, acc;
  int n;
  bool done;
} mpi_req;

static bool is_half(tpr_dtype dt) { return dt == TPR_BF16 || dt == TPR_F16; }
static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

static void req_free(mpi_req *q) {
  if (!q) return;
  tpr__mpi_span_free(&q->s);
  free(q->req);
  free(q->tmp);
  free(q);
}

static mpi_req *req_new(int nreq) {
  mpi_req *q = calloc(1, sizeof *q);
  if (q) q->req = malloc((size_t)nreq * sizeof *q->req);
  if (q && !q->req) {
    free(q);
    return NULL;
  }
  for (int i = 0; q && i < nreq; i++) q->req[i] = MPI_REQUEST_NULL;
  return q;
}

// Requests already posted complete before a failed start returns: MPI
// would otherwise write into buffers the caller owns again.
static tpr_status start_failed(mpi_req *q, int err, const char *what) {
  MPI_Waitall(q->nreq, q->req, MPI_STATUSES_IGNORE);
  req_free(q);
  return tpr__mpi_fail(err, what);
}

// Only host memory here: a device buffer would need staging that outlives
// the start (a CUDA-aware MPI takes it directly).
static tpr_status check_host(mpi_ctx *c, const void *send, const void *recv, const char *op) {
  if (tpr__stage_is_device(&c->stage, send) || tpr__stage_is_device(&c->stage, recv))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED,
                    "mpi %s: device buffers need the nccl backend or a CUDA-aware MPI for nonblocking collectives "
                    "(the blocking call stages them)", op);
  return TPR_OK;
}

// A request of one MPI call over count elements of dt (the element type
// covers counts past the int limit).
static tpr_status one_request(size_t count, tpr_dtype dt, const char *op, mpi_req **out) {
  mpi_req *q = req_new(1);
  if (!q) return TPR_FAIL(TPR_ERR_OOM, "%s: request", op);
  tpr_status rc = tpr__mpi_span_make(count, dt, &q->s);
  if (rc != TPR_OK) {
    req_free(q);
    return rc;
  }
  q->nreq = 1;
  *out = q;
  return TPR_OK;
}

tpr_status tpr__mpi_iall_gather(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, void **req) {
  mpi_ctx *c = ctx;
  *req = NULL;
  if (!count) return TPR_OK;
  TPR_CHECK(check_host(c, send, recv, "iall_gather"));
  mpi_req *q = NULL;
  TPR_CHECK(one_request(count, dt, "iall_gather", &q));
  bool in_place = send == (const char *)recv + (size_t)c->rank * count * tpr_dtype_size(dt);
  int err = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, q->s.n, q->s.t, recv, q->s.n, q->s.t, c->comm, q->req);
  if (err != MPI_SUCCESS) return start_failed(q, err, "MPI_Iallgather");
  *req = q;
  return TPR_OK;
}

tpr_status tpr__mpi_ibroadcast(void *ctx, void *buf, size_t count, tpr_dtype dt, int root, void **req) {
  mpi_ctx *c = ctx;
  *req = NULL;
  if (!count) return TPR_OK;
  TPR_CHECK(check_host(c, buf, buf, "ibroadcast"));
  mpi_req *q = NULL;
  TPR_CHECK(one_request(count, dt, "ibroadcast", &q));
  int err = MPI_Ibcast(buf, q->s.n, q->s.t, root, c->comm, q->req);
  if (err != MPI_SUCCESS) return start_failed(q, err, "MPI_Ibcast");
  *req = q;
  return TPR_OK;
}

// See the header comment: packed chunks in q->tmp, reduced in place.
static tpr_status start_packed(mpi_ctx *c, const void *send, void *recv, size_t count, tpr_dtype dt, tpr_red_op op,
                               void **req) {
  tpr_dtype acc = is_half(dt) ? TPR_F32 : dt;
  size_t esz = tpr_dtype_size(dt), asz = tpr_dtype_size(acc), n = (size_t)c->size;
  size_t chunk = min_size(count, tpr__mpi_max_count()), nchunks = (count + chunk - 1) / chunk;
  mpi_req *q = nchunks <= (size_t)1 << 30 ? req_new((int)nchunks) : NULL;
  if (q) q->tmp = malloc(n * count * asz);
  if (!q || !q->tmp) {
    req_free(q);
    return TPR_FAIL(TPR_ERR_OOM, "ireduce_scatter: a private buffer of %zu elements", n * count);
  }
  *q = (mpi_req){.nreq = 0, .req = q->req, .fin = FIN_UNPACK, .tmp = q->tmp, .recv = recv, .count = count,
                 .chunk = chunk, .dt = dt, .acc = acc, .n = c->size};
  for (size_t off = 0; off < count; off += chunk) {
    size_t m = min_size(chunk, count - off);
    char *base = q->tmp + n * off * asz;
    for (size_t j = 0; j < n; j++)
      tpr_dtype_convert((const char *)send + (j * count + off) * esz, dt, base + j * m * asz, acc, m);
    int err = MPI_Ireduce_scatter_block(MPI_IN_PLACE, base, (int)m, tpr__mpi_reduce_type(acc), tpr__mpi_op(op),
                                        c->comm, &q->req[q->nreq]);
    if (err != MPI_SUCCESS) return start_failed(q, err, "MPI_Ireduce_scatter_block");
    q->nreq++;
  }
  *req = q;
  return TPR_OK;
}

tpr_status tpr__mpi_ireduce_scatter(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                    tpr_red_op op, void **req) {
  mpi_ctx *c = ctx;
  *req = NULL;
  if (!count) return TPR_OK;
  TPR_CHECK(check_host(c, send, recv, "ireduce_scatter"));
  if (is_half(dt) || count > tpr__mpi_max_count()) return start_packed(c, send, recv, count, dt, op, req);
  size_t bytes = count * tpr_dtype_size(dt);
  bool in_place = recv == (const char *)send + (size_t)c->rank * bytes;
  mpi_req *q = req_new(1);
  if (q && in_place) q->tmp = malloc(bytes);
  if (!q || (in_place && !q->tmp)) {
    req_free(q);
    return TPR_FAIL(TPR_ERR_OOM, "ireduce_scatter: request (%zu bytes)", bytes);
  }
  q->nreq = 1, q->recv = recv, q->count = count, q->dt = dt, q->fin = in_place ? FIN_COPY : FIN_NONE;
  int err = MPI_Ireduce_scatter_block(send, in_place ? q->tmp : recv, (int)count, tpr__mpi_reduce_type(dt),
                                      tpr__mpi_op(op), c->comm, q->req);
  if (err != MPI_SUCCESS) return start_failed(q, err, "MPI_Ireduce_scatter_block");
  *req = q;
  return TPR_OK;
}

// Moves a completed reduce_scatter's result into recv.
static void finish(mpi_req *q) {
  if (q->done) return;
  q->done = true;
  size_t esz = tpr_dtype_size(q->dt), asz = tpr_dtype_size(q->acc), n = (size_t)q->n;
  if (q->fin == FIN_COPY) memcpy(q->recv, q->tmp, q->count * esz);
  if (q->fin == FIN_UNPACK)
    for (size_t off = 0; off < q->count; off += q->chunk) {
      size_t m = min_size(q->chunk, q->count - off);
      tpr_dtype_convert(q->tmp + n * off * asz, q->acc, (char *)q->recv + off * esz, q->dt, m);
    }
}

tpr_status tpr__mpi_test(void *ctx, void *req, bool *done) {
  mpi_req *q = req;
  int flag = 1;
  if (!q->done) {
    int err = MPI_Testall(q->nreq, q->req, &flag, MPI_STATUSES_IGNORE);
    if (err != MPI_SUCCESS) return tpr__mpi_fail(err, "MPI_Testall");
    if (flag) finish(q);
  }
  *done = flag != 0;
  return TPR_OK;
}

tpr_status tpr__mpi_wait(void *ctx, void *req) {
  mpi_req *q = req;
  int err = q->done ? MPI_SUCCESS : MPI_Waitall(q->nreq, q->req, MPI_STATUSES_IGNORE);
  if (err == MPI_SUCCESS) finish(q);
  req_free(q);
  return err == MPI_SUCCESS ? TPR_OK : tpr__mpi_fail(err, "MPI_Waitall");
}
