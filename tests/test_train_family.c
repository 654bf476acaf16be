// `tpr train` on a family's training fixture against PyTorch (the family's
// transformers class + torch.optim.AdamW + clip_grad_norm_, f32:
// scripts/reference/make_<family>_train_fixture.py, tests/fixtures/*_train),
// one family per run: `test_train_family qwen3|hunyuan|qwen3_vl|qwen2_vl|minimax|minicpm_sala`,
// registered as ctest test_train_family_<name>. For each family: step 0's
// loss and every parameter's gradient over its meshes (tp 1, 2, 4 with KV
// heads replicated, expert- and data-parallel); the AdamW steps' losses and
// parameters, saved as the family's transformers class names them; a resume
// bit for bit; negative controls that must fail the gradient bound;
// refusals. What a family adds:
//   qwen3     Qwen3MoeForCausalLM, load-balancing loss
//   hunyuan   HunYuanMoEV1ForCausalLM, which trains on the cross-entropy
//             alone: the fixture's coef is 0 and tpr's default for the
//             family too (test_default_aux_is_zero)
//   qwen3_vl  Qwen3VLMoeForConditionalGeneration's text decoder: every run
//             passes the fixture's 3-D positions (an image-like grid inside
//             text, so that t, h and w differ and interleaved MRoPE's
//             backward is exercised); the text rule without them; --save
//             in the layout transformers' class writes (fused experts)
//   minimax   MiniMaxForCausalLM: lightning attention layers (their
//             backward through the block loop, the full-hidden norm's
//             all-reduce) beside a softmax layer, weighted residuals; the
//             AdamW steps under FSDP at dp 2 and dp 2 x tp 2 too, saved in
//             transformers' names (test_fsdp_steps)
//   qwen2_vl  Qwen2VLForConditionalGeneration's text decoder: dense, q/k/v
//             biases, sectioned MRoPE, no router (the loss is the
//             cross-entropy alone); the text rule; --save; and the CLI of a
//             model without experts (plan, bench model, --moe-stats)
//   minicpm_sala  the float64 reference (scripts/reference/minicpm_sala_ref.py,
//             no transformers class): lightning layers (QK-norm, RoPE, the
//             output norm's all-reduce, gates) beside InfLLM-v2 sparse layers
//             on 64-token windows past dense_len, so the block selection
//             (no gradient) decides which keys get one; muP; cross-entropy
//             alone; the sparse layers run dense is a control; the AdamW
//             steps under FSDP (test_fsdp_steps)
// FSDP of these families: tests/test_fsdp_qkhd.c.
#include "test_util.h"
#include "train_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "shard/safetensors.h"

// A negative control at tp 1 or 2 (--grad-accum 2): the flags that break
// one piece of the backward (or the forward), and whether the forward, so
// the loss, must stay PyTorch's.
typedef struct control {
  const char *what;
  int tp;
  bool no_aux;                // the aux loss left out (its weight 0)
  const char *const *flags;   // NULL: none
  bool same_loss;
} control;

// `tpr args...` at np ranks must fail with `expect` in its stderr.
typedef struct refusal {
  const char *what;
  int np;
  const char *const *args;
  const char *expect;
} refusal;

typedef struct family {
  const char *name;        // argv[1]
  const char *fix, *model;
  const char *positions;   // MRoPE: the fixture's positions (--positions-3d on every run); NULL: 1-D positions
  int min_tensors;         // tensors a comparison must cover
  const char *model_type;  // the saved config.json's
  bool ce_alone;           // the recipe's loss is the cross-entropy alone (aux coef 0, tpr's default too)
  const th_mesh_case *step0;
  size_t n_step0;
  int steps_np[2];
  const char *const *steps_mesh[2];
  const control *controls;
  size_t n_controls;
  const refusal *refusals;
  size_t n_refusals;
  // A tensor --save must write fused (transformers' layout); NULL: no check.
  const char *fused_experts;
  const struct CMUnitTest *tests;
  size_t n_tests;
} family;

static const family *F;  // the family under test

#define FIXTURE(dir) TPR_FIXTURES "/" dir
#define GA2 "--grad-accum", "2"

