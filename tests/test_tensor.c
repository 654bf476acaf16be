// Tensors (runtime/tensor.h) and the host copies of backend.h on the CPU
// backend: shapes and strides, views sharing reference-counted storage,
// element addressing through strides, wrapped caller memory, and errors.
// Data is fresh random each run (seed printed; TPR_TEST_SEED=... reruns it).
// Run under the ASan build too: a view outliving its original, or tpr freeing
// wrapped memory, shows up there.
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

static tpr_tensor *new_t(tpr_dtype dt, int nd, const int64_t *shape) {
  tpr_tensor *t = NULL;
  TT_OK(tpr_tensor_new(tt_cpu(), dt, nd, shape, &t));
  return t;
}

static float at3(const tpr_tensor *t, int64_t i, int64_t j, int64_t k) {
  const float *base = tpr_tensor_data(t);
  return base[i * t->stride[0] + j * t->stride[1] + k * t->stride[2]];
}

static void random_shape(int nd, int64_t lo, int64_t hi, int64_t *shape) {
  for (int d = 0; d < nd; d++) shape[d] = tt_randint(lo, hi);
}

static void test_new_shapes_strides(void **state) {
  static const size_t sizes[TPR_DTYPE_COUNT] = {4, 2, 2, 1, 4, 8, 1};
  for (int rep = 0; rep < 50; rep++) {
    int nd = (int)tt_randint(1, TPR_MAX_DIMS);
    int64_t shape[TPR_MAX_DIMS];
    random_shape(nd, 1, nd > 4 ? 3 : 7, shape);
    for (int dt = 0; dt < TPR_DTYPE_COUNT; dt++) {
      tpr_tensor *t = new_t((tpr_dtype)dt, nd, shape);
      assert_int_equal(t->ndim, nd);
      assert_int_equal(t->dtype, dt);
      assert_int_equal(t->offset, 0);
      int64_t want = 1;
      for (int d = nd - 1; d >= 0; d--) {
        assert_int_equal(t->shape[d], shape[d]);
        assert_int_equal(t->stride[d], want);
        want *= shape[d];
      }
      assert_int_equal(tpr_tensor_numel(t), want);
      assert_int_equal(tpr_tensor_nbytes(t), (size_t)want * sizes[dt]);
      assert_true(tpr_tensor_is_contiguous(t));
      assert_non_null(tpr_tensor_data(t));
      assert_ptr_equal(tpr_tensor_backend(t), tt_cpu());
      assert_int_equal(tpr_tensor_storage_refs(t), 1);
      // The whole buffer is writable (ASan checks the bounds).
      memset(tpr_tensor_data(t), 0x5a, tpr_tensor_nbytes(t));
      tpr_tensor_free(t);
    }
  }
}

static void test_scalar_and_empty(void **state) {
  int64_t unused = 0;
  tpr_tensor *s = new_t(TPR_I64, 0, &unused);
  assert_int_equal(tpr_tensor_numel(s), 1);
  assert_int_equal(tpr_tensor_nbytes(s), 8);
  assert_true(tpr_tensor_is_contiguous(s));
  int64_t v = (int64_t)tt_next_u64(), back = 0;
  TT_OK(tpr_tensor_from_host(s, &v, sizeof v));
  TT_OK(tpr_tensor_to_host(s, &back, sizeof back));
  assert_int_equal(back, v);
  char buf[64];
  assert_string_equal(tpr_tensor_describe(s, buf, sizeof buf), "i64()");
  tpr_tensor_free(s);

  int64_t shape[3] = {tt_randint(1, 5), 0, tt_randint(1, 5)};
  tpr_tensor *e = new_t(TPR_F32, 3, shape);
  assert_int_equal(tpr_tensor_numel(e), 0);
  assert_int_equal(tpr_tensor_nbytes(e), 0);
  assert_true(tpr_tensor_is_contiguous(e));
  assert_int_equal(e->stride[2], 1);
  assert_int_equal(e->stride[1], shape[2]);  // a 0 dim counts as 1 in the strides
  assert_int_equal(e->stride[0], shape[2]);
  TT_OK(tpr_tensor_to_host(e, buf, 0));
  TT_OK(tpr_tensor_from_host(e, buf, 0));
  assert_int_equal(tpr_tensor_to_host(e, buf, 4), TPR_ERR_SHAPE);
  tpr_tensor *r = NULL;
  TT_OK(tpr_tensor_reshape(e, 1, (const int64_t[]){0}, &r));
  assert_int_equal(tpr_tensor_numel(r), 0);
  tpr_tensor_free(r);
  tpr_tensor_free(e);
}

