// The `mpi` backend: host buffers over a duplicated MPI communicator; device
// buffers reach it through comm_stage.c (pinned host copies) unless MPI is
// CUDA-aware. MPI errors are returned (MPI_ERRORS_RETURN), never fatal, and
// become TPR_ERR_COMM with MPI's own message.
//
// An MPI count is an int. Nothing here truncates a size_t: reductions are cut
// into chunks of at most max_count elements (element-wise ops do not care),
// data movement describes a bigger block as one element of a derived
// contiguous type, and all_to_allv is point-to-point messages throughout.
// Which MPI calls a rank makes depends only on what every rank shares (count,
// dtype, group size), never on its own buffers (in place or not, device or
// host, its all_to_allv layout), so no rank can take a path its peers do not.
// Zero counts make no MPI call where every rank has the same count; send and
// recv pass empty messages (with a valid pointer), so they still pair up.
#include "comm_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm_mpi_impl.h"

// Open MPI says at compile time whether it was built CUDA-aware, and at run
// time whether that support is active. Other MPIs: assume not (staging is
// always correct, only slower).
#if defined(OPEN_MPI) && OPEN_MPI && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

enum { TAG_P2P = 7470, TAG_ALLTOALLV = 7471 };  // send/recv vs all_to_allv's fallback: never matched together

// bf16/f16 reductions and packed reduce-scatter blocks go through an f32 (or
// same-type) scratch of about this size per MPI call, so the scratch kept
// between calls stays bounded whatever the count.
#define CHUNK_BYTES ((size_t)16 << 20)

static size_t max_count = INT_MAX;
static int thread_level = -1;  // unknown until tpr_comm_mpi_init or a query

void tpr__comm_mpi_set_max_count(size_t n) { max_count = n && n < INT_MAX ? n : INT_MAX; }
size_t tpr__mpi_max_count(void) { return max_count; }

tpr_status tpr__mpi_fail(int err, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", err);
  return TPR_FAIL(TPR_ERR_COMM, "%s: %s", what, msg);
}

#define MPI_TRY(call, what)                                       \
  do {                                                            \
    int mpi__err = (call);                                        \
    if (mpi__err != MPI_SUCCESS) return tpr__mpi_fail(mpi__err, what); \
  } while (0)

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static bool is_half(tpr_dtype dt) { return dt == TPR_BF16 || dt == TPR_F16; }

// Types that reduce natively (the front admits f32, bf16, f16, i32, i64;
// the 16-bit floats reduce as f32).
MPI_Datatype tpr__mpi_reduce_type(tpr_dtype dt) {
  return dt == TPR_I32 ? MPI_INT32_T : dt == TPR_I64 ? MPI_INT64_T : MPI_FLOAT;
}

// Data movement copies bits: an unsigned integer type of the element's size
// (no float conversion can touch a NaN payload; counts stay in elements, so
// a count reaches 2^31 elements before a derived type is needed).
static MPI_Datatype move_type(tpr_dtype dt) {
  switch (tpr_dtype_size(dt)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
  }
}

MPI_Op tpr__mpi_op(tpr_red_op op) { return op == TPR_MAX ? MPI_MAX : op == TPR_MIN ? MPI_MIN : MPI_SUM; }

// A scratch bigger than CHUNK_BYTES (in-place reduce-scatter) is not kept.
static void scratch_trim(mpi_ctx *c) {
  if (c->scratch_cap > CHUNK_BYTES) {
    free(c->scratch);
    c->scratch = NULL, c->scratch_cap = 0;
  }
}

static void *scratch(mpi_ctx *c, size_t bytes) {
  if (bytes > c->scratch_cap) {
    free(c->scratch);
    c->scratch = malloc(bytes);
    c->scratch_cap = c->scratch ? bytes : 0;
  }
  return c->scratch;
}

// `count` elements of dt as (n, t) for one MPI call: (count, element type)
// when count <= max_count, else (1, a committed contiguous type of count
// elements: max_count-element chunks and a remainder, extent count elements).
void tpr__mpi_span_free(span *s) {
  if (s->owned) MPI_Type_free(&s->t);
  s->owned = false;
}

