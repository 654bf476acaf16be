// The rope op's variants (runtime/ops/rope/rope.h): MRoPE positions (3, T)
// laid out SECTIONED (Qwen2-VL) or INTERLEAVED (Qwen3-VL), each with NeoX
// "half" and GPT-J "interleave" pairing, against a double-precision
// reference written the way transformers writes it (cos/sin tables of the
// whole rotary dim recomposed per axis, then x*cos + rotate(x)*sin), with
// fresh random positions that differ per axis. Controls: the other layout,
// the other pairing and plain 1-D RoPE must each miss the reference; equal
// axes must give plain RoPE bit for bit; rope_bwd of the variants inverts
// the forward and matches finite differences; bad attributes are refused.
// Also: the qwen3_vl_moe config keys, and `tpr forward --positions-3d` on
// the fixture (logits equal transformers'; a file of the wrong shape refused).
#include "cli_util.h"
#include "grad_check.h"
#include "m2_ref.h"
#include "ops_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/ops/rope/rope.h"
#include "shard/model_config.h"

#define REF_BOUND 1e-5   // f32 kernel vs double rotation of the same f32 angles, relative to max |x|
#define MISS_BOUND 1e-2  // a wrong layout/pairing must be at least this far off

// Reference: transformers' recipe. freqs[a][t][k] = f32(pos[a][t] * inv[k])
// (f32 product as torch computes it); the (rd) cos/sin table of token t is
// recomposed per layout exactly as modeling_qwen2_vl.py (split of the doubled
// table by mrope_section*2, chunk i from axis i % 3) or
// modeling_qwen3_vl_moe.py (T table, H written at slice(1, 3h, 3), W at
// slice(2, 3w, 3), then doubled) do; then pairing.
static void reference(const float *x, const int32_t *pos, int64_t T, int64_t NH, int64_t D, const tpr_rope_opts *o,
                      double *out) {
  int64_t rd = o->rotary_dim, half = rd / 2;
  double *cs = malloc((size_t)rd * sizeof *cs), *sn = malloc((size_t)rd * sizeof *sn);
  float *f3 = malloc(3 * (size_t)half * sizeof *f3), *ft = malloc((size_t)half * sizeof *ft);
  for (int64_t t = 0; t < T; t++) {
    for (int a = 0; a < 3; a++)
      for (int64_t k = 0; k < half; k++) {
        float inv = 1.0f / powf(o->theta, (float)(2 * k) / (float)rd);
        int32_t p = o->layout == TPR_MROPE_NONE ? pos[t] : pos[a * T + t];
        f3[a * half + k] = (float)p * inv;
      }
    double emb[1024];  // cat(freqs, freqs) after recomposition, rd entries
    if (o->layout == TPR_MROPE_SECTIONED) {
      int64_t at = 0;
      for (int i = 0; i < 6; i++)  // chunks of the doubled table: sections t,h,w,t,h,w
        for (int64_t j = 0; j < o->section[i % 3]; j++, at++) emb[at] = f3[(i % 3) * half + at % half];
    } else {
      memcpy(ft, f3, (size_t)half * sizeof *ft);
      if (o->layout == TPR_MROPE_INTERLEAVED)
        for (int a = 1; a <= 2; a++)
          for (int64_t k = a; k < 3 * o->section[a] && k < half; k += 3) ft[k] = f3[a * half + k];
      for (int64_t k = 0; k < rd; k++) emb[k] = ft[k % half];
    }
    for (int64_t k = 0; k < rd; k++) cs[k] = cos(emb[k]), sn[k] = sin(emb[k]);
    for (int64_t h = 0; h < NH; h++) {
      const float *xr = x + (t * NH + h) * D;
      double *orow = out + (t * NH + h) * D;
      for (int64_t d = 0; d < rd; d++) {
        double rot;
        int64_t k;  // the table entry of dim d
        if (o->pairing == TPR_ROPE_PAIR_HALF) {
          rot = d < half ? -xr[d + half] : xr[d - half];  // rotate_half: cat(-x2, x1)
          k = d;
        } else {
          rot = d % 2 == 0 ? -xr[d + 1] : xr[d - 1];  // GPT-J: (-x_odd, x_even) interleaved back
          k = d / 2;                                   // pair d/2 uses frequency d/2
        }
        orow[d] = xr[d] * cs[k] + rot * sn[k];
      }
      for (int64_t d = rd; d < D; d++) orow[d] = xr[d];
    }
  }
  free(cs), free(sn), free(f3), free(ft);
}

