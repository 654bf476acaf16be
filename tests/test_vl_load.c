// Loading transformers' own Qwen3-VL-MoE checkpoint layout (shard/loader_hf.c):
// the text decoder under model.language_model.*, the experts fused as
// mlp.experts.gate_up_proj / down_proj, either as save_pretrained writes them
// (the module's (E, 2F, H) / (E, H, F): tests/fixtures/qwen3_vl_moe_tiny) or
// transposed as hub releases hold them ((E, H, 2F) / (E, F, H)), under mpirun
// at the mesh on the command line (--tp/--dp/--ep).
//  - layouts: fresh random fused experts written three ways (module layout,
//    hub layout, and split per expert under Qwen3-MoE's names without the
//    prefix); every rank of 7 meshes (tp, ep, etp up to 4) loads the same
//    bytes from all three, the experts equal the random values sliced by
//    hand, and the fused layouts read no more checkpoint bytes than the
//    split one (the rank's slice only);
//  - `tpr convert` of the module and the hub layout at tp 4 / ep 2 / etp 2
//    loads bit-exact with the Hugging Face directory on every rank;
//  - parity: the fixture rewritten in the hub layout gives transformers'
//    logits (within 1e-4 of max |logit|) at the run's mesh;
//  - negative controls: gate and up halves swapped, or the hub tensor's bytes
//    read untransposed (labelled with the module's shape), must break parity;
//  - refusal: a fused tensor of neither shape is TPR_ERR_FORMAT naming both.
#define _XOPEN_SOURCE 700  // nftw
#include "test_util.h"
#include "cli_util.h"

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/session.h"
#include "m2_ref.h"
#include "mpi_util.h"
#include "shard/convert.h"
#include "shard/loader.h"
#include "shard/safetensors.h"

#define FIX TPR_FIXTURES "/qwen3_vl_moe_tiny"
#define V 96
#define T 12
#define BOUND 1e-4  // max|d| <= BOUND * max|ref|: test_mrope's parity tolerance
enum { L = 2, E = 8, H = 32, F = 8 };  // the fixture's text decoder

static tpr_comm_t world;
static int R, tp, dp, ep;
static char root[] = "/tmp/tpr_test_vl_load_XXXXXX";
static int32_t tokens[T], pos3[3 * T];
static float ref_logits[T * V];
static float fix_gu[L][E * 2 * F * H], fix_dn[L][E * H * F];  // the fixture's experts, module layout

typedef enum form { MODULE, HUB, SPLIT, SWAPPED, UNTRANSPOSED, BAD_SHAPE } form;

static const char *at(const char *name) { return tt_path(root, name); }

// One expert slab (r, c) -> (c, r) for every expert.
static float *transposed(const float *x, int64_t r, int64_t c) {
  float *y = malloc((size_t)(E * r * c) * sizeof *y);
  assert_non_null(y);
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = 0; i < r; i++)
      for (int64_t j = 0; j < c; j++) y[e * r * c + j * r + i] = x[e * r * c + i * c + j];
  return y;
}

