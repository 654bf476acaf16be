// The `self` communicator (collectives/tpr_comm.h): a world of one, where
// every collective is the identity. Buffers hold fresh random bytes and a
// guard region after `count` elements that no collective may touch. The
// front's argument checks are the same for every backend; here they run
// without MPI.
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "collectives/tpr_comm.h"

#define GUARD 32

static tpr_comm_t comm;

static int setup(void **state) { return tpr_comm_init_self(&comm) == TPR_OK ? 0 : -1; }
static int teardown(void **state) {
  tpr_comm_free(comm);
  comm = NULL;
  return 0;
}

static void fill_random(void *p, size_t n) {
  for (size_t i = 0; i < n; i++) ((unsigned char *)p)[i] = (unsigned char)tt_next_u64();
}

// count elements of dt holding random finite values of that type (not all zero).
static void *random_values(tpr_dtype dt, size_t count) {
  size_t esz = tpr_dtype_size(dt);
  unsigned char *p = malloc(count * esz + GUARD);
  for (size_t i = 0; i < count; i++) tpr_dtype_store(p, dt, i, tt_uniform(-100, 100));
  tpr_dtype_store(p, dt, 0, 42.0);  // never all zeros
  fill_random(p + count * esz, GUARD);
  return p;
}

static const tpr_dtype reducible[] = {TPR_F32, TPR_BF16, TPR_F16, TPR_I32, TPR_I64};

static void test_identity(void **state) {
  assert_int_equal(tpr_comm_rank(comm), 0);
  assert_int_equal(tpr_comm_size(comm), 1);
  assert_string_equal(tpr_comm_backend(comm), "self");
  assert_string_equal(tpr_comm_name(comm), "world");
  assert_int_equal(tpr_comm_world_rank(comm, 0), 0);
  assert_int_equal(tpr_comm_world_rank(comm, 1), -1);
  assert_int_equal(tpr_comm_world_rank(comm, -1), -1);
  TT_OK(tpr_comm_barrier(comm));
  tpr_comm_set_check(comm, true);  // agreement over one rank: nothing to compare
  TT_OK(tpr_comm_barrier(comm));
  tpr_comm_set_check(comm, false);
  tpr_comm_t second = NULL;
  TT_OK(tpr_comm_init_self(&second));
  assert_ptr_not_equal(second, comm);
  assert_int_equal(tpr_comm_size(second), 1);
  tpr_comm_free(second);
  tpr_comm_free(NULL);
}

static void test_all_reduce_out_of_place(void **state) {
  for (size_t d = 0; d < sizeof reducible / sizeof reducible[0]; d++) {
    tpr_dtype dt = reducible[d];
    for (tpr_red_op op = TPR_SUM; op <= TPR_MIN; op++) {
      size_t count = (size_t)tt_randint(1, 3000), nb = count * tpr_dtype_size(dt);
      unsigned char *send = random_values(dt, count), *copy = malloc(nb + GUARD);
      unsigned char *recv = malloc(nb + GUARD), *recv_guard = malloc(GUARD);
      memcpy(copy, send, nb + GUARD);
      fill_random(recv, nb + GUARD);
      memcpy(recv_guard, recv + nb, GUARD);
      TT_OK(tpr_comm_all_reduce(comm, send, recv, count, dt, op));
      assert_memory_equal(recv, send, nb);
      assert_memory_equal(recv + nb, recv_guard, GUARD);  // nothing past count
      assert_memory_equal(send, copy, nb + GUARD);         // send untouched
      free(send), free(copy), free(recv), free(recv_guard);
    }
  }
}

static void test_all_reduce_in_place(void **state) {
  for (size_t d = 0; d < sizeof reducible / sizeof reducible[0]; d++) {
    tpr_dtype dt = reducible[d];
    for (tpr_red_op op = TPR_SUM; op <= TPR_MIN; op++) {
      size_t count = (size_t)tt_randint(1, 3000), nb = count * tpr_dtype_size(dt);
      unsigned char *buf = random_values(dt, count), *copy = malloc(nb + GUARD);
      memcpy(copy, buf, nb + GUARD);
      TT_OK(tpr_comm_all_reduce(comm, buf, buf, count, dt, op));
      assert_memory_equal(buf, copy, nb + GUARD);
      // Element-wise: op over one rank is the value itself.
      size_t i = (size_t)tt_randint(0, (int64_t)count - 1);
      assert_true(tpr_dtype_load(buf, dt, i) == tpr_dtype_load(copy, dt, i));
      free(buf), free(copy);
    }
  }
}

