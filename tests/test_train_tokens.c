// Token streams (train/tokens.h): several shards read as their concatenation
// (across boundaries, windows included, bit for bit), glob order, the
// token-shard index's train/val splits and ":split" suffixes, loss masks
// (train/data.h turning unlearned targets into -100), and every refusal
// naming its file.
#define _GNU_SOURCE  // mkdtemp, nftw
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/file_io.h"
#include "test_util.h"
#include "train/data.h"
#include "train/npy.h"
#include "train/tokens.h"

static char dir[64];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }

static int setup(void **state) {
  snprintf(dir, sizeof dir, "/tmp/tpr_tokens_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

static const char *at(const char *name) {
  static char p[8][256];
  static int k;
  k = (k + 1) % 8;
  snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
  return p[k];
}

// n random ids < 1000 as descr ('<u2', '<u4', '<i4', '<i8') into file `name`;
// their int32 copy into out (n) when out is not NULL.
static void put_tokens(const char *name, const char *descr, int64_t n, int32_t *out) {
  int64_t *v = malloc((size_t)(n ? n : 1) * 8);
  uint8_t *b = malloc((size_t)(n ? n : 1) * 8);
  for (int64_t i = 0; i < n; i++) v[i] = tt_randint(0, 999);
  size_t sz = !strcmp(descr, "<u2") ? 2 : !strcmp(descr, "<i8") ? 8 : 4;
  for (int64_t i = 0; i < n; i++) {
    uint64_t x = (uint64_t)v[i];
    memcpy(b + i * sz, &x, sz);  // little-endian: the low bytes
    if (out) out[i] = (int32_t)v[i];
  }
  TT_OK(tpr_npy_write(at(name), descr, b, n));
  free(v), free(b);
}

static void put_mask(const char *name, int64_t n, uint8_t *out) {
  uint8_t *m = malloc((size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) m[i] = (uint8_t)tt_randint(0, 1);
  TT_OK(tpr_npy_write(at(name), "|u1", m, n));
  if (out) memcpy(out, m, (size_t)n);
  free(m);
}

static tpr_tokens *open_ok(const char *spec, const char *split, bool masks) {
  tpr_tokens *t;
  TT_OK(tpr_tokens_open(spec, &(tpr_tokens_opts){.split = split, .masks = masks}, &t));
  return t;
}

static void expect_bad(const char *spec, const char *split, bool masks, tpr_status want, const char *msg) {
  tpr_tokens *t = (tpr_tokens *)1;
  tpr_status rc = tpr_tokens_open(spec, &(tpr_tokens_opts){.split = split, .masks = masks}, &t);
  printf("  refused: %s\n", tpr_last_error());
  assert_int_equal(rc, want);
  assert_null(t);
  if (!strstr(tpr_last_error(), msg)) fail_msg("'%s' not in '%s'", msg, tpr_last_error());
}

// Shards a (u2, 37), b (i8, 0: empty), c (u4, 50), d (i4, 21) read as the
// concatenation at every (start, count), and train/data.h's windows of the
// list equal those of the single concatenated file in both orders.
static void test_concat(void **state) {
  enum { N = 37 + 0 + 50 + 21, T = 8 };
  int32_t all[N], got[N];
  put_tokens("a.npy", "<u2", 37, all);
  put_tokens("b.npy", "<i8", 0, NULL);
  put_tokens("c.npy", "<u4", 50, all + 37);
  put_tokens("d.npy", "<i4", 21, all + 87);
  TT_OK(tpr_npy_write_i32(at("whole.npy"), all, N));
  char spec[1024];
  snprintf(spec, sizeof spec, "%s,%s,%s,%s", at("a.npy"), at("b.npy"), at("c.npy"), at("d.npy"));
  tpr_tokens *t = open_ok(spec, "train", false), *w = open_ok(at("whole.npy"), "train", false);
  assert_int_equal(tpr_tokens_len(t), N);
  assert_int_equal(tpr_tokens_files(t), 4);
  for (int s = 0; s <= N; s++)
    for (int c = 0; s + c <= N; c++) {
      memset(got, 0xff, sizeof got);
      TT_OK(tpr_tokens_read_i32(t, s, c, got));
      assert_memory_equal(got, all + s, (size_t)c * sizeof *got);
    }
  assert_int_equal(tpr_tokens_read_i32(t, N - 1, 2, got), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_tokens_read_mask(t, 0, 1, got), TPR_ERR_INVALID_ARG);  // opened without masks
  for (int order = 0; order < 2; order++) {
    tpr_data_config c = {.seq_len = T, .micro_batch = 2, .accum = 3, .dp = 2, .order = order, .seed = 7};
    tpr_data *d1, *d2;
    TT_OK(tpr_data_create(t, &c, 1000, &d1));
    TT_OK(tpr_data_create(w, &c, 1000, &d2));
    for (int64_t step = 0; step < 4; step++)
      for (int m = 0; m < 3; m++)
        for (int r = 0; r < 2; r++)
          for (int b = 0; b < 2; b++) {
            int32_t i1[T], t1[T], i2[T], t2[T];
            TT_OK(tpr_data_window(d1, step, m, r, b, i1, t1));
            TT_OK(tpr_data_window(d2, step, m, r, b, i2, t2));
            assert_memory_equal(i1, i2, sizeof i1);
            assert_memory_equal(t1, t2, sizeof t1);
          }
    tpr_data_free(d1), tpr_data_free(d2);
  }
  // Every id is checked against the vocabulary: the file and its position named.
  int32_t e[6] = {1, 2, 3, 1000, 4, 5};
  TT_OK(tpr_npy_write_i32(at("e.npy"), e, 6));
  snprintf(spec, sizeof spec, "%s,%s", at("a.npy"), at("e.npy"));
  tpr_tokens *bad = open_ok(spec, "train", false);
  tpr_data_config c = {.seq_len = T, .micro_batch = 1, .accum = 1, .dp = 1};
  tpr_data *d;
  assert_int_equal(tpr_data_create(bad, &c, 1000, &d), TPR_ERR_INVALID_ARG);
  printf("  vocabulary check: %s\n", tpr_last_error());
  assert_non_null(strstr(tpr_last_error(), "e.npy: token at position 3 is 1000, outside the vocabulary [0, 1000)"));
  tpr_tokens_close(bad);
  tpr_tokens_close(t), tpr_tokens_close(w);
  printf("concat: 4 shards (u2, empty i8, u4, i4) = the concatenated file at every range and window\n");
}

// A glob expands sorted (byte order), skipping masks and document offsets;
// no match is refused naming the pattern.
static void test_glob(void **state) {
  int32_t v[3][10];
  put_tokens("s.2.npy", "<u2", 10, v[2]);  // written out of order
  put_tokens("s.0.npy", "<u2", 10, v[0]);
  put_tokens("s.10.npy", "<u2", 10, v[1]);  // "s.10" < "s.2" in byte order
  put_mask("s.0.mask.npy", 10, NULL);
  put_tokens("s.0.docs.npy", "<i8", 2, NULL);
  char pat[300];
  snprintf(pat, sizeof pat, "%s/s.*.npy", dir);
  tpr_tokens *t = open_ok(pat, "train", false);
  assert_int_equal(tpr_tokens_files(t), 3);
  assert_string_equal(tpr_tokens_file(t, 0), at("s.0.npy"));
  assert_string_equal(tpr_tokens_file(t, 1), at("s.10.npy"));
  assert_string_equal(tpr_tokens_file(t, 2), at("s.2.npy"));
  int32_t got[30];
  TT_OK(tpr_tokens_read_i32(t, 0, 30, got));
  assert_memory_equal(got, v, sizeof got);
  tpr_tokens_close(t);
  snprintf(pat, sizeof pat, "%s/nothing*.npy", dir);
  expect_bad(pat, "train", false, TPR_ERR_INVALID_ARG, "matches no file");
  snprintf(pat, sizeof pat, "%s/s.0.*.npy", dir);  // only the companions
  expect_bad(pat, "train", false, TPR_ERR_INVALID_ARG, "matches only .mask.npy");
  // A glob of files with masks, asked for them: s.10 and s.2 have none.
  snprintf(pat, sizeof pat, "%s/s.*.npy", dir);
  expect_bad(pat, "train", true, TPR_ERR_IO, "s.10.mask.npy");
  printf("glob: sorted, companions skipped, no match refused\n");
}

// An index as `tpr data prepare` writes it: train shards x.train.0000{0,1},
// val x.val.00000 (the shard lists and totals given); `top` holds the
// "format" and "version" keys.
static void put_index(const char *name, const char *top, const char *train_shards, const char *val_shards,
                      int64_t train_tokens, int64_t val_tokens) {
  char text[4096];
  snprintf(text, sizeof text,
           "{%s, \"tokenizer\": \"t.json\", \"vocab_size\": 1000, \"dtype\": \"uint16\", \"eos_id\": null,\n"
           " \"append_eos\": true, \"chat\": true, \"seed\": 0, \"val_fraction\": 0.1,\n"
           " \"splits\": {\"train\": {\"tokens\": %lld, \"documents\": 2, \"shards\": [%s]},\n"
           "            \"val\": {\"tokens\": %lld, \"documents\": 1, \"shards\": [%s]}}}\n",
           top, (long long)train_tokens, train_shards, (long long)val_tokens, val_shards);
  TT_OK(tpr_file_write(at(name), (const uint8_t *)text, strlen(text)));
}

#define FMT_OK "\"format\": \"tpr-token-shards\", \"version\": 1"
#define SHARD(f, n) "{\"tokens_file\": \"" f ".npy\", \"docs_file\": \"" f ".docs.npy\", \"mask_file\": \"" f ".mask.npy\", \"tokens\": " #n ", \"documents\": 1}"

static void test_index(void **state) {
  int32_t tr[40 + 25], va[30];
  uint8_t mtr[65], mva[30];
  put_tokens("x.train.00000.npy", "<u2", 40, tr);
  put_mask("x.train.00000.mask.npy", 40, mtr);
  put_tokens("x.train.00001.npy", "<u2", 25, tr + 40);
  put_mask("x.train.00001.mask.npy", 25, mtr + 40);
  put_tokens("x.val.00000.npy", "<u2", 30, va);
  put_mask("x.val.00000.mask.npy", 30, mva);
  const char *train = SHARD("x.train.00000", 40) ", " SHARD("x.train.00001", 25);
  const char *val = SHARD("x.val.00000", 30);
  put_index("x.json", FMT_OK, train, val, 65, 30);
  char spec[300];
  int32_t got[65], mask[65];
  // The caller's default split, and the suffix overriding it.
  const char *specs[4] = {"x.json", "x.json", "x.json:train", "x.json:val"};
  const char *splits[4] = {"train", "val", "val", "train"};
  const bool is_train[4] = {true, false, true, false};
  for (int k = 0; k < 4; k++) {
    tpr_tokens *t = open_ok(at(specs[k]), splits[k], true);
    int64_t n = is_train[k] ? 65 : 30;
    assert_int_equal(tpr_tokens_len(t), n);
    TT_OK(tpr_tokens_read_i32(t, 0, n, got));
    TT_OK(tpr_tokens_read_mask(t, 0, n, mask));
    assert_memory_equal(got, is_train[k] ? tr : va, (size_t)n * sizeof *got);
    for (int64_t i = 0; i < n; i++) assert_int_equal(mask[i], (is_train[k] ? mtr : mva)[i]);
    tpr_tokens_close(t);
  }
  // Masked windows: target t of window w is kept iff mask[w*T + t + 1] == 1.
  {
    enum { T = 8 };
    tpr_tokens *t = open_ok(at("x.json"), "train", true);
    tpr_data_config c = {.seq_len = T, .micro_batch = 1, .accum = 1, .dp = 1, .masked = true};
    tpr_data *d;
    TT_OK(tpr_data_create(t, &c, 1000, &d));
    int masked = 0;
    for (int64_t s = 0; s < 8; s++) {
      int32_t in[T], tg[T];
      TT_OK(tpr_data_window(d, s, 0, 0, 0, in, tg));
      for (int i = 0; i < T; i++) {
        int64_t p = (s % 8) * T + i + 1;
        assert_int_equal(in[i], tr[p - 1]);
        assert_int_equal(tg[i], mtr[p] ? tr[p] : -100);
        masked += !mtr[p];
      }
    }
    assert_true(masked > 0 && masked < 64);
    tpr_data_free(d);
    tpr_tokens_close(t);
    tpr_tokens *u = open_ok(at("x.json"), "train", false);  // no masks opened: masked data refused
    assert_int_equal(tpr_data_create(u, &c, 1000, &d), TPR_ERR_INVALID_ARG);
    tpr_tokens_close(u);
  }
  // Refusals, each naming its file.
  snprintf(spec, sizeof spec, "%s", at("bad.json"));
  put_index("bad.json", "\"format\": \"other\", \"version\": 1", train, val, 65, 30);
  expect_bad(spec, "train", false, TPR_ERR_FORMAT, "bad.json: \"format\" is other");
  put_index("bad.json", "\"format\": \"tpr-token-shards\", \"version\": 2", train, val, 65, 30);
  expect_bad(spec, "train", false, TPR_ERR_FORMAT, "bad.json: \"version\" 2 is not supported");
  put_index("bad.json", FMT_OK, train, "", 65, 0);
  expect_bad(spec, "val", false, TPR_ERR_INVALID_ARG, "bad.json: split \"val\" is empty");
  put_index("bad.json", FMT_OK, train, SHARD("x.val.missing", 30), 65, 30);
  expect_bad(spec, "val", false, TPR_ERR_IO, "x.val.missing.npy: No such file or directory (shard 0 of split \"val\"");
  put_index("bad.json", FMT_OK, SHARD("x.train.00000", 41), val, 41, 30);  // shape mismatch
  expect_bad(spec, "train", false, TPR_ERR_FORMAT, "x.train.00000.npy: shape (40,), but its index says 41 tokens");
  put_index("bad.json", FMT_OK, SHARD("x.train.00000", 40), val, 65, 30);  // the split total
  expect_bad(spec, "train", false, TPR_ERR_FORMAT, "split \"train\" says 65 tokens, its shards hold 40");
  put_tokens("x.u4.npy", "<u4", 40, NULL);
  put_index("bad.json", FMT_OK, SHARD("x.u4", 40), val, 40, 30);  // dtype mismatch
  expect_bad(spec, "train", false, TPR_ERR_FORMAT, "x.u4.npy: dtype '<u4', but its index says '<u2'");
  put_index("bad.json", FMT_OK, "{\"tokens_file\": \"x.train.00000.npy\", \"tokens\": 40}", val, 40, 30);
  expect_bad(spec, "train", true, TPR_ERR_INVALID_ARG, "bad.json: shard 0 has no \"mask_file\"");
  put_index("bad.json", FMT_OK, "{\"tokens_file\": \"../x.train.00000.npy\", \"tokens\": 40}", val, 40, 30);
  expect_bad(spec, "train", false, TPR_ERR_FORMAT, "is not a plain file name");
  TT_OK(tpr_file_write(at("bad.json"), (const uint8_t *)"{\"format\": ", 11));
  expect_bad(spec, "train", false, TPR_ERR_FORMAT, "bad.json: not a JSON object");
  expect_bad(at("none.json"), "train", false, TPR_ERR_IO, "none.json");
  expect_bad(at("x.json:dev"), "train", false, TPR_ERR_INVALID_ARG, "unknown split 'dev'");
  // Masks: the wrong dtype, the wrong length, a value other than 0/1.
  put_tokens("m.npy", "<u2", 12, NULL);
  put_tokens("m.mask.npy", "<u2", 12, NULL);
  expect_bad(at("m.npy"), "train", true, TPR_ERR_FORMAT, "m.mask.npy: a loss mask must be '|u1'");
  put_mask("m.mask.npy", 11, NULL);
  expect_bad(at("m.npy"), "train", true, TPR_ERR_FORMAT, "m.mask.npy: 11 mask values for the 12 tokens");
  uint8_t two[12] = {0, 1, 2};
  TT_OK(tpr_npy_write(at("m.mask.npy"), "|u1", two, 12));
  expect_bad(at("m.npy"), "train", true, TPR_ERR_FORMAT, "m.mask.npy: mask value 2 at position 2");
  expect_bad(at("x.val.00000.mask.npy"), "train", false, TPR_ERR_FORMAT, "token dtype '|u1'");  // a mask as tokens
  snprintf(spec, sizeof spec, "%s,", at("m.npy"));
  expect_bad(spec, "train", false, TPR_ERR_INVALID_ARG, "an empty item");
  printf("index: train/val splits and suffixes, masked windows, refusals named\n");
}

// Document offsets (X.docs.npy beside X.npy): the starts of two files read
// back as stream positions at every (start, count), empty documents starting
// nowhere; a file without offsets leaves the stream without; malformed
// offsets are refused naming the file.
static void test_doc_starts(void **state) {
  put_tokens("p.npy", "<u2", 30, NULL);
  put_tokens("q.npy", "<i4", 25, NULL);
  const int64_t p_off[] = {0, 7, 7, 19, 30}, q_off[] = {0, 1, 25};  // p: an empty document at 7
  TT_OK(tpr_npy_write(at("p.docs.npy"), "<i8", p_off, 5));
  TT_OK(tpr_npy_write(at("q.docs.npy"), "<i8", q_off, 3));
  char spec[600];
  snprintf(spec, sizeof spec, "%s,%s", at("p.npy"), at("q.npy"));
  tpr_tokens *t;
  TT_OK(tpr_tokens_open(spec, &(tpr_tokens_opts){.split = "train", .docs = true}, &t));
  assert_true(tpr_tokens_has_docs(t));
  uint8_t want[56] = {0}, got[56];
  want[0] = want[7] = want[19] = want[30] = want[31] = 1;  // q's starts at 30 + 0, 30 + 1
  for (int64_t a = 0; a <= 55; a++)
    for (int64_t n = 0; a + n <= 56; n++) {  // position 55 is past the end: never a start
      memset(got, 7, sizeof got);
      TT_OK(tpr_tokens_doc_starts(t, a, n, got));
      assert_memory_equal(got, want + a, (size_t)n);
    }
  tpr_tokens_close(t);
  // Not asked for, or one file without offsets: none.
  TT_OK(tpr_tokens_open(spec, &(tpr_tokens_opts){.split = "train"}, &t));
  assert_false(tpr_tokens_has_docs(t));
  tpr_tokens_close(t);
  put_tokens("r.npy", "<u2", 5, NULL);
  snprintf(spec, sizeof spec, "%s,%s", at("p.npy"), at("r.npy"));
  TT_OK(tpr_tokens_open(spec, &(tpr_tokens_opts){.split = "train", .docs = true}, &t));
  assert_false(tpr_tokens_has_docs(t));
  assert_int_not_equal(tpr_tokens_doc_starts(t, 0, 1, got), TPR_OK);
  tpr_tokens_close(t);
  // Malformed: not starting at 0, decreasing, not ending at the token count, not '<i8'.
  const int64_t bad[][4] = {{1, 7, 19, 30}, {0, 19, 7, 30}, {0, 7, 19, 29}};
  for (int k = 0; k < 3; k++) {
    TT_OK(tpr_npy_write(at("p.docs.npy"), "<i8", bad[k], 4));
    tpr_status rc = tpr_tokens_open(at("p.npy"), &(tpr_tokens_opts){.split = "train", .docs = true}, &t);
    assert_int_equal(rc, TPR_ERR_FORMAT);
    assert_non_null(strstr(tpr_last_error(), "p.docs.npy"));
  }
  const int32_t narrow[] = {0, 7, 19, 30};
  TT_OK(tpr_npy_write(at("p.docs.npy"), "<i4", narrow, 4));
  assert_int_equal(tpr_tokens_open(at("p.npy"), &(tpr_tokens_opts){.split = "train", .docs = true}, &t),
                   TPR_ERR_FORMAT);
  assert_non_null(strstr(tpr_last_error(), "'<i8'"));
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_concat, setup, teardown),
      cmocka_unit_test_setup_teardown(test_glob, setup, teardown),
      cmocka_unit_test_setup_teardown(test_index, setup, teardown),
      cmocka_unit_test_setup_teardown(test_doc_starts, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
