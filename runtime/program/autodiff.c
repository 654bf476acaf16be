// tpr_program_build_backward: reverse-mode autodiff over a program's nodes.
#include "autodiff.h"

#include <stdlib.h>
#include <string.h>

#include "program_impl.h"

struct tpr_grad_ctx {
  tpr_program *p;
  const tpr_backward_opts *opts;
  bool *wanted;        // (values at start) depends on a wrt value and the loss depends on it
  tpr_value_id *grad;  // (values at start) cotangent so far, -1 for none
  int n_values;        // values of the forward program
  // Rematerialisation (values marked remat, program.h): a forward
  // value's clone in the backward, and for each value created since, the
  // forward value it clones (-1: none), so cotangents go to the original.
  tpr_value_id *clone;  // (values at start) -1 until cloned
  tpr_value_id *orig;   // (cap_orig) indexed by id - n_values
  int cap_orig;
};

// A clone's original (v itself for any other value).
static tpr_value_id original(const tpr_grad_ctx *g, tpr_value_id v) {
  int k = v - g->n_values;
  return k >= 0 && k < g->cap_orig && g->orig[k] >= 0 ? g->orig[k] : v;
}

static tpr_status note_clone(tpr_grad_ctx *g, tpr_value_id c, tpr_value_id v) {
  int k = c - g->n_values;
  if (k >= g->cap_orig) {
    int cap = g->cap_orig ? g->cap_orig : 256;
    while (cap <= k) cap *= 2;
    tpr_value_id *o = realloc(g->orig, (size_t)cap * sizeof *o);
    if (!o) return TPR_FAIL(TPR_ERR_OOM, "backward: clones");
    for (int i = g->cap_orig; i < cap; i++) o[i] = -1;
    g->orig = o, g->cap_orig = cap;
  }
  g->orig[k] = v;
  return TPR_OK;
}

// v, or for a remat value its clone, emitted (with the clones of its remat
// inputs) the first time the backward reads it.
static tpr_status rematerialise(tpr_grad_ctx *g, tpr_value_id v, tpr_value_id *out) {
  if (v < 0 || v >= g->n_values || !g->p->values[v].remat) {
    *out = v;
    return TPR_OK;
  }
  if (g->clone[v] < 0) {
    tpr_node node = g->p->nodes[g->p->values[v].producer];  // a copy: appending moves the array
    for (int i = 0; i < node.n_in; i++) TPR_CHECK(rematerialise(g, node.in[i], &node.in[i]));
    TPR_CHECK(tpr_program_op(g->p, node.op, node.in, node.n_in, &node.attrs, &g->clone[v]));
    TPR_CHECK(note_clone(g, g->clone[v], v));
  }
  *out = g->clone[v];
  return TPR_OK;
}

// Whether op's backward rule reads input i's value (not only its shape): an
// embedding's table is never read, so no clone of it is gathered.
static bool rule_reads_input(tpr_op_kind op, int i) {
  return !((op == TPR_OP_EMBEDDING || op == TPR_OP_EMBEDDING_SHARD) && i == 0);
}

void tpr_backward_opts_init(tpr_backward_opts *o) {
  for (int a = 0; a < TPR_AXIS_COUNT; a++) o->axis_rank[a] = -1;
}

tpr_program *tpr_grad_program(tpr_grad_ctx *g) { return g->p; }

bool tpr_grad_wanted(const tpr_grad_ctx *g, tpr_value_id v) {
  v = original(g, v);
  return v >= 0 && v < g->n_values && g->wanted[v];
}

tpr_status tpr_grad_axis_rank(const tpr_grad_ctx *g, tpr_mesh_axis axis, tpr_value_id *out) {
  if ((unsigned)axis >= TPR_AXIS_COUNT || g->opts->axis_rank[axis] < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "backward: a rule needs this rank's index on axis %s, and "
                    "tpr_backward_opts gives none", tpr_mesh_axis_name(axis));
  *out = g->opts->axis_rank[axis];
  return TPR_OK;
}

tpr_status tpr_grad_contiguous(tpr_grad_ctx *g, tpr_value_id v, tpr_value_id *out) {
  tpr_tensor d;
  TPR_CHECK(tpr_program_value(g->p, v, &d));
  if (tpr_tensor_is_contiguous(&d)) {  // an offset is fine: a view of packed results at its place
    *out = v;
    return TPR_OK;
  }
  return tpr_pb_cast(g->p, v, d.dtype, out);
}

