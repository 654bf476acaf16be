// Loading one rank's weights (docs/architecture.md sections 5 and 7).
//
// A rank builds each buffer of the sharding plan straight from the mmapped
// checkpoint: it reads only the boxes its slice needs (tpr_st_read) and
// applies the plan's transform while copying (padded Q heads and vocab rows
// become zeros, replicated KV heads are copied again). The source is either
// a Hugging Face directory (config.json + *.safetensors) or a directory
// written by tpr_convert (manifest.pb + one safetensors file per rank),
// told apart by manifest.pb. A converted directory must have been written
// for the same mesh, and every tensor read is checked against its XXH3
// checksum in the manifest.
//
// Mapped pages are released (MADV_DONTNEED) after each tensor, so the peak
// resident memory of a whole-rank load is the rank's own buffers plus one
// source tensor, not the checkpoint.
#ifndef TPR_LOADER_H
#define TPR_LOADER_H

#include <stdbool.h>
#include <stdint.h>

#include "shard/mesh.h"
#include "shard/shard_plan.h"

// Destination dtype meaning "each tensor keeps its checkpoint dtype" (an FP8
// weight with block scales is dequantized to bf16). Not a tpr_dtype value.
#define TPR_LOAD_SOURCE_DTYPE TPR_DTYPE_COUNT

#define TPR_LOAD_NAME_MAX 128

// One buffer a rank holds: an instance of a plan tensor kind.
typedef struct tpr_load_item {
  int kind;                          // index into plan->tensors
  int64_t layer;                     // model layer; -1 for kinds without {L}
  int64_t local_expert;              // [0, experts_per_rank); -1 for kinds without {E}
  int64_t expert;                    // ep_rank * experts_per_rank + local_expert; -1 if none
  char name[TPR_LOAD_NAME_MAX];      // checkpoint name: {L} = layer, {E} = expert
  char rank_name[TPR_LOAD_NAME_MAX]; // name in a converted rank file: {E} = local expert
  int64_t numel;                     // of the buffer: numel(plan rank_shape)
} tpr_load_item;

typedef struct tpr_loader tpr_loader;

// A plan tensor's name pattern with {L} -> layer and {E} -> expert, into
// buf[TPR_LOAD_NAME_MAX].
tpr_status tpr_loader_tensor_name(const char *pattern, int64_t layer, int64_t expert, char *buf);

// Opens `dir` for world rank `rank` of `plan` (borrowed: it must outlive the
// loader). Reads headers only (and, for a converted directory, the manifest
// and the rank file's header checksum). Errors: TPR_ERR_IO (missing
// directory or file), TPR_ERR_FORMAT (malformed checkpoint or manifest, a
// checksum or size mismatch, an interrupted convert), TPR_ERR_INVALID_ARG
// (a rank outside the plan's world, a converted directory written for
// another mesh: the message names both meshes).
tpr_status tpr_loader_open(const char *dir, const tpr_shard_plan *plan, int rank, tpr_loader **out);
void tpr_loader_close(tpr_loader *l);  // NULL is fine

bool tpr_loader_converted(const tpr_loader *l);
const tpr_mesh *tpr_loader_mesh(const tpr_loader *l);

// The rank's buffers, in plan order (kind, then layer, then local expert).
int64_t tpr_loader_count(const tpr_loader *l);
const tpr_load_item *tpr_loader_item(const tpr_loader *l, int64_t i);  // NULL if out of range
// The item of kind `kind` for `layer` (-1 if the kind has none) and
// `local_expert` (-1 likewise). TPR_ERR_INVALID_ARG if the rank holds none.
tpr_status tpr_loader_find(const tpr_loader *l, int kind, int64_t layer, int64_t local_expert,
                           const tpr_load_item **out);

// The dtype `it` has in the checkpoint (what TPR_LOAD_SOURCE_DTYPE gives).
tpr_dtype tpr_loader_item_dtype(const tpr_loader *l, const tpr_load_item *it);

// Fills dst: the item's buffer, plan rank_shape (r0[, r1]) row-major, dtype
// dt (or TPR_LOAD_SOURCE_DTYPE). Adds the checkpoint bytes it read to
// *bytes_read when that is not NULL. A tensor missing from the checkpoint or
// of the wrong shape is TPR_ERR_FORMAT naming the tensor and the file.
tpr_status tpr_loader_read(tpr_loader *l, const tpr_load_item *it, tpr_dtype dt, void *dst, uint64_t *bytes_read);

// FP8 kept as FP8. The scale block (columns per scale) plan kind `kind` can
// be held at on every rank of the mesh: a divisor of the checkpoint's block
// width that each rank's runs of source columns start on; 0 when the kind
// is not block-scaled FP8 in a Hugging Face directory (converted
// directories hold no FP8), or its runs are too fine (under 16 columns).
int tpr_loader_fp8_block(const tpr_loader *l, int kind);
// Whether the checkpoint holds plan kind `kind` as block-scaled FP8
// (whatever tpr_loader_fp8_block says of keeping it so).
bool tpr_loader_kind_fp8(const tpr_loader *l, int kind);
// Item it's raw FP8 bytes, laid out by the plan (rank_shape (R, C)), into
// dst, and its scales into scale (R, ceil(C / block)) f32: the multiplier of
// row i's block b (0 for padding). block as tpr_loader_fp8_block gives.
tpr_status tpr_loader_read_fp8(tpr_loader *l, const tpr_load_item *it, int block, uint8_t *dst, float *scale,
                               uint64_t *bytes_read);

// Every buffer of the rank, in one allocation.
typedef struct tpr_rank_weights {
  int64_t n;             // tpr_loader_count
  tpr_load_item *items;  // (n) copies of the loader's items
  tpr_dtype *dtype;      // (n)
  uint64_t *offset;      // (n + 1) byte offsets into arena; item i is [offset[i], offset[i+1])
  uint8_t *arena;        // (bytes_held)
  uint64_t bytes_held;   // what the rank holds, zero padding included
  uint64_t bytes_read;   // checkpoint bytes read to fill it
  float **scales;        // (n) FP8 items: (R, ceil(C / block)) f32 scales (tpr_loader_read_fp8); NULL otherwise
  int *block;            // (n) their scale block; 0 otherwise
} tpr_rank_weights;

tpr_status tpr_loader_load_all(tpr_loader *l, tpr_dtype dt, tpr_rank_weights *out);
// The same with a dtype per plan kind: item i gets kind_dt[items[i].kind]
// (kind_dt has plan->n_tensors entries); dt is ignored when kind_dt is set.
// A kind of dtype TPR_F8E4M3 with kind_block[kind] > 0 is read raw by
// tpr_loader_read_fp8, its scales into out->scales[i].
tpr_status tpr_loader_load_all_as(tpr_loader *l, tpr_dtype dt, const tpr_dtype *kind_dt, const int *kind_block,
                                  tpr_rank_weights *out);
// Bytes the arena of tpr_loader_load_all_as(l, dt, kind_dt, ...) takes on
// this rank (each buffer 64-byte aligned; FP8 scales not included): what a
// node-wide memory check asks before any rank loads.
uint64_t tpr_loader_arena_bytes(const tpr_loader *l, tpr_dtype dt, const tpr_dtype *kind_dt);
void tpr_rank_weights_free(tpr_rank_weights *w);
static inline void *tpr_rank_weights_data(const tpr_rank_weights *w, int64_t i) { return w->arena + w->offset[i]; }

// File name of world rank `rank`'s shard in a converted directory:
// "rank-00001-of-00004.safetensors".
void tpr_loader_rank_file(int rank, int world, char *buf, size_t n);

#endif