tpr_status tpr__mpi_span_make(size_t count, tpr_dtype dt, span *s) {
  MPI_Datatype elem = move_type(dt);
  *s = (span){.n = (int)count, .t = elem};
  if (count <= max_count) return TPR_OK;
  size_t esz = tpr_dtype_size(dt), q = count / max_count, r = count % max_count;
  if (q > INT_MAX) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "mpi: a block of %zu elements is too big to describe", count);
  MPI_Datatype chunk, body;
  MPI_TRY(MPI_Type_contiguous((int)max_count, elem, &chunk), "MPI_Type_contiguous");
  int blocks[2] = {(int)q, (int)r};
  MPI_Aint displs[2] = {0, (MPI_Aint)(q * max_count * esz)};
  MPI_Datatype types[2] = {chunk, elem};
  int err = MPI_Type_create_struct(r ? 2 : 1, blocks, displs, types, &body);
  MPI_Type_free(&chunk);
  if (err != MPI_SUCCESS) return tpr__mpi_fail(err, "MPI_Type_create_struct");
  // Resized so that block j of an array of them starts at j * count elements.
  err = MPI_Type_create_resized(body, 0, (MPI_Aint)(count * esz), &s->t);
  MPI_Type_free(&body);
  if (err == MPI_SUCCESS) err = MPI_Type_commit(&s->t);
  if (err != MPI_SUCCESS) return tpr__mpi_fail(err, "MPI_Type_create_resized");
  s->n = 1;
  s->owned = true;
  return TPR_OK;
}

// --- reductions ---------------------------------------------------------

// 16-bit floats accumulate in f32 (docs/architecture.md: reductions accumulate in f32)
// and round once, chunk by chunk through the scratch. In place is safe: a
// chunk is read whole before it is written.
static tpr_status all_reduce_half(mpi_ctx *c, const void *send, void *recv, size_t count, tpr_dtype dt,
                                  tpr_red_op op) {
  size_t esz = tpr_dtype_size(dt), chunk = min_size(max_count, CHUNK_BYTES / sizeof(float));
  float *tmp = scratch(c, min_size(count, chunk) * sizeof *tmp);
  if (!tmp) return TPR_FAIL(TPR_ERR_OOM, "all_reduce: f32 scratch for %zu elements", min_size(count, chunk));
  for (size_t off = 0; off < count; off += chunk) {
    size_t n = min_size(chunk, count - off);
    tpr_dtype_convert((const char *)send + off * esz, dt, tmp, TPR_F32, n);
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, tmp, (int)n, MPI_FLOAT, tpr__mpi_op(op), c->comm), "MPI_Allreduce");
    tpr_dtype_convert(tmp, TPR_F32, (char *)recv + off * esz, dt, n);
  }
  return TPR_OK;
}

static tpr_status mpi_all_reduce(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                 tpr_red_op op) {
  mpi_ctx *c = ctx;
  if (!count) return TPR_OK;
  if (is_half(dt)) return all_reduce_half(c, send, recv, count, dt, op);
  size_t esz = tpr_dtype_size(dt);
  for (size_t off = 0; off < count; off += max_count) {
    size_t n = min_size(max_count, count - off);
    const void *src = send == recv ? MPI_IN_PLACE : (const char *)send + off * esz;
    MPI_TRY(MPI_Allreduce(src, (char *)recv + off * esz, (int)n, tpr__mpi_reduce_type(dt), tpr__mpi_op(op), c->comm),
            "MPI_Allreduce");
  }
  return TPR_OK;
}

// bf16/f16, and counts above max_count: chunk by chunk, each rank packs
// elements [off, off + m) of every block into the scratch (converted to f32
// for bf16/f16), reduce-scatters that in place (MPI leaves block r's result
// at the scratch's start) and unpacks it into recv[off, off + m). In place is
// safe: recv[off, off + m) is written after every block's [off, off + m) was
// packed, and later chunks read beyond it. The chunking depends only on
// count, dtype and group size, which every rank shares, so every rank makes
// the same MPI calls.
static tpr_status reduce_scatter_packed(mpi_ctx *c, const void *send, void *recv, size_t count, tpr_dtype dt,
                                        tpr_red_op op) {
  tpr_dtype acc = is_half(dt) ? TPR_F32 : dt;
  size_t esz = tpr_dtype_size(dt), asz = tpr_dtype_size(acc), n = (size_t)c->size;
  size_t chunk = min_size(min_size(count, max_count), CHUNK_BYTES / (n * asz));
  if (chunk == 0) chunk = 1;
  char *tmp = scratch(c, n * chunk * asz);
  if (!tmp) return TPR_FAIL(TPR_ERR_OOM, "reduce_scatter: scratch for %zu elements", n * chunk);
  for (size_t off = 0; off < count; off += chunk) {
    size_t m = min_size(chunk, count - off);
    for (size_t j = 0; j < n; j++)
      tpr_dtype_convert((const char *)send + (j * count + off) * esz, dt, tmp + j * m * asz, acc, m);
    MPI_TRY(MPI_Reduce_scatter_block(MPI_IN_PLACE, tmp, (int)m, tpr__mpi_reduce_type(acc), tpr__mpi_op(op), c->comm),
            "MPI_Reduce_scatter_block");
    tpr_dtype_convert(tmp, acc, (char *)recv + off * esz, dt, m);
  }
  return TPR_OK;
}

