// tpr_comm: the collective layer, NCCL-shaped.
//
// A communicator is a group of ranks with a backend behind a vtable:
//   self  a world of one, no MPI needed (tpr runs without mpirun);
//   mpi   host buffers over an MPI communicator (device buffers are staged
//         through pinned host memory when MPI is not CUDA-aware);
//   nccl  device buffers, one GPU per rank, ncclUniqueId bootstrapped over MPI.
//
// Conventions (as nccl.h): counts are in elements of `dtype`; "per rank"
// counts are what one rank contributes or receives. Every call returns a
// tpr_status and is complete when it returns (the nccl backend synchronises
// its stream), so host code may read `recv` at once. Every rank of the group
// must make the same sequence of calls with the same count, dtype, op and
// root; TPR_COMM_CHECK=1 (or tpr_comm_set_check) verifies that before each
// collective and fails every rank with a message instead of corrupting data
// or hanging. A watchdog (tpr_comm_watchdog_start) aborts the job when a
// collective does not finish in time, naming the op, the group and the ranks
// that had and had not arrived.
#ifndef TPR_COMM_H
#define TPR_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/program/tpr_runtime.h"

typedef enum tpr_red_op { TPR_SUM = 0, TPR_MAX = 1, TPR_MIN = 2 } tpr_red_op;

typedef struct tpr_comm_s *tpr_comm_t;
// An outstanding nonblocking collective (tpr_comm_iall_gather, ...).
typedef struct tpr_comm_request_s *tpr_comm_request;

// What a backend implements. The front (comm.c) has already checked the
// arguments, so entries see valid dtypes, non-NULL buffers for count > 0 and
// roots/peers in range. Entries may be NULL: the call is then
// TPR_ERR_UNSUPPORTED naming the backend.
typedef struct tpr_comm_vtable {
  const char *name;
  tpr_status (*all_reduce)(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, tpr_red_op op);
  tpr_status (*all_gather)(void *ctx, const void *send, void *recv, size_t send_count, tpr_dtype dt);
  tpr_status (*reduce_scatter)(void *ctx, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                               tpr_red_op op);
  tpr_status (*all_to_all)(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt);
  tpr_status (*all_to_allv)(void *ctx, const void *send, const size_t *send_counts, const size_t *send_displs,
                            void *recv, const size_t *recv_counts, const size_t *recv_displs, tpr_dtype dt);
  tpr_status (*broadcast)(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, int root);
  tpr_status (*barrier)(void *ctx);
  tpr_status (*send)(void *ctx, const void *buf, size_t count, tpr_dtype dt, int peer);
  tpr_status (*recv)(void *ctx, void *buf, size_t count, tpr_dtype dt, int peer);
  // Nonblocking forms: start the collective and hand back the backend's
  // request in *req, or NULL when it is already complete (self, zero
  // counts). test sets *done once complete (the request stays the
  // backend's); wait blocks until complete and frees the request, also
  // when it fails. A backend that never returns a request needs no test
  // or wait.
  tpr_status (*iall_gather)(void *ctx, const void *send, void *recv, size_t send_count, tpr_dtype dt, void **req);
  tpr_status (*ireduce_scatter)(void *ctx, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                                tpr_red_op op, void **req);
  tpr_status (*ibroadcast)(void *ctx, void *buf, size_t count, tpr_dtype dt, int root, void **req);
  tpr_status (*test)(void *ctx, void *req, bool *done);
  tpr_status (*wait)(void *ctx, void *req);
  // Collective over the parent: ranks with the same color form a new group,
  // ordered by (key, parent rank). color < 0: this rank joins no group and
  // gets *out_ctx = NULL.
  tpr_status (*split)(void *ctx, int color, int key, void **out_ctx, int *rank, int *size);
  void (*destroy)(void *ctx);
} tpr_comm_vtable;

// --- creating communicators ---------------------------------------------