// (3, T) positions: T axis ascending from a random start, H and W a random
// grid walk, so every axis differs from the others.
static int32_t *random_pos3(int64_t T) {
  int32_t *p = malloc(3 * (size_t)T * sizeof *p);
  int32_t base = (int32_t)tt_randint(0, 3000);
  for (int64_t t = 0; t < T; t++) {
    p[t] = base + (int32_t)t;
    p[T + t] = base + (int32_t)tt_randint(0, 40);
    p[2 * T + t] = base + (int32_t)tt_randint(0, 40) + 50;
  }
  return p;
}

static double run_err(const tpr_rope_opts *kern, const tpr_rope_opts *ref, const float *xh, const int32_t *pos,
                      int64_t T, int64_t NH, int64_t D) {
  const int64_t xs[3] = {T, NH, D};
  tpr_tensor *x = tt_from_host(TPR_F32, 3, xs, xh), *out = tt_new(TPR_F32, 3, xs), *p;
  if (kern->layout == TPR_MROPE_NONE) p = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, pos);
  else p = tt_from_host(TPR_I32, 2, (const int64_t[]){3, T}, pos);
  TT_OK(tpr_rope_ex(tt_cpu(), x, p, kern, out));
  size_t n = (size_t)(T * NH * D);
  double *want = malloc(n * sizeof *want);
  reference(xh, pos, T, NH, D, ref, want);
  double err = tt_max_rel_err(tpr_tensor_data(out), want, n);
  free(want);
  tpr_tensor_free(x), tpr_tensor_free(out), tpr_tensor_free(p);
  return err;
}

typedef struct vcase {
  const char *name;
  int64_t NH, D, rd, sec[3];
} vcase;

static const vcase cases[] = {
    {"Qwen3-VL-like D 32 [6,5,5]", 3, 32, 32, {6, 5, 5}},
    {"tiny D 16 [4,2,2]", 2, 16, 16, {4, 2, 2}},
    {"partial rd 12 of 20 [2,2,2]", 2, 20, 12, {2, 2, 2}},
    {"sections not a multiple of 3 [11,11,10]", 1, 64, 64, {11, 11, 10}},
};

static void test_layouts_and_pairings(void **state) {
  (void)state;
  const tpr_mrope_layout layouts[2] = {TPR_MROPE_SECTIONED, TPR_MROPE_INTERLEAVED};
  const tpr_rope_pairing pairs[2] = {TPR_ROPE_PAIR_HALF, TPR_ROPE_PAIR_INTERLEAVE};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const vcase *v = &cases[c];
    int64_t T = tt_randint(5, 12);
    float *xh = malloc((size_t)(T * v->NH * v->D) * sizeof *xh);
    tt_fill_normal(xh, (size_t)(T * v->NH * v->D), 1.0);
    int32_t *pos = random_pos3(T);
    for (int l = 0; l < 2; l++)
      for (int q = 0; q < 2; q++) {
        tpr_rope_opts o = {.rotary_dim = v->rd, .theta = 1e4f, .pairing = pairs[q], .layout = layouts[l],
                           .section = {v->sec[0], v->sec[1], v->sec[2]}};
        double err = run_err(&o, &o, xh, pos, T, v->NH, v->D);
        // Controls: the other layout, the other pairing, plain rope on the T row.
        tpr_rope_opts wl = o, wp = o, plain = o;
        wl.layout = layouts[1 - l];
        wp.pairing = pairs[1 - q];
        plain.layout = TPR_MROPE_NONE;
        double e_layout = run_err(&wl, &o, xh, pos, T, v->NH, v->D);
        double e_pair = run_err(&wp, &o, xh, pos, T, v->NH, v->D);
        double e_plain = run_err(&plain, &o, xh, pos, T, v->NH, v->D);  // pos row 0 = T axis
        printf("  %-40s %-11s %-10s T %2lld: max rel err %.2e (bound %.0e); controls: other layout %.2e, other "
               "pairing %.2e, plain 1-D %.2e (must be > %.0e)\n",
               v->name, l ? "interleaved" : "sectioned", q ? "gptj" : "neox", (long long)T, err, REF_BOUND, e_layout,
               e_pair, e_plain, MISS_BOUND);
        assert_true(err < REF_BOUND);
        assert_true(e_layout > MISS_BOUND);
        assert_true(e_pair > MISS_BOUND);
        assert_true(e_plain > MISS_BOUND);
      }
    free(xh), free(pos);
  }
}

