// tpr bench comm: the collectives' bandwidth in the nccl-tests format, and
// with --baseline the same calls through raw MPI on the same communicator.
//
// Conventions follow NVIDIA/nccl-tests exactly (src/common.cu and the
// per-collective src/*.cu; doc/PERFORMANCE.md explains the bus factors):
//  - sizes step from -b by *f (or +i) while <= -e; each collective turns the
//    requested size into counts with its *GetCollByteCount: all_reduce,
//    broadcast and sendrecv use count = size / eltsize; all_gather,
//    reduce_scatter and alltoall a per-rank count
//    base = (count / nranks) & -(16 / eltsize), rounded down to 16 bytes;
//  - "size" is max(send, recv) bytes (setupArgs + writeBenchmarkLinePreamble:
//    the total for all_gather, reduce_scatter and alltoall) and "count" is
//    the count argument of the call (paramcount: per rank for those three);
//  - algbw = size / time for every op (AllGatherGetBw etc. multiply the
//    per-rank count back by nranks), busbw = algbw * factor: all_reduce
//    2(n-1)/n, all_gather, reduce_scatter and alltoall (n-1)/n, broadcast
//    and sendrecv 1;
//  - time is each rank's mean over the timed iterations, averaged over ranks
//    (BenchTime: Allreduce(args, &deltaSec, average) with average = 1);
//    #wrong is summed over ranks (Allreduce(..., /*sum*/4)).
// Beyond nccl-tests: --blocks splits the timed iterations into blocks and
// reports the interquartile mean of the block times; --baseline alternates
// one-iteration blocks of tpr's call and the raw MPI call, which runs as a
// plain program would: on buffers of its own, malloc'd and filled per size,
// and MPI_COMM_WORLD (bench_comm_mpi.c; see measure).
// Every op runs out of place except broadcast, which runs in place as
// MPI_Bcast does.
#include "launch/bench_comm.h"
#include "launch/bench_comm_mpi.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/world.h"
#include "runtime/backend_cuda.h"

static const struct {
  const char *name, *alias, *mpi_call;
  bool reduces, per_rank;  // takes --redop; counts are nccl-tests' per-rank base
} ops[OP_COUNT] = {
    [OP_ALL_REDUCE] = {"all_reduce", "allreduce", "MPI_Allreduce", true, false},
    [OP_ALL_GATHER] = {"all_gather", "allgather", "MPI_Allgather", false, true},
    [OP_REDUCE_SCATTER] = {"reduce_scatter", "reducescatter", "MPI_Reduce_scatter_block", true, true},
    [OP_ALL_TO_ALL] = {"all_to_all", "alltoall", "MPI_Alltoall", false, true},
    [OP_BROADCAST] = {"broadcast", "bcast", "MPI_Bcast", false, false},
    [OP_SENDRECV] = {"sendrecv", "send_recv", "MPI_Sendrecv", false, false},
};

static const struct {
  const char *name, *alias;  // nccl-tests' name, tpr's name
  tpr_dtype dt;
} types[] = {
    {"float", "f32", TPR_F32}, {"bfloat16", "bf16", TPR_BF16}, {"half", "f16", TPR_F16},
    {"int32", "i32", TPR_I32}, {"int64", "i64", TPR_I64},
};
#define N_TYPES (sizeof types / sizeof types[0])

static const char *const redop_names[] = {[TPR_SUM] = "sum", [TPR_MAX] = "max", [TPR_MIN] = "min"};

// The counts of one row, as nccl-tests' *GetCollByteCount computes them.
typedef struct shape {
  size_t count;       // the call's count argument ("count" column)
  size_t send, recv;  // elements in the send and the receive buffer
  uint64_t bytes;     // "size" column: max(send, recv) bytes; algbw = bytes / time
} shape;

typedef struct bench {
  tpr_world *w;
  int rank, n;
  bench_op op;
  tpr_dtype dt;
  size_t es;  // element size
  const char *type_name;
  tpr_red_op redop;
  int root;
  uint64_t minb, maxb, stepb;
  int64_t factor, iters, warmup, blocks, ipb;  // ipb: iterations per timed block
  bool check, json, baseline;
  int64_t max_blocks;  // > blocks: add blocks for fast sizes (see measure)
  // Buffers of `cap` bytes each. With nccl, send/recv are device memory and
  // hsend/hrecv host staging for the check; otherwise they are the same.
  size_t cap;
  void *send, *recv, *hsend, *hrecv;
  tpr_backend *dev;
  bench_mpi m;  // the baseline: its own buffers, MPI_COMM_WORLD
  int64_t *t;  // (2 blocks + 2) block times and #wrong, summed over ranks
  uint64_t red_mod, mov_mod;  // input values are integers below these (exact in every dtype)
} bench;

// ---- sizes and bandwidth ---------------------------------------------------

