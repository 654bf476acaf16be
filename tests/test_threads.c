// The threaded CPU kernels (cpu_threads.h) give bitwise identical results on
// one thread and on two: every kernel below runs on random inputs (seed
// printed) through a cpu backend of 1 thread and one of 2, and the two
// outputs must agree byte for byte. Sizes cross the threading threshold
// (TPR__PAR_MIN_WORK elements) both ways, and strided (transposed) inputs
// exercise the iterator's random access. Negative controls: the comparison
// must see a one-ulp change of one output element, and a one-element change
// of an input must change the 2-thread output.
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/ops/cpu_threads.h"

static tpr_backend *be1, *be2;

typedef struct tin {
  tpr_dtype dt;
  int nd;
  int64_t shape[4];  // the logical shape
  bool transpose;    // stored with the last two dims swapped, read through a transposed view
  void *h;           // host data (numel elements)
} tin;

static int64_t tin_numel(const tin *t) {
  int64_t n = 1;
  for (int d = 0; d < t->nd; d++) n *= t->shape[d];
  return n;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// Runs op on be over ins (wrapped host memory); returns the output bytes
// (malloc'ed; *nbytes set) and the kernel's wall time in *ms.
static unsigned char *run_on(tpr_backend *be, tpr_op_kind op, const tin *ins, int n, const tpr_op_attrs *at,
                             size_t *nbytes, double *ms) {
  tpr_tensor *w[4] = {0}, *v[4] = {0};
  const tpr_tensor *t[4];
  for (int i = 0; i < n; i++) {
    int64_t sh[4];
    memcpy(sh, ins[i].shape, sizeof sh);
    if (ins[i].transpose) sh[ins[i].nd - 2] = ins[i].shape[ins[i].nd - 1], sh[ins[i].nd - 1] = ins[i].shape[ins[i].nd - 2];
    TT_OK(tpr_tensor_wrap(be, ins[i].dt, ins[i].nd, sh, ins[i].h, &w[i]));
    if (ins[i].transpose) TT_OK(tpr_tensor_transpose(w[i], ins[i].nd - 2, ins[i].nd - 1, &v[i]));
    t[i] = v[i] ? v[i] : w[i];
  }
  tpr_tensor desc;
  TT_OK(tpr__op_infer(op, t, n, at, &desc));
  *nbytes = (size_t)tpr_tensor_numel(&desc) * tpr_dtype_size(desc.dtype);
  unsigned char *o = malloc(*nbytes ? *nbytes : 1);
  assert_non_null(o);
  memset(o, 0xA5, *nbytes);  // the same filler on both sides: an element nobody writes compares equal, not random
  tpr_tensor *ot;
  TT_OK(tpr_tensor_wrap(be, desc.dtype, desc.ndim, desc.shape, o, &ot));
  double t0 = now_ms();
  TT_OK(tpr_op_run(be, op, t, n, at, ot));
  *ms = now_ms() - t0;
  tpr_tensor_free(ot);
  for (int i = 0; i < n; i++) tpr_tensor_free(v[i]), tpr_tensor_free(w[i]);
  return o;
}

// Runs op on 1 and 2 threads; true when the outputs agree byte for byte.
static bool same_on_1_and_2(const char *name, tpr_op_kind op, const tin *ins, int n, const tpr_op_attrs *at) {
  size_t n1, n2;
  double ms1, ms2;
  unsigned char *o1 = run_on(be1, op, ins, n, at, &n1, &ms1);
  unsigned char *o2 = run_on(be2, op, ins, n, at, &n2, &ms2);
  assert_int_equal(n1, n2);
  const bool same = memcmp(o1, o2, n1) == 0;
  int64_t work = 0;
  for (int i = 0; i < n; i++) work = tin_numel(&ins[i]) > work ? tin_numel(&ins[i]) : work;
  bool strided = false;
  for (int i = 0; i < n; i++) strided |= ins[i].transpose;
  printf("  %-24s %-9s %s  out %8zu B  1 thr %7.3f ms  2 thr %7.3f ms  %s\n", name, strided ? "(strided)" : "",
         work >= TPR__PAR_MIN_WORK ? "threaded" : "serial  ", n1, ms1, ms2, same ? "bitwise equal" : "DIFFER");
  free(o1), free(o2);
  return same;
}

// ---- input makers

static tin f32_in(int nd, const int64_t *shape, bool transpose, double scale) {
  tin t = {TPR_F32, nd, {0}, transpose, NULL};
  memcpy(t.shape, shape, (size_t)nd * sizeof *shape);
  int64_t n = tin_numel(&t);
  t.h = malloc((size_t)(n ? n : 1) * sizeof(float));
  tt_fill_normal(t.h, (size_t)n, scale);
  return t;
}

static tin i32_in(int64_t n, int64_t lo, int64_t hi) {  // (n) values in [lo, hi]
  tin t = {TPR_I32, 1, {n}, false, NULL};
  int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = (int32_t)tt_randint(lo, hi);
  t.h = v;
  return t;
}

// (N, E) gates with k positive entries per row at random experts.
static tin gates_in(int64_t N, int64_t E, int64_t k) {
  tin t = {TPR_F32, 2, {N, E}, false, NULL};
  float *g = calloc((size_t)(N * E), sizeof *g);
  for (int64_t r = 0; r < N; r++)
    for (int64_t j = 0; j < k;) {
      int64_t e = tt_randint(0, E - 1);
      if (g[r * E + e] != 0.0f) continue;
      g[r * E + e] = (float)tt_uniform(0.05, 1.0);
      j++;
    }
  t.h = g;
  return t;
}

static void free_ins(tin *ins, int n) {
  for (int i = 0; i < n; i++) free(ins[i].h);
}

static const int64_t Ts[] = {1, 5, 64, 300};  // rows: 1 and 5 stay serial at H <= 1024, 64 and 300 thread

// ---- tests

static void test_norms(void **state) {
  for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++)
    for (int tr = 0; tr < 2; tr++) {
      const int64_t T = Ts[c], H = 1024, xs[2] = {T, H}, ws[1] = {H}, ss[2] = {T, 1};
      tin in[3] = {f32_in(2, xs, tr, 1.0), f32_in(1, ws, false, 1.0)};
      tpr_op_attrs at = {.n_f = 1, .f = {1e-6f}};
      assert_true(same_on_1_and_2("rms_norm", TPR_OP_RMS_NORM, in, 2, &at));
      assert_true(same_on_1_and_2("sum_squares", TPR_OP_SUM_SQUARES, in, 1, NULL));
      tin sum = f32_in(2, ss, false, 1.0);
      for (int64_t t = 0; t < T; t++) ((float *)sum.h)[t] = fabsf(((float *)sum.h)[t]) * 1000.0f;
      in[2] = in[1], in[1] = sum;
      tpr_op_attrs at2 = {.n_f = 2, .f = {2048.0f, 1e-6f}};
      assert_true(same_on_1_and_2("rms_scale", TPR_OP_RMS_SCALE, in, 3, &at2));
      free_ins(in, 3);
    }
}