// In place (recv inside send) is a per-rank choice, so it must not change
// the MPI calls: the result goes to a scratch block first (MPI's own in-place
// form would leave it at block 0, not block r).
static tpr_status mpi_reduce_scatter(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                     tpr_red_op op) {
  mpi_ctx *c = ctx;
  if (!count) return TPR_OK;
  if (is_half(dt) || count > max_count) return reduce_scatter_packed(c, send, recv, count, dt, op);
  size_t bytes = count * tpr_dtype_size(dt);
  bool in_place = recv == (const char *)send + (size_t)c->rank * bytes;
  void *dst = in_place ? scratch(c, bytes) : recv;
  if (!dst) return TPR_FAIL(TPR_ERR_OOM, "reduce_scatter: scratch for %zu bytes", bytes);
  int err = MPI_Reduce_scatter_block(send, dst, (int)count, tpr__mpi_reduce_type(dt), tpr__mpi_op(op), c->comm);
  if (err == MPI_SUCCESS && in_place) memcpy(recv, dst, bytes);
  scratch_trim(c);
  return err == MPI_SUCCESS ? TPR_OK : tpr__mpi_fail(err, "MPI_Reduce_scatter_block");
}

// --- data movement ------------------------------------------------------

static tpr_status mpi_all_gather(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt) {
  mpi_ctx *c = ctx;
  if (!count) return TPR_OK;
  span s;
  TPR_CHECK(tpr__mpi_span_make(count, dt, &s));
  bool in_place = send == (const char *)recv + (size_t)c->rank * count * tpr_dtype_size(dt);
  int err = MPI_Allgather(in_place ? MPI_IN_PLACE : send, s.n, s.t, recv, s.n, s.t, c->comm);
  tpr__mpi_span_free(&s);
  return err == MPI_SUCCESS ? TPR_OK : tpr__mpi_fail(err, "MPI_Allgather");
}

static tpr_status mpi_all_to_all(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt) {
  mpi_ctx *c = ctx;
  if (!count) return TPR_OK;
  span s;
  TPR_CHECK(tpr__mpi_span_make(count, dt, &s));
  int err = MPI_Alltoall(send, s.n, s.t, recv, s.n, s.t, c->comm);
  tpr__mpi_span_free(&s);
  return err == MPI_SUCCESS ? TPR_OK : tpr__mpi_fail(err, "MPI_Alltoall");
}

