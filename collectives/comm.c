// Backend-independent front of tpr_comm: argument checks, the agreement
// check (TPR_COMM_CHECK=1), the watchdog's bookkeeping, then the vtable.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

static const char *const op_names[TPR__OP_COUNT] = {
    [TPR__OP_NONE] = "nothing",         [TPR__OP_ALL_REDUCE] = "all_reduce",
    [TPR__OP_ALL_GATHER] = "all_gather", [TPR__OP_REDUCE_SCATTER] = "reduce_scatter",
    [TPR__OP_ALL_TO_ALL] = "all_to_all", [TPR__OP_ALL_TO_ALLV] = "all_to_allv",
    [TPR__OP_BROADCAST] = "broadcast",   [TPR__OP_BARRIER] = "barrier",
    [TPR__OP_SEND] = "send",             [TPR__OP_RECV] = "recv",
    [TPR__OP_SPLIT] = "split",          [TPR__OP_IALL_GATHER] = "iall_gather", [TPR__OP_IBROADCAST] = "ibroadcast",
    [TPR__OP_IREDUCE_SCATTER] = "ireduce_scatter",
};

const char *tpr__coll_op_name(tpr__coll_op op) {
  return (unsigned)op < TPR__OP_COUNT ? op_names[op] : "unknown-op";
}

static bool env_check_mode(void) {
  const char *v = getenv("TPR_COMM_CHECK");
  return v && *v && strcmp(v, "0") != 0;
}

tpr_status tpr__comm_new(const tpr_comm_vtable *vt, void *ctx, int rank, int size, const int *world_ranks,
                         const char *name, tpr_comm_t host, tpr_comm_t *out) {
  *out = NULL;
  struct tpr_comm_s *c = calloc(1, sizeof *c);
  int *wr = malloc((size_t)(size > 0 ? size : 1) * sizeof *wr);
  if (!c || !wr) {
    free(c);
    free(wr);
    if (vt->destroy) vt->destroy(ctx);
    tpr_comm_free(host);
    return TPR_FAIL(TPR_ERR_OOM, "communicator");
  }
  for (int i = 0; i < size; i++) wr[i] = world_ranks ? world_ranks[i] : i;
  *c = (struct tpr_comm_s){.vt = vt, .ctx = ctx, .rank = rank, .size = size, .world_ranks = wr,
                           .host = host, .check = env_check_mode()};
  snprintf(c->name, sizeof c->name, "%s", name ? name : "group");
  *out = c;
  return TPR_OK;
}

void *tpr__comm_ctx(tpr_comm_t c) { return c ? c->ctx : NULL; }

void tpr_comm_free(tpr_comm_t c) {
  if (!c) return;
  if (c->vt->destroy) c->vt->destroy(c->ctx);
  tpr_comm_free(c->host);
  free(c->world_ranks);
  free(c);
}

int tpr_comm_rank(tpr_comm_t c) { return c->rank; }
int tpr_comm_size(tpr_comm_t c) { return c->size; }
const char *tpr_comm_backend(tpr_comm_t c) { return c->vt->name; }
const char *tpr_comm_name(tpr_comm_t c) { return c->name; }
int tpr_comm_world_rank(tpr_comm_t c, int r) { return r >= 0 && r < c->size ? c->world_ranks[r] : -1; }
void tpr_comm_set_check(tpr_comm_t c, bool on) { c->check = on; }

const char *tpr__comm_describe(tpr_comm_t c, char *buf, size_t cap) {
  size_t used = (size_t)snprintf(buf, cap, "%s (world ranks ", c->name);
  for (int i = 0; i < c->size && used + 16 < cap; i++) {
    if (i == 8 && c->size > 10) {
      used += (size_t)snprintf(buf + used, cap - used, ",...,%d", c->world_ranks[c->size - 1]);
      break;
    }
    used += (size_t)snprintf(buf + used, cap - used, "%s%d", i ? "," : "", c->world_ranks[i]);
  }
  if (used + 2 < cap) snprintf(buf + used, cap - used, ")");
  return buf;
}

// --- argument checks ----------------------------------------------------

static tpr_status check_dtype(const char *op, tpr_dtype dt) {
  if (!tpr_dtype_valid(dt)) return TPR_FAIL(TPR_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
  return TPR_OK;
}

static tpr_status check_reduction(const char *op, tpr_dtype dt, tpr_red_op red) {
  TPR_CHECK(check_dtype(op, dt));
  if (dt == TPR_F8E4M3 || dt == TPR_U8)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s: %s is not reducible (use f32, bf16, f16, i32 or i64)", op,
                    tpr_dtype_name(dt));
  if ((unsigned)red > TPR_MIN) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: unknown reduction op %d", op, (int)red);
  return TPR_OK;
}

