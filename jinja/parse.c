// The Jinja parser: template text (newlines normalised to \n, one trailing
// newline dropped, then lex.c's tokens) to a syntax tree (jinja_impl.h).
// It follows jinja2's precedence (parser.py): condexpr < or < and < not <
// compare < +,- < ~ < *,/,//,% < ** < unary < filters/tests/calls < postfix.
#define _GNU_SOURCE  // memmem
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/lex.h"

// --- parser -------------------------------------------------------------------------
typedef struct parser {
  jctx *c;
  tok *t;
  size_t i;
} parser;

static tok *cur(parser *P) { return &P->t[P->i]; }
static tok *peek(parser *P, int k) {
  size_t j = P->i + (size_t)k;
  return P->t[j < P->i ? P->i : j].t == T_EOF ? &P->t[P->i] : &P->t[j];
}
static bool is_op(const tok *t, const char *op) { return t->t == T_OP && t->n == strlen(op) && memcmp(t->s, op, t->n) == 0; }
static bool is_name(const tok *t, const char *nm) {
  return t->t == T_NAME && t->n == strlen(nm) && memcmp(t->s, nm, t->n) == 0;
}
static const char *tok_desc(parser *P, const tok *t) {
  switch (t->t) {
    case T_NAME: case T_OP: return jstrdup(P->c, t->s, t->n);
    case T_STR: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    case T_VEND: return "'}}'";
    case T_BEND: return "'%}'";
    case T_EOF: return "the end of the template";
    default: return "text";
  }
}
static tok *next(parser *P) {
  tok *t = cur(P);
  P->c->line = t->line;
  if (t->t != T_EOF) P->i++;
  return t;
}
static void expect_op(parser *P, const char *op) {
  P->c->line = cur(P)->line;
  if (!is_op(cur(P), op)) jfail(P->c, "expected '%s', got %s", op, tok_desc(P, cur(P)));
  P->i++;
}
static const char *expect_name(parser *P) {
  P->c->line = cur(P)->line;
  if (cur(P)->t != T_NAME) jfail(P->c, "expected a name, got %s", tok_desc(P, cur(P)));
  tok *t = next(P);
  return jstrdup(P->c, t->s, t->n);
}
static void expect_bend(parser *P) {
  P->c->line = cur(P)->line;
  if (cur(P)->t != T_BEND) jfail(P->c, "expected '%%}', got %s", tok_desc(P, cur(P)));
  P->i++;
}

void jn_push(jctx *c, jnlist *l, jnode *n) {
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 4;
    jnode **nv = jalloc(c, (size_t)cap * sizeof *nv);
    if (l->n) memcpy(nv, l->v, (size_t)l->n * sizeof *nv);
    l->v = nv;
    l->cap = cap;
  }
  l->v[l->n++] = n;
}

static jnode *node(parser *P, jnk k) {
  jnode *n = jalloc(P->c, sizeof *n);
  memset(n, 0, sizeof *n);
  n->k = k;
  n->line = cur(P)->line;
  return n;
}

static jnode *expr(parser *P);
static jnode *or_expr(parser *P);
static jnode *unary(parser *P, bool with_filter);
static jnode *primary(parser *P);
static jnode *postfix(parser *P, jnode *n);

// Call arguments after '(': positional and name=value.
static void call_args(parser *P, jnode *n) {
  expect_op(P, "(");
  int cap = 0;
  while (!is_op(cur(P), ")")) {
    if (n->args.n) expect_op(P, ",");
    if (is_op(cur(P), ")")) break;
    if (is_op(cur(P), "*") || is_op(cur(P), "**")) jfail(P->c, "*args and **kwargs in calls are not supported");
    const char *kw = NULL;
    if (cur(P)->t == T_NAME && is_op(peek(P, 1), "=")) {
      kw = expect_name(P);
      P->i++;
    }
    jn_push(P->c, &n->args, expr(P));
    if (n->args.n > cap) {
      int nc = cap ? cap * 2 : 4;
      const char **nk = jalloc(P->c, (size_t)nc * sizeof *nk);
      memset(nk, 0, (size_t)nc * sizeof *nk);
      if (cap) memcpy(nk, n->kw, (size_t)cap * sizeof *nk);
      n->kw = nk;
      cap = nc;
    }
    n->kw[n->args.n - 1] = kw;
  }
  expect_op(P, ")");
}

