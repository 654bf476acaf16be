// Internal: staging of CUDA device buffers for a backend whose transport
// reads only host memory (the mpi backend over an MPI that is not
// CUDA-aware). A staged entry checks each buffer; when none is device memory
// it calls the host entry at once (one pointer query per buffer, the whole
// cost of the fast path). Otherwise it copies device inputs into pinned host
// buffers, runs the host entry on host pointers and copies the outputs back.
//
// A backend context that uses these entries begins with a tpr_stage_ctx
// (first member), and its vtable names tpr__stage_* for the buffer-taking
// entries; its host vtable holds the entries that see host memory only.
#ifndef TPR_COMM_STAGE_H
#define TPR_COMM_STAGE_H

#include <stdbool.h>
#include <stddef.h>

#include "tpr_comm.h"

typedef struct tpr_stage_ctx {
  const tpr_comm_vtable *host;  // entries over host buffers (same ctx)
  bool device_ok;               // the transport reads device memory itself: never stage
  int rank, size;               // in the group, for in-place layouts
  void *pinned[2];              // cached pinned buffers: [0] inputs, [1] outputs
  size_t cap[2];
} tpr_stage_ctx;

// The CUDA calls staging makes. Tests replace them (NULL restores the
// runtime/backend_cuda.h ones) to run every staging path on a machine
// without a GPU, against fake device memory the transport must never touch.
// Pinned buffers are cached per communicator: swap hooks only while no
// communicator that has staged anything is alive.
typedef struct tpr_stage_hooks {
  bool (*is_device)(const void *p);
  tpr_status (*memcpy)(void *dst, const void *src, size_t bytes);
  tpr_status (*sync)(void);
  tpr_status (*host_alloc)(size_t bytes, void **out);
  void (*host_free)(void *p);
} tpr_stage_hooks;
void tpr__stage_set_hooks(const tpr_stage_hooks *hooks);

void tpr__stage_init(tpr_stage_ctx *s, const tpr_comm_vtable *host, bool device_ok, int rank, int size);
// True when p is device memory the transport cannot read itself (it would
// be staged).
bool tpr__stage_is_device(const tpr_stage_ctx *s, const void *p);
// Frees the cached pinned buffers.
void tpr__stage_release(tpr_stage_ctx *s);

tpr_status tpr__stage_all_reduce(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt,
                                 tpr_red_op op);
tpr_status tpr__stage_all_gather(void *ctx, const void *send, void *recv, size_t send_count, tpr_dtype dt);
tpr_status tpr__stage_reduce_scatter(void *ctx, const void *send, void *recv, size_t recv_count, tpr_dtype dt,
                                     tpr_red_op op);
tpr_status tpr__stage_all_to_all(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt);
tpr_status tpr__stage_all_to_allv(void *ctx, const void *send, const size_t *send_counts, const size_t *send_displs,
                                  void *recv, const size_t *recv_counts, const size_t *recv_displs, tpr_dtype dt);
tpr_status tpr__stage_broadcast(void *ctx, const void *send, void *recv, size_t count, tpr_dtype dt, int root);
tpr_status tpr__stage_send(void *ctx, const void *buf, size_t count, tpr_dtype dt, int peer);
tpr_status tpr__stage_recv(void *ctx, void *buf, size_t count, tpr_dtype dt, int peer);

#endif
