// Values of the Jinja interpreter: the arena, Python's str/repr/==/< of
// them, UTF-8 (JSON in and out: json.c).
#define _GNU_SOURCE  // memmem
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

struct jchunk {
  jchunk *next;
  size_t used, cap;
  _Alignas(16) char data[];
};

_Noreturn void jfail(jctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char msg[900];
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  c->err->raised = false;
  c->err->line = c->line;
  if (c->line > 0)
    snprintf(c->err->message, sizeof c->err->message, "line %d: %s", c->line, msg);
  else
    snprintf(c->err->message, sizeof c->err->message, "%s", msg);
  longjmp(c->jb, 1);
}

_Noreturn void jraise(jctx *c, const char *msg) {
  c->err->raised = true;
  c->err->line = c->line;
  snprintf(c->err->message, sizeof c->err->message, "%s", msg);
  longjmp(c->jb, 1);
}

void *jalloc(jctx *c, size_t n) {
  jarena *a = c->a;
  n = (n + 15) & ~(size_t)15;
  if (!a->head || a->head->used + n > a->head->cap) {
    size_t cap = n > 65536 ? n : 65536;
    if (a->used + cap > a->limit) jfail(c, "the template used more than %zu bytes of memory", a->limit);
    jchunk *ch = malloc(sizeof *ch + cap);
    if (!ch) jfail(c, "out of memory");
    ch->next = a->head;
    ch->used = 0;
    ch->cap = cap;
    a->head = ch;
    a->used += cap;
  }
  void *p = a->head->data + a->head->used;
  a->head->used += n;
  return p;
}

void jarena_free(jarena *a) {
  for (jchunk *ch = a->head, *next; ch; ch = next) {
    next = ch->next;
    free(ch);
  }
  a->head = NULL;
  a->used = 0;
}

char *jstrdup(jctx *c, const char *s, size_t n) {
  char *p = jalloc(c, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

jval jv_str(jctx *c, const char *s, size_t n) {
  jstr *x = jalloc(c, sizeof *x + n + 1);
  x->len = n;
  x->markup = false;
  if (n) memcpy(x->s, s, n);
  x->s[n] = 0;
  jval v = {.t = JV_STR};
  v.s = x;
  return v;
}

jval jv_cstr(jctx *c, const char *s) { return jv_str(c, s, strlen(s)); }

jval jv_list(jctx *c, int kind) {
  jlist *l = jalloc(c, sizeof *l);
  memset(l, 0, sizeof *l);
  l->kind = kind;
  jval v = {.t = JV_LIST};
  v.l = l;
  return v;
}

jval jv_dict(jctx *c) {
  jdict *d = jalloc(c, sizeof *d);
  memset(d, 0, sizeof *d);
  jval v = {.t = JV_DICT};
  v.d = d;
  return v;
}

void jl_push(jctx *c, jlist *l, jval v) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 4;
    jval *nv = jalloc(c, cap * sizeof *nv);
    if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
    l->v = nv;
    l->cap = cap;
  }
  l->v[l->n++] = v;
}

jval *jd_get(const jdict *d, jval k) {
  for (size_t i = 0; i < d->n; i++)
    if (jequal(d->k[i], k)) return &d->v[i];
  return NULL;
}

jval *jd_gets(const jdict *d, const char *k) {
  size_t n = strlen(k);
  for (size_t i = 0; i < d->n; i++)
    if (d->k[i].t == JV_STR && d->k[i].s->len == n && memcmp(d->k[i].s->s, k, n) == 0) return &d->v[i];
  return NULL;
}

void jd_set(jctx *c, jdict *d, jval k, jval v) {
  jval *p = jd_get(d, k);
  if (p) {
    *p = v;
    return;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 4;
    jval *nk = jalloc(c, cap * sizeof *nk), *nv = jalloc(c, cap * sizeof *nv);
    if (d->n) {
      memcpy(nk, d->k, d->n * sizeof *nk);
      memcpy(nv, d->v, d->n * sizeof *nv);
    }
    d->k = nk;
    d->v = nv;
    d->cap = cap;
  }
  d->k[d->n] = k;
  d->v[d->n++] = v;
}

