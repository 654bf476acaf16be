// The alpha-beta model of one collective: t = alpha * steps(n) + beta * bus_bytes,
// fitted by least squares on `tpr bench comm --json` rows.
//
// bus_bytes = size * bus_factor(op, n), with size as nccl-tests reports it
// (the larger of the send and receive buffers) and nccl-tests' bus factors
// (doc/PERFORMANCE.md): all_reduce 2(n-1)/n; all_gather, reduce_scatter and
// all_to_all (n-1)/n; broadcast and sendrecv 1. With these factors a ring's
// bytes per link are the same for every n, so one beta (seconds per bus byte,
// 1 / bus bandwidth) fits the rows of every rank count at once.
// steps(n) = ceil(log2 n) is the latency term's growth: the rounds of a
// recursive-doubling or tree algorithm (0 at n = 1, where nothing is sent).
#ifndef TPR_SCALE_ALPHABETA_H
#define TPR_SCALE_ALPHABETA_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/status.h"

typedef enum tpr_coll {
  TPR_COLL_ALL_REDUCE,
  TPR_COLL_ALL_GATHER,
  TPR_COLL_REDUCE_SCATTER,
  TPR_COLL_ALL_TO_ALL,
  TPR_COLL_BROADCAST,
  TPR_COLL_COUNT
} tpr_coll;

const char *tpr_coll_name(tpr_coll c);  // bench comm's op names ("all_reduce")
// -1 when the name is none of them (sendrecv included: no step issues it).
int tpr_coll_from_name(const char *name);

// nccl-tests' bus factor of op at n ranks (0 at n <= 1: no bytes move).
double tpr_scale_bus_factor(tpr_coll op, int n);
typedef double (*tpr_bus_factor_fn)(tpr_coll op, int n);

// ceil(log2 n): latency rounds.
double tpr_scale_latency_steps(int n);

// Two regimes where one line does not fit: an MPI library switches
// algorithms (and messages outgrow the caches) as the size grows, so calls of
// at least `split` bytes use their own alpha_large and beta_large.
typedef struct tpr_ab {
  double alpha;   // seconds per latency round
  double beta;    // seconds per bus byte (1 / bus bandwidth)
  double rms_rel; // root-mean-square relative residual of the fit
  int points;     // rows used (0: not fitted)
  double split;   // bytes (nccl-tests' size) from which the large regime holds; 0: one regime
  double alpha_large, beta_large;
} tpr_ab;

// Time of one call of op moving `size` bytes (nccl-tests' size) over n ranks.
double tpr_ab_time(const tpr_ab *ab, tpr_coll op, int n, double size);

typedef struct tpr_comm_sample {
  tpr_coll op;
  int ranks;
  double size;    // bytes (nccl-tests' size column)
  double time_s;
  char transport[16];  // bench comm's backend ("mpi", "nccl", "self")
} tpr_comm_sample;

// Least squares of time = alpha * steps(n) + beta * size * factor(op, n) over
// the samples of one op and transport (factor NULL: tpr_scale_bus_factor);
// ranks > 0 keeps only the rows measured at that many ranks (a fit for that
// group size alone), 0 pools every rank count.
// Weighted by 1/time so small and large messages count alike (relative
// error). Fewer than two usable rows, or rows that cannot separate alpha from
// beta, are TPR_ERR_INVALID_ARG naming the op.
// Where one line leaves an rms relative residual over 2%, the fit also tries
// every row size as the split between two regimes (each fitted alone, each
// with at least two sizes and beta > 0; the small one's alpha >= 0, the large
// one's time positive from the split on) and keeps the best split when
// it cuts the rms residual by at least a quarter; rms_rel is then the
// two-regime fit's.
tpr_status tpr_scale_fit_ab(const tpr_comm_sample *s, size_t n, tpr_coll op, const char *transport, int ranks,
                            tpr_bus_factor_fn factor, tpr_ab *out);

// Appends the rows of a `tpr bench comm --json` output file (header lines
// name op, ranks and backend; result lines carry size and time_us).
// *samples is realloc'ed; malformed lines are TPR_ERR_FORMAT with path:line.
tpr_status tpr_scale_read_comm(const char *path, tpr_comm_sample **samples, size_t *n);

#endif