static void test_new_errors(void **state) {
  tpr_tensor *t = NULL;
  int64_t shape[TPR_MAX_DIMS + 1];
  random_shape(TPR_MAX_DIMS + 1, 1, 2, shape);
  assert_int_equal(tpr_tensor_new(tt_cpu(), TPR_F32, -1, shape, &t), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_new(tt_cpu(), TPR_F32, TPR_MAX_DIMS + 1, shape, &t), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "ndim 9"));
  int bad = (int)tt_randint(0, 2);
  shape[bad] = -tt_randint(1, 100);
  assert_int_equal(tpr_tensor_new(tt_cpu(), TPR_F32, 3, shape, &t), TPR_ERR_SHAPE);
  char want[64];
  snprintf(want, sizeof want, "dim %d has negative size %lld", bad, (long long)shape[bad]);
  assert_non_null(strstr(tpr_last_error(), want));
  shape[bad] = 2;
  assert_int_equal(tpr_tensor_new(tt_cpu(), TPR_DTYPE_COUNT, 2, shape, &t), TPR_ERR_DTYPE);
  assert_int_equal(tpr_tensor_new(tt_cpu(), (tpr_dtype)-1, 2, shape, &t), TPR_ERR_DTYPE);
  assert_int_equal(tpr_tensor_new(NULL, TPR_F32, 2, shape, &t), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_tensor_new(tt_cpu(), TPR_F32, 2, shape, NULL), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_tensor_wrap(tt_cpu(), TPR_F32, 2, shape, NULL, &t), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_tensor_wrap(tt_cpu(), TPR_F32, -2, shape, shape, &t), TPR_ERR_SHAPE);
  tpr_tensor_free(NULL);
}

static void test_reshape_shares_storage(void **state) {
  int64_t A = tt_randint(2, 6), B = tt_randint(2, 6), C = tt_randint(2, 6);
  float *h;
  tpr_tensor *t = tt_random_f32(tt_cpu(), 3, (const int64_t[]){A, B, C}, &h);
  tpr_tensor *v = NULL, *v2 = NULL;
  TT_OK(tpr_tensor_reshape(t, 2, (const int64_t[]){A * B, C}, &v));
  assert_int_equal(tpr_tensor_storage_refs(t), 2);
  TT_OK(tpr_tensor_reshape(v, 1, (const int64_t[]){A * B * C}, &v2));
  assert_int_equal(tpr_tensor_storage_refs(t), 3);
  assert_int_equal(tpr_tensor_storage_refs(v2), 3);
  assert_ptr_equal(tpr_tensor_data(v), tpr_tensor_data(t));
  assert_int_equal(v->stride[0], C);
  assert_int_equal(v->stride[1], 1);
  // Write through the view, read through the original.
  int64_t i = tt_randint(0, A * B - 1), k = tt_randint(0, C - 1);
  float x = (float)tt_normal() + 10.0f;
  ((float *)tpr_tensor_data(v))[i * C + k] = x;
  assert_true(at3(t, i / B, i % B, k) == x);
  h[i * C + k] = x;
  tpr_tensor_free(v);
  assert_int_equal(tpr_tensor_storage_refs(t), 2);
  // The storage survives its original handle.
  tpr_tensor_free(t);
  assert_int_equal(tpr_tensor_storage_refs(v2), 1);
  float *back = malloc((size_t)(A * B * C) * sizeof *back);
  TT_OK(tpr_tensor_to_host(v2, back, (size_t)(A * B * C) * sizeof *back));
  assert_memory_equal(back, h, (size_t)(A * B * C) * sizeof *back);
  tpr_tensor_free(v2);
  free(back);
  free(h);
}

static void test_reshape_errors(void **state) {
  int64_t A = tt_randint(2, 6), B = tt_randint(2, 6);
  tpr_tensor *t = tt_random_f32(tt_cpu(), 2, (const int64_t[]){A, B}, NULL), *tr = NULL, *v = (tpr_tensor *)1;
  assert_int_equal(tpr_tensor_reshape(t, 2, (const int64_t[]){A, B + 1}, &v), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_reshape(t, 1, (const int64_t[]){-A * B}, &v), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_reshape(t, TPR_MAX_DIMS + 1, (const int64_t[9]){A * B, 1, 1, 1, 1, 1, 1, 1, 1}, &v),
                   TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_reshape(NULL, 1, (const int64_t[]){A * B}, &v), TPR_ERR_INVALID_ARG);
  TT_OK(tpr_tensor_transpose(t, 0, 1, &tr));
  assert_int_equal(tpr_tensor_reshape(tr, 1, (const int64_t[]){A * B}, &v), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "contiguous"));
  assert_int_equal(tpr_tensor_storage_refs(t), 2);  // failed views take no reference
  tpr_tensor_free(tr);
  tpr_tensor_free(t);
}

