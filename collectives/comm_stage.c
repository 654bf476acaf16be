// Staging of CUDA device buffers through pinned host memory, for a backend
// whose transport reads host memory only (see comm_stage.h). Without CUDA
// (or without device buffers) every entry is one pointer query per buffer
// and a call of the host entry.
#include "comm_stage.h"

#include <string.h>

#include "runtime/backend_cuda.h"

// Pinned buffers up to this size stay cached for the next call (pinning is
// slow: milliseconds per call); bigger ones are freed when the call ends.
#define STAGE_KEEP_BYTES ((size_t)256 << 20)

enum { SLOT_IN = 0, SLOT_OUT = 1 };

static const tpr_stage_hooks cuda_hooks = {
    .is_device = tpr_cuda_is_device_pointer,
    .memcpy = tpr_cuda_memcpy,
    .sync = tpr_cuda_device_sync,
    .host_alloc = tpr_cuda_host_alloc,
    .host_free = tpr_cuda_host_free,
};
static const tpr_stage_hooks *hooks = &cuda_hooks;

void tpr__stage_set_hooks(const tpr_stage_hooks *h) { hooks = h ? h : &cuda_hooks; }

void tpr__stage_init(tpr_stage_ctx *s, const tpr_comm_vtable *host, bool device_ok, int rank, int size) {
  memset(s, 0, sizeof *s);
  s->host = host;
  s->device_ok = device_ok;
  s->rank = rank;
  s->size = size;
}

static void drop(tpr_stage_ctx *s, int i) {
  hooks->host_free(s->pinned[i]);
  s->pinned[i] = NULL;
  s->cap[i] = 0;
}

void tpr__stage_release(tpr_stage_ctx *s) {
  drop(s, SLOT_IN);
  drop(s, SLOT_OUT);
}

static bool on_device(const tpr_stage_ctx *s, const void *p) {
  return p && !s->device_ok && hooks->is_device(p);
}

bool tpr__stage_is_device(const tpr_stage_ctx *s, const void *p) { return on_device(s, p); }

// The slow path starts here: kernels still writing the caller's device
// buffers (on any stream, e.g. the backend's non-blocking one) finish first,
// since the copies below run on the legacy default stream.
static tpr_status begin(tpr_stage_ctx *s) { return hooks->sync(); }

static void end(tpr_stage_ctx *s) {
  for (int i = 0; i < 2; i++)
    if (s->cap[i] > STAGE_KEEP_BYTES) drop(s, i);
}

// Host view of `bytes` at `user`: user itself when it is host memory, else
// pinned slot i, filled from user when copy_in.
static tpr_status stage(tpr_stage_ctx *s, int i, const void *user, size_t bytes, bool copy_in, void **host) {
  if (!bytes || !on_device(s, user)) {
    *host = (void *)user;
    return TPR_OK;
  }
  if (s->cap[i] < bytes) {
    drop(s, i);
    TPR_CHECK(hooks->host_alloc(bytes, &s->pinned[i]));
    s->cap[i] = bytes;
  }
  *host = s->pinned[i];
  return copy_in ? hooks->memcpy(*host, user, bytes) : TPR_OK;
}

// Copies an output back when it was staged.
static tpr_status unstage(void *user, const void *host, size_t bytes) {
  return host == user || !bytes ? TPR_OK : hooks->memcpy(user, host, bytes);
}

static tpr_status finish(tpr_stage_ctx *s, tpr_status rc) {
  end(s);
  return rc;
}

tpr_status tpr__stage_all_reduce(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                 tpr_red_op op) {
  tpr_stage_ctx *s = ctx;
  size_t bytes = count * tpr_dtype_size(dt);
  if (!bytes || (!on_device(s, send) && (send == recv || !on_device(s, recv))))
    return s->host->all_reduce(ctx, send, recv, count, dt, op);
  void *hs = NULL, *hr = NULL;
  tpr_status rc = begin(s);
  if (rc == TPR_OK) rc = stage(s, SLOT_OUT, recv, bytes, send == recv, &hr);  // in place: read and written
  if (rc == TPR_OK) {
    if (send == recv) hs = hr;
    else rc = stage(s, SLOT_IN, send, bytes, true, &hs);
  }
  if (rc == TPR_OK) rc = s->host->all_reduce(ctx, hs, hr, count, dt, op);
  if (rc == TPR_OK) rc = unstage(recv, hr, bytes);
  return finish(s, rc);
}