static void test_all_gather(void **state) {
  for (int d = 0; d < TPR_DTYPE_COUNT; d++) {  // any dtype gathers, f8 and u8 too
    tpr_dtype dt = (tpr_dtype)d;
    size_t count = (size_t)tt_randint(1, 2000), nb = count * tpr_dtype_size(dt);
    unsigned char *send = malloc(nb + GUARD), *recv = malloc(nb + GUARD), *guard = malloc(GUARD);
    fill_random(send, nb + GUARD);
    send[0] |= 1;
    fill_random(recv, nb + GUARD);
    memcpy(guard, recv + nb, GUARD);
    TT_OK(tpr_comm_all_gather(comm, send, recv, count, dt));
    assert_memory_equal(recv, send, nb);
    assert_memory_equal(recv + nb, guard, GUARD);
    // In place: send == recv + rank * count == recv.
    TT_OK(tpr_comm_all_gather(comm, recv, recv, count, dt));
    assert_memory_equal(recv, send, nb);
    free(send), free(recv), free(guard);
  }
}

static void test_empty_and_null(void **state) {
  float x[4];
  tt_fill_normal(x, 4, 1.0);
  float y[4] = {1, 2, 3, 4};
  for (size_t d = 0; d < sizeof reducible / sizeof reducible[0]; d++) {
    TT_OK(tpr_comm_all_reduce(comm, NULL, NULL, 0, reducible[d], TPR_SUM));
    TT_OK(tpr_comm_all_reduce(comm, x, y, 0, reducible[d], TPR_MAX));
  }
  TT_OK(tpr_comm_all_gather(comm, NULL, NULL, 0, TPR_U8));
  assert_true(y[0] == 1 && y[3] == 4);  // count 0 copies nothing
  size_t count = (size_t)tt_randint(1, 4);
  assert_int_equal(tpr_comm_all_reduce(comm, NULL, y, count, TPR_F32, TPR_SUM), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "NULL buffer"));
  assert_int_equal(tpr_comm_all_reduce(comm, x, NULL, count, TPR_F32, TPR_SUM), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_comm_all_reduce(comm, NULL, NULL, count, TPR_I64, TPR_MIN), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_comm_all_gather(comm, NULL, y, count, TPR_F32), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_comm_all_gather(comm, x, NULL, count, TPR_F32), TPR_ERR_INVALID_ARG);
  assert_true(y[0] == 1 && y[1] == 2 && y[2] == 3 && y[3] == 4);  // failed calls write nothing
}

static void test_bad_dtype_and_op(void **state) {
  unsigned char a[64], b[64], keep[64];
  fill_random(a, sizeof a);
  fill_random(b, sizeof b);
  memcpy(keep, b, sizeof b);
  assert_int_equal(tpr_comm_all_reduce(comm, a, b, 8, TPR_F8E4M3, TPR_SUM), TPR_ERR_DTYPE);
  assert_non_null(strstr(tpr_last_error(), "f8"));
  assert_int_equal(tpr_comm_all_reduce(comm, a, b, 8, TPR_U8, TPR_MAX), TPR_ERR_DTYPE);
  assert_non_null(strstr(tpr_last_error(), "u8"));
  assert_int_equal(tpr_comm_all_reduce(comm, a, b, 8, TPR_DTYPE_COUNT, TPR_SUM), TPR_ERR_DTYPE);
  assert_int_equal(tpr_comm_all_reduce(comm, a, b, 8, (tpr_dtype)-1, TPR_SUM), TPR_ERR_DTYPE);
  assert_int_equal(tpr_comm_all_gather(comm, a, b, 8, (tpr_dtype)99), TPR_ERR_DTYPE);
  assert_int_equal(tpr_comm_all_reduce(comm, a, b, 4, TPR_F32, (tpr_red_op)3), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "op 3"));
  assert_int_equal(tpr_comm_all_reduce(comm, a, b, 4, TPR_F32, (tpr_red_op)-1), TPR_ERR_INVALID_ARG);
  assert_memory_equal(b, keep, sizeof b);  // nothing written on any error
}