static void random_perm(int n, int *perm) {
  for (int i = 0; i < n; i++) perm[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)tt_randint(0, i), tmp = perm[i];
    perm[i] = perm[j], perm[j] = tmp;
  }
}

static void test_permute_transpose(void **state) {
  for (int rep = 0; rep < 20; rep++) {
    int64_t shape[3];
    random_shape(3, 1, 6, shape);
    float *h;
    tpr_tensor *t = tt_random_f32(tt_cpu(), 3, shape, &h), *p = NULL;
    int perm[3];
    random_perm(3, perm);
    TT_OK(tpr_tensor_permute(t, perm, &p));
    assert_ptr_equal(tpr_tensor_data(p), tpr_tensor_data(t));
    for (int d = 0; d < 3; d++) {
      assert_int_equal(p->shape[d], shape[perm[d]]);
      assert_int_equal(p->stride[d], t->stride[perm[d]]);
    }
    // p[i0,i1,i2] == t[idx] with idx[perm[d]] = i_d, read from the host copy.
    for (int64_t i = 0; i < p->shape[0]; i++)
      for (int64_t j = 0; j < p->shape[1]; j++)
        for (int64_t k = 0; k < p->shape[2]; k++) {
          int64_t idx[3], at[3] = {i, j, k};
          for (int d = 0; d < 3; d++) idx[perm[d]] = at[d];
          assert_true(at3(p, i, j, k) == h[(idx[0] * shape[1] + idx[1]) * shape[2] + idx[2]]);
        }
    tpr_tensor *tr = NULL;
    TT_OK(tpr_tensor_transpose(t, 0, 2, &tr));
    assert_int_equal(tr->shape[0], shape[2]);
    assert_int_equal(tr->shape[2], shape[0]);
    assert_int_equal(tr->stride[0], 1);
    assert_int_equal(tr->stride[1], shape[2]);
    assert_int_equal(tr->stride[2], shape[1] * shape[2]);
    int64_t i = tt_randint(0, shape[2] - 1), j = tt_randint(0, shape[1] - 1), k = tt_randint(0, shape[0] - 1);
    assert_true(at3(tr, i, j, k) == h[(k * shape[1] + j) * shape[2] + i]);
    assert_int_equal(tpr_tensor_storage_refs(t), 3);
    tpr_tensor_free(tr);
    tpr_tensor_free(p);
    tpr_tensor_free(t);
    free(h);
  }
}

static void test_permute_errors(void **state) {
  tpr_tensor *t = tt_random_f32(tt_cpu(), 3, (const int64_t[]){2, 3, 4}, NULL), *p = NULL;
  static const int bad[][3] = {{0, 0, 1}, {2, 1, 2}, {0, 1, 3}, {-1, 0, 1}, {0, 1, 99}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(tpr_tensor_permute(t, bad[i], &p), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "not a permutation"));
  assert_int_equal(tpr_tensor_permute(t, NULL, &p), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_tensor_transpose(t, 0, 3, &p), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_transpose(t, -1, 0, &p), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_transpose(NULL, 0, 1, &p), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_tensor_storage_refs(t), 1);
  tpr_tensor_free(t);
}

