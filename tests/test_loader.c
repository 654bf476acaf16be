// The loader against slices computed here, independently, from the full
// tensors of a random checkpoint and the planner's head maps: for several
// head counts (sharded, replicated and MHA-converted KV heads, padded Q
// heads), meshes (tp, ep, etp, dp) and dtypes, every buffer of every rank.
// Negative control: rank 0's buffers checked as if they were another rank's
// must differ, so the comparison can fail.
#include "test_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_fixture.h"
#include "shard/loader.h"

static char root[] = "/tmp/tpr_test_loader_XXXXXX";

// Source element of each unit of an axis: -1 gives a zero.
static int64_t *heads_src(const int32_t *map, int64_t from, int64_t cnt, int64_t D) {
  int64_t *s = malloc((size_t)(cnt * D) * sizeof *s);
  for (int64_t j = 0; j < cnt * D; j++) s[j] = map[from + j / D] < 0 ? -1 : map[from + j / D] * D + j % D;
  return s;
}

// Block b of width w; entries at or past limit are padding.
static int64_t *block_src(int64_t b, int64_t w, int64_t limit) {
  int64_t *s = malloc((size_t)w * sizeof *s);
  for (int64_t j = 0; j < w; j++) s[j] = b * w + j < limit ? b * w + j : -1;
  return s;
}

// What mesh coordinate m should hold of checkpoint tensor t: rows (or 1-D
// elements) or columns picked by src, or the whole tensor when src is NULL.
static float *expected(const ck_model *mdl, const tpr_shard_plan *p, const tpr_mesh *m, const ck_tensor *t,
                       int64_t *numel) {
  const tpr_attn_plan *a = &p->attn;
  const char *n = t->name;
  int64_t D = mdl->s.D, R = t->shape[0], C = t->ndim == 2 ? t->shape[1] : 1, nsrc = 0;
  int64_t *src = NULL;
  bool cols = false, expert = strstr(n, ".experts.") != NULL;
  bool full_norm = !mdl->s.qwen3 && (strstr(n, "q_norm") || strstr(n, "k_norm"));
  if (strstr(n, "q_proj")) src = heads_src(a->q_head_map, m->tp_rank * a->q_per_rank, nsrc = a->q_per_rank, D);
  else if (strstr(n, "k_proj") || strstr(n, "v_proj"))
    src = heads_src(a->kv_head_map, m->tp_rank * a->kv_per_rank, nsrc = a->kv_per_rank, D);
  else if (strstr(n, "o_proj"))
    src = heads_src(a->q_head_map, m->tp_rank * a->q_per_rank, nsrc = a->q_per_rank, D), cols = true;
  else if (full_norm && strstr(n, "q_norm")) src = heads_src(a->q_head_map, 0, nsrc = a->nq_padded, D);
  else if (full_norm) src = heads_src(a->kv_head_map, 0, nsrc = a->nkv_eff, D);
  else if (strstr(n, "embed_tokens") || strstr(n, "lm_head")) {
    int64_t Vr = (mdl->s.V + p->tp - 1) / p->tp;
    src = block_src(m->tp_rank, Vr, mdl->s.V), nsrc = Vr, D = 1;  // rows past V are zeros
  } else if (expert && (strstr(n, "w2") || strstr(n, "down_proj")))
    src = block_src(m->etp_rank, nsrc = mdl->s.I / p->etp, INT64_MAX), cols = true, D = 1;
  else if (expert) src = block_src(m->etp_rank, nsrc = mdl->s.I / p->etp, INT64_MAX), D = 1;
  else if (strstr(n, "mlp.down_proj")) src = block_src(m->tp_rank, nsrc = mdl->s.F / p->tp, INT64_MAX), cols = true, D = 1;
  else if (strstr(n, "mlp.gate_proj") || strstr(n, "mlp.up_proj"))
    src = block_src(m->tp_rank, nsrc = mdl->s.F / p->tp, INT64_MAX), D = 1;
  int64_t units = src ? nsrc * D : 0, orows = src && !cols ? units : R, ocols = cols ? units : C;
  float *out = malloc((size_t)(orows * ocols) * sizeof *out);
  for (int64_t r = 0; r < orows; r++)
    for (int64_t c = 0; c < ocols; c++) {
      int64_t sr = src && !cols ? src[r] : r, sc = cols ? src[c] : c;
      out[r * ocols + c] = sr < 0 || sc < 0 ? 0.0f : t->values[sr * C + sc];
    }
  free(src);
  *numel = orows * ocols;
  return out;
}

