// The nccl backend on real GPUs under mpirun: every collective on device
// buffers against expectations computed on the host, for f32, bf16, f16, i32
// and i64. Inputs are fresh random integers, small enough that every partial
// sum is exact in the dtype: NCCL rounds 16-bit floats back after every hop,
// so only then is a bf16/f16 sum exact whatever NCCL's reduction order.
//
// Skips (exit 77 on every rank) when the build has no NCCL, a rank has no
// GPU, or a node has more ranks than GPUs (NCCL refuses two ranks on one GPU
// in a communicator), printing why.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/tpr_comm.h"
#include "runtime/backend_cuda.h"
#include "test_util.h"

static tpr_comm_t world, nc;  // mpi world (bootstrap), nccl world
static tpr_backend *gpu;      // allocations and copies on the communicator's GPU
static int rank, size;
static uint64_t seed;         // the same on every rank: each rank can compute every rank's input

enum { POISON = 0x7f };  // 0x7f7f...: 3.4e38 in f32/bf16, NaN in f16, never one of our integers

static uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of rank r's input for test `tag`: an integer exact in dt, summed
// over up to 32 ranks (bf16: |sum| <= 256, f16: <= 2048).
static double elem(tpr_dtype dt, int tag, int r, size_t i) {
  int64_t hi = dt == TPR_BF16 ? 8 : dt == TPR_F16 ? 60 : dt == TPR_F32 ? 1000 : dt == TPR_I32 ? 1000000
               : dt == TPR_I64 ? (int64_t)1 << 40 : 255;
  int64_t lo = dt == TPR_U8 ? 0 : -hi;
  uint64_t h = mix(seed ^ mix(((uint64_t)tag << 48) ^ ((uint64_t)r << 32) ^ i));
  return (double)(lo + (int64_t)(h % (uint64_t)(hi - lo + 1)));
}

static double reduce2(tpr_red_op op, double a, double b) {
  return op == TPR_SUM ? a + b : op == TPR_MAX ? (a > b ? a : b) : (a < b ? a : b);
}

// A host buffer of n elements: rank r's input for `tag` from element `first`.
static void *host_input(tpr_dtype dt, int tag, int r, size_t first, size_t n) {
  void *h = malloc(n * tpr_dtype_size(dt) + 1);
  for (size_t i = 0; i < n; i++) tpr_dtype_store(h, dt, i, elem(dt, tag, r, first + i));
  return h;
}

// Device memory, filled from host (or poisoned when host is NULL). The
// backend's memset is stream-ordered on another stream, hence the sync.
static void *dev(const void *host, size_t bytes) {
  void *d;
  TT_OK(tpr_backend_alloc(gpu, bytes, &d));
  if (host) {
    TT_OK(gpu->vt->copy_from_host(gpu->ctx, d, host, bytes));
  } else {
    TT_OK(gpu->vt->memset(gpu->ctx, d, POISON, bytes));
    TT_OK(tpr_backend_sync(gpu));
  }
  return d;
}

static void *to_host(const void *d, size_t bytes) {
  void *h = malloc(bytes + 1);
  TT_OK(gpu->vt->copy_to_host(gpu->ctx, h, d, bytes));
  return h;
}

static void assert_exact(const char *what, tpr_dtype dt, const void *got, const double *want, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double g = tpr_dtype_load(got, dt, i);
    if (g != want[i])
      fail_msg("rank %d: %s %s: element %zu of %zu is %.17g, want %.17g", rank, what, tpr_dtype_name(dt), i, n, g,
               want[i]);
  }
}

// Copies d back and compares it with want, then frees the copy.
static void check_dev(const char *what, tpr_dtype dt, const void *d, const double *want, size_t n) {
  void *h = to_host(d, n * tpr_dtype_size(dt));
  assert_exact(what, dt, h, want, n);
  free(h);
}

static void test_identity(void **state) {
  assert_string_equal(tpr_comm_backend(nc), "nccl");
  assert_string_equal(tpr_comm_name(nc), "world");
  assert_int_equal(tpr_comm_rank(nc), tpr_comm_rank(world));
  assert_int_equal(tpr_comm_size(nc), tpr_comm_size(world));
  for (int r = 0; r < size; r++) assert_int_equal(tpr_comm_world_rank(nc, r), r);
  tpr_comm_t self;
  TT_OK(tpr_comm_init_self(&self));
  tpr_comm_t bad = NULL;
  assert_int_equal(tpr_comm_init_nccl(self, -1, &bad), TPR_ERR_INVALID_ARG);  // bootstraps over mpi only
  assert_null(bad);
  tpr_comm_free(self);
}

