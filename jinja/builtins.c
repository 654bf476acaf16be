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
static const jval *arg(int n, const jval *args, const char **kw, int pos, const char *name) {
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

static void check_args(jctx *c, const char *what, int n, const char **kw, int max_pos, const char *const *names) {
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

static jstr *need_str(jctx *c, jval v, const char *what) {
  if (v.t != JV_STR) {
    if (v.t == JV_UNDEF) jfail(c, "%s is undefined", v.undef ? v.undef : "a value");
    jfail(c, "%s expects a string, got %s", what, jtype_name(v));
  }
  return v.s;
}

static bool is_none(const jval *v) { return !v || v->t == JV_NONE; }

// --- string helpers ---------------------------------------------------------------------------
typedef uint32_t (*cpmap)(uint32_t);
static uint32_t up(uint32_t cp) { return (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp); }
static uint32_t lo(uint32_t cp) { return (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); }
static bool is_alpha(uint32_t cp) {
  utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}

// Maps code points; mode 0: all with f, 1: capitalize (first up, rest low),
// 2: Python's str.title, 3: jinja's title filter (words start after -, space, ( { [ <).
static jval map_case(jctx *c, jstr *s, cpmap f, int mode) {
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
    else if (mode == 1) o = i == 0 ? up(cp) : lo(cp);
    else if (mode == 2) {
      o = prev_alpha ? lo(cp) : up(cp);
      prev_alpha = is_alpha(cp);
    } else {
      bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_isspace(cp);
      o = sep ? cp : start ? up(cp) : lo(cp);
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

static jval strip(jctx *c, jstr *s, const jstr *chars, bool left, bool right) {
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

static jval replace(jctx *c, jstr *s, jstr *old, jstr *new, int64_t count) {
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

static jval splitlines(jctx *c, jstr *s, bool keepends) {
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
  jstr *p = need_str(c, what, ends ? "endswith" : "startswith");
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
      v = arg(n, args, kw, auto_idx++, NULL);
    } else if (f[0] >= '0' && f[0] <= '9') {
      v = arg(n, args, kw, atoi(f), NULL);
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

static bool in_list(const char *const *l, const char *n) {
  for (int i = 0; l[i]; i++)
    if (!strcmp(l[i], n)) return true;
  return false;
}

bool jmethod_exists(jval self, const char *name) {
  if (self.t == JV_STR) return in_list(str_methods, name);
  if (self.t == JV_LIST) return self.l->kind <= JL_TUPLE && in_list(list_methods, name);
  if (self.t == JV_DICT) return in_list(dict_methods, name);
  return false;
}

static jval view(jctx *c, jdict *d, int what) {  // 0 keys, 1 values, 2 items
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
      check_args(c, "dict.get", n, kw, 2, NULL);
      if (n < 1) jfail(c, "dict.get expected at least 1 argument");
      jval *v = jd_get(self.d, args[0]);
      return v ? *v : n > 1 ? args[1] : jv_none();
    }
    if (strcmp(name, "items") && strcmp(name, "keys") && strcmp(name, "values") && strcmp(name, "copy"))
      jfail(c, "access to attribute '%s' of 'dict' object is unsafe", name);
    check_args(c, name, n, kw, 0, NULL);
    if (!strcmp(name, "items")) return view(c, self.d, 2);
    if (!strcmp(name, "keys")) return view(c, self.d, 0);
    if (!strcmp(name, "values")) return view(c, self.d, 1);
    if (!strcmp(name, "copy")) {
      jval r = jv_dict(c);
      for (size_t i = 0; i < self.d->n; i++) jd_set(c, r.d, self.d->k[i], self.d->v[i]);
      return r;
    }
    jfail(c, "access to attribute '%s' of 'dict' object is unsafe", name);
  }
  if (self.t == JV_LIST) {
    if (!strcmp(name, "index") || !strcmp(name, "count")) {
      check_args(c, name, n, kw, 1, NULL);
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
  const jval *a0 = arg(n, args, kw, 0, NULL), *a1 = arg(n, args, kw, 1, NULL);
  if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
    check_args(c, name, n, kw, 1, NULL);
    if (!a0) jfail(c, "%s expects an argument", name);
    return jv_bool(starts_ends(c, s, *a0, name[0] == 'e'));
  }
  if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
    check_args(c, name, n, kw, 1, NULL);
    const jstr *chars = is_none(a0) ? NULL : need_str(c, *a0, name);
    return strip(c, s, chars, name[0] != 'r', name[0] != 'l');
  }
  if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
    static const char *const names[] = {"sep", "maxsplit", NULL};
    check_args(c, name, n, kw, 2, names);
    const jval *sep = arg(n, args, kw, 0, "sep"), *mx = arg(n, args, kw, 1, "maxsplit");
    if (mx && mx->t != JV_INT) jfail(c, "maxsplit must be an integer");
    return split(c, s, is_none(sep) ? NULL : need_str(c, *sep, name), mx ? mx->i : -1, name[0] == 'r');
  }
  if (!strcmp(name, "splitlines")) {
    static const char *const names[] = {"keepends", NULL};
    check_args(c, name, n, kw, 1, names);
    const jval *ke = arg(n, args, kw, 0, "keepends");
    return splitlines(c, s, ke && jtruthy(c, *ke));
  }
  if (!strcmp(name, "replace")) {
    check_args(c, name, n, kw, 3, NULL);
    if (!a0 || !a1) jfail(c, "replace expects 2 arguments");
    const jval *cnt = arg(n, args, kw, 2, NULL);
    if (cnt && cnt->t != JV_INT) jfail(c, "replace's count must be an integer");
    return replace(c, s, need_str(c, *a0, "replace"), need_str(c, *a1, "replace"), cnt ? cnt->i : -1);
  }
  if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
    check_args(c, name, n, kw, 0, NULL);
    if (name[0] == 'u') return map_case(c, s, up, 0);
    if (name[0] == 'l') return map_case(c, s, lo, 0);
    return map_case(c, s, NULL, name[0] == 't' ? 2 : 1);
  }
  if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "rindex") ||
      !strcmp(name, "count")) {
    check_args(c, name, n, kw, 1, NULL);
    if (!a0) jfail(c, "%s expects an argument", name);
    jstr *sub = need_str(c, *a0, name);
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
    check_args(c, name, n, kw, 1, NULL);
    if (!a0) jfail(c, "join expects an argument");
    jlist *l = jiterate(c, *a0);
    jbuf b = {0};
    jb_put(c, &b, "", 0);
    for (size_t i = 0; i < l->n; i++) {
      if (i) jb_put(c, &b, s->s, s->len);
      jstr *x = need_str(c, l->v[i], "str.join");
      jb_put(c, &b, x->s, x->len);
    }
    return jv_str(c, b.p, b.len);
  }
  if (!strcmp(name, "format")) return str_format(c, s, n, args, kw);
  if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
    check_args(c, name, n, kw, 1, NULL);
    if (!a0) jfail(c, "%s expects an argument", name);
    jstr *p = need_str(c, *a0, name);
    if (p->len <= s->len) {
      if (name[6] == 'p' && memcmp(s->s, p->s, p->len) == 0) return jv_str(c, s->s + p->len, s->len - p->len);
      if (name[6] == 's' && memcmp(s->s + s->len - p->len, p->s, p->len) == 0) return jv_str(c, s->s, s->len - p->len);
    }
    return self;
  }
  jfail(c, "the string method '%s' is not supported by tpr's Jinja", name);
}