// The plan kind of a checkpoint name: layer and expert numbers -> {L}, {E}.
static int kind_of(const tpr_shard_plan *p, const char *name, int64_t *layer, int64_t *expert) {
  char pat[160];
  size_t k = 0;
  *layer = *expert = -1;
  for (const char *s = name; *s && k < sizeof pat - 4;) {
    bool l = !strncmp(s, "layers.", 7), e = !strncmp(s, "experts.", 8);
    if (l || e) {
      size_t w = l ? 7 : 8;
      memcpy(pat + k, s, w), k += w, s += w;
      *(l ? layer : expert) = strtoll(s, (char **)&s, 10);
      memcpy(pat + k, l ? "{L}" : "{E}", 3), k += 3;
    } else {
      pat[k++] = *s++;
    }
  }
  pat[k] = 0;
  for (int i = 0; i < p->n_tensors; i++)
    if (!strcmp(p->tensors[i].name, pat)) return i;
  fail_msg("no plan kind '%s' for checkpoint tensor %s", pat, name);
  return -1;
}

// Checks every buffer the loader gives against what mesh coordinate m should
// hold; returns how many differ. dt may be TPR_LOAD_SOURCE_DTYPE.
static int check_rank(tpr_loader *ld, const tpr_shard_plan *p, const ck_model *mdl, const tpr_mesh *m, tpr_dtype dt) {
  int bad = 0;
  int64_t held = 0, epr = mdl->s.E / p->ep;
  for (int i = 0; i < mdl->n; i++) {
    const ck_tensor *t = &mdl->t[i];
    int64_t layer, expert, numel;
    int kind = kind_of(p, t->name, &layer, &expert);
    if (expert >= 0 && expert / epr != m->ep_rank) continue;  // another expert block
    const tpr_load_item *it;
    TT_OK(tpr_loader_find(ld, kind, layer, expert < 0 ? -1 : expert % epr, &it));
    held++;
    float *want = expected(mdl, p, m, t, &numel);
    assert_int_equal(numel, it->numel);
    tpr_dtype got_dt = dt == TPR_LOAD_SOURCE_DTYPE ? tpr_loader_item_dtype(ld, it) : dt;
    if (dt == TPR_LOAD_SOURCE_DTYPE) assert_int_equal(got_dt, t->dtype == TPR_F8E4M3 ? TPR_BF16 : t->dtype);
    size_t esz = tpr_dtype_size(got_dt);
    uint8_t *got = malloc((size_t)numel * esz + 1), *ref = malloc((size_t)numel * esz + 1);
    TT_OK(tpr_loader_read(ld, it, dt, got, NULL));
    tpr_dtype_convert(want, TPR_F32, ref, got_dt, (size_t)numel);  // one rounding, as the loader does
    bad += memcmp(got, ref, (size_t)numel * esz) != 0;
    free(got), free(ref), free(want);
  }
  assert_int_equal(held, tpr_loader_count(ld));
  return bad;
}

typedef struct mesh_case {
  int tp, ep, etp, dp;
  const char *strategy;
} mesh_case;

