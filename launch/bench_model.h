// tpr bench model: MiniMax-M2 prefill and decode speed under tensor
// parallelism, against this machine's sgemm rate and memory read bandwidth
// measured in the same run.
#ifndef TPR_BENCH_MODEL_H
#define TPR_BENCH_MODEL_H

// argv[0] is "model"; returns the exit code (0 ok, 1 failure, 2 bad usage).
int tpr_bench_model(int argc, char **argv);

#endif
