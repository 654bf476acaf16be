// The Jinja evaluator: expressions to values, statements to output, with
// jinja2's scoping (a for body is a scope per iteration, if is none, a macro
// is its own over the scope it was defined in) and its Undefined (prints as
// nothing, iterates as empty, fails when used as a value).
#define _GNU_SOURCE  // memmem
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

enum { OP_POW = 'P', OP_FLOORDIV = 'F', OP_EQ = 'E', OP_NE = 'N', OP_GE = 'G', OP_LE = 'L', OP_IN = 'I', OP_NOTIN = 'O' };

const char *const jglobal_names[JF_COUNT] = {"range", "dict", "namespace", "raise_exception", "strftime_now"};

void jstep(jctx *c) {
  if (++c->steps > c->max_steps) jfail(c, "the template ran more than %lld loop iterations and calls", (long long)c->max_steps);
}

// The output being written: the render's, or a capture (macro, set block).
static jbuf *cur_out(jctx *c) { return (jbuf *)c->out; }

static void out_put(jctx *c, const char *s, size_t n) {
  jbuf *b = cur_out(c);
  if (b->len + n > c->max_output) jfail(c, "the output is longer than %zu bytes", c->max_output);
  jb_put(c, b, s, n);
}

static jval capture(jctx *c, jscope *s, const jnlist *body, int *flow) {
  jbuf b = {0}, *saved = cur_out(c);
  jb_put(c, &b, "", 0);
  c->out = (char *)&b;
  jexec(c, s, body);  // a break in it reaches the enclosing loop, as in Python
  c->out = (char *)saved;
  if (flow) *flow = c->flow;
  return jv_str(c, b.p, b.len);
}

static jval *lookup(jscope *s, const char *name) {
  for (; s; s = s->parent) {
    jval *v = jd_gets(&s->vars, name);
    if (v) return v;
  }
  return NULL;
}

static void set_var(jctx *c, jscope *s, const char *name, jval v) { jd_set(c, &s->vars, jv_cstr(c, name), v); }

_Noreturn static void undefined_use(jctx *c, jval v) {
  jfail(c, "%s is undefined", v.undef ? v.undef : "a value");
}

// --- attribute and item access ------------------------------------------------------------
static jval method(jctx *c, jval self, const char *name) {
  jmethod *m = jalloc(c, sizeof *m);
  m->self = self;
  m->name = name;
  jval v = {.t = JV_METHOD};
  v.me = m;
  return v;
}

static jval undef_attr(jctx *c, jval obj, const char *name) {
  char *w = jalloc(c, strlen(name) + 64);
  sprintf(w, "'%s object' has no attribute '%s': it", jtype_name(obj), name);
  return jv_undef(w);
}

static jval loop_attr(jctx *c, jval obj, const char *name) {
  jloop *l = obj.loop;
  int64_t n = (int64_t)l->items->n, i = (int64_t)l->i;
  if (!strcmp(name, "index")) return jv_int(i + 1);
  if (!strcmp(name, "index0")) return jv_int(i);
  if (!strcmp(name, "revindex")) return jv_int(n - i);
  if (!strcmp(name, "revindex0")) return jv_int(n - i - 1);
  if (!strcmp(name, "first")) return jv_bool(i == 0);
  if (!strcmp(name, "last")) return jv_bool(i == n - 1);
  if (!strcmp(name, "length")) return jv_int(n);
  if (!strcmp(name, "depth")) return jv_int(l->depth);
  if (!strcmp(name, "depth0")) return jv_int(l->depth - 1);
  if (!strcmp(name, "previtem")) return i > 0 ? l->items->v[i - 1] : jv_undef("there is no previous item: loop.previtem");
  if (!strcmp(name, "nextitem")) return i + 1 < n ? l->items->v[i + 1] : jv_undef("there is no next item: loop.nextitem");
  if (!strcmp(name, "cycle")) return method(c, obj, "cycle");
  jfail(c, "loop.%s is not supported", name);
}