static void run_cases(const char *name, const ck_spec *s, const mesh_case *cases, int n) {
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/%s", root, name);
  assert_int_equal(mkdir(dir, 0755), 0);
  ck_model mdl;
  ck_write(dir, s, &mdl);
  tpr_model_config c;
  TT_OK(tpr_model_config_load(dir, &c));
  for (int i = 0; i < n; i++) {
    const mesh_case *k = &cases[i];
    tpr_shard_plan p;
    TT_OK(tpr_shard_plan_build(&c, k->tp, k->ep, k->etp, k->dp, TPR_BF16, &p));
    assert_string_equal(tpr_kv_strategy_name(p.attn.strategy), k->strategy);
    tpr_loader *first = NULL;
    for (int r = 0; r < p.world; r++) {
      tpr_loader *ld;
      tpr_mesh m;
      TT_OK(tpr_loader_open(dir, &p, r, &ld));
      TT_OK(tpr_mesh_init(p.world, r, p.tp, p.ep, p.etp, &m));
      assert_false(tpr_loader_converted(ld));
      int bad = check_rank(ld, &p, &mdl, &m, TPR_F32) + check_rank(ld, &p, &mdl, &m, TPR_LOAD_SOURCE_DTYPE);
      if (r == 1 || r == p.world - 1) bad += check_rank(ld, &p, &mdl, &m, TPR_BF16);
      if (bad) fail_msg("%s tp=%d ep=%d etp=%d dp=%d rank %d: %d buffers differ", name, k->tp, k->ep, k->etp, k->dp, r, bad);
      // The whole-rank load: same bytes, the plan's byte counts.
      tpr_rank_weights w;
      uint64_t held, pad;
      TT_OK(tpr_loader_load_all(ld, TPR_LOAD_SOURCE_DTYPE, &w));
      TT_OK(tpr_shard_plan_rank_bytes(&p, r, &held, &pad));
      assert_int_equal(w.n, tpr_loader_count(ld));
      if (!s->fp8_rows) assert_true(w.bytes_read == w.bytes_held - pad);  // every non-padding byte read once
      if (!s->qwen3) assert_true(w.bytes_held == held + 2 * (uint64_t)(s->E * s->L));  // the f32 routing bias
      for (int64_t j = 0; j < w.n; j++) {
        size_t nb = (size_t)(w.offset[j + 1] - w.offset[j]);
        uint8_t *one = calloc(nb + 1, 1);
        TT_OK(tpr_loader_read(ld, &w.items[j], w.dtype[j], one, NULL));
        assert_memory_equal(one, tpr_rank_weights_data(&w, j), (size_t)w.items[j].numel * tpr_dtype_size(w.dtype[j]));
        free(one);
      }
      tpr_rank_weights_free(&w);
      // Negative control: a loader ignoring the rank (rank 0's buffers) fails the check for another mesh position.
      if (r == 0) first = ld;
      else {
        if (check_rank(first, &p, &mdl, &m, TPR_F32) == 0)
          fail_msg("%s tp=%d: rank 0's buffers pass as rank %d's: the check cannot fail", name, k->tp, r);
        tpr_loader_close(ld);
      }
    }
    tpr_loader_close(first);
    tpr_shard_plan_free(&p);
  }
  ck_free(&mdl);
  ck_rmdir(dir);
}

static void test_gqa_6_2(void **state) {  // nq 6, nkv 2: every strategy and mesh shape
  static const mesh_case cases[] = {
      {1, 1, 1, 1, "shard"},        {2, 1, 1, 1, "shard"},        {3, 1, 1, 1, "convert_to_mha"},
      {4, 2, 2, 1, "replicate_kv"}, {6, 1, 1, 1, "replicate_kv"}, {2, 2, 1, 1, "shard"},
      {4, 4, 1, 1, "replicate_kv"}, {2, 2, 2, 2, "shard"},        {1, 2, 1, 2, "shard"},
  };
  ck_spec s = ck_default_spec();
  run_cases("gqa_6_2", &s, cases, sizeof cases / sizeof cases[0]);
}

static void test_gqa_12_4(void **state) {  // interleaved Q padding (12 -> 16 at tp 8) and MHA at tp 6
  static const mesh_case cases[] = {{8, 2, 1, 1, "replicate_kv"}, {6, 2, 1, 1, "convert_to_mha"}, {4, 1, 1, 1, "shard"}};
  ck_spec s = ck_default_spec();
  s.nq = 12, s.nkv = 4, s.D = 4;
  run_cases("gqa_12_4", &s, cases, sizeof cases / sizeof cases[0]);
}

static void test_mha_and_mqa(void **state) {
  static const mesh_case mha[] = {{4, 1, 1, 1, "shard"}, {3, 1, 1, 1, "convert_to_mha"}};
  ck_spec s = ck_default_spec();
  s.nq = s.nkv = 4;
  run_cases("mha_4", &s, mha, 2);
  static const mesh_case mqa[] = {{4, 1, 1, 1, "replicate_kv"}, {2, 2, 1, 1, "replicate_kv"}};
  s.nq = 8, s.nkv = 1, s.D = 4;
  run_cases("mqa_8_1", &s, mqa, 2);
}

