// In-register FLOP/s probes (bench_peak.h). Each thread runs ACC
// independent multiply-add chains on constants for a fixed count of
// iterations; the count doubles until the slowest thread's run lasts 50 ms.
// The chains converge (x <- x * 0.5 + 1 stays near 2; the bf16 sums grow by
// 2^-12 a step), so no value turns denormal or infinite and slows the units.
#include "launch/bench_peak.h"

#include <omp.h>
#include <stdint.h>

#include "runtime/cpu_isa.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define PEAK_X86 1
#endif

enum { ACC = 12 };  // independent chains: more than FMA latency x units on current cores

#ifdef PEAK_X86
__attribute__((target("avx512f"))) static float f32_avx512(int64_t iters) {
  __m512 acc[ACC], a = _mm512_set1_ps(0.5f), b = _mm512_set1_ps(1.0f);
  for (int i = 0; i < ACC; i++) acc[i] = _mm512_set1_ps((float)i);
  for (int64_t n = 0; n < iters; n++)
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float f32_avx2(int64_t iters) {
  __m256 acc[ACC], a = _mm256_set1_ps(0.5f), b = _mm256_set1_ps(1.0f);
  for (int i = 0; i < ACC; i++) acc[i] = _mm256_set1_ps((float)i);
  for (int64_t n = 0; n < iters; n++)
    for (int i = 0; i < ACC; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < ACC; i++) s = _mm256_add_ps(s, acc[i]);
  float l[8], t = 0;
  _mm256_storeu_ps(l, s);
  for (int i = 0; i < 8; i++) t += l[i];
  return t;
}

__attribute__((target("avx512f,avx512bf16"))) static float bf16_avx512(int64_t iters) {
  __m512 acc[ACC];
  // 2^-6 in bf16 (0x3C80) in every half: each vdpbf16ps adds 2 x 2^-12 per lane.
  const __m512bh x = (__m512bh)_mm512_set1_epi16((short)0x3C80);
  for (int i = 0; i < ACC; i++) acc[i] = _mm512_set1_ps((float)i);
  for (int64_t n = 0; n < iters; n++)
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], x, x);
  __m512 s = acc[0];
  for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

static bool cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit) {
  unsigned r[4] = {0};
  if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1u;
}
#endif

typedef float (*probe_fn)(int64_t);

// GFLOP/s of `fn` (flops_per_iter per call iteration) on `threads` threads.
static double measure(probe_fn fn, double flops_per_iter, int threads) {
  volatile float sink = 0;
  for (int64_t iters = 1 << 12;; iters *= 2) {
    double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
    {
      float r = fn(iters);
#pragma omp atomic
      sink += r;
    }
    double dt = omp_get_wtime() - t0;
    if (dt >= 0.05 || iters >= (int64_t)1 << 40) return flops_per_iter * (double)iters * threads / dt * 1e-9;
  }
}

void tpr_bench_peak_measure(int threads, tpr_bench_peak *out) {
  *out = (tpr_bench_peak){.isa = tpr_cpu_isa_name(TPR_ISA_PORTABLE), .threads = threads > 0 ? threads : 1};
#ifdef PEAK_X86
  const tpr_cpu_isa isa = tpr_cpu_isa_active();
  out->isa = tpr_cpu_isa_name(isa);
  // Per iteration: ACC vector FMAs of 2 flops a lane; vdpbf16ps: 2 products and 2 adds a lane.
  if (isa >= TPR_ISA_AVX512) out->f32_gflops = measure(f32_avx512, ACC * 16 * 2.0, out->threads);
  else if (isa >= TPR_ISA_AVX2) out->f32_gflops = measure(f32_avx2, ACC * 8 * 2.0, out->threads);
  // AVX512_BF16: CPUID.(7,1):EAX bit 5; AMX-BF16: CPUID.(7,0):EDX bit 22.
  out->has_bf16_dot = tpr_cpu_has_bf16_dot();
  out->has_amx_bf16 = cpuid_bit(7, 0, 3, 22);
  if (out->has_bf16_dot) out->bf16_gflops = measure(bf16_avx512, ACC * 16 * 4.0, out->threads);
#endif
}