static shape shape_of(const bench *b, uint64_t size) {
  size_t count = (size_t)(size / b->es), n = (size_t)b->n;
  size_t base = (count / n) & ~(16 / b->es - 1);  // nccl-tests: (count/nranks) & -(16/eltSize)
  shape s = {.count = count, .send = count, .recv = count};
  if (b->op == OP_ALL_GATHER) s = (shape){.count = base, .send = base, .recv = base * n};
  if (b->op == OP_REDUCE_SCATTER) s = (shape){.count = base, .send = base * n, .recv = base};
  if (b->op == OP_ALL_TO_ALL) s = (shape){.count = base, .send = base * n, .recv = base * n};
  s.bytes = (uint64_t)(s.send > s.recv ? s.send : s.recv) * b->es;
  return s;
}

// busbw / algbw (nccl-tests' *GetBw; doc/PERFORMANCE.md).
static double bus_factor(bench_op op, int n) {
  if (op == OP_ALL_REDUCE) return 2.0 * (n - 1) / n;
  if (op == OP_BROADCAST || op == OP_SENDRECV) return 1.0;
  return (double)(n - 1) / n;
}

// ---- the calls ---------------------------------------------------------------

static tpr_status copy_local(bench *b, void *dst, const void *src, size_t bytes) {
  if (b->dev) return b->dev->vt->copy_device(b->dev->ctx, dst, src, bytes);
  memcpy(dst, src, bytes);
  return TPR_OK;
}

static tpr_status run_tpr(bench *b, const shape *s) {
  tpr_comm_t c = b->w->comm;
  switch (b->op) {
    case OP_ALL_REDUCE: return tpr_comm_all_reduce(c, b->send, b->recv, s->count, b->dt, b->redop);
    case OP_ALL_GATHER: return tpr_comm_all_gather(c, b->send, b->recv, s->count, b->dt);
    case OP_REDUCE_SCATTER: return tpr_comm_reduce_scatter(c, b->send, b->recv, s->count, b->dt, b->redop);
    case OP_ALL_TO_ALL: return tpr_comm_all_to_all(c, b->send, b->recv, s->count, b->dt);
    case OP_BROADCAST: return tpr_comm_broadcast(c, b->recv, b->recv, s->count, b->dt, b->root);
    case OP_SENDRECV: {
      // nccl-tests' ring: send to rank + 1, receive from rank - 1. tpr's p2p
      // calls block, so even ranks send first and odd ranks receive first.
      if (b->n == 1) return copy_local(b, b->recv, b->send, s->count * b->es);
      int next = (b->rank + 1) % b->n, prev = (b->rank + b->n - 1) % b->n;
      if (b->rank % 2 == 0) {
        TPR_CHECK(tpr_comm_send(c, b->send, s->count, b->dt, next));
        return tpr_comm_recv(c, b->recv, s->count, b->dt, prev);
      }
      TPR_CHECK(tpr_comm_recv(c, b->recv, s->count, b->dt, prev));
      return tpr_comm_send(c, b->send, s->count, b->dt, next);
    }
    default: return TPR_FAIL(TPR_ERR_INTERNAL, "bench comm: op %d", (int)b->op);
  }
}

static tpr_status run_mpi(bench *b, const shape *s) { return bench_mpi_run(&b->m, s->count); }

// ---- data check --------------------------------------------------------------

// Rank r's input element i in check round `epoch`: small integers, so sums,
// maxima and minima are exact in every dtype and the expected output is known.
static double in_value(const bench *b, int r, size_t i, int epoch) {
  if (ops[b->op].reduces) return (double)((i + 5u * (uint64_t)r + 7u * (uint64_t)epoch) % b->red_mod);
  return (double)((i + 37u * (uint64_t)r + 11u * (uint64_t)epoch) % b->mov_mod);
}

static double reduced(const bench *b, size_t i, int epoch) {
  double v = in_value(b, 0, i, epoch);
  for (int q = 1; q < b->n; q++) {
    double x = in_value(b, q, i, epoch);
    v = b->redop == TPR_SUM ? v + x : b->redop == TPR_MAX ? fmax(v, x) : fmin(v, x);
  }
  return v;
}

// Element j of this rank's output.
static double expected(const bench *b, const shape *s, size_t j, int epoch) {
  size_t c = s->count ? s->count : 1, q = j / c, i = j % c;
  switch (b->op) {
    case OP_ALL_REDUCE: return reduced(b, j, epoch);
    case OP_REDUCE_SCATTER: return reduced(b, (size_t)b->rank * s->count + j, epoch);
    case OP_ALL_GATHER: return in_value(b, (int)q, i, epoch);
    case OP_ALL_TO_ALL: return in_value(b, (int)q, (size_t)b->rank * s->count + i, epoch);
    case OP_BROADCAST: return in_value(b, b->root, j, epoch);
    default: return in_value(b, (b->rank + b->n - 1) % b->n, j, epoch);
  }
}