tpr_status tpr_grad_add(tpr_grad_ctx *g, tpr_value_id v, tpr_value_id dv) {
  v = original(g, v);
  if (!tpr_grad_wanted(g, v)) return TPR_OK;
  tpr_tensor want, got;
  TPR_CHECK(tpr_program_value(g->p, v, &want));
  TPR_CHECK(tpr_program_value(g->p, dv, &got));
  if (got.dtype != TPR_F32 || !tpr_tensor_same_shape(&want, &got)) {
    char w[128], h[128];
    return TPR_FAIL(TPR_ERR_INTERNAL, "backward: cotangent of value %d must be f32 %s, a rule gave %s", v,
                    tpr_tensor_describe(&want, w, sizeof w), tpr_tensor_describe(&got, h, sizeof h));
  }
  if (g->grad[v] < 0) {
    g->grad[v] = dv;
    return TPR_OK;
  }
  return tpr_pb_add(g->p, g->grad[v], dv, &g->grad[v]);
}

tpr_status tpr_grad_unpack(tpr_grad_ctx *g, tpr_value_id packed, int64_t *offset, tpr_value_id like,
                           tpr_value_id *out) {
  tpr_tensor d;
  TPR_CHECK(tpr_program_value(g->p, like, &d));
  int64_t n = tpr_tensor_numel(&d);
  tpr_value_id flat;
  TPR_CHECK(tpr_pb_slice(g->p, packed, 0, *offset, n, &flat));
  *offset += n;
  return tpr_pb_reshape(g->p, flat, d.ndim, d.shape, out);
}

// wanted = reachable forward from a wrt value AND backward from the loss.
static void mark_wanted(const tpr_program *p, tpr_value_id loss, const tpr_value_id *wrt, int n_wrt, bool *from_wrt,
                        bool *to_loss, int n_values) {
  for (int i = 0; i < n_wrt; i++) from_wrt[wrt[i]] = true;
  for (int n = 0; n < p->n_nodes; n++) {
    const tpr_node *node = &p->nodes[n];
    for (int i = 0; i < node->n_in; i++)
      if (from_wrt[node->in[i]]) from_wrt[node->out] = true;
  }
  to_loss[loss] = true;
  for (int n = p->n_nodes - 1; n >= 0; n--) {
    const tpr_node *node = &p->nodes[n];
    if (!to_loss[node->out]) continue;
    for (int i = 0; i < node->n_in; i++) to_loss[node->in[i]] = true;
  }
  for (int v = 0; v < n_values; v++) to_loss[v] = to_loss[v] && from_wrt[v];
}

static tpr_status check_args(const tpr_program *p, tpr_value_id loss, const tpr_value_id *wrt, int n_wrt) {
  if (loss < 0 || loss >= p->n_values) return TPR_FAIL(TPR_ERR_INVALID_ARG, "backward: unknown loss value %d", loss);
  const tpr_tensor *d = &p->values[loss].desc;
  if (d->dtype != TPR_F32 || tpr_tensor_numel(d) != 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "backward: the loss must be one f32 element");
  if (n_wrt < 0 || (n_wrt > 0 && !wrt)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "backward: bad wrt list");
  for (int i = 0; i < n_wrt; i++) {
    if (wrt[i] < 0 || wrt[i] >= p->n_values)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "backward: wrt[%d] is unknown value %d", i, wrt[i]);
    if (p->values[wrt[i]].desc.dtype != TPR_F32 && p->values[wrt[i]].desc.dtype != TPR_BF16)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "backward: wrt[%d] ('%s') is not f32 or bf16", i,
                      p->values[wrt[i]].name ? p->values[wrt[i]].name : "?");
  }
  return TPR_OK;
}

static tpr_status run_rules(tpr_grad_ctx *g, int n_fwd_nodes) {
  for (int n = n_fwd_nodes - 1; n >= 0; n--) {
    const tpr_node *node = &g->p->nodes[n];
    if (!g->wanted[node->out] || g->grad[node->out] < 0) continue;
    tpr_grad_node gn = {.op = node->op, .n_in = node->n_in, .attrs = node->attrs, .out = node->out,
                        .dout = g->grad[node->out]};
    memcpy(gn.in, node->in, sizeof gn.in);
    // A rule reads remat inputs through their clones (the chain of a remat
    // value itself needs only shapes: it maps the cotangent back).
    if (!g->p->values[gn.out].remat)
      for (int i = 0; i < gn.n_in; i++)
        if (rule_reads_input(gn.op, i)) TPR_CHECK(rematerialise(g, gn.in[i], &gn.in[i]));
    tpr_backward_rule rule = tpr__backward_rule(gn.op);
    if (!rule)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backward: op %s (node %d) has no backward rule", tpr_op_name(gn.op), n);
    tpr_status rc = rule(g, &gn);
    if (rc != TPR_OK) return rc;
  }
  return TPR_OK;
}