// f(...): a call of n.
static jnode *call_of(parser *P, jnode *n) {
  jnode *call = node(P, N_CALL);
  call->a = n;
  call_args(P, call);
  return call;
}

static const char *dotted_name(parser *P) {
  const char *nm = expect_name(P);
  while (is_op(cur(P), ".") && peek(P, 1)->t == T_NAME) {
    P->i++;
    const char *more = expect_name(P);
    char *j = jalloc(P->c, strlen(nm) + strlen(more) + 2);
    sprintf(j, "%s.%s", nm, more);
    nm = j;
  }
  return nm;
}

static jnode *filter(parser *P, jnode *on) {
  jnode *n = node(P, N_FILTER);
  n->name = dotted_name(P);
  n->a = on;
  if (is_op(cur(P), "(")) call_args(P, n);
  return n;
}

static jnode *filter_expr(parser *P, jnode *n) {
  while (1) {
    if (is_op(cur(P), "|")) {
      P->i++;
      n = filter(P, n);
    } else if (is_name(cur(P), "is")) {
      P->i++;
      jnode *t = node(P, N_TEST);
      if (is_name(cur(P), "not")) {
        P->i++;
        t->negate = true;
      }
      t->name = dotted_name(P);
      t->a = n;
      tok *c = cur(P);
      if (is_op(c, "(")) {
        call_args(P, t);
      } else if ((c->t == T_NAME || c->t == T_STR || c->t == T_INT || c->t == T_FLOAT || is_op(c, "[") ||
                  is_op(c, "{")) &&
                 !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) jfail(P->c, "You cannot chain multiple tests with is");
        jn_push(P->c, &t->args, postfix(P, primary(P)));
        t->kw = jalloc(P->c, sizeof *t->kw);
        t->kw[0] = NULL;
      }
      n = t;
    } else if (is_op(cur(P), "(")) {
      n = call_of(P, n);
    } else {
      return n;
    }
  }
}

static jnode *subscript(parser *P) {
  jnode *parts[3] = {NULL, NULL, NULL};
  int k = 0;
  bool slice = false;
  while (1) {
    if (!is_op(cur(P), ":") && !is_op(cur(P), "]") && !is_op(cur(P), ",")) parts[k] = expr(P);
    if (is_op(cur(P), ":") && k < 2) {
      P->i++;
      slice = true;
      k++;
      continue;
    }
    break;
  }
  if (!slice) {
    if (!parts[0]) jfail(P->c, "expected an expression in []");
    if (is_op(cur(P), ",")) jfail(P->c, "tuple subscripts are not supported");
    return parts[0];
  }
  jnode *s = node(P, N_SLICE);
  s->a = parts[0];
  s->b = parts[1];
  s->c = parts[2];
  return s;
}

static jnode *postfix(parser *P, jnode *n) {
  while (1) {
    if (is_op(cur(P), ".")) {
      P->i++;
      if (cur(P)->t == T_INT) {
        jnode *it = node(P, N_ITEM);
        it->a = n;
        it->b = node(P, N_LIT);
        it->b->lit = jv_int(next(P)->i);
        n = it;
        continue;
      }
      jnode *at = node(P, N_ATTR);
      at->a = n;
      at->name = expect_name(P);
      n = at;
    } else if (is_op(cur(P), "[")) {
      P->i++;
      jnode *it = node(P, N_ITEM);
      it->a = n;
      it->b = subscript(P);
      expect_op(P, "]");
      n = it;
    } else if (is_op(cur(P), "(")) {
      n = call_of(P, n);
    } else {
      return n;
    }
  }
}

