// The methods of Python's str, list and dict that chat templates call (as
// jinja2's sandbox allows them), and the string operations the filters
// share (jinja_impl.h, builtins.c).
#define _GNU_SOURCE  // memmem
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "jinja/jinja_impl.h"

// --- string helpers ---------------------------------------------------------------------------
uint32_t jcp_upper(uint32_t cp) { return (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp); }
uint32_t jcp_lower(uint32_t cp) { return (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); }
bool jis_alpha(uint32_t cp) {
  utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}

// Maps code points; mode 0: all with f, 1: capitalize (first jcp_upper, rest low),
// 2: Python's str.title, 3: jinja's title filter (words start after -, space, ( { [ <).
jval jmap_case(jctx *c, jstr *s, cpmap f, int mode) {
  jbuf b = {0};
  jb_put(c, &b, "", 0);
  bool start = true, prev_alpha = false;
  for (size_t i = 0; i < s->len;) {
    uint32_t cp;
    int k = ju8_decode(s->s + i, s->len - i, &cp);
    if (!k) {
      cp = (unsigned char)s->s[i];
      k = 1;
    }
    uint32_t o = cp;
    if (mode == 0) o = f(cp);
    else if (mode == 1) o = i == 0 ? jcp_upper(cp) : jcp_lower(cp);
    else if (mode == 2) {
      o = prev_alpha ? jcp_lower(cp) : jcp_upper(cp);
      prev_alpha = jis_alpha(cp);
    } else {
      bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_isspace(cp);
      o = sep ? cp : start ? jcp_upper(cp) : jcp_lower(cp);
      start = sep;
    }
    char e[4];
    jb_put(c, &b, e, (size_t)ju8_encode(o, e));
    i += (size_t)k;
  }
  return jv_str(c, b.p, b.len);
}

static bool in_chars(uint32_t cp, const jstr *chars) {
  if (!chars) return ju_isspace(cp);
  for (size_t i = 0; i < chars->len;) {
    uint32_t x;
    int k = ju8_decode(chars->s + i, chars->len - i, &x);
    if (!k) return false;
    if (x == cp) return true;
    i += (size_t)k;
  }
  return false;
}

jval jstrip(jctx *c, jstr *s, const jstr *chars, bool left, bool right) {
  size_t a = 0, b = s->len;
  while (left && a < b) {
    uint32_t cp;
    int k = ju8_decode(s->s + a, b - a, &cp);
    if (!k || !in_chars(cp, chars)) break;
    a += (size_t)k;
  }
  while (right && b > a) {
    size_t st = b - 1;
    while (st > a && ((unsigned char)s->s[st] & 0xc0) == 0x80) st--;
    uint32_t cp;
    if (!ju8_decode(s->s + st, b - st, &cp) || !in_chars(cp, chars)) break;
    b = st;
  }
  return jv_str(c, s->s + a, b - a);
}

jval jreplace(jctx *c, jstr *s, jstr *old, jstr *new, int64_t count) {
  jbuf b = {0};
  jb_put(c, &b, "", 0);
  if (old->len == 0) {  // Python inserts between every character
    int64_t done = 0;
    for (size_t i = 0; i <= s->len;) {
      if (count < 0 || done < count) {
        jb_put(c, &b, new->s, new->len);
        done++;
      }
      if (i == s->len) break;
      size_t k = 1;
      while (i + k < s->len && ((unsigned char)s->s[i + k] & 0xc0) == 0x80) k++;
      jb_put(c, &b, s->s + i, k);
      i += k;
    }
    return jv_str(c, b.p, b.len);
  }
  size_t i = 0;
  int64_t done = 0;
  while (i < s->len) {
    const char *hit = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
    if (!hit) break;
    jb_put(c, &b, s->s + i, (size_t)(hit - (s->s + i)));
    jb_put(c, &b, new->s, new->len);
    i = (size_t)(hit - s->s) + old->len;
    done++;
  }
  jb_put(c, &b, s->s + i, s->len - i);
  return jv_str(c, b.p, b.len);
}

