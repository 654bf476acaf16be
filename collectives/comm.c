// Backend-independent front of tpr_comm: argument checks, then the vtable.
#include <stdlib.h>

#include "tpr_comm.h"

struct tpr_comm_s {
  const tpr_comm_vtable *vt;
  void *ctx;
  int rank, size;
};

tpr_status tpr__comm_new(const tpr_comm_vtable *vt, void *ctx, int rank, int size, tpr_comm_t *out) {
  struct tpr_comm_s *c = calloc(1, sizeof *c);
  if (!c) return TPR_FAIL(TPR_ERR_OOM, "communicator");
  *c = (struct tpr_comm_s){.vt = vt, .ctx = ctx, .rank = rank, .size = size};
  *out = c;
  return TPR_OK;
}

void tpr_comm_free(tpr_comm_t c) {
  if (!c) return;
  if (c->vt->destroy) c->vt->destroy(c->ctx);
  free(c);
}

int tpr_comm_rank(tpr_comm_t c) { return c->rank; }
int tpr_comm_size(tpr_comm_t c) { return c->size; }
const char *tpr_comm_backend(tpr_comm_t c) { return c->vt->name; }

static tpr_status check_buffers(const char *op, const void *send, void *recv, size_t count, tpr_dtype dt) {
  if (!tpr_dtype_valid(dt)) return TPR_FAIL(TPR_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
  if (count && (!send || !recv)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: NULL buffer with count %zu", op, count);
  return TPR_OK;
}

tpr_status tpr_comm_all_reduce(tpr_comm_t c, const void *send, void *recv, size_t count, tpr_dtype dt,
                               tpr_red_op op) {
  TPR_CHECK(check_buffers("all_reduce", send, recv, count, dt));
  if (dt == TPR_F8E4M3 || dt == TPR_U8)
    return TPR_FAIL(TPR_ERR_DTYPE, "all_reduce: %s is not reducible", tpr_dtype_name(dt));
  if ((unsigned)op > TPR_MIN) return TPR_FAIL(TPR_ERR_INVALID_ARG, "all_reduce: unknown op %d", (int)op);
  if (!c->vt->all_reduce) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "comm %s: all_reduce", c->vt->name);
  return c->vt->all_reduce(c->ctx, send, recv, count, dt, op);
}

tpr_status tpr_comm_all_gather(tpr_comm_t c, const void *send, void *recv, size_t send_count, tpr_dtype dt) {
  TPR_CHECK(check_buffers("all_gather", send, recv, send_count, dt));
  if (!c->vt->all_gather) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "comm %s: all_gather", c->vt->name);
  return c->vt->all_gather(c->ctx, send, recv, send_count, dt);
}

tpr_status tpr_comm_barrier(tpr_comm_t c) { return c->vt->barrier ? c->vt->barrier(c->ctx) : TPR_OK; }