static void test_rope(void **state) {
  for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++) {
    const int64_t T = Ts[c], xs[3] = {T, 16, 64};
    tin in[2] = {f32_in(3, xs, false, 1.0), i32_in(T, 0, 4095)};
    tpr_op_attrs at = {.n_i = 1, .i = {32}, .n_f = 1, .f = {5e6f}};
    assert_true(same_on_1_and_2("rope", TPR_OP_ROPE, in, 2, &at));
    assert_true(same_on_1_and_2("rope_bwd", TPR_OP_ROPE_BWD, in, 2, &at));
    free_ins(in, 2);
  }
}

static void test_softmax(void **state) {
  for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++)
    for (int tr = 0; tr < 2; tr++) {
      const int64_t T = Ts[c], xs[2] = {T, 1000};
      tin in[2] = {f32_in(2, xs, tr, 3.0), f32_in(2, xs, false, 1.0)};
      assert_true(same_on_1_and_2("softmax", TPR_OP_SOFTMAX, in, 1, NULL));
      in[0].transpose = false;
      assert_true(same_on_1_and_2("softmax_bwd", TPR_OP_SOFTMAX_BWD, in, 2, NULL));
      free_ins(in, 2);
    }
}

static void test_router(void **state) {
  for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++) {
    const int64_t T = Ts[c], E = 64, ls[2] = {T, E}, bs[1] = {E};
    tin in[3] = {f32_in(2, ls, false, 2.0), f32_in(1, bs, false, 0.1), f32_in(2, ls, false, 1.0)};
    tpr_op_attrs at = {.n_i = 1, .i = {4}};
    assert_true(same_on_1_and_2("router_sigmoid_topk", TPR_OP_ROUTER_SIGMOID_TOPK, in, 2, &at));
    assert_true(same_on_1_and_2("router_sigmoid_topk_bwd", TPR_OP_ROUTER_SIGMOID_TOPK_BWD, in, 3, &at));
    free_ins(in, 3);
  }
}