// str.split / rsplit (sep NULL: runs of whitespace).
static jval split(jctx *c, jstr *s, const jstr *sep, int64_t maxsplit, bool from_right) {
  jval r = jv_list(c, JL_LIST);
  if (sep && sep->len == 0) jfail(c, "empty separator");
  if (!sep) {
    // whitespace runs; empty pieces dropped
    size_t n = s->len;
    size_t *st = jalloc(c, (n + 1) * sizeof *st), *en = jalloc(c, (n + 1) * sizeof *en);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
      uint32_t cp;
      int w = ju8_decode(s->s + i, n - i, &cp);
      if (!w) w = 1, cp = 'x';
      if (ju_isspace(cp)) {
        i += (size_t)w;
        continue;
      }
      st[k] = i;
      while (i < n) {
        w = ju8_decode(s->s + i, n - i, &cp);
        if (!w) w = 1, cp = 'x';
        if (ju_isspace(cp)) break;
        i += (size_t)w;
      }
      en[k++] = i;
    }
    if (maxsplit < 0 || (size_t)maxsplit >= k) {
      for (size_t i = 0; i < k; i++) jl_push(c, r.l, jv_str(c, s->s + st[i], en[i] - st[i]));
      return r;
    }
    // The rest after maxsplit pieces keeps its whitespace on the far side (Python).
    if (!from_right) {
      for (int64_t i = 0; i < maxsplit; i++) jl_push(c, r.l, jv_str(c, s->s + st[i], en[i] - st[i]));
      jl_push(c, r.l, jv_str(c, s->s + st[maxsplit], n - st[maxsplit]));
      return r;
    }
    jl_push(c, r.l, jv_str(c, s->s, en[k - (size_t)maxsplit - 1]));
    for (size_t i = k - (size_t)maxsplit; i < k; i++) jl_push(c, r.l, jv_str(c, s->s + st[i], en[i] - st[i]));
    return r;
  }
  if (!from_right) {
    size_t i = 0;
    int64_t done = 0;
    while (maxsplit < 0 || done < maxsplit) {
      const char *hit = memmem(s->s + i, s->len - i, sep->s, sep->len);
      if (!hit) break;
      jl_push(c, r.l, jv_str(c, s->s + i, (size_t)(hit - (s->s + i))));
      i = (size_t)(hit - s->s) + sep->len;
      done++;
    }
    jl_push(c, r.l, jv_str(c, s->s + i, s->len - i));
    return r;
  }
  // rsplit with a separator: pieces found from the right, then reversed
  jval rev = jv_list(c, JL_LIST);
  size_t end = s->len;
  int64_t done = 0;
  while ((maxsplit < 0 || done < maxsplit) && end >= sep->len) {
    size_t found = (size_t)-1;
    for (size_t p = end - sep->len + 1; p-- > 0;)
      if (memcmp(s->s + p, sep->s, sep->len) == 0) {
        found = p;
        break;
      }
    if (found == (size_t)-1) break;
    jl_push(c, rev.l, jv_str(c, s->s + found + sep->len, end - found - sep->len));
    end = found;
    done++;
  }
  jl_push(c, rev.l, jv_str(c, s->s, end));
  for (size_t i = rev.l->n; i-- > 0;) jl_push(c, r.l, rev.l->v[i]);
  return r;
}

static bool line_break(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 ||
         cp == 0x2028 || cp == 0x2029;
}

jval jsplitlines(jctx *c, jstr *s, bool keepends) {
  jval r = jv_list(c, JL_LIST);
  size_t i = 0, st = 0;
  while (i < s->len) {
    uint32_t cp;
    int k = ju8_decode(s->s + i, s->len - i, &cp);
    if (!k) k = 1, cp = 'x';
    if (line_break(cp)) {
      size_t e = i + (size_t)k;
      if (cp == '\r' && e < s->len && s->s[e] == '\n') e++;
      jl_push(c, r.l, jv_str(c, s->s + st, (keepends ? e : i) - st));
      st = i = e;
      continue;
    }
    i += (size_t)k;
  }
  if (st < s->len) jl_push(c, r.l, jv_str(c, s->s + st, s->len - st));
  return r;
}

static bool starts_ends(jctx *c, jstr *s, jval what, bool ends) {
  if (what.t == JV_LIST && what.l->kind == JL_TUPLE) {
    for (size_t i = 0; i < what.l->n; i++)
      if (starts_ends(c, s, what.l->v[i], ends)) return true;
    return false;
  }
  jstr *p = jneed_str(c, what, ends ? "endswith" : "startswith");
  if (p->len > s->len) return false;
  return memcmp(ends ? s->s + s->len - p->len : s->s, p->s, p->len) == 0;
}