static jnode *primary(parser *P) {
  tok *t = cur(P);
  P->c->line = t->line;
  if (++P->c->parse_depth > 200) jfail(P->c, "expression nested too deep");
  jnode *n;
  if (t->t == T_NAME) {
    P->i++;
    n = node(P, N_LIT);
    n->line = t->line;
    if (is_name(t, "true") || is_name(t, "True")) n->lit = jv_bool(true);
    else if (is_name(t, "false") || is_name(t, "False")) n->lit = jv_bool(false);
    else if (is_name(t, "none") || is_name(t, "None")) n->lit = jv_none();
    else {
      n->k = N_NAME;
      n->name = jstrdup(P->c, t->s, t->n);
    }
  } else if (t->t == T_STR) {
    jbuf b = {0};
    jb_put(P->c, &b, "", 0);
    while (cur(P)->t == T_STR) {  // adjacent literals join, as in Python
      jb_put(P->c, &b, cur(P)->s, cur(P)->n);
      P->i++;
    }
    n = node(P, N_LIT);
    n->lit = jv_str(P->c, b.p, b.len);
  } else if (t->t == T_INT) {
    P->i++;
    n = node(P, N_LIT);
    n->lit = jv_int(t->i);
  } else if (t->t == T_FLOAT) {
    P->i++;
    n = node(P, N_LIT);
    n->lit = jv_float(t->f);
  } else if (is_op(t, "(")) {
    P->i++;
    if (is_op(cur(P), ")")) {
      P->i++;
      n = node(P, N_TUPLE);
    } else {
      n = expr(P);
      if (is_op(cur(P), ",")) {
        jnode *tu = node(P, N_TUPLE);
        jn_push(P->c, &tu->args, n);
        while (is_op(cur(P), ",")) {
          P->i++;
          if (is_op(cur(P), ")")) break;
          jn_push(P->c, &tu->args, expr(P));
        }
        n = tu;
      }
      expect_op(P, ")");
    }
  } else if (is_op(t, "[")) {
    P->i++;
    n = node(P, N_LIST);
    while (!is_op(cur(P), "]")) {
      if (n->args.n) expect_op(P, ",");
      if (is_op(cur(P), "]")) break;
      jn_push(P->c, &n->args, expr(P));
    }
    expect_op(P, "]");
  } else if (is_op(t, "{")) {
    P->i++;
    n = node(P, N_DICT);
    while (!is_op(cur(P), "}")) {
      if (n->args.n) expect_op(P, ",");
      if (is_op(cur(P), "}")) break;
      jn_push(P->c, &n->args, expr(P));
      expect_op(P, ":");
      jn_push(P->c, &n->args, expr(P));
    }
    expect_op(P, "}");
  } else {
    jfail(P->c, "unexpected %s", tok_desc(P, t));
  }
  P->c->parse_depth--;
  return n;
}

static jnode *unary(parser *P, bool with_filter) {
  jnode *n;
  if (is_op(cur(P), "-") || is_op(cur(P), "+")) {
    n = node(P, N_UNARY);
    n->op = cur(P)->s[0];
    P->i++;
    if (++P->c->parse_depth > 200) jfail(P->c, "expression nested too deep");
    n->a = unary(P, false);
    P->c->parse_depth--;
  } else {
    n = postfix(P, primary(P));
  }
  return with_filter ? filter_expr(P, n) : n;
}

static jnode *binary(parser *P, jnk k, int op, jnode *a, jnode *b) {
  jnode *n = node(P, k);
  n->op = op;
  n->a = a;
  n->b = b;
  return n;
}

enum { OP_POW = 'P', OP_FLOORDIV = 'F', OP_EQ = 'E', OP_NE = 'N', OP_GE = 'G', OP_LE = 'L', OP_IN = 'I', OP_NOTIN = 'O' };

static jnode *pow_expr(parser *P) {
  jnode *n = unary(P, true);
  while (is_op(cur(P), "**")) {
    P->i++;
    n = binary(P, N_BINARY, OP_POW, n, unary(P, true));
  }
  return n;
}

static jnode *math2(parser *P) {
  jnode *n = pow_expr(P);
  while (1) {
    int op = is_op(cur(P), "*") ? '*' : is_op(cur(P), "/") ? '/' : is_op(cur(P), "//") ? OP_FLOORDIV : is_op(cur(P), "%") ? '%' : 0;
    if (!op) return n;
    P->i++;
    n = binary(P, N_BINARY, op, n, pow_expr(P));
  }
}

static jnode *concat(parser *P) {
  jnode *n = math2(P);
  if (!is_op(cur(P), "~")) return n;
  jnode *c = node(P, N_CONCAT);
  jn_push(P->c, &c->args, n);
  while (is_op(cur(P), "~")) {
    P->i++;
    jn_push(P->c, &c->args, math2(P));
  }
  return c;
}

static jnode *math1(parser *P) {
  jnode *n = concat(P);
  while (is_op(cur(P), "+") || is_op(cur(P), "-")) {
    int op = cur(P)->s[0];
    P->i++;
    n = binary(P, N_BINARY, op, n, concat(P));
  }
  return n;
}

