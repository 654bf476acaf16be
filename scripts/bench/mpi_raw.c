// mpi_raw_bench: the collectives as a plain C program calls them, with no
// tpr in the process. Each rank mallocs a send and a receive buffer per size,
// fills the send buffer with values and clears the receive buffer (as any
// program that uses its results does), then calls MPI_Allreduce,
// MPI_Allgather or MPI_Reduce_scatter_block on them. MPI_Init (not
// MPI_Init_thread), MPI_COMM_WORLD, out of place.
//
// It is the reference `tpr bench comm` is held to (scripts/bench/comm.sh):
// the sizes, counts, flags and columns are tpr bench comm's (nccl-tests'
// conventions: per-rank counts rounded down to 16 bytes for all_gather and
// reduce_scatter; busbw = algbw * 2(n-1)/n or (n-1)/n; time = per-rank mean
// per iteration, averaged over ranks; --blocks K: the interquartile mean of
// K blocks of n/K iterations, as tpr bench comm --baseline reports).
//
//   mpirun -np N mpi_raw_bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]
//                              [-o all_reduce|all_gather|reduce_scatter] [--blocks K] [--json]
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER };
static const char *const op_names[] = {"all_reduce", "all_gather", "reduce_scatter"};

static double parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024.0;
  if (*end == 'M' || *end == 'm') v *= 1048576.0;
  if (*end == 'G' || *end == 'g') v *= 1073741824.0;
  return v;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int call(int op, const float *send, float *recv, int count) {
  switch (op) {
    case ALL_REDUCE: return MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case ALL_GATHER: return MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
    default: return MPI_Reduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  double minb = 8, maxb = 128.0 * 1048576.0;
  long factor = 2, iters = 20, warmup = 5, blocks = 1;
  int op = ALL_REDUCE, json = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) { json = 1; continue; }
    if (!v) goto usage;
    i++;
    if (!strcmp(a, "-b") || !strcmp(a, "--minbytes")) minb = parse_size(v);
    else if (!strcmp(a, "-e") || !strcmp(a, "--maxbytes")) maxb = parse_size(v);
    else if (!strcmp(a, "-f") || !strcmp(a, "--stepfactor")) factor = atol(v);
    else if (!strcmp(a, "-n") || !strcmp(a, "--iters")) iters = atol(v);
    else if (!strcmp(a, "-w") || !strcmp(a, "--warmup_iters")) warmup = atol(v);
    else if (!strcmp(a, "--blocks")) blocks = atol(v);
    else if (!strcmp(a, "-o") || !strcmp(a, "--op")) {
      op = -1;
      for (int k = 0; k < 3; k++)
        if (!strcmp(v, op_names[k])) op = k;
      if (op < 0) goto usage;
    } else goto usage;
  }
  if (minb < 4 || maxb < minb || factor < 2 || iters < 1 || warmup < 0 || blocks < 1) goto usage;
  if (blocks > iters) blocks = iters;
  long ipb = iters / blocks;
  double bus = op == ALL_REDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
  if (rank == 0 && !json)
    printf("# mpi_raw_bench: %s, %d rank(s), float sum, plain malloc'd buffers, MPI_COMM_WORLD\n"
           "# iters %ld warmup %ld blocks %ld; busbw = algbw * %.4g\n"
           "# %10s  %12s  %8s  %7s  %7s  %8s\n", op_names[op], n, iters, warmup, blocks, bus, "size (B)",
           "count", "time (us)", "algbw", "busbw", "min (us)");
  double *t = malloc((size_t)blocks * sizeof *t), *all = malloc((size_t)blocks * sizeof *all);
  for (double size = minb; size <= maxb; size *= (double)factor) {
    size_t count = (size_t)size / sizeof(float), base = (count / (size_t)n) & ~(size_t)3;
    size_t c = op == ALL_REDUCE ? count : base;
    size_t sendn = op == REDUCE_SCATTER ? c * (size_t)n : c, recvn = op == ALL_GATHER ? c * (size_t)n : c;
    size_t bytes = (sendn > recvn ? sendn : recvn) * sizeof(float);
    float *send = malloc(sendn * sizeof *send + 4), *recv = malloc(recvn * sizeof *recv + 4);
    if (!send || !recv) {
      fprintf(stderr, "mpi_raw_bench: out of memory at %zu bytes\n", bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < sendn; i++) send[i] = (float)((i + (size_t)rank) % 1000);
    memset(recv, 0, recvn * sizeof *recv);
    for (long i = 0; i < warmup; i++) call(op, send, recv, (int)c);
    for (long k = 0; k < blocks; k++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (long i = 0; i < ipb; i++) call(op, send, recv, (int)c);
      t[k] = (MPI_Wtime() - t0) / (double)ipb;
    }
    MPI_Allreduce(t, all, (int)blocks, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    qsort(all, (size_t)blocks, sizeof *all, cmp_dbl);
    double sum = 0;
    for (long k = blocks / 4; k < blocks - blocks / 4; k++) sum += all[k];
    double us = sum / (double)(blocks - 2 * (blocks / 4)) / n * 1e6, min_us = all[0] / n * 1e6;
    double algbw = (double)bytes / 1e3 / us;
    if (rank == 0 && json)
      printf("{\"kind\":\"result\",\"op\":\"%s\",\"size\":%zu,\"count\":%zu,\"time_us\":%.3f,\"algbw\":%.4f,"
             "\"busbw\":%.4f,\"min_time_us\":%.3f,\"ranks\":%d}\n", op_names[op], bytes, c, us, algbw, algbw * bus, min_us, n);
    else if (rank == 0)
      printf("%12zu  %12zu  %8.1f  %7.2f  %7.2f  %8.1f\n", bytes, c, us, algbw, algbw * bus, min_us);
    fflush(stdout);
    free(send);
    free(recv);
  }
  free(t);
  free(all);
  MPI_Finalize();
  return 0;
usage:
  if (rank == 0)
    fprintf(stderr, "usage: mpirun -np N mpi_raw_bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
                    "       [-o all_reduce|all_gather|reduce_scatter] [--blocks K] [--json]\n");
  MPI_Finalize();
  return 2;
}
