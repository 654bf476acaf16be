// Logit processing and logprobs of one row (engine/logit_proc.h), against
// hand computations that follow engine/engine.h's formulas id by id, from
// the raw row, the request and the token history (never from the module's
// own history summary):
//  - random vocabularies, logits, histories and parameters: the processed
//    row equals the hand row bit for bit; the history summary equals a
//    brute-force count;
//  - order of operations on hand-picked numbers, and a negative control:
//    the hand computation done in another order disagrees on random rows;
//  - min_new: the stop token is -inf exactly while generated < min_new;
//  - zeroed parameters: nothing active, the row left bit-identical;
//  - logprobs: log-softmax against a long double reference, top ids by a
//    full sort (ties lower id first), with deliberate ties.
// The seed is fresh each run (printed; TPR_TEST_SEED reproduces it).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/logit_proc.h"
#include "logit_ref.h"
#include "test_util.h"

#define MAX_V 64
#define MAX_HIST 48

typedef struct request {
  tpr_gen_params g;  // g.logit_bias points at bias
  tpr_logit_bias bias[8];
} request;

typedef struct history {
  int32_t tok[MAX_HIST];  // prompt then generated
  int64_t len, prompt_len;
} history;

static int64_t count_in(const int32_t *t, int64_t n, int32_t v) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; i++) c += t[i] == v;
  return c;
}

// The module's view of a request at this point of its history, built as
// the engine builds it (the summaries from tpr_logit_tally).
typedef struct built {
  tpr_logit_proc p;
  int32_t seen[MAX_HIST], gen_ids[MAX_HIST], gen_counts[MAX_HIST];
} built;

static void build(built *b, const request *q, const history *h, int32_t *tally) {
  const tpr_gen_params *g = &q->g;
  const int64_t gen = h->len - h->prompt_len;
  b->p = (tpr_logit_proc){.bias = g->logit_bias, .n_bias = g->n_logit_bias,
                          .masked_stop = g->stop_token >= 0 && gen < g->min_new ? g->stop_token : -1,
                          .repetition_penalty = g->repetition_penalty, .frequency_penalty = g->frequency_penalty,
                          .presence_penalty = g->presence_penalty, .seen = b->seen, .gen_ids = b->gen_ids,
                          .gen_counts = b->gen_counts};
  b->p.n_seen = tpr_logit_tally(h->tok, h->len, tally, b->seen, NULL);
  b->p.n_gen = tpr_logit_tally(h->tok + h->prompt_len, gen, tally, b->gen_ids, b->gen_counts);
}

static void hand_row(const float *raw, int64_t V, const request *q, const history *h, const int order[4], float *out) {
  logit_ref_row(raw, V, &q->g, h->tok, h->prompt_len, h->len, order, out);
}

static void random_case(int64_t V, request *q, history *h, float *raw) {
  memset(q, 0, sizeof *q);
  tpr_gen_params *g = &q->g;
  g->logit_bias = q->bias;
  g->n_logit_bias = tt_randint(0, 8);
  for (int64_t i = 0; i < g->n_logit_bias; i++)
    q->bias[i] = (tpr_logit_bias){(int32_t)tt_randint(0, V - 1), (float)tt_uniform(-100, 100)};
  g->stop_token = tt_randint(0, 3) ? (int32_t)tt_randint(0, V - 1) : -1;
  h->prompt_len = tt_randint(1, MAX_HIST / 2);
  h->len = h->prompt_len + tt_randint(0, MAX_HIST / 2);
  g->min_new = tt_randint(0, h->len - h->prompt_len + 2);
  g->repetition_penalty = tt_randint(0, 3) ? tt_uniform(0.1, 3) : (double)tt_randint(0, 1);
  g->frequency_penalty = tt_randint(0, 3) ? tt_uniform(-2, 2) : 0;
  g->presence_penalty = tt_randint(0, 3) ? tt_uniform(-2, 2) : 0;
  // Few distinct ids, so repeats (counts > 1) are common.
  int64_t pool = tt_randint(1, V);
  for (int64_t i = 0; i < h->len; i++) h->tok[i] = (int32_t)tt_randint(0, pool - 1);
  for (int64_t v = 0; v < V; v++) raw[v] = (float)(4 * tt_normal());
}