static jnode *compare(parser *P) {
  jnode *n = math1(P);
  jnode *cmp = NULL;
  while (1) {
    tok *t = cur(P);
    int op = 0;
    if (is_op(t, "==")) op = OP_EQ;
    else if (is_op(t, "!=")) op = OP_NE;
    else if (is_op(t, ">=")) op = OP_GE;
    else if (is_op(t, "<=")) op = OP_LE;
    else if (is_op(t, ">")) op = '>';
    else if (is_op(t, "<")) op = '<';
    else if (is_name(t, "in")) op = OP_IN;
    else if (is_name(t, "not") && is_name(peek(P, 1), "in")) op = OP_NOTIN;
    if (!op) break;
    P->i += op == OP_NOTIN ? 2 : 1;
    if (!cmp) {
      cmp = node(P, N_COMPARE);
      cmp->a = n;
    }
    jnode *r = math1(P);
    jnode *o = node(P, N_LIT);  // carries the operator and operand
    o->op = op;
    o->a = r;
    jn_push(P->c, &cmp->ops, o);
  }
  return cmp ? cmp : n;
}

static jnode *not_expr(parser *P) {
  if (is_name(cur(P), "not")) {
    jnode *n = node(P, N_NOT);
    P->i++;
    if (++P->c->parse_depth > 200) jfail(P->c, "expression nested too deep");
    n->a = not_expr(P);
    P->c->parse_depth--;
    return n;
  }
  return compare(P);
}

static jnode *and_expr(parser *P) {
  jnode *n = not_expr(P);
  while (is_name(cur(P), "and")) {
    P->i++;
    n = binary(P, N_AND, 0, n, not_expr(P));
  }
  return n;
}

static jnode *or_expr(parser *P) {
  jnode *n = and_expr(P);
  while (is_name(cur(P), "or")) {
    P->i++;
    n = binary(P, N_OR, 0, n, and_expr(P));
  }
  return n;
}

static jnode *expr(parser *P) {
  if (++P->c->parse_depth > 200) jfail(P->c, "expression nested too deep");
  jnode *n = or_expr(P);
  while (is_name(cur(P), "if")) {
    P->i++;
    jnode *c = node(P, N_COND);
    c->a = or_expr(P);  // the condition
    c->b = n;           // then
    if (is_name(cur(P), "else")) {
      P->i++;
      c->c = expr(P);
    }
    n = c;
  }
  P->c->parse_depth--;
  return n;
}

// expr [, expr ...] as a tuple (no condexpr when a for's filter may follow).
static jnode *tuple_expr(parser *P, bool with_cond) {
  jnode *n = with_cond ? expr(P) : or_expr(P);
  if (!is_op(cur(P), ",")) return n;
  jnode *tu = node(P, N_TUPLE);
  jn_push(P->c, &tu->args, n);
  while (is_op(cur(P), ",")) {
    P->i++;
    if (cur(P)->t == T_VEND || cur(P)->t == T_BEND) break;
    jn_push(P->c, &tu->args, with_cond ? expr(P) : or_expr(P));
  }
  return tu;
}

// An assignment target: name, name.attr (set only) or a tuple of names.
static jnode *target(parser *P, bool allow_attr) {
  bool paren = is_op(cur(P), "(");
  if (paren) P->i++;
  jnode *first = node(P, N_NAME);
  first->name = expect_name(P);
  if (allow_attr && is_op(cur(P), ".")) {
    P->i++;
    jnode *at = node(P, N_ATTR);
    at->a = first;
    at->name = expect_name(P);
    if (paren) expect_op(P, ")");
    return at;
  }
  if (!is_op(cur(P), ",")) {
    if (paren) expect_op(P, ")");
    return first;
  }
  jnode *tu = node(P, N_TUPLE);
  jn_push(P->c, &tu->args, first);
  while (is_op(cur(P), ",")) {
    P->i++;
    if (cur(P)->t != T_NAME) break;
    jnode *nm = node(P, N_NAME);
    nm->name = expect_name(P);
    jn_push(P->c, &tu->args, nm);
  }
  if (paren) expect_op(P, ")");
  return tu;
}

static const char *body(parser *P, jnlist *out, const char *const *ends);

static bool name_in(const tok *t, const char *const *names) {
  for (int i = 0; names && names[i]; i++)
    if (is_name(t, names[i])) return true;
  return false;
}

