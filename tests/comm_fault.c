// A program that misbehaves on purpose, run under mpirun by
// test_comm_watchdog: one rank skips a collective, or passes a different
// count, or waits for a message nobody sends.
//   comm_fault skip RANK TIMEOUT      rank RANK skips the last all_reduce (#3) and waits
//                                     in the final barrier
//   comm_fault iskip RANK TIMEOUT     call #3 is a nonblocking all_gather that rank RANK never
//                                     starts; the others wait for it in tpr_comm_wait
//   comm_fault count RANK             check mode: rank RANK passes count + 1
//   comm_fault op RANK                check mode: rank RANK calls a barrier instead
//   comm_fault recv TIMEOUT           rank 0 receives from rank 1, which never sends
//   comm_fault ok TIMEOUT             every rank behaves (control)
// In the check-mode cases every rank must get TPR_ERR_COMM naming the odd
// rank; it prints "CHECK-CAUGHT" and exits 3, or exits 1 if the collective
// went through.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/tpr_comm.h"

#define N 1000

static int finish(tpr_comm_t world, int code) {
  tpr_comm_watchdog_stop();
  tpr_comm_free(world);
  tpr_comm_mpi_finalize();
  return code;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  const char *mode = argv[1];
  tpr_comm_t world = NULL;
  if (tpr_comm_mpi_init(&argc, &argv) != TPR_OK || tpr_comm_init_mpi_world(&world) != TPR_OK) {
    fprintf(stderr, "setup: %s\n", tpr_last_error());
    return 1;
  }
  int rank = tpr_comm_rank(world), odd = atoi(argv[2]);
  bool iskip = strcmp(mode, "iskip") == 0;
  double timeout = strcmp(mode, "skip") == 0 || iskip ? atof(argv[3]) : atof(argv[2]);
  if (strcmp(mode, "count") == 0 || strcmp(mode, "op") == 0) {
    timeout = 30;
    tpr_comm_set_check(world, true);
  }
  if (tpr_comm_watchdog_start(timeout) != TPR_OK) return finish(world, 1);
  float x[N + 1];
  for (int i = 0; i <= N; i++) x[i] = (float)(rank + i % 7);
  if (!strcmp(mode, "recv")) {
    if (rank == 0 && tpr_comm_recv(world, x, 4, TPR_F32, 1) != TPR_OK) return finish(world, 1);
  } else if (!strcmp(mode, "count") || !strcmp(mode, "op")) {
    tpr_status rc = rank == odd && !strcmp(mode, "op") ? tpr_comm_barrier(world)
                    : tpr_comm_all_reduce(world, x, x, N + (rank == odd), TPR_F32, TPR_SUM);
    if (rc == TPR_OK) return finish(world, 1);
    char want[32];
    snprintf(want, sizeof want, "rank %d (world %d) calls", odd, odd);
    bool named = rc == TPR_ERR_COMM && strstr(tpr_last_error(), want) && strstr(tpr_last_error(), "differs");
    fprintf(stderr, "rank %d: %s: %s\n", rank, named ? "CHECK-CAUGHT" : "wrong error", tpr_last_error());
    return finish(world, named ? 3 : 1);
  } else {
    for (int k = 1; k <= 3; k++) {
      if ((!strcmp(mode, "skip") || iskip) && k == 3 && rank == odd) continue;
      if (iskip && k == 3) {
        float all[64 * N];
        tpr_comm_request req = NULL;
        bool done = false;
        if (tpr_comm_iall_gather(world, x, all, N, TPR_F32, &req) != TPR_OK) return finish(world, 1);
        for (int p = 0; p < 100 && !done; p++)  // polls never complete it: rank `odd` is missing
          if (tpr_comm_test(req, &done) != TPR_OK) return finish(world, 1);
        if (tpr_comm_wait(req) != TPR_OK) return finish(world, 1);
        continue;
      }
      if (tpr_comm_all_reduce(world, x, x, N, TPR_F32, TPR_SUM) != TPR_OK) return finish(world, 1);
    }
  }
  // As tpr_world_finish: wait for the others, watched.
  if (tpr_comm_barrier(world) != TPR_OK) return finish(world, 1);
  if (rank == 0) printf("FINISHED\n");
  return finish(world, 0);
}