static void test_random_rows(void **state) {
  (void)state;
  static int32_t tally[MAX_V];
  const int swapped[4] = {REF_REPETITION, REF_BIAS, REF_MIN_NEW, REF_FREQUENCY_PRESENCE};
  int64_t cases = 0, touched = 0, swapped_differs = 0;
  for (int run = 0; run < 2000; run++) {
    const int64_t V = tt_randint(2, MAX_V);
    request q;
    history h;
    float raw[MAX_V], got[MAX_V], want[MAX_V], other[MAX_V];
    random_case(V, &q, &h, raw);
    built b;
    build(&b, &q, &h, tally);
    for (int64_t v = 0; v < V; v++) assert_int_equal(tally[v], 0);  // left zeroed
    memcpy(got, raw, sizeof raw);
    tpr_logit_proc_apply(&b.p, got, V);
    hand_row(raw, V, &q, &h, logit_ref_order, want);
    hand_row(raw, V, &q, &h, swapped, other);
    for (int64_t v = 0; v < V; v++) {
      if (memcmp(&want[v], &got[v], sizeof want[v]) != 0)
        fail_msg("run %d id %lld: got %.9g want %.9g (raw %.9g)", run, (long long)v, got[v], want[v], raw[v]);
      touched += memcmp(&raw[v], &got[v], sizeof got[v]) != 0;
    }
    bool differs = memcmp(other, got, (size_t)V * sizeof *got) != 0;
    if (!tpr_logit_proc_active(&b.p)) assert_memory_equal(raw, got, (size_t)V * sizeof *raw);
    // The summaries against a brute-force count.
    for (int64_t i = 0; i < b.p.n_gen; i++)
      assert_int_equal(b.p.gen_counts[i], count_in(h.tok + h.prompt_len, h.len - h.prompt_len, b.p.gen_ids[i]));
    int64_t distinct = 0;
    for (int64_t v = 0; v < V; v++) distinct += count_in(h.tok, h.len, (int32_t)v) > 0;
    assert_int_equal(b.p.n_seen, distinct);
    swapped_differs += differs;
    cases++;
  }
  printf("random rows: %lld cases bit-identical to the hand computation (%lld logits changed); the hand "
         "computation in another order (repetition first) differs in %lld cases\n",
         (long long)cases, (long long)touched, (long long)swapped_differs);
  assert_true(touched > 0 && swapped_differs > cases / 4);
}

// Hand-picked numbers where each pair of steps would give another result in
// the other order.
static void test_order_by_hand(void **state) {
  (void)state;
  static int32_t tally[8];
  // ids: 0 bias then repetition; 1 repetition then frequency; 2 the stop
  // token, masked and penalised; 3 untouched; 4 positive, repetition only.
  float row[8] = {1.0f, -1.0f, 5.0f, 0.25f, 3.0f, 0, 0, 0};
  request q = {.bias = {{0, -2.0f}}};
  q.g = (tpr_gen_params){.logit_bias = q.bias, .n_logit_bias = 1, .min_new = 4, .stop_token = 2,
                         .repetition_penalty = 2.0, .frequency_penalty = 1.0, .presence_penalty = 0.5};
  history h = {.tok = {0, 4, 1, 1, 2}, .len = 5, .prompt_len = 2};  // generated: 1, 1, 2 (3 < min_new: stop masked)
  built b;
  build(&b, &q, &h, tally);
  tpr_logit_proc_apply(&b.p, row, (int64_t)(sizeof row / sizeof row[0]));
  // 0: (1 - 2) = -1, in the history: -1 * 2 = -2 (repetition first would give 0.5 - 2 = -1.5).
  assert_true(row[0] == -2.0f);
  // 1: -1 * 2 = -2, generated twice: -2 - (1*2 + 0.5) = -4.5 (the other order: (-1 - 2.5) * 2 = -7).
  assert_true(row[1] == -4.5f);
  assert_true(isinf(row[2]) && row[2] < 0);
  assert_true(row[3] == 0.25f);
  assert_true(row[4] == 1.5f);  // 3 / 2; in the prompt only: no frequency / presence
  // At 4 generated the stop token is no longer masked: 5 / 2 - (1 * 1 + 0.5) = 1.
  float row2[8] = {1.0f, -1.0f, 5.0f, 0.25f, 3.0f, 0, 0, 0};
  h.tok[5] = 3, h.len = 6;
  build(&b, &q, &h, tally);
  assert_int_equal(b.p.masked_stop, -1);
  tpr_logit_proc_apply(&b.p, row2, 8);
  assert_true(row2[2] == 1.0f);
  assert_true(row2[3] == 0.25f / 2 - 1.5f);
  printf("order by hand: [%g %g %g %g %g] then, unmasked, stop %g\n", row[0], row[1], row[2], row[3], row[4],
         row2[2]);
}