// After 'if' or 'elif': the condition, the body, then elif/else/endif.
static jnode *if_rest(parser *P, int line) {
  jnode *n = node(P, S_IF);
  n->line = line;
  n->a = tuple_expr(P, true);
  expect_bend(P);
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  const char *e = body(P, &n->body, ends);
  if (!strcmp(e, "elif")) {
    jn_push(P->c, &n->orelse, if_rest(P, P->t[P->i - 1].line));  // consumes the chain's endif
    return n;
  }
  if (!strcmp(e, "else")) {
    expect_bend(P);
    static const char *const ends2[] = {"endif", NULL};
    body(P, &n->orelse, ends2);
  }
  expect_bend(P);
  return n;
}

// A macro's or a call block's parameters, "(a, b=1, ...)", as jinja2's
// parse_signature reads them: names into n->kw, each default (NULL: none)
// into n->args; no trailing comma, no parameter without a default after one
// with.
static void signature(parser *P, jnode *n) {
  expect_op(P, "(");
  int cap = 0, np = 0;
  bool defaults = false;
  while (!is_op(cur(P), ")")) {
    if (np) expect_op(P, ",");
    const char *pn = expect_name(P);
    if (np == cap) {
      cap = cap ? cap * 2 : 4;
      const char **nk = jalloc(P->c, (size_t)cap * sizeof *nk);
      if (np) memcpy(nk, n->kw, (size_t)np * sizeof *nk);
      n->kw = nk;
    }
    n->kw[np++] = pn;
    jnode *def = NULL;
    if (is_op(cur(P), "=")) {
      P->i++;
      def = expr(P);
      defaults = true;
    } else if (defaults) {
      jfail(P->c, "non-default argument follows default argument");
    }
    jn_push(P->c, &n->args, def);
  }
  expect_op(P, ")");
}

static jnode *statement(parser *P) {
  tok *t = cur(P);
  P->c->line = t->line;
  if (t->t != T_NAME) jfail(P->c, "expected a tag name after '{%%', got %s", tok_desc(P, t));
  const char *nm = jstrdup(P->c, t->s, t->n);
  P->i++;
  jnode *n;
  if (!strcmp(nm, "if")) return if_rest(P, t->line);
  if (!strcmp(nm, "for")) {
    n = node(P, S_FOR);
    n->line = t->line;
    n->a = target(P, false);
    if (!is_name(cur(P), "in")) jfail(P->c, "expected 'in' in a for tag");
    P->i++;
    n->b = tuple_expr(P, false);
    if (is_name(cur(P), "if")) {
      P->i++;
      n->c = expr(P);
    }
    if (is_name(cur(P), "recursive")) jfail(P->c, "recursive for loops are not supported");
    expect_bend(P);
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *e = body(P, &n->body, ends);
    if (!strcmp(e, "else")) {
      expect_bend(P);
      static const char *const ends2[] = {"endfor", NULL};
      body(P, &n->orelse, ends2);
    }
    expect_bend(P);
    return n;
  }
  if (!strcmp(nm, "set")) {
    n = node(P, S_SET);
    n->line = t->line;
    n->a = target(P, true);
    if (is_op(cur(P), "=")) {
      P->i++;
      n->b = tuple_expr(P, true);
      expect_bend(P);
      return n;
    }
    n->k = S_SETBLOCK;
    if (n->a->k != N_NAME && n->a->k != N_ATTR) jfail(P->c, "a block set assigns one name");
    jnode *f = NULL;
    while (is_op(cur(P), "|")) {
      P->i++;
      f = filter(P, f);
    }
    n->call = f;
    expect_bend(P);
    static const char *const ends[] = {"endset", NULL};
    body(P, &n->body, ends);
    expect_bend(P);
    return n;
  }
  if (!strcmp(nm, "macro")) {
    n = node(P, S_MACRO);
    n->line = t->line;
    n->name = expect_name(P);
    signature(P, n);
    expect_bend(P);
    static const char *const ends[] = {"endmacro", NULL};
    body(P, &n->body, ends);
    expect_bend(P);
    return n;
  }
  if (!strcmp(nm, "call")) {
    n = node(P, S_CALLBLOCK);
    n->line = t->line;
    if (is_op(cur(P), "(")) signature(P, n);  // the caller's parameters
    n->call = expr(P);
    if (n->call->k != N_CALL) jfail(P->c, "expected a call in a call tag");
    expect_bend(P);
    static const char *const ends[] = {"endcall", NULL};
    body(P, &n->body, ends);
    expect_bend(P);
    return n;
  }
  if (!strcmp(nm, "filter")) {
    n = node(P, S_FILTERBLOCK);
    n->line = t->line;
    jnode *f = filter(P, NULL);
    while (is_op(cur(P), "|")) {
      P->i++;
      f = filter(P, f);
    }
    n->call = f;
    expect_bend(P);
    static const char *const ends[] = {"endfilter", NULL};
    body(P, &n->body, ends);
    expect_bend(P);
    return n;
  }
  if (!strcmp(nm, "generation")) {  // transformers' AssistantTracker: renders its body
    n = node(P, S_GENERATION);
    n->line = t->line;
    expect_bend(P);
    static const char *const ends[] = {"endgeneration", NULL};
    body(P, &n->body, ends);
    expect_bend(P);
    return n;
  }
  if (!strcmp(nm, "with")) {  // targets in args, their values in ops
    n = node(P, S_WITH);
    n->line = t->line;
    while (cur(P)->t != T_BEND) {
      if (n->args.n) expect_op(P, ",");
      jn_push(P->c, &n->args, target(P, false));
      expect_op(P, "=");
      jn_push(P->c, &n->ops, expr(P));
    }
    expect_bend(P);
    static const char *const ends[] = {"endwith", NULL};
    body(P, &n->body, ends);
    expect_bend(P);
    return n;
  }
  if (!strcmp(nm, "break") || !strcmp(nm, "continue")) {
    n = node(P, nm[0] == 'b' ? S_BREAK : S_CONTINUE);
    n->line = t->line;
    expect_bend(P);
    return n;
  }
  static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "autoescape",
                                            "trans", "pluralize", "do", NULL};
  for (int i = 0; unsupported[i]; i++)
    if (!strcmp(nm, unsupported[i]))
      jfail(P->c, "the '%s' tag is not supported by tpr's Jinja (or not enabled in transformers' environment)", nm);
  jfail(P->c, "unknown tag '%s'", nm);
}

