// The autodiff core (runtime/program/autodiff.h): build_backward's pruning, seeding,
// gradient accumulation over several consumers and its errors, and the
// backward rules of the basic ops (sum_to, scale, add, mul, matmul) against
// central finite differences. Fresh random inputs each run (seed printed).
#include "grad_check.h"
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define NMSE_BOUND 1e-6  // smooth, well-scaled ops in f32 with h = 1e-2: observed ~1e-9

static tpr_tensor *rnd(int nd, const int64_t *shape) { return tt_random_f32(tt_cpu(), nd, shape, NULL); }

static void check_case(tt_grad_case *c) { tt_grad_expect(c, NMSE_BOUND); }

static void free_inputs(tt_grad_case *c) { tt_grad_free_inputs(c); }

static void test_matmul_all_transposes(void **state) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int64_t M = 3, K = 5, N = 4;
      tt_grad_case c = {.name = "matmul", .n_in = 2, .diff = {true, true}, .op = TPR_OP_MATMUL,
                        .attrs = {.n_i = 2, .i = {ta, tb}}};
      c.in[0] = rnd(2, ta ? (const int64_t[]){K, M} : (const int64_t[]){M, K});
      c.in[1] = rnd(2, tb ? (const int64_t[]){N, K} : (const int64_t[]){K, N});
      check_case(&c);
      free_inputs(&c);
    }
}

static void test_matmul_batched(void **state) {
  // Batched a with a shared 2-D b (the weight's gradient sums the batch) and
  // with a batched b.
  tt_grad_case c = {.name = "matmul shared b", .n_in = 2, .diff = {true, true}, .op = TPR_OP_MATMUL,
                    .attrs = {.n_i = 2, .i = {0, 1}}};
  c.in[0] = rnd(3, (const int64_t[]){2, 3, 5});
  c.in[1] = rnd(2, (const int64_t[]){4, 5});
  check_case(&c);
  free_inputs(&c);
  tt_grad_case d = {.name = "matmul batched b", .n_in = 2, .diff = {true, true}, .op = TPR_OP_MATMUL,
                    .attrs = {.n_i = 2, .i = {1, 0}}};
  d.in[0] = rnd(3, (const int64_t[]){2, 5, 3});
  d.in[1] = rnd(3, (const int64_t[]){2, 5, 4});
  check_case(&d);
  free_inputs(&d);
}

static void test_broadcast_binary(void **state) {
  tpr_op_kind ops[2] = {TPR_OP_ADD, TPR_OP_MUL};
  for (int k = 0; k < 2; k++) {
    tt_grad_case c = {.name = k ? "mul broadcast" : "add broadcast", .n_in = 2, .diff = {true, true}, .op = ops[k]};
    c.in[0] = rnd(3, (const int64_t[]){2, 3, 4});
    c.in[1] = rnd(2, (const int64_t[]){1, 4});
    check_case(&c);
    free_inputs(&c);
  }
}

static void test_sum_to_scale(void **state) {
  tt_grad_case c = {.name = "sum_to", .n_in = 1, .diff = {true}, .op = TPR_OP_SUM_TO,
                    .attrs = {.n_i = 2, .i = {3, 1}}};
  c.in[0] = rnd(3, (const int64_t[]){2, 3, 4});
  check_case(&c);
  free_inputs(&c);
  tt_grad_case s = {.name = "scale", .n_in = 1, .diff = {true}, .op = TPR_OP_SCALE, .attrs = {.n_f = 1, .f = {-1.7f}}};
  s.in[0] = rnd(2, (const int64_t[]){3, 4});
  check_case(&s);
  free_inputs(&s);
}

// x feeds three consumers (both operands of one matmul and a residual add):
// its cotangent must be the sum of all three contributions.
static tpr_status build_shared(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  tpr_value_id xx, w;
  TPR_CHECK(tpr_pb_matmul(p, in[0], in[0], false, true, &xx));  // (4, 4)
  TPR_CHECK(tpr_pb_mul(p, xx, in[1], &w));
  return tpr_pb_add(p, w, in[0], out);
}