// Text-only positions (all three axes equal): every layout is plain RoPE,
// bit for bit (the angles come from the same f32 product).
static void test_equal_axes_is_plain_rope(void **state) {
  (void)state;
  int64_t T = 9, NH = 2, D = 16;
  const int64_t xs[3] = {T, NH, D};
  float *xh = malloc((size_t)(T * NH * D) * sizeof *xh);
  tt_fill_normal(xh, (size_t)(T * NH * D), 1.0);
  int32_t p1[9], p3[27];
  for (int64_t t = 0; t < T; t++) p1[t] = p3[t] = p3[T + t] = p3[2 * T + t] = (int32_t)tt_randint(0, 9000);
  tpr_tensor *x = tt_from_host(TPR_F32, 3, xs, xh), *a = tt_new(TPR_F32, 3, xs), *b = tt_new(TPR_F32, 3, xs);
  tpr_tensor *pos1 = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, p1);
  tpr_tensor *pos3 = tt_from_host(TPR_I32, 2, (const int64_t[]){3, T}, p3);
  TT_OK(tpr_rope(tt_cpu(), x, pos1, D, 1e4f, a));
  for (int l = TPR_MROPE_SECTIONED; l <= TPR_MROPE_INTERLEAVED; l++) {
    tpr_rope_opts o = {.rotary_dim = D, .theta = 1e4f, .layout = (tpr_mrope_layout)l, .section = {4, 2, 2}};
    TT_OK(tpr_rope_ex(tt_cpu(), x, pos3, &o, b));
    int same = memcmp(tpr_tensor_data(a), tpr_tensor_data(b), (size_t)(T * NH * D) * sizeof(float)) == 0;
    printf("  layout %d with t = h = w: %s plain rope\n", l, same ? "bit-identical to" : "DIFFERS from");
    assert_true(same);
  }
  free(xh);
  tpr_tensor_free(x), tpr_tensor_free(a), tpr_tensor_free(b), tpr_tensor_free(pos1), tpr_tensor_free(pos3);
}

// The backward of each variant: finite differences through tpr_op_run.
static void test_variant_grads(void **state) {
  (void)state;
  for (int l = TPR_MROPE_SECTIONED; l <= TPR_MROPE_INTERLEAVED; l++)
    for (int q = 0; q < 2; q++) {
      int64_t T = 5, NH = 2, D = 16;
      tpr_rope_opts o = {.rotary_dim = 12, .theta = 1e4f, .pairing = (tpr_rope_pairing)q,
                         .layout = (tpr_mrope_layout)l, .section = {2, 2, 2}};
      int32_t *pos = random_pos3(T);
      char name[96];
      snprintf(name, sizeof name, "rope %s %s rd 12 of 16", l == 1 ? "sectioned" : "interleaved", q ? "gptj" : "neox");
      tt_grad_case c = {.name = name, .n_in = 2, .diff = {true, false}, .op = TPR_OP_ROPE, .attrs = tpr_rope_attrs(&o)};
      c.in[0] = tt_random_f32(tt_cpu(), 3, (const int64_t[]){T, NH, D}, NULL);
      c.in[1] = tt_from_host(TPR_I32, 2, (const int64_t[]){3, T}, pos);
      tt_grad_expect(&c, 1e-6);
      tt_grad_free_inputs(&c);
      free(pos);
    }
}

static void test_bad_attrs_refused(void **state) {
  (void)state;
  int64_t T = 4, D = 8;
  tpr_tensor *x = tt_random_f32(tt_cpu(), 3, (const int64_t[]){T, 1, D}, NULL), *out = tt_new(TPR_F32, 3,
                                                                                              (const int64_t[]){T, 1, D});
  int32_t p[12] = {0};
  tpr_tensor *p1 = tt_from_host(TPR_I32, 1, (const int64_t[]){T}, p);
  tpr_tensor *p3 = tt_from_host(TPR_I32, 2, (const int64_t[]){3, T}, p);
  struct {
    const char *what;
    tpr_rope_opts o;
    const tpr_tensor *pos;
  } bad[] = {
      {"sections sum 5, not rd/2 = 4", {D, 1e4f, 0, TPR_MROPE_INTERLEAVED, {2, 2, 1}}, p3},
      {"negative section", {D, 1e4f, 0, TPR_MROPE_SECTIONED, {6, -1, -1}}, p3},
      {"layout 3", {D, 1e4f, 0, (tpr_mrope_layout)3, {2, 1, 1}}, p3},
      {"pairing 2", {D, 1e4f, (tpr_rope_pairing)2, TPR_MROPE_NONE, {0}}, p1},
      {"MRoPE with (T) positions", {D, 1e4f, 0, TPR_MROPE_SECTIONED, {2, 1, 1}}, p1},
      {"plain rope with (3, T) positions", {D, 1e4f, 0, TPR_MROPE_NONE, {0}}, p3},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tpr_status rc = tpr_rope_ex(tt_cpu(), x, bad[i].pos, &bad[i].o, out);
    printf("  %-34s -> %s: %s\n", bad[i].what, tpr_status_name(rc), tpr_last_error());
    assert_int_not_equal(rc, TPR_OK);
  }
  tpr_tensor_free(x), tpr_tensor_free(out), tpr_tensor_free(p1), tpr_tensor_free(p3);
}