// dir/ with the fixture's config.json and model.safetensors, the fused
// experts replaced by gu (E, 2F, H) / dn (E, H, F) of each layer laid out as
// `f` says.
static void write_form(const char *dir, form f, float (*gu)[E * 2 * F * H], float (*dn)[E * H * F]) {
  assert_int_equal(mkdir(dir, 0755), 0);
  size_t len;
  char *cfg = tt_slurp(FIX "/config.json", &len);
  tt_spit(tt_path(dir, "config.json"), cfg, len);
  free(cfg);
  tpr_st_set *src;
  TT_OK(tpr_st_open(FIX "/model.safetensors", &src));
  int n = tpr_st_count(src), k = 0, nb = 0;
  tpr_st_write_entry *w = calloc((size_t)(n + 3 * E * L), sizeof *w);
  char(*names)[160] = calloc((size_t)(n + 3 * E * L), sizeof *names);
  int64_t(*shapes)[3] = calloc((size_t)(n + 3 * E * L), sizeof *shapes);
  float *bufs[2 * L];
  assert_true(w && names && shapes);
  for (int i = 0; i < n; i++) {
    const tpr_st_tensor *t = tpr_st_get(src, i);
    int l;
    char part[32] = "";
    if (sscanf(t->name, "model.language_model.layers.%d.mlp.experts.%31s", &l, part) == 2 && l >= 0 && l < L) {
      bool gate_up = !strcmp(part, "gate_up_proj");
      const float *x = gate_up ? gu[l] : dn[l];
      int64_t r = gate_up ? 2 * F : H, c = gate_up ? H : F;  // the module's slab (r, c)
      if (f == SPLIT) {
        for (int e = 0; e < E; e++)
          for (int h = 0; h < (gate_up ? 2 : 1); h++) {
            snprintf(names[k], sizeof names[k], "model.layers.%d.mlp.experts.%d.%s.weight", l, e,
                     gate_up ? (h ? "up_proj" : "gate_proj") : "down_proj");
            shapes[k][0] = gate_up ? F : H, shapes[k][1] = c;
            w[k] = (tpr_st_write_entry){names[k], TPR_F32, 2, shapes[k], x + e * r * c + h * F * H};
            k++;
          }
        continue;
      }
      const float *data = x;
      int64_t s0 = r, s1 = c;
      if (f == HUB || f == UNTRANSPOSED) {
        data = bufs[nb++] = transposed(x, r, c);
        if (f == HUB) s0 = c, s1 = r;  // UNTRANSPOSED keeps the module's shape on the hub's bytes
      } else if (f == SWAPPED && gate_up) {
        float *y = bufs[nb++] = malloc(sizeof gu[l]);
        for (int e = 0; e < E; e++) {
          memcpy(y + e * r * c, x + e * r * c + F * H, sizeof(float) * F * H);
          memcpy(y + e * r * c + F * H, x + e * r * c, sizeof(float) * F * H);
        }
        data = y;
      } else if (f == BAD_SHAPE && gate_up) {
        s0 = F;  // the first F rows of each slab's storage: (E, F, H)
      }
      snprintf(names[k], sizeof names[k], "%s", t->name);
      shapes[k][0] = E, shapes[k][1] = s0, shapes[k][2] = s1;
      w[k] = (tpr_st_write_entry){names[k], TPR_F32, 3, shapes[k], data};
      k++;
      continue;
    }
    const char *lm = "model.language_model.";
    if (f == SPLIT && !strncmp(t->name, "model.visual.", 13)) continue;
    if (f == SPLIT && !strncmp(t->name, lm, strlen(lm))) snprintf(names[k], sizeof names[k], "model.%s", t->name + strlen(lm));
    else snprintf(names[k], sizeof names[k], "%s", t->name);
    w[k] = (tpr_st_write_entry){names[k], t->dtype, t->ndim, t->shape, t->data};
    k++;
  }
  TT_OK(tpr_st_write(tt_path(dir, "model.safetensors"), w, k, NULL));
  for (int i = 0; i < nb; i++) free(bufs[i]);
  free(w);
  free(names);
  free(shapes);
  tpr_st_close(src);
}

static void load(const char *dir, const tpr_shard_plan *p, int rank, tpr_rank_weights *w) {
  tpr_loader *l;
  TT_OK(tpr_loader_open(dir, p, rank, &l));
  TT_OK(tpr_loader_load_all(l, TPR_LOAD_SOURCE_DTYPE, w));
  tpr_loader_close(l);
}

// Items of a and b equal in name, dtype and bytes; the differing count.
static int64_t diff_items(const tpr_rank_weights *a, const tpr_rank_weights *b) {
  assert_int_equal(a->n, b->n);
  int64_t bad = 0;
  for (int64_t i = 0; i < a->n; i++) {
    assert_string_equal(a->items[i].name, b->items[i].name);
    bad += a->dtype[i] != b->dtype[i] || a->items[i].numel != b->items[i].numel ||
           memcmp(tpr_rank_weights_data(a, i), tpr_rank_weights_data(b, i),
                  (size_t)a->items[i].numel * tpr_dtype_size(a->dtype[i])) != 0;
  }
  return bad;
}