static double aux(void) { return th_meta_at("model.router_aux_loss_coef", -1); }

// The MoE families' step-0 meshes.
static const th_mesh_case moe_meshes[] = {
    {1, MESH(GA2)},
    {2, MESH(GA2, "--tp", "2")},
    {4, MESH(GA2, "--tp", "4")},  // 2 KV heads replicated over 4 ranks
    {2, MESH(GA2, "--tp", "2", "--ep", "2", "--etp", "1")},  // tp 2 x ep 2 (folded)
    {4, MESH(GA2, "--tp", "4", "--ep", "2", "--etp", "2")},
    {2, MESH("--dp", "2", "--tp", "1", "--ep", "2")},  // one window per replica
    {4, MESH("--dp", "2", "--tp", "2", "--ep", "2", "--etp", "1", "--moe-dispatch", "alltoall")},
};

static void test_step0_meshes(void **state) {
  (void)state;
  if (F->ce_alone) assert_true(aux() == 0.0);  // the recipe: cross-entropy alone
  th_check_step0(F->step0, F->n_step0, aux(), F->min_tensors);
}

static void test_controls_fail(void **state) {
  (void)state;
  double err[4], loss_err[4];
  for (size_t i = 0; i < F->n_controls; i++) {
    const control *c = &F->controls[i];
    const char *const *mesh = c->tp == 1 ? MESH(GA2) : MESH(GA2, "--tp", "2");
    err[i] = th_step0(c->tp, mesh, c->no_aux ? 0.0 : aux(), c->flags, F->min_tensors, &loss_err[i]);
    if (c->same_loss) assert_true(loss_err[i] <= TH_LOSS_BOUND);
  }
  for (size_t i = 0; i < F->n_controls; i++) {
    printf("  control: %s: worst gradient %.2e (must exceed %.0e), loss rel err %.2e\n", F->controls[i].what, err[i],
           100 * TH_GRAD_BOUND, loss_err[i]);
    assert_true(err[i] > 100 * TH_GRAD_BOUND);
  }
}

// The fixture's AdamW steps (warmup, cosine decay, clipping; no decay on
// norms and biases) equal PyTorch's: every step's loss, and the saved
// parameters after them, in a checkpoint whose config names the family.
static void test_steps(void **state) {
  (void)state;
  th_check_steps_meshes(2, F->steps_np, F->steps_mesh, aux(), F->min_tensors, F->model_type);
}

// A run stopped half-way and resumed from its checkpoint reaches the
// uninterrupted run's weights and moments bit for bit.
static void test_resume_bit_identical(void **state) {
  (void)state;
  th_check_resume(4, aux());
}

static void test_refusals(void **state) {
  (void)state;
  for (size_t i = 0; i < F->n_refusals; i++) {
    const refusal *r = &F->refusals[i];
    th_check_refusal(r->what, r->np, r->args, r->expect);
  }
}

// One step at np 1 on the fixture's tokens (no --positions-3d), with the
// fixture's aux weight or, pass_aux false, tpr's default for the family:
// the step-0 loss, and in *aux_out the aux loss reported.
static double one_step_loss(bool pass_aux, double *aux_out) {
  char data[600], coef[32];
  snprintf(data, sizeof data, "%s/tokens.npy", F->fix);
  snprintf(coef, sizeof coef, "%.17g", aux());
  char seq_len[24];
  snprintf(seq_len, sizeof seq_len, "%d", (int)th_meta_at("data.seq_len", -1));
  const char *args[20] = {"train", "--model", F->model, "--data", data, "--data-order", "sequential", "--seq-len",
                          seq_len, GA2, "--steps", "1", "--json"};
  int n = 14;
  if (pass_aux) args[n++] = "--aux-coef", args[n++] = coef;
  run_result r = tt_run(th.tpr, th.tmp_dir, args, &(tt_run_opts){.np = 1, .timeout_s = 120});
  assert_int_equal(r.code, 0);
  const char *at = strstr(r.out, "\"loss\":"), *ax = strstr(r.out, "\"aux\":");
  assert_non_null(at);
  assert_non_null(ax);
  double loss = strtod(at + 7, NULL);
  *aux_out = strtod(ax + 6, NULL);
  tt_run_done(&r);
  return loss;
}