// In place: send is block r of recv.
tpr_status tpr__stage_all_gather(void *ctx, const void *send, void *recv, size_t send_count, tpr_dtype dt) {
  tpr_stage_ctx *s = ctx;
  size_t bytes = send_count * tpr_dtype_size(dt), total = bytes * (size_t)s->size;
  bool in_place = send == (const char *)recv + (size_t)s->rank * bytes;
  if (!bytes || (!on_device(s, recv) && (in_place || !on_device(s, send))))
    return s->host->all_gather(ctx, send, recv, send_count, dt);
  void *hs = NULL, *hr = NULL;
  tpr_status rc = begin(s);
  if (rc == TPR_OK) rc = stage(s, SLOT_OUT, recv, total, false, &hr);
  if (rc == TPR_OK) {
    if (in_place) {  // only block r of recv is input: copy it to its place in the host view
      hs = (char *)hr + (size_t)s->rank * bytes;
      rc = hooks->memcpy(hs, send, bytes);
    } else {
      rc = stage(s, SLOT_IN, send, bytes, true, &hs);
    }
  }
  if (rc == TPR_OK) rc = s->host->all_gather(ctx, hs, hr, send_count, dt);
  if (rc == TPR_OK) rc = unstage(recv, hr, total);
  return finish(s, rc);
}

// In place: recv is block r of send.
tpr_status tpr__stage_reduce_scatter(void *ctx, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                                     tpr_red_op op) {
  tpr_stage_ctx *s = ctx;
  size_t bytes = recv_count * tpr_dtype_size(dt), total = bytes * (size_t)s->size;
  bool in_place = recv == (const char *)send + (size_t)s->rank * bytes;
  if (!bytes || (!on_device(s, send) && (in_place || !on_device(s, recv))))
    return s->host->reduce_scatter(ctx, send, recv, recv_count, dt, op);
  void *hs = NULL, *hr = NULL;
  tpr_status rc = begin(s);
  if (rc == TPR_OK) rc = stage(s, SLOT_IN, send, total, true, &hs);
  if (rc == TPR_OK) {
    if (in_place) hr = (char *)hs + (size_t)s->rank * bytes;
    else rc = stage(s, SLOT_OUT, recv, bytes, false, &hr);
  }
  if (rc == TPR_OK) rc = s->host->reduce_scatter(ctx, hs, hr, recv_count, dt, op);
  if (rc == TPR_OK) rc = unstage(recv, hr, bytes);
  return finish(s, rc);
}

tpr_status tpr__stage_all_to_all(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt) {
  tpr_stage_ctx *s = ctx;
  size_t total = count * tpr_dtype_size(dt) * (size_t)s->size;
  if (!total || (!on_device(s, send) && !on_device(s, recv))) return s->host->all_to_all(ctx, send, recv, count, dt);
  void *hs = NULL, *hr = NULL;
  tpr_status rc = begin(s);
  if (rc == TPR_OK) rc = stage(s, SLOT_IN, send, total, true, &hs);
  if (rc == TPR_OK) rc = stage(s, SLOT_OUT, recv, total, false, &hr);
  if (rc == TPR_OK) rc = s->host->all_to_all(ctx, hs, hr, count, dt);
  if (rc == TPR_OK) rc = unstage(recv, hr, total);
  return finish(s, rc);
}

// Elements spanned by the blocks that hold data.
static size_t extent(const size_t *counts, const size_t *displs, int n) {
  size_t end = 0;
  for (int j = 0; j < n; j++)
    if (counts[j] && displs[j] + counts[j] > end) end = displs[j] + counts[j];
  return end;
}