jval jgetattr(jctx *c, jval obj, const char *name) {
  switch (obj.t) {
    case JV_UNDEF: undefined_use(c, obj);
    case JV_DICT:
      if (jmethod_exists(obj, name)) return method(c, obj, name);
      {
        jval *v = jd_gets(obj.d, name);
        return v ? *v : undef_attr(c, obj, name);
      }
    case JV_NS: {
      jval *v = jd_gets(obj.d, name);
      return v ? *v : undef_attr(c, obj, name);
    }
    case JV_LOOP: return loop_attr(c, obj, name);
    case JV_STR: case JV_LIST:
      if (jmethod_exists(obj, name)) return method(c, obj, name);
      return undef_attr(c, obj, name);
    default:
      if (name[0] == '_') jfail(c, "access to attribute '%s' of '%s' object is unsafe", name, jtype_name(obj));
      return undef_attr(c, obj, name);
  }
}

// Python's slice.indices: start, stop, step for a sequence of n.
static void slice_indices(jctx *c, jval a, jval b, jval st, int64_t n, int64_t *start, int64_t *stop, int64_t *step) {
  *step = 1;
  if (st.t != JV_NONE && st.t != JV_UNDEF) {
    if (st.t != JV_INT) jfail(c, "slice indices must be integers or None");
    *step = st.i;
    if (*step == 0) jfail(c, "slice step cannot be zero");
  }
  int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
  if (a.t == JV_NONE || a.t == JV_UNDEF) {
    *start = *step < 0 ? hi : lo;
  } else {
    if (a.t != JV_INT) jfail(c, "slice indices must be integers or None");
    *start = a.i < 0 ? a.i + n : a.i;
    if (*start < lo) *start = lo;
    if (*start > hi) *start = hi;
  }
  if (b.t == JV_NONE || b.t == JV_UNDEF) {
    *stop = *step < 0 ? lo : hi;
  } else {
    if (b.t != JV_INT) jfail(c, "slice indices must be integers or None");
    *stop = b.i < 0 ? b.i + n : b.i;
    if (*stop < lo) *stop = lo;
    if (*stop > hi) *stop = hi;
  }
}

static jval do_slice(jctx *c, jval obj, jval a, jval b, jval st) {
  int64_t start, stop, step;
  if (obj.t == JV_STR) {
    bool ascii = ju8_count(obj.s->s, obj.s->len) == obj.s->len;
    int64_t n = ascii ? (int64_t)obj.s->len : (int64_t)ju8_count(obj.s->s, obj.s->len);
    slice_indices(c, a, b, st, n, &start, &stop, &step);
    if (step == 1) {
      if (stop <= start) return jv_str(c, "", 0);
      size_t bs = ascii ? (size_t)start : ju8_offset(obj.s->s, obj.s->len, (size_t)start);
      size_t be = ascii ? (size_t)stop : ju8_offset(obj.s->s, obj.s->len, (size_t)stop);
      return jv_str(c, obj.s->s + bs, be - bs);
    }
    size_t *off = jalloc(c, ((size_t)n + 1) * sizeof *off);
    size_t k = 0;
    for (size_t i = 0; i < obj.s->len; i++)
      if (((unsigned char)obj.s->s[i] & 0xc0) != 0x80) off[k++] = i;
    off[k] = obj.s->len;
    jbuf out = {0};
    jb_put(c, &out, "", 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      jb_put(c, &out, obj.s->s + off[i], off[i + 1] - off[i]);
    return jv_str(c, out.p, out.len);
  }
  if (obj.t == JV_LIST && obj.l->kind <= JL_TUPLE) {
    slice_indices(c, a, b, st, (int64_t)obj.l->n, &start, &stop, &step);
    jval r = jv_list(c, obj.l->kind);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) jl_push(c, r.l, obj.l->v[i]);
    return r;
  }
  if (obj.t == JV_UNDEF) undefined_use(c, obj);
  // jinja2 compiles x[a:b] to Python's own subscript: a TypeError.
  jfail(c, "'%s' object is not subscriptable (or its slicing is not supported)", jtype_name(obj));
}