static tpr_status check_buffers(const char *op, const void *send, const void *recv, size_t count) {
  if (count && (!send || !recv)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: NULL buffer with count %zu", op, count);
  return TPR_OK;
}

static tpr_status check_comm(const char *op, tpr_comm_t c) {
  if (!c) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: NULL communicator", op);
  return TPR_OK;
}

static tpr_status unsupported(tpr_comm_t c, tpr__coll_op op) {
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "comm %s: the %s backend has no %s", c->name, c->vt->name,
                  tpr__coll_op_name(op));
}

// --- the call path: agree (check mode), watch, run ----------------------

// Runs `expr` (a backend call) as collective `op` on c.
#define RUN_COLLECTIVE(c, op_, count_, dt_, red_, root_, scounts, rcounts, expr)                          \
  do {                                                                                                   \
    tpr__call call_ = {.op = (op_), .seq = ++(c)->seq, .count = (count_), .dtype = (dt_), .red_op = (red_), \
                       .root = (root_)};                                                                 \
    tpr__watch_enter((c), call_.op, call_.seq, call_.count, call_.dtype, call_.root);                   \
    tpr_status rc_ = (c)->check && (c)->size > 1 ? tpr__comm_agree((c), &call_, (scounts), (rcounts)) : TPR_OK; \
    if (rc_ == TPR_OK) rc_ = (expr);                                                                     \
    tpr__watch_leave();                                                                                  \
    return rc_;                                                                                          \
  } while (0)

tpr_status tpr_comm_all_reduce(tpr_comm_t c, const void *send, void *recv, size_t count, tpr_dtype dt,
                               tpr_red_op op) {
  TPR_CHECK(check_comm("all_reduce", c));
  TPR_CHECK(check_reduction("all_reduce", dt, op));
  TPR_CHECK(check_buffers("all_reduce", send, recv, count));
  if (!c->vt->all_reduce) return unsupported(c, TPR__OP_ALL_REDUCE);
  RUN_COLLECTIVE(c, TPR__OP_ALL_REDUCE, count, dt, op, -1, NULL, NULL,
                 c->vt->all_reduce(c->ctx, send, recv, count, dt, op));
}

tpr_status tpr_comm_all_gather(tpr_comm_t c, const void *send, void *recv, size_t send_count, tpr_dtype dt) {
  TPR_CHECK(check_comm("all_gather", c));
  TPR_CHECK(check_dtype("all_gather", dt));
  TPR_CHECK(check_buffers("all_gather", send, recv, send_count));
  if (!c->vt->all_gather) return unsupported(c, TPR__OP_ALL_GATHER);
  RUN_COLLECTIVE(c, TPR__OP_ALL_GATHER, send_count, dt, -1, -1, NULL, NULL,
                 c->vt->all_gather(c->ctx, send, recv, send_count, dt));
}

tpr_status tpr_comm_reduce_scatter(tpr_comm_t c, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                                   tpr_red_op op) {
  TPR_CHECK(check_comm("reduce_scatter", c));
  TPR_CHECK(check_reduction("reduce_scatter", dt, op));
  TPR_CHECK(check_buffers("reduce_scatter", send, recv, recv_count));
  if (!c->vt->reduce_scatter) return unsupported(c, TPR__OP_REDUCE_SCATTER);
  RUN_COLLECTIVE(c, TPR__OP_REDUCE_SCATTER, recv_count, dt, op, -1, NULL, NULL,
                 c->vt->reduce_scatter(c->ctx, send, recv, recv_count, dt, op));
}

static bool overlaps(const void *a, const void *b, size_t bytes) {
  const char *x = a, *y = b;
  return bytes && x < y + bytes && y < x + bytes;
}

tpr_status tpr_comm_all_to_all(tpr_comm_t c, const void *send, void *recv, size_t count, tpr_dtype dt) {
  TPR_CHECK(check_comm("all_to_all", c));
  TPR_CHECK(check_dtype("all_to_all", dt));
  TPR_CHECK(check_buffers("all_to_all", send, recv, count));
  if (overlaps(send, recv, count * (size_t)c->size * tpr_dtype_size(dt)))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "all_to_all: send and recv overlap (out of place only)");
  if (!c->vt->all_to_all) return unsupported(c, TPR__OP_ALL_TO_ALL);
  RUN_COLLECTIVE(c, TPR__OP_ALL_TO_ALL, count, dt, -1, -1, NULL, NULL,
                 c->vt->all_to_all(c->ctx, send, recv, count, dt));
}