// min_new over a whole generation: masked at gen 0..min_new-1 only; no stop
// token: nothing masked.
static void test_min_new(void **state) {
  (void)state;
  static int32_t tally[16];
  history h = {.prompt_len = 3, .len = 3};
  for (int i = 0; i < 3; i++) h.tok[i] = i;
  request q = {.g = {.stop_token = 7, .min_new = 5}};
  for (int64_t gen = 0; gen < 8; gen++) {
    float row[16];
    for (int v = 0; v < 16; v++) row[v] = (float)v;
    built b;
    build(&b, &q, &h, tally);
    tpr_logit_proc_apply(&b.p, row, (int64_t)(sizeof row / sizeof row[0]));
    assert_int_equal(isinf(row[7]) != 0, gen < 5);
    assert_int_equal(tpr_logit_proc_active(&b.p), gen < 5);
    h.tok[h.len++] = 9;
  }
  q.g.stop_token = -1;
  built b;
  build(&b, &q, &h, tally);
  assert_false(tpr_logit_proc_active(&b.p));
}

// Zeroed parameters: nothing active, the row untouched bit for bit (with a
// history, NaN-free but with -0.0 and subnormals in it).
static void test_zeroed_params_identity(void **state) {
  (void)state;
  static int32_t tally[MAX_V];
  for (int run = 0; run < 200; run++) {
    request q;
    history h;
    float raw[MAX_V], got[MAX_V];
    random_case(MAX_V, &q, &h, raw);
    raw[0] = -0.0f, raw[1] = 1e-40f;
    memset(&q, 0, sizeof q);
    q.g.stop_token = (int32_t)tt_randint(-1, MAX_V - 1);  // min_new 0: never masked
    built b;
    build(&b, &q, &h, tally);
    assert_false(tpr_logit_proc_active(&b.p));
    memcpy(got, raw, sizeof raw);
    tpr_logit_proc_apply(&b.p, got, MAX_V);
    assert_memory_equal(got, raw, sizeof raw);
  }
}

static void test_logprobs(void **state) {
  (void)state;
  double worst = 0;
  for (int run = 0; run < 500; run++) {
    const int64_t V = tt_randint(1, 3000);
    float *x = malloc((size_t)V * sizeof *x);
    double *xd = malloc((size_t)V * sizeof *xd);
    int32_t *ids = malloc((size_t)V * sizeof *ids);
    for (int64_t v = 0; v < V; v++) x[v] = (float)(tt_uniform(1, 8) * tt_normal());
    for (int64_t t = 0; t < V / 4; t++) x[tt_randint(0, V - 1)] = x[tt_randint(0, V - 1)];  // ties
    for (int64_t v = 0; v < V; v++) xd[v] = x[v];
    long double m = x[0], s = 0;
    for (int64_t v = 0; v < V; v++) m = x[v] > m ? x[v] : m;
    for (int64_t v = 0; v < V; v++) s += expl((long double)x[v] - m);
    const long double lse = m + logl(s);
    const int32_t tok = (int32_t)tt_randint(0, V - 1), k = (int32_t)tt_randint(0, TPR_MAX_TOP_LOGPROBS);
    tpr_token_logprob rec;
    tpr_logprobs_of(x, V, tok, k, &rec);
    logit_ref_sorted_ids(xd, V, ids);
    assert_int_equal(rec.token, tok);
    assert_int_equal(rec.n_top, k < V ? k : V);
    double err = fabs((double)rec.logprob - (double)((long double)x[tok] - lse));
    for (int32_t i = 0; i < rec.n_top; i++) {
      assert_int_equal(rec.top_ids[i], ids[i]);
      err = fmax(err, fabs((double)rec.top_logprobs[i] - (double)((long double)x[ids[i]] - lse)));
    }
    // One f32 rounding of a value of magnitude up to ~60.
    if (err > 1e-5) fail_msg("run %d: logprob error %g", run, err);
    worst = fmax(worst, err);
    free(x), free(xd), free(ids);
  }
  printf("logprobs: 500 rows (vocab up to 3000, with ties), max error %.3g against long double; top ids as a full "
         "sort orders them\n", worst);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_rows),           cmocka_unit_test(test_order_by_hand),
      cmocka_unit_test(test_min_new),               cmocka_unit_test(test_zeroed_params_identity),
      cmocka_unit_test(test_logprobs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
