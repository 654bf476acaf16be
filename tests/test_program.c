// Programs: build -> serialize -> deserialize -> execute gives results
// identical to the built program and to eager op-by-op execution; two
// independent builds give identical bytes; malformed bytes and bad bindings
// give clear errors, never a crash.
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { T = 5, H = 12, F = 20, V = 17 };

// ids (T) i32 -> embedding (T, H) -> rms_norm -> gate/up matmuls with w (F, H)
// transposed -> swiglu (T, F) -> down (T, H) -> + residual -> permute/reshape
// views -> softmax. Exercises every op kind and all three view kinds.
static tpr_program *build(float eps) {
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  tpr_value_id ids, table, norm, w1, w3, w2, sel, e, h, g, u, a, d, r, pt, rs, sm, sl, tok, c, back;
  TT_OK(tpr_program_input(p, "ids", TPR_I32, 1, (const int64_t[]){T}, &ids));
  TT_OK(tpr_program_param(p, "table", TPR_F32, 2, (const int64_t[]){V, H}, &table));
  TT_OK(tpr_program_param(p, "norm", TPR_F32, 1, (const int64_t[]){H}, &norm));
  TT_OK(tpr_program_param(p, "w1", TPR_F32, 2, (const int64_t[]){F, H}, &w1));
  TT_OK(tpr_program_param(p, "w3", TPR_F32, 2, (const int64_t[]){F, H}, &w3));
  TT_OK(tpr_program_param(p, "w2", TPR_F32, 2, (const int64_t[]){H, F}, &w2));
  TT_OK(tpr_program_input(p, "sel", TPR_I64, 1, (const int64_t[]){2}, &sel));
  TT_OK(tpr_pb_embedding(p, table, ids, &e));      // (T, H)
  TT_OK(tpr_pb_rms_norm(p, e, norm, eps, &h));     // (T, H)
  TT_OK(tpr_pb_matmul(p, h, w1, false, true, &g)); // (T, F)
  TT_OK(tpr_pb_matmul(p, h, w3, false, true, &u)); // (T, F)
  TT_OK(tpr_pb_swiglu(p, g, u, &a));               // (T, F)
  TT_OK(tpr_pb_matmul(p, a, w2, false, true, &d)); // (T, H)
  TT_OK(tpr_pb_add(p, d, e, &r));                  // (T, H) residual
  TT_OK(tpr_pb_permute(p, r, (const int[]){1, 0}, &pt));  // (H, T) view
  TT_OK(tpr_pb_cast(p, pt, TPR_F32, &c));                  // (H, T) contiguous copy
  TT_OK(tpr_pb_reshape(p, c, 3, (const int64_t[]){3, 4, T}, &rs));  // (3, 4, T) view
  TT_OK(tpr_pb_softmax(p, rs, &sm));                       // (3, 4, T)
  TT_OK(tpr_pb_slice(p, sm, 1, 1, 2, &sl));                // (3, 2, T) view
  TT_OK(tpr_pb_index_select(p, sl, 0, sel, &tok));         // (2, 2, T)
  TT_OK(tpr_pb_cast(p, tok, TPR_BF16, &back));             // (2, 2, T) bf16
  TT_OK(tpr_program_output(p, back, "probs_bf16"));
  TT_OK(tpr_program_output(p, r, "residual"));
  return p;
}

typedef struct inputs {
  tpr_tensor *ids, *table, *norm, *w1, *w3, *w2, *sel;
} inputs;

static tpr_tensor *index_tensor(tpr_dtype dt, int64_t n, int64_t hi) {
  tpr_tensor *t;
  TT_OK(tpr_tensor_new(tt_cpu(), dt, 1, (const int64_t[]){n}, &t));
  for (int64_t i = 0; i < n; i++) tpr_dtype_store(tpr_tensor_data(t), dt, (size_t)i, (double)tt_randint(0, hi - 1));
  return t;
}

