// The interpreter's entry points (jinja.h): a parse or a render in an arena
// of its own, every error unwound (setjmp) to here with its message, and the
// limits applied.
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

// The setjmp of one parse or render; false: c->err says why.
static bool guarded_parse(jctx *c, const char *src, size_t len, jnlist *out) {
  if (setjmp(c->jb)) return false;
  jparse(c, src, len, out);
  return true;
}

static bool guarded_render(jctx *c, const tpr_jinja_template *t, jbuild_fn build, const void *arg, jbuf *b) {
  if (setjmp(c->jb)) return false;
  jscope *root = jalloc(c, sizeof *root);
  memset(root, 0, sizeof *root);
  build(c, &root->vars, arg);
  c->globals = root;
  jb_put(c, b, "", 0);
  c->out = (char *)b;
  jexec(c, root, &t->body);
  if (c->flow != FLOW_NORMAL) {
    c->line = 0;
    jfail(c, "break or continue outside a loop");
  }
  return true;
}

tpr_status tpr_jinja_parse(const char *src, size_t len, tpr_jinja_template **out, tpr_jinja_error *err) {
  tpr_jinja_error local;
  if (!err) err = &local;
  memset(err, 0, sizeof *err);
  *out = NULL;
  tpr_jinja_template *t = calloc(1, sizeof *t);
  jctx *c = calloc(1, sizeof *c);
  if (!t || !c) {
    free(t);
    free(c);
    return TPR_FAIL(TPR_ERR_OOM, "jinja: out of memory");
  }
  t->arena.limit = (size_t)64 << 20;
  c->a = &t->arena;
  c->err = err;
  c->line = 1;
  bool ok = guarded_parse(c, src, len, &t->body);
  free(c);
  if (!ok) {
    tpr_jinja_free(t);
    return TPR_FAIL(TPR_ERR_FORMAT, "chat template: %s", err->message);
  }
  *out = t;
  return TPR_OK;
}

void tpr_jinja_free(tpr_jinja_template *t) {
  if (!t) return;
  jarena_free(&t->arena);
  free(t);
}

typedef struct json_arg {
  const char *s;
  size_t n;
} json_arg;

static void build_from_json(jctx *c, jdict *vars, const void *arg) {
  const json_arg *a = arg;
  jval v = jjson_parse(c, a->s, a->n);
  if (v.t != JV_DICT) jfail(c, "the variables must be a JSON object");
  for (size_t i = 0; i < v.d->n; i++) jd_set(c, vars, v.d->k[i], v.d->v[i]);
}

tpr_status tpr_jinja_render_json(const tpr_jinja_template *t, const char *vars_json, size_t vars_len,
                                 const tpr_jinja_limits *limits, char **out, size_t *out_len, tpr_jinja_error *err) {
  json_arg a = {vars_json, vars_len};
  return jrender(t, build_from_json, &a, limits, out, out_len, err);
}

tpr_status jrender(const tpr_jinja_template *t, jbuild_fn build, const void *arg, const tpr_jinja_limits *limits,
                   char **out, size_t *out_len, tpr_jinja_error *err) {
  tpr_jinja_error local;
  if (!err) err = &local;
  memset(err, 0, sizeof *err);
  *out = NULL;
  if (out_len) *out_len = 0;
  tpr_jinja_limits lim = limits ? *limits : (tpr_jinja_limits){0};
  jarena arena = {.limit = lim.max_memory ? lim.max_memory : (size_t)256 << 20};
  jctx *c = calloc(1, sizeof *c);
  if (!c) return TPR_FAIL(TPR_ERR_OOM, "jinja: out of memory");
  c->a = &arena;
  c->err = err;
  c->max_output = lim.max_output ? lim.max_output : (size_t)16 << 20;
  c->max_steps = lim.max_steps ? lim.max_steps : 10000000;
  c->max_depth = lim.max_depth ? lim.max_depth : 64;
  jbuf b = {0};
  bool ok = guarded_render(c, t, build, arg, &b);
  free(c);
  char *r = ok ? malloc(b.len + 1) : NULL;
  if (r) memcpy(r, b.p, b.len + 1);
  size_t len = b.len;
  jarena_free(&arena);
  if (!ok) {
    if (err->raised) return TPR_FAIL(TPR_ERR_INVALID_ARG, "chat template raised: %s", err->message);
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "chat template: %s", err->message);
  }
  if (!r) return TPR_FAIL(TPR_ERR_OOM, "jinja: out of memory");
  *out = r;
  if (out_len) *out_len = len;
  return TPR_OK;
}
