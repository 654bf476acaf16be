// The `mpi` communicator under mpirun (np 1..4): every collective, dtype,
// reduction op and count {0, 1, 7, 1000, 1 Mi (a representative subset, for
// run time)}, in place and out of place, with EXACT expected results (see
// comm_cases.h). Also: the int-count limit (chunked, derived-type and
// point-to-point paths, exercised by lowering the limit), the staging of
// device buffers (against fake device memory that faults when MPI touches
// it), negative controls of the checkers, and the front's argument errors.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/comm_mpi.h"
#include "runtime/rng.h"
#include "comm_cases.h"
#include "mpi_util.h"

static tpr_comm_t world;

// --- the matrix -----------------------------------------------------------

static const tpr_dtype reducible[] = {TPR_F32, TPR_BF16, TPR_F16, TPR_I32, TPR_I64};
static const tpr_dtype all_types[] = {TPR_U8, TPR_BF16, TPR_F16, TPR_F32, TPR_I32, TPR_I64, TPR_F8E4M3};
static const size_t counts[] = {0, 1, 7, 1000};  // 1 Mi: a representative subset (run time)
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static void test_identity(void **state) {
  int mr, ms, cmp = MPI_UNEQUAL, level = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mr);
  MPI_Comm_size(MPI_COMM_WORLD, &ms);
  EXPECT(tpr_comm_rank(comm) == mr && tpr_comm_size(comm) == ms, "rank/size %d/%d, MPI says %d/%d",
         tpr_comm_rank(comm), tpr_comm_size(comm), mr, ms);
  EXPECT(strcmp(tpr_comm_backend(comm), "mpi") == 0, "backend %s", tpr_comm_backend(comm));
  EXPECT(strcmp(tpr_comm_name(comm), "world") == 0, "name %s", tpr_comm_name(comm));
  for (int r = 0; r < N; r++) EXPECT(tpr_comm_world_rank(comm, r) == r, "world rank of %d", r);
  EXPECT(tpr_comm_world_rank(comm, N) == -1 && tpr_comm_world_rank(comm, -1) == -1, "world rank out of range");
  MPI_Comm h = tpr__comm_mpi_handle(comm);
  EXPECT(h != MPI_COMM_NULL && h != MPI_COMM_WORLD, "the handle is a duplicate of the world");
  if (h != MPI_COMM_NULL) MPI_Comm_compare(h, MPI_COMM_WORLD, &cmp);
  EXPECT(cmp == MPI_CONGRUENT, "handle compares %d to MPI_COMM_WORLD", cmp);
  tpr_comm_t self;
  EXPECT_OK(tpr_comm_init_self(&self));
  EXPECT(tpr__comm_mpi_handle(self) == MPI_COMM_NULL && tpr__comm_mpi_handle(NULL) == MPI_COMM_NULL,
         "no MPI handle behind self");
  tpr_comm_free(self);
  MPI_Query_thread(&level);
  EXPECT(tpr__comm_mpi_thread_level() == level, "thread level %d, MPI says %d", tpr__comm_mpi_thread_level(), level);
  if (level < MPI_THREAD_MULTIPLE && R == 0) print_message("note: MPI grants thread level %d only\n", level);
  for (int k = 0; k < 3; k++) EXPECT_OK(tpr_comm_barrier(comm));
  agree();
}

static void test_all_reduce(void **state) {
  for (size_t d = 0; d < LEN(reducible); d++)
    for (tpr_red_op op = TPR_SUM; op <= TPR_MIN; op++)
      for (size_t k = 0; k < LEN(counts); k++)
        for (int ip = 0; ip < 2; ip++) case_all_reduce(reducible[d], op, counts[k], ip, 0);
  case_all_reduce(TPR_F32, TPR_SUM, MI, false, 0);
  case_all_reduce(TPR_BF16, TPR_SUM, MI, true, 0);
  agree();
}

static void test_reduce_scatter(void **state) {
  for (size_t d = 0; d < LEN(reducible); d++)
    for (tpr_red_op op = TPR_SUM; op <= TPR_MIN; op++)
      for (size_t k = 0; k < LEN(counts); k++)
        for (int ip = 0; ip < 2; ip++) case_reduce_scatter(reducible[d], op, counts[k], ip, 0);
  case_reduce_scatter(TPR_F32, TPR_SUM, MI, false, 0);
  agree();
}

