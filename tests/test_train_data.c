// Token files and batches (train/npy.h, train/data.h): .npy round trips of
// every accepted dtype and format version, every malformed header as
// TPR_ERR_FORMAT naming the file, ids outside the vocabulary, and the
// deterministic window order (sequential and per-epoch shuffled).
#define _GNU_SOURCE  // mkdtemp, nftw
#include <dirent.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/file_io.h"
#include "test_util.h"
#include "train/data.h"
#include "train/npy.h"
#include "train/tokens.h"

// ---- .npy token files ---------------------------------------------------

static char dir[64], path[128];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }

static int setup(void **state) {
  snprintf(dir, sizeof dir, "/tmp/tpr_train_XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(path, sizeof path, "%s/tokens.npy", dir);
  return 0;
}

static int teardown(void **state) {
  nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

// Writes path per the npy spec: magic, version, header length (u16 for
// 1.0, u32 otherwise; `hlen` < 0 means the true length), the header text
// padded with spaces and a '\n' to a multiple of 64 (pad == false: the text
// as given), then `dlen` data bytes.
static void put_raw(int major, const char *text, bool pad, long long hlen, const void *data, size_t dlen) {
  size_t pre = major == 1 ? 10 : 12, tl = strlen(text), hl = tl;
  if (pad) {
    hl = tl + 1;
    while ((pre + hl) % 64) hl++;
  }
  uint8_t *b = calloc(pre + hl + dlen + 1, 1);
  memcpy(b, "\x93NUMPY", 6);
  b[6] = (uint8_t)major;
  uint64_t h = hlen < 0 ? hl : (uint64_t)hlen;
  for (size_t i = 0; i < pre - 8; i++) b[8 + i] = (uint8_t)(h >> (8 * i));
  memcpy(b + pre, text, tl);
  if (pad) {
    memset(b + pre + tl, ' ', hl - tl - 1);
    b[pre + hl - 1] = '\n';
  }
  if (dlen) memcpy(b + pre + hl, data, dlen);
  TT_OK(tpr_file_write(path, b, pre + hl + dlen));
  free(b);
}

static void put_npy(int major, const char *descr, int64_t n, const void *data, size_t itemsize) {
  char text[160];
  snprintf(text, sizeof text, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", descr, (long long)n);
  put_raw(major, text, true, -1, data, (size_t)n * itemsize);
}

static void test_npy_round_trip(void **state) {
  enum { N = 300 };
  uint16_t u2[N];
  uint32_t u4[N];
  int32_t i4[N];
  int64_t i8[N], want[5][N];
  uint8_t u1[N];
  for (int i = 0; i < N; i++) {
    want[4][i] = u1[i] = (uint8_t)tt_randint(0, 255);
    want[0][i] = u2[i] = (uint16_t)tt_randint(0, 65535);
    want[1][i] = u4[i] = (uint32_t)tt_randint(0, 4294967295LL);
    want[2][i] = i4[i] = (int32_t)tt_randint(0, INT32_MAX);
    want[3][i] = i8[i] = tt_randint(0, INT64_MAX / 2);
  }
  u2[7] = 65535, want[0][7] = 65535;  // the top of each unsigned range
  u4[7] = 4294967295u, want[1][7] = 4294967295LL;
  const char *descr[5] = {"<u2", "<u4", "<i4", "<i8", "|u1"};  // |u1: loss masks
  const void *data[5] = {u2, u4, i4, i8, u1};
  size_t size[5] = {2, 4, 4, 8, 1};
  for (int major = 1; major <= 3; major++) {
    for (int k = 0; k < 5; k++) {
      put_npy(major, descr[k], N, data[k], size[k]);
      tpr_npy *t;
      TT_OK(tpr_npy_open(path, &t));
      assert_int_equal(tpr_npy_len(t), N);
      assert_string_equal(tpr_npy_descr(t), descr[k]);
      for (int i = 0; i < N; i++) {
        int64_t v;
        TT_OK(tpr_npy_get(t, i, &v));
        assert_true(v == want[k][i]);
      }
      int64_t v;
      assert_int_equal(tpr_npy_get(t, N, &v), TPR_ERR_INVALID_ARG);
      tpr_npy_close(t);
    }
  }
  // Other spellings np.load accepts: double quotes, other key order, no
  // trailing comma, spaces inside the tuple; and an empty array.
  put_raw(1, "{\"shape\": ( 3 , ), \"fortran_order\": False, \"descr\": \"<u2\"}", true, -1, u2, 6);
  tpr_npy *t;
  TT_OK(tpr_npy_open(path, &t));
  assert_int_equal(tpr_npy_len(t), 3);
  tpr_npy_close(t);
  put_npy(1, "<i4", 0, NULL, 4);
  TT_OK(tpr_npy_open(path, &t));
  assert_int_equal(tpr_npy_len(t), 0);
  tpr_npy_close(t);
  // tpr_npy_write_i32: readable back, header aligned as np.save aligns it,
  // no temporary file left behind.
  TT_OK(tpr_npy_write_i32(path, i4, N));
  TT_OK(tpr_npy_open(path, &t));
  assert_string_equal(tpr_npy_descr(t), "<i4");
  int32_t back[N];
  TT_OK(tpr_npy_read_i32(t, 0, N, back));
  assert_memory_equal(back, i4, sizeof back);
  tpr_npy_close(t);
  uint8_t *bytes;
  size_t len;
  TT_OK(tpr_file_read(path, &bytes, &len));
  assert_int_equal((len - N * 4) % 64, 0);
  free(bytes);
  int files = 0;
  DIR *dh = opendir(dir);
  for (struct dirent *e; dh && (e = readdir(dh));) files += e->d_name[0] != '.';
  if (dh) closedir(dh);
  assert_int_equal(files, 1);  // tokens.npy alone
  // u4 values above INT32_MAX read as int64 but not as int32.
  put_npy(1, "<u4", N, u4, 4);
  TT_OK(tpr_npy_open(path, &t));
  assert_int_equal(tpr_npy_read_i32(t, 0, N, back), TPR_ERR_INVALID_ARG);
  tpr_npy_close(t);
  printf("npy: <u2 <u4 <i4 <i8 round trips in format 1.0/2.0/3.0, writer output read back\n");
}

// Files written by numpy itself (scripts/reference/make_npy_fixture.py).
static void test_npy_numpy_files(void **state) {
  const int64_t want[5] = {5, 0, 1, 2, 65535};
  const char *dts[4] = {"u2", "u4", "i4", "i8"};
  int files = 0;
  for (int k = 0; k < 4; k++)
    for (int major = 1; major <= 3; major++) {
      char p[512];
      snprintf(p, sizeof p, "%s/npy/tokens_%s_v%d.npy", TPR_FIXTURES, dts[k], major);
      tpr_npy *t;
      TT_OK(tpr_npy_open(p, &t));
      assert_int_equal(tpr_npy_len(t), 5);
      assert_true(tpr_npy_descr(t)[0] == '<' && !strcmp(tpr_npy_descr(t) + 1, dts[k]));
      for (int i = 0; i < 5; i++) {
        int64_t v;
        TT_OK(tpr_npy_get(t, i, &v));
        assert_true(v == want[i]);
      }
      TT_OK(tpr_npy_check_range(t, 65536));
      assert_int_equal(tpr_npy_check_range(t, 65535), TPR_ERR_INVALID_ARG);
      tpr_npy_close(t);
      files++;
    }
  printf("npy: %d files written by numpy (4 dtypes x versions 1.0/2.0/3.0) read back exactly\n", files);
}

static void expect_bad(const char *what, const char *msg) {
  tpr_npy *t = NULL;
  tpr_status rc = tpr_npy_open(path, &t);
  if (rc != TPR_ERR_FORMAT)
    fail_msg("%s: got %s, want TPR_ERR_FORMAT (%s)", what, tpr_status_name(rc), rc ? tpr_last_error() : "-");
  assert_null(t);
  if (!strstr(tpr_last_error(), msg)) fail_msg("%s: expected '%s' in '%s'", what, msg, tpr_last_error());
  if (!strstr(tpr_last_error(), path)) fail_msg("%s: expected the path in '%s'", what, tpr_last_error());
}

static void test_npy_malformed(void **state) {
  uint16_t d[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const char *ok = "{'descr': '<u2', 'fortran_order': False, 'shape': (8,), }";
  put_raw(1, ok, true, -1, d, 16);
  tpr_npy *t;
  TT_OK(tpr_npy_open(path, &t));  // the control: this one is fine
  tpr_npy_close(t);
  TT_OK(tpr_file_write(path, (const uint8_t *)"\x93NUMPZ\x01\x00\x10\x00{}", 12));
  expect_bad("bad magic", "bad magic");
  TT_OK(tpr_file_write(path, (const uint8_t *)"\x93NUMPY\x01\x00\x40", 9));
  expect_bad("truncated header", "truncated");  // shorter than the fixed preamble
  TT_OK(tpr_file_write(path, (const uint8_t *)"\x93NUMPY\x02\x00\x40\x00", 10));
  expect_bad("truncated 2.0 preamble", "truncated");
  put_raw(1, ok, true, 4000, d, 16);
  expect_bad("header length past EOF", "past the end");
  put_raw(2, ok, true, 1LL << 31, d, 16);
  expect_bad("2.0 header length past EOF", "past the end");
  put_raw(4, ok, true, -1, d, 16);
  expect_bad("version 4.0", "version 4.0");
  put_raw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", true, -1, d, 16);
  expect_bad("<f4", "'<f4' not supported");
  put_raw(1, "{'descr': '>u2', 'fortran_order': False, 'shape': (8,), }", true, -1, d, 16);
  expect_bad(">u2", "'>u2' not supported");
  put_raw(1, "{'descr': '|i1', 'fortran_order': False, 'shape': (16,), }", true, -1, d, 16);
  expect_bad("|i1", "'|i1' not supported");
  put_raw(1, "{'descr': '<u2', 'fortran_order': True, 'shape': (8,), }", true, -1, d, 16);
  expect_bad("fortran", "fortran_order True");
  put_raw(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 4), }", true, -1, d, 16);
  expect_bad("2-D", "must be 1-D");
  put_raw(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (), }", true, -1, d, 16);
  expect_bad("0-D", "must be 1-D");
  put_raw(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (9,), }", true, -1, d, 16);
  expect_bad("size short", "needs 18");
  put_raw(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (7,), }", true, -1, d, 16);
  expect_bad("size long", "needs 14");
  put_raw(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (99999999999999999999,), }", true, -1, d, 16);
  expect_bad("huge shape", "too large");
  struct { const char *text, *msg; } garbage[] = {
      {"hello world", "not a dict"},
      {"{'descr': '<u2' 'fortran_order': False, 'shape': (8,), }", "expected ','"},
      {"{'descr': '<u2', 'fortran_order': False}", "missing key 'shape'"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (8,), 'x': 1}", "unexpected key 'x'"},
      {"{'descr': '<u2', 'descr': '<u2', 'fortran_order': False, 'shape': (8,)}", "given twice"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (8)}", "not a tuple"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': [8]}", "must be a tuple"},
      {"{'descr': '<u2', 'fortran_order': false, 'shape': (8,)}", "True or False"},
      {"{'descr': '<u2, 'fortran_order': False, 'shape': (8,)}", "expected ',' or '}' after 'descr'"},
      {"{'descr' '<u2', 'fortran_order': False, 'shape': (8,)}", "expected ':'"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (8,)} x", "trailing"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (-8,)}", "non-integer"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (8,)", "expected ','"},
  };
  for (size_t k = 0; k < sizeof garbage / sizeof *garbage; k++) {
    put_raw(1, garbage[k].text, true, -1, d, 16);
    expect_bad(garbage[k].text, garbage[k].msg);
  }
  put_raw(1, ok, false, -1, d, 16);
  expect_bad("no newline", "newline");
  // Random byte edits of the preamble and header never crash (sanitizer
  // build) and give either a valid open or TPR_ERR_FORMAT.
  int opened = 0;
  for (int it = 0; it < 400; it++) {
    put_raw(1 + (it % 3), ok, true, -1, d, 16);
    uint8_t *b;
    size_t len;
    TT_OK(tpr_file_read(path, &b, &len));
    for (int e = 0; e < 1 + it % 4; e++) b[tt_randint(0, (int64_t)len - 17)] = (uint8_t)tt_randint(0, 255);
    TT_OK(tpr_file_write(path, b, len));
    free(b);
    tpr_status rc = tpr_npy_open(path, &t);
    if (rc == TPR_OK) opened++, tpr_npy_close(t);
    else if (rc != TPR_ERR_FORMAT) fail_msg("corruption %d: %s: %s", it, tpr_status_name(rc), tpr_last_error());
  }
  printf("npy: every malformed case is TPR_ERR_FORMAT naming the file; %d of 400 random edits still valid\n",
         opened);
}

static void test_npy_range(void **state) {
  int32_t v[50];
  for (int i = 0; i < 50; i++) v[i] = (int32_t)tt_randint(0, 99);
  TT_OK(tpr_npy_write_i32(path, v, 50));
  tpr_npy *t;
  TT_OK(tpr_npy_open(path, &t));
  TT_OK(tpr_npy_check_range(t, 100));
  tpr_npy_close(t);
  v[31] = 100;
  v[40] = 250;
  TT_OK(tpr_npy_write_i32(path, v, 50));
  TT_OK(tpr_npy_open(path, &t));
  assert_int_equal(tpr_npy_check_range(t, 100), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "position 31 is 100"));
  tpr_npy_close(t);
  v[31] = -3;
  TT_OK(tpr_npy_write_i32(path, v, 50));
  TT_OK(tpr_npy_open(path, &t));
  assert_int_equal(tpr_npy_check_range(t, 100), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "position 31 is -3"));
  printf("npy: ids outside [0, vocab) named by position and value: %s\n", tpr_last_error());
  assert_int_equal(tpr_npy_check_range(t, 0), TPR_ERR_INVALID_ARG);
  tpr_npy_close(t);
}