// A world of one: every collective is a copy (or nothing, in place).
tpr_status tpr_comm_init_self(tpr_comm_t *out);
// MPI_Init_thread (if needed; MPI_THREAD_MULTIPLE so the watchdog can talk
// while the main thread waits in a collective) with MPI errors returned, not
// fatal. Safe without mpirun (Open MPI then runs as a singleton world).
tpr_status tpr_comm_mpi_init(int *argc, char ***argv);
tpr_status tpr_comm_mpi_finalize(void);
// A communicator over a duplicate of MPI_COMM_WORLD (MPI initialised first).
tpr_status tpr_comm_init_mpi_world(tpr_comm_t *out);
// NCCL over the ranks of `mpi_world` (an mpi communicator of the world):
// rank 0's ncclUniqueId is broadcast over MPI, each rank uses CUDA device
// `device` (< 0: the node-local rank). No NCCL in this build, or no CUDA
// device -> TPR_ERR_UNSUPPORTED with a message saying which.
tpr_status tpr_comm_init_nccl(tpr_comm_t mpi_world, int device, tpr_comm_t *out);
// True when this build has the nccl backend compiled in.
bool tpr_comm_nccl_built(void);

// A sub-communicator: ranks of `parent` with the same color form a group,
// ordered by (key, parent rank); collective over `parent`. `name` ("tp",
// "ep", ...) labels the group in watchdog and check-mode messages.
// color < 0: this rank joins no group and *out = NULL.
tpr_status tpr_comm_split(tpr_comm_t parent, int color, int key, const char *name, tpr_comm_t *out);

void tpr_comm_free(tpr_comm_t c);

int tpr_comm_rank(tpr_comm_t c);
int tpr_comm_size(tpr_comm_t c);
const char *tpr_comm_backend(tpr_comm_t c);  // "self", "mpi", "nccl"
const char *tpr_comm_name(tpr_comm_t c);     // "world", "tp", ...
// World rank of this group's rank r (0 <= r < size); -1 if out of range.
int tpr_comm_world_rank(tpr_comm_t c, int r);
// Turns the agreement check on or off for this communicator (initially on
// when the environment has TPR_COMM_CHECK=1).
void tpr_comm_set_check(tpr_comm_t c, bool on);

// --- collectives --------------------------------------------------------
// n = tpr_comm_size(c), r = tpr_comm_rank(c). Reductions support f32, bf16,
// f16 (bf16/f16 accumulate in f32 and round once), i32 and i64 with SUM, MAX
// and MIN. Data movement (gather, all_to_all, broadcast, send/recv) takes any
// dtype. Buffers are device memory for nccl, host or device memory for mpi.

// recv[i] = op over ranks of send[i], i < count. In place when send == recv.
tpr_status tpr_comm_all_reduce(tpr_comm_t c, const void *send, void *recv, size_t count, tpr_dtype dt,
                               tpr_red_op op);
// recv (n * send_count) = every rank's send (send_count), concatenated in rank
// order. In place when send == recv + r * send_count.
tpr_status tpr_comm_all_gather(tpr_comm_t c, const void *send, void *recv, size_t send_count, tpr_dtype dt);
// send (n * recv_count) is reduced over ranks; rank r receives block r:
// recv[i] = op over ranks of send[r * recv_count + i]. In place when
// recv == send + r * recv_count.
tpr_status tpr_comm_reduce_scatter(tpr_comm_t c, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                                   tpr_red_op op);
// send and recv (n * count): block j of send goes to rank j, where it lands
// as block r of recv. Out of place only (send and recv must not overlap).
tpr_status tpr_comm_all_to_all(tpr_comm_t c, const void *send, void *recv, size_t count, tpr_dtype dt);
// Per-peer counts and displacements (elements, n entries each): send_counts[j]
// elements from send + send_displs[j] go to rank j and land at
// recv + recv_displs[r] there; recv_counts[j] must equal what rank j sends
// here (checked in check mode). Out of place only. Counts may be zero.
tpr_status tpr_comm_all_to_allv(tpr_comm_t c, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs, tpr_dtype dt);
// recv (count) on every rank = root's send (count). send is read on root
// only (may be NULL elsewhere). In place when send == recv.
tpr_status tpr_comm_broadcast(tpr_comm_t c, const void *send, void *recv, size_t count, tpr_dtype dt, int root);
tpr_status tpr_comm_barrier(tpr_comm_t c);
// Point to point: count elements to / from group rank `peer` (peer != r).
// Blocking; a send is matched by the peer's recv in call order.
tpr_status tpr_comm_send(tpr_comm_t c, const void *buf, size_t count, tpr_dtype dt, int peer);
tpr_status tpr_comm_recv(tpr_comm_t c, void *buf, size_t count, tpr_dtype dt, int peer);