jval jgetitem(jctx *c, jval obj, jval key) {
  switch (obj.t) {
    case JV_UNDEF: undefined_use(c, obj);
    case JV_DICT: {
      jval *v = jd_get(obj.d, key);
      if (v) return *v;
      if (key.t == JV_STR && jmethod_exists(obj, key.s->s)) return method(c, obj, key.s->s);
      return jv_undef("a dict key");
    }
    case JV_LIST:
    case JV_STR:
      if (key.t == JV_INT || key.t == JV_BOOL) {
        int64_t i = key.t == JV_INT ? key.i : key.b;
        if (obj.t == JV_LIST && obj.l->kind == JL_VIEW) jfail(c, "indexing a view or range is not supported");
        if (obj.t == JV_LIST && obj.l->kind == JL_GEN) return jv_undef("an item of a generator");
        int64_t n = obj.t == JV_LIST ? (int64_t)obj.l->n : (int64_t)ju8_count(obj.s->s, obj.s->len);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return jv_undef("an index out of range");
        if (obj.t == JV_LIST) return obj.l->v[i];
        size_t bs = ju8_offset(obj.s->s, obj.s->len, (size_t)i), be = ju8_offset(obj.s->s, obj.s->len, (size_t)i + 1);
        return jv_str(c, obj.s->s + bs, be - bs);
      }
      if (key.t == JV_STR) return jgetattr(c, obj, key.s->s);
      return jv_undef("an item");
    case JV_NS: case JV_LOOP:
      if (key.t == JV_STR) return jgetattr(c, obj, key.s->s);
      return jv_undef("an item");
    default:
      return jv_undef("an item");
  }
}

jlist *jiterate(jctx *c, jval v) {
  switch (v.t) {
    case JV_UNDEF: return jv_list(c, JL_LIST).l;
    case JV_LIST:
      if (v.l->kind == JL_GEN) {  // a generator is used up by iterating it
        jlist *l = jv_list(c, JL_LIST).l;
        for (size_t i = v.l->pos; i < v.l->n; i++) jl_push(c, l, v.l->v[i]);
        v.l->pos = v.l->n;
        return l;
      }
      return v.l;
    case JV_DICT: {
      jlist *l = jv_list(c, JL_LIST).l;
      for (size_t i = 0; i < v.d->n; i++) jl_push(c, l, v.d->k[i]);
      return l;
    }
    case JV_STR: {
      jlist *l = jv_list(c, JL_LIST).l;
      for (size_t i = 0; i < v.s->len;) {
        size_t k = 1;
        while (i + k < v.s->len && ((unsigned char)v.s->s[i + k] & 0xc0) == 0x80) k++;
        jl_push(c, l, jv_str(c, v.s->s + i, k));
        i += k;
      }
      return l;
    }
    default: jfail(c, "'%s' object is not iterable", jtype_name(v));
  }
}

