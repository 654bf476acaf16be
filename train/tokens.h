// The token stream `tpr train --data`, `--eval-data` and `tpr eval --data`
// read: one or more token files (train/npy.h) concatenated in order, each
// optionally with its loss mask. train/data.h windows the stream exactly as
// it windowed one file, so a stream of shards reads what the concatenated
// single file reads, bit for bit.
//
// A spec is a comma-separated list of items, taken in the order given:
//   X.npy          one token file; its loss mask (when asked for) is
//                  X.mask.npy beside it.
//   PATTERN        a glob(3) pattern (it holds '*', '?' or '['), expanded by
//                  tpr and sorted (byte order); names ending in .mask.npy or
//                  .docs.npy (a shard's mask and document offsets) are
//                  skipped. No match is an error naming the pattern.
//   PREFIX.json    an index written by `tpr data prepare` (the token-shard
//                  format, docs/training.md): the shards of one split, their
//                  masks named by "mask_file". The split is the caller's
//                  default (train for --data, val for --eval-data and
//                  `tpr eval --data`) unless the item ends in ":train" or
//                  ":val" (PREFIX.json:val).
// Token files hold '<u2', '<u4', '<i4' or '<i8' ids; masks are '|u1' of 0/1,
// one per token. An index's shard must have the index's dtype and its
// recorded token count, its split must be non-empty and its token total
// must add up; every failure is an error naming the file.
#ifndef TPR_TRAIN_TOKENS_H
#define TPR_TRAIN_TOKENS_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr_tokens tpr_tokens;

typedef struct tpr_tokens_opts {
  const char *split;  // an index's split when the item names none: "train" or "val"
  bool masks;         // open every file's loss mask (its absence is an error)
  // Open every file's document offsets (an index's "docs_file", X.docs.npy
  // beside X.npy) when all have them; a file without them leaves the stream
  // without (tpr_tokens_has_docs false). Malformed offsets are an error.
  bool docs;
} tpr_tokens_opts;

tpr_status tpr_tokens_open(const char *spec, const tpr_tokens_opts *o, tpr_tokens **out);
void tpr_tokens_close(tpr_tokens *t);

int64_t tpr_tokens_len(const tpr_tokens *t);  // tokens of all files together
const char *tpr_tokens_spec(const tpr_tokens *t);
int tpr_tokens_files(const tpr_tokens *t);     // token files in the stream
const char *tpr_tokens_file(const tpr_tokens *t, int i);
bool tpr_tokens_has_masks(const tpr_tokens *t);
bool tpr_tokens_has_docs(const tpr_tokens *t);
// out[i] = 1 where a document starts at stream position start + i, else 0
// (count entries; positions past the end are 0). The stream must have docs.
tpr_status tpr_tokens_doc_starts(const tpr_tokens *t, int64_t start, int64_t count, uint8_t *out);

// Tokens [start, start + count) of the stream as int32, across file
// boundaries; a range past the end is TPR_ERR_INVALID_ARG.
tpr_status tpr_tokens_read_i32(const tpr_tokens *t, int64_t start, int64_t count, int32_t *out);
// The mask values (0/1) of the same positions; the stream must have masks.
tpr_status tpr_tokens_read_mask(const tpr_tokens *t, int64_t start, int64_t count, int32_t *out);

// Every id of every file in [0, vocab), or TPR_ERR_INVALID_ARG naming the
// file, the position in it and the value.
tpr_status tpr_tokens_check_range(const tpr_tokens *t, int64_t vocab);

#endif
