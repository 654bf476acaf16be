// Whole-file reads and writes with tpr_status errors naming the path.
#ifndef TPR_FILE_IO_H
#define TPR_FILE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

// *bytes is malloc'ed with one extra NUL byte after *len (so text can be
// parsed in place); the caller frees it.
tpr_status tpr_file_read(const char *path, uint8_t **bytes, size_t *len);
tpr_status tpr_file_write(const char *path, const uint8_t *bytes, size_t len);

#include <stdbool.h>

// "dir/name", malloc'ed (NULL when out of memory).
char *tpr_path_join(const char *dir, const char *name);
// Creates path (which must not exist) holding bytes, fsynced.
tpr_status tpr_file_create_synced(const char *path, const void *bytes, size_t len);
// fsyncs a directory (file systems that cannot are let be).
tpr_status tpr_dir_sync(const char *dir);
// Removes the files of a flat directory (those `only` accepts, if given),
// then the directory if that emptied it. True if the directory is gone.
bool tpr_dir_remove_flat(const char *dir, bool (*only)(const char *name));
// Publishes the finished directory tmp as out: an existing out (only with
// force) is moved to "<out>.old-<pid>" first, tmp renamed over, the parent
// fsynced, and the old one removed when is_ours(old) says it is one of ours
// (only its files our_file accepts go); a failed rename puts the old one
// back. `what` names the caller in messages.
tpr_status tpr_dir_publish(const char *tmp, const char *out, bool force, bool (*is_ours)(const char *dir),
                           bool (*our_file)(const char *name), const char *what);

#endif