// Per-peer arrays: present, and every (count, displ) inside a buffer that is
// non-NULL when anything moves. Returns the total count in *total.
static tpr_status check_v(const char *which, int n, const void *buf, const size_t *counts, const size_t *displs,
                          size_t *extent) {
  if (!counts || !displs) return TPR_FAIL(TPR_ERR_INVALID_ARG, "all_to_allv: NULL %s counts or displacements", which);
  *extent = 0;
  for (int j = 0; j < n; j++) {
    if (counts[j] && !buf)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "all_to_allv: NULL %s buffer with %s_counts[%d] = %zu", which, which, j,
                      counts[j]);
    if (counts[j] && displs[j] + counts[j] > *extent) *extent = displs[j] + counts[j];
  }
  return TPR_OK;
}

tpr_status tpr_comm_all_to_allv(tpr_comm_t c, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs, tpr_dtype dt) {
  TPR_CHECK(check_comm("all_to_allv", c));
  TPR_CHECK(check_dtype("all_to_allv", dt));
  size_t send_extent, recv_extent, esz = tpr_dtype_size(dt);
  TPR_CHECK(check_v("send", c->size, send, send_counts, send_displs, &send_extent));
  TPR_CHECK(check_v("recv", c->size, recv, recv_counts, recv_displs, &recv_extent));
  if (send_extent && recv_extent) {
    const char *s = send, *r = recv;
    if (s < r + recv_extent * esz && r < s + send_extent * esz)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "all_to_allv: send and recv overlap (out of place only)");
  }
  if (!c->vt->all_to_allv) return unsupported(c, TPR__OP_ALL_TO_ALLV);
  RUN_COLLECTIVE(c, TPR__OP_ALL_TO_ALLV, send_extent, dt, -1, -1, send_counts, recv_counts,
                 c->vt->all_to_allv(c->ctx, send, send_counts, send_displs, recv, recv_counts, recv_displs, dt));
}

tpr_status tpr_comm_broadcast(tpr_comm_t c, const void *send, void *recv, size_t count, tpr_dtype dt, int root) {
  TPR_CHECK(check_comm("broadcast", c));
  TPR_CHECK(check_dtype("broadcast", dt));
  if (root < 0 || root >= c->size)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "broadcast: root %d outside the group of %d", root, c->size);
  TPR_CHECK(check_buffers("broadcast", c->rank == root ? send : recv, recv, count));
  if (!c->vt->broadcast) return unsupported(c, TPR__OP_BROADCAST);
  RUN_COLLECTIVE(c, TPR__OP_BROADCAST, count, dt, -1, root, NULL, NULL,
                 c->vt->broadcast(c->ctx, send, recv, count, dt, root));
}

tpr_status tpr_comm_barrier(tpr_comm_t c) {
  TPR_CHECK(check_comm("barrier", c));
  if (!c->vt->barrier) {
    if (c->size == 1) return TPR_OK;
    return unsupported(c, TPR__OP_BARRIER);
  }
  RUN_COLLECTIVE(c, TPR__OP_BARRIER, 0, TPR_U8, -1, -1, NULL, NULL, c->vt->barrier(c->ctx));
}

static tpr_status check_peer(const char *op, tpr_comm_t c, int peer) {
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: peer %d is not another rank of the group of %d (this is rank %d)", op,
                    peer, c->size, c->rank);
  return TPR_OK;
}

// Point to point: watched (a missing peer hangs as surely as a collective),
// not agreed (only two ranks take part). send's buffer is const to callers;
// one path serves both directions.
static tpr_status point_to_point(tpr_comm_t c, tpr__coll_op op, void *buf, size_t count, tpr_dtype dt, int peer) {
  const char *name = op_names[op];
  TPR_CHECK(check_comm(name, c));
  TPR_CHECK(check_dtype(name, dt));
  TPR_CHECK(check_peer(name, c, peer));
  TPR_CHECK(check_buffers(name, buf, buf, count));
  bool send = op == TPR__OP_SEND;
  if (send ? !c->vt->send : !c->vt->recv) return unsupported(c, op);
  tpr__watch_enter(c, op, 0, count, dt, peer);
  tpr_status rc = send ? c->vt->send(c->ctx, buf, count, dt, peer) : c->vt->recv(c->ctx, buf, count, dt, peer);
  tpr__watch_leave();
  return rc;
}

tpr_status tpr_comm_send(tpr_comm_t c, const void *buf, size_t count, tpr_dtype dt, int peer) {
  return point_to_point(c, TPR__OP_SEND, (void *)buf, count, dt, peer);
}

