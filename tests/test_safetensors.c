// safetensors reading and writing (shard/safetensors.h): round trips of every
// dtype, box reads against an element-by-element gather, sharded and
// single-file directories, FP8 block dequantization against hand-computed
// values, atomic writes, and a fixture written by the reference Python
// writer (scripts/reference/make_safetensors_fixture.py). Malformed files
// are in test_safetensors_bad.c.
#define _GNU_SOURCE  // nftw
#include <cjson/cJSON.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/file_io.h"
#include "shard/safetensors.h"
#include "test_util.h"

static const tpr_dtype all_dtypes[] = {TPR_F32, TPR_BF16, TPR_F16, TPR_F8E4M3, TPR_I32, TPR_I64, TPR_U8};
enum { NDT = sizeof all_dtypes / sizeof all_dtypes[0] };

static void expect_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("expected '%s' in '%s'", needle, hay);
}

static void expect_err(tpr_status rc, tpr_status want, const char *msg) {
  if (rc != want)
    fail_msg("got %s, want %s (%s); last error: %s", tpr_status_name(rc), tpr_status_name(want), msg,
             tpr_last_error());
  expect_contains(tpr_last_error(), msg);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }
static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static char *tmp_dir(void) {
  char *d = strdup("/tmp/tpr_st_XXXXXX");
  assert_non_null(mkdtemp(d));
  return d;
}

static char *path_in(const char *dir, const char *name) {
  char *p = malloc(strlen(dir) + strlen(name) + 2);
  sprintf(p, "%s/%s", dir, name);
  return p;
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

static void *random_bytes(size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)tt_next_u64();
  return p;
}

static int64_t numel_of(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  return n;
}

// Every dtype with random bytes (NaN payloads included): raw bytes come
// back bit-exact, f32 reads equal tpr_dtype_convert, metadata survives, and
// widest-first data order leaves every tensor aligned to its element size.
static void test_round_trip_every_dtype(void **state) {
  char *dir = tmp_dir(), *path = path_in(dir, "all.safetensors");
  int64_t shapes[NDT][4];
  int ndims[NDT];
  tpr_st_write_entry e[NDT];
  char names[NDT][32];
  for (int i = 0; i < NDT; i++) {
    ndims[i] = (int)tt_randint(0, 4);
    for (int d = 0; d < ndims[i]; d++) shapes[i][d] = tt_randint(1, 6);
    snprintf(names[i], sizeof names[i], "t%d.%s", (int)tt_randint(0, 99), tpr_dtype_name(all_dtypes[i]));
    size_t nb = (size_t)numel_of(ndims[i], shapes[i]) * tpr_dtype_size(all_dtypes[i]);
    e[i] = (tpr_st_write_entry){names[i], all_dtypes[i], ndims[i], shapes[i], random_bytes(nb)};
  }
  const char *meta[] = {"format", "pt", "b", "x y", NULL};
  TT_OK(tpr_st_write(path, e, NDT, meta));
  assert_int_equal(count_entries(dir), 1);  // no temporary file left

  tpr_st_set *s = NULL;
  TT_OK(tpr_st_open(path, &s));
  assert_int_equal(tpr_st_count(s), NDT);
  assert_string_equal(tpr_st_metadata(s, "format"), "pt");
  assert_string_equal(tpr_st_metadata(s, "b"), "x y");
  assert_null(tpr_st_metadata(s, "nope"));
  for (int i = 1; i < NDT; i++) assert_true(strcmp(tpr_st_get(s, i - 1)->name, tpr_st_get(s, i)->name) < 0);
  assert_null(tpr_st_get(s, NDT));
  for (int i = 0; i < NDT; i++) {
    const tpr_st_tensor *t = tpr_st_find(s, names[i]);
    assert_non_null(t);
    assert_int_equal(t->dtype, all_dtypes[i]);
    assert_int_equal(t->ndim, ndims[i]);
    for (int d = 0; d < ndims[i]; d++) assert_int_equal(t->shape[d], shapes[i][d]);
    size_t esz = tpr_dtype_size(t->dtype);
    assert_int_equal(t->nbytes, (size_t)t->numel * esz);
    assert_int_equal((uintptr_t)t->data % esz, 0);
    assert_string_equal(t->path, path);
    assert_memory_equal(t->data, e[i].data, t->nbytes);
    void *raw = malloc(t->nbytes + 1);
    TT_OK(tpr_st_read(s, names[i], NULL, NULL, t->dtype, raw));
    assert_memory_equal(raw, e[i].data, t->nbytes);
    float *got = malloc((size_t)t->numel * 4), *want = malloc((size_t)t->numel * 4);
    TT_OK(tpr_st_read_f32(s, names[i], NULL, NULL, got));
    tpr_dtype_convert(e[i].data, t->dtype, want, TPR_F32, (size_t)t->numel);
    assert_memory_equal(got, want, (size_t)t->numel * 4);
    free(raw), free(got), free(want);
  }
  assert_null(tpr_st_find(s, "absent"));
  tpr_st_close(s);
  for (int i = 0; i < NDT; i++) free((void *)e[i].data);
  rm_tree(dir);
  free(path), free(dir);
}