static void test_reduce_scatter(void **state) {
  for (size_t d = 0; d < sizeof reducible / sizeof reducible[0]; d++) {
    tpr_dtype dt = reducible[d];
    for (tpr_red_op op = TPR_SUM; op <= TPR_MIN; op++) {
      size_t count = (size_t)tt_randint(1, 3000), nb = count * tpr_dtype_size(dt);
      unsigned char *send = random_values(dt, count), *copy = malloc(nb + GUARD);
      unsigned char *recv = malloc(nb + GUARD), *guard = malloc(GUARD);
      memcpy(copy, send, nb + GUARD);
      fill_random(recv, nb + GUARD);
      memcpy(guard, recv + nb, GUARD);
      TT_OK(tpr_comm_reduce_scatter(comm, send, recv, count, dt, op));  // block 0 of 1
      assert_memory_equal(recv, send, nb);
      assert_memory_equal(recv + nb, guard, GUARD);
      assert_memory_equal(send, copy, nb + GUARD);
      TT_OK(tpr_comm_reduce_scatter(comm, send, send, count, dt, op));  // in place: recv == send + 0
      assert_memory_equal(send, copy, nb + GUARD);
      free(send), free(copy), free(recv), free(guard);
    }
  }
  unsigned char a[16] = {0}, b[16];
  assert_int_equal(tpr_comm_reduce_scatter(comm, a, b, 4, TPR_U8, TPR_SUM), TPR_ERR_DTYPE);
  assert_int_equal(tpr_comm_reduce_scatter(comm, a, b, 2, TPR_F32, (tpr_red_op)5), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_comm_reduce_scatter(comm, NULL, b, 2, TPR_F32, TPR_SUM), TPR_ERR_INVALID_ARG);
  TT_OK(tpr_comm_reduce_scatter(comm, NULL, NULL, 0, TPR_F32, TPR_SUM));
}

static void test_all_to_all_and_broadcast(void **state) {
  for (int d = 0; d < TPR_DTYPE_COUNT; d++) {
    tpr_dtype dt = (tpr_dtype)d;
    size_t count = (size_t)tt_randint(1, 2000), nb = count * tpr_dtype_size(dt);
    unsigned char *send = malloc(nb + GUARD), *recv = malloc(nb + GUARD), guard[GUARD];
    fill_random(send, nb + GUARD);
    fill_random(guard, GUARD);
    memcpy(recv + nb, guard, GUARD);
    TT_OK(tpr_comm_all_to_all(comm, send, recv, count, dt));
    assert_memory_equal(recv, send, nb);
    assert_memory_equal(recv + nb, guard, GUARD);
    fill_random(recv, nb);
    TT_OK(tpr_comm_broadcast(comm, send, recv, count, dt, 0));
    assert_memory_equal(recv, send, nb);
    assert_memory_equal(recv + nb, guard, GUARD);
    TT_OK(tpr_comm_broadcast(comm, recv, recv, count, dt, 0));  // in place
    assert_memory_equal(recv, send, nb);
    // Errors: overlap (all_to_all is out of place only), roots outside the group.
    assert_int_equal(tpr_comm_all_to_all(comm, send, send, count, dt), TPR_ERR_INVALID_ARG);
    assert_int_equal(tpr_comm_broadcast(comm, send, recv, count, dt, 1), TPR_ERR_INVALID_ARG);
    assert_int_equal(tpr_comm_broadcast(comm, send, recv, count, dt, -1), TPR_ERR_INVALID_ARG);
    assert_int_equal(tpr_comm_broadcast(comm, NULL, recv, count, dt, 0), TPR_ERR_INVALID_ARG);
    free(send), free(recv);
  }
  TT_OK(tpr_comm_all_to_all(comm, NULL, NULL, 0, TPR_F16));
  TT_OK(tpr_comm_broadcast(comm, NULL, NULL, 0, TPR_F16, 0));
}

