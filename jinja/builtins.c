// Filters, tests, methods and globals of the Jinja interpreter: jinja2 3.1's
// builtins (filters.py, tests.py) as far as chat templates use them, the
// methods of Python's str, list and dict that the sandbox allows, and
// transformers' globals. Names jinja2 knows but tpr does not implement are
// refused with their name, never rendered differently.
#define _GNU_SOURCE  // memmem
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "jinja/jinja_impl.h"

// --- arguments ---------------------------------------------------------------------------
// Argument `pos` (counting positional ones) or keyword `name`; NULL if absent.
const jval *jarg(int n, const jval *args, const char **kw, int pos, const char *name) {
  int p = 0;
  for (int i = 0; i < n; i++) {
    if (kw && kw[i]) {
      if (name && !strcmp(kw[i], name)) return &args[i];
    } else if (p++ == pos) {
      return &args[i];
    }
  }
  return NULL;
}

void jcheck_args(jctx *c, const char *what, int n, const char **kw, int max_pos, const char *const *names) {
  int p = 0;
  for (int i = 0; i < n; i++) {
    if (kw && kw[i]) {
      bool ok = false;
      for (int k = 0; names && names[k]; k++) ok |= !strcmp(names[k], kw[i]);
      if (!ok) jfail(c, "%s got an unexpected keyword argument '%s'", what, kw[i]);
    } else if (++p > max_pos) {
      jfail(c, "%s takes at most %d positional argument(s)", what, max_pos);
    }
  }
}

jstr *jneed_str(jctx *c, jval v, const char *what) {
  if (v.t != JV_STR) {
    if (v.t == JV_UNDEF) jfail(c, "%s is undefined", v.undef ? v.undef : "a value");
    jfail(c, "%s expects a string, got %s", what, jtype_name(v));
  }
  return v.s;
}

bool jis_none(const jval *v) { return !v || v->t == JV_NONE; }

// --- tests ----------------------------------------------------------------------------------------------
static const char *const tests[] = {"defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
                                    "sequence", "iterable", "boolean", "true", "false", "even", "odd", "divisibleby",
                                    "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt",
                                    "greaterthan", ">", "ge", ">=", "in", "sameas", "callable", "lower", "upper",
                                    "filter", "test", "escaped", NULL};

bool jtest_known(const char *name) { return jin_list(tests, name); }

