// The tensor-parallel MLP block against a double-precision reference written
// here: every rank of tp in {1, 2, 4, 8} runs the same program with its own
// rank tensor; the sum of the partials must equal the unsharded block.
// Negative control: giving every rank rank 0's tensor (the seed-000 bug: the
// rank baked in as a constant) must be caught.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/mlp_block.h"
#include "test_util.h"

static const tpr_block_config cfg = {.hidden_size = 24, .intermediate_size = 64, .tokens = 7, .rms_norm_eps = 1e-6f};

static float *host_copy(const tpr_tensor *t) {
  size_t n = tpr_tensor_nbytes(t);
  float *h = malloc(n);
  TT_OK(tpr_tensor_to_host(t, h, n));
  return h;
}

// y (T, H) in double, straight from the definition.
static double *reference(const tpr_block_tensors *w) {
  int64_t T = cfg.tokens, H = cfg.hidden_size, F = cfg.intermediate_size;
  float *x = host_copy(w->x), *g = host_copy(w->norm), *w1 = host_copy(w->w1), *w3 = host_copy(w->w3),
        *w2 = host_copy(w->w2);
  double *y = calloc((size_t)(T * H), sizeof *y), *h = malloc((size_t)H * sizeof *h), *act = malloc((size_t)F * sizeof *act);
  for (int64_t t = 0; t < T; t++) {
    double ss = 0;
    for (int64_t i = 0; i < H; i++) ss += (double)x[t * H + i] * x[t * H + i];
    double inv = 1.0 / sqrt(ss / (double)H + cfg.rms_norm_eps);
    for (int64_t i = 0; i < H; i++) h[i] = x[t * H + i] * inv * g[i];
    for (int64_t f = 0; f < F; f++) {
      double a = 0, b = 0;
      for (int64_t i = 0; i < H; i++) a += w1[f * H + i] * h[i], b += w3[f * H + i] * h[i];
      act[f] = a / (1.0 + exp(-a)) * b;
    }
    for (int64_t o = 0; o < H; o++) {
      double s = 0;
      for (int64_t f = 0; f < F; f++) s += w2[o * F + f] * act[f];
      y[t * H + o] = s;
    }
  }
  free(x), free(g), free(w1), free(w3), free(w2), free(h), free(act);
  return y;
}

// Runs every rank of a tp group in this process and sums the partials. With
// `all_rank0`, every rank gets rank 0's coordinates.
static float *run_tp(const tpr_block_tensors *w, int tp, bool all_rank0) {
  size_t n = (size_t)(cfg.tokens * cfg.hidden_size);
  float *sum = calloc(n, sizeof *sum), *part = malloc(n * sizeof *part);
  tpr_program *p;
  TT_OK(tpr_block_build(&cfg, tp, &p));
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  for (int r = 0; r < tp; r++) {
    tpr_mesh m;
    TT_OK(tpr_mesh_init(tp, all_rank0 ? 0 : r, tp, 1, 1, &m));
    tpr_tensor *rank;
    TT_OK(tpr_mesh_rank_tensor(&m, tt_cpu(), &rank));
    TT_OK(tpr_block_bind(e, w, rank));
    TT_OK(tpr_exec_run(e));
    const tpr_tensor *out;
    TT_OK(tpr_exec_output(e, "partial", &out));
    TT_OK(tpr_tensor_to_host(out, part, n * sizeof *part));
    for (size_t i = 0; i < n; i++) sum[i] += part[i];
    tpr_tensor_free(rank);
  }
  tpr_exec_free(e);
  tpr_program_free(p);
  free(part);
  return sum;
}

static void test_tp_degrees_match_reference(void **state) {
  tpr_block_tensors w;
  TT_OK(tpr_block_random(&cfg, tt_next_u64(), tt_cpu(), &w));
  double *want = reference(&w);
  size_t n = (size_t)(cfg.tokens * cfg.hidden_size);
  const int degrees[] = {1, 2, 4, 8};
  for (int k = 0; k < 4; k++) {
    float *got = run_tp(&w, degrees[k], false);
    double err = tt_max_rel_err(got, want, n);
    print_message("tp=%d max rel err %.2e\n", degrees[k], err);
    // f32 GEMMs over K <= 64 with O(1) values: a few ulps of 1e-7 each.
    assert_true(err < 1e-5);
    free(got);
    if (degrees[k] > 1) {
      float *wrong = run_tp(&w, degrees[k], true);
      double bad = tt_max_rel_err(wrong, want, n);
      print_message("tp=%d with every rank as rank 0: max rel err %.2e (must be large)\n", degrees[k], bad);
      assert_true(bad > 1e-2);
      free(wrong);
    }
  }
  free(want);
  tpr_block_tensors_free(&w);
}

// One program for every rank: the bytes do not depend on which rank builds it,
// and tp that does not divide the intermediate size is refused by name.
static void test_program_rank_free_and_errors(void **state) {
  tpr_program *p;
  assert_int_equal(tpr_block_build(&cfg, 3, &p), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "tp=3"));
  assert_non_null(strstr(tpr_last_error(), "64"));
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tp_degrees_match_reference),
      cmocka_unit_test(test_program_rank_free_and_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