// The expert items of w against gu/dn sliced by hand: gate rows [r0, r0+Ir)
// of expert e's (F, H) gate (up: rows F + ..), down columns [r0, r0+Ir).
static int64_t check_experts(const tpr_shard_plan *p, int rank, const tpr_rank_weights *w,
                             float (*gu)[E * 2 * F * H], float (*dn)[E * H * F]) {
  tpr_mesh m;
  TT_OK(tpr_mesh_init(p->world, rank, p->tp, p->ep, p->etp, &m));
  int64_t Ir = p->expert_inter_per_rank, r0 = m.etp_rank * Ir, checked = 0;
  for (int64_t i = 0; i < w->n; i++) {
    const tpr_load_item *it = &w->items[i];
    if (it->expert < 0) continue;
    const float *got = tpr_rank_weights_data(w, i);
    int64_t l = it->layer, e = it->expert;
    bool down = strstr(it->name, "down_proj") != NULL, up = strstr(it->name, "up_proj") != NULL;
    for (int64_t a = 0; a < (down ? H : Ir); a++)
      for (int64_t b = 0; b < (down ? Ir : H); b++) {
        float want = down ? dn[l][(e * H + a) * F + r0 + b] : gu[l][(e * 2 * F + (up ? F : 0) + r0 + a) * H + b];
        if (got[a * (down ? Ir : H) + b] != want)
          fail_msg("rank %d %s [%lld, %lld] = %g, want %g", rank, it->name, (long long)a, (long long)b,
                   got[a * (down ? Ir : H) + b], want);
      }
    checked++;
  }
  return checked;
}

static const int meshes[][4] = {  // tp, dp, ep, etp
    {1, 1, 1, 1}, {2, 1, 1, 2}, {2, 1, 2, 1}, {1, 2, 2, 1}, {4, 1, 2, 2}, {2, 2, 4, 1}, {4, 2, 2, 4}};

static float (*rand_gu)[E * 2 * F * H], (*rand_dn)[E * H * F];

static void test_layouts(void **state) {
  (void)state;
  if (R != 0) return;  // the loader is per rank: one process plays every rank
  tpr_model_config cfg;
  TT_OK(tpr_model_config_load(at("module"), &cfg));
  int64_t ranks = 0, experts = 0;
  uint64_t read_fused = 0, read_split = 0, read_hub = 0;
  for (size_t mi = 0; mi < sizeof meshes / sizeof *meshes; mi++) {
    const int *m = meshes[mi];
    tpr_shard_plan p;
    TT_OK(tpr_shard_plan_build(&cfg, m[0], m[2], m[3], m[1], TPR_F32, &p));
    for (int r = 0; r < p.world; r++) {
      tpr_rank_weights a, b, c;
      load(at("module"), &p, r, &a);
      load(at("hub"), &p, r, &b);
      load(at("split"), &p, r, &c);
      int64_t d1 = diff_items(&a, &c), d2 = diff_items(&b, &c);
      if (d1 || d2) fail_msg("tp %d dp %d ep %d etp %d rank %d: %lld (module) / %lld (hub) buffers differ from the "
                             "split layout's", m[0], m[1], m[2], m[3], r, (long long)d1, (long long)d2);
      experts += check_experts(&p, r, &a, rand_gu, rand_dn);
      if (a.bytes_read > c.bytes_read || b.bytes_read > c.bytes_read)
        fail_msg("rank %d read %llu (module) / %llu (hub) checkpoint bytes, the split layout %llu", r,
                 (unsigned long long)a.bytes_read, (unsigned long long)b.bytes_read, (unsigned long long)c.bytes_read);
      read_fused += a.bytes_read, read_hub += b.bytes_read, read_split += c.bytes_read;
      ranks++;
      tpr_rank_weights_free(&a);
      tpr_rank_weights_free(&b);
      tpr_rank_weights_free(&c);
    }
    tpr_shard_plan_free(&p);
  }
  printf("layouts: %zu meshes, %lld rank loads: module, hub and split layouts equal; %lld expert buffers equal the "
         "random values sliced by hand; bytes read module %llu, hub %llu, split %llu\n", sizeof meshes / sizeof *meshes,
         (long long)ranks, (long long)experts, (unsigned long long)read_fused, (unsigned long long)read_hub,
         (unsigned long long)read_split);
}