static void test_elementwise(void **state) {
  for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++)
    for (int tr = 0; tr < 2; tr++) {
      const int64_t T = Ts[c], F = 1000 + tt_randint(0, 70), xs[2] = {T, F}, rs[1] = {F};
      tin in[3] = {f32_in(2, xs, tr, 2.0), f32_in(2, xs, false, 1.0), f32_in(2, xs, false, 1.0)};
      assert_true(same_on_1_and_2("add", TPR_OP_ADD, in, 2, NULL));
      assert_true(same_on_1_and_2("mul", TPR_OP_MUL, in, 2, NULL));
      assert_true(same_on_1_and_2("swiglu", TPR_OP_SWIGLU, in, 2, NULL));
      assert_true(same_on_1_and_2("swiglu_bwd", TPR_OP_SWIGLU_BWD, in, 3, NULL));
      assert_true(same_on_1_and_2("sigmoid", TPR_OP_SIGMOID, in, 1, NULL));
      assert_true(same_on_1_and_2("sigmoid_bwd", TPR_OP_SIGMOID_BWD, in, 2, NULL));
      tin bc[2] = {in[0], f32_in(1, rs, false, 1.0)};  // a broadcast row
      assert_true(same_on_1_and_2("add (broadcast)", TPR_OP_ADD, bc, 2, NULL));
      free(bc[1].h);
      free_ins(in, 3);
    }
}

static void test_moe_dispatch(void **state) {
  const int64_t Ns[] = {3, 64, 200};
  for (size_t c = 0; c < sizeof Ns / sizeof *Ns; c++) {
    const int64_t N = Ns[c], H = 256, E = 8, k = 2, R = N * k, xs[2] = {N, H}, ys[2] = {R, H};
    tin in[3] = {f32_in(2, xs, false, 1.0), gates_in(N, E, k), f32_in(2, xs, false, 1.0)};
    tpr_op_attrs at = {.n_i = 1, .i = {R}};
    assert_true(same_on_1_and_2("moe_permute", TPR_OP_MOE_PERMUTE, in, 2, &at));
    tin un[3] = {f32_in(2, ys, false, 1.0), in[1], in[2]};
    assert_true(same_on_1_and_2("moe_unpermute", TPR_OP_MOE_UNPERMUTE, un, 2, NULL));
    assert_true(same_on_1_and_2("moe_permute_bwd", TPR_OP_MOE_PERMUTE_BWD, un, 2, NULL));
    assert_true(same_on_1_and_2("moe_unpermute_bwd", TPR_OP_MOE_UNPERMUTE_BWD, un, 3, NULL));
    free(un[0].h);
    free_ins(in, 3);
  }
}

static void test_gathers(void **state) {
  for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++) {
    const int64_t T = Ts[c], V = 500, H = 768, ts[2] = {V, H};
    tin in[3] = {f32_in(2, ts, false, 1.0), i32_in(T, 0, 2 * V - 1), i32_in(1, 1, 1)};
    assert_true(same_on_1_and_2("embedding_shard", TPR_OP_EMBEDDING_SHARD, in, 3, NULL));
    for (int64_t i = 0; i < T; i++) ((int32_t *)in[1].h)[i] %= (int32_t)V;
    assert_true(same_on_1_and_2("embedding", TPR_OP_EMBEDDING, in, 2, NULL));
    tpr_op_attrs at = {.n_i = 1, .i = {0}};
    assert_true(same_on_1_and_2("index_select", TPR_OP_INDEX_SELECT, in, 2, &at));
    free_ins(in, 3);
  }
}

