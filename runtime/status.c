#include "status.h"

#include <stdio.h>
#include <string.h>

// Large enough for a message plus a few levels of propagation context.
#define TPR_ERROR_CAP 2048

static _Thread_local char last_error[TPR_ERROR_CAP];

static const char *const status_names[TPR_STATUS_COUNT] = {
    [TPR_OK] = "TPR_OK",
    [TPR_ERR_INVALID_ARG] = "TPR_ERR_INVALID_ARG",
    [TPR_ERR_SHAPE] = "TPR_ERR_SHAPE",
    [TPR_ERR_DTYPE] = "TPR_ERR_DTYPE",
    [TPR_ERR_OOM] = "TPR_ERR_OOM",
    [TPR_ERR_IO] = "TPR_ERR_IO",
    [TPR_ERR_FORMAT] = "TPR_ERR_FORMAT",
    [TPR_ERR_UNSUPPORTED] = "TPR_ERR_UNSUPPORTED",
    [TPR_ERR_COMM] = "TPR_ERR_COMM",
    [TPR_ERR_INTERNAL] = "TPR_ERR_INTERNAL",
};

const char *tpr_status_name(tpr_status s) {
  if ((unsigned)s >= TPR_STATUS_COUNT) return "TPR_ERR_UNKNOWN";
  return status_names[s];
}

const char *tpr_last_error(void) { return last_error; }

void tpr_clear_error(void) { last_error[0] = '\0'; }

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

tpr_status tpr__fail(tpr_status s, const char *file, int line, const char *fmt, ...) {
  int n = snprintf(last_error, sizeof last_error, "%s:%d: ", base_name(file), line);
  if (n < 0 || (size_t)n >= sizeof last_error) return s;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
  va_end(ap);
  return s;
}

tpr_status tpr__propagate(tpr_status s, const char *file, int line) {
  size_t used = strlen(last_error);
  if (used + 64 < sizeof last_error)
    snprintf(last_error + used, sizeof last_error - used, " (at %s:%d)", base_name(file), line);
  return s;
}