// The box [st, st+ln) of a row-major tensor gathered one element at a time.
static void gather(const uint8_t *src, int nd, const int64_t *shape, const int64_t *st, const int64_t *ln, size_t esz,
                   uint8_t *out) {
  int64_t idx[TPR_MAX_DIMS] = {0}, n = numel_of(nd, ln);
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off = off * shape[d] + st[d] + idx[d];
    memcpy(out + k * (int64_t)esz, src + off * (int64_t)esz, esz);
    for (int d = nd - 1; d >= 0 && ++idx[d] == ln[d]; d--) idx[d] = 0;
  }
}

// Rewrites `path` with its header grown by k spaces, shifting the data
// section by k bytes: still a valid file, but its tensors are misaligned in
// memory, which the reader must cope with (the sanitizer build checks).
static void shift_data(const char *path, int k) {
  uint8_t *b;
  size_t n;
  TT_OK(tpr_file_read(path, &b, &n));
  uint64_t h = 0;
  for (int i = 7; i >= 0; i--) h = h << 8 | b[i];
  uint8_t *o = malloc(n + (size_t)k);
  for (int i = 0; i < 8; i++) o[i] = (uint8_t)((h + (uint64_t)k) >> (8 * i));
  memcpy(o + 8, b + 8, h);
  memset(o + 8 + h, ' ', (size_t)k);
  memcpy(o + 8 + h + k, b + 8 + h, n - 8 - h);
  TT_OK(tpr_file_write(path, o, n + (size_t)k));
  free(b), free(o);
}