// n = 1: send_counts[0] elements from send + send_displs[0] land at
// recv + recv_displs[0]; everything else in recv stays.
static void test_all_to_allv(void **state) {
  for (int d = 0; d < TPR_DTYPE_COUNT; d++) {
    tpr_dtype dt = (tpr_dtype)d;
    size_t esz = tpr_dtype_size(dt), count = (size_t)tt_randint(0, 500);
    size_t sd = (size_t)tt_randint(0, 9), rd = (size_t)tt_randint(0, 9);
    size_t sn = (sd + count + 3) * esz, rn = (rd + count + 5) * esz;
    unsigned char *send = malloc(sn), *recv = malloc(rn), *before = malloc(rn);
    fill_random(send, sn);
    fill_random(recv, rn);
    memcpy(before, recv, rn);
    size_t sc[1] = {count}, sdv[1] = {sd}, rc[1] = {count}, rdv[1] = {rd};
    TT_OK(tpr_comm_all_to_allv(comm, send, sc, sdv, recv, rc, rdv, dt));
    assert_memory_equal(recv + rd * esz, send + sd * esz, count * esz);
    assert_memory_equal(recv, before, rd * esz);
    assert_memory_equal(recv + (rd + count) * esz, before + (rd + count) * esz, rn - (rd + count) * esz);
    if (count) {  // what this rank sends itself must be what it expects
      rc[0] = count - 1;
      memcpy(recv, before, rn);
      assert_int_equal(tpr_comm_all_to_allv(comm, send, sc, sdv, recv, rc, rdv, dt), TPR_ERR_INVALID_ARG);
      assert_memory_equal(recv, before, rn);
    }
    free(send), free(recv), free(before);
  }
  size_t zero[1] = {0}, far[1] = {(size_t)1 << 40};
  TT_OK(tpr_comm_all_to_allv(comm, NULL, zero, far, NULL, zero, far, TPR_I64));  // nothing moves
  assert_int_equal(tpr_comm_all_to_allv(comm, NULL, NULL, zero, NULL, zero, zero, TPR_I64), TPR_ERR_INVALID_ARG);
}

static void test_point_to_point(void **state) {
  unsigned char a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {0};
  // The only rank is this one: there is no peer to talk to.
  assert_int_equal(tpr_comm_send(comm, a, 8, TPR_U8, 0), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "peer 0"));
  assert_int_equal(tpr_comm_recv(comm, b, 8, TPR_U8, 0), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_comm_send(comm, a, 8, TPR_U8, 1), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_comm_recv(comm, b, 8, TPR_U8, -1), TPR_ERR_INVALID_ARG);
  for (int i = 0; i < 8; i++) assert_int_equal(b[i], 0);
}

static void test_split(void **state) {
  tpr_comm_t g = NULL;
  TT_OK(tpr_comm_split(comm, 7, -3, "tp", &g));
  assert_non_null(g);
  assert_int_equal(tpr_comm_size(g), 1);
  assert_int_equal(tpr_comm_rank(g), 0);
  assert_string_equal(tpr_comm_name(g), "tp");
  assert_string_equal(tpr_comm_backend(g), "self");
  assert_int_equal(tpr_comm_world_rank(g, 0), 0);
  float x = 3.5f, y = 0;
  TT_OK(tpr_comm_all_reduce(g, &x, &y, 1, TPR_F32, TPR_SUM));
  assert_true(y == 3.5f);
  tpr_comm_t h = NULL;
  TT_OK(tpr_comm_split(g, 0, 0, "ep", &h));  // a split of a split
  assert_non_null(h);
  assert_string_equal(tpr_comm_name(h), "ep");
  tpr_comm_free(h);
  tpr_comm_free(g);
  g = comm;  // must be overwritten
  TT_OK(tpr_comm_split(comm, -1, 0, "none", &g));
  assert_null(g);
}

// Nonblocking forms: complete at the start (the copy), equal to the blocking
// calls bit for bit, several outstanding and waited in reverse; a backend
// without the entries is TPR_ERR_UNSUPPORTED naming it (negative control).
static const tpr_comm_vtable bare_vtable = {.name = "bare"};
static char bare_ctx;