static void test_all_gather(void **state) {
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(counts); k++)
      for (int ip = 0; ip < 2; ip++) case_all_gather(all_types[d], counts[k], ip, 0);
  case_all_gather(TPR_F32, MI, false, 0);
  agree();
}

static void test_all_to_all(void **state) {
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(counts); k++) case_all_to_all(all_types[d], counts[k], 0);
  case_all_to_all(TPR_F32, MI, 0);
  agree();
}

static void test_all_to_allv(void **state) {
  const size_t maxcs[] = {0, 1, 7, 1000};
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(maxcs); k++)
      for (int rep = 0; rep < 2; rep++) case_all_to_allv(all_types[d], maxcs[k], 0);
  // Nothing moves: NULL buffers are fine.
  size_t zero[64] = {0}, garbage[64];
  for (int j = 0; j < N; j++) garbage[j] = (size_t)1 << 40;
  EXPECT_OK(tpr_comm_all_to_allv(comm, NULL, zero, garbage, NULL, zero, garbage, TPR_F32));
  agree();
}

static void test_broadcast(void **state) {
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(counts); k++)
      for (int root = 0; root < N; root++)
        for (int variant = 0; variant < 3; variant++) case_broadcast(all_types[d], counts[k], root, variant, 0);
  case_broadcast(TPR_BF16, MI, N - 1, 0, 0);
  agree();
}

static void test_send_recv(void **state) {
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(counts); k++) case_send_recv(all_types[d], counts[k], 0);
  case_send_recv(TPR_U8, MI, 0);
  agree();
}

// Beyond an int: the same checks with the per-call limit lowered, so that
// reductions run in chunks, data movement uses derived types and
// all_to_allv goes point to point (counts and displacements above it).
static void test_count_limit(void **state) {
  const size_t limits[] = {64, 7};
  for (size_t l = 0; l < LEN(limits); l++) {
    tpr__comm_mpi_set_max_count(limits[l]);
    const size_t cs[] = {1, 7, 64, 65, 1000};
    for (size_t k = 0; k < LEN(cs); k++) {
      for (int ip = 0; ip < 2; ip++) {
        case_all_reduce(TPR_F32, TPR_SUM, cs[k], ip, 0);
        case_all_reduce(TPR_BF16, TPR_SUM, cs[k], ip, 0);
        case_all_reduce(TPR_I64, TPR_MAX, cs[k], ip, 0);
        case_reduce_scatter(TPR_I32, TPR_SUM, cs[k], ip, 0);
        case_reduce_scatter(TPR_F16, TPR_MIN, cs[k], ip, 0);
        case_all_gather(TPR_I64, cs[k], ip, 0);
        case_all_gather(TPR_U8, cs[k], ip, 0);
      }
      case_all_to_all(TPR_BF16, cs[k], 0);
      case_broadcast(TPR_F32, cs[k], N - 1, 0, 0);
      case_broadcast(TPR_U8, cs[k], 0, 2, 0);
      case_send_recv(TPR_I64, cs[k], 0);
    }
    for (int rep = 0; rep < 3; rep++) case_all_to_allv(TPR_F32, 300, 0), case_all_to_allv(TPR_U8, 50, 0);
  }
  tpr__comm_mpi_set_max_count(0);
  agree();
}

// Device buffers: fake device memory (see tb_alloc) for send, recv or both,
// on a communicator of its own (staging caches buffers per communicator).
static void test_device_staging(void **state) {
  tpr_comm_t saved = comm, dup = NULL;
  EXPECT_OK(tpr_comm_split(world, 0, R, "staged", &dup));
  if (!dup) {
    agree();
    return;
  }
  tpr__stage_set_hooks(&fake_hooks);
  comm = dup;
  fake_copies = 0;
  const size_t cs[] = {0, 1, 7, 1000};
  const tpr_dtype ts[] = {TPR_F32, TPR_BF16, TPR_I64};
  const tpr_dtype ms[] = {TPR_U8, TPR_F16, TPR_I64};
  for (int mem = 1; mem <= 3; mem++)
    for (size_t k = 0; k < LEN(cs); k++)
      for (size_t d = 0; d < 3; d++) {
        for (int ip = 0; ip < 2; ip++) {
          case_all_reduce(ts[d], d == 2 ? TPR_MIN : TPR_SUM, cs[k], ip, mem);
          case_reduce_scatter(ts[d], TPR_MAX, cs[k], ip, mem);
          case_all_gather(ms[d], cs[k], ip, mem);
        }
        case_all_to_all(ms[d], cs[k], mem);
        for (int root = 0; root < N; root++)
          for (int variant = 0; variant < 3; variant++) case_broadcast(ms[d], cs[k], root, variant, mem);
        case_send_recv(ms[d], cs[k], mem);
      }
  for (int mem = 1; mem <= 3; mem++)
    for (int rep = 0; rep < 3; rep++) case_all_to_allv(TPR_F32, 100, mem), case_all_to_allv(TPR_U8, 7, mem);
  EXPECT(fake_copies > 0, "no device buffer was staged");
  comm = saved;
  tpr_comm_free(dup);
  tpr__stage_set_hooks(NULL);
  agree();
}

