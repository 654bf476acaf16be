// Converting a checkpoint into per-rank shard files for one mesh.
//
// <out>/rank-00000-of-00004.safetensors ... hold each world rank's buffers
// exactly as tpr_loader builds them (padding and replication applied), named
// by the Hugging Face names with {L} = layer and {E} = the local expert
// index; <out>/manifest.pb (shard/manifest.proto) records the mesh, the
// model config, every tensor's layout and XXH3 checksums per file and per
// tensor; <out>/config.json is the source's, so the directory loads like a
// checkpoint (tpr_loader_open detects manifest.pb).
//
// Atomic: everything is written into <out>.tmp-<pid>/ (each file written,
// fsynced and renamed by tpr_st_write; manifest.pb last), the directory is
// fsynced and renamed to <out>. An interrupted convert leaves only the
// temporary directory, which does not load (no manifest.pb, or not <out>).
#ifndef TPR_CONVERT_H
#define TPR_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include "shard/loader.h"

typedef struct tpr_convert_stats {
  int files;               // rank files written
  uint64_t bytes_written;  // all files, manifest and config included
  uint64_t bytes_read;     // checkpoint bytes read
} tpr_convert_stats;

// Converts `src` (a Hugging Face directory; a converted one for the same
// mesh works too) for `plan`. dt: the stored dtype, or TPR_LOAD_SOURCE_DTYPE
// to keep each tensor's (then loading the result is bit-exact with loading
// src in any dtype). An existing <out> is refused unless `force`, which
// renames it away first and removes it once the new one is in place (when it
// is not a converted directory it is kept as <out>.old-<pid>). stats may be
// NULL.
tpr_status tpr_convert(const char *src, const tpr_shard_plan *plan, const char *out, tpr_dtype dt, bool force,
                       tpr_convert_stats *stats);

#endif
