// Training checkpoints: a Hugging Face directory (config.json +
// model.safetensors with transformers' names, full tensors reassembled from
// the shards, padding removed) that transformers loads with from_pretrained
// and tpr loads as a model, plus what resuming needs: the step and the data
// order (trainer_state.json) and each rank's AdamW moments in its own layout
// (optim-rank-RRRRR-of-WWWWW.safetensors). Published atomically: every file
// is written into "<dir>.tmp", fsynced, and the directory renamed over the
// old one, so a process killed mid-save leaves the previous checkpoint whole.
#ifndef TPR_TRAIN_CHECKPOINT_H
#define TPR_TRAIN_CHECKPOINT_H

#include "train/adamw.h"
#include "train/trainer.h"

// Collective: the full tensors (weights, or with grads the gradient
// accumulators) reassembled on world rank 0 and written there as one
// safetensors file under transformers' names (atomically).
tpr_status tpr_train_write_full(tpr_train_state *t, bool grads, const char *path);

// Collective. adam: (tpr_train_num_params) this rank's moments.
tpr_status tpr_train_checkpoint_save(tpr_train_state *t, tpr_comm_t world, const char *dir, int64_t step,
                                     const tpr_train_opts *o, const tpr_adamw_state *adam);

// Reads the step and this rank's moments from a checkpoint written for the
// same mesh (the session must have been opened on dir, so the weights are
// its). A checkpoint of another mesh or a damaged file: a clear error.
tpr_status tpr_train_checkpoint_load(tpr_train_state *t, const char *dir, tpr_adamw_state *adam, int64_t *step);

// The data order a checkpoint's run read with (trainer_state.json's "seed"
// and "data_order"), so a resume reads on exactly where it stopped.
tpr_status tpr_train_checkpoint_data_order(const char *dir, uint64_t *seed, bool *sequential);

#endif
