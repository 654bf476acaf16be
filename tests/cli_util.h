// Shared helpers for the tests that read and write files or run the built
// tpr binary (bin/tpr, beside the test binaries) as a subprocess.
#ifndef TPR_CLI_UTIL_H
#define TPR_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>

typedef struct run_result {
  int code;  // exit status, or -signal when killed by one
  char *out, *err;
} run_result;

// The whole file, NUL-terminated (caller frees); its length in *len if len.
// Fails the test, naming the path, if it cannot be opened.
char *tt_slurp(const char *path, size_t *len);
// Writes len bytes to path, replacing it; fails the test, naming the path.
void tt_spit(const char *path, const void *bytes, size_t len);
// A 1-D numpy .npy file of n int32 values ('<i4', version 1.0).
void tt_write_npy_i32(const char *path, const int32_t *v, int64_t n);
// "dir/name" in one of 8 rotating static buffers.
const char *tt_path(const char *dir, const char *name);
// The configs/ directory of the source tree, or $TPR_CONFIGS_DIR.
void tt_configs_dir(char *buf, size_t cap);
// This test binary's path (from /proc/self/exe); 0 on success, -1 if unknown.
int tt_self_exe(char *buf, size_t cap);
// The tpr binary beside this test binary; 0 on success, -1 (and a message
// naming `test`) if it is not built.
int tt_tpr_path(char *buf, size_t cap, const char *test);

// How tt_run starts a program: np > 0 under `mpirun -np np --oversubscribe`
// (the mpirun CMake found, TPR_MPIEXEC; leak checking off for the children,
// as Open MPI's components leak what LeakSanitizer cannot attribute);
// timeout_s > 0 under coreutils' timeout, failing the test if it hangs.
typedef struct tt_run_opts {
  int np;
  int timeout_s;
} tt_run_opts;
// Runs `exe args...` (args NULL-terminated) outside any launcher it was
// started from, stdin from /dev/null, stdout/stderr captured in
// tmp_dir/stdout and tmp_dir/stderr, TPR_NUM_THREADS=1, TPR_LOG_LEVEL unset.
// Fails the test on a sanitizer report. o may be NULL.
run_result tt_run(const char *exe, const char *tmp_dir, const char *const *args, const tt_run_opts *o);

// Runs `tpr args...` (args NULL-terminated, after argv[0]) with stdin from
// /dev/null and stdout/stderr captured in tmp_dir/stdout and tmp_dir/stderr,
// outside any MPI launcher (the self backend), TPR_NUM_THREADS=1 and
// TPR_LOG_LEVEL unset. Fails the test if stderr carries a sanitizer report.
run_result tt_run_tpr(const char *tpr, const char *tmp_dir, const char *const *args);
// Runs `mpirun -np np --oversubscribe exe args...` (args NULL-terminated)
// the same way; mpirun is the one CMake found (TPR_MPIEXEC).
run_result tt_run_mpi(int np, const char *exe, const char *tmp_dir, const char *const *args);
// The JSON object a successful --json run printed (r consumed: its output is
// freed); fails the test on a non-zero exit or output that is not an object.
struct cJSON;
struct cJSON *tt_json_of(run_result r);
// j[key] as a number; fails the test if it is missing or not a number.
double tt_json_num(const struct cJSON *j, const char *key);
// Frees r's captured output.
void tt_run_done(run_result *r);

#endif