// One call with fresh inputs; *wrong = elements of this rank's output that differ.
// The baseline's own buffers hold its inputs and outputs (mpi: true).
static tpr_status check_once(bench *b, const shape *s, bool mpi, int epoch, int64_t *wrong) {
  size_t in_bytes = s->send * b->es, out_bytes = s->recv * b->es;
  void *hsend = mpi ? b->m.send : b->hsend, *hrecv = mpi ? b->m.recv : b->hrecv;
  memset(hrecv, 0xff, out_bytes);  // NaN / -1: never an expected value
  if (b->op == OP_BROADCAST && b->rank == b->root)
    for (size_t i = 0; i < s->recv; i++) tpr_dtype_store(hrecv, b->dt, i, in_value(b, b->rank, i, epoch));
  if (b->op != OP_BROADCAST)
    for (size_t i = 0; i < s->send; i++) tpr_dtype_store(hsend, b->dt, i, in_value(b, b->rank, i, epoch));
  if (b->dev && !mpi) {
    TPR_CHECK(b->dev->vt->copy_from_host(b->dev->ctx, b->send, b->hsend, in_bytes));
    TPR_CHECK(b->dev->vt->copy_from_host(b->dev->ctx, b->recv, b->hrecv, out_bytes));
  }
  TPR_CHECK(tpr_comm_barrier(b->w->host));
  TPR_CHECK(mpi ? run_mpi(b, s) : run_tpr(b, s));
  if (b->dev && !mpi) TPR_CHECK(b->dev->vt->copy_to_host(b->dev->ctx, b->hrecv, b->recv, out_bytes));
  int64_t bad = 0;
  for (size_t j = 0; j < s->recv; j++) bad += tpr_dtype_load(hrecv, b->dt, j) != expected(b, s, j, epoch);
  *wrong = bad;
  return TPR_OK;
}

// ---- timing ------------------------------------------------------------------

typedef struct row {
  shape s;
  double us, algbw, busbw, mpi_us, mpi_algbw, mpi_busbw;
  double ratio;  // busbw / mpi busbw, as mpi time / time (defined for size 0 and one rank too)
  int64_t wrong, mpi_wrong;  // -1: not checked
  int64_t blocks;            // timed blocks per side
} row;

static tpr_status time_block(bench *b, const shape *s, bool mpi, int64_t *ns) {
  TPR_CHECK(tpr_comm_barrier(b->w->host));
  double t0 = tpr_cli_now();
  for (int64_t i = 0; i < b->ipb; i++) TPR_CHECK(mpi ? run_mpi(b, s) : run_tpr(b, s));
  *ns = (int64_t)((tpr_cli_now() - t0) * 1e9);
  return TPR_OK;
}

static int cmp_i64(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, c = *(const int64_t *)y;
  return (a > c) - (a < c);
}

// The per-iteration time (us) of the blocks, averaged over ranks: the
// interquartile mean (the mean of the middle half once sorted), as robust to
// a burst of load as the median and, measured here, half as noisy in the
// tpr / MPI ratio. One block: its time. Sorts rank_sum_ns in place.
static double iqm_us(int64_t *rank_sum_ns, int64_t blocks, int n, int64_t ipb) {
  qsort(rank_sum_ns, (size_t)blocks, sizeof rank_sum_ns[0], cmp_i64);
  double sum = 0;
  for (int64_t k = blocks / 4; k < blocks - blocks / 4; k++) sum += (double)rank_sum_ns[k];
  return sum / (double)(blocks - 2 * (blocks / 4)) / n / (double)ipb * 1e-3;
}

// Host buffers (mpi, self) are allocated per size, exactly as big as the
// size needs, and touched just before they are timed (send filled, recv
// cleared), as the baseline's and a plain program's: buffers allocated once
// at the largest size and zeroed at start-up ran 10-13% slower at 16-64 MiB
// than fresh ones in the same process (docs/collectives.md).
static tpr_status host_buffers(bench *b, const shape *s) {
  free(b->hsend);
  free(b->hrecv);
  size_t in = s->send * b->es, out = s->recv * b->es;
  b->hsend = malloc(in ? in : 1);
  b->hrecv = malloc(out ? out : 1);
  if (!b->hsend || !b->hrecv) return TPR_FAIL(TPR_ERR_OOM, "bench comm: buffers of %zu and %zu bytes", in, out);
  for (size_t i = 0; i < s->send; i++) tpr_dtype_store(b->hsend, b->dt, i, in_value(b, b->rank, i, 0));
  memset(b->hrecv, 0, out);
  b->send = b->hsend, b->recv = b->hrecv;
  return TPR_OK;
}

