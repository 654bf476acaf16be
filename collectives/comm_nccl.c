// The `nccl` backend: device buffers, one GPU per rank, ncclUniqueId
// bootstrapped over MPI.
//
// Buffers are device memory of this communicator's GPU. A host pointer (or
// memory of another GPU) would fault inside an NCCL kernel and leave a sticky
// CUDA error that kills the context, so every entry refuses one up front with
// TPR_ERR_INVALID_ARG (one cudaPointerGetAttributes per buffer, a few hundred
// ns). Inputs must be ready when the call is made: the API has no stream, so
// work on other streams that writes `send` must be synchronised by the caller
// (exec.c syncs its backend before a collective op).
//
// Each communicator owns a non-blocking stream. Every call enqueues on it and
// waits for it before returning (tpr_comm.h promises completion on return).
// The wait polls instead of blocking in cudaStreamSynchronize, checking
// ncclCommGetAsyncError, so a failed peer (network error, dead process) ends
// the call with a message instead of a hang; a peer that never arrives is the
// watchdog's (watchdog.c), which aborts the job over MPI.
//
// Reductions run in NCCL's own arithmetic: f32/i32/i64 as usual; bf16 and f16
// are widened per step but rounded back to 16 bits after every hop, so with
// more than two ranks a bf16 sum is rounded up to n-1 times, not once as
// tpr_comm.h states. Exact whenever partial sums are representable.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpr_comm.h"

#ifdef TPR_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#include <time.h>

#include "comm_mpi.h"  // tpr__comm_mpi_handle: the bootstrap's MPI communicator

typedef struct nccl_ctx {
  ncclComm_t comm;
  cudaStream_t stream;
  int device;
  int rank, size;
  int *scratch;  // (1) device int the barrier reduces
  bool broken;   // an asynchronous error was seen: destroy aborts instead
} nccl_ctx;

static tpr_status nccl_fail(nccl_ctx *c, ncclResult_t r, const char *what) {
  // Argument errors leave the communicator usable; anything else may not.
  if (c && r != ncclInvalidArgument && r != ncclInvalidUsage) c->broken = true;
  const char *detail = ncclGetLastError(c ? c->comm : NULL);
  return TPR_FAIL(TPR_ERR_COMM, "nccl: %s: %s%s%s", what, ncclGetErrorString(r), detail && *detail ? ": " : "",
                  detail ? detail : "");
}

static tpr_status cuda_fail(cudaError_t e, const char *what) {
  return TPR_FAIL(TPR_ERR_COMM, "nccl: %s: %s", what, cudaGetErrorString(e));
}

static ncclDataType_t nccl_type(tpr_dtype dt) {
  switch (dt) {
    case TPR_F32: return ncclFloat32;
    case TPR_BF16: return ncclBfloat16;
    case TPR_F16: return ncclFloat16;
    case TPR_I32: return ncclInt32;
    case TPR_I64: return ncclInt64;
    default: return ncclUint8;  // u8, f8e4m3: moved, never reduced (the front refuses)
  }
}

static ncclRedOp_t nccl_op(tpr_red_op op) { return op == TPR_MAX ? ncclMax : op == TPR_MIN ? ncclMin : ncclSum; }

static void sleep_us(long us) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000L};
  nanosleep(&ts, NULL);
}

// One look at the stream (ev NULL) or at an event recorded on it: *done, or
// an error when CUDA or NCCL (asynchronously: a failed peer) reports one.
static tpr_status poll_once(nccl_ctx *c, cudaEvent_t ev, const char *what, bool *done) {
  cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(c->stream);
  *done = e == cudaSuccess;
  if (*done) return TPR_OK;
  if (e != cudaErrorNotReady) {
    c->broken = true;
    return cuda_fail(e, what);
  }
  ncclResult_t async = ncclSuccess, r = ncclCommGetAsyncError(c->comm, &async);
  if (r != ncclSuccess) return nccl_fail(c, r, "ncclCommGetAsyncError");
  if (async != ncclSuccess && async != ncclInProgress) {
    c->broken = true;
    return nccl_fail(c, async, what);
  }
  return TPR_OK;
}

// Waits for the stream (ev NULL) or an event on it. Spins first (a small
// collective takes microseconds), then sleeps with backoff up to 1 ms so a
// long wait costs no CPU.
static tpr_status wait_on(nccl_ctx *c, cudaEvent_t ev, const char *what) {
  long nap_us = 0;
  for (unsigned polls = 0;; polls++) {
    bool done = false;
    TPR_CHECK(poll_once(c, ev, what, &done));
    if (done) return TPR_OK;
    if (polls < 2000) continue;
    nap_us = nap_us ? (nap_us < 1000 ? 2 * nap_us : 1000) : 10;
    sleep_us(nap_us);
  }
}

