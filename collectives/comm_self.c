// The `self` backend: a world of one. Collectives reduce over one rank, so
// they are copies (or nothing, in place); tpr runs without mpirun through it.
// Point to point cannot happen (the only peer would be this rank, which the
// front rejects), so send/recv stay NULL.
#include <string.h>

#include "tpr_comm.h"

// The context carries nothing, but must not be NULL: a split hands back a
// NULL context for "joins no group".
static char self_ctx;

static tpr_status self_copy(const void *send, void *recv, size_t count, tpr_dtype dt) {
  if (count && send != recv) memmove(recv, send, count * tpr_dtype_size(dt));
  return TPR_OK;
}

static tpr_status self_all_reduce(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                  tpr_red_op op) {
  return self_copy(send, recv, count, dt);
}

static tpr_status self_all_gather(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt) {
  return self_copy(send, recv, count, dt);
}

static tpr_status self_reduce_scatter(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                      tpr_red_op op) {
  return self_copy(send, recv, count, dt);
}

// Nonblocking: the copy happens at the start, so the request is complete.
static tpr_status self_iall_gather(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, void **req) {
  *req = NULL;
  return self_copy(send, recv, count, dt);
}

static tpr_status self_ibroadcast(void *ctx, void *buf, size_t count, tpr_dtype dt, int root, void **req) {
  *req = NULL;  // root is 0, this rank: buf already holds the data
  return TPR_OK;
}

static tpr_status self_ireduce_scatter(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                       tpr_red_op op, void **req) {
  *req = NULL;
  return self_copy(send, recv, count, dt);
}

static tpr_status self_all_to_all(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt) {
  return self_copy(send, recv, count, dt);
}

// n = 1: block 0 goes from send + send_displs[0] to recv + recv_displs[0].
// recv_counts[0] must equal send_counts[0] (what this rank sends itself).
static tpr_status self_all_to_allv(void *ctx, const void *send, const size_t *send_counts, const size_t *send_displs,
                                   void *recv, const size_t *recv_counts, const size_t *recv_displs, tpr_dtype dt) {
  if (send_counts[0] != recv_counts[0])
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "all_to_allv: rank 0 sends itself %zu elements but expects %zu",
                    send_counts[0], recv_counts[0]);
  if (!send_counts[0]) return TPR_OK;  // buffers may be NULL
  size_t esz = tpr_dtype_size(dt);
  return self_copy((const char *)send + send_displs[0] * esz, (char *)recv + recv_displs[0] * esz, send_counts[0], dt);
}

static tpr_status self_broadcast(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, int root) {
  return self_copy(send, recv, count, dt);  // root is 0, this rank
}

static tpr_status self_barrier(void *ctx) { return TPR_OK; }

static tpr_status self_split(void *ctx, int color, int key, void **out_ctx, int *rank, int *size) {
  *out_ctx = color < 0 ? NULL : &self_ctx;
  *rank = color < 0 ? -1 : 0;
  *size = color < 0 ? 0 : 1;
  return TPR_OK;
}

static const tpr_comm_vtable self_vtable = {
    .name = "self",
    .all_reduce = self_all_reduce,
    .all_gather = self_all_gather,
    .reduce_scatter = self_reduce_scatter,
    .all_to_all = self_all_to_all,
    .all_to_allv = self_all_to_allv,
    .broadcast = self_broadcast,
    .barrier = self_barrier,
    .send = NULL,
    .recv = NULL,
    .iall_gather = self_iall_gather,
    .ibroadcast = self_ibroadcast,
    .ireduce_scatter = self_ireduce_scatter,
    .split = self_split,
    .destroy = NULL,
};

tpr_status tpr_comm_init_self(tpr_comm_t *out) {
  return tpr__comm_new(&self_vtable, &self_ctx, 0, 1, NULL, "world", NULL, out);
}