// ---- the qwen3_vl_moe config (shard/model_config_mrope.c)

static tpr_status parse_vl(const char *rope_json, const char *extra, tpr_model_config *c) {
  char json[2048];
  snprintf(json, sizeof json,
           "{\"model_type\": \"qwen3_vl_moe\", \"tie_word_embeddings\": false, %s \"text_config\": {"
           "\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
           "\"num_key_value_heads\": 2, \"head_dim\": 16, \"moe_intermediate_size\": 8, "
           "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"tie_word_embeddings\": true %s}}",
           extra, rope_json);
  return tpr_model_config_parse(json, strlen(json), "test", c);
}

static void test_config(void **state) {
  (void)state;
  tpr_model_config c;
  // transformers 5's save_pretrained spelling.
  TT_OK(parse_vl(", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5e5, "
                 "\"mrope_section\": [4, 2, 2], \"mrope_interleaved\": true}", "", &c));
  printf("  rope_parameters: family %s, layout %d, section [%lld, %lld, %lld], theta %g, norm_topk %d, tied %d\n",
         tpr_model_family_name(c.family), c.mrope_layout, (long long)c.mrope_section[0],
         (long long)c.mrope_section[1], (long long)c.mrope_section[2], c.rope_theta, c.norm_topk_prob,
         c.tie_word_embeddings);
  assert_int_equal(c.family, TPR_FAMILY_QWEN3_VL_MOE);
  assert_int_equal(c.mrope_layout, TPR_MROPE_INTERLEAVED);
  assert_int_equal(c.mrope_section[0], 4);
  assert_int_equal(c.mrope_section[2], 2);
  assert_true(c.rope_theta == 5e5 && c.norm_topk_prob && !c.tie_word_embeddings && c.num_experts == 4);
  // The hub's legacy spelling: rope_scaling with "type": "mrope".
  TT_OK(parse_vl(", \"rope_theta\": 5e5, \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 3], "
                 "\"mrope_interleaved\": true}", "", &c));
  assert_int_equal(c.mrope_section[1], 3);
  struct {
    const char *what, *rope;
    tpr_status want;
  } bad[] = {
      {"sections sum 9 of rd/2 8", ", \"rope_parameters\": {\"rope_theta\": 1e4, \"mrope_section\": [5, 2, 2]}",
       TPR_ERR_FORMAT},
      {"mrope_interleaved false", ", \"rope_parameters\": {\"rope_theta\": 1e4, \"mrope_section\": [4, 2, 2], "
       "\"mrope_interleaved\": false}", TPR_ERR_UNSUPPORTED},
      {"rope_parameters vs rope_scaling", ", \"rope_parameters\": {\"rope_theta\": 1e4, \"mrope_section\": [4, 2, 2]}, "
       "\"rope_scaling\": {\"mrope_section\": [2, 3, 3]}", TPR_ERR_FORMAT},
      {"rope_type yarn", ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1e4, "
       "\"mrope_section\": [4, 2, 2]}", TPR_ERR_UNSUPPORTED},
      {"section of 2 entries", ", \"rope_parameters\": {\"rope_theta\": 1e4, \"mrope_section\": [4, 4]}",
       TPR_ERR_FORMAT},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tpr_status rc = parse_vl(bad[i].rope, "", &c);
    printf("  %-32s -> %s: %s\n", bad[i].what, tpr_status_name(rc), tpr_last_error());
    assert_int_equal(rc, bad[i].want);
  }
  // No text_config at all.
  const char *flat = "{\"model_type\": \"qwen3_vl_moe\", \"hidden_size\": 32}";
  tpr_status rc = tpr_model_config_parse(flat, strlen(flat), "test", &c);
  printf("  %-32s -> %s: %s\n", "no text_config", tpr_status_name(rc), tpr_last_error());
  assert_int_equal(rc, TPR_ERR_FORMAT);
}

