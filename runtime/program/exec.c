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
  tpr_exec_comm_stats comm;   // since the last tpr_exec_comm_reset
  // Prefetch (tpr__program_gather_issue): the param_gather nodes in node
  // order, where each starts, and the requests in flight.
  int *gathers, n_gathers;    // (n_gathers) node ids
  int *issue;                 // (n_nodes)
  void **pending;             // (n_nodes) request of a started gather, else NULL
  double *started;            // (n_nodes) when it started
  bool *completed;            // (n_nodes) a poll saw it complete (its seconds are counted)
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

// Thread-local: a rank's engine runs its programs on one thread, and other
// threads' execs (tests running several) must not add to its totals.
static _Thread_local tpr_exec_op_profile *op_profile;

void tpr_exec_set_op_profile(tpr_exec_op_profile *p) { op_profile = p; }

void tpr_exec_set_collectives(tpr_exec *e, const tpr_exec_collectives *c) {
  e->coll = c ? *c : (tpr_exec_collectives){0};
}

const tpr_exec_comm_stats *tpr_exec_comm(const tpr_exec *e) { return &e->comm; }
void tpr_exec_comm_reset(tpr_exec *e) { memset(&e->comm, 0, sizeof e->comm); }

static double comm_bytes(const tpr_node *node, const tpr_tensor *const *in, const tpr_tensor *out) {
  if (node->op == TPR_OP_PARAM_GATHER)  // gathered in the shard's dtype, widened after
    return (double)tpr_tensor_nbytes(in[0]) * (double)node->attrs.i[1];
  size_t a = tpr_tensor_nbytes(in[0]), b = tpr_tensor_nbytes(out);
  return (double)(a > b ? a : b);
}

static tpr_status no_communicators(const tpr_node *node) {
  return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s over %s: the program has collective ops but the exec has no "
                  "communicators (tpr_exec_set_collectives)", tpr_op_name(node->op),
                  tpr_mesh_axis_name((tpr_mesh_axis)node->attrs.i[0]));
}

// Collective ops leave the backend: finish its queued work, then call out.
static tpr_status run_collective(tpr_exec *e, const tpr_node *node, const tpr_tensor *const *in, tpr_tensor *out) {
  if (!e->coll.run) return no_communicators(node);
  TPR_CHECK(tpr_backend_sync(e->be));
  double t0 = now_s();
  tpr_status rc = e->coll.run(e->coll.ctx, node->op, &node->attrs, in, node->n_in, out);
  double dt = now_s() - t0;
  e->comm.calls[node->op]++, e->comm.bytes[node->op] += comm_bytes(node, in, out);
  e->comm.seconds[node->op] += dt, e->comm.exposed[node->op] += dt;
  return rc;
}

static void node_inputs(tpr_exec *e, const tpr_node *node, const tpr_tensor **in) {
  for (int i = 0; i < node->n_in; i++) in[i] = e->handles[node->in[i]];
}

// Starts the prefetched gathers whose issue node is n (not n's own).
static tpr_status start_prefetches(tpr_exec *e, int n, int *cursor) {
  for (; *cursor < e->n_gathers && e->issue[e->gathers[*cursor]] <= n; (*cursor)++) {
    int g = e->gathers[*cursor];
    if (g <= n) continue;  // not prefetched: it runs at its own node
    const tpr_node *node = &e->p->nodes[g];
    const tpr_tensor *in[TPR_OP_MAX_INPUTS];
    node_inputs(e, node, in);
    TPR_CHECK(tpr_backend_sync(e->be));  // the collective reads memory the backend may still write
    double t0 = now_s();
    TPR_CHECK(e->coll.start(e->coll.ctx, node->op, &node->attrs, in, node->n_in, e->handles[node->out], &e->pending[g]));
    e->started[g] = t0, e->completed[g] = false;
    e->comm.exposed[node->op] += now_s() - t0;
  }
  return TPR_OK;
}

// Progress for the gathers in flight; notes when each completes.
static tpr_status poll_prefetches(tpr_exec *e, int from, int to) {
  for (int k = from; k < to; k++) {
    int g = e->gathers[k];
    if (!e->pending[g] || e->completed[g]) continue;
    bool done = false;
    TPR_CHECK(e->coll.test(e->coll.ctx, e->pending[g], &done));
    if (done) e->completed[g] = true, e->comm.seconds[TPR_OP_PARAM_GATHER] += now_s() - e->started[g];
  }
  return TPR_OK;
}