tpr_status tpr_comm_recv(tpr_comm_t c, void *buf, size_t count, tpr_dtype dt, int peer) {
  return point_to_point(c, TPR__OP_RECV, buf, count, dt, peer);
}

// --- nonblocking collectives -------------------------------------------

struct tpr_comm_request_s {
  tpr_comm_t c;
  tpr__coll_op op;
  uint64_t seq;
  size_t count;
  tpr_dtype dt;
  void *impl;  // the backend's request; NULL once complete
};

// Check mode and the sequence number as a blocking call; the start itself
// is not watched (it returns at once), the wait is.
static tpr_status start_request(tpr_comm_t c, tpr__coll_op op, size_t count, tpr_dtype dt, int red, int root,
                                tpr_comm_request *r) {
  tpr__call call = {.op = op, .seq = ++c->seq, .count = count, .dtype = dt, .red_op = red, .root = root};
  if (c->check && c->size > 1) {
    tpr__watch_enter(c, op, call.seq, count, dt, -1);
    tpr_status rc = tpr__comm_agree(c, &call, NULL, NULL);
    tpr__watch_leave();
    TPR_CHECK(rc);
  }
  *r = calloc(1, sizeof **r);
  if (!*r) return TPR_FAIL(TPR_ERR_OOM, "%s on group %s: request", tpr__coll_op_name(op), c->name);
  **r = (struct tpr_comm_request_s){.c = c, .op = op, .seq = call.seq, .count = count, .dt = dt};
  return TPR_OK;
}

// A backend failure, with the op, its sequence number and the group.
static tpr_status request_fail(tpr_comm_request r, tpr_status rc) {
  char group[160];
  return TPR_FAIL(rc, "%s #%llu on group %s: %s", tpr__coll_op_name(r->op), (unsigned long long)r->seq,
                  tpr__comm_describe(r->c, group, sizeof group), tpr_last_error());
}

static tpr_status check_request_out(const char *op, tpr_comm_t c, tpr_comm_request *req) {
  if (!req) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: NULL request pointer", op);
  *req = NULL;
  return check_comm(op, c);
}

// The end of a nonblocking start: the request on success, else the error
// (the request freed).
static tpr_status started(tpr_comm_request r, tpr_status rc, tpr_comm_request *req) {
  if (rc != TPR_OK) {
    rc = request_fail(r, rc);
    free(r);
    return rc;
  }
  *req = r;
  return TPR_OK;
}

tpr_status tpr_comm_iall_gather(tpr_comm_t c, const void *send, void *recv, size_t send_count, tpr_dtype dt,
                                tpr_comm_request *req) {
  TPR_CHECK(check_request_out("iall_gather", c, req));
  TPR_CHECK(check_dtype("iall_gather", dt));
  TPR_CHECK(check_buffers("iall_gather", send, recv, send_count));
  if (!c->vt->iall_gather) return unsupported(c, TPR__OP_IALL_GATHER);
  tpr_comm_request r;
  TPR_CHECK(start_request(c, TPR__OP_IALL_GATHER, send_count, dt, -1, -1, &r));
  tpr_status rc = c->vt->iall_gather(c->ctx, send, recv, send_count, dt, &r->impl);
  return started(r, rc, req);
}

tpr_status tpr_comm_ireduce_scatter(tpr_comm_t c, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                                    tpr_red_op op, tpr_comm_request *req) {
  TPR_CHECK(check_request_out("ireduce_scatter", c, req));
  TPR_CHECK(check_reduction("ireduce_scatter", dt, op));
  TPR_CHECK(check_buffers("ireduce_scatter", send, recv, recv_count));
  if (!c->vt->ireduce_scatter) return unsupported(c, TPR__OP_IREDUCE_SCATTER);
  tpr_comm_request r;
  TPR_CHECK(start_request(c, TPR__OP_IREDUCE_SCATTER, recv_count, dt, op, -1, &r));
  tpr_status rc = c->vt->ireduce_scatter(c->ctx, send, recv, recv_count, dt, op, &r->impl);
  return started(r, rc, req);
}

tpr_status tpr_comm_ibroadcast(tpr_comm_t c, void *buf, size_t count, tpr_dtype dt, int root, tpr_comm_request *req) {
  TPR_CHECK(check_request_out("ibroadcast", c, req));
  TPR_CHECK(check_dtype("ibroadcast", dt));
  if (root < 0 || root >= c->size)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "ibroadcast: root %d outside the group of %d", root, c->size);
  TPR_CHECK(check_buffers("ibroadcast", buf, buf, count));
  if (!c->vt->ibroadcast) return unsupported(c, TPR__OP_IBROADCAST);
  tpr_comm_request r;
  TPR_CHECK(start_request(c, TPR__OP_IBROADCAST, count, dt, -1, root, &r));
  tpr_status rc = c->vt->ibroadcast(c->ctx, buf, count, dt, root, &r->impl);
  return started(r, rc, req);
}