// ---- tpr forward --positions-3d on the qwen3_vl_moe fixture

#define VL_FIX TPR_FIXTURES "/qwen3_vl_moe_tiny"
#define VL_T 12
#define VL_V 96

static char tmp_dir[] = "/tmp/tpr_mrope_XXXXXX";

// np.save's bytes of an int64 array (rows, cols).
static void write_npy(const char *path, const int64_t *v, int rows, int cols) {
  char head[128];
  int n = snprintf(head, sizeof head, "{'descr': '<i8', 'fortran_order': False, 'shape': (%d, %d), }", rows, cols);
  int pad = 64 - (10 + n + 1) % 64;  // header padded so the data starts on a 64-byte boundary
  size_t hl = (size_t)(n + pad + 1), total = 10 + hl + (size_t)(rows * cols) * 8;
  unsigned char *b = calloc(1, total);
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (unsigned char)(hl & 255), b[9] = (unsigned char)(hl >> 8);
  memcpy(b + 10, head, (size_t)n);
  memset(b + 10 + n, ' ', (size_t)pad);
  b[10 + hl - 1] = '\n';
  memcpy(b + 10 + hl, v, (size_t)(rows * cols) * 8);
  tt_spit(path, b, total);
  free(b);
}

static void test_cli_positions_3d(void **state) {
  (void)state;
  char tpr[4096];
  if (tt_tpr_path(tpr, sizeof tpr, "test_cli_positions_3d") != 0) skip();
  tpr_st_set *set;
  TT_OK(tpr_st_open(VL_FIX "/reference.safetensors", &set));
  float tok_f[VL_T], pos_f[3 * VL_T];
  static float want[VL_T * VL_V], got[VL_T * VL_V];
  m2_read_f32(set, "tokens", VL_T, 0, tok_f);
  m2_read_f32(set, "pos3", 3, VL_T, pos_f);
  m2_read_f32(set, "logits", VL_T, VL_V, want);
  tpr_st_close(set);
  int32_t ids[VL_T];
  int64_t pos[3 * VL_T];
  for (int i = 0; i < VL_T; i++) ids[i] = (int32_t)tok_f[i];
  for (int i = 0; i < 3 * VL_T; i++) pos[i] = (int64_t)pos_f[i];
  char toks[16 * VL_T];
  m2_ids_text(ids, VL_T, toks);
  const char *npy = tt_path(tmp_dir, "pos3.npy"), *bad = tt_path(tmp_dir, "bad.npy");
  const char *out = tt_path(tmp_dir, "logits.safetensors");
  write_npy(npy, pos, 3, VL_T);
  write_npy(bad, pos, 2, VL_T);  // (2, T): not three axes
  const char *args[] = {"forward", "--model", VL_FIX, "--tokens", toks, "--positions-3d", npy, "--out", out, NULL};
  run_result r = tt_run_tpr(tpr, tmp_dir, args);
  if (r.code != 0) fail_msg("tpr forward --positions-3d exited %d: %s", r.code, r.err);
  tt_run_done(&r);
  TT_OK(tpr_st_open(out, &set));
  m2_read_f32(set, "logits", VL_T, VL_V, got);
  tpr_st_close(set);
  double e = m2_rel_err(got, want, VL_T * VL_V);
  const char *bargs[] = {"forward", "--model", VL_FIX, "--tokens", toks, "--positions-3d", bad, "--out", out, NULL};
  r = tt_run_tpr(tpr, tmp_dir, bargs);
  printf("  tpr forward --positions-3d (.npy (3, %d)): logits vs transformers %.3g (bound 1e-4); a (2, %d) file -> "
         "exit %d: %s", VL_T, e, VL_T, r.code, r.err);
  assert_true(e <= 1e-4);
  assert_int_equal(r.code, 2);
  assert_non_null(strstr(r.err, "shape must be (3, 12)"));
  tt_run_done(&r);
  unlink(npy), unlink(bad), unlink(out);
}

int main(void) {
  tt_seed_from_env();
  if (!mkdtemp(tmp_dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layouts_and_pairings),
      cmocka_unit_test(test_equal_axes_is_plain_rope),
      cmocka_unit_test(test_variant_grads),
      cmocka_unit_test(test_bad_attrs_refused),
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_cli_positions_3d),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  char rm[64];
  snprintf(rm, sizeof rm, "rm -rf %s", tmp_dir);
  if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
  return failed;
}
