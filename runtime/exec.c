// Executing a program: one arena from the memory planner, a tensor handle per
// value, and the nodes run in order through tpr_op_run (which re-checks every
// shape, so a bad binding can never make a kernel read out of bounds).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "program_impl.h"

struct tpr_exec {
  const tpr_program *p;
  tpr_backend *be;
  tpr_memory_plan plan;
  void *arena;
  tpr_tensor **handles;  // (n_values) handle per value; NULL until bound/created
  tpr_exec_collectives coll;  // how collective ops run; run == NULL until set
  double *node_seconds;       // (n_nodes) while profiling, else NULL
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tpr_status tpr_exec_set_profiling(tpr_exec *e, bool on) {
  free(e->node_seconds);
  e->node_seconds = NULL;
  if (on && !(e->node_seconds = calloc((size_t)(e->p->n_nodes ? e->p->n_nodes : 1), sizeof *e->node_seconds)))
    return TPR_FAIL(TPR_ERR_OOM, "exec profile");
  return TPR_OK;
}

const double *tpr_exec_node_seconds(const tpr_exec *e) { return e->node_seconds; }

void tpr_exec_set_collectives(tpr_exec *e, const tpr_exec_collectives *c) {
  e->coll = c ? *c : (tpr_exec_collectives){0};
}

// Collective ops leave the backend: finish its queued work, then call out.
static tpr_status run_collective(tpr_exec *e, const tpr_node *node, const tpr_tensor *const *in, tpr_tensor *out) {
  if (!e->coll.run)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s over %s: the program has collective ops but the exec has no "
                    "communicators (tpr_exec_set_collectives)", tpr_op_name(node->op),
                    tpr_mesh_axis_name((tpr_mesh_axis)node->attrs.i[0]));
  TPR_CHECK(tpr_backend_sync(e->be));
  return e->coll.run(e->coll.ctx, node->op, &node->attrs, in, node->n_in, out);
}

// A handle with v's geometry over the memory starting at base_data.
static tpr_status make_handle(tpr_exec *e, tpr_value_id v, void *base_data, tpr_tensor **out) {
  const tpr_tensor *d = &e->p->values[v].desc;
  TPR_CHECK(tpr_tensor_wrap(e->be, d->dtype, 0, NULL, base_data ? base_data : e->arena, out));
  tpr__view_apply(*out, d);
  (*out)->dtype = d->dtype;
  return TPR_OK;
}

tpr_status tpr_exec_new(const tpr_program *p, tpr_backend *backend, tpr_exec **out) {
  *out = NULL;
  tpr_exec *e = calloc(1, sizeof *e);
  size_t *offsets = malloc((size_t)(p->n_values ? p->n_values : 1) * sizeof *offsets);
  tpr_status rc = TPR_OK;
  if (!e || !offsets) {
    rc = TPR_FAIL(TPR_ERR_OOM, "exec");
    goto fail;
  }
  e->p = p;
  e->be = backend;
  e->handles = calloc((size_t)(p->n_values ? p->n_values : 1), sizeof *e->handles);
  if (!e->handles) {
    rc = TPR_FAIL(TPR_ERR_OOM, "exec handles");
    goto fail;
  }
  TPR_CHECK_GOTO(tpr_program_plan_memory(p, &e->plan, offsets), rc, fail);
  TPR_CHECK_GOTO(tpr_backend_alloc(backend, e->plan.arena_bytes, &e->arena), rc, fail);
  for (int v = 0; v < p->n_values; v++) {
    if (offsets[v] == TPR_PLAN_NONE) continue;
    TPR_CHECK_GOTO(make_handle(e, v, (char *)e->arena + offsets[v], &e->handles[v]), rc, fail);
  }
  free(offsets);
  *out = e;
  return TPR_OK;
fail:
  free(offsets);
  tpr_exec_free(e);
  return rc;
}

void tpr_exec_free(tpr_exec *e) {
  if (!e) return;
  if (e->handles)
    for (int v = 0; v < e->p->n_values; v++) tpr_tensor_free(e->handles[v]);
  free(e->handles);
  free(e->node_seconds);
  if (e->arena) tpr_backend_release(e->be, e->arena);
  free(e);
}

