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

#endif