static void test_slice(void **state) {
  int64_t A = tt_randint(2, 6), B = tt_randint(3, 7), C = tt_randint(3, 7);
  float *h;
  tpr_tensor *t = tt_random_f32(tt_cpu(), 3, (const int64_t[]){A, B, C}, &h), *s = NULL, *s2 = NULL;
  int64_t start = tt_randint(0, B - 2), len = tt_randint(1, B - start);
  TT_OK(tpr_tensor_slice(t, 1, start, len, &s));
  assert_int_equal(s->offset, start * C);
  assert_int_equal(s->shape[1], len);
  assert_int_equal(s->stride[0], B * C);
  assert_int_equal(s->stride[1], C);
  assert_ptr_equal(tpr_tensor_data(s), (float *)tpr_tensor_data(t) + start * C);
  // A slice of a slice accumulates offsets.
  int64_t start2 = tt_randint(0, C - 2), len2 = tt_randint(1, C - start2);
  TT_OK(tpr_tensor_slice(s, 2, start2, len2, &s2));
  assert_int_equal(s2->offset, start * C + start2);
  for (int64_t i = 0; i < A; i++)
    for (int64_t j = 0; j < len; j++)
      for (int64_t k = 0; k < len2; k++)
        assert_true(at3(s2, i, j, k) == h[(i * B + j + start) * C + k + start2]);
  tpr_tensor *v = NULL;
  assert_int_equal(tpr_tensor_slice(t, 1, B - 1, 2, &v), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_slice(t, 1, -1, 1, &v), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_slice(t, 1, 0, -1, &v), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_slice(t, 3, 0, 1, &v), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_slice(t, -1, 0, 1, &v), TPR_ERR_SHAPE);
  assert_int_equal(tpr_tensor_slice(t, 0, A, 1, &v), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "outside dim 0"));
  TT_OK(tpr_tensor_slice(t, 0, A, 0, &v));  // empty slice at the end
  assert_int_equal(tpr_tensor_numel(v), 0);
  assert_int_equal(tpr_tensor_storage_refs(t), 4);
  tpr_tensor_free(v);
  tpr_tensor_free(s);
  tpr_tensor_free(t);
  assert_true(at3(s2, A - 1, len - 1, len2 - 1) == h[(A * B - B + len - 1 + start) * C + len2 - 1 + start2]);
  tpr_tensor_free(s2);
  free(h);
}

static void test_is_contiguous(void **state) {
  int64_t A = tt_randint(2, 5), B = tt_randint(2, 5), C = tt_randint(2, 5);
  tpr_tensor *t = new_t(TPR_BF16, 3, (const int64_t[]){A, B, C}), *v = NULL;
  TT_OK(tpr_tensor_slice(t, 0, 1, A - 1, &v));  // slice of dim 0: contiguous
  assert_true(tpr_tensor_is_contiguous(v));
  tpr_tensor_free(v);
  TT_OK(tpr_tensor_slice(t, 2, 0, C - 1, &v));  // slice of the last dim: not
  assert_false(tpr_tensor_is_contiguous(v));
  tpr_tensor_free(v);
  TT_OK(tpr_tensor_slice(t, 1, 1, 1, &v));  // a single middle row: contiguous
  assert_false(tpr_tensor_is_contiguous(v));  // A >= 2 rows of stride B*C apart
  tpr_tensor_free(v);
  TT_OK(tpr_tensor_slice(t, 0, tt_randint(0, A - 1), 1, &v));  // (1, B, C)
  assert_true(tpr_tensor_is_contiguous(v));
  tpr_tensor_free(v);
  TT_OK(tpr_tensor_transpose(t, 1, 2, &v));
  assert_false(tpr_tensor_is_contiguous(v));
  tpr_tensor_free(v);
  tpr_tensor_free(t);
  // Size-1 dims move freely: (1, N) -> (N, 1) is still contiguous.
  t = new_t(TPR_F32, 3, (const int64_t[]){1, B, 1});
  TT_OK(tpr_tensor_permute(t, (const int[]){2, 1, 0}, &v));
  assert_true(tpr_tensor_is_contiguous(v));
  tpr_tensor_free(v);
  tpr_tensor_free(t);
}

static void test_wrap_is_never_freed(void **state) {
  int64_t n = tt_randint(4, 64);
  float stack_buf[64];
  float *heap = malloc((size_t)n * sizeof *heap);
  tt_fill_normal(heap, (size_t)n, 1.0);
  tt_fill_normal(stack_buf, 64, 1.0);
  tpr_tensor *w = NULL, *ws = NULL, *v = NULL;
  TT_OK(tpr_tensor_wrap(tt_cpu(), TPR_F32, 1, &n, heap, &w));
  TT_OK(tpr_tensor_wrap(tt_cpu(), TPR_F32, 2, (const int64_t[]){8, 8}, stack_buf, &ws));
  assert_ptr_equal(tpr_tensor_data(w), heap);
  assert_ptr_equal(tpr_tensor_data(ws), stack_buf);
  float x = (float)tt_normal();
  ((float *)tpr_tensor_data(ws))[13] = x;
  assert_true(stack_buf[13] == x);
  TT_OK(tpr_tensor_slice(w, 0, 1, n - 1, &v));
  float back;
  tpr_tensor *one = NULL;
  TT_OK(tpr_tensor_slice(v, 0, 0, 1, &one));
  TT_OK(tpr_tensor_to_host(one, &back, sizeof back));
  assert_true(back == heap[1]);
  tpr_tensor_free(one);
  tpr_tensor_free(w);
  tpr_tensor_free(v);
  tpr_tensor_free(ws);
  // Still ours: ASan reports a use-after-free or double free if tpr freed them.
  heap[n - 1] = 1.5f;
  stack_buf[63] = 2.5f;
  assert_true(heap[n - 1] + stack_buf[63] == 4.0f);
  free(heap);
  // Zero elements may wrap NULL.
  TT_OK(tpr_tensor_wrap(tt_cpu(), TPR_F32, 1, (const int64_t[]){0}, NULL, &w));
  tpr_tensor_free(w);
}

