// The parts of a session that code above the engine builds its own programs
// on: the weights as loaded (opened with opts.training they are f32 and
// may be updated in place), the program builder every rank agrees on, the
// binder of the weights, and the communicators. Not for the engine's users,
// who run steps through engine/session.h; the session keeps owning all of
// it, and knows nothing of what is built on it.
#ifndef TPR_ENGINE_SESSION_PARTS_H
#define TPR_ENGINE_SESSION_PARTS_H

#include "engine/session.h"
#include "shard/loader.h"

const tpr_session_opts *tpr__session_opts(const tpr_session *s);
tpr_backend *tpr__session_backend(const tpr_session *s);
const tpr_family *tpr__session_family(const tpr_session *s);
// The host-buffer communicator of every rank, and one mesh axis's.
tpr_comm_t tpr__session_world(const tpr_session *s);
tpr_comm_t tpr__session_axis(const tpr_session *s, tpr_mesh_axis axis);
// The exec hook that runs a program's collectives on the mesh.
const tpr_exec_collectives *tpr__session_collectives(const tpr_session *s);

// This rank's loaded slices (items in the loader's order). The arena is
// NULL once released.
const tpr_rank_weights *tpr__session_weights(const tpr_session *s);
// Item i as a tensor (the arena's bytes, wrapped); NULL for expert items,
// which are stacked per layer, and once released.
tpr_tensor *tpr__session_item_tensor(const tpr_session *s, int64_t i);
// Layer L's stacked experts: which 0 w13 (E_r, 2F_r, H), 1 w2 (E_r, H, F_r);
// NULL for a dense-MLP layer and once released.
tpr_tensor *tpr__session_expert(const tpr_session *s, int64_t L, int which);
// Frees the item tensors, the stacked experts and the loader's arena, for a
// caller that copied what it keeps (FSDP's chunks); the programs built
// afterwards bind what the caller binds in their place.
void tpr__session_release_weights(tpr_session *s);

// Builds (or receives from rank 0, opts.broadcast_program) a program and
// checks its hash on every rank. Collective.
typedef tpr_status (*tpr__build_fn)(const tpr_shard_plan *plan, const void *opts, tpr_program **out);
tpr_status tpr__session_make_program(tpr_session *s, tpr__build_fn build, const void *opts, tpr_program **out);
// Binds the weights, the stacked experts (those not released), the KV pools
// (unless opened for training) and the rank tensor.
tpr_status tpr__session_bind_params(tpr_session *s, tpr_exec *e);

#endif