static void test_convert(void **state) {
  (void)state;
  if (R != 0) return;
  tpr_model_config cfg;
  TT_OK(tpr_model_config_load(at("module"), &cfg));
  tpr_shard_plan p;
  TT_OK(tpr_shard_plan_build(&cfg, 4, 2, 2, 1, TPR_F32, &p));
  const char *forms[] = {"module", "hub"};
  for (int f = 0; f < 2; f++) {
    char out[4200];
    snprintf(out, sizeof out, "%s/conv_%s", root, forms[f]);
    tpr_convert_stats st;
    TT_OK(tpr_convert(at(forms[f]), &p, out, TPR_LOAD_SOURCE_DTYPE, false, &st));
    for (int r = 0; r < p.world; r++) {
      tpr_rank_weights a, b;
      load(at(forms[f]), &p, r, &a);
      load(out, &p, r, &b);
      int64_t d = diff_items(&a, &b);
      if (d) fail_msg("convert of the %s layout, rank %d: %lld buffers differ", forms[f], r, (long long)d);
      tpr_rank_weights_free(&a);
      tpr_rank_weights_free(&b);
    }
    printf("convert (%s layout) tp 4 ep 2 etp 2: %d rank files, %llu bytes read, bit-exact with the HF load\n",
           forms[f], st.files, (unsigned long long)st.bytes_read);
  }
  tpr_shard_plan_free(&p);
}

static double parity(const char *dir) {
  tpr_session_opts o = {.model_dir = dir, .max_seq = T, .max_batch = 1, .tp = tp, .dp = dp, .ep = ep,
                        .force_tp_rank = -1};
  tpr_session *s = NULL;
  TT_OK(tpr_session_open(&o, world, tt_cpu(), &s));
  static float got[T * V];
  TT_OK(tpr_session_forward_3d(s, tokens, T, 0, pos3, got));
  tpr_session_close(s);
  return m2_rel_err(got, ref_logits, T * V);
}

static void test_parity_hub(void **state) {
  (void)state;
  double e = parity(at("fix_hub"));
  if (R == 0)
    printf("parity, fixture in the hub's transposed layout, tp %d dp %d ep %d: %.3g (bound %.0e)\n", tp, dp, ep, e,
           BOUND);
  if (!(e <= BOUND)) fail_msg("the hub layout's logits differ from transformers' by %.3g", e);
}

static void test_control_swapped(void **state) {
  (void)state;
  double e = parity(at("fix_swapped"));
  if (R == 0) printf("control: gate/up halves swapped: %.3g (must exceed %.0e)\n", e, BOUND);
  if (!(e > BOUND)) fail_msg("swapped gate/up halves passed the parity bound (%.3g)", e);
}

static void test_control_untransposed(void **state) {
  (void)state;
  double e = parity(at("fix_untransposed"));
  if (R == 0) printf("control: hub bytes read untransposed: %.3g (must exceed %.0e)\n", e, BOUND);
  if (!(e > BOUND)) fail_msg("untransposed experts passed the parity bound (%.3g)", e);
}

