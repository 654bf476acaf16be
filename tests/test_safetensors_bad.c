// Malformed safetensors files (shard/safetensors.h): hand-built headers and
// byte edits of valid files each give TPR_ERR_FORMAT (or UNSUPPORTED) with a
// message naming the file, the tensor and the problem; random corruption
// never crashes (run under the sanitizer build too).
#define _GNU_SOURCE  // nftw
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/file_io.h"
#include "shard/safetensors.h"
#include "test_util.h"

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }
static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static char dir[64], path[128];

static int setup(void **state) {
  snprintf(dir, sizeof dir, "/tmp/tpr_st_bad_XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(path, sizeof path, "%s/bad.safetensors", dir);
  return 0;
}

static int teardown(void **state) {
  rm_tree(dir);
  return 0;
}

// Writes path: u64 header length `hlen` (the header's own length when
// hlen < 0), the header, then `data` zero bytes.
static void put(const char *header, long long hlen, size_t data) {
  size_t n = strlen(header);
  uint8_t *b = calloc(8 + n + data + 1, 1);
  uint64_t h = hlen < 0 ? n : (uint64_t)hlen;
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(h >> (8 * i));
  memcpy(b + 8, header, n);
  TT_OK(tpr_file_write(path, b, 8 + n + data));
  free(b);
}

static void expect_open(tpr_status want, const char *msg) {
  tpr_st_set *s = NULL;
  tpr_status rc = tpr_st_open(path, &s);
  if (rc != want)
    fail_msg("got %s, want %s (%s); last error: %s", tpr_status_name(rc), tpr_status_name(want), msg,
             rc == TPR_OK ? "-" : tpr_last_error());
  if (want == TPR_OK) {
    assert_non_null(s);
    tpr_st_close(s);
    return;
  }
  assert_null(s);
  if (!strstr(tpr_last_error(), msg)) fail_msg("expected '%s' in '%s'", msg, tpr_last_error());
  if (!strstr(tpr_last_error(), path)) fail_msg("expected the path in '%s'", tpr_last_error());
}

#define T(name, dt, shape, offs) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}"
#define A T("a", "F32", "[2,3]", "[0,24]")
#define B T("b", "BF16", "[4]", "[24,32]")

static const struct {
  const char *entries;  // the header object's members
  size_t data;          // bytes of data section
  tpr_status want;
  const char *msg;
} cases[] = {
    {A "," B, 32, TPR_OK, ""},
    // Valid oddities: metadata, a scalar, empty tensors sharing an offset, a hole, trailing data.
    {"\"__metadata__\":{\"format\":\"pt\"}," A "," B "," T("s", "I64", "[]", "[32,40]") "," T("e", "U8", "[0]", "[24,24]")
     "," T("f", "F32", "[3,0]", "[24,24]") "," T("g", "F16", "[2]", "[44,48]"), 50, TPR_OK, ""},
    {"\"__metadata__\":null," A, 24, TPR_OK, ""},
    {"\"a\":5", 0, TPR_ERR_FORMAT, "tensor 'a': entry is not a JSON object"},
    {"\"a\":{\"shape\":[2,3],\"data_offsets\":[0,24]}", 24, TPR_ERR_FORMAT, "tensor 'a': \"dtype\" is missing or not a string"},
    {"\"a\":{\"dtype\":5,\"shape\":[2,3],\"data_offsets\":[0,24]}", 24, TPR_ERR_FORMAT, "\"dtype\" is missing or not a string"},
    {"\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,24]}", 24, TPR_ERR_FORMAT, "tensor 'a': \"shape\" is missing or not an array"},
    {T("a", "F32", "\"2x3\"", "[0,24]"), 24, TPR_ERR_FORMAT, "\"shape\" is missing or not an array"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[2,3]}", 24, TPR_ERR_FORMAT, "\"data_offsets\" is missing or not an array of 2"},
    {T("a", "F32", "[2,3]", "[0]"), 24, TPR_ERR_FORMAT, "\"data_offsets\" is missing or not an array of 2"},
    {T("a", "F32", "[2,3]", "[0,24,48]"), 24, TPR_ERR_FORMAT, "not an array of 2"},
    {T("a", "F32", "[2,3]", "[\"0\",\"24\"]"), 24, TPR_ERR_FORMAT, "tensor 'a': data_offsets[0] is not an integer"},
    {T("a", "F32", "[2,3]", "[-1,23]"), 24, TPR_ERR_FORMAT, "data_offsets[0] is negative"},
    {T("a", "F32", "[2,3]", "[0,24.5]"), 25, TPR_ERR_FORMAT, "data_offsets[1] is not an integer"},
    {T("a", "F33", "[2,3]", "[0,24]"), 24, TPR_ERR_FORMAT, "tensor 'a': unknown dtype \"F33\""},
    {T("a", "F64", "[3]", "[0,24]"), 24, TPR_ERR_UNSUPPORTED, "tensor 'a': unsupported dtype F64"},
    {T("a", "BOOL", "[3]", "[0,3]"), 24, TPR_ERR_UNSUPPORTED, "unsupported dtype BOOL"},
    {T("a", "F32", "[-2,3]", "[0,24]"), 24, TPR_ERR_FORMAT, "tensor 'a': dim 0 is negative"},
    {T("a", "F32", "[2,2.5]", "[0,20]"), 24, TPR_ERR_FORMAT, "tensor 'a': dim 1 is not an integer"},
    {T("a", "F32", "[2,\"3\"]", "[0,24]"), 24, TPR_ERR_FORMAT, "dim 1 is not an integer"},
    {T("a", "F32", "[1e300]", "[0,24]"), 24, TPR_ERR_FORMAT, "dim 0 is above 2^53"},
    {T("a", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]"), 24, TPR_ERR_FORMAT, "tensor 'a': 9 dims, more than TPR_MAX_DIMS (8)"},
    {T("a", "U8", "[4294967296,4294967296,4294967296]", "[0,1]"), 24, TPR_ERR_FORMAT, "element count overflows"},
    {T("a", "F32", "[2,3]", "[24,0]"), 24, TPR_ERR_FORMAT, "tensor 'a': data_offsets begin 24 > end 0"},
    {T("a", "F32", "[2,3]", "[8,32]"), 24, TPR_ERR_FORMAT,
     "tensor 'a': data_offsets end 32 is beyond the data section (24 bytes)"},
    {T("a", "F32", "[2,3]", "[0,20]"), 24, TPR_ERR_FORMAT,
     "tensor 'a': data_offsets span 20 bytes, but 6 F32 elements need 24"},
    {A "," T("b", "BF16", "[4]", "[20,28]"), 32, TPR_ERR_FORMAT, "tensors 'a' [0, 24) and 'b' [20, 28) overlap"},
    {T("z", "U8", "[2]", "[4,6]") "," A, 32, TPR_ERR_FORMAT, "tensors 'a' [0, 24) and 'z' [4, 6) overlap"},
    {"\"__metadata__\":{\"k\":1}," A, 24, TPR_ERR_FORMAT, "\"__metadata__\" is not an object of strings"},
    {"\"__metadata__\":[\"k\"]," A, 24, TPR_ERR_FORMAT, "\"__metadata__\" is not an object of strings"},
    {A "," T("a", "F32", "[2,3]", "[24,48]"), 48, TPR_ERR_FORMAT, "tensor 'a' appears twice in the header"},
};

static void test_bad_headers(void **state) {
  char header[1024];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(header, sizeof header, "{%s}", cases[i].entries);
    put(header, -1, cases[i].data);
    expect_open(cases[i].want, cases[i].msg);
  }
}