static inputs make_inputs(void) {
  tpr_backend *be = tt_cpu();
  inputs in = {
      .ids = index_tensor(TPR_I32, T, V),
      .table = tt_random_f32(be, 2, (const int64_t[]){V, H}, NULL),
      .norm = tt_random_f32(be, 1, (const int64_t[]){H}, NULL),
      .w1 = tt_random_f32(be, 2, (const int64_t[]){F, H}, NULL),
      .w3 = tt_random_f32(be, 2, (const int64_t[]){F, H}, NULL),
      .w2 = tt_random_f32(be, 2, (const int64_t[]){H, F}, NULL),
      .sel = index_tensor(TPR_I64, 2, 3),
  };
  return in;
}

static void free_inputs(inputs *in) {
  tpr_tensor *all[] = {in->ids, in->table, in->norm, in->w1, in->w3, in->w2, in->sel};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tpr_tensor_free(all[i]);
}

static void bind_all(tpr_exec *e, const inputs *in) {
  TT_OK(tpr_exec_bind(e, "ids", in->ids));
  TT_OK(tpr_exec_bind(e, "table", in->table));
  TT_OK(tpr_exec_bind(e, "norm", in->norm));
  TT_OK(tpr_exec_bind(e, "w1", in->w1));
  TT_OK(tpr_exec_bind(e, "w3", in->w3));
  TT_OK(tpr_exec_bind(e, "w2", in->w2));
  TT_OK(tpr_exec_bind(e, "sel", in->sel));
}

// Runs p and returns a malloc'ed copy of output `name`.
static void *run_output(const tpr_program *p, const inputs *in, const char *name, size_t *nbytes) {
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  bind_all(e, in);
  TT_OK(tpr_exec_run(e));
  const tpr_tensor *out;
  TT_OK(tpr_exec_output(e, name, &out));
  *nbytes = tpr_tensor_nbytes(out);
  void *copy = malloc(*nbytes);
  TT_OK(tpr_tensor_to_host(out, copy, *nbytes));
  tpr_exec_free(e);
  return copy;
}

static void test_round_trip_identical(void **state) {
  tpr_program *p = build(1e-6f);
  uint8_t *bytes, *bytes2;
  size_t len, len2;
  TT_OK(tpr_program_serialize(p, &bytes, &len));
  tpr_program *q;
  TT_OK(tpr_program_deserialize(bytes, len, &q));
  TT_OK(tpr_program_serialize(q, &bytes2, &len2));
  assert_int_equal(len, len2);
  assert_memory_equal(bytes, bytes2, len);
  assert_int_equal(tpr_program_num_nodes(p), tpr_program_num_nodes(q));

  inputs in = make_inputs();
  const char *names[] = {"probs_bf16", "residual"};
  for (int k = 0; k < 2; k++) {
    size_t n1, n2;
    void *a = run_output(p, &in, names[k], &n1);
    void *b = run_output(q, &in, names[k], &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);  // bit-identical
    free(a), free(b);
  }
  free_inputs(&in);
  free(bytes), free(bytes2);
  tpr_program_free(p), tpr_program_free(q);
}

