// The node-local rank count and the CPU backend's thread count read from
// the launcher's environment (runtime/backend.h): Open MPI's mpirun
// (OMPI_COMM_WORLD_LOCAL_SIZE), srun --mpi=pmix (SLURM_STEP_TASKS_PER_NODE
// at SLURM_NODEID, SLURM_CPUS_PER_TASK) and their order of precedence.
// Malformed values fall through to the next source, never crash.
#include "test_util.h"

#include <stdlib.h>
#include <unistd.h>

static const char *const all_vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                                       "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_CPUS_PER_TASK",
                                       "TPR_NUM_THREADS"};

static int clear_env(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof all_vars / sizeof *all_vars; i++) unsetenv(all_vars[i]);
  return 0;
}

static int threads_now(void) {
  tpr_backend *b;
  TT_OK(tpr_backend_cpu_new(NULL, &b));
  int n = tpr_backend_cpu_threads(b);
  tpr_backend_free(b);
  return n;
}

// srun's per-node lists: "2(x3),1" is 2,2,2,1 tasks on nodes 0..3.
static void test_slurm_step_list(void **state) {
  (void)state;
  static const struct { const char *list, *node; int want; } cases[] = {
      {"2(x3),1", "0", 2}, {"2(x3),1", "2", 2}, {"2(x3),1", "3", 1}, {"2(x3),1", "4", 1 /* past the list */},
      {"4", "0", 4},       {"3,5,7", "1", 5},    {"3,5,7", "2", 7},    {"1(x2),6(x2)", "3", 6},
      // malformed: the fallback of 1
      {"2(x", "0", 1},     {"2(y3)", "0", 1},    {"", "0", 1},         {"x", "0", 1},
      {"2(x3),1", "-1", 1}, {"2(x3),1", "1a", 1}, {"0,2", "0", 1},     {"2,,3", "1", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    setenv("SLURM_STEP_TASKS_PER_NODE", cases[i].list, 1);
    setenv("SLURM_NODEID", cases[i].node, 1);
    int got = tpr_local_ranks_from_env();
    if (got != cases[i].want)
      fail_msg("SLURM_STEP_TASKS_PER_NODE=%s SLURM_NODEID=%s: %d local ranks, want %d", cases[i].list, cases[i].node,
               got, cases[i].want);
  }
  unsetenv("SLURM_NODEID");  // a list without the node's index says nothing
  assert_int_equal(tpr_local_ranks_from_env(), 1);
}

// mpirun's own count wins over Slurm's (mpirun inside an allocation inherits
// the batch step's SLURM_* variables, which describe the batch step); the
// step's list wins over SLURM_NTASKS_PER_NODE, which may be the allocation's.
static void test_precedence(void **state) {
  (void)state;
  assert_int_equal(tpr_local_ranks_from_env(), 1);
  setenv("SLURM_NTASKS_PER_NODE", "3", 1);
  assert_int_equal(tpr_local_ranks_from_env(), 3);
  setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2)", 1);
  setenv("SLURM_NODEID", "1", 1);
  assert_int_equal(tpr_local_ranks_from_env(), 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x", 1);  // malformed: the next source
  assert_int_equal(tpr_local_ranks_from_env(), 3);
  setenv("MPI_LOCALNRANKS", "4", 1);
  assert_int_equal(tpr_local_ranks_from_env(), 4);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "5", 1);
  assert_int_equal(tpr_local_ranks_from_env(), 5);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "x", 1);  // not a count: the next source
  assert_int_equal(tpr_local_ranks_from_env(), 4);
}

static void test_threads(void **state) {
  (void)state;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int base = (int)(cores > 0 ? cores : 1);
  assert_int_equal(threads_now(), base);  // alone: every core
  setenv("SLURM_CPUS_PER_TASK", "3", 1);
  assert_int_equal(threads_now(), 3);  // what Slurm gave the task, whatever the cores
  setenv("SLURM_NTASKS_PER_NODE", "64", 1);
  assert_int_equal(threads_now(), 3);  // not divided again by the ranks: it is per task
  setenv("TPR_NUM_THREADS", "2", 1);
  assert_int_equal(threads_now(), 2);  // the explicit setting wins
  unsetenv("TPR_NUM_THREADS");
  static const char *const bad[] = {"0", "-2", "2x", "", "99999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("SLURM_CPUS_PER_TASK", bad[i], 1);
    int got = threads_now(), want = base / 64 > 0 ? base / 64 : 1;  // ignored: cores / local ranks
    if (got != want) fail_msg("SLURM_CPUS_PER_TASK='%s': %d threads, want %d", bad[i], got, want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_slurm_step_list, clear_env),
      cmocka_unit_test_setup(test_precedence, clear_env),
      cmocka_unit_test_setup(test_threads, clear_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
