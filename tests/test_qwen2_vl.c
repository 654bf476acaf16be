// Qwen2-VL's text decoder (models/qwen2_vl.h: a dense Qwen2 with q/k/v biases
// and SECTIONED MRoPE, built by the shared step builder) through the engine's
// session against transformers' Qwen2VLForConditionalGeneration language
// model (tests/fixtures/qwen2_vl_tiny, made by
// scripts/reference/make_qwen2_vl_fixture.py), under mpirun at the mesh on
// the command line (--tp). The fixture's 6 Q heads over 2 KV heads make tp 4
// pad Q (interleaved) and replicate KV, so the biases' slices are checked on
// every layout. The prompt's 3-D positions hold a 2x3 image-like grid:
//  - parity: logits within 1e-4 of max |logit|;
//  - greedy decode through the KV cache continuing at max(pos3) + 1 + j on
//    every axis, from a prefill of a random length: tokens equal, logits
//    within the bound;
//  - the batched engine (tpr run's path) on a text-only prompt: tokens and
//    logits equal transformers' own generate;
//  - negative controls, each must break the bound: (a) the INTERLEAVED layout
//    (Qwen3-VL's) in place of the sectioned one, (b) 1-D positions, (c) the
//    q/k/v biases left out;
//  - config parsing (nested text_config and the hub's flat keys with the
//    legacy rope_scaling; qwen2_5_vl) and refusals by name (sliding window,
//    RoPE scaling, head_dim, hidden_act, ep > 1, MoE options).
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "family_parity.h"
#include "m2_ref.h"
#include "runtime/ops/rope/rope.h"

#define FIX TPR_FIXTURES "/qwen2_vl_tiny"
#define V 90
#define T 12
#define NG 4
#define TT 7   // text-only prompt
#define NGT 6  // its greedy continuation
#define BOUND 1e-4  // max|d| <= BOUND * max|ref|: the TP parity tolerance of every family

static struct {
  int32_t tokens[T], pos3[3 * T], greedy[NG];
  float logits[T * V], greedy_logits[NG * V];
  int32_t text[TT], text_greedy[NGT];
  float text_logits[NGT * V];
} ref;

static void load_ref(void) {
  tpr_st_set *set;
  TT_OK(tpr_st_open(FIX "/reference.safetensors", &set));
  fp_read_ids(set, "tokens", T, 0, ref.tokens);
  fp_read_ids(set, "pos3", 3, T, ref.pos3);
  fp_read_ids(set, "greedy", NG, 0, ref.greedy);
  m2_read_f32(set, "logits", T, V, ref.logits);
  m2_read_f32(set, "greedy_logits", NG, V, ref.greedy_logits);
  fp_read_ids(set, "text_tokens", TT, 0, ref.text);
  fp_read_ids(set, "text_greedy", NGT, 0, ref.text_greedy);
  m2_read_f32(set, "text_greedy_logits", NGT, V, ref.text_logits);
  tpr_st_close(set);
}

// no_bias: the session's family control (qwen2_vl: the q/k/v biases left out).
static tpr_session *open_session(int layout_control, bool no_bias) {
  tpr_session_opts o = fp_session_opts(FIX, T + NG);
  o.mrope_layout_control = layout_control;
  o.per_rank_qk_norm = no_bias;
  return fp_open(&o, NULL);
}

// The prompt's error at pos3 (NULL: text positions), the same on every rank.
static double parity(tpr_session *s, const int32_t *pos3) {
  static float got[T * V];
  TT_OK(tpr_session_forward_3d(s, ref.tokens, T, 0, pos3, got));
  return m2_rel_err(got, ref.logits, T * V);
}

static void test_parity(void **state) {
  (void)state;
  tpr_session *s = open_session(0, false);
  const tpr_shard_plan *p = tpr_session_plan(s);
  double e = parity(s, ref.pos3);
  if (fp.R == 0)
    printf("parity tp %d (%s, Q %lld -> %lld heads, %lld Q + %lld KV heads per rank, q bias %lld per rank), "
           "3-D positions with a 2x3 grid: max|d|/max|ref| %.3g (bound %.0e)\n", fp.tp,
           tpr_kv_strategy_name(p->attn.strategy), (long long)p->attn.nq, (long long)p->attn.nq_padded,
           (long long)p->attn.q_per_rank, (long long)p->attn.kv_per_rank,
           (long long)(p->attn.q_per_rank * p->config.head_dim), e, BOUND);
  tpr_session_close(s);
  if (!(e <= BOUND)) fail_msg("logits differ from transformers' by %.3g of max |logit| (bound %.0e)", e, BOUND);
}