static void test_qwen3_dense_layer(void **state) {  // column/row dense MLP in layer 0, per-head QK-norm
  static const mesh_case cases[] = {{2, 2, 1, 1, "shard"}, {4, 2, 2, 1, "replicate_kv"}};
  ck_spec s = ck_default_spec();
  s.qwen3 = true, s.nq = 4, s.L = 3;
  run_cases("qwen3", &s, cases, 2);
}

static void test_fp8_block_scales(void **state) {  // slices cut through 5 x 3 scale blocks
  static const mesh_case cases[] = {{2, 2, 1, 1, "shard"}, {4, 2, 2, 1, "replicate_kv"}, {3, 1, 1, 1, "convert_to_mha"}};
  ck_spec s = ck_default_spec();
  s.fp8_rows = 5, s.fp8_cols = 3;
  run_cases("fp8", &s, cases, 3);
}

static void expect_error(tpr_status rc, tpr_status want, const char *a, const char *b) {
  if (rc != want) fail_msg("got %s, want %s: %s", tpr_status_name(rc), tpr_status_name(want), tpr_last_error());
  if (a && !strstr(tpr_last_error(), a)) fail_msg("'%s' not in: %s", a, tpr_last_error());
  if (b && !strstr(tpr_last_error(), b)) fail_msg("'%s' not in: %s", b, tpr_last_error());
}

static void test_bad_checkpoints(void **state) {
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/bad", root);
  assert_int_equal(mkdir(dir, 0755), 0);
  ck_spec s = ck_default_spec();
  ck_model mdl;
  ck_write(dir, &s, &mdl);
  tpr_model_config c;
  tpr_shard_plan p;
  TT_OK(tpr_model_config_load(dir, &c));
  TT_OK(tpr_shard_plan_build(&c, 2, 1, 1, 1, TPR_BF16, &p));
  tpr_loader *ld = NULL;
  expect_error(tpr_loader_open(dir, &p, 2, &ld), TPR_ERR_INVALID_ARG, "rank 2", NULL);
  expect_error(tpr_loader_open("/nonexistent/ckpt", &p, 0, &ld), TPR_ERR_IO, "/nonexistent/ckpt", NULL);
  assert_null(ld);
  // A missing tensor and one of the wrong shape: errors name the tensor and where it was looked for.
  const char *gone = "model.layers.1.self_attn.k_proj.weight", *wide = "model.layers.0.block_sparse_moe.experts.3.w2.weight";
  ck_rewrite(dir, &mdl, gone, wide);
  TT_OK(tpr_loader_open(dir, &p, 1, &ld));
  tpr_rank_weights w;
  expect_error(tpr_loader_load_all(ld, TPR_F32, &w), TPR_ERR_FORMAT, gone, dir);
  assert_null(w.arena);
  const tpr_load_item *it = NULL;
  for (int k = 0; k < p.n_tensors; k++)
    if (strstr(p.tensors[k].name, "w2")) TT_OK(tpr_loader_find(ld, k, 0, 3, &it));
  assert_non_null(it);
  float *buf = malloc((size_t)it->numel * sizeof *buf);
  expect_error(tpr_loader_read(ld, it, TPR_F32, buf, NULL), TPR_ERR_FORMAT, wide, "model-0000");
  expect_error(tpr_loader_find(ld, 0, 5, -1, &it), TPR_ERR_INVALID_ARG, "layer 5", NULL);
  free(buf);
  tpr_loader_close(ld);
  tpr_shard_plan_free(&p);
  ck_free(&mdl);
  ck_rmdir(dir);
}

int main(void) {
  tt_seed_from_env();
  if (!mkdtemp(root)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gqa_6_2),
      cmocka_unit_test(test_gqa_12_4),
      cmocka_unit_test(test_mha_and_mqa),
      cmocka_unit_test(test_qwen3_dense_layer),
      cmocka_unit_test(test_fp8_block_scales),
      cmocka_unit_test(test_bad_checkpoints),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  ck_rmdir(root);
  return rc;
}