bool jtest(jctx *c, jscope *s, const char *name, jval v, int n, const jval *args) {
  (void)s;
  if (!strcmp(name, "defined")) return v.t != JV_UNDEF;
  if (!strcmp(name, "undefined")) return v.t == JV_UNDEF;
  if (!strcmp(name, "none")) return v.t == JV_NONE;
  if (!strcmp(name, "string")) return v.t == JV_STR;
  if (!strcmp(name, "number")) return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
  if (!strcmp(name, "integer")) return v.t == JV_INT;
  if (!strcmp(name, "float")) return v.t == JV_FLOAT;
  if (!strcmp(name, "boolean")) return v.t == JV_BOOL;
  if (!strcmp(name, "true")) return v.t == JV_BOOL && v.b;
  if (!strcmp(name, "false")) return v.t == JV_BOOL && !v.b;
  if (!strcmp(name, "mapping")) return v.t == JV_DICT;
  // Undefined has __len__ and __getitem__ (that raise when called): a sequence to jinja2.
  if (!strcmp(name, "sequence"))
    return v.t == JV_STR || v.t == JV_DICT || v.t == JV_UNDEF || (v.t == JV_LIST && v.l->kind != JL_GEN);
  if (!strcmp(name, "iterable")) return v.t == JV_STR || v.t == JV_DICT || v.t == JV_LIST || v.t == JV_UNDEF;
  if (!strcmp(name, "callable")) return v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_METHOD;
  if (!strcmp(name, "escaped")) return v.t == JV_STR && v.s->markup;
  if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
    if (v.t != JV_STR) jfail(c, "the '%s' test expects a string", name);
    jval m = jmap_case(c, v.s, name[0] == 'l' ? jcp_lower : jcp_upper, 0);
    bool cased = false;
    for (size_t i = 0; i < v.s->len;) {
      uint32_t cp;
      int k = ju8_decode(v.s->s + i, v.s->len - i, &cp);
      if (!k) break;
      cased |= jcp_upper(cp) != jcp_lower(cp);
      i += (size_t)k;
    }
    return cased && jequal(m, v);
  }
  if (!strcmp(name, "even") || !strcmp(name, "odd")) {  // value % 2 == 1 / == 0, floats too
    if (v.t == JV_FLOAT) {
      double m = fmod(v.f, 2.0);
      if (m < 0) m += 2.0;
      return name[0] == 'o' ? m == 1.0 : m == 0.0;
    }
    if (v.t != JV_INT && v.t != JV_BOOL) jfail(c, "the '%s' test expects a number", name);
    int64_t x = v.t == JV_INT ? v.i : v.b;
    return (x % 2 != 0) == (name[0] == 'o');
  }
  if (!strcmp(name, "filter")) return v.t == JV_STR && jfilter_known(v.s->s);
  if (!strcmp(name, "test")) return v.t == JV_STR && jtest_known(v.s->s);
  if (n < 1) jfail(c, "the '%s' test expects an argument", name);
  jval b = args[0];
  if (!strcmp(name, "divisibleby")) {
    if ((v.t == JV_FLOAT && (b.t == JV_INT || b.t == JV_BOOL || b.t == JV_FLOAT)) ||
        (b.t == JV_FLOAT && (v.t == JV_INT || v.t == JV_BOOL))) {  // value % num == 0 in floats
      double x = v.t == JV_FLOAT ? v.f : (double)(v.t == JV_INT ? v.i : v.b);
      double y = b.t == JV_FLOAT ? b.f : (double)(b.t == JV_INT ? b.i : b.b);
      if (y == 0) jfail(c, "float modulo");
      return fmod(x, y) == 0;
    }
    if ((v.t != JV_INT && v.t != JV_BOOL) || (b.t != JV_INT && b.t != JV_BOOL)) jfail(c, "divisibleby expects numbers");
    int64_t x = v.t == JV_INT ? v.i : v.b, y = b.t == JV_INT ? b.i : b.b;
    if (y == 0) jfail(c, "integer division or modulo by zero");
    return x % y == 0;
  }
  if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return jequal(v, b);
  if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jequal(v, b);
  if (!strcmp(name, "sameas")) {
    if (v.t != b.t) return false;
    if (v.t == JV_NONE || v.t == JV_UNDEF) return true;
    if (v.t == JV_BOOL) return v.b == b.b;
    if (v.t == JV_LIST) return v.l == b.l;
    if (v.t == JV_DICT || v.t == JV_NS) return v.d == b.d;
    jfail(c, "'sameas' on a %s (Python object identity) is not supported", jtype_name(v));
  }
  if (!strcmp(name, "in")) {
    jval t = jv_bool(false);
    (void)t;
    if (b.t == JV_STR) {
      if (v.t != JV_STR) jfail(c, "'in <string>' requires string as left operand");
      return v.s->len == 0 || memmem(b.s->s, b.s->len, v.s->s, v.s->len) != NULL;
    }
    if (b.t == JV_DICT) return jd_get(b.d, v) != NULL;
    jlist *l = jiterate(c, b);
    for (size_t i = 0; i < l->n; i++)
      if (jequal(v, l->v[i])) return true;
    return false;
  }
  int r = jcompare(c, v, b);
  if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<")) return r < 0;
  if (!strcmp(name, "le") || !strcmp(name, "<=")) return r <= 0;
  if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">")) return r > 0;
  if (!strcmp(name, "ge") || !strcmp(name, ">=")) return r >= 0;
  jfail(c, "the test '%s' is not supported", name);
}

// --- filters ---------------------------------------------------------------------------------------------
static const char *const filters[] = {"tojson", "trim", "length", "count", "upper", "lower", "title", "capitalize",
                                      "replace", "join", "default", "d", "first", "last", "items", "list", "string",
                                      "int", "float", "abs", "round", "unique", "sort", "reverse", "selectattr",
                                      "rejectattr", "map", "select", "reject", "safe", "e", "escape", "indent",
                                      "wordcount", "sum", "min", "max", "attr", "dictsort", "format", NULL};

bool jfilter_known(const char *name) { return jin_list(filters, name); }

static int64_t len_of(jctx *c, jval v) {
  switch (v.t) {
    case JV_STR: return (int64_t)ju8_count(v.s->s, v.s->len);
    case JV_LIST:
      if (v.l->kind == JL_GEN) jfail(c, "object of type 'generator' has no len()");
      return (int64_t)v.l->n;
    case JV_DICT: return (int64_t)v.d->n;
    case JV_UNDEF: return 0;
    default: jfail(c, "object of type '%s' has no len()", jtype_name(v));
  }
}