// --- operators ---------------------------------------------------------------------------------
static bool is_num(jval v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static int64_t as_int(jval v) { return v.t == JV_INT ? v.i : v.t == JV_BOOL ? v.b : 0; }
static double as_dbl(jval v) { return v.t == JV_FLOAT ? v.f : (double)as_int(v); }

_Noreturn static void bad_operands(jctx *c, const char *op, jval a, jval b) {
  if (a.t == JV_UNDEF) undefined_use(c, a);
  if (b.t == JV_UNDEF) undefined_use(c, b);
  jfail(c, "unsupported operand type(s) for %s: '%s' and '%s'", op, jtype_name(a), jtype_name(b));
}

static jval repeat(jctx *c, jval seq, int64_t k) {
  if (k < 0) k = 0;
  if (seq.t == JV_STR) {
    if (seq.s->len && (size_t)k > c->max_output / seq.s->len) jfail(c, "a repeated string longer than the output limit");
    jbuf b = {0};
    jb_put(c, &b, "", 0);
    for (int64_t i = 0; i < k; i++) jb_put(c, &b, seq.s->s, seq.s->len);
    return jv_str(c, b.p, b.len);
  }
  if (seq.l->n && (size_t)k > c->max_output / seq.l->n) jfail(c, "a repeated list too long");
  jval r = jv_list(c, seq.l->kind);
  for (int64_t i = 0; i < k; i++)
    for (size_t j = 0; j < seq.l->n; j++) jl_push(c, r.l, seq.l->v[j]);
  return r;
}

static jval binop(jctx *c, int op, jval a, jval b) {
  if (is_num(a) && is_num(b)) {
    bool fl = a.t == JV_FLOAT || b.t == JV_FLOAT;
    int64_t x = as_int(a), y = as_int(b), r;
    double p = as_dbl(a), q = as_dbl(b);
    switch (op) {
      case '+':
        if (fl) return jv_float(p + q);
        if (__builtin_add_overflow(x, y, &r)) jfail(c, "integer overflow");
        return jv_int(r);
      case '-':
        if (fl) return jv_float(p - q);
        if (__builtin_sub_overflow(x, y, &r)) jfail(c, "integer overflow");
        return jv_int(r);
      case '*':
        if (fl) return jv_float(p * q);
        if (__builtin_mul_overflow(x, y, &r)) jfail(c, "integer overflow");
        return jv_int(r);
      case '/':
        if (q == 0) jfail(c, "division by zero");
        return jv_float(p / q);
      case OP_FLOORDIV:
        if (fl) {
          if (q == 0) jfail(c, "float floor division by zero");
          return jv_float(floor(p / q));
        }
        if (y == 0) jfail(c, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) jfail(c, "integer overflow");
        r = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) r--;
        return jv_int(r);
      case '%':
        if (fl) {
          if (q == 0) jfail(c, "float modulo");
          double m = fmod(p, q);
          if (m != 0 && ((m < 0) != (q < 0))) m += q;
          return jv_float(m);
        }
        if (y == 0) jfail(c, "integer division or modulo by zero");
        if (y == -1) return jv_int(0);
        r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return jv_int(r);
      case OP_POW:
        if (!fl && y >= 0) {
          int64_t acc = 1;
          for (int64_t i = 0; i < y; i++) {
            if (__builtin_mul_overflow(acc, x, &acc)) jfail(c, "integer overflow");
            if (acc == 0 || acc == 1) break;
          }
          return jv_int(acc);
        }
        return jv_float(pow(p, q));
    }
  }
  if (op == '+') {
    if (a.t == JV_STR && b.t == JV_STR) {
      // Markup + str and str + Markup escape the plain side (markupsafe's
      // __add__/__radd__), and the sum is Markup.
      bool markup = a.s->markup || b.s->markup;
      if (markup) {
        a = jescape(c, a);
        b = jescape(c, b);
      }
      jval r;
      char *p = jalloc(c, a.s->len + b.s->len + 1);
      memcpy(p, a.s->s, a.s->len);
      memcpy(p + a.s->len, b.s->s, b.s->len);
      r = jv_str(c, p, a.s->len + b.s->len);
      r.s->markup = markup;
      return r;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.l->kind == b.l->kind && a.l->kind <= JL_TUPLE) {
      jval r = jv_list(c, a.l->kind);
      for (size_t i = 0; i < a.l->n; i++) jl_push(c, r.l, a.l->v[i]);
      for (size_t i = 0; i < b.l->n; i++) jl_push(c, r.l, b.l->v[i]);
      return r;
    }
  }
  if (op == '*') {
    if ((a.t == JV_STR || (a.t == JV_LIST && a.l->kind <= JL_TUPLE)) && (b.t == JV_INT || b.t == JV_BOOL))
      return repeat(c, a, as_int(b));
    if ((b.t == JV_STR || (b.t == JV_LIST && b.l->kind <= JL_TUPLE)) && (a.t == JV_INT || a.t == JV_BOOL))
      return repeat(c, b, as_int(a));
  }
  if (op == '%' && a.t == JV_STR) {  // Python's printf-style formatting: a tuple is the arguments
    if (a.s->markup) jfail(c, "'%%' on a |safe or |e string (Markup escapes the arguments) is not supported");
    if (b.t == JV_DICT) jfail(c, "'%%' formatting with a mapping is not supported");
    if (b.t == JV_LIST && b.l->kind == JL_TUPLE) return jpercent_format(c, a.s, (int)b.l->n, b.l->v, false);
    return jpercent_format(c, a.s, 1, &b, b.t == JV_LIST || b.t == JV_UNDEF);
  }
  const char *name = op == OP_POW ? "**" : op == OP_FLOORDIV ? "//" : op == '+' ? "+" : op == '-' ? "-" : op == '*' ? "*" : op == '/' ? "/" : "%";
  bad_operands(c, name, a, b);
}