tpr_status tpr_comm_test(tpr_comm_request r, bool *done) {
  if (!done) return TPR_FAIL(TPR_ERR_INVALID_ARG, "comm test: NULL done pointer");
  *done = true;
  if (!r || !r->impl) return TPR_OK;
  *done = false;
  if (!r->c->vt->test) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "comm %s: the %s backend has no test", r->c->name,
                                       r->c->vt->name);
  tpr_status rc = r->c->vt->test(r->c->ctx, r->impl, done);
  return rc == TPR_OK ? TPR_OK : request_fail(r, rc);
}

tpr_status tpr_comm_wait(tpr_comm_request r) {
  if (!r) return TPR_OK;
  tpr_status rc = TPR_OK;
  if (r->impl) {
    tpr_comm_t c = r->c;
    if (!c->vt->wait) {
      rc = TPR_FAIL(TPR_ERR_UNSUPPORTED, "comm %s: the %s backend has no wait", c->name, c->vt->name);
    } else {
      tpr__watch_enter(c, r->op, r->seq, r->count, r->dt, -1);
      rc = c->vt->wait(c->ctx, r->impl);
      tpr__watch_leave();
      if (rc != TPR_OK) rc = request_fail(r, rc);
    }
  }
  free(r);
  return rc;
}

// --- sub-communicators --------------------------------------------------

// The members' world ranks, gathered over the new group's host channel.
static tpr_status gather_world_ranks(tpr_comm_t g, int world_rank) {
  tpr_comm_t h = g->host ? g->host : g;
  int64_t mine = world_rank, *all = malloc((size_t)g->size * sizeof *all);
  if (!all) return TPR_FAIL(TPR_ERR_OOM, "split: world ranks");
  tpr_status rc = g->size == 1 ? (all[0] = mine, TPR_OK) : h->vt->all_gather(h->ctx, &mine, all, 1, TPR_I64);
  for (int i = 0; rc == TPR_OK && i < g->size; i++) g->world_ranks[i] = (int)all[i];
  free(all);
  return rc;
}

tpr_status tpr_comm_split(tpr_comm_t parent, int color, int key, const char *name, tpr_comm_t *out) {
  *out = NULL;
  TPR_CHECK(check_comm("split", parent));
  if (!parent->vt->split) return unsupported(parent, TPR__OP_SPLIT);
  int world_rank = parent->world_ranks[parent->rank];
  tpr_comm_t host = NULL;
  tpr_status rc = TPR_OK;
  // A device communicator splits its host twin the same way, first, so the
  // new group has a host channel for agreement and bookkeeping.
  if (parent->host) TPR_CHECK(tpr_comm_split(parent->host, color, key, name, &host));
  void *ctx = NULL;
  int rank = 0, size = 0;
  tpr__watch_enter(parent, TPR__OP_SPLIT, ++parent->seq, 0, TPR_U8, -1);
  rc = parent->vt->split(parent->ctx, color, key, &ctx, &rank, &size);
  tpr__watch_leave();
  if (rc != TPR_OK || !ctx) {
    tpr_comm_free(host);
    return rc;
  }
  TPR_CHECK(tpr__comm_new(parent->vt, ctx, rank, size, NULL, name, host, out));
  (*out)->check = parent->check;
  if (host) {
    memcpy((*out)->world_ranks, host->world_ranks, (size_t)size * sizeof *host->world_ranks);
    return TPR_OK;
  }
  rc = gather_world_ranks(*out, world_rank);
  if (rc != TPR_OK) {
    tpr_comm_free(*out);
    *out = NULL;
  }
  return rc;
}

tpr_status tpr_comm_agree(tpr_comm_t c, tpr_status rc) {
  int64_t failed = rc != TPR_OK;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", rc != TPR_OK ? tpr_last_error() : "");
  tpr_status crc = tpr_comm_all_reduce(c, &failed, &failed, 1, TPR_I64, TPR_MAX);
  if (crc != TPR_OK) return crc;
  if (rc != TPR_OK) return TPR_FAIL(rc, "%s", msg);
  if (failed) return TPR_FAIL(TPR_ERR_INVALID_ARG, "another rank failed (see its message)");
  return TPR_OK;
}