static void test_box_reads(void **state) {
  char *dir = tmp_dir(), *path = path_in(dir, "box.safetensors");
  for (int iter = 0; iter < 60; iter++) {
    int nd = (int)tt_randint(1, 4);
    int64_t shape[4], st[4], ln[4];
    for (int d = 0; d < nd; d++) {
      shape[d] = tt_randint(1, 9);
      st[d] = tt_randint(0, shape[d] - 1);
      ln[d] = tt_randint(iter % 10 == 0 ? 0 : 1, shape[d] - st[d]);
    }
    tpr_dtype dt = all_dtypes[tt_randint(0, NDT - 1)], out_dt = all_dtypes[tt_randint(0, NDT - 1)];
    size_t esz = tpr_dtype_size(dt), n = (size_t)numel_of(nd, ln);
    void *data = random_bytes((size_t)numel_of(nd, shape) * esz);
    tpr_st_write_entry e = {"box", dt, nd, shape, data};
    TT_OK(tpr_st_write(path, &e, 1, NULL));
    if (iter % 2) shift_data(path, (int)tt_randint(1, 7));
    tpr_st_set *s = NULL;
    TT_OK(tpr_st_open(path, &s));
    uint8_t *raw_want = malloc(n * esz + 1), *raw = malloc(n * esz + 1);
    gather(data, nd, shape, st, ln, esz, raw_want);
    TT_OK(tpr_st_read(s, "box", st, ln, dt, raw));
    assert_memory_equal(raw, raw_want, n * esz);
    size_t osz = tpr_dtype_size(out_dt);
    uint8_t *got = malloc(n * osz + 1), *want = malloc(n * osz + 1);
    tpr_dtype_convert(raw_want, dt, want, out_dt, n);
    TT_OK(tpr_st_read(s, "box", st, ln, out_dt, got));
    if (memcmp(got, want, n * osz)) fail_msg("iter %d: %s box read into %s differs", iter, tpr_dtype_name(dt),
                                             tpr_dtype_name(out_dt));
    // Out of bounds in each way, with a message naming the tensor.
    int d = (int)tt_randint(0, nd - 1);
    int64_t bad_st[4], bad_ln[4];
    memcpy(bad_st, st, sizeof st), memcpy(bad_ln, ln, sizeof ln);
    bad_ln[d] = shape[d] - st[d] + 1;
    expect_err(tpr_st_read(s, "box", bad_st, bad_ln, dt, raw), TPR_ERR_SHAPE, "'box': box start");
    bad_ln[d] = ln[d], bad_st[d] = -1;
    expect_err(tpr_st_read(s, "box", bad_st, bad_ln, dt, raw), TPR_ERR_SHAPE, "outside its shape");
    bad_st[d] = shape[d] + 1;
    expect_err(tpr_st_read(s, "box", bad_st, NULL, dt, raw), TPR_ERR_SHAPE, "outside its shape");
    tpr_st_close(s);
    free(data), free(raw), free(raw_want), free(got), free(want);
  }
  tpr_st_set *s = NULL;
  TT_OK(tpr_st_open(path, &s));
  float f;
  expect_err(tpr_st_read_f32(s, "nope", NULL, NULL, &f), TPR_ERR_INVALID_ARG, "no tensor named 'nope'");
  tpr_st_close(s);
  rm_tree(dir);
  free(path), free(dir);
}

// Writes file `name` in dir with one 2x3 f32 tensor per name, value = file_no*100 + i.
static void write_shard(const char *dir, const char *name, int file_no, const char *const *tensors, int n) {
  static const int64_t shape[2] = {2, 3};  // outlives the loop, unlike a compound literal in it
  float v[8][6];
  tpr_st_write_entry e[8];
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < 6; k++) v[i][k] = (float)(file_no * 100 + i * 10 + k);
    e[i] = (tpr_st_write_entry){tensors[i], TPR_F32, 2, shape, v[i]};
  }
  char *p = path_in(dir, name);
  TT_OK(tpr_st_write(p, e, n, (const char *[]){"shard", name, NULL}));
  free(p);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char *p = path_in(dir, name);
  TT_OK(tpr_file_write(p, (const uint8_t *)text, strlen(text)));
  free(p);
}

static const char *const shard_a[] = {"model.embed.weight", "model.layers.0.w"};
static const char *const shard_b[] = {"model.layers.1.w", "lm_head.weight"};
static const char *const shard_c[] = {"model.norm.weight"};

static void write_sharded_set(const char *dir) {
  write_shard(dir, "model-00001-of-00003.safetensors", 1, shard_a, 2);
  write_shard(dir, "model-00002-of-00003.safetensors", 2, shard_b, 2);
  write_shard(dir, "model-00003-of-00003.safetensors", 3, shard_c, 1);
}

static const char *index_fmt =
    "{\"metadata\": {\"total_size\": 120}, \"weight_map\": {"
    "\"model.embed.weight\": \"model-00001-of-00003.safetensors\", "
    "\"model.layers.0.w\": \"model-00001-of-00003.safetensors\", "
    "\"model.layers.1.w\": \"%s\", \"lm_head.weight\": \"model-00002-of-00003.safetensors\", "
    "\"model.norm.weight\": \"model-00003-of-00003.safetensors\"%s}}";