// tpr's own default for the family is transformers' loss: no --aux-coef,
// the same step-0 loss (a load-balancing term would add coef x ~2.3).
static void test_default_aux_is_zero(void **state) {
  (void)state;
  double a, got = one_step_loss(false, &a), want = th_meta_at("records.loss", 0);
  printf("  default --aux-coef: step-0 loss %.7f, PyTorch %.7f\n", got, want);
  assert_true(fabs(got - want) <= 1e-5 * fabs(want));
}

// Without --positions-3d the trainer gives every axis the sequence position
// (transformers' positions for text): step 0's loss equals PyTorch's with
// them; against the grid fixture the gradients must fail (the negative
// control: 1-D positions in place of the 3-D ones). A family whose loss is
// the cross-entropy alone runs with its default (no --aux-coef), which
// must report no aux loss.
static void test_text_positions(void **state) {
  (void)state;
  const char *const *saved = th.run_args;
  th.run_args = NULL;
  double le;
  double g = th_step0(1, MESH(GA2), aux(), NULL, F->min_tensors, &le);
  th.run_args = saved;
  double a, got = one_step_loss(!F->ce_alone, &a), want = th_meta_at("text_positions_step0_loss", -1);
  double text_err = fabs(got - want) / fabs(want);
  printf("  text positions: step-0 loss %.7f, PyTorch %.7f (rel err %.2e), aux %g; against the 3-D fixture: loss "
         "rel err %.2e, worst gradient %.2e (must exceed %.0e)\n", got, want, text_err, a, le, g, 100 * TH_GRAD_BOUND);
  assert_true(text_err <= TH_LOSS_BOUND);
  if (F->ce_alone) assert_true(a == 0.0);
  assert_true(g > 100 * TH_GRAD_BOUND);
}

// --save writes what the family's transformers class writes with
// save_pretrained: the fixture's tensors byte for byte under the same names
// (th_check_save_as_saved), the vision tower copied; qwen3_vl's experts
// fused as gate_up_proj (E, 2F, H) and down_proj (E, H, F).
static void test_save_transformers_layout(void **state) {
  (void)state;
  const char *moved = th_check_save_as_saved(F->positions);
  if (!F->fused_experts) return;
  tpr_st_set *set = NULL;
  TT_OK(tpr_st_open(moved, &set));
  const tpr_st_tensor *gu = tpr_st_find(set, F->fused_experts);
  assert_non_null(gu);
  assert_int_equal(gu->ndim, 3);
  assert_null(tpr_st_find(set, "model.layers.0.mlp.experts.0.gate_proj.weight"));
  tpr_st_close(set);
}

// The elements a decode step of one token reads on a rank at tp (f32: 4
// bytes each) of the Qwen2-VL fixture: q/k/v/o's head slices, the dense
// MLP's F/tp columns, the lm head's vocab shard; dense: false leaves the MLP
// out (what bench model counted before it knew dense layers; the negative
// control).
static double qwen2_vl_decode_bytes(int tp, bool dense) {
  const double H = 96, D = 16, ffn = 64, L = 2;
  double qr = tp == 4 ? 2 : 6.0 / tp, kr = tp >= 2 ? 1 : 2, vocab_padded = tp == 4 ? 92 : 90;
  double layer = (2 * qr + 2 * kr) * D * H + (dense ? 3 * ffn / tp * H : 0);
  return 4 * (L * layer + vocab_padded / tp * H);
}

