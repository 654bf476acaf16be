// Internals of train/checkpoint.c shared with checkpoint_reshard.c.
#ifndef TPR_TRAIN_CHECKPOINT_IMPL_H
#define TPR_TRAIN_CHECKPOINT_IMPL_H

#include "train/adamw.h"
#include "train/trainer.h"

// "optim-rank-RRRRR-of-WWWWW.safetensors"
void tpr__train_rank_file(int rank, int world, char *buf, size_t n);

// This rank's moments from a checkpoint saved by old_world ranks with the
// same tp, ep and etp (any dp, with or without FSDP): every element of this
// rank's chunk is read from the old rank that held it.
tpr_status tpr__train_load_moments(tpr_session *s, const char *dir, int old_world, int64_t step,
                                   tpr_adamw_state *adam);

#endif
