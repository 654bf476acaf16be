// Internals shared by the loader, the converter and the checkpoint generator.
#ifndef TPR_LOADER_IMPL_H
#define TPR_LOADER_IMPL_H

#include <stddef.h>

#include "runtime/file_io.h"  // tpr_path_join
#include "shard/loader.h"
#include "shard/safetensors.h"

// Version of manifest.pb this build writes and reads.
#define TPR_MANIFEST_VERSION 1

typedef struct tpr__conv_tensor {  // what manifest.pb says of one item of this rank
  uint64_t xxh3, nbytes, offset;
  tpr_dtype dtype;
  bool seen;
} tpr__conv_tensor;

struct tpr_loader {
  char *dir;
  const tpr_shard_plan *plan;
  tpr_mesh mesh;
  bool converted;
  bool *moe;             // (num_layers) layers holding the MoE block
  tpr_load_item *items;  // (n)
  int64_t n;
  int64_t *kind_start;   // (plan->n_tensors + 1) items of kind k: [kind_start[k], kind_start[k+1])
  tpr_st_set *set;       // the HF set, or this rank's converted file
  char *rank_path;       // converted: this rank's file
  tpr__conv_tensor *conv;  // converted: (n), parallel to items
};

// Which layers hold the MoE block: model_config.c counts them (qwen3_moe's
// mlp_only_layers / decoder_sparse_step) but does not keep the list, so the
// rule is applied again here to the config text. *moe is malloc'ed
// (num_layers); the count must equal c->num_moe_layers.
tpr_status tpr__moe_layers(const char *json, size_t len, const char *origin, const tpr_model_config *c, bool **moe);

// The buffers world rank m->world_rank holds under plan p (names filled).
// *kind_start as in struct tpr_loader. Both malloc'ed.
tpr_status tpr__load_items(const tpr_shard_plan *p, const tpr_mesh *m, const bool *moe, tpr_load_item **items,
                           int64_t *n, int64_t **kind_start);

// Releases the mapped pages of a tensor (and of its FP8 scales) from this
// process's resident set; they are read again from the page cache if touched.
void tpr__drop_pages(const void *data, size_t nbytes);

// Transform reads from a Hugging Face set (loader_hf.c).
tpr_status tpr__hf_read(tpr_loader *l, const tpr_load_item *it, tpr_dtype dt, void *dst, uint64_t *bytes_read);
tpr_dtype tpr__hf_item_dtype(const tpr_loader *l, const tpr_load_item *it);
// One info line on world rank 0 when the set is in transformers' Qwen3-VL-MoE
// layout (language_model prefix, fused experts, a vision tower not read).
void tpr__hf_layout_note(const tpr_loader *l);
// FP8 kept as FP8 (loader.h: tpr_loader_fp8_block, tpr_loader_read_fp8).
int tpr__hf_fp8_block(const tpr_loader *l, int kind);
bool tpr__hf_kind_fp8(const tpr_loader *l, int kind);
tpr_status tpr__hf_read_fp8(tpr_loader *l, const tpr_load_item *it, int block, uint8_t *dst, float *scale,
                            uint64_t *bytes_read);

// A converted directory (loader_conv.c): manifest checks at open, verified reads.
tpr_status tpr__conv_open(tpr_loader *l);
tpr_status tpr__conv_read(tpr_loader *l, const tpr_load_item *it, tpr_dtype dt, void *dst, uint64_t *bytes_read);

#endif
