// CPU instruction-set detection and the user's override (runtime/cpu_isa.h).
#include "runtime/cpu_isa.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/log.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

// -1 = not decided yet. Atomic because kernels on OpenMP threads may ask
// while a test forces a level; every writer stores a complete value.
static _Atomic int g_active = -1;

tpr_cpu_isa tpr_cpu_isa_detect(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 15 has no "f16c" for
  // __builtin_cpu_supports, and the fuzz build (scripts/fuzz.sh) uses clang.
  unsigned a, b, c = 0, d;
  bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c))
    return TPR_ISA_PORTABLE;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return TPR_ISA_AVX512;
  return TPR_ISA_AVX2;
#else
  return TPR_ISA_PORTABLE;
#endif
}

bool tpr_cpu_has_bf16_dot(void) {
  if (tpr_cpu_isa_active() < TPR_ISA_AVX512) return false;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static int has = -1;  // every thread that races here stores the same value
  if (has < 0) {
    unsigned a = 0, b, c, d;
    has = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
  }
  return has;
#else
  return false;
#endif
}

const char *tpr_cpu_isa_name(tpr_cpu_isa isa) {
  switch (isa) {
    case TPR_ISA_PORTABLE: return "portable";
    case TPR_ISA_AVX2: return "avx2";
    case TPR_ISA_AVX512: return "avx512";
  }
  return "?";
}

static tpr_cpu_isa from_env(tpr_cpu_isa best) {
  const char *env = getenv("TPR_CPU_ISA");
  if (!env || !*env) return best;
  tpr_cpu_isa want;
  if (strcasecmp(env, "portable") == 0) want = TPR_ISA_PORTABLE;
  else if (strcasecmp(env, "avx2") == 0) want = TPR_ISA_AVX2;
  else if (strcasecmp(env, "avx512") == 0) want = TPR_ISA_AVX512;
  else {
    TPR_LOG_WRN("TPR_CPU_ISA='%s' is not one of portable|avx2|avx512; using %s", env, tpr_cpu_isa_name(best));
    return best;
  }
  if (want > best) {
    TPR_LOG_WRN("TPR_CPU_ISA=%s: this CPU lacks it; using %s", env, tpr_cpu_isa_name(best));
    return best;
  }
  return want;
}

static void init_active(void) {
  // Runs once (so the environment warning prints once); a level forced
  // before the first use wins over the environment.
  int expected = -1;
  atomic_compare_exchange_strong(&g_active, &expected, (int)from_env(tpr_cpu_isa_detect()));
}

tpr_cpu_isa tpr_cpu_isa_active(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  int v = atomic_load(&g_active);
  if (v >= 0) return (tpr_cpu_isa)v;
  pthread_once(&once, init_active);
  return (tpr_cpu_isa)atomic_load(&g_active);
}

void tpr_cpu_isa_force(tpr_cpu_isa isa) {
  tpr_cpu_isa best = tpr_cpu_isa_detect();
  if ((int)isa < 0) isa = TPR_ISA_PORTABLE;
  atomic_store(&g_active, (int)(isa > best ? best : isa));
}