// all_to_allv as one message per peer (MPI_Alltoallv would take int counts
// and displacements: a rank whose layout does not fit an int cannot fall back
// on its own, since its peers, whose layouts fit, would wait in a different
// call; messages work for every layout, and a block bigger than max_count is
// one element of a derived type). All receives are posted, then the sends in
// ring order from the next rank on; this rank's own block is a local copy.
// Measured on one node, as fast as Open MPI's MPI_Alltoallv (pairwise).
static tpr_status mpi_all_to_allv(void *ctx, const void *send, const size_t *sc, const size_t *sd, void *recv,
                                  const size_t *rc, const size_t *rd, tpr_dtype dt) {
  mpi_ctx *c = ctx;
  int n = c->size, r = c->rank, nreq = 0, err = MPI_SUCCESS;
  size_t esz = tpr_dtype_size(dt);
  MPI_Request stack_req[16];
  span stack_spans[16];
  MPI_Request *req = 2 * n <= 16 ? stack_req : malloc(2 * (size_t)n * sizeof *req);
  span *spans = 2 * n <= 16 ? stack_spans : malloc(2 * (size_t)n * sizeof *spans);
  tpr_status st = req && spans ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "all_to_allv: %d requests", 2 * n);
  const char *what = "MPI_Irecv";
  for (int k = 1; k < n && st == TPR_OK && err == MPI_SUCCESS; k++) {
    int j = (r - k + n) % n;
    if (!rc[j]) continue;
    req[nreq] = MPI_REQUEST_NULL;
    st = tpr__mpi_span_make(rc[j], dt, &spans[nreq]);
    if (st == TPR_OK)
      err = MPI_Irecv((char *)recv + rd[j] * esz, spans[nreq].n, spans[nreq].t, j, TAG_ALLTOALLV, c->comm,
                      &req[nreq]);
    if (st == TPR_OK) nreq++;  // a failed post leaves MPI_REQUEST_NULL, which MPI_Waitall skips
  }
  for (int k = 1; k < n && st == TPR_OK && err == MPI_SUCCESS; k++) {
    int j = (r + k) % n;
    if (!sc[j]) continue;
    what = "MPI_Isend";
    req[nreq] = MPI_REQUEST_NULL;
    st = tpr__mpi_span_make(sc[j], dt, &spans[nreq]);
    if (st == TPR_OK)
      err = MPI_Isend((const char *)send + sd[j] * esz, spans[nreq].n, spans[nreq].t, j, TAG_ALLTOALLV, c->comm,
                      &req[nreq]);
    if (st == TPR_OK) nreq++;
  }
  // This rank's block to itself. A mismatch is reported only after the
  // exchange, so that the peers are not left waiting for this rank.
  size_t self = sc[r] < rc[r] ? sc[r] : rc[r];
  if (self) memmove((char *)recv + rd[r] * esz, (const char *)send + sd[r] * esz, self * esz);
  // Posted messages complete even when a later post failed: a request left
  // behind would write into the caller's buffer after the call returned.
  int werr = nreq ? MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
  if (err == MPI_SUCCESS && werr != MPI_SUCCESS) err = werr, what = "MPI_Waitall";
  for (int i = 0; i < nreq; i++) tpr__mpi_span_free(&spans[i]);
  if (req != stack_req) free(req);
  if (spans != stack_spans) free(spans);
  if (st != TPR_OK) return st;
  if (err != MPI_SUCCESS) return tpr__mpi_fail(err, what);
  if (sc[r] != rc[r])
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "all_to_allv: rank %d sends itself %zu elements but expects %zu", r, sc[r],
                    rc[r]);
  return TPR_OK;
}

static tpr_status mpi_broadcast(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, int root) {
  mpi_ctx *c = ctx;
  if (!count) return TPR_OK;
  if (c->rank == root && send != recv) memmove(recv, send, count * tpr_dtype_size(dt));
  span s;
  TPR_CHECK(tpr__mpi_span_make(count, dt, &s));
  int err = MPI_Bcast(recv, s.n, s.t, root, c->comm);
  tpr__mpi_span_free(&s);
  return err == MPI_SUCCESS ? TPR_OK : tpr__mpi_fail(err, "MPI_Bcast");
}

static tpr_status mpi_barrier(void *ctx) {
  MPI_TRY(MPI_Barrier(((mpi_ctx *)ctx)->comm), "MPI_Barrier");
  return TPR_OK;
}

// Point to point sends empty messages too, so that a send is always matched
// by a recv as the header promises.
static char p2p_dummy;

static tpr_status mpi_send(void *ctx, const void *buf, size_t count, tpr_dtype dt, int peer) {
  span s;
  TPR_CHECK(tpr__mpi_span_make(count, dt, &s));
  int err = MPI_Send(buf ? buf : &p2p_dummy, s.n, s.t, peer, TAG_P2P, ((mpi_ctx *)ctx)->comm);
  tpr__mpi_span_free(&s);
  return err == MPI_SUCCESS ? TPR_OK : tpr__mpi_fail(err, "MPI_Send");
}

static tpr_status mpi_recv(void *ctx, void *buf, size_t count, tpr_dtype dt, int peer) {
  span s;
  TPR_CHECK(tpr__mpi_span_make(count, dt, &s));
  int err = MPI_Recv(buf ? buf : &p2p_dummy, s.n, s.t, peer, TAG_P2P, ((mpi_ctx *)ctx)->comm, MPI_STATUS_IGNORE);
  tpr__mpi_span_free(&s);
  return err == MPI_SUCCESS ? TPR_OK : tpr__mpi_fail(err, "MPI_Recv");
}