static tpr_status wait_stream(nccl_ctx *c, const char *what) { return wait_on(c, NULL, what); }

// The tail of every entry: the enqueue's result, then completion.
static tpr_status finish(nccl_ctx *c, ncclResult_t r, const char *what) {
  if (r != ncclSuccess) return nccl_fail(c, r, what);
  return wait_stream(c, what);
}

static tpr_status check_device_ptr(const nccl_ctx *c, const void *p, const char *op, const char *which) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // older runtimes fail on plain host pointers: clear it, call it host
    a.type = cudaMemoryTypeUnregistered;
  }
  if ((a.type == cudaMemoryTypeDevice && a.device == c->device) || a.type == cudaMemoryTypeManaged) return TPR_OK;
  if (a.type == cudaMemoryTypeDevice)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "nccl %s: %s buffer %p is on GPU %d; this communicator's GPU is %d", op,
                    which, p, a.device, c->device);
  return TPR_FAIL(TPR_ERR_INVALID_ARG,
                  "nccl %s: %s buffer %p is host memory; the nccl backend takes device memory of GPU %d "
                  "(the mpi backend takes host buffers)",
                  op, which, p, c->device);
}

// Checks send and recv (either may be NULL: not used on this rank).
static tpr_status check_buffers(const nccl_ctx *c, const void *send, const void *recv, const char *op) {
  if (send) TPR_CHECK(check_device_ptr(c, send, op, "send"));
  if (recv && recv != send) TPR_CHECK(check_device_ptr(c, recv, op, "recv"));
  return TPR_OK;
}

static tpr_status nc_all_reduce(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                tpr_red_op op) {
  nccl_ctx *c = ctx;
  if (!count) return TPR_OK;
  TPR_CHECK(check_buffers(c, send, recv, "all_reduce"));
  return finish(c, ncclAllReduce(send, recv, count, nccl_type(dt), nccl_op(op), c->comm, c->stream),
                "ncclAllReduce");
}

// In-place layouts of all_gather and reduce_scatter are NCCL's own.
static tpr_status nc_all_gather(void *ctx, const void *send, void *recv, size_t send_count, tpr_dtype dt) {
  nccl_ctx *c = ctx;
  if (!send_count) return TPR_OK;
  TPR_CHECK(check_buffers(c, send, recv, "all_gather"));
  return finish(c, ncclAllGather(send, recv, send_count, nccl_type(dt), c->comm, c->stream), "ncclAllGather");
}

static tpr_status nc_reduce_scatter(void *ctx, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                                    tpr_red_op op) {
  nccl_ctx *c = ctx;
  if (!recv_count) return TPR_OK;
  TPR_CHECK(check_buffers(c, send, recv, "reduce_scatter"));
  return finish(c, ncclReduceScatter(send, recv, recv_count, nccl_type(dt), nccl_op(op), c->comm, c->stream),
                "ncclReduceScatter");
}

// --- nonblocking: enqueue, then an event marks completion -----------------

typedef struct nc_req {
  cudaEvent_t ev;
  const char *what;
} nc_req;

// The tail of a nonblocking start: the enqueue's result, then an event on
// the stream. If the event cannot be made, the collective is already
// enqueued: wait for it so the caller's buffers are free when this fails.
static tpr_status start(nccl_ctx *c, ncclResult_t r, const char *what, void **req) {
  if (r != ncclSuccess) return nccl_fail(c, r, what);
  nc_req *q = calloc(1, sizeof *q);
  cudaError_t e = q ? cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming) : cudaErrorMemoryAllocation;
  if (e == cudaSuccess) e = cudaEventRecord(q->ev, c->stream);
  if (e != cudaSuccess) {
    tpr_status rc = wait_stream(c, what);
    if (q && q->ev) cudaEventDestroy(q->ev);
    free(q);
    return rc != TPR_OK ? rc : cuda_fail(e, "cudaEventCreate/Record (nonblocking collective)");
  }
  q->what = what;
  *req = q;
  return TPR_OK;
}

static tpr_status nc_iall_gather(void *ctx, const void *send, void *recv, size_t send_count, tpr_dtype dt,
                                 void **req) {
  nccl_ctx *c = ctx;
  *req = NULL;
  if (!send_count) return TPR_OK;
  TPR_CHECK(check_buffers(c, send, recv, "iall_gather"));
  return start(c, ncclAllGather(send, recv, send_count, nccl_type(dt), c->comm, c->stream), "ncclAllGather", req);
}