// The program's residual must equal the same ops run eagerly.
static void test_matches_eager(void **state) {
  tpr_program *p = build(1e-5f);
  inputs in = make_inputs();
  size_t nbytes;
  float *got = run_output(p, &in, "residual", &nbytes);
  tpr_backend *be = tt_cpu();
  tpr_tensor *e, *h, *g, *u, *a, *d, *r;
  TT_OK(tpr_tensor_new(be, TPR_F32, 2, (const int64_t[]){T, H}, &e));
  TT_OK(tpr_tensor_new(be, TPR_F32, 2, (const int64_t[]){T, H}, &h));
  TT_OK(tpr_tensor_new(be, TPR_F32, 2, (const int64_t[]){T, F}, &g));
  TT_OK(tpr_tensor_new(be, TPR_F32, 2, (const int64_t[]){T, F}, &u));
  TT_OK(tpr_tensor_new(be, TPR_F32, 2, (const int64_t[]){T, F}, &a));
  TT_OK(tpr_tensor_new(be, TPR_F32, 2, (const int64_t[]){T, H}, &d));
  TT_OK(tpr_tensor_new(be, TPR_F32, 2, (const int64_t[]){T, H}, &r));
  TT_OK(tpr_embedding(be, in.table, in.ids, e));
  TT_OK(tpr_rms_norm(be, e, in.norm, 1e-5f, h));
  TT_OK(tpr_matmul(be, h, in.w1, false, true, g));
  TT_OK(tpr_matmul(be, h, in.w3, false, true, u));
  TT_OK(tpr_swiglu(be, g, u, a));
  TT_OK(tpr_matmul(be, a, in.w2, false, true, d));
  TT_OK(tpr_add(be, d, e, r));
  assert_int_equal(nbytes, tpr_tensor_nbytes(r));
  assert_memory_equal(got, tpr_tensor_data(r), nbytes);
  // Negative control: a different eps must change the bytes, so the
  // comparison above is not vacuous.
  TT_OK(tpr_rms_norm(be, e, in.norm, 0.5f, h));
  TT_OK(tpr_matmul(be, h, in.w1, false, true, g));
  TT_OK(tpr_matmul(be, h, in.w3, false, true, u));
  TT_OK(tpr_swiglu(be, g, u, a));
  TT_OK(tpr_matmul(be, a, in.w2, false, true, d));
  TT_OK(tpr_add(be, d, e, r));
  assert_true(memcmp(got, tpr_tensor_data(r), nbytes) != 0);
  tpr_tensor *all[] = {e, h, g, u, a, d, r};
  for (int i = 0; i < 7; i++) tpr_tensor_free(all[i]);
  free(got);
  free_inputs(&in);
  tpr_program_free(p);
}

// Two builds with different heap histories give identical bytes; a changed
// attribute gives different bytes and a different hash.
static void test_independent_builds_identical(void **state) {
  tpr_program *p1 = build(1e-6f);
  void *junk[64];
  for (int i = 0; i < 64; i++) junk[i] = malloc((size_t)tt_randint(1, 4096));
  tpr_program *p2 = build(1e-6f);
  tpr_program *p3 = build(2e-6f);
  for (int i = 0; i < 64; i++) free(junk[i]);
  uint8_t *b1, *b2, *b3;
  size_t l1, l2, l3;
  TT_OK(tpr_program_serialize(p1, &b1, &l1));
  TT_OK(tpr_program_serialize(p2, &b2, &l2));
  TT_OK(tpr_program_serialize(p3, &b3, &l3));
  assert_int_equal(l1, l2);
  assert_memory_equal(b1, b2, l1);
  assert_true(l1 != l3 || memcmp(b1, b3, l1) != 0);
  uint64_t h1, h2, h3;
  TT_OK(tpr_program_hash(p1, &h1));
  TT_OK(tpr_program_hash(p2, &h2));
  TT_OK(tpr_program_hash(p3, &h3));
  assert_true(h1 == h2);
  assert_true(h1 != h3);
  free(b1), free(b2), free(b3);
  tpr_program_free(p1), tpr_program_free(p2), tpr_program_free(p3);
}