// The CLI of a model without experts: plan prints what applies (no QK-norm
// divisors, no "0 experts top-0"), bench model counts the dense MLPs (its
// bytes per decode step against the hand count; no nan), --moe-stats is
// refused naming the family, run says the vision tower is not run.
static void test_dense_cli(void **state) {
  (void)state;
  run_result r = tt_run(th.tpr, th.tmp_dir, MESH("plan", "--model", F->model, "--tp", "4"), NULL);
  assert_int_equal(r.code, 0);
  printf("  plan: %.*s", (int)(strchr(strchr(strchr(r.out, '\n') + 1, '\n') + 1, '\n') - r.out + 1), r.out);
  assert_null(strstr(r.out, "qk-norm divisors"));
  assert_null(strstr(r.out, "experts"));
  assert_non_null(strstr(r.out, "no qk-norm"));
  assert_non_null(strstr(r.out, "dense MLP width 64"));
  tt_run_done(&r);
  cJSON *j = tt_json_of(tt_run(th.tpr, th.tmp_dir, MESH("plan", "--model", F->model, "--tp", "1", "--json"), NULL));
  const cJSON *at = cJSON_GetObjectItemCaseSensitive(j, "attention");
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(at, "qk_norm")), "none");
  cJSON_Delete(j);

  const int tps[] = {1, 4};
  for (int i = 0; i < 2; i++) {
    char tp[8];
    snprintf(tp, sizeof tp, "%d", tps[i]);
    r = tt_run(th.tpr, th.tmp_dir,
               MESH("bench", "model", "--model", F->model, "--tp", tp, "--batch", "1", "--prompt-len", "4",
                    "--gen-len", "4", "--json"),
               &(tt_run_opts){.np = tps[i], .timeout_s = 120});
    assert_int_equal(r.code, 0);
    assert_null(strstr(r.out, "nan"));
    assert_null(strstr(r.out, "inf"));
    j = tt_json_of(r);
    double got = tt_json_num(j, "machine_read_gbs_per_rank") * 1e9 * tt_json_num(j, "decode_tokens_per_step") /
                 tt_json_num(j, "decode_roofline_tok_s");
    double want = qwen2_vl_decode_bytes(tps[i], true), wrong = qwen2_vl_decode_bytes(tps[i], false);
    printf("  bench model tp %d: %.0f bytes per decode step, by hand %.0f (without the dense MLPs %.0f); prefill "
           "%.4g GF/s per rank\n", tps[i], got, want, wrong, tt_json_num(j, "prefill_gflops_per_rank"));
    assert_true(fabs(got - want) <= 1e-4 * want);
    assert_true(fabs(got - wrong) > 1e-2 * want);
    assert_true(tt_json_num(j, "prefill_gflops_per_rank") > 0);
    cJSON_Delete(j);
  }

  r = tt_run(th.tpr, th.tmp_dir, MESH("run", "--model", F->model, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"),
             NULL);
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.err, "qwen2_vl runs its text decoder only"));
  tt_run_done(&r);
  th_check_refusal("--moe-stats", 1,
                   MESH("run", "--model", F->model, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--moe-stats"),
                   "--moe-stats: qwen2_vl is a dense model");
}

#define COMMON_TESTS                                                                    \
  cmocka_unit_test(test_controls_fail), cmocka_unit_test(test_steps),                  \
      cmocka_unit_test(test_resume_bit_identical), cmocka_unit_test(test_refusals)

// -- qwen3_moe
#define QWEN3_FIX FIXTURE("qwen3_moe_train")
#define QWEN3_MODEL FIXTURE("qwen3_moe_tiny")
// The forward is the same under each control (the aux loss only adds), but
// without the aux loss the routers' gradients miss its part, and without
// the backward all-reduce of the per-head norm weights or of the
// column-parallel inputs the tp 2 gradients are partial.
static const control qwen3_controls[] = {
    {"aux loss left out", 1, true, NULL, false},
    {"per-head norm weights' all-reduce left out", 2, false, MESH("--debug-skip-grad-marks", "qk-norm"), true},
    {"column inputs' all-reduce left out", 2, false, MESH("--debug-skip-grad-marks", "column"), true},
};
static const refusal qwen3_refusals[] = {
    {"routing-bias update", 1,
     MESH("train", "--model", QWEN3_MODEL, "--data", QWEN3_FIX "/tokens.npy", "--seq-len", "16",
          "--bias-update-rate", "0.01"),
     "qwen3_moe has not"},
};
static const struct CMUnitTest qwen3_tests[] = {cmocka_unit_test(test_step0_meshes), COMMON_TESTS};

