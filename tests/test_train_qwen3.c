// `tpr train` on the Qwen3-MoE fixture against PyTorch (transformers'
// Qwen3MoeForCausalLM + torch.optim.AdamW + clip_grad_norm_, f32:
// scripts/reference/make_qwen3_train_fixture.py, tests/fixtures/qwen3_moe_train):
// step 0's loss and every parameter's gradient at tp 1, tp 2, tp 4 (KV heads
// replicated), expert-parallel and data-parallel meshes; the AdamW steps'
// losses and parameters; a resume bit for bit; negative controls (the aux loss left out, a missing
// backward all-reduce of the per-head norm weights or of the column inputs
// must fail the gradient bound); refusals.
#include "test_util.h"
#include "train_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIX TPR_FIXTURES "/qwen3_moe_train"
#define MODEL TPR_FIXTURES "/qwen3_moe_tiny"
#define MIN_TENSORS 50  // every trained tensor of the 4-layer fixture is compared

static void test_step0_meshes(void **state) {
  (void)state;
  const th_mesh_case cases[] = {
      {1, MESH("--grad-accum", "2")},
      {2, MESH("--grad-accum", "2", "--tp", "2")},
      {4, MESH("--grad-accum", "2", "--tp", "4")},  // 2 KV heads replicated over 4 ranks
      {2, MESH("--grad-accum", "2", "--tp", "2", "--ep", "2", "--etp", "1")},
      {4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "2", "--etp", "2")},
      {2, MESH("--dp", "2", "--tp", "1", "--ep", "2")},  // one window per replica
      {4, MESH("--dp", "2", "--tp", "2", "--ep", "2", "--etp", "1", "--moe-dispatch", "alltoall")},
  };
  th_check_step0(cases, sizeof cases / sizeof *cases, th_meta_at("model.router_aux_loss_coef", -1), MIN_TENSORS);
}

// Negative controls: the forward is the same (the aux loss only adds), but
// without the aux loss the routers' gradients miss its part, and without the
// backward all-reduce of the per-head norm weights or of the column-parallel
// inputs the tp 2 gradients are partial.
static void test_controls_fail(void **state) {
  (void)state;
  double aux = th_meta_at("model.router_aux_loss_coef", -1), le;
  const char *const *tp1 = MESH("--grad-accum", "2"), *const *tp2 = MESH("--grad-accum", "2", "--tp", "2");
  double no_aux = th_step0(1, tp1, 0.0, NULL, MIN_TENSORS, &le);
  double qk = th_step0(2, tp2, aux, MESH("--debug-skip-grad-marks", "qk-norm"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  double col = th_step0(2, tp2, aux, MESH("--debug-skip-grad-marks", "column"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  printf("  controls: aux loss left out %.2e, per-head norm weights' all-reduce left out %.2e, column inputs' "
         "%.2e (each must exceed %.0e)\n", no_aux, qk, col, 100 * TH_GRAD_BOUND);
  assert_true(no_aux > 100 * TH_GRAD_BOUND);
  assert_true(qk > 100 * TH_GRAD_BOUND);
  assert_true(col > 100 * TH_GRAD_BOUND);
}

// The fixture's AdamW steps (warmup, cosine decay, clipping) equal PyTorch's:
// every step's loss, and the saved parameters after them.
static void test_steps(void **state) {
  (void)state;
  const char *const *meshes[] = {MESH("--grad-accum", "2"),
                                 MESH("--grad-accum", "2", "--tp", "2", "--ep", "2", "--etp", "1")};
  th_check_steps_meshes(2, (const int[]){1, 2}, meshes, th_meta_at("model.router_aux_loss_coef", -1), MIN_TENSORS,
                        "qwen3_moe");
}

// A run stopped half-way and resumed from its checkpoint reaches the
// uninterrupted run's weights and moments bit for bit.
static void test_resume_bit_identical(void **state) {
  (void)state;
  th_check_resume(4, th_meta_at("model.router_aux_loss_coef", -1));
}

static void test_refusals(void **state) {
  (void)state;
  th_check_refusal("routing-bias update", 1,
                   MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "16",
                        "--bias-update-rate", "0.01"),
                   "qwen3_moe has not");
}

static int setup(void **state) {
  (void)state;
  return th_setup("test_train_qwen3", "/tmp/tpr_test_train_qwen3_XXXXXX", FIX, MODEL);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step0_meshes),
      cmocka_unit_test(test_controls_fail),
      cmocka_unit_test(test_steps),
      cmocka_unit_test(test_resume_bit_identical),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, th_teardown);
}
