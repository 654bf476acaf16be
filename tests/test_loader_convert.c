// tpr_convert and loading converted directories: the round trip is
// bit-exact with loading the Hugging Face directory; a flipped byte, a
// corrupt header or a truncated rank file is reported by file and tensor; a
// converted directory refuses another mesh; an interrupted convert never
// leaves a directory that loads; an existing output needs force.
#include "test_util.h"
#include "cli_util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_fixture.h"
#include "runtime/file_io.h"
#include "shard/convert.h"
#include "shard/safetensors.h"

static char root[] = "/tmp/tpr_test_convert_XXXXXX";
static char hf[4200], conv[4200];
static ck_model mdl;
static tpr_model_config cfg;
static tpr_shard_plan plan;  // tp 4, ep 2, etp 2: the mesh conv was written for

static const char *at(const char *name) { return tt_path(root, name); }

static void copy_dir(const char *from, const char *to) {
  assert_int_equal(mkdir(to, 0755), 0);
  DIR *d = opendir(from);
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char a[4400], b[4400];
    snprintf(a, sizeof a, "%s/%s", from, e->d_name);
    snprintf(b, sizeof b, "%s/%s", to, e->d_name);
    uint8_t *bytes;
    size_t len;
    TT_OK(tpr_file_read(a, &bytes, &len));
    TT_OK(tpr_file_write(b, bytes, len));
    free(bytes);
  }
  closedir(d);
}

static void expect_error(tpr_status rc, tpr_status want, const char *a, const char *b) {
  if (rc != want) fail_msg("got %s, want %s: %s", tpr_status_name(rc), tpr_status_name(want), tpr_last_error());
  if (a && !strstr(tpr_last_error(), a)) fail_msg("'%s' not in: %s", a, tpr_last_error());
  if (b && !strstr(tpr_last_error(), b)) fail_msg("'%s' not in: %s", b, tpr_last_error());
}

static void load(const char *dir, const tpr_shard_plan *p, int rank, tpr_dtype dt, tpr_rank_weights *w) {
  tpr_loader *l;
  TT_OK(tpr_loader_open(dir, p, rank, &l));
  TT_OK(tpr_loader_load_all(l, dt, w));
  tpr_loader_close(l);
}

static tpr_status try_load(const char *dir, const tpr_shard_plan *p, int rank) {
  tpr_loader *l = NULL;
  tpr_rank_weights w;
  tpr_status rc = tpr_loader_open(dir, p, rank, &l);
  if (rc == TPR_OK) rc = tpr_loader_load_all(l, TPR_F32, &w);
  if (rc == TPR_OK) tpr_rank_weights_free(&w);
  tpr_loader_close(l);
  return rc;
}

static int setup(void **state) {
  tt_seed_from_env();
  if (!mkdtemp(root)) return -1;
  snprintf(hf, sizeof hf, "%s/hf", root);
  snprintf(conv, sizeof conv, "%s/conv", root);
  if (mkdir(hf, 0755)) return -1;
  ck_spec s = ck_default_spec();
  ck_write(hf, &s, &mdl);
  if (tpr_model_config_load(hf, &cfg) || tpr_shard_plan_build(&cfg, 4, 2, 2, 1, TPR_BF16, &plan)) return -1;
  tpr_convert_stats st;
  if (tpr_convert(hf, &plan, conv, TPR_LOAD_SOURCE_DTYPE, false, &st) != TPR_OK) {
    fprintf(stderr, "convert: %s\n", tpr_last_error());
    return -1;
  }
  return st.files == 4 && st.bytes_written > 0 ? 0 : -1;
}

static int teardown(void **state) {
  DIR *d = opendir(root);
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') ck_rmdir(at(e->d_name));
  if (d) closedir(d);
  ck_free(&mdl);
  tpr_shard_plan_free(&plan);
  return rmdir(root);
}