tpr_status tpr_program_build_backward(tpr_program *p, tpr_value_id loss, const tpr_value_id *wrt, int n_wrt,
                                      const tpr_backward_opts *opts, tpr_value_id *grads) {
  TPR_CHECK(check_args(p, loss, wrt, n_wrt));
  tpr_backward_opts none;
  if (!opts) {
    tpr_backward_opts_init(&none);
    opts = &none;
  }
  int nv = p->n_values;
  tpr_grad_ctx g = {.p = p, .opts = opts, .n_values = nv};
  bool *from_wrt = calloc((size_t)nv, sizeof *from_wrt);
  g.wanted = calloc((size_t)nv, sizeof *g.wanted);
  g.grad = malloc((size_t)nv * sizeof *g.grad);
  g.clone = malloc((size_t)nv * sizeof *g.clone);
  tpr_status rc = TPR_OK;
  if (!from_wrt || !g.wanted || !g.grad || !g.clone) {
    rc = TPR_FAIL(TPR_ERR_OOM, "backward");
    goto done;
  }
  for (int v = 0; v < nv; v++) g.grad[v] = g.clone[v] = -1;
  mark_wanted(p, loss, wrt, n_wrt, from_wrt, g.wanted, nv);
  int n_fwd = p->n_nodes;  // the rules run over these; the seed and the backward come after
  if (g.wanted[loss]) TPR_CHECK_GOTO(tpr_pb_fill(p, loss, 1.0f, &g.grad[loss]), rc, done);
  TPR_CHECK_GOTO(run_rules(&g, n_fwd), rc, done);
  for (int i = 0; i < n_wrt; i++) {
    grads[i] = -1;
    if (g.grad[wrt[i]] < 0) continue;
    tpr_value_id gv = g.grad[wrt[i]];
    // Each gradient gets its own contiguous value, so callers may name it an
    // output even when two wrt values received the same cotangent.
    bool shared = false;
    for (int j = 0; j < i; j++) shared = shared || grads[j] == gv;
    if (shared || gv < nv || p->values[gv].is_output)
      TPR_CHECK_GOTO(tpr_pb_cast(p, gv, TPR_F32, &gv), rc, done);
    else
      TPR_CHECK_GOTO(tpr_grad_contiguous(&g, gv, &gv), rc, done);
    grads[i] = gv;
  }
done:
  free(from_wrt);
  free(g.wanted);
  free(g.grad);
  free(g.clone), free(g.orig);
  return rc;
}

tpr_status tpr_pb_grad_all_reduce(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 2, .i = {axis, n}};
  return tpr_program_op(p, TPR_OP_GRAD_ALL_REDUCE, (const tpr_value_id[]){x}, 1, &at, out);
}

tpr_status tpr_pb_sum_to(tpr_program *p, tpr_value_id x, int ndim, const int64_t *shape, tpr_value_id *out) {
  if (ndim < 0 || ndim > TPR_OP_MAX_IATTRS)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "sum_to: %d dims (at most %d)", ndim, TPR_OP_MAX_IATTRS);
  tpr_op_attrs at = {.n_i = ndim};
  for (int i = 0; i < ndim; i++) at.i[i] = shape[i];
  return tpr_program_op(p, TPR_OP_SUM_TO, (const tpr_value_id[]){x}, 1, &at, out);
}

tpr_status tpr_pb_scale(tpr_program *p, tpr_value_id x, float alpha, tpr_value_id *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {alpha}};
  return tpr_program_op(p, TPR_OP_SCALE, (const tpr_value_id[]){x}, 1, &at, out);
}

tpr_status tpr_pb_fill(tpr_program *p, tpr_value_id like, float value, tpr_value_id *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {value}};
  return tpr_program_op(p, TPR_OP_FILL, (const tpr_value_id[]){like}, 1, &at, out);
}