// --- communicators ------------------------------------------------------

static const tpr_comm_vtable mpi_host_vtable;  // entries over host buffers only

static bool mpi_reads_device_memory(void) {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

// Takes ownership of comm (freed on failure).
static tpr_status ctx_new(MPI_Comm comm, mpi_ctx **out) {
  *out = NULL;
  mpi_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    MPI_Comm_free(&comm);
    return TPR_FAIL(TPR_ERR_OOM, "mpi communicator");
  }
  c->comm = comm;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &c->rank);
  MPI_Comm_size(comm, &c->size);
  tpr__stage_init(&c->stage, &mpi_host_vtable, mpi_reads_device_memory(), c->rank, c->size);
  *out = c;
  return TPR_OK;
}

static void mpi_destroy(void *ctx) {
  mpi_ctx *c = ctx;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&c->comm);
  tpr__stage_release(&c->stage);
  free(c->scratch);
  free(c);
}

static tpr_status mpi_split(void *ctx, int color, int key, void **out_ctx, int *rank, int *size) {
  mpi_ctx *c = ctx;
  *out_ctx = NULL, *rank = -1, *size = 0;
  MPI_Comm sub;
  MPI_TRY(MPI_Comm_split(c->comm, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
  if (sub == MPI_COMM_NULL) return TPR_OK;
  mpi_ctx *s;
  TPR_CHECK(ctx_new(sub, &s));
  *out_ctx = s, *rank = s->rank, *size = s->size;
  return TPR_OK;
}

static const tpr_comm_vtable mpi_host_vtable = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_to_all = mpi_all_to_all,
    .all_to_allv = mpi_all_to_allv,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .send = mpi_send,
    .recv = mpi_recv,
    .split = mpi_split,
    .destroy = mpi_destroy,
};

// What the front calls: buffer entries check for device memory first.
static const tpr_comm_vtable mpi_vtable = {
    .name = "mpi",
    .all_reduce = tpr__stage_all_reduce,
    .all_gather = tpr__stage_all_gather,
    .reduce_scatter = tpr__stage_reduce_scatter,
    .all_to_all = tpr__stage_all_to_all,
    .all_to_allv = tpr__stage_all_to_allv,
    .broadcast = tpr__stage_broadcast,
    .barrier = mpi_barrier,
    .send = tpr__stage_send,
    .recv = tpr__stage_recv,
    .iall_gather = tpr__mpi_iall_gather,
    .ibroadcast = tpr__mpi_ibroadcast,
    .ireduce_scatter = tpr__mpi_ireduce_scatter,
    .test = tpr__mpi_test,
    .wait = tpr__mpi_wait,
    .split = mpi_split,
    .destroy = mpi_destroy,
};

tpr_status tpr_comm_mpi_init(int *argc, char ***argv) {
  int inited = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&inited);
  if (!inited) MPI_TRY(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  else MPI_Query_thread(&provided);
  thread_level = provided;
  if (provided < MPI_THREAD_MULTIPLE)
    TPR_LOG_INF("MPI grants thread level %d, not MPI_THREAD_MULTIPLE: the watchdog cannot ask other ranks "
                "while a collective runs", provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return TPR_OK;
}

int tpr__comm_mpi_thread_level(void) {
  if (thread_level >= 0) return thread_level;
  int inited = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return thread_level = provided;
}

tpr_status tpr_comm_mpi_finalize(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_TRY(MPI_Finalize(), "MPI_Finalize");
  return TPR_OK;
}

tpr_status tpr_comm_init_mpi_world(tpr_comm_t *out) {
  *out = NULL;
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized)
    return TPR_FAIL(TPR_ERR_COMM, "MPI is not initialised (call tpr_comm_mpi_init first) or already finalised");
  MPI_Comm dup;
  MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  mpi_ctx *c;
  TPR_CHECK(ctx_new(dup, &c));
  return tpr__comm_new(&mpi_vtable, c, c->rank, c->size, NULL, "world", NULL, out);  // destroys c on failure
}

MPI_Comm tpr__comm_mpi_handle(tpr_comm_t c) {
  if (!c || strcmp(tpr_comm_backend(c), "mpi") != 0) return MPI_COMM_NULL;
  return ((mpi_ctx *)tpr__comm_ctx(c))->comm;
}