static void test_host_copies(void **state) {
  for (int dt = 0; dt < TPR_DTYPE_COUNT; dt++) {
    int64_t shape[2] = {tt_randint(2, 9), tt_randint(2, 9)};  // 2+ so the transpose is strided
    tpr_tensor *t = new_t((tpr_dtype)dt, 2, shape), *tr = NULL, *row = NULL;
    size_t nb = tpr_tensor_nbytes(t);
    unsigned char *src = malloc(nb + 1), *dst = malloc(nb + 1);
    for (size_t i = 0; i < nb; i++) src[i] = (unsigned char)tt_next_u64();
    TT_OK(tpr_tensor_from_host(t, src, nb));
    memset(dst, 0, nb);
    TT_OK(tpr_tensor_to_host(t, dst, nb));
    assert_memory_equal(dst, src, nb);
    assert_int_equal(tpr_tensor_to_host(t, dst, nb + 1), TPR_ERR_SHAPE);
    assert_non_null(strstr(tpr_last_error(), "bytes"));
    assert_int_equal(tpr_tensor_from_host(t, src, nb - 1), TPR_ERR_SHAPE);
    assert_int_equal(tpr_tensor_to_host(NULL, dst, nb), TPR_ERR_INVALID_ARG);
    TT_OK(tpr_tensor_transpose(t, 0, 1, &tr));
    assert_int_equal(tpr_tensor_to_host(tr, dst, nb), TPR_ERR_SHAPE);
    assert_non_null(strstr(tpr_last_error(), "not contiguous"));
    assert_int_equal(tpr_tensor_from_host(tr, src, nb), TPR_ERR_SHAPE);
    // Copies through a contiguous row view land in the original.
    int64_t r = tt_randint(0, shape[0] - 1);
    size_t rb = (size_t)shape[1] * tpr_dtype_size((tpr_dtype)dt);
    TT_OK(tpr_tensor_slice(t, 0, r, 1, &row));
    for (size_t i = 0; i < rb; i++) src[(size_t)r * rb + i] ^= 0xa5;
    TT_OK(tpr_tensor_from_host(row, src + (size_t)r * rb, rb));
    TT_OK(tpr_tensor_to_host(t, dst, nb));
    assert_memory_equal(dst, src, nb);
    tpr_tensor_free(row);
    tpr_tensor_free(tr);
    tpr_tensor_free(t);
    free(src);
    free(dst);
  }
}

static void test_describe(void **state) {
  char buf[64];
  tpr_tensor *t = new_t(TPR_F32, 3, (const int64_t[]){2, 3, 4}), *p = NULL;
  assert_string_equal(tpr_tensor_describe(t, buf, sizeof buf), "f32(2,3,4)");
  TT_OK(tpr_tensor_permute(t, (const int[]){2, 0, 1}, &p));
  assert_string_equal(tpr_tensor_describe(p, buf, sizeof buf), "f32(4,2,3)");
  // A small buffer is cut, terminated, and never overrun.
  char small[8];
  memset(small, 'x', sizeof small);
  tpr_tensor_describe(t, small, 6);
  assert_string_equal(small, "f32(2");
  assert_true(small[6] == 'x' && small[7] == 'x');
  tpr_tensor_free(p);
  tpr_tensor_free(t);
  int64_t n = tt_randint(100000, 999999);
  t = new_t(TPR_BF16, 1, &n);
  char want[32];
  snprintf(want, sizeof want, "bf16(%lld)", (long long)n);
  assert_string_equal(tpr_tensor_describe(t, buf, sizeof buf), want);
  tpr_tensor_free(t);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_new_shapes_strides),
      cmocka_unit_test(test_scalar_and_empty),
      cmocka_unit_test(test_new_errors),
      cmocka_unit_test(test_reshape_shares_storage),
      cmocka_unit_test(test_reshape_errors),
      cmocka_unit_test(test_permute_transpose),
      cmocka_unit_test(test_permute_errors),
      cmocka_unit_test(test_slice),
      cmocka_unit_test(test_is_contiguous),
      cmocka_unit_test(test_wrap_is_never_freed),
      cmocka_unit_test(test_host_copies),
      cmocka_unit_test(test_describe),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(tt_cpu());
  return rc;
}