// Byte edits of a valid file and files that are not JSON objects at all.
static void test_bad_bytes(void **state) {
  const char *good = "{" A "," B "}";
  put("", -1, 0);
  assert_int_equal(truncate(path, 0), 0);
  expect_open(TPR_ERR_FORMAT, "0 bytes, shorter than the 8-byte header length");
  put("", -1, 0);
  assert_int_equal(truncate(path, 7), 0);
  expect_open(TPR_ERR_FORMAT, "7 bytes, shorter than the 8-byte header length");
  put(good, (long long)strlen(good) + 33, 32);  // header length past EOF
  expect_open(TPR_ERR_FORMAT, "runs past the end of the file");
  put(good, 200000000, 32);
  expect_open(TPR_ERR_FORMAT, "header length 200000000 is over the 100000000-byte limit");
  put(good, 0xFFFFFFFFFFFFFFFll, 32);
  expect_open(TPR_ERR_FORMAT, "is over the");
  put(good, -1, 32);
  assert_int_equal(truncate(path, 8 + (off_t)strlen(good) + 31), 0);  // one data byte short
  expect_open(TPR_ERR_FORMAT, "tensor 'b': data_offsets end 32 is beyond the data section (31 bytes)");
  put(good, (long long)strlen(good) - 1, 32);  // the closing brace cut off
  expect_open(TPR_ERR_FORMAT, "header is not valid JSON");
  put("[1, 2]", -1, 0);
  expect_open(TPR_ERR_FORMAT, "header is not a JSON object");
  put("\"x\"", -1, 0);
  expect_open(TPR_ERR_FORMAT, "header is not a JSON object");
  put("", -1, 0);
  expect_open(TPR_ERR_FORMAT, "header is not valid JSON");
  put("{}x", -1, 0);
  expect_open(TPR_ERR_FORMAT, "header has bytes after its JSON object (at byte 2)");
  // Padding must be whitespace: a NUL inside it is corruption.
  char padded[256];
  snprintf(padded, sizeof padded, "%s   ", good);
  put(padded, -1, 32);
  expect_open(TPR_OK, "");
  padded[strlen(good) + 1] = 'Q';
  put(padded, -1, 32);
  expect_open(TPR_ERR_FORMAT, "bytes after its JSON object");
  put("{}", -1, 0);
  expect_open(TPR_OK, "");  // an empty file set is valid
}