static tpr_status nc_ireduce_scatter(void *ctx, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                                     tpr_red_op op, void **req) {
  nccl_ctx *c = ctx;
  *req = NULL;
  if (!recv_count) return TPR_OK;
  TPR_CHECK(check_buffers(c, send, recv, "ireduce_scatter"));
  return start(c, ncclReduceScatter(send, recv, recv_count, nccl_type(dt), nccl_op(op), c->comm, c->stream),
               "ncclReduceScatter", req);
}

static tpr_status nc_ibroadcast(void *ctx, void *buf, size_t count, tpr_dtype dt, int root, void **req) {
  nccl_ctx *c = ctx;
  *req = NULL;
  if (!count) return TPR_OK;
  TPR_CHECK(check_buffers(c, buf, buf, "ibroadcast"));
  return start(c, ncclBroadcast(buf, buf, count, nccl_type(dt), root, c->comm, c->stream), "ncclBroadcast", req);
}

static tpr_status nc_test(void *ctx, void *req, bool *done) {
  nc_req *q = req;
  return poll_once(ctx, q->ev, q->what, done);
}

static tpr_status nc_wait(void *ctx, void *req) {
  nc_req *q = req;
  tpr_status rc = wait_on(ctx, q->ev, q->what);
  cudaEventDestroy(q->ev);
  free(q);
  return rc;
}

// One grouped exchange: to peer j go sc[j] elements from send + sd[j]; from
// peer j come rc[j] into recv + rd[j]. counts == NULL: the all_to_all layout
// (`count` elements at block j on both sides). The block to self is a copy on
// the stream, not an NCCL self-send. Zero counts are skipped on both sides,
// which stays matched because rc[j] here equals sc[me] on rank j.
static tpr_status exchange(nccl_ctx *c, const char *send, const size_t *sc, const size_t *sd, char *recv,
                           const size_t *rc, const size_t *rd, size_t count, tpr_dtype dt, const char *op) {
  size_t esz = tpr_dtype_size(dt);
  ncclDataType_t t = nccl_type(dt);
#define AT(arr, uniform) ((arr) ? (arr)[j] : (uniform))
  for (int j = 0; j < c->size; j++) {  // check every buffer first: no half-enqueued group on error
    if (AT(sc, count)) TPR_CHECK(check_device_ptr(c, send + AT(sd, (size_t)j * count) * esz, op, "send"));
    if (AT(rc, count)) TPR_CHECK(check_device_ptr(c, recv + AT(rd, (size_t)j * count) * esz, op, "recv"));
  }
  int j = c->rank;
  size_t self = AT(sc, count) < AT(rc, count) ? AT(sc, count) : AT(rc, count);
  if (self) {
    cudaError_t e = cudaMemcpyAsync(recv + AT(rd, (size_t)j * count) * esz, send + AT(sd, (size_t)j * count) * esz,
                                    self * esz, cudaMemcpyDeviceToDevice, c->stream);
    if (e != cudaSuccess) return cuda_fail(e, "cudaMemcpyAsync (the block to self)");
  }
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return nccl_fail(c, r, "ncclGroupStart");
  for (j = 0; j < c->size && r == ncclSuccess; j++) {
    if (j == c->rank) continue;
    if (AT(sc, count)) r = ncclSend(send + AT(sd, (size_t)j * count) * esz, AT(sc, count), t, j, c->comm, c->stream);
    if (r == ncclSuccess && AT(rc, count))
      r = ncclRecv(recv + AT(rd, (size_t)j * count) * esz, AT(rc, count), t, j, c->comm, c->stream);
  }
#undef AT
  ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failed enqueue
  char what[64];
  snprintf(what, sizeof what, "%s (%s)", r != ncclSuccess ? "ncclSend/ncclRecv" : "ncclGroupEnd", op);
  return r != ncclSuccess ? nccl_fail(c, r, what) : finish(c, end, what);
}

static tpr_status nc_all_to_all(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt) {
  if (!count) return TPR_OK;
  return exchange(ctx, send, NULL, NULL, recv, NULL, NULL, count, dt, "all_to_all");
}

static tpr_status nc_all_to_allv(void *ctx, const void *send, const size_t *send_counts, const size_t *send_displs,
                                 void *recv, const size_t *recv_counts, const size_t *recv_displs, tpr_dtype dt) {
  return exchange(ctx, send, send_counts, send_displs, recv, recv_counts, recv_displs, 0, dt, "all_to_allv");
}