static void write_index(const char *dir, const char *layer1_file, const char *extra) {
  char text[1024];
  snprintf(text, sizeof text, index_fmt, layer1_file, extra);
  write_text(dir, "model.safetensors.index.json", text);
}

static void test_sharded_index(void **state) {
  char *dir = tmp_dir();
  write_sharded_set(dir);
  write_text(dir, "stray.safetensors", "not opened: the index does not name it");
  write_index(dir, "model-00002-of-00003.safetensors", "");
  tpr_st_set *s = NULL;
  TT_OK(tpr_st_open(dir, &s));
  assert_int_equal(tpr_st_count(s), 5);
  const char *sorted[] = {"lm_head.weight", "model.embed.weight", "model.layers.0.w", "model.layers.1.w",
                          "model.norm.weight"};
  for (int i = 0; i < 5; i++) assert_string_equal(tpr_st_get(s, i)->name, sorted[i]);
  const tpr_st_tensor *t = tpr_st_find(s, "lm_head.weight");
  expect_contains(t->path, "model-00002-of-00003.safetensors");
  float v[6];
  TT_OK(tpr_st_read_f32(s, "lm_head.weight", (int64_t[]){1, 1}, (int64_t[]){1, 2}, v));
  assert_true(v[0] == 214.0f && v[1] == 215.0f);  // file 2, tensor 1, elements 4 and 5
  TT_OK(tpr_st_read_f32(s, "model.norm.weight", NULL, NULL, v));
  assert_true(v[5] == 305.0f);
  assert_string_equal(tpr_st_metadata(s, "shard"), "model-00001-of-00003.safetensors");  // first file wins
  tpr_st_close(s);

  // The index maps a tensor to a file that does not hold it.
  write_index(dir, "model-00003-of-00003.safetensors", "");
  expect_err(tpr_st_open(dir, &s), TPR_ERR_FORMAT, "maps tensor 'model.layers.1.w' to");
  expect_contains(tpr_last_error(), "00003-of-00003.safetensors, which does not hold it (it is in");
  assert_null(s);
  // ... names a tensor no file holds.
  write_index(dir, "model-00002-of-00003.safetensors", ", \"ghost\": \"model-00003-of-00003.safetensors\"");
  expect_err(tpr_st_open(dir, &s), TPR_ERR_FORMAT, "maps tensor 'ghost'");
  // ... names a file that does not exist.
  write_index(dir, "model-00002-of-00003.safetensors", ", \"x\": \"model-00004-of-00003.safetensors\"");
  expect_err(tpr_st_open(dir, &s), TPR_ERR_IO, "model-00004-of-00003.safetensors, which cannot be opened");
  // ... points outside the directory.
  write_index(dir, "../model-00002-of-00003.safetensors", "");
  expect_err(tpr_st_open(dir, &s), TPR_ERR_FORMAT, "'model.layers.1.w' is not a file name inside");
  // Two files hold the same tensor.
  write_shard(dir, "model-00003-of-00003.safetensors", 3, (const char *[]){"model.norm.weight", "lm_head.weight"}, 2);
  write_index(dir, "model-00002-of-00003.safetensors", "");
  expect_err(tpr_st_open(dir, &s), TPR_ERR_FORMAT, "tensor 'lm_head.weight' is in both");
  // The index is not JSON / has no weight_map.
  write_text(dir, "model.safetensors.index.json", "{\"weight_map\": ");
  expect_err(tpr_st_open(dir, &s), TPR_ERR_FORMAT, "model.safetensors.index.json: not valid JSON");
  write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
  expect_err(tpr_st_open(dir, &s), TPR_ERR_FORMAT, "no \"weight_map\" object");
  assert_null(s);
  rm_tree(dir);
  free(dir);
}