static void test_all_reduce(void **state) {
  const tpr_dtype dts[] = {TPR_F32, TPR_BF16, TPR_F16, TPR_I32, TPR_I64};
  const size_t n = 4099;
  double *want = malloc(n * sizeof *want);
  for (int d = 0; d < 5; d++) {
    for (int op = TPR_SUM; op <= TPR_MIN; op++) {
      tpr_dtype dt = dts[d];
      int tag = 10 * d + op;
      size_t bytes = n * tpr_dtype_size(dt);
      for (size_t i = 0; i < n; i++) {
        want[i] = elem(dt, tag, 0, i);
        for (int r = 1; r < size; r++) want[i] = reduce2(op, want[i], elem(dt, tag, r, i));
      }
      void *h = host_input(dt, tag, rank, 0, n), *s = dev(h, bytes), *o = dev(NULL, bytes);
      TT_OK(tpr_comm_all_reduce(nc, s, o, n, dt, op));
      check_dev("all_reduce", dt, o, want, n);
      TT_OK(tpr_comm_all_reduce(nc, s, s, n, dt, op));  // in place
      check_dev("all_reduce in place", dt, s, want, n);
      tpr_backend_release(gpu, s), tpr_backend_release(gpu, o), free(h);
    }
  }
  free(want);
}

static void test_all_gather(void **state) {
  const tpr_dtype dts[] = {TPR_F32, TPR_BF16, TPR_I64, TPR_U8};
  const size_t n = 1031;
  double *want = malloc((size_t)size * n * sizeof *want);
  for (int d = 0; d < 4; d++) {
    tpr_dtype dt = dts[d];
    size_t esz = tpr_dtype_size(dt);
    int tag = 100 + d;
    for (int r = 0; r < size; r++)
      for (size_t i = 0; i < n; i++) want[(size_t)r * n + i] = elem(dt, tag, r, i);
    void *h = host_input(dt, tag, rank, 0, n), *s = dev(h, n * esz), *o = dev(NULL, size * n * esz);
    TT_OK(tpr_comm_all_gather(nc, s, o, n, dt));
    check_dev("all_gather", dt, o, want, size * n);
    // In place: this rank's block already sits at its slot of recv.
    void *ip = dev(NULL, size * n * esz);
    char *mine = (char *)ip + (size_t)rank * n * esz;
    TT_OK(gpu->vt->copy_from_host(gpu->ctx, mine, h, n * esz));
    TT_OK(tpr_comm_all_gather(nc, mine, ip, n, dt));
    check_dev("all_gather in place", dt, ip, want, size * n);
    tpr_backend_release(gpu, s), tpr_backend_release(gpu, o), tpr_backend_release(gpu, ip), free(h);
  }
  free(want);
}

static void test_reduce_scatter(void **state) {
  const struct { tpr_dtype dt; tpr_red_op op; } cases[] = {
      {TPR_F32, TPR_SUM}, {TPR_BF16, TPR_SUM}, {TPR_F16, TPR_MIN}, {TPR_I32, TPR_MAX}, {TPR_I64, TPR_SUM}};
  const size_t n = 517;  // per rank
  double *want = malloc(n * sizeof *want);
  for (int k = 0; k < 5; k++) {
    tpr_dtype dt = cases[k].dt;
    tpr_red_op op = cases[k].op;
    size_t esz = tpr_dtype_size(dt);
    int tag = 200 + k;
    for (size_t i = 0; i < n; i++) {
      want[i] = elem(dt, tag, 0, (size_t)rank * n + i);
      for (int r = 1; r < size; r++) want[i] = reduce2(op, want[i], elem(dt, tag, r, (size_t)rank * n + i));
    }
    void *h = host_input(dt, tag, rank, 0, size * n), *s = dev(h, size * n * esz), *o = dev(NULL, n * esz);
    TT_OK(tpr_comm_reduce_scatter(nc, s, o, n, dt, op));
    check_dev("reduce_scatter", dt, o, want, n);
    char *mine = (char *)s + (size_t)rank * n * esz;  // in place: recv is this rank's block of send
    TT_OK(tpr_comm_reduce_scatter(nc, s, mine, n, dt, op));
    check_dev("reduce_scatter in place", dt, mine, want, n);
    tpr_backend_release(gpu, s), tpr_backend_release(gpu, o), free(h);
  }
  free(want);
}