// Statements up to one of `ends` (its name consumed, its '%}' not); NULL
// ends: up to the end of the template. Returns the end tag's name.
static const char *body(parser *P, jnlist *out, const char *const *ends) {
  int line0 = cur(P)->line;
  while (1) {
    tok *t = cur(P);
    P->c->line = t->line;
    switch (t->t) {
      case T_EOF:
        if (ends) {
          P->c->line = line0;
          jfail(P->c, "unexpected end of template: expected '%s'", ends[0]);
        }
        return NULL;
      case T_TEXT: {
        jnode *n = node(P, S_TEXT);
        n->lit = jv_str(P->c, t->s, t->n);
        jn_push(P->c, out, n);
        P->i++;
        break;
      }
      case T_VBEGIN: {
        P->i++;
        jnode *n = node(P, S_OUT);
        n->a = tuple_expr(P, true);
        P->c->line = cur(P)->line;
        if (cur(P)->t != T_VEND) jfail(P->c, "expected '}}', got %s", tok_desc(P, cur(P)));
        P->i++;
        jn_push(P->c, out, n);
        break;
      }
      case T_BBEGIN: {
        tok *nt = peek(P, 1);
        if (name_in(nt, ends)) {
          P->i += 2;
          return jstrdup(P->c, nt->s, nt->n);
        }
        static const char *const closers[] = {"endif", "endfor", "endset", "endmacro", "endcall", "endfilter",
                                              "endgeneration", "endwith", "elif", "else", NULL};
        if (name_in(nt, closers)) {
          P->c->line = nt->line;
          jfail(P->c, "unexpected '%s'%s%s%s", tok_desc(P, nt), ends ? " (expected '" : "", ends ? ends[0] : "",
                ends ? "')" : "");
        }
        P->i++;
        if (++P->c->parse_depth > 100) jfail(P->c, "blocks nested too deep");
        jn_push(P->c, out, statement(P));
        P->c->parse_depth--;
        break;
      }
      default: jfail(P->c, "unexpected %s", tok_desc(P, t));
    }
  }
}

void jparse(jctx *c, const char *src, size_t len, jnlist *out) {
  if (!ju8_valid(src, len)) jfail(c, "the template is not valid UTF-8");
  // Newlines to \n, one trailing newline dropped (keep_trailing_newline=False).
  char *s = jalloc(c, len + 1);
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    if (src[i] == '\r') {
      s[n++] = '\n';
      if (i + 1 < len && src[i + 1] == '\n') i++;
    } else {
      s[n++] = src[i];
    }
  }
  if (n && s[n - 1] == '\n') n--;
  s[n] = 0;
  parser P = {.c = c, .t = jlex(c, s, n)};
  body(&P, out, NULL);
  jcheck_names(c, out);
}