// Warm-up, then `blocks` timed blocks of `ipb` iterations. With the baseline,
// tpr and MPI blocks alternate T M | M T | T M ... so load from the rest of
// the machine falls on both alike; the blocks' interquartile mean is reported.
// The baseline's buffers are fresh per size, filled (send) and cleared
// (recv) in that order, as a plain program touches them.
static tpr_status measure(bench *b, uint64_t size, int epoch, row *r) {
  *r = (row){.s = shape_of(b, size), .wrong = -1, .mpi_wrong = -1};
  const shape *s = &r->s;
  if (!b->dev) TPR_CHECK(host_buffers(b, s));
  if (b->baseline) {
    TPR_CHECK(bench_mpi_buffers(&b->m, s->send * b->es, s->recv * b->es));
    for (size_t i = 0; i < s->send; i++) tpr_dtype_store(b->m.send, b->dt, i, in_value(b, b->rank, i, 0));
    memset(b->m.recv, 0, s->recv * b->es);
  }
  double t0 = tpr_cli_now();
  for (int64_t i = 0; i < b->warmup; i++) {
    TPR_CHECK(run_tpr(b, s));
    if (b->baseline) TPR_CHECK(run_mpi(b, s));
  }
  int64_t nb = b->blocks, *t = b->t;  // (2 nb + 2): tpr blocks, mpi blocks, #wrong tpr, #wrong mpi
  if (b->max_blocks > nb && b->warmup > 0) {
    // Fast sizes get more blocks, up to ~0.5 s per side: a burst of load
    // then spans many alternations. Every rank must agree, so the warm-up
    // time is averaged over ranks first.
    int64_t ns = (int64_t)((tpr_cli_now() - t0) * 1e9);
    TPR_CHECK(tpr_comm_all_reduce(b->w->host, &ns, &ns, 1, TPR_I64, TPR_SUM));
    double per_block = (double)ns / b->n / (double)(2 * b->warmup) * (double)b->ipb;
    double want = per_block > 0 ? 0.5e9 / per_block : (double)b->max_blocks;
    nb = want > (double)b->max_blocks ? b->max_blocks : want > (double)nb ? (int64_t)want : nb;
  }
  r->blocks = nb;
  memset(t, 0, (size_t)(2 * nb + 2) * sizeof *t);
  for (int64_t k = 0; k < nb; k++) {
    bool mpi_first = b->baseline && k % 2 == 1;
    if (mpi_first) TPR_CHECK(time_block(b, s, true, &t[nb + k]));
    TPR_CHECK(time_block(b, s, false, &t[k]));
    if (b->baseline && !mpi_first) TPR_CHECK(time_block(b, s, true, &t[nb + k]));
  }
  int64_t wrong[2] = {0, 0};
  if (b->check) TPR_CHECK(check_once(b, s, false, epoch, &wrong[0]));
  if (b->check && b->baseline) TPR_CHECK(check_once(b, s, true, epoch, &wrong[1]));
  t[2 * nb] = wrong[0], t[2 * nb + 1] = wrong[1];
  TPR_CHECK(tpr_comm_all_reduce(b->w->host, t, t, (size_t)(2 * nb + 2), TPR_I64, TPR_SUM));
  double f = bus_factor(b->op, b->n);
  if (b->check) r->wrong = t[2 * nb];
  if (b->check && b->baseline) r->mpi_wrong = t[2 * nb + 1];
  r->us = iqm_us(t, nb, b->n, b->ipb);
  r->algbw = (double)s->bytes / 1e9 / (r->us * 1e-6);
  r->busbw = r->algbw * f;
  if (b->baseline) {
    r->mpi_us = iqm_us(t + nb, nb, b->n, b->ipb);
    r->mpi_algbw = (double)s->bytes / 1e9 / (r->mpi_us * 1e-6);
    r->mpi_busbw = r->mpi_algbw * f;
    r->ratio = r->mpi_us / r->us;
  }
  return TPR_OK;
}

// ---- output ------------------------------------------------------------------

static const char *fmt_us(double us, char *buf, size_t n) {  // nccl-tests' precision steps
  snprintf(buf, n, us >= 10000.0 ? "%.0f" : us >= 100.0 ? "%.1f" : "%.2f", us);
  return buf;
}

static const char *redop_col(const bench *b) { return ops[b->op].reduces ? redop_names[b->redop] : "none"; }
static int root_col(const bench *b) { return b->op == OP_BROADCAST ? b->root : -1; }

static void print_header(const bench *b) {
  if (b->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kind", "header");
    cJSON_AddStringToObject(j, "bench", "comm");
    cJSON_AddStringToObject(j, "op", ops[b->op].name);
    cJSON_AddStringToObject(j, "type", b->type_name);
    cJSON_AddStringToObject(j, "redop", redop_col(b));
    cJSON_AddNumberToObject(j, "root", root_col(b));
    cJSON_AddNumberToObject(j, "ranks", b->n);
    cJSON_AddStringToObject(j, "backend", tpr_comm_backend(b->w->comm));
    cJSON_AddNumberToObject(j, "minbytes", (double)b->minb);
    cJSON_AddNumberToObject(j, "maxbytes", (double)b->maxb);
    cJSON_AddNumberToObject(j, "stepfactor", (double)b->factor);
    cJSON_AddNumberToObject(j, "stepbytes", (double)b->stepb);
    cJSON_AddNumberToObject(j, "iters", (double)b->iters);
    cJSON_AddNumberToObject(j, "warmup_iters", (double)b->warmup);
    cJSON_AddNumberToObject(j, "blocks", (double)b->blocks);
    cJSON_AddNumberToObject(j, "max_blocks", (double)b->max_blocks);
    cJSON_AddNumberToObject(j, "iters_per_block", (double)b->ipb);
    cJSON_AddNumberToObject(j, "check", b->check);
    cJSON_AddBoolToObject(j, "baseline", b->baseline);
    if (b->baseline) cJSON_AddStringToObject(j, "mpi_call", ops[b->op].mpi_call);
    cJSON_AddNumberToObject(j, "busbw_factor", bus_factor(b->op, b->n));
    tpr_cli_print_json(j);
    return;
  }
  printf("# tpr bench comm: %s, %d rank(s), backend %s, type %s, redop %s, root %d\n", ops[b->op].name, b->n,
         tpr_comm_backend(b->w->comm), b->type_name, redop_col(b), root_col(b));
  if (b->factor)
    printf("# minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %" PRId64 "(factor)", b->minb, b->maxb, b->factor);
  else
    printf("# minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %" PRIu64 "(bytes)", b->minb, b->maxb, b->stepb);
  printf(" warmup iters: %" PRId64 " iters: %" PRId64 " validation: %d\n", b->warmup, b->iters, b->check);
  printf("# busbw = algbw * %.4g (nccl-tests); time: per-rank mean per iteration, averaged over ranks",
         bus_factor(b->op, b->n));
  if (b->max_blocks > b->blocks)
    printf("; interquartile mean of %" PRId64 " to %" PRId64 " blocks (as many as fill 0.5 s) of %" PRId64
           " iteration(s)", b->blocks, b->max_blocks, b->ipb);
  else if (b->blocks > 1)
    printf("; interquartile mean of %" PRId64 " blocks of %" PRId64 " iteration(s)", b->blocks, b->ipb);
  printf("\n");
  if (b->baseline)
    printf("# baseline: %s on MPI_COMM_WORLD and its own malloc'd buffers, blocks alternating with tpr's; "
           "ratio = busbw / mpi busbw\n", ops[b->op].mpi_call);
  printf("#\n# %10s  %12s  %8s  %6s  %6s  %8s  %7s  %7s  %6s", "size", "count", "type", "redop", "root", "time",
         "algbw", "busbw", "#wrong");
  if (b->baseline) printf("  %8s  %9s  %6s  %6s", "mpi time", "mpi busbw", "#wrong", "ratio");
  printf("\n# %10s  %12s  %8s  %6s  %6s  %8s  %7s  %7s  %6s", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
         "(GB/s)", "");
  if (b->baseline) printf("  %8s  %9s  %6s  %6s", "(us)", "(GB/s)", "", "");
  printf("\n");
  fflush(stdout);
}

