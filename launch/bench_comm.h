// tpr bench comm: bandwidth of every collective in the nccl-tests format
// (size, count, time, algbw, busbw, #wrong), optionally next to the same
// calls made through raw MPI on the same communicator.
#ifndef TPR_BENCH_COMM_H
#define TPR_BENCH_COMM_H

// argv[0] is "comm"; returns the exit code (0 ok, 1 failure or wrong
// results, 2 bad usage).
int tpr_bench_comm(int argc, char **argv);

#endif