// --- tests ----------------------------------------------------------------------------------------------
static const char *const tests[] = {"defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
                                    "sequence", "iterable", "boolean", "true", "false", "even", "odd", "divisibleby",
                                    "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt",
                                    "greaterthan", ">", "ge", ">=", "in", "sameas", "callable", "lower", "upper",
                                    "filter", "test", "escaped", NULL};

bool jtest_known(const char *name) { return in_list(tests, name); }

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
    jval m = map_case(c, v.s, name[0] == 'l' ? lo : up, 0);
    bool cased = false;
    for (size_t i = 0; i < v.s->len;) {
      uint32_t cp;
      int k = ju8_decode(v.s->s + i, v.s->len - i, &cp);
      if (!k) break;
      cased |= up(cp) != lo(cp);
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

bool jfilter_known(const char *name) { return in_list(filters, name); }

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
    const jval *attribute = arg(n, args, kw, -1, "attribute");
    if (attribute) {
      const jval *def = arg(n, args, kw, -1, "default");
      for (size_t i = 0; i < l->n; i++) {
        jval x = attr_path(c, l->v[i], need_str(c, *attribute, "map"));
        jl_push(c, r.l, x.t == JV_UNDEF && def ? *def : x);
      }
      return r;
    }
    if (n < 1) jfail(c, "map expects a filter name or attribute=");
    const char *f = need_str(c, args[0], "map")->s;
    if (!jfilter_known(f)) jfail(c, "no filter named '%s'", f);
    for (size_t i = 0; i < l->n; i++) jl_push(c, r.l, jfilter(c, s, f, l->v[i], n - 1, args + 1, kw ? kw + 1 : NULL));
    return r;
  }
  int skip = byattr ? 1 : 0;
  if (byattr && n < 1) jfail(c, "%s expects an attribute", name);
  const char *test = n > skip ? need_str(c, args[skip], name)->s : NULL;
  if (test && !jtest_known(test)) jfail(c, "no test named '%s'", test);
  for (size_t i = 0; i < l->n; i++) {
    jval x = byattr ? attr_path(c, l->v[i], need_str(c, args[0], name)) : l->v[i];
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
    if (!case_sensitive && k.t == JV_STR) k = map_case(c, k.s, lo, 0);
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
    check_args(c, "tojson", n, kw, 4, names);
    const jval *ea = arg(n, args, kw, 0, "ensure_ascii"), *ind = arg(n, args, kw, 1, "indent"),
               *sep = arg(n, args, kw, 2, "separators"), *sk = arg(n, args, kw, 3, "sort_keys");
    if (ea && jtruthy(c, *ea)) jfail(c, "tojson(ensure_ascii=True) is not supported");
    const char *indent = NULL;
    if (!is_none(ind)) {
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
    if (!is_none(sep)) {
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
    const jval *def = arg(n, args, kw, 0, "default_value"), *boolean = arg(n, args, kw, 1, "boolean");
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
    jval r = view(c, v.d, 2);
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
    const jval *d = arg(n, args, kw, 0, "d"), *attribute = arg(n, args, kw, 1, "attribute");
    jlist *l = jiterate(c, v);
    jbuf b = {0};
    jb_put(c, &b, "", 0);
    for (size_t i = 0; i < l->n; i++) {
      if (i && d) jstr_of(c, &b, *d);
      jval x = attribute ? attr_path(c, l->v[i], need_str(c, *attribute, "join")) : l->v[i];
      jstr_of(c, &b, x);
    }
    return jv_str(c, b.p, b.len);
  }
  if (!strcmp(name, "unique")) {
    static const char *const names[] = {"case_sensitive", "attribute", NULL};
    check_args(c, "unique", n, kw, 2, names);
    const jval *cs = arg(n, args, kw, 0, "case_sensitive"), *attribute = arg(n, args, kw, 1, "attribute");
    jlist *l = jiterate(c, v);
    jval r = jv_list(c, JL_GEN), seen = jv_list(c, JL_LIST);
    for (size_t i = 0; i < l->n; i++) {
      jval k = attribute ? attr_path(c, l->v[i], need_str(c, *attribute, "unique")) : l->v[i];
      if (!(cs && jtruthy(c, *cs)) && k.t == JV_STR) k = map_case(c, k.s, lo, 0);
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
    check_args(c, "sort", n, kw, 3, names);
    const jval *rv = arg(n, args, kw, 0, "reverse"), *cs = arg(n, args, kw, 1, "case_sensitive"),
               *attribute = arg(n, args, kw, 2, "attribute");
    if (attribute && attribute->t == JV_STR && strchr(attribute->s->s, ','))
      jfail(c, "sort by several attributes is not supported");
    return sort_list(c, jiterate(c, v), rv && jtruthy(c, *rv), cs && jtruthy(c, *cs),
                     attribute ? need_str(c, *attribute, "sort") : NULL);
  }
  if ((!strcmp(name, "int") || !strcmp(name, "float") || !strcmp(name, "indent")) && v.t == JV_UNDEF)
    jfail(c, "%s is undefined", v.undef ? v.undef : "a value");  // int(Undefined), Undefined + "\n" raise
  if (!strcmp(name, "int")) {
    const jval *def = arg(n, args, kw, 0, "default");
    if (arg(n, args, kw, 1, "base")) jfail(c, "int(base=) is not supported");
    if (v.t == JV_INT) return v;
    if (v.t == JV_BOOL) return jv_int(v.b);
    if (v.t == JV_FLOAT && isfinite(v.f) && fabs(v.f) < 9.2e18) return jv_int((int64_t)v.f);
    if (v.t == JV_STR) {
      jval t = strip(c, v.s, NULL, true, true);
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
    const jval *def = arg(n, args, kw, 0, "default");
    if (v.t == JV_FLOAT) return v;
    if (v.t == JV_INT || v.t == JV_BOOL) return jv_float(v.t == JV_INT ? (double)v.i : v.b);
    if (v.t == JV_STR) {
      jval t = strip(c, v.s, NULL, true, true);
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
    const jval *pr = arg(n, args, kw, 0, "precision"), *me = arg(n, args, kw, 1, "method");
    int64_t p = pr ? (pr->t == JV_INT ? pr->i : 0) : 0;
    const char *method = me ? need_str(c, *me, "round")->s : "common";
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
    const jval *chars = arg(n, args, kw, 0, "chars");
    return strip(c, sv.s, is_none(chars) ? NULL : need_str(c, *chars, "trim"), true, true);
  }
  if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
    jval sv = jv_to_str(c, v.t == JV_UNDEF ? jv_str(c, "", 0) : v);
    if (name[0] == 'u') return map_case(c, sv.s, up, 0);
    if (name[0] == 'l') return map_case(c, sv.s, lo, 0);
    return map_case(c, sv.s, NULL, name[0] == 't' ? 3 : 1);
  }
  if (!strcmp(name, "replace")) {
    jval sv = jv_to_str(c, v.t == JV_UNDEF ? jv_str(c, "", 0) : v);
    if (n < 2) jfail(c, "replace expects 2 arguments");
    const jval *cnt = arg(n, args, kw, 2, "count");
    if (!is_none(cnt) && cnt->t != JV_INT) jfail(c, "replace's count must be an integer");
    return replace(c, sv.s, jv_to_str(c, args[0]).s, jv_to_str(c, args[1]).s, is_none(cnt) ? -1 : cnt->i);
  }
  if (!strcmp(name, "indent")) {
    static const char *const names[] = {"width", "first", "blank", NULL};
    check_args(c, "indent", n, kw, 3, names);
    const jval *w = arg(n, args, kw, 0, "width"), *first = arg(n, args, kw, 1, "first"),
               *blank = arg(n, args, kw, 2, "blank");
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
    jval lines = splitlines(c, jv_str(c, src.p, src.len).s, false);
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
    const jval *attribute = arg(n, args, kw, 0, "attribute"), *start = arg(n, args, kw, 1, "start");
    jval acc = start ? *start : jv_int(0);
    jlist *l = jiterate(c, v);
    for (size_t i = 0; i < l->n; i++) {
      jval x = attribute ? attr_path(c, l->v[i], need_str(c, *attribute, "sum")) : l->v[i];
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
    const jval *cs = arg(n, args, kw, 0, "case_sensitive"), *attribute = arg(n, args, kw, 1, "attribute");
    jlist *l = jiterate(c, v);
    if (l->n == 0) return jv_undef("min/max of an empty sequence");
    jval r = sort_list(c, l, false, cs && jtruthy(c, *cs), attribute ? need_str(c, *attribute, name) : NULL);
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
                                          : is_alpha(cp) || utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_ND);
      if (word && !in) k++;
      in = word;
      i += (size_t)w;
    }
    return jv_int(k);
  }
  if (!strcmp(name, "dictsort")) {
    static const char *const names[] = {"case_sensitive", "by", "reverse", NULL};
    check_args(c, "dictsort", n, kw, 3, names);
    const jval *cs = arg(n, args, kw, 0, "case_sensitive"), *by = arg(n, args, kw, 1, "by"),
               *rv = arg(n, args, kw, 2, "reverse");
    if (v.t != JV_DICT) jfail(c, "dictsort expects a mapping, got %s", jtype_name(v));
    bool by_value = false;
    if (by) {
      jstr *bs = need_str(c, *by, "dictsort");
      if (!strcmp(bs->s, "value")) by_value = true;
      else if (strcmp(bs->s, "key")) jfail(c, "You can only sort by either \"key\" or \"value\"");
    }
    jval items = view(c, v.d, 2);
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
    jstr *a = need_str(c, args[0], "attr");
    if (v.t == JV_DICT) return jmethod_exists(v, a->s) ? jgetattr(c, v, a->s) : jv_undef("an attribute");
    return jgetattr(c, v, a->s);
  }
  jfail(c, "the filter '%s' is not supported by tpr's Jinja", name);
}

// --- globals ------------------------------------------------------------------------------------------------
jval jglobal_call(jctx *c, int fn, int n, const jval *args, const char **kw) {
  switch (fn) {
    case JF_RANGE: {
      check_args(c, "range", n, kw, 3, NULL);
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
      jstr *f = need_str(c, args[0], "strftime_now");
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