static tpr_status nc_broadcast(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, int root) {
  nccl_ctx *c = ctx;
  if (!count) return TPR_OK;
  if (c->rank != root) send = recv;  // send is read on root only and may be NULL elsewhere
  TPR_CHECK(check_buffers(c, send, recv, "broadcast"));
  return finish(c, ncclBroadcast(send, recv, count, nccl_type(dt), root, c->comm, c->stream), "ncclBroadcast");
}

// A one-int all_reduce: every rank must arrive, and it also orders after all
// earlier work of this communicator.
static tpr_status nc_barrier(void *ctx) {
  nccl_ctx *c = ctx;
  return finish(c, ncclAllReduce(c->scratch, c->scratch, 1, ncclInt32, ncclMax, c->comm, c->stream),
                "ncclAllReduce (barrier)");
}

static tpr_status nc_send(void *ctx, const void *buf, size_t count, tpr_dtype dt, int peer) {
  nccl_ctx *c = ctx;
  if (!count) return TPR_OK;
  TPR_CHECK(check_buffers(c, buf, NULL, "send"));
  return finish(c, ncclSend(buf, count, nccl_type(dt), peer, c->comm, c->stream), "ncclSend");
}

static tpr_status nc_recv(void *ctx, void *buf, size_t count, tpr_dtype dt, int peer) {
  nccl_ctx *c = ctx;
  if (!count) return TPR_OK;
  TPR_CHECK(check_buffers(c, NULL, buf, "recv"));
  return finish(c, ncclRecv(buf, count, nccl_type(dt), peer, c->comm, c->stream), "ncclRecv");
}

static void nc_destroy(void *ctx) {
  nccl_ctx *c = ctx;
  if (!c) return;
  // Destroy flushes outstanding work, which after an asynchronous error may
  // never finish; abort does not wait.
  if (c->comm && c->broken) ncclCommAbort(c->comm);
  else if (c->comm) ncclCommDestroy(c->comm);
  if (c->scratch) cudaFree(c->scratch);
  if (c->stream) cudaStreamDestroy(c->stream);
  free(c);
}

// The per-communicator CUDA state around an existing c->comm (or before it).
static tpr_status local_setup(nccl_ctx *c) {
  cudaError_t e = cudaSetDevice(c->device);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
  e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cuda_fail(e, "cudaStreamCreateWithFlags");
  e = cudaMalloc((void **)&c->scratch, sizeof *c->scratch);
  if (e != cudaSuccess) return cuda_fail(e, "cudaMalloc (barrier scratch)");
  return TPR_OK;
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
// The front splits the host twin the same way; both order by (key, parent
// rank), so group ranks agree.
static tpr_status nc_split(void *ctx, int color, int key, void **out_ctx, int *rank, int *size) {
  nccl_ctx *p = ctx;
  *out_ctx = NULL;
  ncclComm_t comm = NULL;
  // Collective over the parent: called on every rank before anything local can fail.
  ncclResult_t r = ncclCommSplit(p->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, NULL);
  if (r != ncclSuccess) return nccl_fail(p, r, "ncclCommSplit");
  if (!comm) return TPR_OK;
  nccl_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    ncclCommDestroy(comm);
    return TPR_FAIL(TPR_ERR_OOM, "nccl split");
  }
  *c = (nccl_ctx){.comm = comm, .device = p->device};
  tpr_status rc = local_setup(c);
  if (rc == TPR_OK && (r = ncclCommUserRank(comm, &c->rank)) == ncclSuccess) r = ncclCommCount(comm, &c->size);
  if (rc == TPR_OK && r != ncclSuccess) rc = nccl_fail(c, r, "ncclCommUserRank/Count");
  if (rc != TPR_OK) {
    nc_destroy(c);
    return rc;
  }
  *out_ctx = c, *rank = c->rank, *size = c->size;
  return TPR_OK;
}
#else
#define nc_split NULL  // ncclCommSplit arrived in NCCL 2.18
#endif

static const tpr_comm_vtable nccl_vtable = {
    .name = "nccl",
    .all_reduce = nc_all_reduce,
    .all_gather = nc_all_gather,
    .reduce_scatter = nc_reduce_scatter,
    .all_to_all = nc_all_to_all,
    .all_to_allv = nc_all_to_allv,
    .broadcast = nc_broadcast,
    .barrier = nc_barrier,
    .send = nc_send,
    .recv = nc_recv,
    .iall_gather = nc_iall_gather,
    .ibroadcast = nc_ibroadcast,
    .ireduce_scatter = nc_ireduce_scatter,
    .test = nc_test,
    .wait = nc_wait,
    .split = nc_split,
    .destroy = nc_destroy,
};

