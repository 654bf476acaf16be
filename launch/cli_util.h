// Pieces shared by the subcommands: mesh flags, checkpoint plumbing, JSON
// output, timing and byte formatting.
#ifndef TPR_CLI_UTIL_H
#define TPR_CLI_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "launch/args.h"
#include "shard/loader.h"

// The mesh flags every checkpoint command takes; 0 means "not given".
typedef struct tpr_cli_mesh {
  int64_t tp, ep, etp, dp;
} tpr_cli_mesh;

// Checks the flags (tp required, each in [1, 2^24]); prints the problem with
// `usage` and returns false on bad usage.
bool tpr_cli_mesh_ok(const char *cmd, const tpr_cli_mesh *m, const char *usage);

// Sizes from the command line that a command multiplies (tokens of a step,
// rows of a batch): the product of v[0..n) through tpr_size_mul_checked, at
// most `limit`. Prints "cmd: NAMES: a x b x ... exceeds limit" and returns
// false when it does not fit, so nothing is computed from an overflowed size.
bool tpr_cli_sizes_ok(const char *cmd, const char *names, int n, const int64_t *v, int64_t limit);

// "source" (each tensor's own dtype) or a float dtype name (f32, bf16, f16).
bool tpr_cli_load_dtype(const char *cmd, const char *name, tpr_dtype *out);

// config.json of `model` and the plan of the mesh (bytes counted in bf16).
tpr_status tpr_cli_plan(const char *model, const tpr_cli_mesh *m, tpr_shard_plan *plan);

// Bytes and count of the *.safetensors files directly in dir.
uint64_t tpr_cli_safetensors_bytes(const char *dir, int *files);

// Prints j unformatted on one line and deletes it; false (with a message)
// when out of memory.
struct cJSON;
bool tpr_cli_print_json(struct cJSON *j);

double tpr_cli_now(void);  // monotonic seconds
// Progress lines (runtime/progress.h) from rank `rank` when it is 0 and its
// stderr reaches a terminal; stdout, --json included, is never touched.
void tpr_cli_progress(int rank);

// A repeatable data option's values joined by commas (train/tokens.h's list
// form: `--data a.npy --data b.npy` is `--data a.npy,b.npy`), malloc'ed;
// NULL when it was not given (or out of memory).
char *tpr_cli_join_data(const tpr_arg_list *l);
// The best of 3 sgemm 1024^3 on this process's BLAS threads, GFLOP/s: the
// rate GEMM work is compared with, measured in the same run.
double tpr_cli_sgemm_gflops(void);
// "1.2 GiB" (bytes with a binary unit, one decimal; whole bytes below 1 KiB)
const char *tpr_cli_bytes(uint64_t b, char *buf, size_t n);
// The same with `decimals` digits after the point.
const char *tpr_cli_bytes_prec(uint64_t b, int decimals, char *buf, size_t n);

#endif
