// The model commands' smaller parts: `tpr compare` (its verdict, tolerance
// and errors), `tpr bench model` (one run alone and under mpirun, its JSON
// fields consistent, bad usage), and the checks `tpr run` makes up front
// (including --device cuda on a machine without a GPU).
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/backend_cuda.h"

#define FIX TPR_FIXTURES "/minimax_m2_tiny"
#define REF FIX "/reference.safetensors"

static char tpr_path[4096], tmp_dir[] = "/tmp/tpr_test_cli_model_XXXXXX";

static run_result run(int np, const char *const *args) {
  return tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 120});
}
#define RUN(np, ...) run(np, (const char *const[]){__VA_ARGS__, NULL})

static void expect_exit(run_result r, int code, const char *in_err) {
  if (r.code != code) fail_msg("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.out, r.err);
  if (in_err && !strstr(r.err, in_err)) fail_msg("expected '%s' in stderr:\n%s", in_err, r.err);
  tt_run_done(&r);
}

static void test_compare(void **state) {
  // A tensor against itself: zero difference, a pass.
  cJSON *j = tt_json_of(RUN(0, "compare", "--a", REF, "--a-key", "logits_a", "--b", REF, "--json"));
  assert_true(tt_json_num(j, "rel") == 0 && tt_json_num(j, "numel") == 11 * 256);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "pass")));
  cJSON_Delete(j);
  // Our logits against transformers': within 1e-4, but not within 1e-9.
  char out[4200];
  snprintf(out, sizeof out, "%s/logits.safetensors", tmp_dir);
  expect_exit(RUN(0, "forward", "--model", FIX, "--tokens", "138,5,208,45,52,129,193,193,28,94,228", "--out", out),
              0, NULL);
  j = tt_json_of(RUN(0, "compare", "--a", out, "--a-key", "logits", "--b", REF, "--b-key", "logits_a", "--json"));
  double rel = tt_json_num(j, "rel");
  printf("tpr compare: our logits vs transformers': %.3g\n", rel);
  assert_true(rel > 0 && rel <= 1e-4);
  cJSON_Delete(j);
  expect_exit(RUN(0, "compare", "--a", out, "--a-key", "logits", "--b", REF, "--b-key", "logits_a", "--tol", "1e-9"),
              1, NULL);
  // Shapes that differ, a missing key, a missing file, missing flags.
  expect_exit(RUN(0, "compare", "--a", REF, "--a-key", "logits_a", "--b", REF, "--b-key", "logits_b"), 1,
              "different shapes");
  expect_exit(RUN(0, "compare", "--a", REF, "--a-key", "nope", "--b", REF), 1, "no tensor 'nope'");
  expect_exit(RUN(0, "compare", "--a", "/nonexistent.safetensors", "--a-key", "x", "--b", REF), 1, "nonexistent");
  expect_exit(RUN(0, "compare", "--a", REF), 2, "required");
  unlink(out);
}

static void check_bench_json(cJSON *j, int ranks) {
  assert_true(tt_json_num(j, "world_size") == ranks && tt_json_num(j, "tp") == ranks);
  const char *positive[] = {"prefill_tok_s", "decode_tok_s", "prefill_gflops_per_rank", "decode_weight_gbs_per_rank",
                            "machine_gemm_gflops_per_rank", "machine_read_gbs_per_rank", "peak_rss_bytes_max"};
  for (size_t i = 0; i < sizeof positive / sizeof *positive; i++)
    if (!(tt_json_num(j, positive[i]) > 0)) fail_msg("%s is not positive", positive[i]);
  // Efficiencies are the figures over the roofline measured in the same run.
  double eff = tt_json_num(j, "prefill_gemm_efficiency"),
         want = tt_json_num(j, "prefill_gflops_per_rank") / tt_json_num(j, "machine_gemm_gflops_per_rank");
  assert_true(eff > 0 && fabs(eff - want) <= 1e-3 * want + 1e-4);
  const cJSON *rss = cJSON_GetObjectItemCaseSensitive(j, "peak_rss_bytes");
  assert_int_equal(cJSON_GetArraySize(rss), ranks);
  // The ISA's peak from the in-register probe: f32 FMA wherever the kernels
  // vectorise; bf16 dot only with AVX512_BF16, null otherwise; the
  // efficiencies are prefill's rate over them. (No timing is compared: the
  // probes run while other tests load the machine.)
  const char *isa = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "machine_isa"));
  assert_non_null(isa);
  const cJSON *f32 = cJSON_GetObjectItemCaseSensitive(j, "machine_f32_fma_peak_gflops_per_rank");
  const cJSON *bf16 = cJSON_GetObjectItemCaseSensitive(j, "machine_bf16_dot_peak_gflops_per_rank");
  assert_non_null(f32), assert_non_null(bf16);
  const double pre = tt_json_num(j, "prefill_gflops_per_rank");
  if (strcmp(isa, "portable") != 0) {
    assert_true(cJSON_IsNumber(f32) && f32->valuedouble > 0);
    assert_true(fabs(tt_json_num(j, "prefill_f32_peak_efficiency") - pre / f32->valuedouble) <= 1e-3 * pre / f32->valuedouble);
  } else {
    assert_true(cJSON_IsNull(f32));
  }
  if (cJSON_IsNumber(bf16)) {
    assert_true(strcmp(isa, "avx512") == 0 && bf16->valuedouble > 0);
    assert_true(fabs(tt_json_num(j, "prefill_bf16_peak_efficiency") - pre / bf16->valuedouble) <= 1e-3 * pre / bf16->valuedouble);
  } else {
    assert_true(cJSON_IsNull(bf16));
  }
}

