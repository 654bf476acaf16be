// No silent hangs (collectives/watchdog.c, comm_check.c): the misbehaving
// program tests/comm_fault runs under mpirun; a rank that skips a collective
// or waits for a message nobody sends must bring every rank down within the
// timeout plus a small margin, naming the ranks that did and did not
// arrive; check mode must catch a count or op mismatch on every rank.
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"

static char exe[4096], tmp[64];
// mpirun start-up and teardown on this 2-core machine take a few seconds.
#define MARGIN_S 15.0

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static run_result run(int np, const char *const *args, double *secs) {
  double t0 = now_s();
  run_result r = tt_run_mpi(np, exe, tmp, args);
  *secs = now_s() - t0;
  printf("comm_fault %s (np %d): exit %d after %.1f s\n--- stderr ---\n%s\n", args[0], np, r.code, *secs, r.err);
  return r;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
  return n;
}

static void test_control_finishes(void **state) {
  double s;
  run_result r = run(3, (const char *const[]){"ok", "5", NULL}, &s);
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.out, "FINISHED"));
  assert_null(strstr(r.err, "watchdog"));
  tt_run_done(&r);
}

static void test_skipped_collective_aborts_all(void **state) {
  const double timeout = 3;
  double s;
  run_result r = run(4, (const char *const[]){"skip", "2", "3", NULL}, &s);
  assert_int_not_equal(r.code, 0);
  assert_true(s < timeout + MARGIN_S);
  assert_null(strstr(r.out, "FINISHED"));
  // Ranks 0, 1, 3 wait in all_reduce #3; rank 2 skipped it and waits in the
  // final barrier, its own third call. Whichever rank reports first, the
  // report names rank 2 as the one missing.
  assert_non_null(strstr(r.err, "exceeded --comm-timeout"));
  assert_non_null(strstr(r.err, "arrived at all_reduce #3: 0 1 3"));
  assert_non_null(strstr(r.err, "missing from all_reduce #3: rank 2: in barrier #3 on group world"));
  for (int k = 0; k < 4; k++) {  // and only rank 2
    char other[64];
    snprintf(other, sizeof other, "missing from all_reduce #3: rank %d:", k);
    assert_int_equal(count_of(r.err, other), k == 2 ? count_of(r.err, "arrived at all_reduce #3") : 0);
  }
  tt_run_done(&r);
}

// The same with a nonblocking all_gather: the watchdog covers the time the
// others spend in tpr_comm_wait.
static void test_skipped_nonblocking_aborts_all(void **state) {
  const double timeout = 3;
  double s;
  run_result r = run(3, (const char *const[]){"iskip", "1", "3", NULL}, &s);
  assert_int_not_equal(r.code, 0);
  assert_true(s < timeout + MARGIN_S);
  assert_null(strstr(r.out, "FINISHED"));
  assert_non_null(strstr(r.err, "exceeded --comm-timeout"));
  assert_non_null(strstr(r.err, "arrived at iall_gather #3: 0 2"));
  assert_non_null(strstr(r.err, "missing from iall_gather #3: rank 1: in barrier #3 on group world"));
  tt_run_done(&r);
}

static void test_unmatched_recv_aborts(void **state) {
  double s;
  run_result r = run(2, (const char *const[]){"recv", "2", NULL}, &s);
  assert_int_not_equal(r.code, 0);
  assert_true(s < 2 + MARGIN_S);
  // Rank 0 names its peer's state; rank 1, in the final barrier, names rank 0
  // as missing from it. Either report may be the one printed.
  assert_non_null(strstr(r.err, "in recv from rank 1"));
  assert_non_null(strstr(r.err, "in barrier #1"));
  tt_run_done(&r);
}

static void test_check_mode_catches_count(void **state) {
  double s;
  run_result r = run(3, (const char *const[]){"count", "1", NULL}, &s);
  assert_int_equal(count_of(r.err, "CHECK-CAUGHT"), 3);  // every rank, not just the odd one
  assert_non_null(strstr(r.err, "count 1001"));
  assert_int_equal(count_of(r.err, "wrong error"), 0);
  tt_run_done(&r);
}

static void test_check_mode_catches_op(void **state) {
  double s;
  run_result r = run(3, (const char *const[]){"op", "2", NULL}, &s);
  assert_int_equal(count_of(r.err, "CHECK-CAUGHT"), 3);
  assert_non_null(strstr(r.err, "calls barrier #1"));
  tt_run_done(&r);
}

int main(void) {
  tt_seed_from_env();
  if (tt_self_exe(exe, sizeof exe) != 0) return 1;
  char *slash = strrchr(exe, '/');
  snprintf(slash + 1, sizeof exe - (size_t)(slash + 1 - exe), "comm_fault");
  if (access(exe, X_OK) != 0) {
    fprintf(stderr, "%s is not built\n", exe);
    return 1;
  }
  snprintf(tmp, sizeof tmp, "/tmp/tpr_watchdog_XXXXXX");
  if (!mkdtemp(tmp)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_control_finishes),
      cmocka_unit_test(test_skipped_collective_aborts_all),
      cmocka_unit_test(test_unmatched_recv_aborts),
      cmocka_unit_test(test_skipped_nonblocking_aborts_all),
      cmocka_unit_test(test_check_mode_catches_count),
      cmocka_unit_test(test_check_mode_catches_op),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(tt_path(tmp, "stdout"));
  unlink(tt_path(tmp, "stderr"));
  rmdir(tmp);
  return failed ? 1 : 0;
}
