// Run-time choice of the CPU's vector instruction set for the hand-written
// kernels (runtime/ops/skinny_gemm*.c). The library is compiled for the
// baseline x86-64 (or ARM) so one binary runs anywhere; the kernels that use
// AVX2 or AVX-512 are compiled per function with a target attribute and are
// called only when this module says the CPU (and the user) allow it.
#ifndef TPR_CPU_ISA_H
#define TPR_CPU_ISA_H

#include <stdbool.h>

// Ordered: a higher level implies the lower ones on every CPU we dispatch to.
typedef enum tpr_cpu_isa { TPR_ISA_PORTABLE = 0, TPR_ISA_AVX2 = 1, TPR_ISA_AVX512 = 2 } tpr_cpu_isa;

// The best level this CPU supports: AVX2 needs avx2+fma+f16c, AVX-512 needs
// avx512f+avx512bw+avx512vl on top. Always TPR_ISA_PORTABLE off x86-64.
tpr_cpu_isa tpr_cpu_isa_detect(void);

// The level the kernels use: detect(), lowered by the environment variable
// TPR_CPU_ISA=portable|avx2|avx512. A level the CPU lacks gives the best it
// has (with one warning); an unknown name is warned about and ignored. Read
// once and cached.
tpr_cpu_isa tpr_cpu_isa_active(void);

// Tests and benchmarks: sets the active level, clamped to detect().
void tpr_cpu_isa_force(tpr_cpu_isa isa);

// Whether the kernels may use AVX512_BF16's dot products (vdpbf16ps): the
// active level is AVX-512 and the CPU has avx512_bf16 (CPUID 7.1 EAX bit 5).
// Follows tpr_cpu_isa_active(), so TPR_CPU_ISA=avx2 turns them off too.
bool tpr_cpu_has_bf16_dot(void);

// "portable", "avx2", "avx512"; "?" for anything else.
const char *tpr_cpu_isa_name(tpr_cpu_isa isa);

#endif
