// Internals of train/checkpoint.c shared with checkpoint_reshard.c.
#ifndef TPR_TRAIN_CHECKPOINT_IMPL_H
#define TPR_TRAIN_CHECKPOINT_IMPL_H

#include "shard/safetensors.h"
#include "train/adamw.h"
#include "train/trainer.h"

// Full tensors collected on rank 0 for one safetensors file; every entry's
// name, shape and data are owned (malloc'ed).
typedef struct tpr__collect {
  tpr_st_write_entry *e;
  int n, cap;
} tpr__collect;
// Appends an entry, taking name, shape and data over (freed on failure too).
tpr_status tpr__collect_push(tpr__collect *c, char *name, tpr_dtype dt, int ndim, int64_t *shape, void *data);
void tpr__collect_free(tpr__collect *c);

// Rank 0's collected model (the plan's names, experts one by one, f32)
// made what the family's transformers class saves (checkpoint_layout.c):
// qwen3_vl_moe's names and fused experts, and the VL families' vision tower
// copied from src_dir. Other families: unchanged.
tpr_status tpr__train_hf_layout(const tpr_session *s, const char *src_dir, tpr__collect *c);

// "optim-rank-RRRRR-of-WWWWW.safetensors"
void tpr__train_rank_file(int rank, int world, char *buf, size_t n);

// This rank's moments from a checkpoint saved by old_world ranks with the
// same tp, ep and etp (any dp, with or without FSDP): every element of this
// rank's chunk is read from the old rank that held it.
tpr_status tpr__train_load_moments(const tpr_train_state *t, const char *dir, int old_world, int64_t step,
                                   tpr_adamw_state *adam);

#endif