static void print_row(const bench *b, const row *r) {
  if (b->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kind", "result");
    cJSON_AddStringToObject(j, "op", ops[b->op].name);
    cJSON_AddNumberToObject(j, "size", (double)r->s.bytes);
    cJSON_AddNumberToObject(j, "count", (double)r->s.count);
    cJSON_AddStringToObject(j, "type", b->type_name);
    cJSON_AddStringToObject(j, "redop", redop_col(b));
    cJSON_AddNumberToObject(j, "root", root_col(b));
    cJSON_AddNumberToObject(j, "time_us", r->us);
    cJSON_AddNumberToObject(j, "algbw", r->algbw);
    cJSON_AddNumberToObject(j, "busbw", r->busbw);
    cJSON_AddNumberToObject(j, "blocks", (double)r->blocks);
    if (r->wrong >= 0) cJSON_AddNumberToObject(j, "wrong", (double)r->wrong);
    if (b->baseline) {
      cJSON_AddNumberToObject(j, "mpi_time_us", r->mpi_us);
      cJSON_AddNumberToObject(j, "mpi_algbw", r->mpi_algbw);
      cJSON_AddNumberToObject(j, "mpi_busbw", r->mpi_busbw);
      if (r->mpi_wrong >= 0) cJSON_AddNumberToObject(j, "mpi_wrong", (double)r->mpi_wrong);
      cJSON_AddNumberToObject(j, "ratio", r->ratio);
    }
    tpr_cli_print_json(j);
    return;
  }
  char t[32], w[24];
  snprintf(w, sizeof w, "%" PRId64, r->wrong);
  printf("%12" PRIu64 "  %12zu  %8s  %6s  %6d  %8s  %7.2f  %7.2f  %6s", r->s.bytes, r->s.count, b->type_name,
         redop_col(b), root_col(b), fmt_us(r->us, t, sizeof t), r->algbw, r->busbw, r->wrong >= 0 ? w : "N/A");
  if (b->baseline) {
    snprintf(w, sizeof w, "%" PRId64, r->mpi_wrong);
    printf("  %8s  %9.2f  %6s  %6.3f", fmt_us(r->mpi_us, t, sizeof t), r->mpi_busbw, r->mpi_wrong >= 0 ? w : "N/A",
           r->ratio);
  }
  printf("\n");
  fflush(stdout);
}

// ---- one op over all sizes -----------------------------------------------------