// An attribute path "a.b.0" of jinja's make_attrgetter.
static jval attr_path(jctx *c, jval v, jstr *path) {
  size_t i = 0;
  while (i <= path->len) {
    size_t e = i;
    while (e < path->len && path->s[e] != '.') e++;
    char *part = jstrdup(c, path->s + i, e - i);
    bool digits = e > i;
    for (size_t k = i; k < e; k++) digits &= path->s[k] >= '0' && path->s[k] <= '9';
    v = digits ? jgetitem(c, v, jv_int(atoll(part))) : jgetitem(c, v, jv_cstr(c, part));
    i = e + 1;
  }
  return v;
}

// select/reject/selectattr/rejectattr/map: a generator.
static jval select_like(jctx *c, jscope *s, const char *name, jval v, int n, const jval *args, const char **kw) {
  jlist *l = jtruthy(c, v) ? jiterate(c, v) : jv_list(c, JL_LIST).l;  // jinja2: `if seq:` first, so 0 gives nothing
  jval r = jv_list(c, JL_GEN);
  bool byattr = strstr(name, "attr") != NULL, reject = name[0] == 'r';
  if (!strcmp(name, "map")) {
    const jval *attribute = jarg(n, args, kw, -1, "attribute");
    if (attribute) {
      const jval *def = jarg(n, args, kw, -1, "default");
      for (size_t i = 0; i < l->n; i++) {
        jval x = attr_path(c, l->v[i], jneed_str(c, *attribute, "map"));
        jl_push(c, r.l, x.t == JV_UNDEF && def ? *def : x);
      }
      return r;
    }
    if (n < 1) jfail(c, "map expects a filter name or attribute=");
    const char *f = jneed_str(c, args[0], "map")->s;
    if (!jfilter_known(f)) jfail(c, "no filter named '%s'", f);
    for (size_t i = 0; i < l->n; i++) jl_push(c, r.l, jfilter(c, s, f, l->v[i], n - 1, args + 1, kw ? kw + 1 : NULL));
    return r;
  }
  int skip = byattr ? 1 : 0;
  if (byattr && n < 1) jfail(c, "%s expects an attribute", name);
  const char *test = n > skip ? jneed_str(c, args[skip], name)->s : NULL;
  if (test && !jtest_known(test)) jfail(c, "no test named '%s'", test);
  for (size_t i = 0; i < l->n; i++) {
    jval x = byattr ? attr_path(c, l->v[i], jneed_str(c, args[0], name)) : l->v[i];
    bool ok = test ? jtest(c, s, test, x, n - skip - 1, args + skip + 1) : jtruthy(c, x);
    if (ok != reject) jl_push(c, r.l, l->v[i]);
  }
  return r;
}

static jval sort_list(jctx *c, jlist *l, bool rev, bool case_sensitive, jstr *attribute) {
  size_t n = l->n;
  jval *keys = jalloc(c, (n + 1) * sizeof *keys);
  jval r = jv_list(c, JL_LIST);
  for (size_t i = 0; i < n; i++) {
    jval k = attribute ? attr_path(c, l->v[i], attribute) : l->v[i];
    if (!case_sensitive && k.t == JV_STR) k = jmap_case(c, k.s, jcp_lower, 0);
    keys[i] = k;
    jl_push(c, r.l, l->v[i]);
  }
  // stable insertion sort (Python's sort is stable; reverse keeps equal items' order)
  for (size_t i = 1; i < n; i++)
    for (size_t j = i; j > 0; j--) {
      int cmp = jcompare(c, keys[j - 1], keys[j]);
      if (rev ? cmp >= 0 : cmp <= 0) break;
      jval t = keys[j];
      keys[j] = keys[j - 1];
      keys[j - 1] = t;
      t = r.l->v[j];
      r.l->v[j] = r.l->v[j - 1];
      r.l->v[j - 1] = t;
    }
  return r;
}

jval jescape(jctx *c, jval v) {
  if (v.t == JV_STR && v.s->markup) return v;
  jval s = jv_to_str(c, v);
  jbuf b = {0};
  jb_put(c, &b, "", 0);
  for (size_t i = 0; i < s.s->len; i++) {
    switch (s.s->s[i]) {
      case '&': jb_puts(c, &b, "&amp;"); break;
      case '<': jb_puts(c, &b, "&lt;"); break;
      case '>': jb_puts(c, &b, "&gt;"); break;
      case '"': jb_puts(c, &b, "&#34;"); break;
      case '\'': jb_puts(c, &b, "&#39;"); break;
      default: jb_put(c, &b, s.s->s + i, 1);
    }
  }
  jval r = jv_str(c, b.p, b.len);
  r.s->markup = true;
  return r;
}