// -- hunyuan_v1_moe
#define HUNYUAN_FIX FIXTURE("hunyuan_moe_train")
#define HUNYUAN_MODEL FIXTURE("hunyuan_moe_tiny")
// At tp 2. The marks change only the backward: without the shared expert's
// input all-reduce (or the norm weights') the gradients upstream of it are
// partial. The norm on the other side of RoPE (Qwen3's order) changes the
// forward too.
static const control hunyuan_controls[] = {
    {"shared expert's all-reduce left out", 2, false, MESH("--debug-skip-grad-marks", "shared-mlp"), true},
    {"norm weights' all-reduce left out", 2, false, MESH("--debug-skip-grad-marks", "qk-norm"), true},
    {"norm before RoPE", 2, false, MESH("--debug-per-rank-qk-norm"), false},
};
static const refusal hunyuan_refusals[] = {
    {"capacity path", 1,
     MESH("train", "--model", HUNYUAN_MODEL, "--data", HUNYUAN_FIX "/tokens.npy", "--seq-len", "16",
          "--capacity-factor", "1.0"),
     "--capacity-factor 1 has no backward"},
    {"3-D positions", 1,
     MESH("train", "--model", HUNYUAN_MODEL, "--data", HUNYUAN_FIX "/tokens.npy", "--seq-len", "16",
          "--positions-3d", FIXTURE("qwen3_vl_moe_train/positions_3d.npy")),
     "--positions-3d is for MRoPE families"},
};
static const struct CMUnitTest hunyuan_tests[] = {cmocka_unit_test(test_step0_meshes),
                                                  cmocka_unit_test(test_default_aux_is_zero), COMMON_TESTS};

// -- qwen3_vl_moe
#define QWEN3_VL_FIX FIXTURE("qwen3_vl_moe_train")
#define QWEN3_VL_MODEL FIXTURE("qwen3_vl_moe_tiny")
static const refusal qwen3_vl_refusals[] = {
    {"positions for another length", 1,
     MESH("train", "--model", QWEN3_VL_MODEL, "--data", QWEN3_VL_FIX "/tokens.npy", "--seq-len", "8",
          "--positions-3d", QWEN3_VL_FIX "/positions_3d.npy"),
     "positions_3d.npy"},
};
static const struct CMUnitTest qwen3_vl_tests[] = {
    cmocka_unit_test(test_step0_meshes), cmocka_unit_test(test_text_positions), COMMON_TESTS,
    cmocka_unit_test(test_save_transformers_layout)};

// -- qwen2_vl
#define QWEN2_VL_FIX FIXTURE("qwen2_vl_train")
#define QWEN2_VL_MODEL FIXTURE("qwen2_vl_tiny")
static const th_mesh_case qwen2_vl_meshes[] = {
    {1, MESH(GA2)},
    {2, MESH(GA2, "--tp", "2")},
    {4, MESH(GA2, "--tp", "4")},  // Q 6 -> 8 (padded), 2 KV heads replicated over 4 ranks
    {2, MESH("--dp", "2", "--tp", "1")},  // one window per replica
    {4, MESH("--dp", "2", "--tp", "2")},
};
// At tp 2 (3 Q heads and 1 KV head per rank). The marks change only the
// backward: without the column inputs' all-reduce the gradients upstream of
// q/k/v are partial; the biases all-reduced as though replicated mix
// different heads' cotangents (each rank holds its own heads' slice). (The
// biases left out of the forward is test_qwen2_vl's control: in training
// the loss would not depend on them, which the backward refuses.)
static const control qwen2_vl_controls[] = {
    {"column inputs' all-reduce left out", 2, false, MESH("--debug-skip-grad-marks", "column"), true},
    {"biases marked replicated", 2, false, MESH("--debug-skip-grad-marks", "bias-wrong"), true},
};
static const refusal qwen2_vl_refusals[] = {
    {"positions for another length", 1,
     MESH("train", "--model", QWEN2_VL_MODEL, "--data", QWEN2_VL_FIX "/tokens.npy", "--seq-len", "8",
          "--positions-3d", QWEN2_VL_FIX "/positions_3d.npy"),
     "positions_3d.npy"},
    {"an aux loss", 1,
     MESH("train", "--model", QWEN2_VL_MODEL, "--data", QWEN2_VL_FIX "/tokens.npy", "--seq-len", "16",
          "--aux-coef", "0.01"),
     "qwen2_vl has no experts"},
    {"expert parallelism", 2,
     MESH("train", "--model", QWEN2_VL_MODEL, "--data", QWEN2_VL_FIX "/tokens.npy", "--seq-len", "16", "--tp", "1",
          "--ep", "2"),
     "no experts"},
};
static const struct CMUnitTest qwen2_vl_tests[] = {
    cmocka_unit_test(test_step0_meshes), cmocka_unit_test(test_text_positions), COMMON_TESTS,
    cmocka_unit_test(test_dense_cli), cmocka_unit_test(test_save_transformers_layout)};