static void test_cast(void **state) {
  for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++)
    for (int tr = 0; tr < 2; tr++) {
      const int64_t T = Ts[c], xs[2] = {T, 1000 + tt_randint(0, 30)};
      tin in[1] = {f32_in(2, xs, tr, 3.0)};
      tpr_op_attrs to_bf16 = {.n_i = 1, .i = {TPR_BF16}}, to_f32 = {.n_i = 1, .i = {TPR_F32}};
      assert_true(same_on_1_and_2("cast f32->bf16", TPR_OP_CAST, in, 1, &to_bf16));
      assert_true(same_on_1_and_2("cast f32->f32 (copy)", TPR_OP_CAST, in, 1, &to_f32));
      free_ins(in, 1);
    }
}

static void test_xent(void **state) {
  for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++) {
    const int64_t T = Ts[c], Vl = 1000, V = 1900, ls[2] = {T, Vl}, cs[2] = {T, 1};
    // shard 1 of V = 1900 in Vl = 1000 columns: 900 real, 100 padding.
    tin in[4] = {f32_in(2, ls, false, 3.0), f32_in(2, cs, false, 1.0), i32_in(1, 1, 1), f32_in(2, cs, false, 1.0)};
    tpr_op_attrs at = {.n_i = 1, .i = {V}};
    tin mx[2] = {in[0], in[2]};
    assert_true(same_on_1_and_2("xent_max", TPR_OP_XENT_MAX, mx, 2, &at));
    for (int64_t t = 0; t < T; t++) ((float *)in[1].h)[t] += 8.0f;  // a max-like shift
    assert_true(same_on_1_and_2("xent_sumexp", TPR_OP_XENT_SUMEXP, in, 3, &at));
    assert_true(same_on_1_and_2("xent_sumexp_bwd", TPR_OP_XENT_SUMEXP_BWD, in, 4, &at));
    free_ins(in, 4);
  }
}

// The comparison can fail: a one-ulp change of one output element, and a
// one-element change of one input, are both seen.
static void test_negative_control(void **state) {
  const int64_t xs[2] = {64, 1000};
  tin in[1] = {f32_in(2, xs, false, 3.0)};
  size_t n1, n2;
  double ms;
  unsigned char *o1 = run_on(be1, TPR_OP_SOFTMAX, in, 1, NULL, &n1, &ms);
  unsigned char *o2 = run_on(be2, TPR_OP_SOFTMAX, in, 1, NULL, &n2, &ms);
  assert_memory_equal(o1, o2, n1);
  const int64_t k = tt_randint(0, (int64_t)(n1 / 4) - 1);
  float *f = (float *)o2;
  f[k] = nextafterf(f[k], INFINITY);
  const bool caught_out = memcmp(o1, o2, n1) != 0;
  free(o2);
  ((float *)in[0].h)[k] += 1e-3f;
  o2 = run_on(be2, TPR_OP_SOFTMAX, in, 1, NULL, &n2, &ms);
  const bool caught_in = memcmp(o1, o2, n1) != 0;
  printf("  negative control: one-ulp change of out[%lld] %s, input change %s\n", (long long)k,
         caught_out ? "caught" : "MISSED", caught_in ? "caught" : "MISSED");
  assert_true(caught_out);
  assert_true(caught_in);
  free(o1), free(o2);
  free_ins(in, 1);
}

int main(void) {
  tt_seed_from_env();
  TT_OK(tpr_backend_cpu_new(&(tpr_cpu_options){.n_threads = 1}, &be1));
  TT_OK(tpr_backend_cpu_new(&(tpr_cpu_options){.n_threads = 2}, &be2));
  printf("threading threshold: %lld elements\n", (long long)TPR__PAR_MIN_WORK);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_norms),       cmocka_unit_test(test_rope),   cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_router),      cmocka_unit_test(test_elementwise),
      cmocka_unit_test(test_moe_dispatch), cmocka_unit_test(test_gathers), cmocka_unit_test(test_cast),
      cmocka_unit_test(test_xent),        cmocka_unit_test(test_negative_control),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(be1);
  tpr_backend_free(be2);
  return rc;
}
