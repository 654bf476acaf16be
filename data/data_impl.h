// Inside data/: the shard writer (shards.c) that prepare.c feeds in input order.
#ifndef TPR_DATA_IMPL_H
#define TPR_DATA_IMPL_H

#include <cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/status.h"

// One split's shards: PREFIX.SPLIT.NNNNN.npy (the ids), .docs.npy (the
// document offsets, written when the shard closes) and, with a mask,
// .mask.npy.
typedef struct data_split {
  const char *prefix;  // the output prefix as given (directory included)
  const char *name;    // "train" / "val"
  int item_bytes;      // 2 ('<u2') or 4 ('<u4')
  bool with_mask;
  int64_t shard_tokens;
  // The open shard (tok == NULL: none).
  FILE *tok, *mask;
  char *tok_path, *mask_path;
  int64_t n;           // tokens in the open shard
  int64_t *offsets;    // its document starts, then n
  size_t n_offsets, cap_offsets;
  int shard_index;     // the next shard's number
  void *conv;          // item_bytes-wide staging for one document
  size_t conv_cap;
  cJSON *shards;       // the index's list of this split's shards
  int64_t tokens, documents;
} data_split;

void data_split_init(data_split *s, const char *prefix, const char *name, int item_bytes, bool with_mask,
                     int64_t shard_tokens);
// Appends one document (ids n, mask n or NULL), opening a shard if none is
// open and closing it once it holds >= shard_tokens tokens.
tpr_status data_split_add(data_split *s, const int32_t *ids, const uint8_t *mask, size_t n);
// Closes the open shard (if any): its header, its docs file, its index entry.
tpr_status data_split_finish(data_split *s);
// Frees what is left (and closes files left open after an error).
void data_split_free(data_split *s);

// The size of the fixed .npy v1.0 header data/ writes: np.save's own for any
// 1-D shape below 2^50 (magic, version, length, the dict padded with spaces
// to a multiple of 64 bytes, '\n').
#define DATA_NPY_HEADER 128
// The header for (n,) of descr ("<u2", "<u4", "<i8", "|u1") into h.
void data_npy_header(char h[DATA_NPY_HEADER], const char *descr, int64_t n);

#endif