jval jfilter(jctx *c, jscope *s, const char *name, jval v, int n, const jval *args, const char **kw) {
  jstep(c);
  if (!strcmp(name, "tojson")) {
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    jcheck_args(c, "tojson", n, kw, 4, names);
    const jval *ea = jarg(n, args, kw, 0, "ensure_ascii"), *ind = jarg(n, args, kw, 1, "indent"),
               *sep = jarg(n, args, kw, 2, "separators"), *sk = jarg(n, args, kw, 3, "sort_keys");
    if (ea && jtruthy(c, *ea)) jfail(c, "tojson(ensure_ascii=True) is not supported");
    const char *indent = NULL;
    if (!jis_none(ind)) {
      if (ind->t == JV_INT) {
        char *sp = jalloc(c, (size_t)(ind->i > 0 ? ind->i : 0) + 1);
        int64_t k = ind->i > 0 ? ind->i : 0;
        if (k > 64) jfail(c, "tojson: indent too large");
        memset(sp, ' ', (size_t)k);
        sp[k] = 0;
        indent = sp;
      } else if (ind->t == JV_STR) {
        indent = ind->s->s;
      } else {
        jfail(c, "tojson: indent must be an int or a string");
      }
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (!jis_none(sep)) {
      if (sep->t != JV_LIST || sep->l->n != 2 || sep->l->v[0].t != JV_STR || sep->l->v[1].t != JV_STR)
        jfail(c, "tojson: separators must be a pair of strings");
      item_sep = sep->l->v[0].s->s;
      key_sep = sep->l->v[1].s->s;
    }
    if (v.t == JV_UNDEF) jfail(c, "Object of type Undefined is not JSON serializable");
    jbuf b = {0};
    jb_put(c, &b, "", 0);
    jjson_of(c, &b, v, indent, 0, item_sep, key_sep, sk && jtruthy(c, *sk));
    return jv_str(c, b.p, b.len);
  }
  if (!strcmp(name, "default") || !strcmp(name, "d")) {
    const jval *def = jarg(n, args, kw, 0, "default_value"), *boolean = jarg(n, args, kw, 1, "boolean");
    bool use = v.t == JV_UNDEF || (boolean && jtruthy(c, *boolean) && !jtruthy(c, v));
    return use ? (def ? *def : jv_str(c, "", 0)) : v;
  }
  if (!strcmp(name, "length") || !strcmp(name, "count")) return jv_int(len_of(c, v));
  if (!strcmp(name, "safe")) {
    jval r = jv_to_str(c, v);
    r = jv_str(c, r.s->s, r.s->len);
    r.s->markup = true;
    return r;
  }
  if (!strcmp(name, "e") || !strcmp(name, "escape")) return jescape(c, v);
  if (!strcmp(name, "string")) return v.t == JV_UNDEF ? jv_str(c, "", 0) : jv_to_str(c, v);
  if (!strcmp(name, "list")) {
    jlist *l = jiterate(c, v);
    jval r = jv_list(c, JL_LIST);
    for (size_t i = 0; i < l->n; i++) jl_push(c, r.l, l->v[i]);
    return r;
  }
  if (!strcmp(name, "items")) {
    if (v.t == JV_UNDEF) return jv_list(c, JL_GEN);
    if (v.t != JV_DICT) jfail(c, "Can only get item pairs from a mapping.");
    jval r = jview(c, v.d, 2);
    r.l->kind = JL_GEN;
    return r;
  }
  if (!strcmp(name, "first") || !strcmp(name, "last")) {
    if (v.t == JV_LIST && v.l->kind == JL_GEN) {
      if (name[0] == 'l') jfail(c, "'generator' object is not reversible");
      if (v.l->pos >= v.l->n) return jv_undef("the first item of an empty sequence");
      return v.l->v[v.l->pos++];
    }
    jlist *l = jiterate(c, v);
    if (l->n == 0) return jv_undef(name[0] == 'f' ? "the first item of an empty sequence" : "the last item of an empty sequence");
    return name[0] == 'f' ? l->v[0] : l->v[l->n - 1];
  }
  if (!strcmp(name, "reverse")) {
    if (v.t == JV_STR) {
      jbuf b = {0};
      jb_put(c, &b, "", 0);
      for (size_t i = v.s->len; i > 0;) {
        size_t st = i - 1;
        while (st > 0 && ((unsigned char)v.s->s[st] & 0xc0) == 0x80) st--;
        jb_put(c, &b, v.s->s + st, i - st);
        i = st;
      }
      return jv_str(c, b.p, b.len);
    }
    if (v.t == JV_LIST && v.l->kind == JL_GEN) jfail(c, "reversing a generator is not supported");
    jlist *l = jiterate(c, v);
    jval r = jv_list(c, JL_GEN);  // Python's reversed(): an iterator
    for (size_t i = l->n; i-- > 0;) jl_push(c, r.l, l->v[i]);
    return r;
  }
  if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "select") ||
      !strcmp(name, "reject") || !strcmp(name, "map"))
    return select_like(c, s, name, v, n, args, kw);
  if (!strcmp(name, "join")) {
    const jval *d = jarg(n, args, kw, 0, "d"), *attribute = jarg(n, args, kw, 1, "attribute");
    jlist *l = jiterate(c, v);
    jbuf b = {0};
    jb_put(c, &b, "", 0);
    for (size_t i = 0; i < l->n; i++) {
      if (i && d) jstr_of(c, &b, *d);
      jval x = attribute ? attr_path(c, l->v[i], jneed_str(c, *attribute, "join")) : l->v[i];
      jstr_of(c, &b, x);
    }
    return jv_str(c, b.p, b.len);
  }
  if (!strcmp(name, "unique")) {
    static const char *const names[] = {"case_sensitive", "attribute", NULL};
    jcheck_args(c, "unique", n, kw, 2, names);
    const jval *cs = jarg(n, args, kw, 0, "case_sensitive"), *attribute = jarg(n, args, kw, 1, "attribute");
    jlist *l = jiterate(c, v);
    jval r = jv_list(c, JL_GEN), seen = jv_list(c, JL_LIST);
    for (size_t i = 0; i < l->n; i++) {
      jval k = attribute ? attr_path(c, l->v[i], jneed_str(c, *attribute, "unique")) : l->v[i];
      if (!(cs && jtruthy(c, *cs)) && k.t == JV_STR) k = jmap_case(c, k.s, jcp_lower, 0);
      if ((k.t == JV_LIST && k.l->kind != JL_TUPLE) || k.t == JV_DICT || k.t == JV_NS)
        jfail(c, "unhashable type: '%s'", jtype_name(k));
      bool dup = false;
      for (size_t j = 0; j < seen.l->n && !dup; j++) dup = jequal(seen.l->v[j], k);
      if (dup) continue;
      jl_push(c, seen.l, k);
      jl_push(c, r.l, l->v[i]);
    }
    return r;
  }
  if (!strcmp(name, "sort")) {
    static const char *const names[] = {"reverse", "case_sensitive", "attribute", NULL};
    jcheck_args(c, "sort", n, kw, 3, names);
    const jval *rv = jarg(n, args, kw, 0, "reverse"), *cs = jarg(n, args, kw, 1, "case_sensitive"),
               *attribute = jarg(n, args, kw, 2, "attribute");
    if (attribute && attribute->t == JV_STR && strchr(attribute->s->s, ','))
      jfail(c, "sort by several attributes is not supported");
    return sort_list(c, jiterate(c, v), rv && jtruthy(c, *rv), cs && jtruthy(c, *cs),
                     attribute ? jneed_str(c, *attribute, "sort") : NULL);
  }
  if ((!strcmp(name, "int") || !strcmp(name, "float") || !strcmp(name, "indent")) && v.t == JV_UNDEF)
    jfail(c, "%s is undefined", v.undef ? v.undef : "a value");  // int(Undefined), Undefined + "\n" raise
  if (!strcmp(name, "int")) {
    const jval *def = jarg(n, args, kw, 0, "default");
    if (jarg(n, args, kw, 1, "base")) jfail(c, "int(base=) is not supported");
    if (v.t == JV_INT) return v;
    if (v.t == JV_BOOL) return jv_int(v.b);
    if (v.t == JV_FLOAT && isfinite(v.f) && fabs(v.f) < 9.2e18) return jv_int((int64_t)v.f);
    if (v.t == JV_STR) {
      jval t = jstrip(c, v.s, NULL, true, true);
      char *end;
      if (strchr(t.s->s, '_')) jfail(c, "int of a string with '_' digit separators is not supported");
      errno = 0;
      long long x = strtoll(t.s->s, &end, 10);
      if (t.s->len && !*end && !errno && !strchr(t.s->s, '_')) return jv_int(x);
      double f = strtod(t.s->s, &end);
      if (t.s->len && !*end && isfinite(f) && fabs(f) < 9.2e18 && !strchr(t.s->s, '_') && !strchr(t.s->s, 'x') &&
          !strchr(t.s->s, 'X'))
        return jv_int((int64_t)f);
    }
    return def ? *def : jv_int(0);
  }
  if (!strcmp(name, "float")) {
    const jval *def = jarg(n, args, kw, 0, "default");
    if (v.t == JV_FLOAT) return v;
    if (v.t == JV_INT || v.t == JV_BOOL) return jv_float(v.t == JV_INT ? (double)v.i : v.b);
    if (v.t == JV_STR) {
      jval t = jstrip(c, v.s, NULL, true, true);
      char *end;
      double f = strtod(t.s->s, &end);
      if (t.s->len && !*end && !strchr(t.s->s, 'x') && !strchr(t.s->s, 'X') && !strchr(t.s->s, '_')) return jv_float(f);
    }
    return def ? *def : jv_float(0);
  }
  if (!strcmp(name, "abs")) {
    if (v.t == JV_INT) {
      if (v.i == INT64_MIN) jfail(c, "integer overflow");
      return jv_int(v.i < 0 ? -v.i : v.i);
    }
    if (v.t == JV_BOOL) return jv_int(v.b);
    if (v.t == JV_FLOAT) return jv_float(fabs(v.f));
    jfail(c, "bad operand type for abs(): '%s'", jtype_name(v));
  }
  if (!strcmp(name, "round")) {
    const jval *pr = jarg(n, args, kw, 0, "precision"), *me = jarg(n, args, kw, 1, "method");
    int64_t p = pr ? (pr->t == JV_INT ? pr->i : 0) : 0;
    const char *method = me ? jneed_str(c, *me, "round")->s : "common";
    if (v.t == JV_BOOL) v = jv_int(v.b);  // round(True) is the int 1
    if (v.t == JV_INT && !strcmp(method, "common") && p >= 0) return v;
    if (v.t == JV_INT && p < 0) jfail(c, "round of an int to a negative precision is not supported");
    if (v.t != JV_FLOAT && v.t != JV_INT) jfail(c, "round expects a number");
    double x = v.t == JV_FLOAT ? v.f : (double)v.i, m = pow(10, (double)p);
    if (!strcmp(method, "common")) {
      if (p == 0) return jv_float(nearbyint(x));
      char tmp[512];
      if (p < 0 || p > 300) jfail(c, "round: precision out of range");
      snprintf(tmp, sizeof tmp, "%.*f", (int)p, x);
      return jv_float(strtod(tmp, NULL));
    }
    if (!strcmp(method, "floor")) return jv_float(floor(x * m) / m);
    if (!strcmp(method, "ceil")) return jv_float(ceil(x * m) / m);
    jfail(c, "method must be common, ceil or floor");
  }
  if (!strcmp(name, "trim")) {
    jval sv = jv_to_str(c, v.t == JV_UNDEF ? jv_str(c, "", 0) : v);
    const jval *chars = jarg(n, args, kw, 0, "chars");
    return jstrip(c, sv.s, jis_none(chars) ? NULL : jneed_str(c, *chars, "trim"), true, true);
  }
  if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
    jval sv = jv_to_str(c, v.t == JV_UNDEF ? jv_str(c, "", 0) : v);
    if (name[0] == 'u') return jmap_case(c, sv.s, jcp_upper, 0);
    if (name[0] == 'l') return jmap_case(c, sv.s, jcp_lower, 0);
    return jmap_case(c, sv.s, NULL, name[0] == 't' ? 3 : 1);
  }
  if (!strcmp(name, "replace")) {
    jval sv = jv_to_str(c, v.t == JV_UNDEF ? jv_str(c, "", 0) : v);
    if (n < 2) jfail(c, "replace expects 2 arguments");
    const jval *cnt = jarg(n, args, kw, 2, "count");
    if (!jis_none(cnt) && cnt->t != JV_INT) jfail(c, "replace's count must be an integer");
    return jreplace(c, sv.s, jv_to_str(c, args[0]).s, jv_to_str(c, args[1]).s, jis_none(cnt) ? -1 : cnt->i);
  }
  if (!strcmp(name, "indent")) {
    static const char *const names[] = {"width", "first", "blank", NULL};
    jcheck_args(c, "indent", n, kw, 3, names);
    const jval *w = jarg(n, args, kw, 0, "width"), *first = jarg(n, args, kw, 1, "first"),
               *blank = jarg(n, args, kw, 2, "blank");
    jbuf ind = {0};
    jb_put(c, &ind, "", 0);
    if (w && w->t == JV_STR) jb_put(c, &ind, w->s->s, w->s->len);
    else {
      int64_t k = w ? (w->t == JV_INT ? w->i : -1) : 4;
      if (k < 0 || k > 1024) jfail(c, "indent: width must be an int in [0, 1024] or a string");
      for (int64_t i = 0; i < k; i++) jb_puts(c, &ind, " ");
    }
    if (v.t != JV_STR) jfail(c, "indent of a %s fails in jinja2 (it appends \"\\n\" to it)", jtype_name(v));
    jval sv = v;
    jbuf src = {0};
    jb_put(c, &src, sv.s->s, sv.s->len);
    jb_puts(c, &src, "\n");  // jinja's quirk so that splitlines keeps a trailing empty line
    jval lines = jsplitlines(c, jv_str(c, src.p, src.len).s, false);
    jbuf b = {0};
    jb_put(c, &b, "", 0);
    if (first && jtruthy(c, *first)) jb_put(c, &b, ind.p, ind.len);
    for (size_t i = 0; i < lines.l->n; i++) {
      jstr *ln = lines.l->v[i].s;
      if (i) {
        jb_puts(c, &b, "\n");
        if (ln->len || (blank && jtruthy(c, *blank))) jb_put(c, &b, ind.p, ind.len);
      }
      jb_put(c, &b, ln->s, ln->len);
    }
    return jv_str(c, b.p, b.len);
  }
  if (!strcmp(name, "sum")) {
    const jval *attribute = jarg(n, args, kw, 0, "attribute"), *start = jarg(n, args, kw, 1, "start");
    jval acc = start ? *start : jv_int(0);
    jlist *l = jiterate(c, v);
    for (size_t i = 0; i < l->n; i++) {
      jval x = attribute ? attr_path(c, l->v[i], jneed_str(c, *attribute, "sum")) : l->v[i];
      if (!((acc.t == JV_INT || acc.t == JV_FLOAT || acc.t == JV_BOOL) && (x.t == JV_INT || x.t == JV_FLOAT || x.t == JV_BOOL)))
        jfail(c, "sum over non-numbers is not supported");
      acc = (acc.t == JV_FLOAT || x.t == JV_FLOAT)
                ? jv_float((acc.t == JV_FLOAT ? acc.f : (double)(acc.t == JV_INT ? acc.i : acc.b)) +
                           (x.t == JV_FLOAT ? x.f : (double)(x.t == JV_INT ? x.i : x.b)))
                : jv_int((acc.t == JV_INT ? acc.i : acc.b) + (x.t == JV_INT ? x.i : x.b));
    }
    return acc;
  }
  if (!strcmp(name, "min") || !strcmp(name, "max")) {
    const jval *cs = jarg(n, args, kw, 0, "case_sensitive"), *attribute = jarg(n, args, kw, 1, "attribute");
    jlist *l = jiterate(c, v);
    if (l->n == 0) return jv_undef("min/max of an empty sequence");
    jval r = sort_list(c, l, false, cs && jtruthy(c, *cs), attribute ? jneed_str(c, *attribute, name) : NULL);
    return name[1] == 'i' ? r.l->v[0] : r.l->v[r.l->n - 1];
  }
  if (!strcmp(name, "wordcount")) {
    jval sv = jv_to_str(c, v);
    int64_t k = 0;
    bool in = false;
    for (size_t i = 0; i < sv.s->len;) {
      uint32_t cp;
      int w = ju8_decode(sv.s->s + i, sv.s->len - i, &cp);
      if (!w) w = 1, cp = 'x';
      bool word = cp == '_' || (cp < 0x80 ? ((cp | 32) >= 'a' && (cp | 32) <= 'z') || (cp >= '0' && cp <= '9')
                                          : jis_alpha(cp) || utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_ND);
      if (word && !in) k++;
      in = word;
      i += (size_t)w;
    }
    return jv_int(k);
  }
  if (!strcmp(name, "dictsort")) {
    static const char *const names[] = {"case_sensitive", "by", "reverse", NULL};
    jcheck_args(c, "dictsort", n, kw, 3, names);
    const jval *cs = jarg(n, args, kw, 0, "case_sensitive"), *by = jarg(n, args, kw, 1, "by"),
               *rv = jarg(n, args, kw, 2, "reverse");
    if (v.t != JV_DICT) jfail(c, "dictsort expects a mapping, got %s", jtype_name(v));
    bool by_value = false;
    if (by) {
      jstr *bs = jneed_str(c, *by, "dictsort");
      if (!strcmp(bs->s, "value")) by_value = true;
      else if (strcmp(bs->s, "key")) jfail(c, "You can only sort by either \"key\" or \"value\"");
    }
    jval items = jview(c, v.d, 2);
    jstr *attr = jv_cstr(c, by_value ? "1" : "0").s;
    return sort_list(c, items.l, rv && jtruthy(c, *rv), cs && jtruthy(c, *cs), attr);
  }
  if (!strcmp(name, "format")) {
    if (kw)
      for (int i = 0; i < n; i++)
        if (kw[i]) jfail(c, "the format filter with keyword arguments is not supported");
    return jpercent_format(c, jv_to_str(c, v).s, n, args, false);
  }
  if (!strcmp(name, "attr")) {
    if (n < 1) jfail(c, "attr expects a name");
    jstr *a = jneed_str(c, args[0], "attr");
    if (v.t == JV_DICT) return jmethod_exists(v, a->s) ? jgetattr(c, v, a->s) : jv_undef("an attribute");
    return jgetattr(c, v, a->s);
  }
  jfail(c, "the filter '%s' is not supported by tpr's Jinja", name);
}

