// Capacity mode's gate for a re-routed token (models/layers/moe.h,
// tpr_moe_capacity_gates with reroute_own_prob, Hunyuan's rule from its original code)
// on a hand-made routing: T = 6 tokens, E = 3 experts, top-1, factor 1, so
// C = ceil(6 * 1 * 1 / 3) = 2 per expert. Tokens 0-2 pick expert 0, token 3
// expert 1, tokens 4-5 expert 2 (fresh random logits each run with that
// argmax). Expert 0 drops its lowest-priority token (lowest gate, then the
// later token); the only spare slot is expert 1's, so whatever the seed the
// dropped token d lands there:
//  - own-probability rule: gate[d, 1] = softmax(logits[d])[1], every kept
//    token keeps its router gate, nothing else is routed;
//  - control, the default (MiniMax) rule on the same input: gate[d, 1] is d's
//    weight at expert 0, which differs from the own probability.
// Both with the gates renormalised (transformers' Hunyuan router: every top-1
// gate is 1) and raw (Hunyuan's original top1gating).
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/layers/moe.h"
#include "models/layers/router_softmax.h"

#define T 6
#define E 3

static const int pick[T] = {0, 0, 0, 1, 2, 2};

// Runs router + capacity on logits; out (T, E) the routed gates, router
// (T, E) the router's gates before capacity.
static void run(const float *logits, bool renorm, bool own, uint64_t seed, float *out, float *router) {
  tpr_program *p;
  tpr_value_id x, g;
  tpr_router_softmax_values r;
  TT_OK(tpr_program_new(&p));
  TT_OK(tpr_program_input(p, "logits", TPR_F32, 2, (const int64_t[]){T, E}, &x));
  TT_OK(tpr_router_softmax_topk_values(p, x, 1, renorm, &r));
  tpr_moe_opts o = {.capacity_factor = 1.0, .reroute_dropped = true, .seed = seed, .reroute_own_prob = own,
                    .probs = r.probs, .chosen = r.chosen};
  TT_OK(tpr_moe_capacity_gates(p, &o, 1, 0, r.gates, &g));
  TT_OK(tpr_program_output(p, g, "gates"));
  TT_OK(tpr_program_output(p, r.gates, "router"));
  tpr_tensor *xt;
  TT_OK(tpr_tensor_new(tt_cpu(), TPR_F32, 2, (const int64_t[]){T, E}, &xt));
  memcpy(tpr_tensor_data(xt), logits, sizeof(float) * T * E);
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  TT_OK(tpr_exec_bind(e, "logits", xt));
  TT_OK(tpr_exec_run(e));
  const tpr_tensor *ot;
  TT_OK(tpr_exec_output(e, "gates", &ot));
  memcpy(out, tpr_tensor_data(ot), sizeof(float) * T * E);
  TT_OK(tpr_exec_output(e, "router", &ot));
  memcpy(router, tpr_tensor_data(ot), sizeof(float) * T * E);
  tpr_exec_free(e);
  tpr_tensor_free(xt);
  tpr_program_free(p);
}

static void test_reroute_gate(void **state) {
  (void)state;
  for (int renorm = 1; renorm >= 0; renorm--) {
    float logits[T * E];
    double prob[T][E];
    for (int t = 0; t < T; t++) {
      double z = 0;
      for (int e = 0; e < E; e++) logits[t * E + e] = (float)(e == pick[t] ? tt_uniform(1.5, 3.0) : tt_uniform(-1, 1));
      for (int e = 0; e < E; e++) z += exp(logits[t * E + e]);
      for (int e = 0; e < E; e++) prob[t][e] = exp(logits[t * E + e]) / z;
    }
    // The router's gate at the chosen expert (checked against the hand
    // value), and expert 0's dropped token: the lowest of the router's own
    // float gates, ties to the later token. Renormalised top-1 gates are 1
    // up to rounding (w * (1 / w) can be 1 - 2^-24), and that rounding, not
    // the token order, may then decide which token goes.
    double gate[T];
    for (int t = 0; t < T; t++) gate[t] = renorm ? 1.0 : prob[t][pick[t]];
    uint64_t seed = tt_next_u64();
    float own[T * E], old[T * E], router[T * E];
    run(logits, renorm, true, seed, own, router);
    run(logits, renorm, false, seed, old, router);
    for (int t = 0; t < T; t++)
      if (!(fabs(router[t * E + pick[t]] - gate[t]) <= 1e-6))
        fail_msg("router gate of token %d: %.8f, want %.8f", t, router[t * E + pick[t]], gate[t]);
    int d = 0;
    for (int t = 1; t < 3; t++)
      if (router[t * E] <= router[d * E]) d = t;
    for (int t = 0; t < T; t++) gate[t] = router[t * E + pick[t]];  // the weights the kernel keeps
    double err = 0;
    for (int t = 0; t < T; t++)
      for (int e = 0; e < E; e++) {
        double want = t == d ? (e == 1 ? prob[d][1] : 0) : (e == pick[t] ? gate[t] : 0);
        err = fmax(err, fabs(own[t * E + e] - want));
      }
    double old_gate = old[d * E + 1], own_gate = own[d * E + 1];
    printf("%s gates: token %d dropped by expert 0, re-routed to expert 1: own-probability gate %.6f (softmax %.6f), "
           "max |err| over all gates %.2e; default rule %.6f (its expert-0 weight %.6f)\n",
           renorm ? "renormalised" : "raw", d, own_gate, prob[d][1], err, old_gate, gate[d]);
    if (!(err <= 1e-6)) fail_msg("own-probability gates differ from the hand-worked ones by %.3g", err);
    if (!(fabs(old_gate - gate[d]) <= 1e-6)) fail_msg("the default rule's gate %.6f is not the origin weight", old_gate);
    // Control: the default rule gives a different gate on the same input.
    if (!(fabs(old_gate - own_gate) > 0.05)) fail_msg("the two rules agree (%.6f, %.6f)", old_gate, own_gate);
  }
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_reroute_gate)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
