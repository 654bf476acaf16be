// When an unknown filter or test is an error (docs/chat-templates.md).
//
// jinja2 refuses an unknown filter or test when the template compiles, except
// inside an {% if %} (its condition and branches) or a conditional expression:
// there it compiles to an error raised only if that code runs (jinja2's "soft
// frames", compiler.py _filter_test_common). Loop, macro, call, filter, with
// and set blocks open a new frame and are strict again. tpr checks the parsed
// tree the same way, so a template jinja2 loads, tpr loads; a deferred filter
// that does run fails the render with its name and line (eval.c).
#include <string.h>

#include "jinja/jinja_impl.h"

static void check(jctx *c, const jnode *n, bool soft);

static void check_list(jctx *c, const jnlist *l, bool soft) {
  for (int i = 0; i < l->n; i++) check(c, l->v[i], soft);
}

static void check(jctx *c, const jnode *n, bool soft) {
  if (!n) return;
  switch (n->k) {
    case N_FILTER:
    case N_TEST: {
      bool filter = n->k == N_FILTER;
      if (!soft && !(filter ? jfilter_known(n->name) : jtest_known(n->name))) {
        c->line = n->line;
        jfail(c, "no %s named '%s' (or tpr's Jinja does not support it)", filter ? "filter" : "test", n->name);
      }
      break;
    }
    case S_IF:
    case N_COND:
      soft = true;
      break;
    case S_FOR:  // the iterable in the enclosing frame; target, filter, body and else in new ones
      check(c, n->b, soft);
      check(c, n->a, false);
      check(c, n->c, false);
      check_list(c, &n->body, false);
      check_list(c, &n->orelse, false);
      return;
    case S_CALLBLOCK:  // the call in the enclosing frame
      check(c, n->call, soft);
      check_list(c, &n->args, false);
      check_list(c, &n->body, false);
      return;
    case S_WITH:  // the values in the enclosing frame
      check_list(c, &n->ops, soft);
      check_list(c, &n->body, false);
      return;
    case S_MACRO:
    case S_FILTERBLOCK:
    case S_SETBLOCK:
      check(c, n->a, soft);
      check(c, n->call, false);
      check_list(c, &n->args, false);
      check_list(c, &n->body, false);
      return;
    default:
      break;
  }
  check(c, n->a, soft);
  check(c, n->b, soft);
  check(c, n->c, soft);
  check(c, n->call, soft);
  check_list(c, &n->args, soft);
  check_list(c, &n->ops, soft);
  check_list(c, &n->body, soft);
  check_list(c, &n->orelse, soft);
}

void jcheck_names(jctx *c, const jnlist *body) { check_list(c, body, false); }
