// Weights held in bf16 or FP8 (--weight-dtype): the logits of a bf16 checkpoint run
// with its matrices kept in bf16 equal those of the same checkpoint widened
// to f32 at load (the same values: only the kernels' summation order
// differs), alone and at tp 2, over a prompt long enough for the panel path
// (more than 16 rows) and a short one for the skinny path; auto keeps bf16
// and holds fewer bytes. Negative control: rounding an f32 checkpoint to
// bf16 (--weight-dtype bf16) moves the logits past the same bound, so the
// bound would catch a kernel reading the wrong values.
#include "test_util.h"
#include "cli_util.h"
#include "shard/safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIX TPR_FIXTURES "/minimax_m2_tiny"

static char tpr_path[4096], tmp_dir[] = "/tmp/tpr_test_weight_dtype_XXXXXX";
static char ck_bf16[4200], ck_f32[4200], ck_fp8[4200], tokens_long[1024], tokens_short[256];

static run_result run(int np, const char *const *args) {
  return tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 120});
}
#define RUN(np, ...) run(np, (const char *const[]){__VA_ARGS__, NULL})

// A comma-separated list of n random ids below the fixture's vocab (256).
static void random_tokens(char *buf, size_t cap, int n) {
  size_t k = 0;
  for (int i = 0; i < n; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)tt_randint(0, 255));
}

// Logits of `model` held as `dtype` on np ranks (0: alone) into out, with
// --ep ep (0: the default); returns the weight bytes rank 0 reported and
// checks the dtype it reports.
static double forward_ep(int np, int ep, const char *model, const char *dtype, const char *tokens, const char *out,
                         const char *want_dtype) {
  char tp[8], eps[8];
  snprintf(tp, sizeof tp, "%d", np ? np : 1);
  snprintf(eps, sizeof eps, "%d", ep ? ep : 1);
  cJSON *j = tt_json_of(RUN(np, "forward", "--model", model, "--weight-dtype", dtype, "--tokens", tokens, "--tp", tp,
                            "--ep", eps, "--out", out, "--json"));
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "weight_dtype");
  if (!cJSON_IsString(dt) || strcmp(dt->valuestring, want_dtype) != 0)
    fail_msg("--weight-dtype %s on %s: held %s, want %s", dtype, model, cJSON_IsString(dt) ? dt->valuestring : "?",
             want_dtype);
  double bytes = tt_json_num(j, "weight_bytes");
  cJSON_Delete(j);
  return bytes;
}

static double forward(int np, const char *model, const char *dtype, const char *tokens, const char *out,
                      const char *want_dtype) {
  return forward_ep(np, 0, model, dtype, tokens, out, want_dtype);
}

static double rel_diff(const char *a, const char *b) {
  cJSON *j = tt_json_of(RUN(0, "compare", "--a", a, "--a-key", "logits", "--b", b, "--json", "--tol", "1"));
  double rel = tt_json_num(j, "rel");
  cJSON_Delete(j);
  return rel;
}

static void test_bf16_equals_widened(void **state) {
  const char *toks[2] = {tokens_long, tokens_short}, *names[2] = {"40 tokens (panels)", "5 tokens (skinny)"};
  for (int t = 0; t < 2; t++)
    for (int np = 0; np <= 2; np += 2) {
      const char *kept = tt_path(tmp_dir, "kept.safetensors"), *wide = tt_path(tmp_dir, "wide.safetensors");
      double held = forward(np, ck_bf16, "auto", toks[t], kept, "bf16");
      double full = forward(np, ck_bf16, "f32", toks[t], wide, "f32");
      double rel = rel_diff(kept, wide);
      printf("%s, tp %d: bf16 held %.0f bytes vs f32 %.0f (x%.3f); logits rel diff %.3g\n", names[t], np ? np : 1,
             held, full, held / full, rel);
      assert_true(rel <= 1e-5);
      assert_true(held < 0.6 * full);  // the matrices dominate: about half the bytes
    }
}