static void test_accumulation(void **state) {
  tt_grad_case c = {.name = "three consumers", .n_in = 2, .diff = {true, true}, .build = build_shared};
  c.in[0] = rnd(2, (const int64_t[]){4, 4});
  c.in[1] = rnd(2, (const int64_t[]){4, 4});
  check_case(&c);
  free_inputs(&c);
}

static void test_pruning_and_errors(void **state) {
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  tpr_value_id a, b, unused, prod, loss, ids, grads[3];
  TT_OK(tpr_program_param(p, "a", TPR_F32, 2, (const int64_t[]){2, 3}, &a));
  TT_OK(tpr_program_param(p, "b", TPR_F32, 2, (const int64_t[]){2, 3}, &b));
  TT_OK(tpr_program_param(p, "unused", TPR_F32, 1, (const int64_t[]){3}, &unused));
  TT_OK(tpr_program_input(p, "ids", TPR_I32, 1, (const int64_t[]){2}, &ids));
  TT_OK(tpr_pb_mul(p, a, b, &prod));
  TT_OK(tpr_pb_sum_to(p, prod, 1, (const int64_t[]){1}, &loss));
  // Not a one-element loss; not an f32 wrt.
  assert_int_equal(tpr_program_build_backward(p, prod, &a, 1, NULL, grads), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_program_build_backward(p, loss, &ids, 1, NULL, grads), TPR_ERR_INVALID_ARG);
  int nodes = tpr_program_num_nodes(p);
  // Only a wanted: b's cotangent is never built, unused gets none.
  TT_OK(tpr_program_build_backward(p, loss, (const tpr_value_id[]){a, unused}, 2, NULL, grads));
  assert_true(grads[0] >= 0);
  assert_int_equal(grads[1], -1);
  // fill (the seed) + mul for da only (b's side pruned) + sum_to's broadcast (fill + add)
  int added = tpr_program_num_nodes(p) - nodes;
  assert_true(added <= 5);
  tpr_program_free(p);

  // An op on the path with no rule fails naming it (cache_write never has one).
  TT_OK(tpr_program_new(&p));
  tpr_value_id cache, rows, start, done, w, loss2;
  TT_OK(tpr_program_param(p, "cache", TPR_F32, 3, (const int64_t[]){4, 1, 2}, &cache));
  TT_OK(tpr_program_param(p, "rows", TPR_F32, 3, (const int64_t[]){1, 1, 2}, &rows));
  TT_OK(tpr_program_input(p, "start", TPR_I32, 1, (const int64_t[]){1}, &start));
  TT_OK(tpr_pb_cache_write(p, cache, rows, start, &done));
  TT_OK(tpr_pb_cast(p, done, TPR_F32, &w));
  TT_OK(tpr_pb_sum_to(p, w, 1, (const int64_t[]){1}, &loss2));
  TT_OK(tpr_pb_scale(p, loss2, 2.0f, &loss2));
  assert_int_equal(tpr_program_build_backward(p, loss2, &rows, 1, NULL, grads), TPR_ERR_UNSUPPORTED);
  tpr_program_free(p);
}

// Negative control: the checker must reject a gradient with one of x*x's
// two contributions dropped (half the true gradient) or with a sign error.
static tpr_status build_square(tpr_program *p, const tpr_value_id *in, tpr_value_id *out) {
  return tpr_pb_mul(p, in[0], in[0], out);
}

static void test_grad_check_catches_errors(void **state) {
  tt_grad_case c = {.name = "x*x", .n_in = 1, .diff = {true}, .build = build_square};
  c.in[0] = rnd(2, (const int64_t[]){3, 3});
  check_case(&c);  // the real rules pass
  c.corrupt = 0.5;
  double half = tt_grad_check(&c);
  c.corrupt = -1;
  double sign = tt_grad_check(&c);
  printf("  controls: dropped consumer NMSE %.3e, sign error NMSE %.3e (must exceed %.0e)\n", half, sign, NMSE_BOUND);
  assert_true(half > 1e-2 && sign > 1);
  free_inputs(&c);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul_all_transposes), cmocka_unit_test(test_matmul_batched),
      cmocka_unit_test(test_broadcast_binary),      cmocka_unit_test(test_sum_to_scale),
      cmocka_unit_test(test_accumulation),          cmocka_unit_test(test_pruning_and_errors),
      cmocka_unit_test(test_grad_check_catches_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