static bool contains(jctx *c, jval item, jval seq) {
  switch (seq.t) {
    case JV_UNDEF: return false;
    case JV_STR:
      if (item.t != JV_STR) jfail(c, "'in <string>' requires string as left operand, not %s", jtype_name(item));
      if (item.s->len == 0) return true;
      return memmem(seq.s->s, seq.s->len, item.s->s, item.s->len) != NULL;
    case JV_LIST: {
      size_t from = seq.l->kind == JL_GEN ? seq.l->pos : 0;
      for (size_t i = from; i < seq.l->n; i++)
        if (jequal(item, seq.l->v[i])) {
          if (seq.l->kind == JL_GEN) seq.l->pos = i + 1;
          return true;
        }
      if (seq.l->kind == JL_GEN) seq.l->pos = seq.l->n;
      return false;
    }
    case JV_DICT:
      if ((item.t == JV_LIST && item.l->kind != JL_TUPLE) || item.t == JV_DICT || item.t == JV_NS)
        jfail(c, "unhashable type: '%s'", jtype_name(item));
      return jd_get(seq.d, item) != NULL;
    default: jfail(c, "argument of type '%s' is not iterable", jtype_name(seq));
  }
}

static bool cmp_op(jctx *c, int op, jval a, jval b) {
  switch (op) {
    case OP_EQ: return jequal(a, b);
    case OP_NE: return !jequal(a, b);
    case OP_IN: return contains(c, a, b);
    case OP_NOTIN: return !contains(c, a, b);
  }
  if (a.t == JV_UNDEF) undefined_use(c, a);
  if (b.t == JV_UNDEF) undefined_use(c, b);
  int r = jcompare(c, a, b);
  switch (op) {
    case '<': return r < 0;
    case '>': return r > 0;
    case OP_LE: return r <= 0;
    case OP_GE: return r >= 0;
  }
  return false;
}

// --- calls -------------------------------------------------------------------------------------------
static jval call_macro(jctx *c, jmacro *m, int n, const jval *args, const char **kw) {
  const jnode *def = m->def;
  if (++c->depth > c->max_depth) jfail(c, "macros nested deeper than %d calls", c->max_depth);
  jstep(c);
  jscope *s = jalloc(c, sizeof *s);
  memset(s, 0, sizeof *s);
  s->parent = m->closure;
  int np = def->args.n;
  int npos = 0;
  for (int i = 0; i < n; i++)
    if (!kw || !kw[i]) npos++;
  if (npos > np) jfail(c, "macro '%s' takes not more than %d argument(s)", def->name ? def->name : "caller", np);
  bool *given = jalloc(c, (size_t)(np + 1) * sizeof *given);
  memset(given, 0, (size_t)(np + 1) * sizeof *given);
  int pi = 0;
  for (int i = 0; i < n; i++) {
    if (kw && kw[i]) {
      int k = 0;
      while (k < np && strcmp(def->kw[k], kw[i]) != 0) k++;
      if (k == np) jfail(c, "macro '%s' takes no keyword argument '%s'", def->name ? def->name : "caller", kw[i]);
      set_var(c, s, kw[i], args[i]);
      given[k] = true;
    } else {
      set_var(c, s, def->kw[pi], args[i]);
      given[pi++] = true;
    }
  }
  for (int k = 0; k < np; k++)
    if (!given[k]) {
      const jnode *d = def->args.v[k];
      set_var(c, s, def->kw[k], d ? jeval(c, s, d) : jv_undef("a macro parameter that was not provided"));
    }
  if (m->caller) {
    jval cv = {.t = JV_MACRO};
    cv.m = m->caller;
    set_var(c, s, "caller", cv);
  }
  jval r = capture(c, s, &def->body, NULL);
  c->depth--;
  return r;
}