static void test_all_to_all(void **state) {
  const tpr_dtype dts[] = {TPR_F32, TPR_BF16};
  const size_t n = 333;  // per peer
  double *want = malloc((size_t)size * n * sizeof *want);
  for (int d = 0; d < 2; d++) {
    tpr_dtype dt = dts[d];
    size_t esz = tpr_dtype_size(dt);
    int tag = 300 + d;
    // Block k here is block `rank` of rank k's send.
    for (int k = 0; k < size; k++)
      for (size_t i = 0; i < n; i++) want[(size_t)k * n + i] = elem(dt, tag, k, (size_t)rank * n + i);
    void *h = host_input(dt, tag, rank, 0, size * n), *s = dev(h, size * n * esz), *o = dev(NULL, size * n * esz);
    TT_OK(tpr_comm_all_to_all(nc, s, o, n, dt));
    check_dev("all_to_all", dt, o, want, size * n);
    tpr_backend_release(gpu, s), tpr_backend_release(gpu, o), free(h);
  }
  free(want);
}

// Elements rank s sends to rank d in all_to_allv: 0..5, zeros included.
static size_t v_count(int s, int d) { return mix(seed ^ ((uint64_t)s << 20) ^ (uint64_t)d) % 6; }

static void test_all_to_allv(void **state) {
  const tpr_dtype dts[] = {TPR_I32, TPR_BF16};
  size_t *sc = calloc((size_t)size, sizeof *sc), *sd = calloc((size_t)size, sizeof *sd);
  size_t *rc = calloc((size_t)size, sizeof *rc), *rd = calloc((size_t)size, sizeof *rd);
  // Send blocks packed in reverse peer order with a gap of 1, receive blocks
  // in peer order with a gap of 2: displacements are honoured, gaps untouched.
  size_t send_n = 0, recv_n = 0;
  for (int j = size - 1; j >= 0; j--) sc[j] = v_count(rank, j), sd[j] = send_n, send_n += sc[j] + 1;
  for (int j = 0; j < size; j++) rc[j] = v_count(j, rank), rd[j] = recv_n, recv_n += rc[j] + 2;
  for (int d = 0; d < 2; d++) {
    tpr_dtype dt = dts[d];
    size_t esz = tpr_dtype_size(dt);
    int tag = 400 + d;
    char *h = malloc(send_n * esz), *poison = malloc(esz);
    memset(h, POISON, send_n * esz), memset(poison, POISON, esz);
    for (int j = 0; j < size; j++)
      for (size_t i = 0; i < sc[j]; i++) tpr_dtype_store(h + sd[j] * esz, dt, i, elem(dt, tag, rank, 64 * j + i));
    void *s = dev(h, send_n * esz), *o = dev(NULL, recv_n * esz);
    TT_OK(tpr_comm_all_to_allv(nc, s, sc, sd, o, rc, rd, dt));
    char *got = to_host(o, recv_n * esz);
    for (int k = 0; k < size; k++) {
      for (size_t i = 0; i < rc[k]; i++) {
        double g = tpr_dtype_load(got + rd[k] * esz, dt, i), w = elem(dt, tag, k, 64 * (size_t)rank + i);
        if (g != w) fail_msg("rank %d: all_to_allv %s: element %zu from rank %d is %g, want %g", rank,
                             tpr_dtype_name(dt), i, k, g, w);
      }
      for (size_t g = rd[k] + rc[k]; g < rd[k] + rc[k] + 2; g++)
        if (memcmp(got + g * esz, poison, esz) != 0) fail_msg("rank %d: all_to_allv wrote the gap at %zu", rank, g);
    }
    tpr_backend_release(gpu, s), tpr_backend_release(gpu, o), free(h), free(got), free(poison);
  }
  free(sc), free(sd), free(rc), free(rd);
}