const char *jtype_name(jval v) {
  switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.l->kind == JL_TUPLE ? "tuple" : v.l->kind == JL_GEN ? "generator" : v.l->kind == JL_VIEW ? "view" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_METHOD: return "method";
  }
  return "?";
}

bool jtruthy(jctx *c, jval v) {
  (void)c;
  switch (v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0;
    case JV_STR: return v.s->len != 0;
    case JV_LIST: return v.l->kind == JL_GEN || v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return true;
  }
}

static bool numeric(jval v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num(jval v) { return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : (double)v.b; }

bool jequal(jval a, jval b) {
  if (numeric(a) && numeric(b)) {
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (a.t == JV_INT ? a.i : a.b) == (b.t == JV_INT ? b.i : b.b);
    return num(a) == num(b);
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.s->len == b.s->len && memcmp(a.s->s, b.s->s, a.s->len) == 0;
    case JV_LIST:
      if ((a.l->kind == JL_TUPLE) != (b.l->kind == JL_TUPLE) || a.l->kind == JL_GEN || b.l->kind == JL_GEN)
        return a.l == b.l;
      if (a.l->n != b.l->n) return false;
      for (size_t i = 0; i < a.l->n; i++)
        if (!jequal(a.l->v[i], b.l->v[i])) return false;
      return true;
    case JV_DICT:
      if (a.d->n != b.d->n) return false;
      for (size_t i = 0; i < a.d->n; i++) {
        jval *o = jd_get(b.d, a.d->k[i]);
        if (!o || !jequal(a.d->v[i], *o)) return false;
      }
      return true;
    case JV_NS: return a.d == b.d;
    case JV_LOOP: return a.loop == b.loop;
    case JV_MACRO: return a.m == b.m;
    case JV_FUNC: return a.fn == b.fn;
    case JV_METHOD: return a.me == b.me;
    default: return false;
  }
}

int jcompare(jctx *c, jval a, jval b) {
  if (numeric(a) && numeric(b)) {
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
      int64_t x = a.t == JV_INT ? a.i : a.b, y = b.t == JV_INT ? b.i : b.b;
      return x < y ? -1 : x > y;
    }
    double x = num(a), y = num(b);
    return x < y ? -1 : x > y;
  }
  if (a.t == JV_STR && b.t == JV_STR) {  // UTF-8 byte order is code point order
    size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
    int r = memcmp(a.s->s, b.s->s, n);
    if (r) return r;
    return a.s->len < b.s->len ? -1 : a.s->len > b.s->len;
  }
  if (a.t == JV_LIST && b.t == JV_LIST && a.l->kind == b.l->kind && a.l->kind <= JL_TUPLE) {
    for (size_t i = 0; i < a.l->n && i < b.l->n; i++)
      if (!jequal(a.l->v[i], b.l->v[i])) return jcompare(c, a.l->v[i], b.l->v[i]);
    return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
  }
  jfail(c, "'<' not supported between instances of '%s' and '%s'", jtype_name(a), jtype_name(b));
}

