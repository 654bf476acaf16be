#include "mesh.h"

#include <string.h>

tpr_status tpr_mesh_init(int world_size, int world_rank, int tp, int ep, int etp, tpr_mesh *out) {
  memset(out, 0, sizeof *out);
  if (world_size < 1 || world_rank < 0 || world_rank >= world_size)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "mesh: rank %d of a world of %d", world_rank, world_size);
  if (tp < 1 || ep < 1 || etp < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "mesh: tp=%d ep=%d etp=%d must all be >= 1", tp, ep, etp);
  if (world_size % tp)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "mesh: tp=%d does not divide the world of %d ranks (world = dp*tp)", tp,
                    world_size);
  if (world_size % (ep * etp))
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "mesh: ep*etp = %d*%d = %d does not divide the world of %d ranks (world = edp*ep*etp)", ep, etp,
                    ep * etp, world_size);
  *out = (tpr_mesh){
      .world_size = world_size,
      .world_rank = world_rank,
      .tp = tp,
      .dp = world_size / tp,
      .ep = ep,
      .etp = etp,
      .edp = world_size / (ep * etp),
      .tp_rank = world_rank % tp,
      .dp_rank = world_rank / tp,
      .etp_rank = world_rank % etp,
      .ep_rank = (world_rank / etp) % ep,
      .edp_rank = world_rank / (ep * etp),
  };
  return TPR_OK;
}

void tpr_mesh_rank_values(const tpr_mesh *m, int32_t *host) {
  int32_t v[TPR_RANK_SLOTS] = {
      [TPR_RANK_TP] = m->tp_rank,   [TPR_RANK_TP_SIZE] = m->tp,   [TPR_RANK_DP] = m->dp_rank,
      [TPR_RANK_DP_SIZE] = m->dp,   [TPR_RANK_EP] = m->ep_rank,   [TPR_RANK_EP_SIZE] = m->ep,
      [TPR_RANK_ETP] = m->etp_rank, [TPR_RANK_ETP_SIZE] = m->etp, [TPR_RANK_EDP] = m->edp_rank,
      [TPR_RANK_EDP_SIZE] = m->edp, [TPR_RANK_WORLD] = m->world_rank, [TPR_RANK_WORLD_SIZE] = m->world_size,
  };
  memcpy(host, v, sizeof v);
}

tpr_status tpr_mesh_rank_tensor(const tpr_mesh *m, tpr_backend *backend, tpr_tensor **out) {
  int32_t host[TPR_RANK_SLOTS];
  tpr_mesh_rank_values(m, host);
  TPR_CHECK(tpr_tensor_new(backend, TPR_I32, 1, (const int64_t[]){TPR_RANK_SLOTS}, out));
  tpr_status rc = tpr_tensor_from_host(*out, host, sizeof host);
  if (rc != TPR_OK) {
    tpr_tensor_free(*out);
    *out = NULL;
  }
  return rc;
}

tpr_status tpr_program_rank_param(tpr_program *p, tpr_value_id *out) {
  return tpr_program_param(p, TPR_RANK_PARAM, TPR_I32, 1, (const int64_t[]){TPR_RANK_SLOTS}, out);
}

tpr_status tpr_pb_rank_index(tpr_program *p, tpr_value_id rank, tpr_rank_slot slot, tpr_value_id *out) {
  return tpr_pb_slice(p, rank, 0, slot, 1, out);
}
