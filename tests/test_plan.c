// The memory planner: peak arena bytes strictly below the naive sum on a
// chain; on random DAGs no two simultaneously live buffers share bytes, and
// running the planned program matches evaluating every node into its own
// fresh tensor, bit for bit.
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static void test_chain_peak_below_naive(void **state) {
  enum { N = 1000, LEN = 12 };
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  tpr_value_id x, w, cur;
  TT_OK(tpr_program_input(p, "x", TPR_F32, 1, (const int64_t[]){N}, &x));
  TT_OK(tpr_program_param(p, "w", TPR_F32, 1, (const int64_t[]){N}, &w));
  cur = x;
  for (int i = 0; i < LEN; i++) TT_OK((i % 2 ? tpr_pb_add : tpr_pb_mul)(p, cur, w, &cur));
  TT_OK(tpr_program_output(p, cur, "y"));
  tpr_memory_plan plan;
  TT_OK(tpr_program_plan_memory(p, &plan, NULL));
  size_t one = (N * sizeof(float) + TPR_PLAN_ALIGN - 1) / TPR_PLAN_ALIGN * TPR_PLAN_ALIGN;
  assert_int_equal(plan.n_buffers, LEN);
  assert_int_equal(plan.naive_bytes, LEN * one);
  assert_true(plan.arena_bytes < plan.naive_bytes);
  // A chain needs exactly two live buffers at a time (input and output of a node).
  assert_int_equal(plan.arena_bytes, 2 * one);
  tpr_program_free(p);
}

enum { MAXV = 200, R = 6, C = 10 };

// What the test knows about each program value, recorded while building: the
// node that made it, the node inputs, and the value whose bytes it uses.
typedef struct dag {
  tpr_program *p;
  int nv, n_nodes;
  int producer[MAXV];          // node index, -1 for x and w
  int base[MAXV];              // itself, or the viewed value's base
  int node_in[MAXV][2], node_n_in[MAXV];
  bool is_output[MAXV];
  bool rc_shaped[MAXV];        // (R, C): usable as an op input
  tpr_tensor *ref[MAXV];       // eager reference: a fresh tensor (or view) per value
} dag;

static int add_value(dag *g, tpr_value_id id, int n_in, int in0, int in1, bool view, tpr_tensor *ref) {
  assert_int_equal(id, g->nv);
  g->producer[id] = g->n_nodes;
  g->node_n_in[g->n_nodes] = n_in;
  g->node_in[g->n_nodes][0] = in0;
  g->node_in[g->n_nodes][1] = in1;
  g->n_nodes++;
  g->base[id] = view ? g->base[in0] : id;
  g->ref[id] = ref;
  g->rc_shaped[id] = ref->shape[0] == R;
  return g->nv++;
}

static tpr_tensor *fresh(tpr_backend *be, int r, int c) {
  tpr_tensor *t;
  TT_OK(tpr_tensor_new(be, TPR_F32, 2, (const int64_t[]){r, c}, &t));
  return t;
}

// Random DAG over (R, C) f32 values: add/mul of any two earlier values,
// softmax, and reshape-view -> cast -> reshape-view (a view feeding a copy).
// Every op is also run eagerly into fresh tensors as the unplanned reference.
static void random_dag(dag *g, int n_ops, tpr_tensor *x, tpr_tensor *w) {
  tpr_backend *be = tt_cpu();
  memset(g, 0, sizeof *g);
  TT_OK(tpr_program_new(&g->p));
  tpr_value_id id;
  TT_OK(tpr_program_input(g->p, "x", TPR_F32, 2, (const int64_t[]){R, C}, &id));
  TT_OK(tpr_program_param(g->p, "w", TPR_F32, 2, (const int64_t[]){R, C}, &id));
  g->nv = 2;
  g->producer[0] = g->producer[1] = -1;
  g->base[0] = 0, g->base[1] = 1;
  g->ref[0] = x, g->ref[1] = w;
  g->rc_shaped[0] = g->rc_shaped[1] = true;
  for (int i = 0; i < n_ops && g->nv + 3 <= MAXV; i++) {
    int a, b;
    do a = (int)tt_randint(0, g->nv - 1); while (!g->rc_shaped[a]);
    do b = (int)tt_randint(0, g->nv - 1); while (!g->rc_shaped[b]);
    int kind = (int)tt_randint(0, 3);
    if (kind <= 1) {
      tpr_tensor *r = fresh(be, R, C);
      TT_OK((kind ? tpr_pb_mul : tpr_pb_add)(g->p, a, b, &id));
      TT_OK((kind ? tpr_mul : tpr_add)(be, g->ref[a], g->ref[b], r));
      add_value(g, id, 2, a, b, false, r);
    } else if (kind == 2) {
      tpr_tensor *r = fresh(be, R, C);
      TT_OK(tpr_pb_softmax(g->p, a, &id));
      TT_OK(tpr_softmax(be, g->ref[a], r));
      add_value(g, id, 1, a, -1, false, r);
    } else {
      tpr_tensor *t, *c = fresh(be, C, R), *back;
      TT_OK(tpr_pb_reshape(g->p, a, 2, (const int64_t[]){C, R}, &id));
      TT_OK(tpr_tensor_reshape(g->ref[a], 2, (const int64_t[]){C, R}, &t));
      int tv = add_value(g, id, 1, a, -1, true, t);
      TT_OK(tpr_pb_cast(g->p, tv, TPR_F32, &id));
      TT_OK(tpr_cast(be, t, c));
      int cv = add_value(g, id, 1, tv, -1, false, c);
      TT_OK(tpr_pb_reshape(g->p, cv, 2, (const int64_t[]){R, C}, &id));
      TT_OK(tpr_tensor_reshape(c, 2, (const int64_t[]){R, C}, &back));
      add_value(g, id, 1, cv, -1, true, back);
    }
  }
  char name[32];
  for (int v = 2; v < g->nv; v++) {
    if (v != g->nv - 1 && tt_randint(0, 4)) continue;
    snprintf(name, sizeof name, "out%d", v);
    TT_OK(tpr_program_output(g->p, v, name));
    g->is_output[v] = true;
  }
}

