#include "grad_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_util.h"

typedef struct gc_prog {
  tpr_program *p;
  tpr_exec *e;
  tpr_tensor *r;  // (out's shape) the random projection
  tpr_value_id grads[TPR_OP_MAX_INPUTS];
} gc_prog;

static void build(const tt_grad_case *c, gc_prog *g) {
  assert_int_equal(tpr_program_new(&g->p), TPR_OK);
  tpr_value_id in[TPR_OP_MAX_INPUTS], out, r, prod, loss;
  for (int i = 0; i < c->n_in; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    assert_int_equal(tpr_program_param(g->p, name, c->in[i]->dtype, c->in[i]->ndim, c->in[i]->shape, &in[i]), TPR_OK);
  }
  tpr_status rc = c->build ? c->build(g->p, in, &out) : tpr_program_op(g->p, c->op, in, c->n_in, &c->attrs, &out);
  if (rc != TPR_OK) fail_msg("%s: building the forward failed: %s", c->name, tpr_last_error());
  tpr_tensor od;
  assert_int_equal(tpr_program_value(g->p, out, &od), TPR_OK);
  assert_int_equal(tpr_program_param(g->p, "r", TPR_F32, od.ndim, od.shape, &r), TPR_OK);
  assert_int_equal(tpr_pb_mul(g->p, out, r, &prod), TPR_OK);
  assert_int_equal(tpr_pb_sum_to(g->p, prod, 1, (const int64_t[]){1}, &loss), TPR_OK);
  assert_int_equal(tpr_program_output(g->p, out, "out"), TPR_OK);
  tpr_value_id wrt[TPR_OP_MAX_INPUTS];
  int n_wrt = 0;
  for (int i = 0; i < c->n_in; i++)
    if (c->diff[i]) wrt[n_wrt++] = in[i];
  tpr_value_id got[TPR_OP_MAX_INPUTS];
  rc = tpr_program_build_backward(g->p, loss, wrt, n_wrt, NULL, got);
  if (rc != TPR_OK) fail_msg("%s: build_backward failed: %s", c->name, tpr_last_error());
  for (int i = 0, k = 0; i < c->n_in; i++) {
    g->grads[i] = c->diff[i] ? got[k++] : -1;
    if (g->grads[i] < 0) continue;
    char name[16];
    snprintf(name, sizeof name, "grad%d", i);
    assert_int_equal(tpr_program_output(g->p, g->grads[i], name), TPR_OK);
  }
  float *rh;
  g->r = tt_random_f32(tt_cpu(), od.ndim, od.shape, &rh);
  free(rh);
  assert_int_equal(tpr_exec_new(g->p, tt_cpu(), &g->e), TPR_OK);
  assert_int_equal(tpr_exec_bind(g->e, "r", g->r), TPR_OK);
}

static double run_loss(const tt_grad_case *c, gc_prog *g) {
  tpr_status rc = tpr_exec_run(g->e);
  if (rc != TPR_OK) fail_msg("%s: run failed: %s", c->name, tpr_last_error());
  const tpr_tensor *out;
  assert_int_equal(tpr_exec_output(g->e, "out", &out), TPR_OK);
  const float *o = tpr_tensor_data(out), *r = tpr_tensor_data(g->r);
  double s = 0;
  for (int64_t i = 0; i < tpr_tensor_numel(out); i++) s += (double)o[i] * (double)r[i];
  return s;
}

double tt_grad_check(const tt_grad_case *c) {
  gc_prog g = {0};
  build(c, &g);
  tpr_tensor *copies[TPR_OP_MAX_INPUTS];
  for (int i = 0; i < c->n_in; i++) {
    copies[i] = tt_new(c->in[i]->dtype, c->in[i]->ndim, c->in[i]->shape);
    assert_int_equal(tpr_cast(tt_cpu(), c->in[i], copies[i]), TPR_OK);
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    assert_int_equal(tpr_exec_bind(g.e, name, copies[i]), TPR_OK);
  }
  run_loss(c, &g);
  double h = c->h > 0 ? c->h : 1e-2, worst = 0;
  int max_points = c->max_points > 0 ? c->max_points : 64;
  for (int i = 0; i < c->n_in; i++) {
    if (!c->diff[i]) continue;
    char name[16];
    snprintf(name, sizeof name, "grad%d", i);
    int64_t n = tpr_tensor_numel(copies[i]);
    if (g.grads[i] < 0) {  // the loss does not depend on this input: its true gradient is 0
      fail_msg("%s: input %d got no gradient", c->name, i);
    }
    const tpr_tensor *gt;
    tpr_exec_run(g.e);
    assert_int_equal(tpr_exec_output(g.e, name, &gt), TPR_OK);
    float *ga = tt_to_host(gt);
    float *x = tpr_tensor_data(copies[i]);
    double num = 0, den = 0;
    int points = n < max_points ? (int)n : max_points;
    for (int k = 0; k < points; k++) {
      int64_t j = n <= max_points ? k : tt_randint(0, n - 1);
      float keep = x[j];
      x[j] = keep + (float)h;
      double hp = (double)x[j] - keep;
      double lp = run_loss(c, &g);
      x[j] = keep - (float)h;
      double hm = keep - (double)x[j];
      double lm = run_loss(c, &g);
      x[j] = keep;
      double fd = (lp - lm) / (hp + hm), an = c->corrupt ? c->corrupt * ga[j] : ga[j];
      num += (an - fd) * (an - fd);
      den += fd * fd;
    }
    double nmse = den > 0 ? num / den : num;
    printf("  grad check %-28s input %d: NMSE %.3e over %d points (h %.0e)\n", c->name, i, nmse, points, h);
    if (nmse > worst || isnan(nmse)) worst = isnan(nmse) ? INFINITY : nmse;
    free(ga);
  }
  for (int i = 0; i < c->n_in; i++) tpr_tensor_free(copies[i]);
  tpr_tensor_free(g.r);
  tpr_exec_free(g.e);
  tpr_program_free(g.p);
  return worst;
}

void tt_grad_expect(const tt_grad_case *c, double bound) {
  double nmse = tt_grad_check(c);
  if (!(nmse <= bound)) fail_msg("%s: gradient NMSE %.3e above %.0e", c->name, nmse, bound);
}

void tt_grad_free_inputs(tt_grad_case *c) {
  for (int i = 0; i < c->n_in; i++) tpr_tensor_free((tpr_tensor *)c->in[i]);
}