static void test_bench_model(void **state) {
  cJSON *j = tt_json_of(RUN(0, "bench", "model", "--model", FIX, "--prompt-len", "4", "--gen-len", "2", "--json"));
  check_bench_json(j, 1);
  assert_true(tt_json_num(j, "prompt_len") == 4 && tt_json_num(j, "gen_len") == 2);
  cJSON_Delete(j);
  j = tt_json_of(RUN(2, "bench", "model", "--model", FIX, "--prompt-len", "4", "--gen-len", "2", "--json"));
  check_bench_json(j, 2);
  cJSON_Delete(j);
  expect_exit(RUN(0, "bench", "model", "--prompt-len", "4"), 2, "--random-weights");
  expect_exit(RUN(0, "bench", "model", "--model", FIX, "--gen-len", "0"), 2, "positive");
  run_result r = RUN(0, "bench", "--help");
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.out, "model"));
  tt_run_done(&r);
}

// --context on the hybrid fixture (tp 1 and 2): one entry per length, the
// KV bytes per sequence growing with it (the softmax layer's rows) and the
// recurrent state bytes the same at every length; bad lists refused.
static void test_bench_context(void **state) {
  for (int np = 0; np <= 2; np += 2) {
    cJSON *j = tt_json_of(RUN(np, "bench", "model", "--model", TPR_FIXTURES "/minimax_tiny", "--context", "8,40",
                              "--gen-len", "3", "--json"));
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "contexts");
    assert_int_equal(cJSON_GetArraySize(c), 2);
    const cJSON *a = cJSON_GetArrayItem(c, 0), *b = cJSON_GetArrayItem(c, 1);
    assert_true(tt_json_num(a, "context") == 8 && tt_json_num(b, "context") == 40);
    assert_true(tt_json_num(a, "decode_tok_s") > 0 && tt_json_num(b, "decode_tokens") == 3);
    double kva = tt_json_num(a, "kv_bytes_per_seq_per_rank"), kvb = tt_json_num(b, "kv_bytes_per_seq_per_rank");
    assert_true(kva > 0 && fabs(kvb / kva - 43.0 / 11.0) < 1e-9);  // rows of C + G tokens
    double sa = tt_json_num(a, "state_bytes_per_seq_per_rank");
    // 3 lightning layers x (4 heads / tp) x 8 x 8 f32
    assert_true(sa == 3.0 * (4 / (np ? np : 1)) * 64 * 4 && sa == tt_json_num(b, "state_bytes_per_seq_per_rank"));
    cJSON_Delete(j);
  }
  expect_exit(RUN(0, "bench", "model", "--model", FIX, "--context", "8,0"), 2, "positive lengths");
  expect_exit(RUN(0, "bench", "model", "--model", FIX, "--context", "8,"), 2, "positive lengths");
  expect_exit(RUN(0, "bench", "model", "--model", FIX, "--context", "8", "--profile"), 2, "not with --profile");
}

// tpr run on the hybrid fixture at tp 2: the memory line names the KV and
// the recurrent state per sequence and rank, and the state slots.
static void test_run_hybrid(void **state) {
  run_result r = RUN(2, "run", "--model", TPR_FIXTURES "/minimax_tiny", "--prompt-ids", "1,2,3,4,5", "--prompt-ids",
                     "9,8,7", "--max-new-tokens", "4");
  if (r.code != 0) fail_msg("exit %d\n%s", r.code, r.err);
  // 3 lightning layers x 2 heads per rank x 8 x 8 f32 = 1.5 KiB; 2 slots (--max-batch: the prompts)
  if (!strstr(r.out, "recurrent state 1.5 KiB (state slots: 2,") || !strstr(r.out, "no prefix caching"))
    fail_msg("no state line in:\n%s", r.out);
  tt_run_done(&r);
}

static void test_run_checks(void **state) {
  expect_exit(RUN(0, "run", "--model", FIX, "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--max-seq", "6"), 2,
              "--max-seq 6 is shorter");
  expect_exit(RUN(2, "forward", "--model", FIX, "--tokens", "1,2", "--out", "/dev/null", "--debug-force-tp-rank", "2"),
              1, "--debug-force-tp-rank 2");
  expect_exit(RUN(0, "forward", "--model", FIX, "--tokens", "1,2", "--out", "/dev/null", "--device", "gpu"), 1,
              "--device gpu: expected cpu, cuda or cuda:N");
  // Without a GPU, --device cuda must say so (with one, tests/test_cuda_model.c runs it).
  if (tpr_cuda_device_count() == 0)
    expect_exit(RUN(2, "run", "--model", FIX, "--prompt-ids", "1,2,3", "--device", "cuda"), 1, "no CUDA device");
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_cli_model") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_compare),
      cmocka_unit_test(test_bench_model),
      cmocka_unit_test(test_bench_context),
      cmocka_unit_test(test_run_hybrid),
      cmocka_unit_test(test_run_checks),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(tt_path(tmp_dir, "stdout"));
  unlink(tt_path(tmp_dir, "stderr"));
  rmdir(tmp_dir);
  return failed ? 1 : 0;
}