// FP8-E4M3 in 128 x 128 blocks (tpr make-checkpoint --dtype fp8): held FP8
// with per-row scales at the block every rank's slice allows (16 columns
// here: the fixture's head_dim and its experts' width at etp 2), against
// the same weights widened to f32 at load. Alone, tp 2 (heads and expert
// widths split: blocks finer than 128) and ep 2 (the alltoall dispatcher's
// grouped experts), prefill past 16 rows and short. Negative control:
// holding the FP8 weights rounded to bf16 moves the logits past the bound.
static void test_fp8_equals_widened(void **state) {
  const char *toks[2] = {tokens_long, tokens_short};
  const int meshes[3][2] = {{0, 0}, {2, 1}, {2, 2}};  // (np, ep)
  for (int t = 0; t < 2; t++)
    for (int m = 0; m < 3; m++) {
      const char *kept = tt_path(tmp_dir, "kept.safetensors"), *wide = tt_path(tmp_dir, "wide.safetensors");
      double held = forward_ep(meshes[m][0], meshes[m][1], ck_fp8, "auto", toks[t], kept, "f8e4m3");
      double full = forward(0, ck_fp8, "f32", toks[t], wide, "f32");
      double rel = rel_diff(kept, wide);
      printf("fp8, %s, tp %d ep %d: held %.0f bytes per rank (f32 alone: %.0f); logits rel diff %.3g\n",
             t ? "5 tokens" : "40 tokens", meshes[m][0] ? meshes[m][0] : 1, meshes[m][1] ? meshes[m][1] : 1, held,
             full, rel);
      assert_true(rel <= 1e-5);
    }
  const char *kept = tt_path(tmp_dir, "kept.safetensors"), *rounded = tt_path(tmp_dir, "rounded.safetensors");
  forward(0, ck_fp8, "auto", tokens_long, kept, "f8e4m3");
  forward(0, ck_fp8, "bf16", tokens_long, rounded, "bf16");
  double rel = rel_diff(rounded, kept);
  printf("negative control: fp8 weights rounded to bf16 vs held fp8: rel diff %.3g (must exceed 1e-5)\n", rel);
  assert_true(rel > 1e-5);
}

static void test_rounding_is_caught(void **state) {
  const char *rounded = tt_path(tmp_dir, "rounded.safetensors"), *exact = tt_path(tmp_dir, "exact.safetensors");
  forward(0, ck_f32, "bf16", tokens_long, rounded, "bf16");
  forward(0, ck_f32, "auto", tokens_long, exact, "f32");  // auto keeps an f32 checkpoint f32
  double rel = rel_diff(rounded, exact);
  printf("negative control: f32 checkpoint rounded to bf16 vs f32: rel diff %.3g (must exceed 1e-5)\n", rel);
  assert_true(rel > 1e-5);
}

// The logits at 1 and 2 threads, bitwise: every kernel a decode or a short
// prefill runs reduces each output in one thread in a fixed order (skinny
// GEMM, attention tiles, the row-split kernels); the 40-token prompt adds
// OpenBLAS sgemm (f32 weights above 16 rows), whose split over threads
// never cuts the inner dimension either. Negative control: a different
// prompt's logits differ.
static void test_thread_invariance(void **state) {
  const char *dts[2] = {"bf16", "f32"}, *toks[2] = {tokens_long, tokens_short};
  for (int d = 0; d < 2; d++)
    for (int t = 0; t < 2; t++) {
      const char *one = tt_path(tmp_dir, "t1.safetensors"), *two = tt_path(tmp_dir, "t2.safetensors");
      const char *args1[] = {"TPR_NUM_THREADS=1", tpr_path, "forward", "--model", ck_bf16, "--weight-dtype", dts[d],
                             "--tokens", toks[t], "--out", one, NULL};
      const char *args2[] = {"TPR_NUM_THREADS=2", tpr_path, "forward", "--model", ck_bf16, "--weight-dtype", dts[d],
                             "--tokens", toks[t], "--out", two, NULL};
      run_result r = tt_run("/usr/bin/env", tmp_dir, args1, &(tt_run_opts){.timeout_s = 120});
      assert_int_equal(r.code, 0);
      tt_run_done(&r);
      r = tt_run("/usr/bin/env", tmp_dir, args2, &(tt_run_opts){.timeout_s = 120});
      assert_int_equal(r.code, 0);
      tt_run_done(&r);
      double rel = rel_diff(one, two);
      printf("%s weights, %s prompt: logits at 1 vs 2 threads: rel diff %.3g\n", dts[d], t ? "5-token" : "40-token",
             rel);
      assert_true(rel == 0);
    }
  const char *other = tt_path(tmp_dir, "other.safetensors"), *one = tt_path(tmp_dir, "t1.safetensors");
  forward(0, ck_bf16, "f32", tokens_long, other, "f32");
  const char *args[] = {"TPR_NUM_THREADS=1", tpr_path, "forward", "--model", ck_f32, "--weight-dtype", "f32",
                        "--tokens", tokens_long, "--out", one, NULL};
  run_result r = tt_run("/usr/bin/env", tmp_dir, args, &(tt_run_opts){.timeout_s = 120});
  assert_int_equal(r.code, 0);
  tt_run_done(&r);
  double rel = rel_diff(one, other);
  printf("negative control: f32 vs bf16-rounded checkpoint at 1 thread: rel diff %.3g (must not be 0)\n", rel);
  assert_true(rel > 0);
}

