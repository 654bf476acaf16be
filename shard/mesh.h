// The device mesh and the rank tensor.
//
// The world is factored twice (Megatron Core's "MoE parallel folding"):
// dense layers on (dp, tp) with world = dp*tp, expert layers on
// (edp, ep, etp) with world = edp*ep*etp. tp varies fastest among dense
// coordinates, etp then ep among expert ones, so tp and etp peers are
// neighbouring ranks (one node, fastest links).
//
// A rank's coordinates reach programs only through the rank tensor, an int32
// tensor bound as the program param "rank"; programs never contain a rank.
#ifndef TPR_MESH_H
#define TPR_MESH_H

#include "runtime/program/tpr_runtime.h"

typedef struct tpr_mesh {
  int world_size, world_rank;
  int tp, dp;         // dense: world = dp * tp
  int ep, etp, edp;   // experts: world = edp * ep * etp
  int tp_rank, dp_rank;
  int ep_rank, etp_rank, edp_rank;
} tpr_mesh;

// Slots of the rank tensor: (TPR_RANK_SLOTS) int32.
typedef enum tpr_rank_slot {
  TPR_RANK_TP = 0,
  TPR_RANK_TP_SIZE = 1,
  TPR_RANK_DP = 2,
  TPR_RANK_DP_SIZE = 3,
  TPR_RANK_EP = 4,
  TPR_RANK_EP_SIZE = 5,
  TPR_RANK_ETP = 6,
  TPR_RANK_ETP_SIZE = 7,
  TPR_RANK_EDP = 8,
  TPR_RANK_EDP_SIZE = 9,
  TPR_RANK_WORLD = 10,
  TPR_RANK_WORLD_SIZE = 11,
  TPR_RANK_SLOTS = 12
} tpr_rank_slot;

// The program param name of the rank tensor.
#define TPR_RANK_PARAM "rank"

// Factors the world. tp must divide world; ep*etp must divide world. A
// factorization that does not fit is a TPR_ERR_INVALID_ARG naming the numbers.
tpr_status tpr_mesh_init(int world_size, int world_rank, int tp, int ep, int etp, tpr_mesh *out);

// Fills host[TPR_RANK_SLOTS] with this rank's coordinates.
void tpr_mesh_rank_values(const tpr_mesh *m, int32_t *host);
// A new (TPR_RANK_SLOTS) int32 tensor on `backend` holding the coordinates.
tpr_status tpr_mesh_rank_tensor(const tpr_mesh *m, tpr_backend *backend, tpr_tensor **out);

// Declares the rank tensor as the program param TPR_RANK_PARAM, once per program.
tpr_status tpr_program_rank_param(tpr_program *p, tpr_value_id *out);
// A (1) int32 view of one slot of the rank tensor: the index for
// index_select(weight.view(tp, n), rank[slot]).
tpr_status tpr_pb_rank_index(tpr_program *p, tpr_value_id rank, tpr_rank_slot slot, tpr_value_id *out);

#endif