// This rank's index among the ranks on its node (MPI_COMM_TYPE_SHARED).
static tpr_status node_rank(tpr_comm_t host, int *out) {
  MPI_Comm node;
  int err = MPI_Comm_split_type(tpr__comm_mpi_handle(host), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  if (err != MPI_SUCCESS) return TPR_FAIL(TPR_ERR_COMM, "nccl init: MPI_Comm_split_type failed (%d)", err);
  MPI_Comm_rank(node, out);
  MPI_Comm_free(&node);
  return TPR_OK;
}

// Everything up to ncclCommInitRank that can fail on one rank alone.
static tpr_status prepare(nccl_ctx *c, int device, int local, ncclUniqueId *id) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
    cudaGetLastError();  // the sticky "no driver" error
    ndev = 0;
  }
  if (ndev == 0) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "no CUDA device: the nccl backend needs a GPU per rank");
  c->device = device < 0 ? local % ndev : device;
  if (c->device >= ndev)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "nccl init: CUDA device %d does not exist (%d visible)", device, ndev);
  TPR_CHECK(local_setup(c));
  ncclResult_t r = c->rank == 0 ? ncclGetUniqueId(id) : ncclSuccess;
  if (r != ncclSuccess) return nccl_fail(c, r, "ncclGetUniqueId");
  return TPR_OK;
}

tpr_status tpr_comm_init_nccl(tpr_comm_t mpi_world, int device, tpr_comm_t *out) {
  *out = NULL;
  if (!mpi_world || strcmp(tpr_comm_backend(mpi_world), "mpi") != 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "nccl init: bootstraps over an mpi communicator, got %s",
                    mpi_world ? tpr_comm_backend(mpi_world) : "NULL");
  // The new communicator owns its host twin; the caller keeps mpi_world.
  tpr_comm_t twin = NULL;
  TPR_CHECK(tpr_comm_split(mpi_world, 0, tpr_comm_rank(mpi_world), "world", &twin));
  nccl_ctx *c = calloc(1, sizeof *c);
  int *world_ranks = malloc((size_t)tpr_comm_size(twin) * sizeof *world_ranks);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  int local = 0;
  tpr_status rc = node_rank(twin, &local);  // collective: before any local failure
  if (!c || !world_ranks) rc = TPR_FAIL(TPR_ERR_OOM, "nccl communicator");
  if (rc == TPR_OK) {
    c->rank = tpr_comm_rank(twin), c->size = tpr_comm_size(twin);
    rc = prepare(c, device, local, &id);
  }
  // Fail together: a rank that stopped here would leave the others waiting
  // in the bootstrap below.
  int32_t mine = (int32_t)rc, worst = mine;
  tpr_status arc = tpr_comm_all_reduce(twin, &mine, &worst, 1, TPR_I32, TPR_MAX);
  if (rc == TPR_OK && arc != TPR_OK) rc = arc;
  if (rc == TPR_OK && worst != TPR_OK)
    rc = TPR_FAIL((tpr_status)worst, "nccl init: another rank failed to set up its GPU (see its message)");
  if (rc == TPR_OK) rc = tpr_comm_broadcast(twin, &id, &id, sizeof id, TPR_U8, 0);
  if (rc == TPR_OK) {
    ncclResult_t r = ncclCommInitRank(&c->comm, c->size, id, c->rank);
    if (r != ncclSuccess) {
      c->comm = NULL;
      rc = nccl_fail(c, r, "ncclCommInitRank");
    }
  }
  if (rc != TPR_OK) {
    nc_destroy(c);
    free(world_ranks);
    tpr_comm_free(twin);
    return rc;
  }
  for (int r = 0; r < c->size; r++) world_ranks[r] = tpr_comm_world_rank(twin, r);
  rc = tpr__comm_new(&nccl_vtable, c, c->rank, c->size, world_ranks, "world", twin, out);
  free(world_ranks);
  return rc;
}

bool tpr_comm_nccl_built(void) { return true; }

#else  // no NCCL in this build

tpr_status tpr_comm_init_nccl(tpr_comm_t mpi_world, int device, tpr_comm_t *out) {
  *out = NULL;
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "this build has no NCCL (configure with TPR_CUDA=ON and NCCL installed)");
}

bool tpr_comm_nccl_built(void) { return false; }

#endif
