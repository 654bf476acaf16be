// The checked shape / size / name helpers (runtime/tensor.h) that every
// parser of outside bytes uses: overflow at each step of the product, the
// element and byte bounds, UTF-8 names; and the serialized-program
// reproducer of issue 19 (a 6-D input whose element count overflows int64)
// now refused with TPR_ERR_FORMAT instead of accepted.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/program/program.h"
#include "runtime/tensor.h"
#include "shard/safetensors.h"
#include "train/npy.h"
#include "test_util.h"

static void test_shape_bounds(void **state) {
  // Random sane shapes pass and report the exact product.
  for (int it = 0; it < 200; it++) {
    int nd = (int)tt_randint(0, 4);
    int64_t shape[TPR_MAX_DIMS], want = 1;
    for (int d = 0; d < nd; d++) want *= (shape[d] = tt_randint(0, 64));
    int64_t n;
    size_t b;
    TT_OK(tpr_shape_size_checked("rand", TPR_BF16, nd, shape, &n, &b));
    assert_int_equal(n, want);
    assert_int_equal(b, (size_t)want * 2);
  }
  // Products that overflow int64 at different steps, and one that only
  // passes the element bound but not the byte bound.
  const int64_t big = INT64_C(1) << 40;
  int64_t a[] = {big, big};                                   // 2^80
  int64_t b[] = {32, 32, 32, 32, 4128, 5066549580791807LL};  // the shape
  int64_t c[] = {INT64_MAX, 2};
  int64_t d[] = {INT64_C(1) << 48, 1};                        // exactly the element bound: ok as u8
  int64_t e[] = {INT64_C(1) << 48, 2};                        // one past it
  int64_t f[] = {0, INT64_MAX, INT64_MAX};                    // empty, but a dim is absurd
  int64_t g[] = {3, -1};
  assert_int_equal(tpr_shape_check(2, a), TPR_ERR_SHAPE);
  assert_int_equal(tpr_shape_check(6, b), TPR_ERR_SHAPE);
  assert_int_equal(tpr_shape_check(2, c), TPR_ERR_SHAPE);
  TT_OK(tpr_shape_size_checked("d", TPR_U8, 2, d, NULL, NULL));
  assert_int_equal(tpr_shape_size_checked("d", TPR_I64, 2, d, NULL, NULL), TPR_ERR_SHAPE);  // 2^51 bytes
  assert_int_equal(tpr_shape_check(2, e), TPR_ERR_SHAPE);
  assert_int_equal(tpr_shape_check(3, f), TPR_ERR_SHAPE);
  assert_int_equal(tpr_shape_check(2, g), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "negative"));
  // The unchecked helpers never overflow (UBSan would flag it): they saturate.
  assert_int_equal(tpr_shape_numel(6, b), INT64_MAX);
  assert_int_equal(tpr_shape_numel(3, (int64_t[]){INT64_MAX, INT64_MAX, 0}), 0);
  int64_t st[TPR_MAX_DIMS];
  tpr_shape_contiguous_strides(6, b, st);
  assert_int_equal(st[5], 1);
  assert_int_equal(st[0], INT64_MAX);
  int64_t r;
  TT_OK(tpr_size_mul_checked("m", 1 << 20, 1 << 20, INT64_C(1) << 40, &r));
  assert_int_equal(r, INT64_C(1) << 40);
  assert_int_equal(tpr_size_mul_checked("m", (1 << 20) + 1, 1 << 20, INT64_C(1) << 40, &r), TPR_ERR_SHAPE);
  assert_int_equal(tpr_size_mul_checked("m", INT64_MAX, 3, INT64_MAX, &r), TPR_ERR_SHAPE);
  assert_int_equal(tpr_size_mul_checked("m", -1, 3, INT64_MAX, &r), TPR_ERR_SHAPE);
  printf("shape bounds: 200 random shapes exact; 7 overflow/bound cases refused\n");
}

