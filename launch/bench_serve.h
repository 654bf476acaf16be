// tpr bench serve: serving throughput and latency of tpr serve under N
// concurrent streaming clients, beside tpr bench model's engine throughput
// on the same prompts, measured in the same run.
#ifndef TPR_BENCH_SERVE_H
#define TPR_BENCH_SERVE_H

// argv[0] is "serve"; returns the exit code (0 ok, 1 failure, 2 bad usage).
int tpr_bench_serve(int argc, char **argv);

#endif