tpr_status tpr__stage_all_to_allv(void *ctx, const void *send, const size_t *send_counts, const size_t *send_displs,
                                  void *recv, const size_t *recv_counts, const size_t *recv_displs, tpr_dtype dt) {
  tpr_stage_ctx *s = ctx;
  if (!on_device(s, send) && !on_device(s, recv))
    return s->host->all_to_allv(ctx, send, send_counts, send_displs, recv, recv_counts, recv_displs, dt);
  size_t esz = tpr_dtype_size(dt);
  void *hs = NULL, *hr = NULL;
  tpr_status rc = begin(s);
  if (rc == TPR_OK) rc = stage(s, SLOT_IN, send, extent(send_counts, send_displs, s->size) * esz, true, &hs);
  if (rc == TPR_OK) rc = stage(s, SLOT_OUT, recv, extent(recv_counts, recv_displs, s->size) * esz, false, &hr);
  if (rc == TPR_OK)
    rc = s->host->all_to_allv(ctx, hs, send_counts, send_displs, hr, recv_counts, recv_displs, dt);
  // Only the received blocks go back: the gaps between them are the caller's.
  for (int j = 0; j < s->size && rc == TPR_OK && hr != recv; j++)
    if (recv_counts[j])
      rc = unstage((char *)recv + recv_displs[j] * esz, (char *)hr + recv_displs[j] * esz, recv_counts[j] * esz);
  return finish(s, rc);
}

// send is read on the root only.
tpr_status tpr__stage_broadcast(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, int root) {
  tpr_stage_ctx *s = ctx;
  size_t bytes = count * tpr_dtype_size(dt);
  bool root_reads = s->rank == root && send != recv;
  if (!bytes || (!on_device(s, recv) && (!root_reads || !on_device(s, send))))
    return s->host->broadcast(ctx, send, recv, count, dt, root);
  void *hs = NULL, *hr = NULL;  // hs stays NULL off the root, where send is not read
  bool in_place = s->rank == root && send == recv;
  tpr_status rc = begin(s);
  if (rc == TPR_OK) rc = stage(s, SLOT_OUT, recv, bytes, in_place, &hr);
  if (rc == TPR_OK) {
    if (in_place) hs = hr;
    else if (root_reads) rc = stage(s, SLOT_IN, send, bytes, true, &hs);
  }
  if (rc == TPR_OK) rc = s->host->broadcast(ctx, hs, hr, count, dt, root);
  if (rc == TPR_OK) rc = unstage(recv, hr, bytes);
  return finish(s, rc);
}

tpr_status tpr__stage_send(void *ctx, const void *buf, size_t count, tpr_dtype dt, int peer) {
  tpr_stage_ctx *s = ctx;
  size_t bytes = count * tpr_dtype_size(dt);
  if (!bytes || !on_device(s, buf)) return s->host->send(ctx, buf, count, dt, peer);
  void *h = NULL;
  tpr_status rc = begin(s);
  if (rc == TPR_OK) rc = stage(s, SLOT_IN, buf, bytes, true, &h);
  if (rc == TPR_OK) rc = s->host->send(ctx, h, count, dt, peer);
  return finish(s, rc);
}

tpr_status tpr__stage_recv(void *ctx, void *buf, size_t count, tpr_dtype dt, int peer) {
  tpr_stage_ctx *s = ctx;
  size_t bytes = count * tpr_dtype_size(dt);
  if (!bytes || !on_device(s, buf)) return s->host->recv(ctx, buf, count, dt, peer);
  void *h = NULL;
  tpr_status rc = begin(s);
  if (rc == TPR_OK) rc = stage(s, SLOT_OUT, buf, bytes, false, &h);
  if (rc == TPR_OK) rc = s->host->recv(ctx, h, count, dt, peer);
  if (rc == TPR_OK) rc = unstage(buf, h, bytes);
  return finish(s, rc);
}