// --- globals ------------------------------------------------------------------------------------------------
jval jglobal_call(jctx *c, int fn, int n, const jval *args, const char **kw) {
  switch (fn) {
    case JF_RANGE: {
      jcheck_args(c, "range", n, kw, 3, NULL);
      int64_t a = 0, b, st = 1;
      for (int i = 0; i < n; i++)
        if (args[i].t != JV_INT && args[i].t != JV_BOOL) jfail(c, "range() takes integers");
      if (n == 1) b = args[0].i;
      else if (n >= 2) {
        a = args[0].i;
        b = args[1].i;
        if (n == 3) st = args[2].i;
      } else
        jfail(c, "range expected at least 1 argument");
      if (st == 0) jfail(c, "range() arg 3 must not be zero");
      jval r = jv_list(c, JL_VIEW);
      int64_t count = 0;
      for (int64_t i = a; st > 0 ? i < b : i > b; i += st) {
        if (++count > 100000) jfail(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jl_push(c, r.l, jv_int(i));
      }
      return r;
    }
    case JF_DICT:
    case JF_NAMESPACE: {
      jval r = jv_dict(c);
      for (int i = 0; i < n; i++) {
        if (kw && kw[i]) {
          if (fn == JF_NAMESPACE && kw[i][0] == '_')
            jfail(c, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.", kw[i]);
          jd_set(c, r.d, jv_cstr(c, kw[i]), args[i]);
        } else if (args[i].t == JV_DICT) {
          for (size_t k = 0; k < args[i].d->n; k++) jd_set(c, r.d, args[i].d->k[k], args[i].d->v[k]);
        } else {
          jfail(c, "%s() takes a mapping or keyword arguments", jglobal_names[fn]);
        }
      }
      if (fn == JF_NAMESPACE) r.t = JV_NS;
      return r;
    }
    case JF_RAISE: {
      if (n != 1) jfail(c, "raise_exception takes one argument");
      jval m = jv_to_str(c, args[0]);
      jraise(c, m.s->s);
    }
    case JF_STRFTIME: {
      if (n != 1) jfail(c, "strftime_now takes one argument");
      jstr *f = jneed_str(c, args[0], "strftime_now");
      // SOURCE_DATE_EPOCH (the reproducible-builds convention) pins the clock,
      // in UTC, so that tests and fixtures render the same every day.
      const char *epoch = getenv("SOURCE_DATE_EPOCH");
      time_t now = epoch && *epoch ? (time_t)strtoll(epoch, NULL, 10) : time(NULL);
      struct tm tm;
      if (epoch && *epoch) gmtime_r(&now, &tm);
      else localtime_r(&now, &tm);
      char buf[512];
      size_t k = strftime(buf, sizeof buf, f->s, &tm);
      if (k == 0 && f->len) jfail(c, "strftime_now: the format gives nothing or too much");
      return jv_str(c, buf, k);
    }
  }
  jfail(c, "unknown global");
}
