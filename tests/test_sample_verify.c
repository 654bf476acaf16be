// The speculative sampling rule for a deterministic draft
// (models/sampling.h tpr_sample_verify), on small vocabularies, by a
// chi-square test of 40,000 draws per case against the distribution
// tpr_sample draws from (softmax at the temperature, top-k, top-p), for
// drafts of every kind: the most likely token, a middling one, one that
// top-k or top-p leaves out (never accepted), one that is the only token
// kept (always accepted). Negative controls that must fail the same test:
// accepting every draft, and the classic bug of redrawing a rejected draft
// from p itself instead of p without the draft. Greedy: accepted exactly
// when the draft is the argmax. Fresh random logits each run (the seed is
// printed; TPR_TEST_SEED reproduces it).
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/sampling.h"

#define V 12
#define DRAWS 40000

typedef enum { RULE, ACCEPT_ALL, REDRAW_FROM_P } variant;

// The distribution tpr_sample draws from, computed here in double from its
// definition (models/sampling.h): descending logit (ties: lower id), top-k,
// softmax at the temperature, the smallest prefix of mass >= top_p.
static void target(const float *logits, const tpr_sampling *s, double *p) {
  int ids[V];
  for (int i = 0; i < V; i++) ids[i] = i;
  for (int i = 1; i < V; i++)
    for (int j = i; j > 0 && (logits[ids[j]] > logits[ids[j - 1]] ||
                              (logits[ids[j]] == logits[ids[j - 1]] && ids[j] < ids[j - 1]));
         j--) {
      int t = ids[j];
      ids[j] = ids[j - 1], ids[j - 1] = t;
    }
  int n = s->top_k > 0 && s->top_k < V ? (int)s->top_k : V;
  double q[V], z = 0, mass = 0;
  for (int i = 0; i < n; i++) z += q[i] = exp(((double)logits[ids[i]] - logits[ids[0]]) / s->temperature);
  int keep = n;
  for (int i = 0; i < n; i++) {
    mass += q[i] / z;
    if (mass >= s->top_p) {
      keep = i + 1;
      break;
    }
  }
  double total = 0;
  for (int i = 0; i < keep; i++) total += q[i];
  memset(p, 0, V * sizeof *p);
  for (int i = 0; i < keep; i++) p[ids[i]] = q[i] / total;
}

static int64_t draw(const float *logits, const tpr_sampling *s, tpr_rng *rng, void *scratch, int64_t draft,
                    variant v) {
  bool accepted;
  if (v == ACCEPT_ALL) return draft;
  int64_t t = tpr_sample_verify(logits, V, s, rng, scratch, draft, &accepted);
  if (v == REDRAW_FROM_P && !accepted) return tpr_sample(logits, V, s, rng, scratch);
  return t;
}

// The chi-square statistic over tokens of expected count >= 5 (the rest
// pooled) as a multiple of its p = 1e-4 critical value (Wilson-Hilferty);
// INFINITY when a token of probability 0 was drawn.
static double chi_square_ratio(const int64_t *count, const double *p, int64_t n) {
  double stat = 0, pooled_o = 0, pooled_e = 0;
  int bins = 0;
  for (int v = 0; v < V; v++) {
    double e = (double)n * p[v], o = (double)count[v];
    if (p[v] == 0) {
      if (count[v] > 0) return INFINITY;
      continue;
    }
    if (e < 5) {
      pooled_o += o, pooled_e += e;
      continue;
    }
    stat += (o - e) * (o - e) / e, bins++;
  }
  if (pooled_e > 0) stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, bins++;
  const double df = bins - 1, z = 3.719, a = 2.0 / (9.0 * df);
  return df > 0 ? stat / (df * pow(1 - a + z * sqrt(a), 3)) : (stat > 0 ? INFINITY : 0);
}