static int64_t cp_index(jstr *s, size_t byte) { return (int64_t)ju8_count(s->s, byte); }


// Python's printf-style `fmt % args` for %s %r %d %i and %% only (no
// widths, precisions or mapping keys: those are refused).
jval jpercent_format(jctx *c, jstr *fmt, int n, const jval *args, bool mapping) {
  jbuf b = {0};
  jb_put(c, &b, "", 0);
  int k = 0;
  for (size_t i = 0; i < fmt->len; i++) {
    if (fmt->s[i] != '%') {
      jb_put(c, &b, fmt->s + i, 1);
      continue;
    }
    if (i + 1 >= fmt->len) jfail(c, "incomplete format");
    char conv = fmt->s[++i];
    if (conv == '%') {
      jb_puts(c, &b, "%");
      continue;
    }
    if (conv != 's' && conv != 'r' && conv != 'd' && conv != 'i')
      jfail(c, "'%%' formatting with '%%%c' is not supported (only %%s %%r %%d %%i %%%%)", conv);
    if (k >= n) jfail(c, "not enough arguments for format string");
    jval a = args[k++];
    if (conv == 's') jstr_of(c, &b, a);
    else if (conv == 'r') jrepr_of(c, &b, a);
    else {
      char tmp[32];
      if (a.t == JV_INT || a.t == JV_BOOL) snprintf(tmp, sizeof tmp, "%lld", (long long)(a.t == JV_INT ? a.i : a.b));
      else if (a.t == JV_FLOAT && isfinite(a.f) && fabs(a.f) < 9.2e18) snprintf(tmp, sizeof tmp, "%lld", (long long)a.f);
      else jfail(c, "%%%c format: a real number is required, not %s", conv, jtype_name(a));
      jb_puts(c, &b, tmp);
    }
  }
  // Python skips this check when the one argument is a mapping-like object
  // (a list, a dict, Undefined: they have __getitem__).
  if (k < n && !mapping) jfail(c, "not all arguments converted during string formatting");
  return jv_str(c, b.p, b.len);
}

// str.format with {} / {0} / {name} fields and {{ }} escapes; format specs,
// conversions and attribute or index lookups in fields are refused.
static jval str_format(jctx *c, jstr *fmt, int n, const jval *args, const char **kw) {
  jbuf b = {0};
  jb_put(c, &b, "", 0);
  int auto_idx = 0;
  for (size_t i = 0; i < fmt->len; i++) {
    char ch = fmt->s[i];
    if (ch == '}' ) {
      if (i + 1 < fmt->len && fmt->s[i + 1] == '}') {
        jb_puts(c, &b, "}");
        i++;
        continue;
      }
      jfail(c, "Single '}' encountered in format string");
    }
    if (ch != '{') {
      jb_put(c, &b, &ch, 1);
      continue;
    }
    if (i + 1 < fmt->len && fmt->s[i + 1] == '{') {
      jb_puts(c, &b, "{");
      i++;
      continue;
    }
    size_t e = i + 1;
    while (e < fmt->len && fmt->s[e] != '}') e++;
    if (e >= fmt->len) jfail(c, "Single '{' encountered in format string");
    const char *f = fmt->s + i + 1;
    size_t fl = e - i - 1;
    for (size_t k = 0; k < fl; k++)
      if (f[k] == ':' || f[k] == '!' || f[k] == '.' || f[k] == '[' || f[k] == '{')
        jfail(c, "str.format with format specs, conversions or lookups is not supported");
    const jval *v = NULL;
    if (fl == 0) {
      v = jarg(n, args, kw, auto_idx++, NULL);
    } else if (f[0] >= '0' && f[0] <= '9') {
      v = jarg(n, args, kw, atoi(f), NULL);
    } else {
      char *name = jstrdup(c, f, fl);
      for (int k = 0; k < n && !v; k++)
        if (kw && kw[k] && !strcmp(kw[k], name)) v = &args[k];
    }
    if (!v) jfail(c, "str.format: no argument for field {%.*s}", (int)fl, f);
    jstr_of(c, &b, *v);
    i = e;
  }
  return jv_str(c, b.p, b.len);
}

