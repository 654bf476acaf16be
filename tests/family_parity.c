#include "family_parity.h"

#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "m2_ref.h"
#include "mpi_util.h"
#include "runtime/ops/rope/rope.h"

fp_mesh fp;

void fp_init(int *argc, char ***argv) {
  fp = tt_mesh_init(argc, argv);
  if (fp.R == 0) tt_seed_from_env();
}


int64_t fp_shared_seed(void) { return tt_shared_seed(fp.world); }

tpr_session_opts fp_session_opts(const char *dir, int64_t max_seq) {
  return (tpr_session_opts){.model_dir = dir, .max_seq = max_seq, .max_batch = 1, .tp = fp.tp, .dp = fp.dp,
                            .ep = fp.ep, .force_tp_rank = -1};
}

tpr_session *fp_open(const tpr_session_opts *o, tpr_comm_t comm) {
  tpr_session *s = NULL;
  TT_OK(tpr_session_open(o, comm ? comm : fp.world, tt_cpu(), &s));
  return s;
}

void fp_read_ids(const tpr_st_set *set, const char *name, int64_t rows, int64_t cols, int32_t *ids) {
  int64_t n = rows * (cols ? cols : 1);
  float *f = malloc((size_t)n * sizeof *f);
  m2_read_f32(set, name, rows, cols, f);
  for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)f[i];
  free(f);
}

int fp_argmax(const float *row, int64_t V) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (row[v] > row[best]) best = v;
  return best;
}

double fp_decode(tpr_session *s, const int32_t *prompt, int64_t T, int64_t P, const int32_t *pos3,
                 const int32_t *greedy, const float *greedy_logits, int64_t ng, int64_t V, int32_t *seq, float *rows) {
  float *step = malloc((size_t)(T * V) * sizeof *step);
  int32_t *p3 = pos3 ? malloc((size_t)(3 * P) * sizeof *p3) : NULL, one[3];
  memcpy(seq, prompt, (size_t)T * sizeof *seq);
  if (pos3) {  // (3, P): each axis's first P positions
    for (int a = 0; a < 3; a++) memcpy(p3 + a * P, pos3 + a * T, (size_t)P * sizeof *p3);
    TT_OK(tpr_session_forward_3d(s, seq, P, 0, p3, step));
  } else {
    TT_OK(tpr_session_forward(s, seq, P, 0, step));
  }
  // Past the prompt, every axis continues at max(pos3) + 1 + j (rope_deltas).
  const int64_t next = pos3 ? tpr_mrope_next_position(pos3, T) : 0;
  double worst = 0;
  for (int64_t t = P; t < T + ng - 1; t++) {  // decode token t, whose row predicts token t+1
    if (pos3) {
      for (int a = 0; a < 3; a++) one[a] = t < T ? pos3[a * T + t] : (int32_t)(next + t - T);
      TT_OK(tpr_session_forward_3d(s, &seq[t], 1, t, one, step));
    } else {
      TT_OK(tpr_session_forward(s, &seq[t], 1, t, step));
    }
    if (t >= T - 1) {
      int g = (int)(t - (T - 1));
      seq[t + 1] = fp_argmax(step, V);
      worst = fmax(worst, m2_rel_err(step, greedy_logits + g * V, V));
      if (seq[t + 1] != greedy[g]) fail_msg("greedy token %d is %d, transformers' %d", g, seq[t + 1], greedy[g]);
    }
    if (rows) memcpy(rows + t * V, step, (size_t)V * sizeof *step);
  }
  free(step), free(p3);
  return worst;
}

void fp_load_ref(const char *dir, int64_t V, int64_t ta, int64_t tb, int64_t ng, fp_ref *r) {
  *r = (fp_ref){.V = V, .ta = ta, .tb = tb, .ng = ng};
  r->a = malloc((size_t)ta * sizeof *r->a), r->b = malloc((size_t)tb * sizeof *r->b);
  r->greedy = malloc((size_t)ng * sizeof *r->greedy);
  r->logits_a = malloc((size_t)(ta * V) * sizeof(float)), r->logits_b = malloc((size_t)(tb * V) * sizeof(float));
  r->greedy_logits = malloc((size_t)(ng * V) * sizeof(float));
  char path[512];
  snprintf(path, sizeof path, "%s/reference.safetensors", dir);
  tpr_st_set *set;
  TT_OK(tpr_st_open(path, &set));
  fp_read_ids(set, "tokens_a", ta, 0, r->a);
  fp_read_ids(set, "tokens_b", tb, 0, r->b);
  fp_read_ids(set, "greedy_a", ng, 0, r->greedy);
  m2_read_f32(set, "logits_a", ta, V, r->logits_a);
  m2_read_f32(set, "logits_b", tb, V, r->logits_b);
  m2_read_f32(set, "greedy_logits_a", ng, V, r->greedy_logits);
  tpr_st_close(set);
}

void fp_free_ref(fp_ref *r) {
  free(r->a), free(r->b), free(r->greedy), free(r->logits_a), free(r->logits_b), free(r->greedy_logits);
  *r = (fp_ref){0};
}

double fp_parity(tpr_session *s, const fp_ref *r) {
  float *la = malloc((size_t)(r->ta * r->V) * sizeof *la), *lb = malloc((size_t)(r->tb * r->V) * sizeof *lb);
  TT_OK(tpr_session_forward(s, r->a, r->ta, 0, la));
  TT_OK(tpr_session_forward(s, r->b, r->tb, 0, lb));
  double ea = m2_rel_err(la, r->logits_a, r->ta * r->V), eb = m2_rel_err(lb, r->logits_b, r->tb * r->V);
  free(la), free(lb);
  if (fp.R == 0) printf("  prompt a %.3g, prompt b %.3g\n", ea, eb);
  return fmax(ea, eb);
}