// Every truncation and many random corruptions either load (and re-validate)
// or fail with TPR_ERR_FORMAT; nothing crashes (ASan build checks reads).
static void test_malformed_bytes(void **state) {
  tpr_program *p = build(1e-6f);
  uint8_t *bytes;
  size_t len;
  TT_OK(tpr_program_serialize(p, &bytes, &len));
  int rejected = 0;
  for (size_t cut = 0; cut < len; cut++) {
    tpr_program *q = NULL;
    tpr_status rc = tpr_program_deserialize(bytes, cut, &q);
    if (rc != TPR_OK) {
      assert_int_equal(rc, TPR_ERR_FORMAT);
      assert_null(q);
      rejected++;
    }
    tpr_program_free(q);
  }
  assert_int_equal(rejected, (int)len);  // every strict prefix is refused, none loads as a smaller program
  uint8_t *copy = malloc(len);
  for (int trial = 0; trial < 2000; trial++) {
    memcpy(copy, bytes, len);
    int flips = (int)tt_randint(1, 4);
    for (int f = 0; f < flips; f++) copy[tt_randint(0, (int64_t)len - 1)] = (uint8_t)tt_next_u64();
    tpr_program *q = NULL;
    tpr_status rc = tpr_program_deserialize(copy, len, &q);
    if (rc != TPR_OK && rc != TPR_ERR_FORMAT) fail_msg("%s: %s", tpr_status_name(rc), tpr_last_error());
    tpr_program_free(q);
  }
  free(copy), free(bytes);
  tpr_program_free(p);
}

static void test_bind_errors(void **state) {
  tpr_program *p = build(1e-6f);
  inputs in = make_inputs();
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  assert_int_equal(tpr_exec_run(e), TPR_ERR_INVALID_ARG);  // nothing bound
  assert_non_null(strstr(tpr_last_error(), "not bound"));
  assert_int_equal(tpr_exec_bind(e, "nope", in.ids), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_exec_bind(e, "residual", in.ids), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_exec_bind(e, "ids", in.sel), TPR_ERR_SHAPE);  // wrong dtype and shape
  assert_non_null(strstr(tpr_last_error(), "expected i32(5)"));
  tpr_tensor *wt;
  TT_OK(tpr_tensor_transpose(in.w2, 0, 1, &wt));  // (F, H) but not contiguous
  assert_int_equal(tpr_exec_bind(e, "w1", wt), TPR_ERR_SHAPE);
  tpr_tensor_free(wt);
  bind_all(e, &in);
  // An out-of-range token id fails the run with the op named.
  int32_t bad = V;
  memcpy(tpr_tensor_data(in.ids), &bad, sizeof bad);
  assert_int_equal(tpr_exec_run(e), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "embedding"));
  const tpr_tensor *out;
  assert_int_equal(tpr_exec_output(e, "ids", &out), TPR_ERR_INVALID_ARG);
  tpr_exec_free(e);
  free_inputs(&in);
  tpr_program_free(p);
}

static void test_build_errors(void **state) {
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  tpr_value_id a, b, c;
  TT_OK(tpr_program_input(p, "a", TPR_F32, 2, (const int64_t[]){3, 4}, &a));
  TT_OK(tpr_program_input(p, "b", TPR_F32, 2, (const int64_t[]){5, 4}, &b));
  assert_int_equal(tpr_program_input(p, "a", TPR_F32, 1, (const int64_t[]){1}, &c), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_pb_matmul(p, a, b, false, false, &c), TPR_ERR_SHAPE);  // K 4 vs 5
  TT_OK(tpr_pb_matmul(p, a, b, false, true, &c));                            // (3, 5)
  assert_int_equal(tpr_pb_add(p, a, b, &c), TPR_ERR_SHAPE);                   // 3 vs 5
  assert_int_equal(tpr_pb_add(p, a, 99, &c), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_program_output(p, a, "x"), TPR_ERR_INVALID_ARG);       // inputs are not outputs
  assert_int_equal(tpr_pb_reshape(p, a, 2, (const int64_t[]){5, 5}, &c), TPR_ERR_SHAPE);
  tpr_value_id t;
  TT_OK(tpr_pb_permute(p, a, (const int[]){1, 0}, &t));
  assert_int_equal(tpr_pb_reshape(p, t, 1, (const int64_t[]){12}, &c), TPR_ERR_SHAPE);  // non-contiguous
  tpr_program_free(p);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_identical),
      cmocka_unit_test(test_matches_eager),
      cmocka_unit_test(test_independent_builds_identical),
      cmocka_unit_test(test_malformed_bytes),
      cmocka_unit_test(test_bind_errors),
      cmocka_unit_test(test_build_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