// --- text forms -------------------------------------------------------------------
void jb_put(jctx *c, jbuf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = (b->len + n + 1) * 2;
    if (cap < 64) cap = 64;
    char *p = jalloc(c, cap);
    if (b->len) memcpy(p, b->p, b->len);
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

// Python's repr(float): the shortest digits that read back, fixed notation
// for exponents in [-4, 16), else d.ddde+XX.
void jfmt_float(double f, char *buf, size_t n) {
  if (isnan(f)) {
    snprintf(buf, n, "nan");
    return;
  }
  if (isinf(f)) {
    snprintf(buf, n, f < 0 ? "-inf" : "inf");
    return;
  }
  char tmp[40];
  int p;
  for (p = 1; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
    if (strtod(tmp, NULL) == f) break;
  }
  // tmp: [-]d[.ddd]e[+-]XX
  const char *s = tmp;
  bool neg = *s == '-';
  if (neg) s++;
  char digits[24];
  int nd = 0;
  for (; *s && *s != 'e'; s++)
    if (*s != '.') digits[nd++] = *s;
  digits[nd] = 0;
  int e = atoi(s + 1);
  while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
  char out[64];
  int o = 0;
  if (neg) out[o++] = '-';
  if (e >= -4 && e < 16) {
    if (e < 0) {
      out[o++] = '0';
      out[o++] = '.';
      for (int i = 0; i < -e - 1; i++) out[o++] = '0';
      for (int i = 0; i < nd; i++) out[o++] = digits[i];
    } else {
      for (int i = 0; i <= e; i++) out[o++] = i < nd ? digits[i] : '0';
      out[o++] = '.';
      if (nd > e + 1)
        for (int i = e + 1; i < nd; i++) out[o++] = digits[i];
      else
        out[o++] = '0';
    }
    out[o] = 0;
  } else {
    out[o++] = digits[0];
    if (nd > 1) {
      out[o++] = '.';
      for (int i = 1; i < nd; i++) out[o++] = digits[i];
    }
    out[o] = 0;
    snprintf(out + o, sizeof out - o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
  }
  snprintf(buf, n, "%s", out);
}

static void jrepr_inner(jctx *c, jbuf *b, jval v);

static void put_pystr(jctx *c, jbuf *b, const jstr *s) {
  bool sq = memchr(s->s, '\'', s->len) != NULL, dq = memchr(s->s, '"', s->len) != NULL;
  char q = sq && !dq ? '"' : '\'';
  jb_put(c, b, &q, 1);
  for (size_t i = 0; i < s->len;) {
    unsigned char ch = (unsigned char)s->s[i];
    char e[12];
    if (ch == (unsigned char)q || ch == '\\') {
      e[0] = '\\';
      e[1] = (char)ch;
      jb_put(c, b, e, 2);
    } else if (ch == '\n') {
      jb_puts(c, b, "\\n");
    } else if (ch == '\r') {
      jb_puts(c, b, "\\r");
    } else if (ch == '\t') {
      jb_puts(c, b, "\\t");
    } else if (ch < 0x20 || ch == 0x7f) {
      snprintf(e, sizeof e, "\\x%02x", ch);
      jb_puts(c, b, e);
    } else if (ch >= 0x80) {
      uint32_t cp = 0xfffd;  // an invalid byte (values are checked UTF-8; never in practice)
      int k = ju8_decode(s->s + i, s->len - i, &cp);
      if (k == 0) k = 1;
      // Python's repr escapes the non-printable: C1 controls and a few separators.
      if ((cp >= 0x80 && cp < 0xa0) || cp == 0xad || cp == 0x2028 || cp == 0x2029 || (cp >= 0x200b && cp <= 0x200f) ||
          (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x2064) || cp == 0xfeff) {
        snprintf(e, sizeof e, cp < 0x100 ? "\\x%02x" : "\\u%04x", cp);
        jb_puts(c, b, e);
      } else if (cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x202f || cp == 0x205f ||
                 cp == 0x3000) {
        // Unicode spaces other than ' ' are not printable to Python either.
        snprintf(e, sizeof e, cp < 0x100 ? "\\x%02x" : "\\u%04x", cp);
        jb_puts(c, b, e);
      } else {
        jb_put(c, b, s->s + i, (size_t)k);
      }
      i += (size_t)k;
      continue;
    } else {
      jb_put(c, b, (const char *)&s->s[i], 1);
    }
    i++;
  }
  jb_put(c, b, &q, 1);
}

void jrepr_of(jctx *c, jbuf *b, jval v) {
  // A namespace can hold itself ({% set ns.x = ns %}); Python prints {...}
  // there: tpr refuses printing past a depth instead of recursing forever.
  if ((v.t == JV_LIST || v.t == JV_DICT || v.t == JV_NS) && ++c->repr_depth > 200)
    jfail(c, "printing a value nested deeper than 200 levels (or one that contains itself) is not supported");
  jrepr_inner(c, b, v);
  if (v.t == JV_LIST || v.t == JV_DICT || v.t == JV_NS) c->repr_depth--;
}

static void jrepr_inner(jctx *c, jbuf *b, jval v) {
  switch (v.t) {
    case JV_STR: put_pystr(c, b, v.s); return;
    case JV_LIST:
      if (v.l->kind >= JL_GEN) jfail(c, "printing a %s is not supported (Python prints its address)", jtype_name(v));
      jb_puts(c, b, v.l->kind == JL_TUPLE ? "(" : "[");
      for (size_t i = 0; i < v.l->n; i++) {
        if (i) jb_puts(c, b, ", ");
        jrepr_of(c, b, v.l->v[i]);
      }
      if (v.l->kind == JL_TUPLE && v.l->n == 1) jb_puts(c, b, ",");
      jb_puts(c, b, v.l->kind == JL_TUPLE ? ")" : "]");
      return;
    case JV_DICT:
      jb_puts(c, b, "{");
      for (size_t i = 0; i < v.d->n; i++) {
        if (i) jb_puts(c, b, ", ");
        jrepr_of(c, b, v.d->k[i]);
        jb_puts(c, b, ": ");
        jrepr_of(c, b, v.d->v[i]);
      }
      jb_puts(c, b, "}");
      return;
    case JV_UNDEF: jb_puts(c, b, "Undefined"); return;  // repr(Undefined), inside a list or dict
    default: jstr_of(c, b, v);
  }
}

void jstr_of(jctx *c, jbuf *b, jval v) {
  char tmp[64];
  switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(c, b, "None"); return;
    case JV_BOOL: jb_puts(c, b, v.b ? "True" : "False"); return;
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.i); jb_puts(c, b, tmp); return;
    case JV_FLOAT: jfmt_float(v.f, tmp, sizeof tmp); jb_puts(c, b, tmp); return;
    case JV_STR: jb_put(c, b, v.s->s, v.s->len); return;
    case JV_LIST: case JV_DICT: jrepr_of(c, b, v); return;
    case JV_NS:
      jb_puts(c, b, "<Namespace ");
      {
        jval d = v;
        d.t = JV_DICT;
        jrepr_of(c, b, d);
      }
      jb_puts(c, b, ">");
      return;
    default: jfail(c, "printing a %s is not supported", jtype_name(v));
  }
}

