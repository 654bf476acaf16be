#include "mesh_comms.h"

#include <stdlib.h>
#include <string.h>

// color and key of this rank's group along each axis.
static void axis_color_key(const tpr_mesh *m, tpr_mesh_axis a, int *color, int *key) {
  switch (a) {
    case TPR_AXIS_TP: *color = m->dp_rank, *key = m->tp_rank; break;
    case TPR_AXIS_DP: *color = m->tp_rank, *key = m->dp_rank; break;
    case TPR_AXIS_ETP: *color = m->edp_rank * m->ep + m->ep_rank, *key = m->etp_rank; break;
    case TPR_AXIS_EP: *color = m->edp_rank * m->etp + m->etp_rank, *key = m->ep_rank; break;
    case TPR_AXIS_EDP: *color = m->ep_rank * m->etp + m->etp_rank, *key = m->edp_rank; break;
    default: *color = 0, *key = m->world_rank; break;
  }
}

static void axis_rank_size(const tpr_mesh *m, tpr_mesh_axis a, int *rank, int *size) {
  switch (a) {
    case TPR_AXIS_TP: *rank = m->tp_rank, *size = m->tp; break;
    case TPR_AXIS_DP: *rank = m->dp_rank, *size = m->dp; break;
    case TPR_AXIS_EP: *rank = m->ep_rank, *size = m->ep; break;
    case TPR_AXIS_ETP: *rank = m->etp_rank, *size = m->etp; break;
    case TPR_AXIS_EDP: *rank = m->edp_rank, *size = m->edp; break;
    default: *rank = m->world_rank, *size = m->world_size; break;
  }
}

tpr_status tpr_mesh_comms_init(tpr_comm_t world, const tpr_mesh *mesh, tpr_mesh_comms *out) {
  memset(out, 0, sizeof *out);
  if (mesh->world_size != tpr_comm_size(world) || mesh->world_rank != tpr_comm_rank(world))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "mesh: built for rank %d of %d ranks, but the world is rank %d of %d",
                    mesh->world_rank, mesh->world_size, tpr_comm_rank(world), tpr_comm_size(world));
  out->mesh = *mesh;
  tpr_status rc = TPR_OK;
  for (int a = 0; a < TPR_AXIS_COUNT && rc == TPR_OK; a++) {
    int color, key, want_rank, want_size;
    axis_color_key(mesh, (tpr_mesh_axis)a, &color, &key);
    axis_rank_size(mesh, (tpr_mesh_axis)a, &want_rank, &want_size);
    rc = tpr_comm_split(world, color, key, tpr_mesh_axis_name((tpr_mesh_axis)a), &out->axis[a]);
    if (rc == TPR_OK && (tpr_comm_rank(out->axis[a]) != want_rank || tpr_comm_size(out->axis[a]) != want_size))
      rc = TPR_FAIL(TPR_ERR_INTERNAL, "mesh: the %s group has rank %d of %d, the mesh says %d of %d",
                    tpr_mesh_axis_name((tpr_mesh_axis)a), tpr_comm_rank(out->axis[a]), tpr_comm_size(out->axis[a]),
                    want_rank, want_size);
  }
  if (rc != TPR_OK) tpr_mesh_comms_free(out);
  return rc;
}

void tpr_mesh_comms_free(tpr_mesh_comms *c) {
  for (int a = 0; a < TPR_AXIS_COUNT; a++) tpr_comm_free(c->axis[a]);
  memset(c, 0, sizeof *c);
}

// Counts are (n*m) i32 per (peer, sub-block); rows are contiguous per peer.
static tpr_status all_to_allv(tpr_comm_t c, const tpr_tensor *const *in, tpr_tensor *out) {
  const tpr_tensor *x = in[0];
  int n = tpr_comm_size(c);
  int64_t m = tpr_tensor_numel(in[1]) / n, row = x->ndim > 1 ? tpr_tensor_numel(x) / x->shape[0] : 1;
  size_t nc = (size_t)(n * m);
  int32_t *counts = malloc(2 * nc * sizeof *counts);
  size_t *v = malloc(4 * (size_t)n * sizeof *v);  // send counts, displs, recv counts, displs
  tpr_status rc = counts && v ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "all_to_allv counts");
  // Counts may live on a device: copy them out (a few bytes per peer).
  if (rc == TPR_OK) rc = tpr_tensor_to_host(in[1], counts, nc * sizeof *counts);
  if (rc == TPR_OK) rc = tpr_tensor_to_host(in[2], counts + nc, nc * sizeof *counts);
  for (int side = 0; rc == TPR_OK && side < 2; side++) {
    size_t *cnt = v + 2 * side * n, *dsp = cnt + n, at = 0, cap = (size_t)(side ? out : x)->shape[0];
    for (int j = 0; j < n; j++) {
      int64_t rows = 0;
      for (int64_t e = 0; e < m; e++) {
        int32_t k = counts[side * nc + (size_t)(j * m + e)];
        if (k < 0) rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "all_to_allv: negative count %d", k);
        rows += k;
      }
      dsp[j] = at * (size_t)row;
      cnt[j] = (size_t)rows * (size_t)row;
      at += (size_t)rows;
    }
    if (rc == TPR_OK && at > cap)
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "all_to_allv: %zu rows to %s but the buffer has %zu", at,
                    side ? "receive" : "send", cap);
  }
  if (rc == TPR_OK)
    rc = tpr_comm_all_to_allv(c, tpr_tensor_data(x), v, v + n, tpr_tensor_data(out), v + 2 * n, v + 3 * n, x->dtype);
  free(counts), free(v);
  return rc;
}