static tpr_status run_op(bench *b, bench_op op, int64_t *total_wrong) {
  int64_t wrong = 0;
  b->op = op;
  uint64_t exact = b->dt == TPR_BF16 ? 256 : b->dt == TPR_F16 ? 2048 : (uint64_t)1 << 24;
  b->red_mod = exact / (uint64_t)b->n + 1;
  if (b->red_mod > 65521) b->red_mod = 65521;
  if (b->red_mod < 2) b->red_mod = 2;
  b->mov_mod = b->dt == TPR_BF16 ? 251 : b->dt == TPR_F16 ? 2039 : 65521;
  if (b->baseline) bench_mpi_setup(&b->m, op, ops[op].mpi_call, b->dt, b->redop, b->root);
  if (b->rank == 0) print_header(b);
  double sum = 0, mpi_sum = 0, min_ratio = INFINITY;
  int rows = 0, epoch = 1;
  for (uint64_t size = b->minb; size <= b->maxb; epoch++) {
    row r;
    TPR_CHECK(measure(b, size, epoch, &r));
    if (b->rank == 0) print_row(b, &r);
    sum += r.busbw, mpi_sum += r.mpi_busbw, rows++;
    if (b->baseline && r.ratio < min_ratio) min_ratio = r.ratio;
    wrong += (r.wrong > 0 ? r.wrong : 0) + (r.mpi_wrong > 0 ? r.mpi_wrong : 0);
    if (b->factor ? size > b->maxb / (uint64_t)b->factor : size > b->maxb - b->stepb) break;
    size = b->factor ? size * (uint64_t)b->factor : size + b->stepb;
  }
  if (b->rank == 0 && !b->json) {
    printf("# Out of bounds values : %" PRId64 " %s\n", wrong, wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g\n", rows ? sum / rows : 0.0);
    if (b->baseline) printf("# Avg mpi bus bandwidth: %g\n# Min ratio            : %.3f\n", rows ? mpi_sum / rows : 0.0,
                            isfinite(min_ratio) ? min_ratio : 0.0);
    printf("#\n");
    fflush(stdout);
  }
  *total_wrong += wrong;
  return TPR_OK;
}

// ---- flags -----------------------------------------------------------------------

// nccl-tests' sizes: a number with an optional K, M or G (2^10, 2^20, 2^30).
static bool parse_bytes(const char *text, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || errno || !isfinite(v) || v < 0) return false;
  double unit = 1;
  if (*end) {
    int u = tolower((unsigned char)*end++);
    unit = u == 'k' ? 1024.0 : u == 'm' ? 1048576.0 : u == 'g' ? 1073741824.0 : 0;
    if (!unit || *end) return false;
  }
  v *= unit;
  if (v != floor(v) || v > 0x1p60) return false;
  *out = (uint64_t)v;
  return true;
}

// nccl-tests' short flags (-b 1M, -b1M) become the long ones tpr_args_parse knows.
static const struct {
  char c;
  const char *name;
} shorts[] = {{'b', "minbytes"}, {'e', "maxbytes"}, {'i', "stepbytes"}, {'f', "stepfactor"}, {'o', "op"},
              {'d', "datatype"}, {'r', "redop"},    {'n', "iters"},     {'w', "warmup_iters"}, {'c', "check"}};

static char **translate_shorts(int argc, char **argv) {
  char **out = calloc((size_t)argc + 1, sizeof *out);
  if (!out) return NULL;
  bool value_next = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    out[i] = strdup(i == 0 ? "tpr bench comm" : a);
    if (i == 0 || value_next) {
      value_next = false;
    } else if (a[0] == '-' && a[1] && a[1] != '-') {
      for (size_t k = 0; k < sizeof shorts / sizeof shorts[0]; k++) {
        if (a[1] != shorts[k].c) continue;
        size_t len = strlen(shorts[k].name) + strlen(a + 2) + 4;
        free(out[i]);
        out[i] = malloc(len);
        if (out[i]) snprintf(out[i], len, a[2] ? "--%s=%s" : "--%s", shorts[k].name, a + 2);
        value_next = !a[2];
        break;
      }
    } else if (strncmp(a, "--", 2) == 0 && !strchr(a, '=')) {
      value_next = strcmp(a, "--json") != 0 && strcmp(a, "--baseline") != 0 && strcmp(a, "--help") != 0;
    }
    if (!out[i]) {
      for (int k = 0; k <= i; k++) free(out[k]);
      free(out);
      return NULL;
    }
  }
  return out;
}

static void free_argv(char **v, int argc) {
  for (int i = 0; v && i < argc; i++) free(v[i]);
  free(v);
}

static int usage_error(const char *fmt, const char *a, const char *hint) {
  fprintf(stderr, "tpr bench comm: ");
  fprintf(stderr, fmt, a);
  fprintf(stderr, "%s%s\n(tpr bench comm --help lists the options)\n", hint ? "\n" : "", hint ? hint : "");
  return 2;
}

static const char usage[] =
    "usage: [mpirun -np N] tpr bench comm [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-o OP] [-d TYPE] [-r REDOP]\n"
    "                                     [-n ITERS] [-w WARMUP] [-c 0|1] [--root R] [--baseline] [--json]\n\n"
    "Times each collective at sizes MIN, MIN*FACTOR, ... <= MAX (or MIN, MIN+STEP, ...) and prints nccl-tests'\n"
    "columns: size (B), count (elements), type, redop, root, time (us), algbw and busbw (GB/s), #wrong.\n"
    "algbw = size / time; busbw = algbw * 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and\n"
    "all_to_all, 1 for broadcast and sendrecv (nccl-tests doc/PERFORMANCE.md). size is the larger of the send\n"
    "and receive buffers (the total for all_gather, reduce_scatter, all_to_all, whose count is per rank and\n"
    "rounded down to 16 bytes as nccl-tests does). Sizes take K, M, G (binary). Short flags are nccl-tests'\n"
    "(-b -e -i -f -n -w -c -d), except -o picks the collective and -r the reduction (nccl-tests: -o redop,\n"
    "-r root). With --baseline every size also runs through raw MPI as a plain program calls it (MPI_COMM_WORLD,\n"
    "buffers of its own, malloc'd and filled per size), in blocks alternating with tpr's, and adds mpi time,\n"
    "mpi busbw, its #wrong and ratio = busbw / mpi busbw.\n"
    "Ops run out of place except broadcast (in place, as MPI_Bcast); sendrecv sends to rank+1 and receives\n"
    "from rank-1. Exit 1 if any element is wrong.";

