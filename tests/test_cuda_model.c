// MiniMax-M2 on the CUDA backend against the CPU backend: `tpr forward
// --device cuda` logits on the transformers fixture, alone and under mpirun
// -np 2 (one GPU per rank when there are two, else both on one), and against
// transformers' own logits. Without a GPU it exits 77: ctest reports it
// skipped, never passed.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "m2_ref.h"
#include "runtime/backend_cuda.h"

#define CUDA_VS_CPU_BOUND 1e-5  // same f32 math, other summation orders (cuBLAS vs OpenBLAS)

static char tpr_path[4096], tmp_dir[] = "/tmp/tpr_test_cuda_model_XXXXXX";
static m2_ref ref;

static float *forward(int np, const char *device, const char *tokens, int64_t T) {
  const char *out = tt_path(tmp_dir, "logits.safetensors");
  unlink(out);
  const char *args[] = {"forward", "--model", M2_FIX, "--tokens", tokens, "--out", out, "--device", device, "--json",
                        NULL};
  cJSON *j = tt_json_of(tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 300}));
  cJSON_Delete(j);
  float *x = m2_read_logits(out, "logits", T);
  unlink(out);
  return x;
}

static void test_logits(void **state) {
  const int nps[] = {0, 2};
  for (int i = 0; i < 2; i++) {
    float *cpu = forward(nps[i], "cpu", ref.a_text, M2_TA), *gpu = forward(nps[i], "cuda", ref.a_text, M2_TA);
    double e = m2_rel_err(gpu, cpu, M2_TA * M2_V), et = m2_rel_err(gpu, ref.logits_a, M2_TA * M2_V);
    printf("np %d: cuda vs cpu %.3g (bound %.0e), cuda vs transformers %.3g (bound %.0e)\n", nps[i] ? nps[i] : 1, e,
           CUDA_VS_CPU_BOUND, et, M2_PARITY_BOUND);
    assert_true(e <= CUDA_VS_CPU_BOUND && et <= M2_PARITY_BOUND);
    free(cpu), free(gpu);
  }
}

static int setup(void **state) {
  m2_ref_load(&ref);
  return 0;
}

int main(void) {
  if (tpr_cuda_device_count() == 0) {
    printf("test_cuda_model: no CUDA device (or a build without CUDA): skipped\n");
    return 77;
  }
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_cuda_model") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_logits)};
  int rc = cmocka_run_group_tests(tests, setup, NULL);
  unlink(tt_path(tmp_dir, "stdout"));
  unlink(tt_path(tmp_dir, "stderr"));
  rmdir(tmp_dir);
  return rc;
}