// --- methods -------------------------------------------------------------------------------------
static const char *const str_methods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                                          "splitlines", "replace", "upper", "lower", "title", "capitalize", "find",
                                          "rfind", "count", "join", "removeprefix", "removesuffix", "index", "rindex",
                                          "format", /* known to Python, refused when called: */ "format_map",
                                          "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper",
                                          "isnumeric", "isdecimal", "istitle", "zfill", "ljust", "rjust", "center",
                                          "casefold", "swapcase", "partition", "rpartition", "expandtabs",
                                          "encode", "translate", "maketrans", "isidentifier", "isprintable",
                                          "isascii", NULL};
static const char *const list_methods[] = {"index", "count", "append", "extend", "insert", "pop", "remove", "reverse",
                                           "sort", "clear", "copy", NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", "copy", "update", "pop", "popitem",
                                           "setdefault", "clear", "fromkeys", NULL};

bool jin_list(const char *const *l, const char *n) {
  for (int i = 0; l[i]; i++)
    if (!strcmp(l[i], n)) return true;
  return false;
}

bool jmethod_exists(jval self, const char *name) {
  if (self.t == JV_STR) return jin_list(str_methods, name);
  if (self.t == JV_LIST) return self.l->kind <= JL_TUPLE && jin_list(list_methods, name);
  if (self.t == JV_DICT) return jin_list(dict_methods, name);
  return false;
}

jval jview(jctx *c, jdict *d, int what) {  // 0 keys, 1 values, 2 items
  jval r = jv_list(c, JL_VIEW);
  for (size_t i = 0; i < d->n; i++) {
    if (what == 2) {
      jval t = jv_list(c, JL_TUPLE);
      jl_push(c, t.l, d->k[i]);
      jl_push(c, t.l, d->v[i]);
      jl_push(c, r.l, t);
    } else {
      jl_push(c, r.l, what ? d->v[i] : d->k[i]);
    }
  }
  return r;
}