static void test_round_trip(void **state) {
  static const tpr_dtype dts[] = {TPR_LOAD_SOURCE_DTYPE, TPR_F32, TPR_BF16};
  for (int r = 0; r < plan.world; r++)
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
      tpr_rank_weights a, b;
      load(hf, &plan, r, dts[k], &a);
      load(conv, &plan, r, dts[k], &b);
      assert_int_equal(a.n, b.n);
      assert_true(a.bytes_held == b.bytes_held);
      if (dts[k] == TPR_LOAD_SOURCE_DTYPE) assert_true(b.bytes_read == b.bytes_held);  // stored as loaded
      assert_memory_equal(a.dtype, b.dtype, (size_t)a.n * sizeof *a.dtype);
      assert_memory_equal(a.offset, b.offset, (size_t)(a.n + 1) * sizeof *a.offset);
      for (int64_t i = 0; i < a.n; i++) {
        assert_string_equal(a.items[i].name, b.items[i].name);
        size_t nb = (size_t)a.items[i].numel * tpr_dtype_size(a.dtype[i]);
        if (memcmp(tpr_rank_weights_data(&a, i), tpr_rank_weights_data(&b, i), nb))
          fail_msg("rank %d %s (dtype %d): converted bytes differ", r, a.items[i].name, (int)dts[k]);
      }
      tpr_rank_weights_free(&a);
      tpr_rank_weights_free(&b);
    }
  tpr_loader *l;
  TT_OK(tpr_loader_open(conv, &plan, 3, &l));
  assert_true(tpr_loader_converted(l));
  const tpr_load_item *it = tpr_loader_item(l, tpr_loader_count(l) - 1);
  assert_string_equal(it->name, "lm_head.weight");
  tpr_loader_close(l);
  // Converting to bf16 up front gives the same bf16 buffers.
  TT_OK(tpr_convert(hf, &plan, at("conv_bf16"), TPR_BF16, false, NULL));
  tpr_rank_weights a, b;
  load(hf, &plan, 2, TPR_BF16, &a);
  load(at("conv_bf16"), &plan, 2, TPR_LOAD_SOURCE_DTYPE, &b);
  assert_true(a.bytes_held == b.bytes_held);
  for (int64_t i = 0; i < a.n; i++)  // not the alignment gaps between buffers
    assert_memory_equal(tpr_rank_weights_data(&a, i), tpr_rank_weights_data(&b, i), (size_t)(a.items[i].numel * 2));
  tpr_rank_weights_free(&a);
  tpr_rank_weights_free(&b);
  ck_rmdir(at("conv_bf16"));
}

static void test_mesh_mismatch(void **state) {
  tpr_shard_plan p;
  TT_OK(tpr_shard_plan_build(&cfg, 2, 1, 1, 2, TPR_BF16, &p));  // world 4 too, another mesh
  expect_error(try_load(conv, &p, 0), TPR_ERR_INVALID_ARG, "tp=4 ep=2 etp=2 dp=1", "tp=2 ep=1 etp=1 dp=2");
  tpr_shard_plan_free(&p);
}

// File offset of tensor `name` in a file tpr_st_write wrote (no gaps).
static long offset_of(const char *path, const char *name, const char **last) {
  tpr_st_set *s;
  TT_OK(tpr_st_open(path, &s));
  const uint8_t *base = NULL, *hi = NULL;
  for (int i = 0; i < tpr_st_count(s); i++) {
    const tpr_st_tensor *t = tpr_st_get(s, i);
    if (!base || (const uint8_t *)t->data < base) base = t->data;
    if (!hi || (const uint8_t *)t->data > hi) hi = t->data, *last = t->name;
  }
  static char keep[128];
  snprintf(keep, sizeof keep, "%s", *last);
  *last = keep;
  FILE *f = fopen(path, "rb");
  uint8_t len8[8];
  assert_int_equal(fread(len8, 1, 8, f), 8);
  fclose(f);
  long hdr = 8;
  for (int i = 0; i < 8; i++) hdr += (long)len8[i] << (8 * i);
  long off = hdr + (long)((const uint8_t *)tpr_st_find(s, name)->data - base);
  tpr_st_close(s);
  return off;
}

static void flip(const char *path, long off) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, off, SEEK_SET);
  int c = fgetc(f);
  fseek(f, off, SEEK_SET);
  fputc(c ^ 0x10, f);
  fclose(f);
}

