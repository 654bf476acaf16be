// tpr bench kernels: the CPU decode kernels (dequantising skinny GEMM) against
// this machine's memory read bandwidth, and the dequant + sgemm path of large
// batches against plain f32 sgemm, measured in the same run.
#ifndef TPR_BENCH_KERNELS_H
#define TPR_BENCH_KERNELS_H

// argv[0] is "kernels"; returns the exit code (0 ok, 1 failure, 2 bad usage).
int tpr_bench_kernels(int argc, char **argv);

#endif