static void test_directories_without_index(void **state) {
  char *dir = tmp_dir();
  tpr_st_set *s = NULL;
  expect_err(tpr_st_open(dir, &s), TPR_ERR_IO, "holds no .safetensors file");
  // Without an index every *.safetensors file is opened, in name order.
  write_sharded_set(dir);
  write_text(dir, "notes.txt", "ignored");
  TT_OK(tpr_st_open(dir, &s));
  assert_int_equal(tpr_st_count(s), 5);
  assert_string_equal(tpr_st_metadata(s, "shard"), "model-00001-of-00003.safetensors");
  tpr_st_close(s);
  // model.safetensors alone is opened when present.
  write_shard(dir, "model.safetensors", 7, (const char *[]){"only"}, 1);
  TT_OK(tpr_st_open(dir, &s));
  assert_int_equal(tpr_st_count(s), 1);
  expect_contains(tpr_st_get(s, 0)->path, "/model.safetensors");
  tpr_st_close(s);
  char *missing = path_in(dir, "missing.safetensors");
  expect_err(tpr_st_open(missing, &s), TPR_ERR_IO, "missing.safetensors");
  assert_null(s);
  rm_tree(dir);
  free(missing), free(dir);
}

// E4M3 code of a value it represents exactly (the test states values so).
static uint8_t f8(float v) {
  uint8_t b = tpr_f32_to_f8e4m3(v);
  assert_true(tpr_f8e4m3_to_f32(b) == v);
  return b;
}