// --- nonblocking collectives ---------------------------------------------
// For overlapping communication with compute (FSDP gathers the next layer's
// weights while this one computes). Same arguments, in-place rules and
// checks as the blocking calls; a start returns at once with *req set (NULL
// when the call fails). Until the request completes the buffers belong to
// the collective: send must not be written, recv not read. Several requests
// may be outstanding on one or several communicators and may complete in
// any order, but every rank must start them in the same order per
// communicator (as MPI requires; check mode verifies op, count and dtype at
// the start, and a nonblocking call does not match a blocking one).
// Backends: self (done at start), mpi (host buffers: MPI_Iallgather /
// MPI_Ireduce_scatter_block; device buffers need a CUDA-aware MPI), nccl
// (enqueued on the communicator's stream; test/wait poll its event). Others
// are TPR_ERR_UNSUPPORTED naming the backend. The communicator must outlive
// its requests.
tpr_status tpr_comm_iall_gather(tpr_comm_t c, const void *send, void *recv, size_t send_count, tpr_dtype dt,
                                tpr_comm_request *req);
tpr_status tpr_comm_ireduce_scatter(tpr_comm_t c, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                                    tpr_red_op op, tpr_comm_request *req);
// In place: root's buf goes to every rank's buf. Lets a rank wait for the
// root without spinning (tpr_comm_test with a sleep between tests): a
// server's ranks idle this way between requests. Not watched while only
// tested, so an idle wait of any length is not taken for a hang.
tpr_status tpr_comm_ibroadcast(tpr_comm_t c, void *buf, size_t count, tpr_dtype dt, int root, tpr_comm_request *req);
// Drives progress (MPI has no progress thread: call this between compute
// pieces); *done = true once complete. The request stays valid until waited.
// NULL is complete.
tpr_status tpr_comm_test(tpr_comm_request r, bool *done);
// Blocks until complete and frees the request (NULL is a no-op), also when
// it fails. Watched like a blocking collective: a rank that never starts
// the matching call is reported and the job aborted. Errors name the op and
// the group.
tpr_status tpr_comm_wait(tpr_comm_request r);

// --- programs -----------------------------------------------------------
// Hashes p (tpr_program_hash, into *hash) and all-gathers the hashes over c
// (host buffers): a rank whose program differs from rank 0's is
// TPR_ERR_INTERNAL on every rank, naming the ranks (docs/architecture.md section 1).
tpr_status tpr_comm_check_program(tpr_comm_t c, const tpr_program *p, uint64_t *hash);

// --- the watchdog -------------------------------------------------------
// Starts one watchdog thread per process, over the MPI world (a world of one,
// or a build without MPI launch, needs none: then a no-op). When a collective
// on any communicator has not returned after timeout_s seconds, it asks every
// rank where it is, prints "op #seq on group: arrived ..., missing ..." to
// stderr and aborts the whole job (MPI_Abort, exit code 124).
#define TPR_COMM_DEFAULT_TIMEOUT_S 300.0
tpr_status tpr_comm_watchdog_start(double timeout_s);
void tpr_comm_watchdog_stop(void);

// --- internals for backends ---------------------------------------------
// Wraps a backend context (taking ownership). world_ranks (size entries, the
// members' ranks in the world, copied) may be NULL for a world communicator.
// host: a communicator over the same ranks that takes host buffers, used by
// the front for check-mode agreement and split bookkeeping; NULL when this
// communicator takes host buffers itself (self, mpi). The new comm owns it.
tpr_status tpr__comm_new(const tpr_comm_vtable *vt, void *ctx, int rank, int size, const int *world_ranks,
                         const char *name, tpr_comm_t host, tpr_comm_t *out);
// The backend context behind c (nccl bootstraps over mpi's).
void *tpr__comm_ctx(tpr_comm_t c);

// Agrees on a phase's outcome, collectively over c: every rank returns an
// error when any rank's rc was one (its own message, or one saying another
// rank failed), so a rank that fails alone never leaves the others waiting
// in the next collective.
tpr_status tpr_comm_agree(tpr_comm_t c, tpr_status rc);

#endif
