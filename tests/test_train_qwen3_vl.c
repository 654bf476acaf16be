// `tpr train` on the Qwen3-VL-MoE fixture against PyTorch (the text decoder of
// transformers' Qwen3VLMoeForConditionalGeneration + torch.optim.AdamW +
// clip_grad_norm_, f32: scripts/reference/make_qwen3_vl_train_fixture.py,
// tests/fixtures/qwen3_vl_moe_train). Every run passes the fixture's 3-D
// positions (--positions-3d: an image-like grid inside text, so that t, h and
// w differ and interleaved MRoPE's backward is exercised): step 0's loss and
// every parameter's gradient at tp 1, tp 2, tp 4 (KV heads replicated),
// expert-parallel and data-parallel meshes; the AdamW steps' losses and
// parameters; a resume bit for bit; the text rule (no --positions-3d: every
// axis the position) against transformers' text positions; negative controls
// (1-D positions, the aux loss left out, the per-head norm weights'
// all-reduce left out must fail the gradient bound); refusals; --save in the
// layout transformers' class writes and loads.
#include "test_util.h"
#include "train_harness.h"
#include "shard/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIX TPR_FIXTURES "/qwen3_vl_moe_train"
#define MODEL TPR_FIXTURES "/qwen3_vl_moe_tiny"
#define POS FIX "/positions_3d.npy"
#define MIN_TENSORS 60  // every trained tensor of the 2-layer text decoder (69) is compared

static double aux(void) { return th_meta_at("model.router_aux_loss_coef", -1); }

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
  th_check_step0(cases, sizeof cases / sizeof *cases, aux(), MIN_TENSORS);
}

// Without --positions-3d the trainer gives every axis the sequence position
// (transformers' positions for text): step 0's loss equals PyTorch's with
// them; and against the grid fixture the gradients must fail (the negative
// control: 1-D positions in place of the 3-D ones).
static void test_text_positions(void **state) {
  (void)state;
  const char *const *saved = th.run_args;
  th.run_args = NULL;
  double le;
  double g = th_step0(1, MESH("--grad-accum", "2"), aux(), NULL, MIN_TENSORS, &le);
  th.run_args = saved;
  char data[600];
  snprintf(data, sizeof data, "%s/tokens.npy", FIX);
  char coef[32];
  snprintf(coef, sizeof coef, "%.17g", aux());
  const char *args[] = {"train", "--model", MODEL, "--data", data, "--data-order", "sequential", "--seq-len", "16",
                        "--grad-accum", "2", "--steps", "1", "--aux-coef", coef, "--json", NULL};
  run_result r = tt_run(th.tpr, th.tmp_dir, args, &(tt_run_opts){.np = 1, .timeout_s = 120});
  assert_int_equal(r.code, 0);
  const char *at = strstr(r.out, "\"loss\":");
  assert_non_null(at);
  double got = strtod(at + 7, NULL), want = th_meta_at("text_positions_step0_loss", -1);
  double text_err = fabs(got - want) / fabs(want);
  tt_run_done(&r);
  printf("  text positions: step-0 loss %.7f, PyTorch %.7f (rel err %.2e); against the 3-D fixture: loss rel err "
         "%.2e, worst gradient %.2e (must exceed %.0e)\n", got, want, text_err, le, g, 100 * TH_GRAD_BOUND);
  assert_true(text_err <= TH_LOSS_BOUND);
  assert_true(g > 100 * TH_GRAD_BOUND);
}

// Negative controls: the aux loss left out (tp 1), the per-head norm
// weights' or the column inputs' backward all-reduce left out (tp 2).
static void test_controls_fail(void **state) {
  (void)state;
  double le;
  const char *const *tp1 = MESH("--grad-accum", "2"), *const *tp2 = MESH("--grad-accum", "2", "--tp", "2");
  double no_aux = th_step0(1, tp1, 0.0, NULL, MIN_TENSORS, &le);
  double qk = th_step0(2, tp2, aux(), MESH("--debug-skip-grad-marks", "qk-norm"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  double col = th_step0(2, tp2, aux(), MESH("--debug-skip-grad-marks", "column"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  printf("  controls: aux loss left out %.2e, per-head norm weights' all-reduce left out %.2e, column inputs' "
         "%.2e (each must exceed %.0e)\n", no_aux, qk, col, 100 * TH_GRAD_BOUND);
  assert_true(no_aux > 100 * TH_GRAD_BOUND);
  assert_true(qk > 100 * TH_GRAD_BOUND);
  assert_true(col > 100 * TH_GRAD_BOUND);
}

static void test_steps(void **state) {
  (void)state;
  const char *const *meshes[] = {MESH("--grad-accum", "2"),
                                 MESH("--grad-accum", "2", "--tp", "2", "--ep", "2", "--etp", "1")};
  th_check_steps_meshes(2, (const int[]){1, 2}, meshes, aux(), MIN_TENSORS, "qwen3_vl_moe");
}

static void test_resume_bit_identical(void **state) {
  (void)state;
  th_check_resume(4, aux());
}

static void test_refusals(void **state) {
  (void)state;
  th_check_refusal("positions for another length", 1,
                   MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "8", "--positions-3d",
                        POS),
                   "positions_3d.npy");
}

// --save writes what Qwen3VLMoeForConditionalGeneration.save_pretrained
// writes (model.language_model.*, each layer's experts fused as
// gate_up_proj (E, 2F, H) and down_proj (E, H, F), the vision tower copied):
// the fixture's tensors byte for byte (th_check_save_as_saved), fused.
static void test_save_transformers_layout(void **state) {
  (void)state;
  const char *moved = th_check_save_as_saved(POS);
  tpr_st_set *set = NULL;
  TT_OK(tpr_st_open(moved, &set));
  const tpr_st_tensor *gu = tpr_st_find(set, "model.language_model.layers.0.mlp.experts.gate_up_proj");
  assert_non_null(gu);
  assert_int_equal(gu->ndim, 3);
  assert_null(tpr_st_find(set, "model.layers.0.mlp.experts.0.gate_proj.weight"));
  tpr_st_close(set);
}

static int setup(void **state) {
  (void)state;
  int rc = th_setup("test_train_qwen3_vl", "/tmp/tpr_test_train_qwen3_vl_XXXXXX", FIX, MODEL);
  static const char *const pos_args[] = {"--positions-3d", POS, NULL};  // outlives setup (a compound literal would not)
  th.run_args = pos_args;
  return rc;
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step0_meshes),
      cmocka_unit_test(test_text_positions),
      cmocka_unit_test(test_controls_fail),
      cmocka_unit_test(test_steps),
      cmocka_unit_test(test_resume_bit_identical),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_save_transformers_layout),
  };
  return cmocka_run_group_tests(tests, setup, th_teardown);
}
