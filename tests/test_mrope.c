// Qwen3-VL-MoE's text decoder (models/qwen3_vl_moe.h: the qwen3_moe step
// with interleaved MRoPE) through the engine's session against transformers'
// Qwen3VLMoeForConditionalGeneration language model (tests/fixtures/
// qwen3_vl_moe_tiny, made by scripts/reference/make_qwen3_vl_moe_fixture.py),
// under mpirun at the mesh on the command line (--tp/--dp/--ep). The prompt's
// 3-D positions hold an image-like 2x3 grid (t constant, h/w varying):
//  - parity: logits within 1e-4 of max |logit|;
//  - greedy decode through the KV cache continuing at max(pos3) + 1 + j on
//    every axis (transformers' rope_deltas), from a prefill of a random
//    length: tokens equal, logits within the bound;
//  - the batched engine (tpr run's path) on a text-only prompt, no 3-D
//    positions given: tokens and logits equal transformers' own generate;
//  - negative control (a): the same prompt at text positions (all three axes
//    = the sequence index, i.e. 1-D RoPE) must break the bound;
//  - negative control (b): the SECTIONED layout in place of the interleaved
//    one must break the bound;
//  - refusals: a negative 3-D position, 3-D positions on a family without
//    MRoPE (qwen3_moe's fixture).
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "family_parity.h"
#include "m2_ref.h"
#include "runtime/ops/rope/rope.h"

#define FIX TPR_FIXTURES "/qwen3_vl_moe_tiny"
#define V 96
#define T 12
#define NG 4
#define TT 7   // text-only prompt
#define NGT 6  // its greedy continuation
#define BOUND 1e-4  // max|d| <= BOUND * max|ref|: the TP parity tolerance (as qwen3_moe's)

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

static tpr_session *open_session(const char *dir, int layout_control) {
  tpr_session_opts o = fp_session_opts(dir, T + NG);
  o.mrope_layout_control = layout_control;
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
  tpr_session *s = open_session(FIX, 0);
  double e = parity(s, ref.pos3);
  tpr_session_close(s);
  if (fp.R == 0)
    printf("parity tp %d dp %d ep %d, 3-D positions with a 2x3 grid: max|d|/max|ref| %.3g (bound %.0e)\n", fp.tp,
           fp.dp, fp.ep, e, BOUND);
  if (!(e <= BOUND)) fail_msg("logits differ from transformers' by %.3g of max |logit| (bound %.0e)", e, BOUND);
}

static void test_greedy_rope_deltas(void **state) {
  (void)state;
  int64_t seed = fp_shared_seed();
  // Prefill the first P tokens (P past the grid, so the delta is in force),
  // then the rest of the prompt and the greedy tokens one at a time, each
  // past the prompt at max(pos3) + 1 + j on every axis.
  int64_t P = 9 + (int64_t)((uint64_t)seed % (T - 9));  // in [9, T-1]
  int32_t seq[T + NG];
  tpr_session *s = open_session(FIX, 0);
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

static void test_control_text_positions(void **state) {
  (void)state;
  tpr_session *s = open_session(FIX, 0);
  double e = parity(s, NULL);  // every axis = the sequence index: plain 1-D RoPE
  tpr_session_close(s);
  if (fp.R == 0) printf("control (a) positions flattened to 1-D: %.3g (must exceed %.0e)\n", e, BOUND);
  if (!(e > BOUND)) fail_msg("1-D positions passed the parity bound (%.3g)", e);
}

static void test_control_sectioned(void **state) {
  (void)state;
  tpr_session *s = open_session(FIX, TPR_MROPE_SECTIONED);
  double e = parity(s, ref.pos3);
  tpr_session_close(s);
  if (fp.R == 0) printf("control (b) sectioned layout in place of interleaved: %.3g (must exceed %.0e)\n", e, BOUND);
  if (!(e > BOUND)) fail_msg("the sectioned layout passed the parity bound (%.3g)", e);
}

static void test_refusals(void **state) {
  (void)state;
  static float got[T * V];
  int32_t bad[3 * T];
  memcpy(bad, ref.pos3, sizeof bad);
  bad[T + 4] = -1;  // a height position
  tpr_session *s = open_session(FIX, 0);
  tpr_status rc = tpr_session_forward_3d(s, ref.tokens, T, 0, bad, got);
  if (fp.R == 0) printf("negative 3-D position -> %s: %s\n", tpr_status_name(rc), tpr_last_error());
  assert_int_equal(rc, TPR_ERR_INVALID_ARG);
  tpr_session_close(s);
  s = open_session(TPR_FIXTURES "/qwen3_moe_tiny", 0);
  rc = tpr_session_forward_3d(s, ref.tokens, 4, 0, ref.pos3, got);
  if (fp.R == 0) printf("3-D positions on qwen3_moe -> %s: %s\n", tpr_status_name(rc), tpr_last_error());
  assert_int_equal(rc, TPR_ERR_INVALID_ARG);
  tpr_session_close(s);
}

int main(int argc, char **argv) {
  fp_init(&argc, &argv);
  load_ref();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_greedy_rope_deltas),
      cmocka_unit_test(test_engine_text),
      cmocka_unit_test(test_control_text_positions),
      cmocka_unit_test(test_control_sectioned),
      cmocka_unit_test(test_refusals),
  };
  return fp_run(tests, sizeof tests / sizeof *tests, NULL);
}