// Independently derived lifetimes: [producer, last reader of it or of a
// view of it]; outputs live to the end. Live intervals that intersect must
// not share arena bytes. Returns the number of conflicting pairs.
static int count_conflicts(const dag *g, const size_t *offsets, bool report) {
  int last[MAXV];
  for (int v = 0; v < g->nv; v++) last[v] = g->producer[v];
  for (int n = 0; n < g->n_nodes; n++)
    for (int i = 0; i < g->node_n_in[n]; i++) {
      int b = g->base[g->node_in[n][i]];
      if (last[b] < n) last[b] = n;
    }
  for (int v = 0; v < g->nv; v++)
    if (g->is_output[v]) last[g->base[v]] = g->n_nodes;
  size_t bytes = R * C * sizeof(float);
  int conflicts = 0;
  for (int a = 0; a < g->nv; a++)
    for (int b = a + 1; b < g->nv; b++) {
      if (offsets[a] == TPR_PLAN_NONE || offsets[b] == TPR_PLAN_NONE) continue;
      assert_true(g->base[a] == a && g->base[b] == b);  // only real buffers are planned
      bool live_together = g->producer[a] <= last[b] && g->producer[b] <= last[a];
      bool share = offsets[a] < offsets[b] + bytes && offsets[b] < offsets[a] + bytes;
      if (live_together && share) {
        if (report)
        print_message("values %d [%d,%d] and %d [%d,%d] share bytes at offsets %zu and %zu\n", a, g->producer[a],
                      last[a], b, g->producer[b], last[b], offsets[a], offsets[b]);
        conflicts++;
      }
    }
  return conflicts;
}

static void test_random_dags_match_unplanned(void **state) {
  tpr_backend *be = tt_cpu();
  int reused = 0, controls = 0;
  for (int trial = 0; trial < 80; trial++) {
    tpr_tensor *x = tt_random_f32(be, 2, (const int64_t[]){R, C}, NULL);
    tpr_tensor *w = tt_random_f32(be, 2, (const int64_t[]){R, C}, NULL);
    dag g;
    random_dag(&g, (int)tt_randint(3, 40), x, w);
    size_t offsets[MAXV];
    tpr_memory_plan plan;
    TT_OK(tpr_program_plan_memory(g.p, &plan, offsets));
    assert_true(plan.arena_bytes <= plan.naive_bytes);
    reused += plan.arena_bytes < plan.naive_bytes;
    assert_int_equal(count_conflicts(&g, offsets, true), 0);
    // Negative control: everything at offset 0 must be caught whenever two
    // planned buffers are live together (any node reading a planned value).
    size_t zero[MAXV];
    for (int v = 0; v < g.nv; v++) {
      zero[v] = offsets[v] == TPR_PLAN_NONE ? TPR_PLAN_NONE : 0;
    }
    if (plan.arena_bytes > R * C * sizeof(float) + TPR_PLAN_ALIGN) {
      assert_true(count_conflicts(&g, zero, false) > 0);
      controls++;
    }

    tpr_exec *e;
    TT_OK(tpr_exec_new(g.p, be, &e));
    TT_OK(tpr_exec_bind(e, "x", x));
    TT_OK(tpr_exec_bind(e, "w", w));
    TT_OK(tpr_exec_run(e));
    for (int v = 0; v < g.nv; v++) {
      if (!g.is_output[v]) continue;
      char name[32];
      snprintf(name, sizeof name, "out%d", v);
      const tpr_tensor *got;
      TT_OK(tpr_exec_output(e, name, &got));
      float *ref = malloc(R * C * sizeof *ref), *out = malloc(R * C * sizeof *out);
      TT_OK(tpr_tensor_to_host(g.ref[v], ref, R * C * sizeof *ref));
      TT_OK(tpr_tensor_to_host(got, out, R * C * sizeof *out));
      assert_memory_equal(out, ref, R * C * sizeof *ref);
      free(ref), free(out);
    }
    tpr_exec_free(e);
    for (int v = 0; v < g.nv; v++) tpr_tensor_free(g.ref[v]);
    tpr_program_free(g.p);
  }
  assert_true(reused > 40);
  assert_true(controls > 40);  // the planner actually shares memory on most DAGs
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chain_peak_below_naive),
      cmocka_unit_test(test_random_dags_match_unplanned),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