// The logits tpr forward wrote for prompt rows [0, rows): (rows, V) f32, malloc'ed; *V set.
static float *read_rows(const char *path, int64_t rows, int64_t *V) {
  tpr_st_set *set;
  TT_OK(tpr_st_open(path, &set));
  const tpr_st_tensor *t = tpr_st_find(set, "logits");
  if (!t || t->dtype != TPR_F32 || t->ndim != 2 || t->shape[0] < rows) fail_msg("%s: no (>= %lld, V) logits", path, (long long)rows);
  *V = t->shape[1];
  float *all = malloc((size_t)t->numel * sizeof *all);
  TT_OK(tpr_st_read_f32(set, "logits", NULL, NULL, all));
  tpr_st_close(set);
  return all;
}

// --activation-dtype bf16 (runtime/ops/gemm/bf16_gemm.h): the bf16 matrices'
// activations rounded to bf16. Against the exact f32-activation logits of
// the same held weights, alone and at tp 2, long and short prompts, row by
// row (a row's largest difference over the largest exact logit): close (the
// rounding of 8 mantissa bits, about 2^-9 per activation, keeps a row near
// 3e-3) and not equal (the path was taken). The bound holds on at least
// three rows in four, not on all: the rounding may move a router score
// across a top-k tie, and a token that takes another expert differs by a
// few percent (seen: one row of 40 at 2.7e-2, and the rows attending to it
// raised to 7e-3). A kernel pairing the wrong elements or dropping K's
// tail moves every row by O(1) and is caught.
static void test_bf16_activations(void **state) {
  const char *toks[2] = {tokens_long, tokens_short};
  const int64_t rows[2] = {40, 5};
  for (int t = 0; t < 2; t++)
    for (int np = 0; np <= 2; np += 2) {
      const char *exact = tt_path(tmp_dir, "exact.safetensors"), *act = tt_path(tmp_dir, "act.safetensors");
      char tp[8];
      snprintf(tp, sizeof tp, "%d", np ? np : 1);
      forward(np, ck_bf16, "auto", toks[t], exact, "bf16");
      cJSON *j = tt_json_of(RUN(np, "forward", "--model", ck_bf16, "--activation-dtype", "bf16", "--tokens", toks[t],
                                "--tp", tp, "--out", act, "--json"));
      const cJSON *ad = cJSON_GetObjectItemCaseSensitive(j, "activation_dtype");
      assert_true(cJSON_IsString(ad) && strcmp(ad->valuestring, "bf16") == 0);
      cJSON_Delete(j);
      int64_t V, V2, n = rows[t];
      float *e = read_rows(exact, n, &V), *a = read_rows(act, n, &V2);
      assert_int_equal(V, V2);
      double scale = 0, worst = 0, sum = 0;
      for (int64_t i = 0; i < n * V; i++) scale = fmax(scale, fabs((double)e[i]));
      int64_t within = 0;
      for (int64_t r = 0; r < n; r++) {
        double row = 0;
        for (int64_t v = 0; v < V; v++) row = fmax(row, fabs((double)a[r * V + v] - e[r * V + v]));
        row /= scale;
        within += row <= 1e-2;
        worst = fmax(worst, row);
        sum += row;
      }
      free(e), free(a);
      printf("bf16 activations, %lld tokens, tp %d: per-row logits rel diff to f32 activations: mean %.3g, worst "
             "%.3g; %lld of %lld rows within 1e-2 (want >= 3/4, and not all 0)\n",
             (long long)n, np ? np : 1, sum / (double)n, worst, (long long)within, (long long)n);
      assert_true(worst > 0);
      assert_true(4 * within >= 3 * n);
    }
}