// The checkers catch what they must: a wrong expectation (rank 0's values
// alone, another root, another sender) and tampered outputs and guards.
static void test_negative_controls(void **state) {
  size_t count = 1000;
  uint64_t salt = ++case_no;
  float *x = malloc(count * sizeof *x + GUARD);
  fill_red(x, TPR_F32, TPR_SUM, salt, R, 0, count);
  guard_set(x + count);
  EXPECT_OK(tpr_comm_all_reduce(comm, x, x, count, TPR_F32, TPR_SUM));
  EXPECT(check_reduced(x, TPR_F32, TPR_SUM, salt, N, 0, count, "control") == 0, "the real result is right");
  if (N > 1)
    EXPECT(check_reduced(x, TPR_F32, TPR_SUM, salt, 1, 0, count, "expected mismatch (rank 0 only)") > 0,
           "rank-0-only expectation not detected");
  x[count / 2] += 0.0625f;
  EXPECT(check_reduced(x, TPR_F32, TPR_SUM, salt, N, 0, count, "expected mismatch (tampered)") == 1,
         "one tampered element not detected exactly once");
  EXPECT(guard_ok(x + count), "guard");
  ((unsigned char *)(x + count))[GUARD - 1] ^= 1;
  EXPECT(!guard_ok(x + count), "tampered guard not detected");
  free(x);

  // The bf16 SUM inputs do exercise the final rounding: from 3 ranks on,
  // sums of k * 2^-3 (|k| <= 127) need 9 or more significant bits, so some
  // of 1000 results must differ from the exact sum (else a backend that
  // never rounded, or rounded twice, could pass unnoticed).
  salt = ++case_no;
  uint16_t *h = malloc(count * sizeof *h);
  fill_red(h, TPR_BF16, TPR_SUM, salt, R, 0, count);
  EXPECT_OK(tpr_comm_all_reduce(comm, h, h, count, TPR_BF16, TPR_SUM));
  EXPECT(check_reduced(h, TPR_BF16, TPR_SUM, salt, N, 0, count, "bf16 control") == 0, "bf16 result");
  size_t rounded = 0;
  for (size_t i = 0; i < count; i++) {
    double exact = 0;
    for (int s = 0; s < N; s++) exact += red_value(TPR_BF16, TPR_SUM, H(salt, (uint64_t)s, i)).f;
    if (tpr_bf16_to_f32(h[i]) != exact) rounded++;
  }
  if (N >= 3) EXPECT(rounded > 0, "no bf16 sum needed rounding: the rounding is untested");
  else EXPECT(rounded == 0, "a bf16 sum of %d ranks is exact, yet %zu were rounded", N, rounded);
  free(h);

  // Moved data: another sender, and a tampered element.
  salt = ++case_no;
  size_t bytes = count * 8;
  unsigned char *send = malloc(bytes), *recv = malloc(bytes * (size_t)N);
  fill_move(send, TPR_I64, salt, R, 0, count);
  EXPECT_OK(tpr_comm_all_gather(comm, send, recv, count, TPR_I64));
  EXPECT(check_moved(recv, TPR_I64, salt, 0, 0, count, "control") == 0, "block 0 is rank 0's");
  EXPECT(check_moved(recv, TPR_I64, salt, N - 1, 0, count, "expected mismatch (wrong sender)") > 0 || N == 1,
         "wrong sender not detected");
  recv[bytes / 2] ^= 0x10;
  EXPECT(check_moved(recv, TPR_I64, salt, 0, 0, count, "expected mismatch (tampered)") == 1, "tamper not detected");
  free(send), free(recv);

  // all_to_allv: a tampered block element and a written gap are both caught.
  salt = ++case_no;
  size_t sc[64], sd[64], rc[64], rd[64], sext, rext, maxc = 50;
  v_layouts(salt, R, maxc, sc, sd, rc, rd, &sext, &rext);
  unsigned char *vs = tb_alloc(sext * 4, false), *vr = tb_alloc(rext * 4, false), *before = malloc(rext * 4 + GUARD);
  fill_move(vs, TPR_F32, salt, R, 0, sext);
  guard_set(vr + rext * 4);
  memcpy(before, vr, rext * 4 + GUARD);
  EXPECT_OK(tpr_comm_all_to_allv(comm, vs, sc, sd, vr, rc, rd, TPR_F32));
  EXPECT(check_v(vr, before, TPR_F32, salt, maxc, rc, rd, rext, "control") == 0, "all_to_allv control");
  int j = -1;
  for (int k = 0; k < N; k++)
    if (rc[k]) j = k;
  if (j >= 0) {
    vr[rd[j] * 4] ^= 1;
    EXPECT(check_v(vr, before, TPR_F32, salt, maxc, rc, rd, rext, "expected mismatch (tampered)") > 0,
           "tampered block not detected");
    vr[rd[j] * 4] ^= 1;
  }
  size_t gap = (size_t)-1;
  unsigned char *cov = calloc(rext + 1, 1);
  for (int k = 0; k < N; k++)
    if (rc[k]) memset(cov + rd[k], 1, rc[k]);
  for (size_t e = 0; e < rext && gap == (size_t)-1; e++)
    if (!cov[e]) gap = e;
  if (gap != (size_t)-1) {
    vr[gap * 4] ^= 1;
    EXPECT(check_v(vr, before, TPR_F32, salt, maxc, rc, rd, rext, "expected mismatch (gap)") > 0,
           "written gap not detected");
  }
  free(cov), tb_free(vs), tb_free(vr), free(before);
  agree();
}