// A 130x260 FP8 weight in 128x128 blocks: scale_inv (2, 3), with partial
// edge blocks of 2 rows and 4 columns. Values chosen so products are exact.
static void test_fp8_block_dequant(void **state) {
  enum { R = 130, C = 260 };
  char *dir = tmp_dir(), *path = path_in(dir, "fp8.safetensors");
  uint8_t *w = malloc(R * C);
  for (int i = 0; i < R * C; i++) {
    w[i] = (uint8_t)tt_next_u64();
    if ((w[i] & 0x7F) == 0x7F) w[i] ^= 1;  // no NaN codes
  }
  float scale[2][3] = {{0.25f, 0.5f, 2.0f}, {4.0f, 0.125f, 8.0f}};
  uint16_t scale_bf16[6];
  for (int i = 0; i < 6; i++) scale_bf16[i] = tpr_f32_to_bf16((&scale[0][0])[i]);
  // Hand-set elements, one per block; the comments give the expected value.
  w[0 * C + 0] = f8(1.5f);        // block (0,0): 1.5 * 0.25 = 0.375
  w[127 * C + 255] = f8(-3.0f);   // block (0,1): -3 * 0.5 = -1.5
  w[5 * C + 256] = f8(0.875f);    // block (0,2), partial columns: 0.875 * 2 = 1.75
  w[128 * C + 0] = f8(448.0f);    // block (1,0), partial rows: 448 * 4 = 1792
  w[129 * C + 200] = f8(-0.5f);   // block (1,1): -0.5 * 0.125 = -0.0625
  w[129 * C + 259] = f8(0.125f);  // block (1,2), the corner: 0.125 * 8 = 1
  const int64_t wshape[2] = {R, C}, sshape[2] = {2, 3};
  tpr_st_write_entry e[5] = {
      {"q.weight", TPR_F8E4M3, 2, wshape, w},
      {"q.weight_scale_inv", TPR_F32, 2, sshape, scale},
      {"k.weight", TPR_F8E4M3, 2, wshape, w},
      {"k.weight_scale_inv", TPR_BF16, 2, sshape, scale_bf16},
      {"plain", TPR_F8E4M3, 2, wshape, w},  // no scale_inv: plain decode
  };
  TT_OK(tpr_st_write(path, e, 5, NULL));
  tpr_st_set *s = NULL;
  TT_OK(tpr_st_open(path, &s));
  float *got = malloc(R * C * sizeof *got);
  const char *names[2] = {"q.weight", "k.weight"};
  for (int k = 0; k < 2; k++) {
    TT_OK(tpr_st_read_f32(s, names[k], NULL, NULL, got));
    assert_true(got[0] == 0.375f);
    assert_true(got[127 * C + 255] == -1.5f);
    assert_true(got[5 * C + 256] == 1.75f);
    assert_true(got[128 * C + 0] == 1792.0f);
    assert_true(got[129 * C + 200] == -0.0625f);
    assert_true(got[129 * C + 259] == 1.0f);
    for (int r = 0; r < R; r++)
      for (int c = 0; c < C; c++) {
        float want = tpr_f8e4m3_to_f32(w[r * C + c]) * scale[r / 128][c / 128];
        if (got[r * C + c] != want) fail_msg("%s[%d][%d] = %g, want %g", names[k], r, c, got[r * C + c], want);
      }
  }
  // A box across block boundaries, into bf16: one rounding of the f32 product.
  const int64_t st[2] = {120, 100}, ln[2] = {10, 160};
  uint16_t *box = malloc(10 * 160 * 2);
  TT_OK(tpr_st_read(s, "q.weight", st, ln, TPR_BF16, box));
  for (int r = 0; r < 10; r++)
    for (int c = 0; c < 160; c++)
      assert_int_equal(box[r * 160 + c], tpr_f32_to_bf16(got[(120 + r) * C + 100 + c]));
  // Same dtype: the raw bytes, unscaled; no scale_inv: plain decode.
  uint8_t *raw = malloc(R * C);
  TT_OK(tpr_st_read(s, "q.weight", NULL, NULL, TPR_F8E4M3, raw));
  assert_memory_equal(raw, w, R * C);
  TT_OK(tpr_st_read_f32(s, "plain", (int64_t[]){129, 0}, (int64_t[]){1, C}, got));
  for (int c = 0; c < C; c++) assert_true(got[c] == tpr_f8e4m3_to_f32(w[129 * C + c]));
  tpr_st_close(s);

  // Another block size (config weight_block_size), and scale shapes that do not fit it.
  TT_OK(tpr_st_write(path, e, 2, NULL));
  TT_OK(tpr_st_open(path, &s));
  assert_int_equal(tpr_st_set_fp8_block(s, 0, 128), TPR_ERR_INVALID_ARG);
  TT_OK(tpr_st_set_fp8_block(s, 65, 130));  // (130, 260) in 65x130 blocks: scale (2, 2) needed
  expect_err(tpr_st_read_f32(s, "q.weight", NULL, NULL, got), TPR_ERR_FORMAT,
             "'q.weight_scale_inv' has shape [2, 3]; FP8 weight 'q.weight' (130, 260) in 65 x 130 blocks needs [2, 2]");
  TT_OK(tpr_st_set_fp8_block(s, 65, 100));  // scale (2, 3): 3 column blocks of 100, 100, 60
  TT_OK(tpr_st_read_f32(s, "q.weight", NULL, NULL, got));
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) assert_true(got[r * C + c] == tpr_f8e4m3_to_f32(w[r * C + c]) * scale[r / 65][c / 100]);
  tpr_st_close(s);

  int32_t iscale[6] = {0};
  tpr_st_write_entry bad[3] = {{"w", TPR_F8E4M3, 2, wshape, w},
                               {"w_scale_inv", TPR_I32, 2, sshape, iscale},
                               {"v", TPR_F8E4M3, 1, (int64_t[]){6}, w}};
  TT_OK(tpr_st_write(path, bad, 3, NULL));
  TT_OK(tpr_st_open(path, &s));
  expect_err(tpr_st_read_f32(s, "w", NULL, NULL, got), TPR_ERR_FORMAT, "'w_scale_inv' is I32; scales must be");
  tpr_st_close(s);
  bad[1] = (tpr_st_write_entry){"v_scale_inv", TPR_F32, 1, (int64_t[]){1}, scale};
  TT_OK(tpr_st_write(path, bad, 3, NULL));
  TT_OK(tpr_st_open(path, &s));
  expect_err(tpr_st_read_f32(s, "v", NULL, NULL, got), TPR_ERR_FORMAT, "FP8 tensor 'v' has 1 dims and a scale_inv");
  tpr_st_close(s);
  rm_tree(dir);
  free(w), free(got), free(box), free(raw), free(path), free(dir);
}