// With bf16 activations every matmul's row is computed alone (bf16_gemm.h),
// and attention, norms and the experts are per row too, so the first 5
// rows of the 40-token prompt's logits equal, bit for bit, the logits of its
// 5-token prefix run alone (at 2 threads: the experts spread over them).
// Negative control: the long run's rows 1..5 against the prefix's 0..4 (the
// comparison reads distinct rows). f32 activations do not promise this
// (a lone row in an expert takes another kernel); their difference is shown.
static void test_bf16_activations_batch_invariant(void **state) {
  char prefix[256];
  size_t k = 0;
  for (int i = 0, commas = 0; tokens_long[i] && commas < 5; i++) {
    if (tokens_long[i] == ',' && ++commas == 5) break;
    prefix[k++] = tokens_long[i];
  }
  prefix[k] = '\0';
  double diff[2], shifted = 0;
  for (int act = 0; act < 2; act++) {
    const char *dt = act ? "bf16" : "f32";
    const char *lp = tt_path(tmp_dir, "long.safetensors"), *sp = tt_path(tmp_dir, "short.safetensors");
    run_result r = RUN(0, "forward", "--model", ck_bf16, "--activation-dtype", dt, "--tokens", tokens_long, "--out", lp);
    assert_int_equal(r.code, 0);
    tt_run_done(&r);
    r = RUN(0, "forward", "--model", ck_bf16, "--activation-dtype", dt, "--tokens", prefix, "--out", sp);
    assert_int_equal(r.code, 0);
    tt_run_done(&r);
    int64_t V, V2;
    float *a = read_rows(lp, 5, &V), *b = read_rows(sp, 5, &V2);
    assert_int_equal(V, V2);
    double worst = 0;
    for (int64_t i = 0; i < 5 * V; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    diff[act] = worst;
    for (int64_t i = 0; act && i < 4 * V; i++) shifted = fmax(shifted, fabs((double)a[V + i] - b[i]));
    free(a), free(b);
  }
  printf("5-token prefix alone vs the first 5 rows of the 40-token prompt: bf16 activations max diff %.3g (must be "
         "0; rows shifted by one: %.3g); f32 activations %.3g (not promised)\n", diff[1], shifted, diff[0]);
  assert_true(diff[1] == 0);
  assert_true(shifted > 1e-3);
}

// Where bf16 activations cannot apply, they are refused, never ignored:
// f32 matrices, training, and an unknown name.
static void test_bf16_activations_refused(void **state) {
  run_result r = RUN(0, "forward", "--model", ck_f32, "--activation-dtype", "bf16", "--tokens", "1,2", "--out",
                     tt_path(tmp_dir, "x.safetensors"));
  if (r.code == 0 || !strstr(r.err, "bf16 activations apply to bf16 weight matrices"))
    fail_msg("f32 matrices: exit %d, stderr:\n%s", r.code, r.err);
  tt_run_done(&r);
  r = RUN(0, "forward", "--model", ck_bf16, "--activation-dtype", "f16", "--tokens", "1,2", "--out",
          tt_path(tmp_dir, "x.safetensors"));
  if (r.code == 0 || !strstr(r.err, "--activation-dtype f16")) fail_msg("f16: exit %d, stderr:\n%s", r.code, r.err);
  tt_run_done(&r);
  r = RUN(0, "train", "--model", ck_bf16, "--activation-dtype", "bf16", "--steps", "1", "--seq-len", "8",
          "--out", tt_path(tmp_dir, "trained"));
  if (r.code == 0 || !strstr(r.err, "training")) fail_msg("train: exit %d, stderr:\n%s", r.code, r.err);
  tt_run_done(&r);
  printf("--activation-dtype bf16 refused for f32 matrices, training and an unknown name\n");
}

static void test_bad_flag(void **state) {
  run_result r = RUN(0, "forward", "--model", ck_bf16, "--weight-dtype", "fp4", "--tokens", "1,2", "--out",
                     tt_path(tmp_dir, "x.safetensors"));
  if (r.code == 0 || !strstr(r.err, "--weight-dtype fp4")) fail_msg("exit %d, stderr:\n%s", r.code, r.err);
  tt_run_done(&r);
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_weight_dtype") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  tt_seed_from_env();
  snprintf(ck_bf16, sizeof ck_bf16, "%s/bf16", tmp_dir);
  snprintf(ck_f32, sizeof ck_f32, "%s/f32", tmp_dir);
  char seed[32];
  snprintf(seed, sizeof seed, "%lld", (long long)tt_randint(1, 1 << 30));
  run_result r = RUN(0, "make-checkpoint", "--config", FIX "/config.json", "--out", ck_bf16, "--dtype", "bf16",
                     "--seed", seed);
  if (r.code) return fprintf(stderr, "make-checkpoint: %s\n", r.err), 1;
  tt_run_done(&r);
  r = RUN(0, "make-checkpoint", "--config", FIX "/config.json", "--out", ck_f32, "--dtype", "f32", "--seed", seed);
  if (r.code) return fprintf(stderr, "make-checkpoint: %s\n", r.err), 1;
  tt_run_done(&r);
  snprintf(ck_fp8, sizeof ck_fp8, "%s/fp8", tmp_dir);
  r = RUN(0, "make-checkpoint", "--config", FIX "/config.json", "--out", ck_fp8, "--dtype", "fp8", "--seed", seed);
  if (r.code) return fprintf(stderr, "make-checkpoint: %s\n", r.err), 1;
  tt_run_done(&r);
  random_tokens(tokens_long, sizeof tokens_long, 40);
  random_tokens(tokens_short, sizeof tokens_short, 5);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_equals_widened),
      cmocka_unit_test(test_fp8_equals_widened),
      cmocka_unit_test(test_rounding_is_caught),
      cmocka_unit_test(test_thread_invariance),
      cmocka_unit_test(test_bf16_activations),
      cmocka_unit_test(test_bf16_activations_batch_invariant),
      cmocka_unit_test(test_bf16_activations_refused),
      cmocka_unit_test(test_bad_flag),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
  return rc;
}
