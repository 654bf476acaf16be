// One communicator per mesh axis group (docs/architecture.md section 4): this rank's tp,
// dp, ep, etp and edp groups, split from the world, and the hook that lets a
// program's collective ops run over them.
//
// Rank layout (shard/mesh.h): dense world = dp*tp with tp fastest; expert
// world = edp*ep*etp with etp fastest, then ep. So the tp group of world rank
// w is {dp_rank*tp + i}, the ep group {edp_rank*ep*etp + j*etp + etp_rank}.
#ifndef TPR_MESH_COMMS_H
#define TPR_MESH_COMMS_H

#include "collectives/tpr_comm.h"
#include "shard/mesh.h"

typedef struct tpr_mesh_comms {
  tpr_comm_t axis[TPR_AXIS_COUNT];  // indexed by tpr_mesh_axis; [TPR_AXIS_WORLD] is a duplicate of the world
  tpr_mesh mesh;
} tpr_mesh_comms;

// Collective over `world`: every rank must call it with the same mesh sizes.
// The mesh's world size must equal the communicator's (a clear error naming
// both otherwise), and each group's rank is checked against the mesh
// coordinate it stands for.
tpr_status tpr_mesh_comms_init(tpr_comm_t world, const tpr_mesh *mesh, tpr_mesh_comms *out);
void tpr_mesh_comms_free(tpr_mesh_comms *c);

// The exec hook for collective ops (ctx = c, which must outlive the exec).
tpr_exec_collectives tpr_mesh_comms_exec_hook(tpr_mesh_comms *c);

#endif