// Random corruption of a valid file: open and read may fail, never crash.
static void test_random_corruption(void **state) {
  uint8_t w[6 * 5] = {0}, scale[4] = {0};
  float f[12];
  uint16_t h[7] = {0};
  tt_fill_normal(f, 12, 1.0);
  tpr_st_write_entry e[4] = {
      {"m.weight", TPR_F8E4M3, 2, (int64_t[]){6, 5}, w},
      {"m.weight_scale_inv", TPR_F32, 2, (int64_t[]){1, 1}, scale},
      {"f", TPR_F32, 3, (int64_t[]){2, 3, 2}, f},
      {"h", TPR_BF16, 1, (int64_t[]){7}, h},
  };
  TT_OK(tpr_st_write(path, e, 4, (const char *[]){"format", "pt", NULL}));
  uint8_t *good;
  size_t n;
  TT_OK(tpr_file_read(path, &good, &n));
  size_t hlen = good[0] | (size_t)good[1] << 8;
  uint8_t *b = malloc(n);
  float out[64];
  int opened = 0;
  for (int iter = 0; iter < 400; iter++) {
    memcpy(b, good, n);
    size_t len = n;
    for (int k = (int)tt_randint(1, 4); k > 0; k--) {
      // Mostly in the header, where the parser is.
      size_t at = tt_randint(0, 9) < 8 ? (size_t)tt_randint(0, (int64_t)(8 + hlen - 1)) : (size_t)tt_randint(0, (int64_t)n - 1);
      b[at] = tt_randint(0, 1) ? (uint8_t)tt_next_u64() : (uint8_t)"{}[]\",:0-9e. "[tt_randint(0, 13)];
    }
    if (iter % 10 == 0) len = (size_t)tt_randint(0, (int64_t)n);
    TT_OK(tpr_file_write(path, b, len));
    tpr_st_set *s = NULL;
    tpr_status rc = tpr_st_open(path, &s);
    if (rc != TPR_OK && rc != TPR_ERR_FORMAT && rc != TPR_ERR_UNSUPPORTED)
      fail_msg("iter %d: %s: %s", iter, tpr_status_name(rc), tpr_last_error());
    if (rc != TPR_OK) continue;
    opened++;
    for (int i = 0; i < tpr_st_count(s); i++) {
      const tpr_st_tensor *t = tpr_st_get(s, i);
      if (t->numel > 64) continue;  // a corrupt shape of a valid but larger size
      rc = tpr_st_read_f32(s, t->name, NULL, NULL, out);
      if (rc != TPR_OK && rc != TPR_ERR_FORMAT) fail_msg("iter %d: read %s: %s", iter, t->name, tpr_last_error());
    }
    tpr_st_close(s);
  }
  print_message("%d of 400 corrupted files still opened\n", opened);
  free(good), free(b);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_bad_headers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_bytes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_random_corruption, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