jval jv_to_str(jctx *c, jval v) {
  if (v.t == JV_STR) return v;
  jbuf b = {0};
  jstr_of(c, &b, v);
  return jv_str(c, b.p ? b.p : "", b.len);
}

// --- UTF-8 -------------------------------------------------------------------------------
int ju8_decode(const char *s, size_t n, uint32_t *cp) {
  const unsigned char *u = (const unsigned char *)s;
  if (n == 0) return 0;
  if (u[0] < 0x80) {
    *cp = u[0];
    return 1;
  }
  int k = u[0] >= 0xf0 ? 4 : u[0] >= 0xe0 ? 3 : u[0] >= 0xc0 ? 2 : 0;
  if (!k || u[0] > 0xf4 || (size_t)k > n) return 0;
  uint32_t v = u[0] & (0x7f >> k);
  for (int i = 1; i < k; i++) {
    if ((u[i] & 0xc0) != 0x80) return 0;
    v = (v << 6) | (u[i] & 0x3f);
  }
  if ((k == 2 && v < 0x80) || (k == 3 && v < 0x800) || (k == 4 && (v < 0x10000 || v > 0x10ffff)) ||
      (v >= 0xd800 && v < 0xe000))
    return 0;
  *cp = v;
  return k;
}

int ju8_encode(uint32_t cp, char *o) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xc0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xe0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

bool ju8_valid(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int k = ju8_decode(s + i, n - i, &cp);
    if (!k) return false;
    i += (size_t)k;
  }
  return true;
}

size_t ju8_count(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xc0) != 0x80;
  return k;
}

size_t ju8_offset(const char *s, size_t n, size_t cp) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (((unsigned char)s[i] & 0xc0) != 0x80) {
      if (k == cp) return i;
      k++;
    }
  return n;
}

bool ju_isspace(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || cp == ' ' || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
         cp == 0x205f || cp == 0x3000;
}