// -- minimax (lightning attention layers 0, 2, 3 beside a softmax layer 1)
#define MINIMAX_FIX FIXTURE("minimax_train")
#define MINIMAX_MODEL FIXTURE("minimax_tiny")
// At tp 2 (2 lightning heads per rank): without the column inputs'
// all-reduce the gradients upstream of qkv_proj / output_gate / q,k,v are
// partial; without the lightning norm's marks (its all-reduced sum of
// squares and its whole weight feed each rank's slice only) the norm
// weights' and the upstream gradients are; the norm over each rank's heads
// alone changes the forward.
static const control minimax_controls[] = {
    {"aux loss left out", 1, true, NULL, false},
    {"lightning norm's all-reduce marks left out", 2, false, MESH("--debug-skip-grad-marks", "qk-norm"), true},
    {"column inputs' all-reduce left out", 2, false, MESH("--debug-skip-grad-marks", "column"), true},
    {"lightning norm over each rank's heads", 2, false, MESH("--debug-per-rank-qk-norm"), false},
};
// (FSDP and --pack, refused before, are built: tests/test_fsdp_qkhd.c's
// minimax group and tests/test_train_pack.c's minimax family.)
// FSDP (the step-0 meshes at dp 2 run it too, the trainer's default there):
// the fixture's AdamW steps at dp 2 (one window per replica) and dp 2 x tp 2,
// every step's loss and the saved parameters against PyTorch's, the saves
// under transformers' names with a config naming the family.
// FSDP's AdamW steps against PyTorch's, allowed up to twice the distance
// plain data parallelism of the same mesh has from PyTorch (if above
// TH_STEPS_BOUND): six Adam steps amplify the last bits of a gradient whose
// second moment is tiny, and a reduce-scatter sums in another order than an
// all-reduce. A sharding bug is off by 1 or more (test_fsdp_minimax's
// controls).
static void test_fsdp_steps(void **state) {
  (void)state;
  const int nps[2] = {2, 4};
  const char *const *fsdp[2] = {MESH("--dp", "2", "--fsdp"), MESH("--dp", "2", "--tp", "2", "--fsdp")};
  const char *const *plain[2] = {MESH("--dp", "2", "--no-fsdp"), MESH("--dp", "2", "--tp", "2", "--no-fsdp")};
  const int total = (int)th_meta_at("optimizer.steps", -1);
  for (int m = 0; m < 2; m++) {
    char save[600];
    snprintf(save, sizeof save, "%s/plain_steps_%d", th.tmp_dir, m);
    const double allowance = fmax(TH_STEPS_BOUND, 2 * th_steps_distance(nps[m], plain[m], total, aux(), save,
                                                                          F->min_tensors));
    snprintf(save, sizeof save, "%s/fsdp_steps_%d", th.tmp_dir, m);
    const double d = th_steps_distance(nps[m], fsdp[m], total, aux(), save, F->min_tensors);
    printf("  FSDP %.2e of its allowance %.2e\n", d, allowance);
    assert_true(d <= allowance);
  }
}
static const struct CMUnitTest minimax_tests[] = {cmocka_unit_test(test_step0_meshes), COMMON_TESTS,
                                                  cmocka_unit_test(test_fsdp_steps)};