int tpr_bench_comm(int argc, char **argv) {
  const char *minb_s = "8", *maxb_s = "128M", *stepb_s = NULL, *op_s = "all_reduce", *type_s = "float",
             *redop_s = "sum";
  int64_t factor = -1, iters = -1, warmup = 5, check = 1, root = 0, blocks = 0;
  bool json = false, baseline = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  const tpr_arg args[] = {
      {"minbytes", TPR_ARG_STR, &minb_s, "-b: smallest size in bytes (default 8)"},
      {"maxbytes", TPR_ARG_STR, &maxb_s, "-e: largest size in bytes (default 128M)"},
      {"stepfactor", TPR_ARG_INT, &factor, "-f: multiply the size by this, >= 2 (default 2)"},
      {"stepbytes", TPR_ARG_STR, &stepb_s, "-i: add this many bytes instead of -f"},
      {"op", TPR_ARG_STR, &op_s,
       "-o: all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|sendrecv|all (default all_reduce)"},
      {"datatype", TPR_ARG_STR, &type_s,
       "-d: float|bfloat16|half|int32|int64 (or f32|bf16|f16|i32|i64; default float)"},
      {"redop", TPR_ARG_STR, &redop_s, "-r: sum|max|min for all_reduce and reduce_scatter (default sum)"},
      {"iters", TPR_ARG_INT, &iters, "-n: timed iterations per size (default 20; 100 with --baseline)"},
      {"warmup_iters", TPR_ARG_INT, &warmup, "-w: untimed iterations before them (default 5)"},
      {"check", TPR_ARG_INT, &check, "-c: 1 checks one extra call per size with fresh inputs (default 1)"},
      {"root", TPR_ARG_INT, &root, "broadcast root (default 0)"},
      {"baseline", TPR_ARG_FLAG, &baseline,
       "also time the raw MPI call on its own buffers and MPI_COMM_WORLD (mpi backend)"},
      {"blocks", TPR_ARG_INT, &blocks,
       "timed blocks per size, reported as the interquartile mean of their times (default 1; --baseline: "
       "-n one-iteration blocks, up to 10x more to fill 0.5 s)"},
      {"json", TPR_ARG_FLAG, &json, "print JSON lines: a header object per op, then one object per size"},
      TPR_WORLD_ARGS(wo),
  };
  char **av = translate_shorts(argc, argv);
  if (!av) {
    fprintf(stderr, "tpr bench comm: out of memory\n");
    return 1;
  }
  int rc = 2;
  tpr_args_result ar = tpr_args_parse(argc, av, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) {
    free_argv(av, argc);
    return ar == TPR_ARGS_HELP ? 0 : 2;
  }
  bench b = {.redop = TPR_SUM, .iters = iters > 0 ? iters : baseline ? 100 : 20, .warmup = warmup,
             .check = check != 0, .json = json, .baseline = baseline, .m = {.half_op = MPI_OP_NULL}};
  int first = -1, last = -1;
  for (int k = 0; k < OP_COUNT; k++)
    if (strcmp(op_s, ops[k].name) == 0 || strcmp(op_s, ops[k].alias) == 0) first = last = k;
  if (strcmp(op_s, "all") == 0) first = 0, last = OP_COUNT - 1;
  for (size_t k = 0; k < N_TYPES; k++)
    if (strcmp(type_s, types[k].name) == 0 || strcmp(type_s, types[k].alias) == 0)
      b.dt = types[k].dt, b.type_name = types[k].name;
  int red = strcmp(redop_s, "sum") == 0 ? TPR_SUM : strcmp(redop_s, "max") == 0 ? TPR_MAX
                                                  : strcmp(redop_s, "min") == 0 ? TPR_MIN : -1;
  if (first < 0) {
    rc = usage_error("unknown op '%s' (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, sendrecv, all)",
                     op_s, strcmp(op_s, "sum") && strcmp(op_s, "max") && strcmp(op_s, "min") && strcmp(op_s, "prod")
                               ? NULL : "-o picks the collective here; the reduction is -r/--redop");
  } else if (!b.type_name) {
    rc = usage_error("unknown datatype '%s' (float, bfloat16, half, int32, int64)", type_s, NULL);
  } else if (red < 0) {
    rc = usage_error("unknown redop '%s' (sum, max, min)", redop_s,
                     isdigit((unsigned char)redop_s[0]) ? "-r picks the reduction here; the root is --root" : NULL);
  } else if (!parse_bytes(minb_s, &b.minb) || b.minb == 0) {
    rc = usage_error("bad -b/--minbytes '%s' (a size >= 1 such as 8, 1K, 1M, 1G)", minb_s, NULL);
  } else if (!parse_bytes(maxb_s, &b.maxb) || b.maxb == 0) {
    rc = usage_error("bad -e/--maxbytes '%s' (a size >= 1 such as 8, 1K, 1M, 1G)", maxb_s, NULL);
  } else if (b.minb > b.maxb) {
    rc = usage_error("-b/--minbytes %s is larger than -e/--maxbytes", minb_s, NULL);
  } else if (stepb_s && (!parse_bytes(stepb_s, &b.stepb) || b.stepb == 0)) {
    rc = usage_error("bad -i/--stepbytes '%s' (a size >= 1)", stepb_s, NULL);
  } else if (stepb_s && factor != -1) {
    rc = usage_error("-f/--stepfactor and -i/--stepbytes %s exclude each other", stepb_s, NULL);
  } else if (!stepb_s && factor != -1 && factor < 2) {
    rc = usage_error("-f/--stepfactor must be at least 2 (step linearly with -i BYTES)%s", "", NULL);
  } else if ((iters < 1 && iters != -1) || warmup < 0 || blocks < 0 || (check != 0 && check != 1) || root < 0) {
    rc = usage_error("-n must be >= 1, -w and --blocks >= 0, -c 0 or 1, --root >= 0%s", "", NULL);
  } else {
    rc = -1;
  }
  if (rc >= 0) {
    free_argv(av, argc);
    return rc;
  }
  b.redop = (tpr_red_op)red;
  b.factor = stepb_s ? 0 : factor == -1 ? 2 : factor;
  b.es = tpr_dtype_size(b.dt);
  b.blocks = blocks ? blocks : baseline ? b.iters : 1;
  if (b.blocks > b.iters) b.blocks = b.iters;
  b.ipb = b.iters / b.blocks;

  tpr_world w;
  if (tpr_world_init(&argc, &argv, &wo, &w) != TPR_OK) {
    free_argv(av, argc);
    return tpr_world_fail(&w, "bench comm");
  }
  b.w = &w, b.rank = w.rank, b.n = w.size, b.root = (int)root;
  const char *backend = tpr_comm_backend(w.comm);
  rc = -1;
  if (root >= w.size) {
    if (w.rank == 0) fprintf(stderr, "tpr bench comm: --root %lld is not a rank (%d ranks)\n", (long long)root, w.size);
    rc = 2;
  } else if (baseline && strcmp(backend, "mpi") != 0) {
    if (w.rank == 0)
      fprintf(stderr, "tpr bench comm: --baseline compares with raw MPI on host buffers and needs the mpi backend "
                      "(this is %s: run under mpirun, or add --comm mpi)\n", backend);
    rc = 2;
  } else if (baseline && b.maxb / b.es > (uint64_t)INT32_MAX) {
    if (w.rank == 0) fprintf(stderr, "tpr bench comm: --baseline: MPI counts stop at 2^31 elements (-e %s)\n", maxb_s);
    rc = 2;
  }
  if (rc >= 0) {
    tpr_world_finish(&w);
    free_argv(av, argc);
    return rc;
  }
  b.cap = (size_t)(b.maxb > 16 ? b.maxb : 16);
  tpr_status st = TPR_OK;
  b.max_blocks = baseline && !blocks ? 10 * b.blocks : b.blocks;
  b.t = calloc((size_t)(2 * b.max_blocks + 2), sizeof *b.t);
  if (!b.t) st = TPR_FAIL(TPR_ERR_OOM, "bench comm: block times");
  if (st == TPR_OK && strcmp(backend, "nccl") == 0) {  // device buffers, host staging for the check
    st = tpr_backend_cuda_new(w.device, &b.dev);  // the GPU the nccl backend uses
    if (st == TPR_OK) st = tpr_backend_alloc(b.dev, b.cap, &b.send);
    if (st == TPR_OK) st = tpr_backend_alloc(b.dev, b.cap, &b.recv);
    if (st == TPR_OK) st = b.dev->vt->memset(b.dev->ctx, b.send, 0, b.cap);
    if (st == TPR_OK) st = b.dev->vt->memset(b.dev->ctx, b.recv, 0, b.cap);
  }
  // nccl: host staging for the check, at the largest size (mpi and self
  // allocate per size, see host_buffers).
  if (st == TPR_OK && b.dev && (posix_memalign(&b.hsend, 4096, b.cap) || posix_memalign(&b.hrecv, 4096, b.cap)))
    st = TPR_FAIL(TPR_ERR_OOM, "bench comm: two buffers of %zu bytes", b.cap);
  int64_t wrong = 0;
  for (int k = first; st == TPR_OK && k <= last; k++) st = run_op(&b, (bench_op)k, &wrong);
  bench_mpi_free(&b.m);
  if (b.dev) {
    if (b.send) tpr_backend_release(b.dev, b.send);
    if (b.recv) tpr_backend_release(b.dev, b.recv);
    tpr_backend_free(b.dev);
  }
  free(b.hsend);
  free(b.hrecv);
  free(b.t);
  free_argv(av, argc);
  if (st != TPR_OK) return tpr_world_fail(&w, "bench comm");
  if (wrong && w.rank == 0) fprintf(stderr, "tpr bench comm: %" PRId64 " wrong element(s)\n", wrong);
  tpr_world_finish(&w);
  return wrong ? 1 : 0;
}
