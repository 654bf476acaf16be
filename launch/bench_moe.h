// tpr bench moe: one MoE layer of a config's shapes with random weights,
// both dispatchers side by side, each op category timed, the exchange
// against tpr_comm_all_to_all and the grouped GEMM against plain sgemm
// measured in the same run.
#ifndef TPR_BENCH_MOE_H
#define TPR_BENCH_MOE_H

// argv[0] is "moe"; returns the exit code (0 ok, 1 failure, 2 bad usage).
int tpr_bench_moe(int argc, char **argv);

#endif