static void test_greedy_cached(void **state) {
  (void)state;
  int64_t seed = fp_shared_seed();
  // Prefill P tokens past the grid (so the position delta is in force), then
  // the rest one at a time through the KV cache.
  int64_t P = 9 + (int64_t)((uint64_t)seed % (T - 9));  // in [9, T-1]
  int32_t seq[T + NG];
  tpr_session *s = open_session(0, false);
  double worst = fp_decode(s, ref.tokens, T, P, ref.pos3, ref.greedy, ref.greedy_logits, NG, V, seq, NULL);
  tpr_session_close(s);
  if (fp.R == 0)
    printf("greedy via the KV cache (prefill %lld of %d, seed %lld, decode at max+1+j = %lld..): %d tokens equal, "
           "logits %.3g (bound %.0e)\n", (long long)P, T, (long long)seed,
           (long long)tpr_mrope_next_position(ref.pos3, T), NG, worst, BOUND);
  if (!(worst <= BOUND)) fail_msg("decoded logits differ from transformers' by %.3g", worst);
}

// What tpr run does: the batched engine on a text prompt, against
// transformers' own generate on the same prompt.
static void test_engine_text(void **state) {
  (void)state;
  fp_test_engine_text(FIX, ref.text, TT, ref.text_greedy, ref.text_logits, NGT, V, BOUND);
}

static void control(const char *what, int layout, bool no_bias, const int32_t *pos3) {
  tpr_session *s = open_session(layout, no_bias);
  double e = parity(s, pos3);
  tpr_session_close(s);
  if (fp.R == 0) printf("control %s: %.3g (must exceed %.0e)\n", what, e, BOUND);
  if (!(e > BOUND)) fail_msg("control %s passed the parity bound (%.3g)", what, e);
}

static void test_control_interleaved(void **state) {
  (void)state;
  control("(a) interleaved layout (Qwen3-VL's) in place of sectioned", TPR_MROPE_INTERLEAVED, false, ref.pos3);
}

static void test_control_text_positions(void **state) {
  (void)state;
  control("(b) positions flattened to 1-D", 0, false, NULL);
}

static void test_control_no_bias(void **state) {
  (void)state;
  control("(c) q/k/v biases left out", 0, true, ref.pos3);
}

// ---- config parsing and refusals (pure: every rank checks the same)

static const char *const NESTED_TEXT =
    "\"vocab_size\": 90, \"hidden_size\": 96, \"intermediate_size\": 64, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 6, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-6";

static tpr_status parse(const char *fmt, const char *a, const char *b, tpr_model_config *c) {
  char json[2048];
  snprintf(json, sizeof json, fmt, a, b);
  return tpr_model_config_parse(json, strlen(json), "cfg", c);
}

static void expect_refused(const char *what, tpr_status rc, tpr_status want, const char *needle) {
  const char *msg = tpr_last_error();
  if (fp.R == 0) printf("refused %-34s -> %s: %s\n", what, tpr_status_name(rc), msg);
  assert_int_equal(rc, want);
  if (!strstr(msg, needle)) fail_msg("%s: the message does not name \"%s\": %s", what, needle, msg);
}

