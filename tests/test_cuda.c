// The CUDA backend on a real GPU: memory round trips and clear errors for
// ops without a CUDA kernel yet. Without a GPU (or without CUDA in the
// build) it exits 77, which ctest reports as skipped, never as passed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend_cuda.h"
#include "test_util.h"

static tpr_backend *gpu;

static void test_round_trip(void **state) {
  enum { N = 100003 };
  float *h = malloc(N * sizeof *h), *back = malloc(N * sizeof *back);
  tt_fill_normal(h, N, 1.0);
  memset(back, 0xff, N * sizeof *back);  // poison: unwritten elements show up as NaN
  tpr_tensor *t, *u;
  TT_OK(tpr_tensor_new(gpu, TPR_F32, 1, (const int64_t[]){N}, &t));
  TT_OK(tpr_tensor_new(gpu, TPR_F32, 1, (const int64_t[]){N}, &u));
  TT_OK(tpr_tensor_from_host(t, h, N * sizeof *h));
  TT_OK(gpu->vt->copy_device(gpu->ctx, tpr_tensor_data(u), tpr_tensor_data(t), N * sizeof *h));
  TT_OK(tpr_tensor_to_host(u, back, N * sizeof *back));
  assert_memory_equal(h, back, N * sizeof *h);
  TT_OK(tpr_tensor_fill_zero(u));
  TT_OK(tpr_tensor_to_host(u, back, N * sizeof *back));
  for (int i = 0; i < N; i++) assert_true(back[i] == 0.0f);
  tpr_tensor_free(t), tpr_tensor_free(u), free(h), free(back);
}

static void test_missing_kernel_is_an_error(void **state) {
  tpr_tensor *x, *y;
  TT_OK(tpr_tensor_new(gpu, TPR_F32, 2, (const int64_t[]){4, 8}, &x));
  TT_OK(tpr_tensor_new(gpu, TPR_F32, 2, (const int64_t[]){4, 8}, &y));
  tpr_status rc = tpr_softmax(gpu, x, y);
  if (gpu->vt->kernels[TPR_OP_SOFTMAX] == NULL) {
    assert_int_equal(rc, TPR_ERR_UNSUPPORTED);
    assert_non_null(strstr(tpr_last_error(), "softmax"));
  }
  tpr_tensor_free(x), tpr_tensor_free(y);
}

int main(void) {
  if (tpr_cuda_device_count() == 0) {
    tpr_backend *b = NULL;
    tpr_status rc = tpr_backend_cuda_new(0, &b);
    // Even when skipping, the no-device path must be a clear error.
    if (rc != TPR_ERR_UNSUPPORTED || !strstr(tpr_last_error(), "no CUDA device")) {
      fprintf(stderr, "expected a 'no CUDA device' error, got %s: %s\n", tpr_status_name(rc), tpr_last_error());
      return 1;
    }
    printf("no CUDA device: skipped (%s)\n", tpr_last_error());
    return 77;
  }
  tt_seed_from_env();
  if (tpr_backend_cuda_new(0, &gpu) != TPR_OK) {
    fprintf(stderr, "cuda backend: %s\n", tpr_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_missing_kernel_is_an_error),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(gpu);
  return rc;
}