jval jmethod_call(jctx *c, jval self, const char *name, int n, const jval *args, const char **kw) {
  if (self.t == JV_DICT) {
    if (!strcmp(name, "get")) {
      jcheck_args(c, "dict.get", n, kw, 2, NULL);
      if (n < 1) jfail(c, "dict.get expected at least 1 argument");
      jval *v = jd_get(self.d, args[0]);
      return v ? *v : n > 1 ? args[1] : jv_none();
    }
    if (strcmp(name, "items") && strcmp(name, "keys") && strcmp(name, "values") && strcmp(name, "copy"))
      jfail(c, "access to attribute '%s' of 'dict' object is unsafe", name);
    jcheck_args(c, name, n, kw, 0, NULL);
    if (!strcmp(name, "items")) return jview(c, self.d, 2);
    if (!strcmp(name, "keys")) return jview(c, self.d, 0);
    if (!strcmp(name, "values")) return jview(c, self.d, 1);
    if (!strcmp(name, "copy")) {
      jval r = jv_dict(c);
      for (size_t i = 0; i < self.d->n; i++) jd_set(c, r.d, self.d->k[i], self.d->v[i]);
      return r;
    }
    jfail(c, "access to attribute '%s' of 'dict' object is unsafe", name);
  }
  if (self.t == JV_LIST) {
    if (!strcmp(name, "index") || !strcmp(name, "count")) {
      jcheck_args(c, name, n, kw, 1, NULL);
      if (n < 1) jfail(c, "list.%s expects an argument", name);
      int64_t k = 0;
      for (size_t i = 0; i < self.l->n; i++)
        if (jequal(self.l->v[i], args[0])) {
          if (name[0] == 'i') return jv_int((int64_t)i);
          k++;
        }
      if (name[0] == 'i') jfail(c, "list.index(x): x not in list");
      return jv_int(k);
    }
    if (!strcmp(name, "copy")) {
      jval r = jv_list(c, JL_LIST);
      for (size_t i = 0; i < self.l->n; i++) jl_push(c, r.l, self.l->v[i]);
      return r;
    }
    jfail(c, "access to attribute '%s' of '%s' object is unsafe", name, jtype_name(self));
  }
  jstr *s = self.s;
  const jval *a0 = jarg(n, args, kw, 0, NULL), *a1 = jarg(n, args, kw, 1, NULL);
  if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
    jcheck_args(c, name, n, kw, 1, NULL);
    if (!a0) jfail(c, "%s expects an argument", name);
    return jv_bool(starts_ends(c, s, *a0, name[0] == 'e'));
  }
  if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
    jcheck_args(c, name, n, kw, 1, NULL);
    const jstr *chars = jis_none(a0) ? NULL : jneed_str(c, *a0, name);
    return jstrip(c, s, chars, name[0] != 'r', name[0] != 'l');
  }
  if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
    static const char *const names[] = {"sep", "maxsplit", NULL};
    jcheck_args(c, name, n, kw, 2, names);
    const jval *sep = jarg(n, args, kw, 0, "sep"), *mx = jarg(n, args, kw, 1, "maxsplit");
    if (mx && mx->t != JV_INT) jfail(c, "maxsplit must be an integer");
    return split(c, s, jis_none(sep) ? NULL : jneed_str(c, *sep, name), mx ? mx->i : -1, name[0] == 'r');
  }
  if (!strcmp(name, "splitlines")) {
    static const char *const names[] = {"keepends", NULL};
    jcheck_args(c, name, n, kw, 1, names);
    const jval *ke = jarg(n, args, kw, 0, "keepends");
    return jsplitlines(c, s, ke && jtruthy(c, *ke));
  }
  if (!strcmp(name, "replace")) {
    jcheck_args(c, name, n, kw, 3, NULL);
    if (!a0 || !a1) jfail(c, "replace expects 2 arguments");
    const jval *cnt = jarg(n, args, kw, 2, NULL);
    if (cnt && cnt->t != JV_INT) jfail(c, "replace's count must be an integer");
    return jreplace(c, s, jneed_str(c, *a0, "replace"), jneed_str(c, *a1, "replace"), cnt ? cnt->i : -1);
  }
  if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
    jcheck_args(c, name, n, kw, 0, NULL);
    if (name[0] == 'u') return jmap_case(c, s, jcp_upper, 0);
    if (name[0] == 'l') return jmap_case(c, s, jcp_lower, 0);
    return jmap_case(c, s, NULL, name[0] == 't' ? 2 : 1);
  }
  if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "rindex") ||
      !strcmp(name, "count")) {
    jcheck_args(c, name, n, kw, 1, NULL);
    if (!a0) jfail(c, "%s expects an argument", name);
    jstr *sub = jneed_str(c, *a0, name);
    if (!strcmp(name, "count")) {
      if (sub->len == 0) return jv_int((int64_t)ju8_count(s->s, s->len) + 1);
      int64_t k = 0;
      for (size_t i = 0; i + sub->len <= s->len;) {
        const char *h = memmem(s->s + i, s->len - i, sub->s, sub->len);
        if (!h) break;
        k++;
        i = (size_t)(h - s->s) + sub->len;
      }
      return jv_int(k);
    }
    int64_t found = -1;
    if (name[0] != 'r') {
      const char *h = sub->len ? memmem(s->s, s->len, sub->s, sub->len) : s->s;
      if (h) found = cp_index(s, (size_t)(h - s->s));
    } else if (sub->len <= s->len) {
      for (size_t p = s->len - sub->len + 1; p-- > 0;)
        if (memcmp(s->s + p, sub->s, sub->len) == 0) {
          found = cp_index(s, p);
          break;
        }
    }
    if (found < 0 && strstr(name, "index")) jfail(c, "substring not found");
    return jv_int(found);
  }
  if (!strcmp(name, "join")) {
    jcheck_args(c, name, n, kw, 1, NULL);
    if (!a0) jfail(c, "join expects an argument");
    jlist *l = jiterate(c, *a0);
    jbuf b = {0};
    jb_put(c, &b, "", 0);
    for (size_t i = 0; i < l->n; i++) {
      if (i) jb_put(c, &b, s->s, s->len);
      jstr *x = jneed_str(c, l->v[i], "str.join");
      jb_put(c, &b, x->s, x->len);
    }
    return jv_str(c, b.p, b.len);
  }
  if (!strcmp(name, "format")) return str_format(c, s, n, args, kw);
  if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
    jcheck_args(c, name, n, kw, 1, NULL);
    if (!a0) jfail(c, "%s expects an argument", name);
    jstr *p = jneed_str(c, *a0, name);
    if (p->len <= s->len) {
      if (name[6] == 'p' && memcmp(s->s, p->s, p->len) == 0) return jv_str(c, s->s + p->len, s->len - p->len);
      if (name[6] == 's' && memcmp(s->s + s->len - p->len, p->s, p->len) == 0) return jv_str(c, s->s, s->len - p->len);
    }
    return self;
  }
  jfail(c, "the string method '%s' is not supported by tpr's Jinja", name);
}