// FSDP's gather (ops.h, param_gather): f32 chunks straight into out; bf16
// chunks into out's upper half, then widened in place front to back (element
// i is read at byte 2n + 2i before bytes [4i, 4i+4) are written, which never
// reach an element not yet read), so no staging buffer is needed.
static tpr_status param_gather_widen(const tpr_tensor *in, tpr_tensor *out) {
  if (in->dtype == TPR_F32) return TPR_OK;
  size_t n = (size_t)tpr_tensor_numel(out);
  char *base = tpr_tensor_data(out);
  const uint16_t *h = (const uint16_t *)(base + 2 * n);
  float *f = (float *)base;
  for (size_t i = 0; i < n; i++) {
    uint16_t b = h[i];
    f[i] = tpr_bf16_to_f32(b);
  }
  return TPR_OK;
}

static void *param_gather_recv(const tpr_tensor *in, tpr_tensor *out) {
  char *base = tpr_tensor_data(out);
  return in->dtype == TPR_F32 ? base : base + 2 * (size_t)tpr_tensor_numel(out);
}

// The axis communicator of a collective node, checked against the program.
static tpr_status node_comm(tpr_mesh_comms *mc, tpr_op_kind op, const tpr_op_attrs *at, tpr_comm_t *out) {
  tpr_mesh_axis axis = (tpr_mesh_axis)at->i[0];
  tpr_comm_t c = mc->axis[axis];
  if (!c) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: no %s communicator", tpr_op_name(op), tpr_mesh_axis_name(axis));
  if (tpr_comm_size(c) != at->i[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "%s over %s: the program was built for a group of %lld ranks, the mesh has %d",
                    tpr_op_name(op), tpr_mesh_axis_name(axis), (long long)at->i[1], tpr_comm_size(c));
  *out = c;
  return TPR_OK;
}

// Prefetched param_gather (runtime/program/program.h, tpr_exec_collectives.start).
static tpr_status start_collective(void *ctx, tpr_op_kind op, const tpr_op_attrs *at, const tpr_tensor *const *ins,
                                   int n_ins, tpr_tensor *out, void **req) {
  (void)n_ins;
  *req = NULL;
  if (op != TPR_OP_PARAM_GATHER) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s cannot be prefetched", tpr_op_name(op));
  tpr_comm_t c;
  TPR_CHECK(node_comm(ctx, op, at, &c));
  tpr_comm_request r = NULL;
  TPR_CHECK(tpr_comm_iall_gather(c, tpr_tensor_data(ins[0]), param_gather_recv(ins[0], out),
                                 (size_t)tpr_tensor_numel(ins[0]), ins[0]->dtype, &r));
  *req = r;
  return TPR_OK;
}

static tpr_status test_collective(void *ctx, void *req, bool *done) {
  (void)ctx;
  return tpr_comm_test(req, done);
}

static tpr_status finish_collective(void *ctx, void *req, const tpr_tensor *const *ins, tpr_tensor *out) {
  (void)ctx;
  TPR_CHECK(tpr_comm_wait(req));
  return param_gather_widen(ins[0], out);
}

static tpr_status run_collective(void *ctx, tpr_op_kind op, const tpr_op_attrs *at, const tpr_tensor *const *ins,
                                 int n_ins, tpr_tensor *out) {
  const tpr_tensor *in = ins[0];
  tpr_comm_t c;
  TPR_CHECK(node_comm(ctx, op, at, &c));
  const void *src = tpr_tensor_data(in);
  void *dst = tpr_tensor_data(out);
  size_t n_in = (size_t)tpr_tensor_numel(in), n_out = (size_t)tpr_tensor_numel(out);
  size_t group = (size_t)tpr_comm_size(c);
  switch (op) {
    case TPR_OP_ALL_REDUCE: return tpr_comm_all_reduce(c, src, dst, n_in, in->dtype, (tpr_red_op)at->i[2]);
    case TPR_OP_ALL_GATHER: return tpr_comm_all_gather(c, src, dst, n_in, in->dtype);
    case TPR_OP_REDUCE_SCATTER:
      return tpr_comm_reduce_scatter(c, src, dst, n_out, in->dtype, (tpr_red_op)at->i[2]);
    case TPR_OP_ALL_TO_ALL: return tpr_comm_all_to_all(c, src, dst, n_in / group, in->dtype);
    case TPR_OP_ALL_TO_ALLV: return all_to_allv(c, ins, out);
    case TPR_OP_PARAM_GATHER:
      TPR_CHECK(tpr_comm_all_gather(c, src, param_gather_recv(in, out), n_in, in->dtype));
      return param_gather_widen(in, out);
    default: return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s is not a collective op", tpr_op_name(op));
  }
}

tpr_exec_collectives tpr_mesh_comms_exec_hook(tpr_mesh_comms *c) {
  return (tpr_exec_collectives){.ctx = c,
                                .run = run_collective,
                                .start = start_collective,
                                .test = test_collective,
                                .finish = finish_collective};
}