static double run_case(const float *logits, const tpr_sampling *s, int64_t draft, variant v, double *accept_rate) {
  static char scratch[TPR_SAMPLE_SCRATCH_BYTES(V)];
  double p[V];
  int64_t count[V] = {0}, accepted = 0;
  target(logits, s, p);
  tpr_rng rng = {tt_next_u64() ^ (uint64_t)draft * 0x9e3779b97f4a7c15ull ^ (uint64_t)v};
  for (int64_t i = 0; i < DRAWS; i++) {
    int64_t t = draw(logits, s, &rng, scratch, draft, v);
    count[t]++;
    accepted += t == draft;
  }
  *accept_rate = (double)accepted / DRAWS;
  return chi_square_ratio(count, p, DRAWS);
}

static void test_rule_keeps_the_distribution(void **state) {
  (void)state;
  float logits[V];
  for (int v = 0; v < V; v++) logits[v] = (float)tt_uniform(-2, 2);
  const tpr_sampling samplers[] = {{.temperature = 1, .top_k = 0, .top_p = 1},
                                   {.temperature = 0.7, .top_k = 6, .top_p = 1},
                                   {.temperature = 1.3, .top_k = 0, .top_p = 0.8}};
  for (size_t si = 0; si < sizeof samplers / sizeof *samplers; si++) {
    const tpr_sampling *s = &samplers[si];
    double p[V];
    target(logits, s, p);
    int best = 0, mid = -1, left_out = -1;
    for (int v = 0; v < V; v++) best = p[v] > p[best] ? v : best;
    for (int v = 0; v < V; v++) {
      if (v != best && p[v] > 0.02 && mid < 0) mid = v;
      if (p[v] == 0 && left_out < 0) left_out = v;
    }
    const int64_t drafts[3] = {best, mid >= 0 ? mid : (best + 1) % V, left_out};
    for (int d = 0; d < 3; d++) {
      if (drafts[d] < 0) continue;  // nothing left out at this setting
      double acc, ok = run_case(logits, s, drafts[d], RULE, &acc);
      double acc_all, all = run_case(logits, s, drafts[d], ACCEPT_ALL, &acc_all);
      double acc_p, from_p = run_case(logits, s, drafts[d], REDRAW_FROM_P, &acc_p);
      printf("# T %.1f top-k %lld top-p %.1f, draft %lld (p %.3f): accepted %.3f, chi-square %.3f of critical; "
             "controls: accept-all %.3g, redraw from p %.3g\n",
             s->temperature, (long long)s->top_k, s->top_p, (long long)drafts[d], p[drafts[d]], acc, ok, all, from_p);
      assert_true(ok < 1);
      assert_true(fabs(acc - p[drafts[d]]) < 0.02);  // the draft is drawn with its own probability
      assert_true(all > 1);
      if (p[drafts[d]] > 0.02 && p[drafts[d]] < 0.98) assert_true(from_p > 1);  // the bug shows when d can go either way
    }
  }
}

// Only one token kept (top-k 1 behaves as greedy; top-p small keeps one):
// a draft of it is always accepted, any other never.
static void test_greedy_and_single_token(void **state) {
  (void)state;
  static char scratch[TPR_SAMPLE_SCRATCH_BYTES(V)];
  float logits[V];
  for (int v = 0; v < V; v++) logits[v] = (float)tt_uniform(-2, 2);
  int best = 0;
  for (int v = 0; v < V; v++) best = logits[v] > logits[best] ? v : best;
  const tpr_sampling greedy = {.temperature = 0, .top_p = 1}, narrow = {.temperature = 1, .top_p = 1e-9};
  tpr_rng rng = {tt_next_u64()};
  for (int64_t d = 0; d < V; d++) {
    bool a;
    assert_int_equal(tpr_sample_verify(logits, V, &greedy, &rng, scratch, d, &a), best);
    assert_int_equal(a, d == best);
    for (int i = 0; i < 50; i++) {
      assert_int_equal(tpr_sample_verify(logits, V, &narrow, &rng, scratch, d, &a), best);
      assert_int_equal(a, d == best);
    }
  }
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_rule_keeps_the_distribution),
                                     cmocka_unit_test(test_greedy_and_single_token)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
