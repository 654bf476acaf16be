// tpr bench <what>: the benchmarks (docs/architecture.md section 10: benchmarks are
// commands that print a table and --json, never timed assertions in tests).
// Adding one is one line in `benches` and its header.
#include <stdio.h>
#include <string.h>

#include "launch/bench_comm.h"
#include "launch/bench_model.h"
#include "launch/bench_moe.h"
#include "launch/bench_serve.h"
// -- bench kernels include
#include "launch/bench_kernels.h"
#include "launch/commands.h"

static const tpr_command benches[] = {
    {"comm", "bandwidth of the collectives (nccl-tests columns), optionally against raw MPI", tpr_bench_comm},
    {"model", "prefill/decode tokens/s of a checkpoint (any family tpr runs) against the measured sgemm rate and read "
              "bandwidth",
     tpr_bench_model},
    {"moe", "one MoE layer, both dispatchers: exchange GB/s and grouped GEMM GFLOP/s against all_to_all and sgemm",
     tpr_bench_moe},
    {"serve", "tpr serve under N streaming HTTP clients (tok/s, TTFT, ITL) against tpr bench model on the same prompts",
     tpr_bench_serve},
    // -- bench kernels entry
    {"kernels", "skinny GEMM per weight dtype against memory read GB/s; dequant+sgemm against f32 sgemm", tpr_bench_kernels},
};
#define N_BENCHES (sizeof benches / sizeof benches[0])

static void usage(FILE *f) {
  fprintf(f,
          "usage: tpr bench <benchmark> [options]\n"
          "       mpirun -np N tpr bench <benchmark> [options]\n\n"
          "benchmarks:\n");
  for (size_t i = 0; i < N_BENCHES; i++) fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].summary);
  fprintf(f, "\n'tpr bench <benchmark> --help' describes its options.\n");
}

int tpr_cmd_bench(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < N_BENCHES; i++)
    if (strcmp(argv[1], benches[i].name) == 0) return benches[i].run(argc - 1, argv + 1);
  fprintf(stderr, "tpr bench: unknown benchmark '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
