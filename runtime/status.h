// Error reporting for every fallible function in tpr.
//
// A function returns a tpr_status; on failure the message (with the file:line
// where it was raised) is kept per thread and read with tpr_last_error().
// Library code never exits or aborts on user error: it returns a status.
#ifndef TPR_STATUS_H
#define TPR_STATUS_H

#include <stdarg.h>

typedef enum tpr_status {
  TPR_OK = 0,
  TPR_ERR_INVALID_ARG,  // a caller passed something that cannot be right
  TPR_ERR_SHAPE,        // shapes do not fit the op
  TPR_ERR_DTYPE,        // dtype not supported by this op or backend
  TPR_ERR_OOM,          // allocation failed
  TPR_ERR_IO,           // file system or stream error
  TPR_ERR_FORMAT,       // malformed file, config or serialized program
  TPR_ERR_UNSUPPORTED,  // valid request this build or backend cannot serve
  TPR_ERR_COMM,         // collective or MPI failure
  TPR_ERR_INTERNAL,     // a bug in tpr: please report
  TPR_STATUS_COUNT
} tpr_status;

// Short stable name of a status ("TPR_ERR_SHAPE").
const char *tpr_status_name(tpr_status s);

// The message of the last error raised on this thread ("" if none).
const char *tpr_last_error(void);

// Forget the last error on this thread.
void tpr_clear_error(void);

// Records "file:line: message" as this thread's last error and returns s.
// Use through TPR_FAIL so file and line are filled in.
tpr_status tpr__fail(tpr_status s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// Appends " (at file:line)" context when an error propagates through TPR_CHECK,
// so the message reads as a short trace from the raise to the caller.
tpr_status tpr__propagate(tpr_status s, const char *file, int line);

#define TPR_FAIL(status, ...) tpr__fail((status), __FILE__, __LINE__, __VA_ARGS__)

// Return the status of `call` from the enclosing function if it failed.
#define TPR_CHECK(call)                                              \
  do {                                                               \
    tpr_status tpr__rc = (call);                                     \
    if (tpr__rc != TPR_OK) return tpr__propagate(tpr__rc, __FILE__, __LINE__); \
  } while (0)

// Store the status of `call` in `rc` and jump to `label` if it failed.
#define TPR_CHECK_GOTO(call, rc, label)                   \
  do {                                                    \
    (rc) = (call);                                        \
    if ((rc) != TPR_OK) {                                 \
      tpr__propagate((rc), __FILE__, __LINE__);           \
      goto label;                                         \
    }                                                     \
  } while (0)

#endif