static size_t file_size(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 ? (size_t)st.st_size : 0;
}

static void test_atomic_write(void **state) {
  char *dir = tmp_dir(), *path = path_in(dir, "w.safetensors"), *nodir = path_in(dir, "no/such/dir/x.safetensors");
  float big[1000] = {1}, small[2] = {7, 8};
  tpr_st_write_entry eb[2] = {{"big", TPR_F32, 1, (int64_t[]){1000}, big}, {"b2", TPR_F32, 1, (int64_t[]){1}, big}};
  expect_err(tpr_st_write(nodir, eb, 2, NULL), TPR_ERR_IO, "cannot create");
  assert_int_equal(count_entries(dir), 0);
  TT_OK(tpr_st_write(path, eb, 2, NULL));
  size_t big_size = file_size(path);
  // Overwriting replaces the file whole: a shorter file leaves no tail.
  tpr_st_write_entry es = {"small", TPR_F32, 1, (int64_t[]){2}, small};
  TT_OK(tpr_st_write(path, &es, 1, NULL));
  assert_true(file_size(path) < big_size);
  tpr_st_set *s = NULL;
  TT_OK(tpr_st_open(path, &s));
  assert_int_equal(tpr_st_count(s), 1);
  assert_string_equal(tpr_st_get(s, 0)->name, "small");
  assert_int_equal(file_size(path), 8 + 64 + 8);  // 8 + header padded to 64 + data
  tpr_st_close(s);
  // Bad entries fail before anything is written; the old file stays.
  uint8_t *before;
  size_t before_len;
  TT_OK(tpr_file_read(path, &before, &before_len));
  tpr_st_write_entry dup[2] = {es, es};
  expect_err(tpr_st_write(path, dup, 2, NULL), TPR_ERR_INVALID_ARG, "tensor 'small' given twice");
  tpr_st_write_entry neg = {"n", TPR_F32, 1, (int64_t[]){-1}, small};
  expect_err(tpr_st_write(path, &neg, 1, NULL), TPR_ERR_INVALID_ARG, "tensor 'n': bad dim 0 = -1");
  tpr_st_write_entry meta = {"__metadata__", TPR_F32, 0, NULL, small};
  expect_err(tpr_st_write(path, &meta, 1, NULL), TPR_ERR_INVALID_ARG, "name '__metadata__' is not allowed");
  expect_err(tpr_st_write(path, &es, 1, (const char *[]){"a", "1", "k", NULL}), TPR_ERR_INVALID_ARG,
             "key 'k' has no value");
  expect_err(tpr_st_write(path, &es, 1, (const char *[]){"k", "1", "k", "2", NULL}), TPR_ERR_INVALID_ARG,
             "key 'k' given twice");
  // A rename that fails (the target is a directory) removes the temporary file.
  char *sub = path_in(dir, "sub");
  assert_int_equal(mkdir(sub, 0755), 0);
  expect_err(tpr_st_write(sub, &es, 1, NULL), TPR_ERR_IO, "cannot rename");
  uint8_t *after;
  size_t after_len;
  TT_OK(tpr_file_read(path, &after, &after_len));
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len);
  assert_int_equal(count_entries(dir), 2);  // w.safetensors and sub/, no temporary file
  assert_int_equal(count_entries(sub), 0);
  free(before), free(after);
  rm_tree(dir);
  free(sub), free(path), free(nodir), free(dir);
}

static tpr_dtype torch_dtype(const char *name) {
  const char *names[] = {"float32", "bfloat16", "float16", "float8_e4m3fn", "int32", "int64", "uint8"};
  for (int i = 0; i < NDT; i++)
    if (!strcmp(name, names[i])) return all_dtypes[i];
  fail_msg("unknown torch dtype %s", name);
  return TPR_F32;
}