static void test_names(void **state) {
  static const struct {
    const char *s;
    bool ok;
  } cases[] = {
      {"model.layers.0.w", true}, {"caf\xc3\xa9", true}, {"\xe2\x82\xac", true}, {"\xf0\x9f\x98\x80", true},
      {"\xc3", false},            // cut short
      {"\x80x", false},           // stray continuation
      {"\xc0\xaf", false},        // overlong '/'
      {"\xe0\x80\xaf", false},    // overlong
      {"\xed\xa0\x80", false},    // surrogate U+D800
      {"\xf4\x90\x80\x80", false},  // U+110000
      {"\xff", false},
  };
  int n = (int)(sizeof cases / sizeof *cases);
  for (int i = 0; i < n; i++) {
    tpr_status rc = tpr_name_check("case", cases[i].s, strlen(cases[i].s));
    if ((rc == TPR_OK) != cases[i].ok) fail_msg("case %d: got %s", i, tpr_status_name(rc));
  }
  assert_int_equal(tpr_name_check("empty", "", 0), TPR_ERR_FORMAT);
  assert_int_equal(tpr_name_check("nul", "a\0b", 3), TPR_ERR_FORMAT);
  char *longname = malloc(TPR_NAME_MAX + 2);
  memset(longname, 'a', TPR_NAME_MAX + 1);
  TT_OK(tpr_name_check("long", longname, TPR_NAME_MAX));
  assert_int_equal(tpr_name_check("long", longname, TPR_NAME_MAX + 1), TPR_ERR_FORMAT);
  free(longname);
  // Random valid code points encode to valid UTF-8; one flipped lead byte
  // to 0xff (the negative control) makes each invalid.
  for (int it = 0; it < 500; it++) {
    uint32_t cp = (uint32_t)tt_randint(1, 0x10ffff);
    if (cp >= 0xd800 && cp <= 0xdfff) cp = 'x';
    char buf[4];
    int len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (len == 1) buf[0] = (char)cp;
    else {
      for (int k = len - 1; k > 0; k--, cp >>= 6) buf[k] = (char)(0x80 | (cp & 0x3f));
      buf[0] = (char)((len == 2 ? 0xc0 : len == 3 ? 0xe0 : 0xf0) | cp);
    }
    assert_true(tpr_utf8_valid(buf, (size_t)len));
    buf[0] = (char)0xff;
    assert_false(tpr_utf8_valid(buf, (size_t)len));
  }
  printf("names: %d fixed cases, 500 random code points valid, each with 0xff lead invalid\n", n);
}

// Program{values: [Value{name, kind=input, dtype=f32, shape}], format_version=1}
// by hand: the bytes an attacker would send.
static size_t program_bytes(uint8_t *out, const char *name, const int64_t *shape, int nd) {
  uint8_t sh[80];
  size_t ns = 0;
  for (int d = 0; d < nd; d++)
    for (uint64_t v = (uint64_t)shape[d];; v >>= 7) {
      sh[ns++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
      if (v <= 0x7f) break;
    }
  uint8_t val[160];
  size_t nv = 0, nn = strlen(name);
  val[nv++] = 0x0a, val[nv++] = (uint8_t)nn;
  memcpy(val + nv, name, nn), nv += nn;
  val[nv++] = 0x22, val[nv++] = (uint8_t)ns;
  memcpy(val + nv, sh, ns), nv += ns;
  size_t n = 0;
  out[n++] = 0x0a, out[n++] = (uint8_t)nv;
  memcpy(out + n, val, nv), n += nv;
  out[n++] = 0x78, out[n++] = 0x01;  // field 15 (format_version) = 1
  return n;
}

static void test_program_reproducer(void **state) {
  uint8_t buf[256];
  tpr_program *p = NULL;
  // Control: the same bytes with a sane shape load (so the encoding is right).
  int64_t ok_shape[] = {2, 3};
  size_t n = program_bytes(buf, "x", ok_shape, 2);
  TT_OK(tpr_program_deserialize(buf, n, &p));
  assert_int_equal(tpr_program_num_values(p), 1);
  tpr_program_free(p);
  // Issue 19: (32, 32, 32, 32, 4128, 5066549580791807) overflows int64.
  int64_t bad[] = {32, 32, 32, 32, 4128, 5066549580791807LL};
  n = program_bytes(buf, "x", bad, 6);
  assert_int_equal(tpr_program_deserialize(buf, n, &p), TPR_ERR_FORMAT);
  assert_null(p);
  printf("reproducer (%zu bytes): %s\n", n, tpr_last_error());
  assert_non_null(strstr(tpr_last_error(), "2^48"));
  // A value name that is not UTF-8.
  n = program_bytes(buf, "a\xc0\xaf", ok_shape, 2);
  assert_int_equal(tpr_program_deserialize(buf, n, &p), TPR_ERR_FORMAT);
  assert_non_null(strstr(tpr_last_error(), "UTF-8"));
  printf("invalid UTF-8 name: %s\n", tpr_last_error());
}

static const char *write_tmp(const char *suffix, const void *bytes, size_t n) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/tpr_shape_XXXXXX%s", suffix);
  int fd = mkstemps(path, (int)strlen(suffix));
  assert_true(fd >= 0);
  assert_int_equal(write(fd, bytes, n), (ssize_t)n);
  close(fd);
  return path;
}