static void test_nonblocking(void **state) {
  enum { K = 4 };
  const tpr_dtype dts[K] = {TPR_F32, TPR_BF16, TPR_I64, TPR_F16};
  size_t count = 1 + (size_t)tt_randint(0, 5000);
  void *in[K], *got[K], *want[K];
  tpr_comm_request req[K];
  for (int k = 0; k < K; k++) {
    size_t bytes = count * tpr_dtype_size(dts[k]);
    in[k] = random_values(dts[k], count);
    got[k] = malloc(bytes + GUARD), want[k] = malloc(bytes + GUARD);
    fill_random(got[k], bytes + GUARD);
    memcpy(want[k], got[k], bytes + GUARD);
    if (k % 2) TT_OK(tpr_comm_ireduce_scatter(comm, in[k], got[k], count, dts[k], TPR_SUM, &req[k]));
    else TT_OK(tpr_comm_iall_gather(comm, in[k], got[k], count, dts[k], &req[k]));
  }
  bool done = false;
  TT_OK(tpr_comm_test(req[0], &done));
  assert_true(done);
  for (int k = K - 1; k >= 0; k--) TT_OK(tpr_comm_wait(req[k]));
  for (int k = 0; k < K; k++) {
    size_t bytes = count * tpr_dtype_size(dts[k]);
    if (k % 2) TT_OK(tpr_comm_reduce_scatter(comm, in[k], want[k], count, dts[k], TPR_SUM));
    else TT_OK(tpr_comm_all_gather(comm, in[k], want[k], count, dts[k]));
    assert_memory_equal(got[k], want[k], bytes + GUARD);  // result and guard
    assert_memory_equal(got[k], in[k], bytes);
    free(in[k]), free(got[k]), free(want[k]);
  }
  // In place is a no-op.
  float x[3] = {1, 2, 3};
  tpr_comm_request r = NULL;
  TT_OK(tpr_comm_ireduce_scatter(comm, x, x, 3, TPR_F32, TPR_MAX, &r));
  TT_OK(tpr_comm_wait(r));
  assert_true(x[0] == 1 && x[1] == 2 && x[2] == 3);
  // Argument checks as the blocking calls.
  assert_int_equal(tpr_comm_ireduce_scatter(comm, x, x, 3, TPR_U8, TPR_SUM, &r), TPR_ERR_DTYPE);
  assert_null(r);
  assert_int_equal(tpr_comm_iall_gather(comm, NULL, x, 3, TPR_F32, &r), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_comm_test(NULL, NULL), TPR_ERR_INVALID_ARG);
  tpr_comm_t bare = NULL;
  TT_OK(tpr__comm_new(&bare_vtable, &bare_ctx, 0, 1, NULL, "tp", NULL, &bare));
  assert_int_equal(tpr_comm_iall_gather(bare, x, x, 1, TPR_F32, &r), TPR_ERR_UNSUPPORTED);
  assert_non_null(strstr(tpr_last_error(), "bare backend has no iall_gather"));
  assert_int_equal(tpr_comm_ireduce_scatter(bare, x, x, 1, TPR_F32, TPR_SUM, &r), TPR_ERR_UNSUPPORTED);
  assert_non_null(strstr(tpr_last_error(), "ireduce_scatter"));
  print_message("nonblocking on self: %d requests of %zu elements outstanding, equal to the blocking calls; "
                "bare backend: %s\n", K, count, tpr_last_error());
  tpr_comm_free(bare);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_identity),
      cmocka_unit_test(test_all_reduce_out_of_place),
      cmocka_unit_test(test_all_reduce_in_place),
      cmocka_unit_test(test_all_gather),
      cmocka_unit_test(test_empty_and_null),
      cmocka_unit_test(test_bad_dtype_and_op),
      cmocka_unit_test(test_reduce_scatter),
      cmocka_unit_test(test_all_to_all_and_broadcast),
      cmocka_unit_test(test_all_to_allv),
      cmocka_unit_test(test_point_to_point),
      cmocka_unit_test(test_split),
      cmocka_unit_test(test_nonblocking),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