// -- minicpm_sala (sparse layers 0 and 3, lightning layers 1 and 2)
#define SALA_FIX FIXTURE("minicpm_sala_train")
#define SALA_MODEL FIXTURE("minicpm_sala_tiny")
static const th_mesh_case sala_meshes[] = {
    {1, MESH(GA2)},
    {2, MESH(GA2, "--tp", "2")},  // lightning k/v heads split, one sparse KV head per rank
    {4, MESH(GA2, "--tp", "4")},  // lightning k/v whole on every rank; sparse KV replicated, the query group gathered
    {2, MESH("--dp", "2", "--tp", "1")},  // one window per replica, under FSDP (the default at dp 2)
    {4, MESH("--dp", "2", "--tp", "2")},
};
// At tp 2 the marks change only the backward: without the column inputs'
// all-reduce the gradients upstream of q/k/v, the gates and the MLP are
// partial; without the norm marks (the lightning q/k norm weights, the
// output norm's all-reduced sum and whole weight) those are. The output norm
// over each rank's heads changes the forward, and so does running the sparse
// layers dense (every block attended: the selection not respected; 0.14 of
// the largest gradient in the fixture script's own check).
static const control sala_controls[] = {
    {"column inputs' all-reduce left out", 2, false, MESH("--debug-skip-grad-marks", "column"), true},
    {"lightning norm marks left out", 2, false, MESH("--debug-skip-grad-marks", "qk-norm"), true},
    {"lightning output norm over each rank's heads", 2, false, MESH("--debug-per-rank-qk-norm"), false},
    {"sparse layers dense", 1, false, MESH("--dense-sparse-layers"), false},
};
static const refusal sala_refusals[] = {
    {"packed documents", 1,
     MESH("train", "--model", SALA_MODEL, "--data", SALA_FIX "/tokens.npy", "--seq-len", "64", "--pack",
          "--eos-id", "2"),
     "--pack is not built for minicpm_sala"},
    {"an aux loss", 1,
     MESH("train", "--model", SALA_MODEL, "--data", SALA_FIX "/tokens.npy", "--seq-len", "64", "--aux-coef", "0.01"),
     "minicpm_sala has no experts"},
};
// (--save: test_steps reads the saved parameters by their checkpoint names;
// the checkpoint holds bf16, the save f32, so th_check_save_as_saved's
// byte-for-byte comparison does not apply.)
static const struct CMUnitTest sala_tests[] = {cmocka_unit_test(test_step0_meshes),
                                               cmocka_unit_test(test_default_aux_is_zero), COMMON_TESTS,
                                               cmocka_unit_test(test_fsdp_steps)};

#define N(a) (sizeof(a) / sizeof *(a))
#define STEPS_TP2_EP2 {MESH(GA2), MESH(GA2, "--tp", "2", "--ep", "2", "--etp", "1")}