static tpr_status open_st(const char *dims, int64_t *dim1) {
  char hdr[256], file[300];
  int h = snprintf(hdr, sizeof hdr, "{\"a\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[0,0]}}", dims);
  uint64_t len = (uint64_t)h;
  memcpy(file, &len, 8);
  memcpy(file + 8, hdr, (size_t)h);
  const char *path = write_tmp(".safetensors", file, 8 + (size_t)h);
  tpr_st_set *set = NULL;
  tpr_status rc = tpr_st_open(path, &set);
  if (rc == TPR_OK) *dim1 = tpr_st_find(set, "a")->shape[1];
  tpr_st_close(set);
  unlink(path);
  return rc;
}

// Headers whose dims only pass the byte-count check because another dim is 0:
// dims above 2^53 were always refused (JSON numbers are doubles), but before
// the checked helper an empty tensor could carry a dim of up to 2^53, which
// later products (views, programs built from the shape) overflow.
static void test_outside_dims(void **state) {
  int64_t d1 = -1;
  TT_OK(open_st("0,5", &d1));  // control: an empty tensor with a sane dim opens
  assert_int_equal(d1, 5);
  assert_int_equal(open_st("0,9223372036854775813", &d1), TPR_ERR_FORMAT);
  printf("safetensors [0, 2^63+5]: %s\n", tpr_last_error());
  assert_int_equal(open_st("0,281474976710657", &d1), TPR_ERR_FORMAT);  // 2^48 + 1
  printf("safetensors [0, 2^48+1]: %s\n", tpr_last_error());
  // .npy: a shape whose byte size overflows int64 (the old message computed it signed).
  char npy[128] = "\x93NUMPY\x01\x00";
  const char *dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387905,), }";
  size_t hl = 118 - 10;  // pad the header to 118 bytes + newline = 128
  npy[8] = (char)(hl & 0xff), npy[9] = (char)(hl >> 8);
  memset(npy + 10, ' ', hl);
  memcpy(npy + 10, dict, strlen(dict));
  npy[10 + hl - 1] = '\n';
  const char *path = write_tmp(".npy", npy, 10 + hl);
  tpr_npy *t = NULL;
  assert_int_equal(tpr_npy_open(path, &t), TPR_ERR_FORMAT);
  printf("npy shape (2^62+1,) of <i8: %s\n", tpr_last_error());
  assert_non_null(strstr(tpr_last_error(), "too large"));
  unlink(path);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shape_bounds),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_program_reproducer),
      cmocka_unit_test(test_outside_dims),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
