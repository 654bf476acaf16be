// The CPU's arithmetic peak, measured in registers on the bench's threads:
// what prefill's GEMMs could reach on this ISA, beside sgemm's achieved
// rate (tpr bench model). Dense FMAs and, where the CPU has AVX512_BF16,
// bf16 dot products (vdpbf16ps: two products per f32 lane), each on
// independent accumulators so latency never limits them. AMX is detected
// and reported, not probed (its tiles need the kernel's permission first).
#ifndef TPR_LAUNCH_BENCH_PEAK_H
#define TPR_LAUNCH_BENCH_PEAK_H

#include <stdbool.h>

typedef struct tpr_bench_peak {
  const char *isa;         // the vector level the f32 probe ran ("avx512", "avx2", "portable")
  double f32_gflops;       // f32 FMA peak over `threads` threads (portable: 0, not probed)
  bool has_bf16_dot;       // AVX512_BF16
  double bf16_gflops;      // bf16 dot peak (0 without AVX512_BF16)
  bool has_amx_bf16;       // AMX-BF16 tiles (reported only)
  int threads;
} tpr_bench_peak;

// Runs each probe for about 50 ms on `threads` OpenMP threads at once.
void tpr_bench_peak_measure(int threads, tpr_bench_peak *out);

#endif