static void test_config(void **state) {
  (void)state;
  tpr_model_config fx, flat, c;
  TT_OK(tpr_model_config_load(FIX, &fx));  // what save_pretrained wrote: text_config nested
  assert_int_equal(fx.family, TPR_FAMILY_QWEN2_VL);
  assert_true(fx.qkv_bias && fx.qk_norm == TPR_QK_NORM_NONE && !fx.tie_word_embeddings);
  assert_int_equal(fx.mrope_layout, TPR_MROPE_SECTIONED);
  assert_int_equal(fx.num_experts + fx.num_moe_layers, 0);
  assert_int_equal(fx.dense_intermediate_size, 64);
  assert_int_equal(fx.head_dim, 16);
  for (int64_t l = 0; l < fx.num_layers; l++) assert_false(tpr_model_config_layer_is_moe(&fx, l));
  // The hub's flat keys with the legacy rope_scaling (type mrope) and a
  // top-level rope_theta: the same model.
  TT_OK(parse("{\"model_type\": \"%s\", %s, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, "
              "\"use_sliding_window\": false, \"sliding_window\": 32768, "
              "\"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [4, 2, 2]}}",
              "qwen2_5_vl", NESTED_TEXT, &flat));
  assert_int_equal(flat.family, TPR_FAMILY_QWEN2_VL);
  assert_memory_equal(&flat, &fx, sizeof flat);
  // No mrope_section: the rotary embedding's default [16, 24, 24] (rd/2 = 64).
  TT_OK(parse("{\"model_type\": \"qwen2_vl\", \"text_config\": {%s, %s}}",
              "\"vocab_size\": 8, \"hidden_size\": 256, \"intermediate_size\": 8, \"num_hidden_layers\": 1",
              "\"num_attention_heads\": 2, \"num_key_value_heads\": 1", &c));
  assert_true(c.mrope_section[0] == 16 && c.mrope_section[1] == 24 && c.mrope_section[2] == 24);
  assert_true(c.rope_theta == 1e6 && c.rms_norm_eps == 1e-5);  // the class defaults
  if (fp.R == 0)
    printf("config: nested text_config == hub flat keys (qwen2_5_vl, rope_scaling mrope): sectioned [%lld, %lld, "
           "%lld], D %lld, dense MLP %lld, no experts; defaults section [16, 24, 24], theta %g\n",
           (long long)fx.mrope_section[0], (long long)fx.mrope_section[1], (long long)fx.mrope_section[2],
           (long long)fx.head_dim, (long long)fx.dense_intermediate_size, c.rope_theta);

  const char *nested = "{\"model_type\": \"qwen2_vl\", \"text_config\": {%s, %s}}";
  expect_refused("use_sliding_window", parse(nested, NESTED_TEXT, "\"use_sliding_window\": true", &c),
                 TPR_ERR_UNSUPPORTED, "sliding");
  expect_refused("layer_types sliding", parse(nested, NESTED_TEXT,
                 "\"layer_types\": [\"full_attention\", \"sliding_attention\"]", &c), TPR_ERR_UNSUPPORTED, "sliding");
  expect_refused("rope_type yarn", parse(nested, NESTED_TEXT,
                 "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4, \"mrope_section\": [4, 2, 2]}", &c),
                 TPR_ERR_UNSUPPORTED, "yarn");
  expect_refused("mrope_interleaved true", parse(nested, NESTED_TEXT,
                 "\"rope_parameters\": {\"mrope_section\": [4, 2, 2], \"mrope_interleaved\": true}", &c),
                 TPR_ERR_UNSUPPORTED, "mrope_interleaved");
  expect_refused("head_dim != hidden/heads", parse(nested, NESTED_TEXT,
                 "\"head_dim\": 8, \"rope_parameters\": {\"mrope_section\": [2, 1, 1]}", &c), TPR_ERR_UNSUPPORTED,
                 "head_dim");
  expect_refused("hidden_act gelu", parse(nested, NESTED_TEXT,
                 "\"hidden_act\": \"gelu\", \"rope_parameters\": {\"mrope_section\": [4, 2, 2]}", &c),
                 TPR_ERR_UNSUPPORTED, "hidden_act");
  expect_refused("sections not summing to D/2", parse(nested, NESTED_TEXT,
                 "\"rope_parameters\": {\"mrope_section\": [4, 2, 3]}", &c), TPR_ERR_FORMAT, "mrope_section");

  tpr_shard_plan plan;
  expect_refused("ep 2 (no experts)", tpr_shard_plan_build(&fx, 1, 2, 1, 2, TPR_F32, &plan), TPR_ERR_INVALID_ARG,
                 "no experts");
  // The plan slices the biases like their weights' rows at tp 4: Q 6 -> 8
  // heads (2 per rank), KV 2 -> 4 (1 per rank).
  TT_OK(tpr_shard_plan_build(&fx, 4, 1, 4, 1, TPR_F32, &plan));
  int found = 0;
  for (int i = 0; i < plan.n_tensors; i++) {
    const tpr_shard_tensor *t = &plan.tensors[i];
    if (!strstr(t->name, "_proj.bias")) continue;
    found++;
    bool q = strstr(t->name, "q_proj") != NULL;
    assert_int_equal(t->transform, TPR_XFORM_COLUMN_HEADS);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->kv_layout, !q);
    assert_int_equal(t->rank_shape[0], (q ? 2 : 1) * 16);
  }
  assert_int_equal(found, 3);
  uint64_t held, pad;
  TT_OK(tpr_shard_plan_rank_bytes(&plan, 1, &held, &pad));
  // Rank 1 holds Q heads [Q3 Q4 | ..] of [Q0 Q1 Q2 0 Q3 Q4 Q5 0]: padded head 3 is rank 1's second:
  // q weight rows + o columns (16 x 96 each) + q bias (16), per layer; vocab 90 -> 92, rank 1 holds no pad row.
  assert_int_equal(pad, (uint64_t)(2 * (16 * 96 * 2 + 16)) * 4);
  if (fp.R == 0)
    printf("plan tp 4: q/k/v biases column_heads (32 / 16 / 16 per rank), rank 1 padding %llu bytes\n",
           (unsigned long long)pad);
  tpr_shard_plan_free(&plan);
}

// A session refuses what a dense model cannot do: MoE statistics (naming
// the family), the capacity path.
static void test_session_refusals(void **state) {
  (void)state;
  tpr_session_opts o = fp_session_opts(FIX, T);
  tpr_session *s = NULL;
  o.moe_stats = true;
  expect_refused("moe_stats", tpr_session_open(&o, fp.world, tt_cpu(), &s), TPR_ERR_INVALID_ARG, "qwen2_vl is a dense model");
  o = fp_session_opts(FIX, T);
  o.moe.capacity_factor = 1.0;
  expect_refused("--capacity-factor", tpr_session_open(&o, fp.world, tt_cpu(), &s), TPR_ERR_INVALID_ARG, "dense");
}

int main(int argc, char **argv) {
  fp_init(&argc, &argv);
  load_ref();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_greedy_cached),
      cmocka_unit_test(test_engine_text),
      cmocka_unit_test(test_control_interleaved),
      cmocka_unit_test(test_control_text_positions),
      cmocka_unit_test(test_control_no_bias),
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_session_refusals),
  };
  return fp_run(tests, sizeof tests / sizeof *tests, NULL);
}