const tpr_memory_plan *tpr_exec_plan(const tpr_exec *e) { return &e->plan; }

tpr_status tpr_exec_bind(tpr_exec *e, const char *name, const tpr_tensor *t) {
  tpr_value_id v = name ? tpr__program_find(e->p, name) : -1;
  if (v < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "bind: the program has no input or param '%s'", name ? name : "");
  const tpr_value_rec *r = &e->p->values[v];
  if (r->kind == TPR_VALUE_NODE) return TPR_FAIL(TPR_ERR_INVALID_ARG, "bind: '%s' is an output, not an input", name);
  if (!t) return TPR_FAIL(TPR_ERR_INVALID_ARG, "bind '%s': NULL tensor", name);
  if (t->dtype != r->desc.dtype || !tpr_tensor_same_shape(t, &r->desc)) {
    char w[128], g[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "bind '%s': expected %s, got %s", name, tpr_tensor_describe(&r->desc, w, sizeof w),
                    tpr_tensor_describe(t, g, sizeof g));
  }
  if (!tpr_tensor_is_contiguous(t)) return TPR_FAIL(TPR_ERR_SHAPE, "bind '%s': tensor must be contiguous", name);
  if (tpr_tensor_backend(t) != e->be)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "bind '%s': tensor lives on backend %s, program runs on %s", name,
                    tpr_backend_name(tpr_tensor_backend(t)), tpr_backend_name(e->be));
  tpr_tensor *h;
  TPR_CHECK(make_handle(e, v, tpr_tensor_data(t), &h));
  tpr_tensor_free(e->handles[v]);
  e->handles[v] = h;
  return TPR_OK;
}

// Views of inputs follow whatever is bound now, so they are rebuilt per run.
static tpr_status refresh_views(tpr_exec *e) {
  for (int v = 0; v < e->p->n_values; v++) {
    const tpr_value_rec *r = &e->p->values[v];
    if (r->base == v) continue;
    tpr_tensor *h;
    TPR_CHECK(make_handle(e, v, tpr_tensor_data(e->handles[r->base]), &h));
    tpr_tensor_free(e->handles[v]);
    e->handles[v] = h;
  }
  return TPR_OK;
}

tpr_status tpr_exec_run(tpr_exec *e) {
  const tpr_program *p = e->p;
  for (int v = 0; v < p->n_values; v++)
    if (p->values[v].kind != TPR_VALUE_NODE && !e->handles[v])
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "run: %s '%s' is not bound",
                      p->values[v].kind == TPR_VALUE_INPUT ? "input" : "param", p->values[v].name);
  TPR_CHECK(refresh_views(e));
  for (int n = 0; n < p->n_nodes; n++) {
    const tpr_node *node = &p->nodes[n];
    if (tpr_op_is_view(node->op)) continue;
    const tpr_tensor *in[TPR_OP_MAX_INPUTS];
    for (int i = 0; i < node->n_in; i++) in[i] = e->handles[node->in[i]];
    double t0 = e->node_seconds ? now_s() : 0;
    tpr_status rc = tpr_op_is_collective(node->op)
                        ? run_collective(e, node, in, e->handles[node->out])
                        : tpr_op_run(e->be, node->op, in, node->n_in, &node->attrs, e->handles[node->out]);
    if (rc == TPR_OK && e->node_seconds) {
      rc = tpr_backend_sync(e->be);
      e->node_seconds[n] += now_s() - t0;
    }
    if (rc != TPR_OK) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", tpr_last_error());
      return TPR_FAIL(rc, "run: node %d (%s) failed: %s", n, tpr_op_name(node->op), msg);
    }
  }
  return tpr_backend_sync(e->be);
}

tpr_status tpr_exec_output(tpr_exec *e, const char *name, const tpr_tensor **out) {
  tpr_value_id v = name ? tpr__program_find(e->p, name) : -1;
  if (v < 0 || !e->p->values[v].is_output)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "the program has no output '%s'", name ? name : "");
  *out = e->handles[v];
  return TPR_OK;
}