static const family families[] = {
    {.name = "qwen3", .fix = QWEN3_FIX, .model = QWEN3_MODEL,
     .min_tensors = 50,  // every trained tensor of the 4-layer fixture is compared
     .model_type = "qwen3_moe", .step0 = moe_meshes, .n_step0 = N(moe_meshes),
     .steps_np = {1, 2}, .steps_mesh = STEPS_TP2_EP2,
     .controls = qwen3_controls, .n_controls = N(qwen3_controls),
     .refusals = qwen3_refusals, .n_refusals = N(qwen3_refusals),
     .tests = qwen3_tests, .n_tests = N(qwen3_tests)},
    {.name = "hunyuan", .fix = HUNYUAN_FIX, .model = HUNYUAN_MODEL,
     .min_tensors = 100,  // every trained tensor of the 3-layer fixture (111) is compared
     .model_type = "hunyuan_v1_moe", .ce_alone = true, .step0 = moe_meshes, .n_step0 = N(moe_meshes),
     .steps_np = {1, 2}, .steps_mesh = STEPS_TP2_EP2,
     .controls = hunyuan_controls, .n_controls = N(hunyuan_controls),
     .refusals = hunyuan_refusals, .n_refusals = N(hunyuan_refusals),
     .tests = hunyuan_tests, .n_tests = N(hunyuan_tests)},
    {.name = "qwen3_vl", .fix = QWEN3_VL_FIX, .model = QWEN3_VL_MODEL, .positions = QWEN3_VL_FIX "/positions_3d.npy",
     .min_tensors = 60,  // every trained tensor of the 2-layer text decoder (69) is compared
     .model_type = "qwen3_vl_moe", .step0 = moe_meshes, .n_step0 = N(moe_meshes),
     .steps_np = {1, 2}, .steps_mesh = STEPS_TP2_EP2,
     // Qwen3-MoE's three controls; 1-D positions in place of the 3-D ones: test_text_positions.
     .controls = qwen3_controls, .n_controls = N(qwen3_controls),
     .refusals = qwen3_vl_refusals, .n_refusals = N(qwen3_vl_refusals),
     .fused_experts = "model.language_model.layers.0.mlp.experts.gate_up_proj",
     .tests = qwen3_vl_tests, .n_tests = N(qwen3_vl_tests)},
    {.name = "qwen2_vl", .fix = QWEN2_VL_FIX, .model = QWEN2_VL_MODEL, .positions = QWEN2_VL_FIX "/positions_3d.npy",
     .min_tensors = 25,  // every trained tensor of the 2-layer text decoder (27) is compared
     .model_type = "qwen2_vl", .ce_alone = true, .step0 = qwen2_vl_meshes, .n_step0 = N(qwen2_vl_meshes),
     .steps_np = {1, 4}, .steps_mesh = {MESH(GA2), MESH(GA2, "--tp", "4")},
     .controls = qwen2_vl_controls, .n_controls = N(qwen2_vl_controls),
     .refusals = qwen2_vl_refusals, .n_refusals = N(qwen2_vl_refusals),
     .tests = qwen2_vl_tests, .n_tests = N(qwen2_vl_tests)},
    {.name = "minimax", .fix = MINIMAX_FIX, .model = MINIMAX_MODEL,
     .min_tensors = 70,  // every trained tensor of the 4-layer fixture (79) is compared
     .model_type = "minimax", .step0 = moe_meshes, .n_step0 = N(moe_meshes),
     .steps_np = {1, 2}, .steps_mesh = STEPS_TP2_EP2,
     .controls = minimax_controls, .n_controls = N(minimax_controls),
     .refusals = NULL, .n_refusals = 0,
     .tests = minimax_tests, .n_tests = N(minimax_tests)},
    {.name = "minicpm_sala", .fix = SALA_FIX, .model = SALA_MODEL,
     .min_tensors = 45,  // every trained tensor of the 4-layer fixture (49) is compared
     .model_type = "minicpm_sala", .ce_alone = true, .step0 = sala_meshes, .n_step0 = N(sala_meshes),
     .steps_np = {1, 2}, .steps_mesh = {MESH(GA2), MESH(GA2, "--tp", "2")},
     .controls = sala_controls, .n_controls = N(sala_controls),
     .refusals = sala_refusals, .n_refusals = N(sala_refusals),
     .tests = sala_tests, .n_tests = N(sala_tests)},
};

static char test_name[64];

static int setup(void **state) {
  (void)state;
  char tmp[96];
  snprintf(tmp, sizeof tmp, "/tmp/tpr_%s_XXXXXX", test_name);
  int rc = th_setup(test_name, tmp, F->fix, F->model);
  // Every run of an MRoPE family passes the fixture's positions; static:
  // the harness reads them after setup returns.
  static const char *pos_args[3];
  pos_args[0] = "--positions-3d", pos_args[1] = F->positions, pos_args[2] = NULL;
  th.run_args = F->positions ? pos_args : NULL;
  return rc;
}

int main(int argc, char **argv) {
  for (size_t i = 0; argc == 2 && i < N(families); i++)
    if (!strcmp(argv[1], families[i].name)) F = &families[i];
  if (!F) {
    fprintf(stderr, "usage: test_train_family qwen3|hunyuan|qwen3_vl|qwen2_vl|minimax|minicpm_sala\n");
    return 2;
  }
  tt_seed_from_env();
  snprintf(test_name, sizeof test_name, "test_train_family_%s", F->name);
  return _cmocka_run_group_tests(test_name, F->tests, F->n_tests, setup, th_teardown);
}