// Node g's prefetched gather: wait for it (the exposed part) and finish it.
static tpr_status finish_prefetch(tpr_exec *e, int g) {
  const tpr_node *node = &e->p->nodes[g];
  const tpr_tensor *in[TPR_OP_MAX_INPUTS];
  node_inputs(e, node, in);
  void *req = e->pending[g];
  e->pending[g] = NULL;
  double t0 = now_s();
  tpr_status rc = e->coll.finish(e->coll.ctx, req, in, e->handles[node->out]);
  double t1 = now_s();
  if (!e->completed[g]) e->comm.seconds[node->op] += t1 - e->started[g];
  e->comm.exposed[node->op] += t1 - t0;
  e->comm.calls[node->op]++, e->comm.bytes[node->op] += comm_bytes(node, in, e->handles[node->out]);
  return rc;
}

// After a failure: every request in flight completes before the arena may
// be reused (its bytes belong to the collective until then).
static void drain_prefetches(tpr_exec *e) {
  for (int k = 0; k < e->n_gathers; k++) {
    int g = e->gathers[k];
    if (!e->pending[g]) continue;
    const tpr_node *node = &e->p->nodes[g];
    const tpr_tensor *in[TPR_OP_MAX_INPUTS];
    node_inputs(e, node, in);
    (void)e->coll.finish(e->coll.ctx, e->pending[g], in, e->handles[node->out]);
    e->pending[g] = NULL;
  }
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
  int nn = p->n_nodes ? p->n_nodes : 1;
  e->issue = malloc((size_t)nn * sizeof *e->issue);
  e->gathers = malloc((size_t)nn * sizeof *e->gathers);
  e->pending = calloc((size_t)nn, sizeof *e->pending);
  e->started = calloc((size_t)nn, sizeof *e->started);
  e->completed = calloc((size_t)nn, sizeof *e->completed);
  if (!e->issue || !e->gathers || !e->pending || !e->started || !e->completed) {
    rc = TPR_FAIL(TPR_ERR_OOM, "exec prefetch");
    goto fail;
  }
  tpr__program_gather_issue(p, e->issue);
  for (int n = 0; n < p->n_nodes; n++)
    if (p->nodes[n].op == TPR_OP_PARAM_GATHER) e->gathers[e->n_gathers++] = n;
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
  free(e->issue), free(e->gathers), free(e->pending), free(e->started), free(e->completed);
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

bool tpr_exec_has(const tpr_exec *e, const char *name) {
  const tpr_value_id v = name ? tpr__program_find(e->p, name) : -1;
  return v >= 0 && e->p->values[v].kind != TPR_VALUE_NODE;
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
  tpr_exec_op_profile *prof = op_profile;
  double run_t0 = prof ? now_s() : 0;
  bool timed = prof || e->node_seconds;
  TPR_CHECK(refresh_views(e));
  // Prefetch needs the nonblocking entries; without them every gather runs
  // at its own node.
  bool prefetch = e->coll.start && e->coll.test && e->coll.finish && e->n_gathers > 0;
  int cursor = 0, polled_from = 0;
  for (int n = 0; n < p->n_nodes; n++) {
    const tpr_node *node = &p->nodes[n];
    if (tpr_op_is_view(node->op)) continue;
    const tpr_tensor *in[TPR_OP_MAX_INPUTS];
    node_inputs(e, node, in);
    double t0 = timed ? now_s() : 0;
    tpr_status rc = TPR_OK;
    if (prefetch) rc = start_prefetches(e, n, &cursor);
    if (rc != TPR_OK)
      ;
    else if (prefetch && e->pending[n])
      rc = finish_prefetch(e, n);
    else if (tpr_op_is_collective(node->op))
      rc = run_collective(e, node, in, e->handles[node->out]);
    else
      rc = tpr_op_run(e->be, node->op, in, node->n_in, &node->attrs, e->handles[node->out]);
    if (rc == TPR_OK && prefetch) {
      while (polled_from < cursor && !e->pending[e->gathers[polled_from]]) polled_from++;
      rc = poll_prefetches(e, polled_from, cursor);
    }
    if (rc == TPR_OK && timed) {
      rc = tpr_backend_sync(e->be);
      double dt = now_s() - t0;
      if (e->node_seconds) e->node_seconds[n] += dt;
      if (prof) prof->seconds[node->op] += dt, prof->calls[node->op]++;
    }
    if (rc != TPR_OK) {
      if (prefetch) drain_prefetches(e);
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", tpr_last_error());
      return TPR_FAIL(rc, "run: node %d (%s) failed: %s", n, tpr_op_name(node->op), msg);
    }
  }
  tpr_status rc = tpr_backend_sync(e->be);
  if (prof) prof->runs++, prof->run_seconds += now_s() - run_t0;
  return rc;
}

tpr_status tpr_exec_output(tpr_exec *e, const char *name, const tpr_tensor **out) {
  tpr_value_id v = name ? tpr__program_find(e->p, name) : -1;
  if (v < 0 || !e->p->values[v].is_output)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "the program has no output '%s'", name ? name : "");
  *out = e->handles[v];
  return TPR_OK;
}