// The front rejects bad arguments before any rank communicates (every rank
// makes the same bad call, so no rank is left waiting), and writes nothing.
static void test_errors(void **state) {
  unsigned char a[256], b[256], keep[256];
  memset(a, 1, sizeof a), memset(b, 7, sizeof b), memcpy(keep, b, sizeof b);
  size_t cnt[64], dsp[64];
  for (int j = 0; j < N; j++) cnt[j] = 1, dsp[j] = (size_t)j;
  unsigned char *big = malloc((size_t)N * 256), *big2 = malloc((size_t)N * 256);
  // NULL buffers with count > 0.
  EXPECT_STATUS(tpr_comm_all_reduce(comm, NULL, b, 4, TPR_F32, TPR_SUM), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, NULL, 4, TPR_F32, TPR_SUM), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_gather(comm, NULL, big, 4, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_reduce_scatter(comm, big, NULL, 4, TPR_I32, TPR_MAX), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_to_all(comm, NULL, big, 4, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_to_allv(comm, NULL, cnt, dsp, big, cnt, dsp, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_to_allv(comm, big, NULL, dsp, big2, cnt, dsp, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_broadcast(comm, a, NULL, 4, TPR_U8, 0), TPR_ERR_INVALID_ARG);
  if (N > 1) {
    EXPECT_STATUS(tpr_comm_send(comm, NULL, 4, TPR_U8, (R + 1) % N), TPR_ERR_INVALID_ARG);
    EXPECT_STATUS(tpr_comm_recv(comm, NULL, 4, TPR_U8, (R + 1) % N), TPR_ERR_INVALID_ARG);
  }
  // Bad dtypes and ops; u8 and f8 do not reduce.
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_DTYPE_COUNT, TPR_SUM), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, (tpr_dtype)-1, TPR_SUM), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_all_gather(comm, a, big, 4, (tpr_dtype)99), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_all_to_all(comm, big, big2, 4, (tpr_dtype)99), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_broadcast(comm, a, b, 4, (tpr_dtype)99, 0), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_F32, (tpr_red_op)3), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_F32, (tpr_red_op)-1), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_reduce_scatter(comm, big, b, 4, TPR_I64, (tpr_red_op)7), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_U8, TPR_SUM), TPR_ERR_DTYPE);
  EXPECT(strstr(tpr_last_error(), "u8") != NULL, "message names u8: %s", tpr_last_error());
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_F8E4M3, TPR_MAX), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_reduce_scatter(comm, big, b, 4, TPR_U8, TPR_SUM), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_reduce_scatter(comm, big, b, 4, TPR_F8E4M3, TPR_MIN), TPR_ERR_DTYPE);
  // Roots and peers out of range; a peer may not be this rank.
  EXPECT_STATUS(tpr_comm_broadcast(comm, a, b, 4, TPR_U8, -1), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_broadcast(comm, a, b, 4, TPR_U8, N), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_send(comm, a, 4, TPR_U8, N), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_send(comm, a, 4, TPR_U8, -1), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_send(comm, a, 4, TPR_U8, R), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_recv(comm, b, 4, TPR_U8, R), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_recv(comm, b, 4, TPR_U8, N + 3), TPR_ERR_INVALID_ARG);
  // all_to_all is out of place only.
  EXPECT_STATUS(tpr_comm_all_to_all(comm, big, big + 1, 2, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT(memcmp(b, keep, sizeof b) == 0, "a failed call wrote into recv");
  // Zero counts with NULL buffers are fine everywhere.
  EXPECT_OK(tpr_comm_all_reduce(comm, NULL, NULL, 0, TPR_BF16, TPR_MAX));
  EXPECT_OK(tpr_comm_reduce_scatter(comm, NULL, NULL, 0, TPR_I64, TPR_SUM));
  EXPECT_OK(tpr_comm_all_gather(comm, NULL, NULL, 0, TPR_U8));
  EXPECT_OK(tpr_comm_all_to_all(comm, NULL, NULL, 0, TPR_F16));
  EXPECT_OK(tpr_comm_broadcast(comm, NULL, NULL, 0, TPR_F32, N - 1));
  if (N > 1) {  // an empty message still pairs a send with a recv
    int next = (R + 1) % N, prev = (R + N - 1) % N;
    for (int phase = 0; phase < 2; phase++) {
      if ((phase == 0) == (R % 2 == 0)) EXPECT_OK(tpr_comm_send(comm, NULL, 0, TPR_F32, next));
      else EXPECT_OK(tpr_comm_recv(comm, NULL, 0, TPR_F32, prev));
    }
  }
  free(big), free(big2);
  agree();
}

// Nonblocking all_gather / reduce_scatter: several outstanding at once,
// completed out of order (case_nonblocking), also past the int-count limit
// (derived types, packed chunks); check mode catches a wrong count on one
// rank at the start (the negative control: no request is left behind).
static void test_nonblocking(void **state) {
  const size_t sizes[] = {1, 7, 1000, MI / 8};
  for (size_t k = 0; k < LEN(sizes); k++) case_nonblocking(sizes[k]);
  tpr__comm_mpi_set_max_count(7);
  case_nonblocking(100);
  tpr__comm_mpi_set_max_count(0);
  // Zero counts with NULL buffers complete at once.
  tpr_comm_request q = (tpr_comm_request)&q;
  bool done = false;
  EXPECT_OK(tpr_comm_iall_gather(comm, NULL, NULL, 0, TPR_F32, &q));
  EXPECT_OK(tpr_comm_test(q, &done));
  EXPECT(done, "a zero-count request is complete");
  EXPECT_OK(tpr_comm_wait(q));
  EXPECT_OK(tpr_comm_wait(NULL));
  EXPECT_STATUS(tpr_comm_ireduce_scatter(comm, NULL, NULL, 4, TPR_F32, TPR_SUM, &q), TPR_ERR_INVALID_ARG);
  EXPECT(q == NULL, "a failed start leaves no request");
  EXPECT_STATUS(tpr_comm_ireduce_scatter(comm, &done, &done, 1, TPR_U8, TPR_SUM, &q), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_iall_gather(comm, &done, &done, 1, TPR_U8, NULL), TPR_ERR_INVALID_ARG);
  if (N > 1) {
    float send[64 * 8], recv[64 * 8];
    for (int i = 0; i < 64 * 8; i++) send[i] = (float)(R + i);
    tpr_comm_set_check(comm, true);
    EXPECT_OK(tpr_comm_ireduce_scatter(comm, send, recv, 4, TPR_F32, TPR_SUM, &q));  // agreed: fine
    EXPECT_OK(tpr_comm_wait(q));
    size_t count = 4 + (R == N - 1);  // the last rank passes a wrong count
    tpr_status rc = tpr_comm_iall_gather(comm, send, recv, count, TPR_F32, &q);
    char want[96];
    snprintf(want, sizeof want, "rank %d (world %d) calls iall_gather", N - 1, N - 1);
    EXPECT(rc == TPR_ERR_COMM && q == NULL && strstr(tpr_last_error(), want) && strstr(tpr_last_error(), "differs"),
           "check mode: a wrong count on rank %d -> %s: %s", N - 1, tpr_status_name(rc), tpr_last_error());
    if (R == 0 && rc == TPR_ERR_COMM) print_message("check mode caught it: %s\n", tpr_last_error());
    // A blocking call does not match a nonblocking one.
    rc = R == 0 ? tpr_comm_iall_gather(comm, send, recv, 4, TPR_F32, &q)
                : tpr_comm_all_gather(comm, send, recv, 4, TPR_F32);
    EXPECT(rc == TPR_ERR_COMM && q == NULL, "check mode: blocking vs nonblocking -> %s", tpr_status_name(rc));
    tpr_comm_set_check(comm, false);
  }
  agree();
}

// Nonblocking broadcast from every root: the root's random bytes reach every
// rank (also past the int-count limit), while the others poll with
// tpr_comm_test, as an idle server rank does; the root starts late, so the
// polls usually see "not done" first.
static void test_ibroadcast(void **state) {
  const size_t sizes[] = {1, 3, 1000, MI / 4};
  for (int root = 0; root < N; root++)
    for (size_t k = 0; k < LEN(sizes); k++) {
      size_t count = sizes[k];
      if (k == 1) tpr__comm_mpi_set_max_count(2);  // 3 i32 values in derived-type pieces
      int32_t *buf = malloc(count * sizeof *buf), *want = malloc(count * sizeof *want);
      tpr_rng rng = {seed ^ (uint64_t)(root * 131 + (int)k)};
      for (size_t i = 0; i < count; i++) want[i] = (int32_t)tpr_rng_next(&rng);
      for (size_t i = 0; i < count; i++) buf[i] = R == root ? want[i] : -1;
      if (R == root) usleep(20000);
      tpr_comm_request q = NULL;
      EXPECT_OK(tpr_comm_ibroadcast(comm, buf, count, TPR_I32, root, &q));
      bool done = false;
      int polls = 0;
      while (!done) {
        EXPECT_OK(tpr_comm_test(q, &done));
        if (!done) polls++, usleep(100);
      }
      EXPECT_OK(tpr_comm_wait(q));
      EXPECT(memcmp(buf, want, count * sizeof *buf) == 0, "ibroadcast root %d count %zu: data differs", root, count);
      if (N > 1 && R == 1 && k == 0 && root == 0) print_message("ibroadcast: %d polls before the root's data came\n", polls);
      tpr__comm_mpi_set_max_count(0);
      free(buf), free(want);
    }
  int32_t v = 5;
  tpr_comm_request q = NULL;
  EXPECT_STATUS(tpr_comm_ibroadcast(comm, &v, 1, TPR_I32, N, &q), TPR_ERR_INVALID_ARG);
  EXPECT(q == NULL, "a failed start leaves no request");
  agree();
}

int main(int argc, char **argv) {
  world = tt_mpi_world(&argc, &argv);
  comm = world;
  R = tpr_comm_rank(comm), N = tpr_comm_size(comm);
  if (N > 64) {
    fprintf(stderr, "this test handles up to 64 ranks\n");
    return 1;
  }
  // One seed for all ranks: each rank computes everyone's inputs from it.
  seed = R == 0 ? tt_seed_from_env() : 0;
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_identity),       cmocka_unit_test(test_all_reduce),
      cmocka_unit_test(test_reduce_scatter), cmocka_unit_test(test_all_gather),
      cmocka_unit_test(test_all_to_all),     cmocka_unit_test(test_all_to_allv),
      cmocka_unit_test(test_broadcast),      cmocka_unit_test(test_send_recv),
      cmocka_unit_test(test_count_limit),    cmocka_unit_test(test_device_staging),
      cmocka_unit_test(test_negative_controls), cmocka_unit_test(test_errors),
      cmocka_unit_test(test_nonblocking),    cmocka_unit_test(test_ibroadcast),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (R == 0) printf("# %llu checked calls per rank\n", (unsigned long long)case_no);
  return tt_mpi_finish(world, failed);
}