// ---- batches ------------------------------------------------------------

enum { T = 8, W = 37 };  // 37 windows: not a multiple of the 8 rows per step

// A token file whose token at position p is p (plus a tail shorter than a
// window), so a window is recognised by its first input: w = inputs[0] / T.
static void data_open(tpr_data_order order, uint64_t seed, tpr_tokens **t, tpr_data **d) {
  int64_t n = (int64_t)W * T + 1 + 5;
  int32_t *v = malloc(n * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = (int32_t)i;
  TT_OK(tpr_npy_write_i32(path, v, n));
  free(v);
  TT_OK(tpr_tokens_open(path, NULL, t));
  tpr_data_config c = {.seq_len = T, .micro_batch = 2, .accum = 2, .dp = 2, .order = order, .seed = seed};
  TT_OK(tpr_data_create(*t, &c, n, d));
  assert_int_equal(tpr_data_windows(*d), W);
}

// Windows of the 8 rows of `step`, in (m, dp rank, row) order; checks every
// row's inputs and targets against its window.
static void step_windows(tpr_data *d, int64_t step, int64_t out[8]) {
  int k = 0;
  for (int m = 0; m < 2; m++)
    for (int r = 0; r < 2; r++)
      for (int b = 0; b < 2; b++) {
        int32_t in[T], tg[T];
        TT_OK(tpr_data_window(d, step, m, r, b, in, tg));
        int64_t w = in[0] / T;
        for (int t = 0; t < T; t++)
          if (in[t] != w * T + t || tg[t] != w * T + t + 1) fail_msg("step %lld row %d: not window %lld", (long long)step, k, (long long)w);
        out[k++] = w;
      }
}

static void test_data_sequential(void **state) {
  tpr_tokens *t;
  tpr_data *d;
  data_open(TPR_DATA_SEQUENTIAL, 0, &t, &d);
  for (int64_t s = 0; s < 20; s++) {
    int64_t w[8];
    step_windows(d, s, w);
    for (int k = 0; k < 8; k++) assert_int_equal(w[k], (s * 8 + k) % W);  // i = ((s*2+m)*2+r)*2+b
    if ((s * 8) % W <= W - 8)  // a step that does not wrap: its 8 windows are distinct
      for (int a = 0; a < 8; a++)
        for (int b = a + 1; b < 8; b++) assert_true(w[a] != w[b]);
  }
  int32_t in[T], tg[T];
  assert_int_equal(tpr_data_window(d, 0, 2, 0, 0, in, tg), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_data_window(d, 0, 0, 2, 0, in, tg), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_data_window(d, -1, 0, 0, 0, in, tg), TPR_ERR_INVALID_ARG);
  tpr_data_free(d);
  tpr_tokens_close(t);
  printf("data sequential: 20 steps x 8 rows map to window ((s*accum+m)*dp+d)*mb+b mod %d exactly\n", W);
}

// Windows of global rows [0, 3W) (three epochs) for a seed.
static void random_rows(uint64_t seed, int64_t *w) {
  tpr_tokens *t;
  tpr_data *d;
  data_open(TPR_DATA_RANDOM, seed, &t, &d);
  int64_t steps = (3 * W + 7) / 8, buf[8];
  for (int64_t s = 0; s < steps; s++) {
    step_windows(d, s, buf);
    for (int k = 0; k < 8 && s * 8 + k < 3 * W; k++) w[s * 8 + k] = buf[k];
  }
  tpr_data_free(d);
  tpr_tokens_close(t);
}

static void test_data_random(void **state) {
  int64_t a[3 * W], b[3 * W], c[3 * W];
  random_rows(1234, a);
  random_rows(1234, b);
  random_rows(1235, c);
  assert_memory_equal(a, b, sizeof a);  // deterministic for a seed (fresh objects)
  int diff_seed = 0, diff_epoch = 0, not_identity = 0;
  for (int e = 0; e < 3; e++) {
    int seen[W] = {0};
    for (int k = 0; k < W; k++) seen[a[e * W + k]]++;
    for (int k = 0; k < W; k++) assert_int_equal(seen[k], 1);  // every window once per epoch
  }
  for (int k = 0; k < 3 * W; k++) diff_seed += a[k] != c[k];
  for (int k = 0; k < W; k++) diff_epoch += a[k] != a[W + k], not_identity += a[k] != k;
  printf("data random: each epoch a permutation of %d windows; another seed changes %d of %d rows, "
         "epoch 1 vs 0 differs in %d, epoch 0 moves %d windows\n",
         W, diff_seed, 3 * W, diff_epoch, not_identity);
  assert_true(diff_seed > W && diff_epoch > W / 2 && not_identity > W / 2);
  // The first 4 steps (rows 0..31 < W) lie in epoch 0: windows disjoint.
  for (int a1 = 0; a1 < 32; a1++)
    for (int a2 = a1 + 1; a2 < 32; a2++) assert_true(a[a1] != a[a2]);
}

static void test_data_short(void **state) {
  int32_t v[T + 1];
  for (int i = 0; i <= T; i++) v[i] = i;
  tpr_data_config c = {.seq_len = T, .micro_batch = 1, .accum = 1, .dp = 1};
  tpr_tokens *t;
  tpr_data *d;
  TT_OK(tpr_npy_write_i32(path, v, T));  // T tokens: one short
  TT_OK(tpr_tokens_open(path, NULL, &t));
  assert_int_equal(tpr_data_create(t, &c, 100, &d), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "has 8 tokens, shorter than one sequence of T+1 = 9"));
  printf("data short file: %s\n", tpr_last_error());
  tpr_tokens_close(t);
  TT_OK(tpr_npy_write_i32(path, v, T + 1));  // exactly one window
  TT_OK(tpr_tokens_open(path, NULL, &t));
  TT_OK(tpr_data_create(t, &c, 100, &d));
  assert_int_equal(tpr_data_windows(d), 1);
  int32_t in[T], tg[T];
  TT_OK(tpr_data_window(d, 5, 0, 0, 0, in, tg));
  assert_true(in[0] == 0 && tg[T - 1] == T);
  tpr_data_free(d);
  assert_int_equal(tpr_data_create(t, &c, T, &d), TPR_ERR_INVALID_ARG);  // id T >= vocab T
  tpr_tokens_close(t);
  tpr_data_order o;
  TT_OK(tpr_data_order_parse("random", &o));
  assert_int_equal(o, TPR_DATA_RANDOM);
  assert_int_equal(tpr_data_order_parse("shuffled", &o), TPR_ERR_INVALID_ARG);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_npy_round_trip, setup, teardown),
      cmocka_unit_test(test_npy_numpy_files),
      cmocka_unit_test_setup_teardown(test_npy_malformed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npy_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_data_sequential, setup, teardown),
      cmocka_unit_test_setup_teardown(test_data_random, setup, teardown),
      cmocka_unit_test_setup_teardown(test_data_short, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