static void test_corruption(void **state) {
  const char *dir = at("corrupt"), *victim = "model.layers.1.self_attn.q_proj.weight", *last = NULL;
  copy_dir(conv, dir);
  char path[4400];
  snprintf(path, sizeof path, "%s/rank-00001-of-00004.safetensors", dir);
  long off = offset_of(path, victim, &last);
  flip(path, off + 5);
  expect_error(try_load(dir, &plan, 1), TPR_ERR_FORMAT, "rank-00001-of-00004.safetensors", victim);
  TT_OK(try_load(dir, &plan, 0));  // the other ranks' files are fine
  flip(path, off + 5);
  TT_OK(try_load(dir, &plan, 1));
  flip(path, 20);  // inside the JSON header
  expect_error(try_load(dir, &plan, 1), TPR_ERR_FORMAT, "rank-00001-of-00004.safetensors", "header");
  flip(path, 20);
  // Truncated: names the file and the tensor that lost its tail.
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(truncate(path, st.st_size - 3), 0);
  expect_error(try_load(dir, &plan, 1), TPR_ERR_FORMAT, "truncated", last);
  expect_error(try_load(dir, &plan, 1), TPR_ERR_FORMAT, "rank-00001-of-00004.safetensors", NULL);
  // A corrupt manifest is refused, not trusted.
  snprintf(path, sizeof path, "%s/manifest.pb", dir);
  TT_OK(tpr_file_write(path, (const uint8_t *)"\xff\xff\xff", 3));
  expect_error(try_load(dir, &plan, 0), TPR_ERR_FORMAT, "manifest.pb", NULL);
  ck_rmdir(dir);
}

static void test_interrupted_and_force(void **state) {
  // What a convert killed midway leaves: <out>.tmp-<pid>/ with some rank
  // files and no manifest; <out> itself does not exist.
  const char *out = at("half"), *tmp = at("half.tmp-4242");
  copy_dir(conv, tmp);
  char path[4400];
  snprintf(path, sizeof path, "%s/manifest.pb", tmp);
  unlink(path);
  snprintf(path, sizeof path, "%s/rank-00003-of-00004.safetensors", tmp);
  unlink(path);
  expect_error(try_load(out, &plan, 0), TPR_ERR_IO, out, NULL);
  expect_error(try_load(tmp, &plan, 0), TPR_ERR_FORMAT, "interrupted", "manifest.pb");
  ck_rmdir(tmp);
  // A convert that fails midway (a tensor missing from the source) leaves neither <out> nor its temporary.
  const char *broken = at("broken");
  copy_dir(hf, broken);
  ck_rewrite(broken, &mdl, "model.layers.1.block_sparse_moe.experts.7.w3.weight", NULL);
  expect_error(tpr_convert(broken, &plan, out, TPR_LOAD_SOURCE_DTYPE, false, NULL), TPR_ERR_FORMAT, "experts.7.w3",
               NULL);
  DIR *d = opendir(root);
  struct dirent *e;
  while ((e = readdir(d))) assert_null(strstr(e->d_name, "half"));
  closedir(d);
  ck_rmdir(broken);
  // An existing output needs force; force replaces a converted directory and removes the old one.
  expect_error(tpr_convert(hf, &plan, conv, TPR_LOAD_SOURCE_DTYPE, false, NULL), TPR_ERR_IO, "exists", "--force");
  TT_OK(tpr_convert(hf, &plan, conv, TPR_LOAD_SOURCE_DTYPE, true, NULL));
  TT_OK(try_load(conv, &plan, 2));
  d = opendir(root);
  while ((e = readdir(d))) assert_null(strstr(e->d_name, ".old-"));
  closedir(d);
  // ... and keeps a directory that is not a converted checkpoint.
  const char *mine = at("mine");
  assert_int_equal(mkdir(mine, 0755), 0);
  snprintf(path, sizeof path, "%s/notes.txt", mine);
  TT_OK(tpr_file_write(path, (const uint8_t *)"keep", 4));
  TT_OK(tpr_convert(hf, &plan, mine, TPR_LOAD_SOURCE_DTYPE, true, NULL));
  snprintf(path, sizeof path, "%s.old-%ld/notes.txt", mine, (long)getpid());
  assert_int_equal(access(path, F_OK), 0);
  expect_error(tpr_convert(hf, &plan, hf, TPR_LOAD_SOURCE_DTYPE, true, NULL), TPR_ERR_INVALID_ARG, "being converted",
               NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_mesh_mismatch),
      cmocka_unit_test(test_corruption),
      cmocka_unit_test(test_interrupted_and_force),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