static void test_broadcast(void **state) {
  const size_t n = 2053;
  const tpr_dtype dt = TPR_F32;
  double *want = malloc(n * sizeof *want);
  for (int root = 0; root < size; root++) {
    int tag = 500 + root;
    for (size_t i = 0; i < n; i++) want[i] = elem(dt, tag, root, i);
    void *h = host_input(dt, tag, root, 0, n);
    void *s = rank == root ? dev(h, n * 4) : NULL, *o = dev(NULL, n * 4);  // send: root only
    TT_OK(tpr_comm_broadcast(nc, s, o, n, dt, root));
    check_dev("broadcast", dt, o, want, n);
    void *ip = dev(rank == root ? h : NULL, n * 4);  // in place
    TT_OK(tpr_comm_broadcast(nc, ip, ip, n, dt, root));
    check_dev("broadcast in place", dt, ip, want, n);
    if (s) tpr_backend_release(gpu, s);
    tpr_backend_release(gpu, o), tpr_backend_release(gpu, ip), free(h);
  }
  free(want);
}

static void test_send_recv(void **state) {
  int peer = rank ^ 1;
  if (size < 2) skip();
  if (peer >= size) return;  // odd size: the last rank sits this one out
  const size_t n = 70001;
  const tpr_dtype dt = TPR_I64;
  double *want = malloc(n * sizeof *want);
  for (size_t i = 0; i < n; i++) want[i] = elem(dt, 600, peer, i);
  void *h = host_input(dt, 600, rank, 0, n), *s = dev(h, n * 8), *o = dev(NULL, n * 8);
  if (rank % 2 == 0) {  // even sends first, odd receives first: no deadlock
    TT_OK(tpr_comm_send(nc, s, n, dt, peer));
    TT_OK(tpr_comm_recv(nc, o, n, dt, peer));
  } else {
    TT_OK(tpr_comm_recv(nc, o, n, dt, peer));
    TT_OK(tpr_comm_send(nc, s, n, dt, peer));
  }
  check_dev("send/recv", dt, o, want, n);
  tpr_backend_release(gpu, s), tpr_backend_release(gpu, o), free(h), free(want);
}

static void test_barrier(void **state) {
  for (int i = 0; i < 3; i++) TT_OK(tpr_comm_barrier(nc));
}

static void test_split(void **state) {
  // Parity groups in reverse rank order (key = -rank).
  tpr_comm_t tp;
  TT_OK(tpr_comm_split(nc, rank % 2, -rank, "tp", &tp));
  assert_non_null(tp);
  assert_string_equal(tpr_comm_backend(tp), "nccl");
  assert_string_equal(tpr_comm_name(tp), "tp");
  int n = 0, me = -1;
  for (int r = size - 1; r >= 0; r--) {
    if (r % 2 != rank % 2) continue;
    if (r == rank) me = n;
    assert_int_equal(tpr_comm_world_rank(tp, n), r);
    n++;
  }
  assert_int_equal(tpr_comm_size(tp), n);
  assert_int_equal(tpr_comm_rank(tp), me);
  // The NCCL group must order its ranks as the host twin does: gather world ranks.
  int32_t mine = rank, *all = dev(NULL, (size_t)n * 4), *d = dev(&mine, 4);
  TT_OK(tpr_comm_all_gather(tp, d, all, 1, TPR_I32));
  double *want = malloc((size_t)n * sizeof *want);
  for (int k = 0; k < n; k++) want[k] = tpr_comm_world_rank(tp, k);
  check_dev("all_gather on a split", TPR_I32, all, want, n);
  // A split of a split, and a collective on it.
  tpr_comm_t sub;
  TT_OK(tpr_comm_split(tp, 0, 0, "sub", &sub));
  assert_int_equal(tpr_comm_size(sub), n);
  TT_OK(tpr_comm_all_reduce(sub, d, d, 1, TPR_I32, TPR_SUM));
  int sum = 0;
  for (int r = rank % 2; r < size; r += 2) sum += r;
  want[0] = sum;
  check_dev("all_reduce on a split of a split", TPR_I32, d, want, 1);
  tpr_comm_free(sub), tpr_comm_free(tp);
  tpr_backend_release(gpu, all), tpr_backend_release(gpu, d), free(want);
  // color < 0: rank 0 joins no group; the others work on without it.
  tpr_comm_t rest;
  TT_OK(tpr_comm_split(nc, rank == 0 ? -1 : 0, 0, "rest", &rest));
  if (rank == 0) {
    assert_null(rest);
  } else {
    assert_int_equal(tpr_comm_size(rest), size - 1);
    assert_int_equal(tpr_comm_rank(rest), rank - 1);
    TT_OK(tpr_comm_barrier(rest));
    tpr_comm_free(rest);
  }
}