// The fixture written by safetensors.torch: every value matches what torch
// computed (FP8 weights dequantized with their scale_inv), and tpr_st_write
// reproduces the reference writer's bytes exactly.
static void test_reference_fixture(void **state) {
  char *path = path_in(TPR_FIXTURES, "reference.safetensors"), *jpath = path_in(TPR_FIXTURES, "reference_safetensors.json");
  uint8_t *text, *ref;
  size_t len, ref_len;
  TT_OK(tpr_file_read(jpath, &text, &len));
  cJSON *root = cJSON_Parse((const char *)text);
  assert_non_null(root);
  const cJSON *tensors = cJSON_GetObjectItem(root, "tensors"), *jt;
  tpr_st_set *s = NULL;
  TT_OK(tpr_st_open(path, &s));
  assert_int_equal(tpr_st_count(s), cJSON_GetArraySize(tensors));
  assert_string_equal(tpr_st_metadata(s, "format"), "pt");
  tpr_st_write_entry e[32];
  int n = 0, nvalues = 0;
  cJSON_ArrayForEach(jt, tensors) {
    const tpr_st_tensor *t = tpr_st_find(s, jt->string);
    assert_non_null(t);
    assert_int_equal(t->dtype, torch_dtype(cJSON_GetObjectItem(jt, "dtype")->valuestring));
    const cJSON *shape = cJSON_GetObjectItem(jt, "shape"), *values = cJSON_GetObjectItem(jt, "values"), *v;
    assert_int_equal(t->ndim, cJSON_GetArraySize(shape));
    for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], cJSON_GetArrayItem(shape, d)->valueint);
    assert_int_equal(t->numel, cJSON_GetArraySize(values));
    float *f = malloc((size_t)t->numel * 4 + 4);
    int64_t *iv = malloc((size_t)t->numel * 8 + 8);
    TT_OK(tpr_st_read_f32(s, t->name, NULL, NULL, f));
    TT_OK(tpr_st_read(s, t->name, NULL, NULL, TPR_I64, iv));
    int i = 0;
    cJSON_ArrayForEach(v, values) {
      if (tpr_dtype_is_float(t->dtype)) {
        float want = (float)v->valuedouble;
        if (f[i] != want || signbit(f[i]) != signbit(want))
          fail_msg("%s[%d] = %a, reference %a", t->name, i, f[i], want);
      } else if (iv[i] != (int64_t)v->valuedouble) {
        fail_msg("%s[%d] = %lld, reference %.0f", t->name, i, (long long)iv[i], v->valuedouble);
      }
      i++, nvalues++;
    }
    free(f), free(iv);
    e[n++] = (tpr_st_write_entry){t->name, t->dtype, t->ndim, t->shape, t->data};
  }
  assert_true(nvalues > 700);  // the FP8 weight alone has 780
  char *dir = tmp_dir(), *copy = path_in(dir, "copy.safetensors");
  TT_OK(tpr_st_write(copy, e, n, (const char *[]){"format", "pt", NULL}));
  uint8_t *mine;
  size_t mine_len;
  TT_OK(tpr_file_read(copy, &mine, &mine_len));
  TT_OK(tpr_file_read(path, &ref, &ref_len));
  assert_int_equal(mine_len, ref_len);
  assert_memory_equal(mine, ref, ref_len);
  tpr_st_close(s);
  cJSON_Delete(root);
  rm_tree(dir);
  free(text), free(ref), free(mine), free(copy), free(dir), free(path), free(jpath);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_every_dtype),
      cmocka_unit_test(test_box_reads),
      cmocka_unit_test(test_sharded_index),
      cmocka_unit_test(test_directories_without_index),
      cmocka_unit_test(test_fp8_block_dequant),
      cmocka_unit_test(test_atomic_write),
      cmocka_unit_test(test_reference_fixture),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