jval jcall(jctx *c, jscope *s, jval f, int n, const jval *args, const char **kw) {
  (void)s;
  switch (f.t) {
    case JV_MACRO: return call_macro(c, f.m, n, args, kw);
    case JV_FUNC: return jglobal_call(c, f.fn, n, args, kw);
    case JV_METHOD:
      if (f.me->self.t == JV_LOOP && !strcmp(f.me->name, "cycle")) {
        if (n == 0) jfail(c, "no items for cycling given");
        return args[f.me->self.loop->i % (size_t)n];
      }
      return jmethod_call(c, f.me->self, f.me->name, n, args, kw);
    case JV_UNDEF: undefined_use(c, f);
    default: jfail(c, "'%s' object is not callable", jtype_name(f));
  }
}

static void eval_args(jctx *c, jscope *s, const jnode *n, jval **args) {
  *args = jalloc(c, (size_t)(n->args.n + 1) * sizeof **args);
  for (int i = 0; i < n->args.n; i++) (*args)[i] = jeval(c, s, n->args.v[i]);
}

// A filter chain whose innermost operand is `v` (filter and set blocks).
static jval apply_chain(jctx *c, jscope *s, const jnode *f, jval v) {
  if (!f) return v;
  jval in = apply_chain(c, s, f->a, v);
  jval *args;
  eval_args(c, s, f, &args);
  c->line = f->line;
  return jfilter(c, s, f->name, in, f->args.n, args, f->kw);
}

// --- expressions ---------------------------------------------------------------------------------------
jval jeval(jctx *c, jscope *s, const jnode *n) {
  c->line = n->line;
  switch (n->k) {
    case N_LIT: return n->lit;
    case N_NAME: {
      jval *v = lookup(s, n->name);
      if (v) return *v;
      for (int i = 0; i < JF_COUNT; i++)
        if (!strcmp(n->name, jglobal_names[i])) {
          jval f = {.t = JV_FUNC};
          f.fn = i;
          return f;
        }
      char *w = jalloc(c, strlen(n->name) + 4);
      sprintf(w, "'%s'", n->name);
      return jv_undef(w);
    }
    case N_LIST: case N_TUPLE: {
      jval r = jv_list(c, n->k == N_LIST ? JL_LIST : JL_TUPLE);
      for (int i = 0; i < n->args.n; i++) jl_push(c, r.l, jeval(c, s, n->args.v[i]));
      return r;
    }
    case N_DICT: {
      jval r = jv_dict(c);
      for (int i = 0; i + 1 < n->args.n; i += 2) {
        jval k = jeval(c, s, n->args.v[i]);
        if (k.t == JV_LIST && k.l->kind != JL_TUPLE) jfail(c, "unhashable type: 'list'");
        if (k.t == JV_DICT) jfail(c, "unhashable type: 'dict'");
        jd_set(c, r.d, k, jeval(c, s, n->args.v[i + 1]));
      }
      return r;
    }
    case N_ATTR: {
      jval o = jeval(c, s, n->a);
      c->line = n->line;
      return jgetattr(c, o, n->name);
    }
    case N_ITEM: {
      jval o = jeval(c, s, n->a);
      if (n->b->k == N_SLICE) {
        jval a = n->b->a ? jeval(c, s, n->b->a) : jv_none();
        jval b = n->b->b ? jeval(c, s, n->b->b) : jv_none();
        jval st = n->b->c ? jeval(c, s, n->b->c) : jv_none();
        c->line = n->line;
        return do_slice(c, o, a, b, st);
      }
      jval k = jeval(c, s, n->b);
      c->line = n->line;
      return jgetitem(c, o, k);
    }
    case N_CALL: {
      jval f = jeval(c, s, n->a);
      jval *args;
      eval_args(c, s, n, &args);
      c->line = n->line;
      return jcall(c, s, f, n->args.n, args, n->kw);
    }
    case N_FILTER: {
      jval v = jeval(c, s, n->a);
      jval *args;
      eval_args(c, s, n, &args);
      c->line = n->line;
      if (!jfilter_known(n->name)) jfail(c, "no filter named '%s' (or tpr's Jinja does not support it)", n->name);
      return jfilter(c, s, n->name, v, n->args.n, args, n->kw);
    }
    case N_TEST: {
      jval v = jeval(c, s, n->a);
      jval *args;
      eval_args(c, s, n, &args);
      c->line = n->line;
      if (!jtest_known(n->name)) jfail(c, "no test named '%s' (or tpr's Jinja does not support it)", n->name);
      bool r = jtest(c, s, n->name, v, n->args.n, args);
      return jv_bool(n->negate ? !r : r);
    }
    case N_UNARY: {
      jval v = jeval(c, s, n->a);
      c->line = n->line;
      if (v.t == JV_INT || v.t == JV_BOOL) {
        int64_t x = as_int(v);
        if (n->op == '+') return jv_int(x);
        if (x == INT64_MIN) jfail(c, "integer overflow");
        return jv_int(-x);
      }
      if (v.t == JV_FLOAT) return jv_float(n->op == '-' ? -v.f : v.f);
      if (v.t == JV_UNDEF) undefined_use(c, v);
      jfail(c, "bad operand type for unary %c: '%s'", n->op, jtype_name(v));
    }
    case N_BINARY: {
      jval a = jeval(c, s, n->a), b = jeval(c, s, n->b);
      c->line = n->line;
      return binop(c, n->op, a, b);
    }
    case N_AND: {
      jval a = jeval(c, s, n->a);
      return jtruthy(c, a) ? jeval(c, s, n->b) : a;
    }
    case N_OR: {
      jval a = jeval(c, s, n->a);
      return jtruthy(c, a) ? a : jeval(c, s, n->b);
    }
    case N_NOT: return jv_bool(!jtruthy(c, jeval(c, s, n->a)));
    case N_COND:
      if (jtruthy(c, jeval(c, s, n->a))) return jeval(c, s, n->b);
      return n->c ? jeval(c, s, n->c) : jv_undef("the else of an if-expression without one");
    case N_CONCAT: {
      jbuf b = {0};
      jb_put(c, &b, "", 0);
      for (int i = 0; i < n->args.n; i++) jstr_of(c, &b, jeval(c, s, n->args.v[i]));
      return jv_str(c, b.p, b.len);
    }
    case N_COMPARE: {
      jval a = jeval(c, s, n->a);
      for (int i = 0; i < n->ops.n; i++) {
        jval b = jeval(c, s, n->ops.v[i]->a);
        c->line = n->line;
        if (!cmp_op(c, n->ops.v[i]->op, a, b)) return jv_bool(false);
        a = b;
      }
      return jv_bool(true);
    }
    default: jfail(c, "internal: an expression of kind %d", (int)n->k);
  }
}