static void test_host_buffer_refused(void **state) {
  float h[4] = {1, 2, 3, 4};
  assert_int_equal(tpr_comm_all_reduce(nc, h, h, 4, TPR_F32, TPR_SUM), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "host memory"));
  TT_OK(tpr_comm_barrier(nc));  // the refusal left the communicator usable
}

// Whether this job can run the tests; 0 = yes, else why not (the worst over ranks).
enum { CAN_RUN = 0, NO_NCCL = 1, NO_GPU = 2, TOO_FEW_GPUS = 3 };

static int skip_job(int ndev, int local_ranks) {
  int32_t mine = !tpr_comm_nccl_built() ? NO_NCCL : ndev == 0 ? NO_GPU : local_ranks > ndev ? TOO_FEW_GPUS : CAN_RUN;
  int32_t worst = mine;
  if (tpr_comm_all_reduce(world, &mine, &worst, 1, TPR_I32, TPR_MAX) != TPR_OK) return -1;
  if (worst == CAN_RUN) return 0;
  if (worst == TOO_FEW_GPUS) {  // no init: NCCL would refuse two ranks on one GPU
    if (rank == 0) printf("skipped: %d ranks on a node with %d GPU(s); nccl needs one GPU per rank\n", local_ranks, ndev);
    return 77;
  }
  // Even when skipping, the refusal must be a clear error (init fails on every rank together).
  tpr_comm_t c = NULL;
  tpr_status rc = tpr_comm_init_nccl(world, -1, &c);
  const char *want = mine == NO_NCCL ? "no NCCL" : mine == NO_GPU ? "no CUDA device" : "";
  if (rc != TPR_ERR_UNSUPPORTED || c || !strstr(tpr_last_error(), want)) {
    fprintf(stderr, "rank %d: expected an unsupported '%s' error, got %s: %s\n", rank, want, tpr_status_name(rc),
            tpr_last_error());
    return -1;
  }
  printf("rank %d: skipped (%s)\n", rank, tpr_last_error());
  return 77;
}

int main(int argc, char **argv) {
  if (tpr_comm_mpi_init(&argc, &argv) != TPR_OK || tpr_comm_init_mpi_world(&world) != TPR_OK) {
    fprintf(stderr, "mpi: %s\n", tpr_last_error());
    return 1;
  }
  rank = tpr_comm_rank(world), size = tpr_comm_size(world);
  MPI_Comm node;
  int local = 0, local_ranks = 1;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local), MPI_Comm_size(node, &local_ranks);
  MPI_Comm_free(&node);
  int ndev = tpr_cuda_device_count(), rc = skip_job(ndev, local_ranks);
  if (rc == 0) {
    tt_seed_from_env();
    uint64_t s = tt_next_u64();
    if (tpr_comm_all_reduce(world, &s, &seed, 1, TPR_I64, TPR_MAX) != TPR_OK ||
        tpr_comm_init_nccl(world, -1, &nc) != TPR_OK || tpr_backend_cuda_new(local % ndev, &gpu) != TPR_OK) {
      fprintf(stderr, "rank %d: setup: %s\n", rank, tpr_last_error());
      rc = 1;
    }
  }
  if (rc == 0) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),     cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_all_gather),   cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_all_to_all),   cmocka_unit_test(test_all_to_allv),
        cmocka_unit_test(test_broadcast),    cmocka_unit_test(test_send_recv),
        cmocka_unit_test(test_barrier),      cmocka_unit_test(test_split),
        cmocka_unit_test(test_host_buffer_refused),
    };
    int32_t failed = cmocka_run_group_tests(tests, NULL, NULL), any = failed;
    tpr_comm_all_reduce(world, &failed, &any, 1, TPR_I32, TPR_MAX);  // every rank exits alike
    rc = any ? 1 : 0;
  }
  tpr_comm_free(nc);
  if (gpu) tpr_backend_free(gpu);
  tpr_comm_free(world);
  tpr_comm_mpi_finalize();
  return rc < 0 ? 1 : rc;
}