void fp_test_parity(const tpr_session_opts *o, const fp_ref *r, double bound) {
  tpr_session *s = fp_open(o, NULL);
  if (fp.R == 0) printf("parity tp %d dp %d ep %d (max|d|/max|ref|, bound %.0e):\n", fp.tp, fp.dp, fp.ep, bound);
  double e = fp_parity(s, r);
  tpr_session_close(s);
  if (!(e <= bound)) fail_msg("logits differ from transformers' by %.3g of max |logit| (bound %.0e)", e, bound);
}

void fp_test_control(const tpr_session_opts *o, const fp_ref *r, double bound, const char *what) {
  tpr_session *s = fp_open(o, NULL);
  double e = fp_parity(s, r);
  tpr_session_close(s);
  if (!(e > bound)) fail_msg("%s passed the parity bound (%.3g <= %.0e)", what, e, bound);
}

void fp_test_greedy_cached(const tpr_session_opts *o, const fp_ref *r, double bound, double kv_bound) {
  const int64_t TA = r->ta, NG = r->ng, V = r->V, n = TA + NG;
  int64_t seed = fp_shared_seed();
  int64_t P = 1 + (int64_t)((uint64_t)seed % (uint64_t)(TA - 1));  // prefill length in [1, TA-1]
  int32_t *seq = malloc((size_t)n * sizeof *seq);
  float *full = calloc((size_t)(n * V), sizeof *full), *whole = malloc((size_t)(n * V) * sizeof *whole);
  tpr_session *s = fp_open(o, NULL);
  double vs_ref = fp_decode(s, r->a, TA, P, NULL, r->greedy, r->greedy_logits, NG, V, seq, full), kv = 0;
  // The last greedy token's row was never needed; one full forward over the
  // whole sequence checks every decoded row.
  TT_OK(tpr_session_forward(s, seq, n - 1, 0, whole));
  for (int64_t row = P; row < n - 1; row++) kv = fmax(kv, m2_rel_err(full + row * V, whole + row * V, V));
  tpr_session_close(s);
  free(seq), free(full), free(whole);
  if (fp.R == 0)
    printf("greedy (prefill %lld of %lld, seed %lld): tokens equal; decoded rows vs transformers %.3g (bound %.0e), "
           "vs one full forward %.3g (bound %.0e)\n", (long long)P, (long long)TA, (long long)seed, vs_ref, bound, kv,
           kv_bound);
  if (!(vs_ref <= bound)) fail_msg("decoded logits differ from transformers' by %.3g", vs_ref);
  if (!(kv <= kv_bound)) fail_msg("cached decode differs from a full forward by %.3g", kv);
}

int fp_run(const struct CMUnitTest *tests, size_t n, fp_ref *ref) {
  int failed = _cmocka_run_group_tests("tests", tests, n, NULL, NULL);
  if (ref) fp_free_ref(ref);
  return tt_mpi_finish(fp.world, failed);
}

typedef struct engine_check {
  const float *want;  // (ngt, V)
  int64_t ngt, V;
  double worst;
} engine_check;

static void engine_logits(void *ctx, int64_t seq, int64_t gen, const float *logits, int64_t vocab) {
  engine_check *c = ctx;
  (void)seq, (void)vocab;
  if (gen < c->ngt) c->worst = fmax(c->worst, m2_rel_err(logits, c->want + gen * c->V, (size_t)c->V));
}

void fp_test_engine_text(const char *dir, const int32_t *text, int64_t tt, const int32_t *want_tokens,
                         const float *want_logits, int64_t ngt, int64_t V, double bound) {
  tpr_session_opts so = fp_session_opts(dir, tt + ngt);
  so.max_batch = 2;
  tpr_session *s = fp_open(&so, NULL);
  engine_check c = {.want = want_logits, .ngt = ngt, .V = V};
  tpr_engine_opts eo = {.on_logits = engine_logits, .ctx = &c};
  tpr_engine *e = NULL;
  TT_OK(tpr_engine_new(s, &eo, &e));
  int64_t ids[2] = {-1, -1};
  tpr_gen_params g = {.max_new = ngt, .stop_token = -1, .sampling = {.top_p = 1}};
  tpr_status sub = TPR_OK;  // checked after the steps, so no rank is left stepping alone
  for (int i = 0; fp.R == 0 && sub == TPR_OK && i < 2; i++) sub = tpr_engine_submit(e, text, tt, &g, &ids[i]);
  for (int guard = 0; guard < 64; guard++) {
    tpr_engine_step_info info;
    TT_OK(tpr_engine_step(e, &info));
    if (info.idle) break;
  }
  if (sub != TPR_OK) fail_msg("submit: %s", tpr_last_error());
  for (int i = 0; fp.R == 0 && i < 2; i++) {
    tpr_sched_seq_info r;
    TT_OK(tpr_engine_result(e, ids[i], &r));
    assert_int_equal(r.len, tt + ngt);
    for (int64_t j = 0; j < ngt; j++)
      if (r.tokens[tt + j] != want_tokens[j])
        fail_msg("sequence %d: generated token %lld is %d, transformers' generate %d", i, (long long)j,
                 r.tokens[tt + j], want_tokens[j]);
  }
  tpr_engine_free(e);
  tpr_session_close(s);
  float w = (float)c.worst;
  TT_OK(tpr_comm_all_reduce(fp.world, &w, &w, 1, TPR_F32, TPR_MAX));
  if (fp.R == 0)
    printf("engine, text prompt x2 (tpr run's path): %lld greedy tokens equal transformers' generate, logits %.3g "
           "(bound %.0e)\n", (long long)ngt, w, bound);
  if (!(w <= bound)) fail_msg("engine logits differ from transformers' generate by %.3g", w);
}