// --- statements ------------------------------------------------------------------------------------------
static void assign(jctx *c, jscope *s, const jnode *t, jval v) {
  if (t->k == N_NAME) {
    set_var(c, s, t->name, v);
    return;
  }
  if (t->k == N_ATTR) {
    jval *ns = lookup(s, t->a->name);
    if (!ns || ns->t != JV_NS) jfail(c, "cannot assign attribute on non-namespace object");
    if (t->name[0] == '_')
      jfail(c, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.", t->name);
    jd_set(c, ns->d, jv_cstr(c, t->name), v);
    return;
  }
  // a tuple of names
  jlist *items = jiterate(c, v);
  if ((int)items->n != t->args.n)
    jfail(c, "%s values to unpack (expected %d, got %zu)", (int)items->n > t->args.n ? "too many" : "not enough",
          t->args.n, items->n);
  for (int i = 0; i < t->args.n; i++) set_var(c, s, t->args.v[i]->name, items->v[i]);
}

static int exec_for(jctx *c, jscope *s, const jnode *n) {
  jval it = jeval(c, s, n->b);
  c->line = n->line;
  jlist *items = jiterate(c, it);
  if (n->c) {  // for x in y if cond: filtered before the loop counts
    jlist *kept = jv_list(c, JL_LIST).l;
    for (size_t i = 0; i < items->n; i++) {
      jstep(c);
      jscope *fs = jalloc(c, sizeof *fs);
      memset(fs, 0, sizeof *fs);
      fs->parent = s;
      assign(c, fs, n->a, items->v[i]);
      if (jtruthy(c, jeval(c, fs, n->c))) jl_push(c, kept, items->v[i]);
    }
    items = kept;
  }
  int depth = 1;  // loop.depth counts recursive loop() calls only, which tpr refuses
  jloop *lp = jalloc(c, sizeof *lp);
  lp->items = items;
  lp->depth = depth;
  jval lv = {.t = JV_LOOP};
  lv.loop = lp;
  for (size_t i = 0; i < items->n; i++) {
    jstep(c);
    lp->i = i;
    jscope *is = jalloc(c, sizeof *is);
    memset(is, 0, sizeof *is);
    is->parent = s;
    set_var(c, is, "loop", lv);
    c->line = n->line;
    assign(c, is, n->a, items->v[i]);
    jexec(c, is, &n->body);
    int f = c->flow;  // the body's break/continue
    c->flow = FLOW_NORMAL;
    if (f == FLOW_BREAK) break;
  }
  if (items->n == 0 && n->orelse.n) jexec(c, s, &n->orelse);
  return FLOW_NORMAL;
}

// Runs statements; a break or continue stops them and is left in c->flow
// for the enclosing loop.
void jexec(jctx *c, jscope *s, const jnlist *body) {
  for (int i = 0; i < body->n; i++) {
    const jnode *n = body->v[i];
    c->line = n->line;
    switch (n->k) {
      case S_TEXT: out_put(c, n->lit.s->s, n->lit.s->len); break;
      case S_OUT: {
        jval v = jeval(c, s, n->a);
        c->line = n->line;
        if (v.t == JV_STR) {
          out_put(c, v.s->s, v.s->len);
        } else {
          jbuf b = {0};
          jb_put(c, &b, "", 0);
          jstr_of(c, &b, v);
          out_put(c, b.p, b.len);
        }
        break;
      }
      case S_IF: {
        if (jtruthy(c, jeval(c, s, n->a))) jexec(c, s, &n->body);
        else jexec(c, s, &n->orelse);
        break;
      }
      case S_FOR: exec_for(c, s, n); break;
      case S_SET: assign(c, s, n->a, jeval(c, s, n->b)); break;
      case S_SETBLOCK: {
        jval v = capture(c, s, &n->body, NULL);
        assign(c, s, n->a, apply_chain(c, s, n->call, v));
        break;
      }
      case S_FILTERBLOCK: {
        jval v = capture(c, s, &n->body, NULL);
        jval r = jv_to_str(c, apply_chain(c, s, n->call, v));
        out_put(c, r.s->s, r.s->len);
        break;
      }
      case S_GENERATION: jexec(c, s, &n->body); break;
      case S_WITH: {  // the values are evaluated outside, then bound in a scope of their own
        jval *vals = jalloc(c, (size_t)(n->ops.n + 1) * sizeof *vals);
        for (int k = 0; k < n->ops.n; k++) vals[k] = jeval(c, s, n->ops.v[k]);
        jscope *ws = jalloc(c, sizeof *ws);
        memset(ws, 0, sizeof *ws);
        ws->parent = s;
        for (int k = 0; k < n->args.n; k++) assign(c, ws, n->args.v[k], vals[k]);
        jexec(c, ws, &n->body);
        break;
      }
      case S_MACRO: {
        jmacro *m = jalloc(c, sizeof *m);
        memset(m, 0, sizeof *m);
        m->def = n;
        m->closure = s;
        jval v = {.t = JV_MACRO};
        v.m = m;
        set_var(c, s, n->name, v);
        break;
      }
      case S_CALLBLOCK: {
        jmacro *caller = jalloc(c, sizeof *caller);
        memset(caller, 0, sizeof *caller);
        caller->def = n;  // its args/kw are the caller's parameters, its body the caller's
        caller->closure = s;
        jval f = jeval(c, s, n->call->a);
        jval *args;
        eval_args(c, s, n->call, &args);
        c->line = n->line;
        if (f.t != JV_MACRO) jfail(c, "a call block must call a macro");
        jmacro with = *f.m;
        with.caller = caller;
        jval r = call_macro(c, &with, n->call->args.n, args, n->call->kw);
        out_put(c, r.s->s, r.s->len);
        break;
      }
      case S_BREAK: c->flow = FLOW_BREAK; return;
      case S_CONTINUE: c->flow = FLOW_CONTINUE; return;
      default: jfail(c, "internal: a statement of kind %d", (int)n->k);
    }
    if (c->flow != FLOW_NORMAL) return;  // a break/continue inside an if
  }
}