static void test_refusal_shape(void **state) {
  (void)state;
  if (R != 0) return;
  tpr_model_config cfg;
  TT_OK(tpr_model_config_load(at("bad_shape"), &cfg));
  tpr_shard_plan p;
  TT_OK(tpr_shard_plan_build(&cfg, 1, 1, 1, 1, TPR_F32, &p));
  tpr_loader *l;
  tpr_rank_weights w;
  TT_OK(tpr_loader_open(at("bad_shape"), &p, 0, &l));
  tpr_status rc = tpr_loader_load_all(l, TPR_F32, &w);
  tpr_loader_close(l);
  tpr_shard_plan_free(&p);
  printf("gate_up_proj (8, 8, 32) -> %s: %s\n", tpr_status_name(rc), tpr_last_error());
  assert_int_equal(rc, TPR_ERR_FORMAT);
  assert_non_null(strstr(tpr_last_error(), "(8, 8, 32)"));
  assert_non_null(strstr(tpr_last_error(), "(8, 16, 32)"));
  assert_non_null(strstr(tpr_last_error(), "(8, 32, 16)"));
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static int setup(void **state) {
  (void)state;
  if (!mkdtemp(root)) return -1;
  rand_gu = malloc(sizeof(*rand_gu) * L);
  rand_dn = malloc(sizeof(*rand_dn) * L);
  if (!rand_gu || !rand_dn) return -1;
  for (int l = 0; l < L; l++) {
    tt_fill_normal(rand_gu[l], E * 2 * F * H, 1.0);
    tt_fill_normal(rand_dn[l], E * H * F, 1.0);
  }
  write_form(at("module"), MODULE, rand_gu, rand_dn);
  write_form(at("hub"), HUB, rand_gu, rand_dn);
  write_form(at("split"), SPLIT, rand_gu, rand_dn);
  write_form(at("fix_hub"), HUB, fix_gu, fix_dn);
  write_form(at("fix_swapped"), SWAPPED, fix_gu, fix_dn);
  write_form(at("fix_untransposed"), UNTRANSPOSED, fix_gu, fix_dn);
  write_form(at("bad_shape"), BAD_SHAPE, fix_gu, fix_dn);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  free(rand_gu);
  free(rand_dn);
  return nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void load_fixture(void) {
  tpr_st_set *set;
  float f[3 * T];
  TT_OK(tpr_st_open(FIX "/reference.safetensors", &set));
  m2_read_f32(set, "tokens", T, 0, f);
  for (int i = 0; i < T; i++) tokens[i] = (int32_t)f[i];
  m2_read_f32(set, "pos3", 3, T, f);
  for (int i = 0; i < 3 * T; i++) pos3[i] = (int32_t)f[i];
  m2_read_f32(set, "logits", T, V, ref_logits);
  tpr_st_close(set);
  TT_OK(tpr_st_open(FIX "/model.safetensors", &set));
  for (int l = 0; l < L; l++) {
    char name[96];
    snprintf(name, sizeof name, "model.language_model.layers.%d.mlp.experts.gate_up_proj", l);
    TT_OK(tpr_st_read_f32(set, name, NULL, (const int64_t[]){E, 2 * F, H}, fix_gu[l]));
    snprintf(name, sizeof name, "model.language_model.layers.%d.mlp.experts.down_proj", l);
    TT_OK(tpr_st_read_f32(set, name, NULL, (const int64_t[]){E, H, F}, fix_dn[l]));
  }
  tpr_st_close(set);
}

int main(int argc, char **argv) {
  world = tt_mpi_world(&argc, &argv);
  R = tpr_comm_rank(world);
  tp = tpr_comm_size(world), dp = 1, ep = 1;
  for (int i = 1; i + 1 < argc; i++) {
    if (!strcmp(argv[i], "--tp")) tp = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--dp")) dp = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--ep")) ep = atoi(argv[i + 1]);
  }
  if (R == 0) tt_seed_from_env();
  load_fixture();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layouts),
      cmocka_unit_test(test_convert),
      cmocka_unit_test(test_parity_hub),
      cmocka_unit_test(test_control_swapped),
      cmocka_unit_test(test_control_untransposed),
      cmocka_unit_test(test_refusal_shape),
  };
  int failed = cmocka_run_group_tests(tests, setup, teardown);
  return tt_mpi_finish(world, failed);
}
