// JSON in and out of Jinja values: json.dumps as transformers' tojson calls
// it (ensure_ascii=False, its separators, indent, sort_keys), and a reader
// that keeps ints apart from floats (1 stays an int, 1.0 a float) as
// Python's json.loads does.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

// --- json.dumps ------------------------------------------------------------------------
static void json_str(jctx *c, jbuf *b, const char *s, size_t n) {
  jb_puts(c, b, "\"");
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    const char *e = NULL;
    char u[8];
    switch (ch) {
      case '"': e = "\\\""; break;
      case '\\': e = "\\\\"; break;
      case '\n': e = "\\n"; break;
      case '\r': e = "\\r"; break;
      case '\t': e = "\\t"; break;
      case '\b': e = "\\b"; break;
      case '\f': e = "\\f"; break;
      default:
        if (ch < 0x20) {
          snprintf(u, sizeof u, "\\u%04x", ch);
          e = u;
        }
    }
    if (e) {
      jb_put(c, b, s + run, i - run);
      jb_puts(c, b, e);
      run = i + 1;
    }
  }
  jb_put(c, b, s + run, n - run);
  jb_puts(c, b, "\"");
}

static void json_newline(jctx *c, jbuf *b, const char *indent, int level) {
  jb_puts(c, b, "\n");
  for (int i = 0; i < level; i++) jb_puts(c, b, indent);
}

static void json_key(jctx *c, jbuf *b, jval k) {
  char tmp[64];
  switch (k.t) {
    case JV_STR: json_str(c, b, k.s->s, k.s->len); return;
    case JV_INT: snprintf(tmp, sizeof tmp, "\"%lld\"", (long long)k.i); jb_puts(c, b, tmp); return;
    case JV_BOOL: jb_puts(c, b, k.b ? "\"true\"" : "\"false\""); return;
    case JV_NONE: jb_puts(c, b, "\"null\""); return;
    case JV_FLOAT:
      jfmt_float(k.f, tmp, sizeof tmp);
      jb_puts(c, b, "\"");
      jb_puts(c, b, tmp);
      jb_puts(c, b, "\"");
      return;
    default: jfail(c, "keys must be str, int, float, bool or None, not %s", jtype_name(k));
  }
}

void jjson_of(jctx *c, jbuf *b, jval v, const char *indent, int level, const char *item_sep, const char *key_sep,
              bool sort_keys) {
  char tmp[64];
  if (level > 200) jfail(c, "tojson: nesting too deep");
  switch (v.t) {
    case JV_NONE: jb_puts(c, b, "null"); return;
    case JV_BOOL: jb_puts(c, b, v.b ? "true" : "false"); return;
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.i); jb_puts(c, b, tmp); return;
    case JV_FLOAT:
      if (isnan(v.f)) jb_puts(c, b, "NaN");
      else if (isinf(v.f)) jb_puts(c, b, v.f < 0 ? "-Infinity" : "Infinity");
      else {
        jfmt_float(v.f, tmp, sizeof tmp);
        jb_puts(c, b, tmp);
      }
      return;
    case JV_STR: json_str(c, b, v.s->s, v.s->len); return;
    case JV_LIST: {
      if (v.l->kind >= JL_GEN) jfail(c, "Object of type %s is not JSON serializable", jtype_name(v));
      if (v.l->n == 0) {
        jb_puts(c, b, "[]");
        return;
      }
      jb_puts(c, b, "[");
      for (size_t i = 0; i < v.l->n; i++) {
        if (i) jb_puts(c, b, item_sep);
        if (indent) json_newline(c, b, indent, level + 1);
        jjson_of(c, b, v.l->v[i], indent, level + 1, item_sep, key_sep, sort_keys);
      }
      if (indent) json_newline(c, b, indent, level);
      jb_puts(c, b, "]");
      return;
    }
    case JV_DICT: {
      if (v.d->n == 0) {
        jb_puts(c, b, "{}");
        return;
      }
      size_t n = v.d->n;
      size_t *ord = jalloc(c, n * sizeof *ord);
      for (size_t i = 0; i < n; i++) ord[i] = i;
      if (sort_keys)  // insertion sort: dicts in templates are small
        for (size_t i = 1; i < n; i++)
          for (size_t j = i; j > 0 && jcompare(c, v.d->k[ord[j - 1]], v.d->k[ord[j]]) > 0; j--) {
            size_t t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
          }
      jb_puts(c, b, "{");
      for (size_t i = 0; i < n; i++) {
        if (i) jb_puts(c, b, item_sep);
        if (indent) json_newline(c, b, indent, level + 1);
        json_key(c, b, v.d->k[ord[i]]);
        jb_puts(c, b, key_sep);
        jjson_of(c, b, v.d->v[ord[i]], indent, level + 1, item_sep, key_sep, sort_keys);
      }
      if (indent) json_newline(c, b, indent, level);
      jb_puts(c, b, "}");
      return;
    }
    default: jfail(c, "Object of type %s is not JSON serializable", jtype_name(v));
  }
}

// --- JSON reader -----------------------------------------------------------------------
typedef struct jp {
  jctx *c;
  const char *s;
  size_t n, i;
  int depth;
} jp;

static void jp_ws(jp *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

_Noreturn static void jp_fail(jp *p, const char *what) { jfail(p->c, "variables JSON: %s at byte %zu", what, p->i); }

static unsigned jp_hex4(jp *p) {
  if (p->i + 4 > p->n) jp_fail(p, "short \\u escape");
  unsigned v = 0;
  for (int k = 0; k < 4; k++) {
    char ch = p->s[p->i++];
    v <<= 4;
    if (ch >= '0' && ch <= '9') v |= (unsigned)(ch - '0');
    else if (ch >= 'a' && ch <= 'f') v |= (unsigned)(ch - 'a' + 10);
    else if (ch >= 'A' && ch <= 'F') v |= (unsigned)(ch - 'A' + 10);
    else jp_fail(p, "bad \\u escape");
  }
  return v;
}

static jval jp_string(jp *p) {
  p->i++;  // "
  jbuf b = {0};
  jb_put(p->c, &b, "", 0);
  while (1) {
    if (p->i >= p->n) jp_fail(p, "unterminated string");
    char ch = p->s[p->i];
    if (ch == '"') {
      p->i++;
      break;
    }
    if ((unsigned char)ch < 0x20) jp_fail(p, "control character in a string");
    if (ch != '\\') {
      size_t st = p->i;
      while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\' && (unsigned char)p->s[p->i] >= 0x20) p->i++;
      jb_put(p->c, &b, p->s + st, p->i - st);
      continue;
    }
    p->i++;
    if (p->i >= p->n) jp_fail(p, "unterminated escape");
    char e = p->s[p->i++], o[4];
    switch (e) {
      case '"': case '\\': case '/': jb_put(p->c, &b, &e, 1); break;
      case 'n': jb_puts(p->c, &b, "\n"); break;
      case 't': jb_puts(p->c, &b, "\t"); break;
      case 'r': jb_puts(p->c, &b, "\r"); break;
      case 'b': jb_puts(p->c, &b, "\b"); break;
      case 'f': jb_puts(p->c, &b, "\f"); break;
      case 'u': {
        uint32_t cp = jp_hex4(p);
        if (cp >= 0xd800 && cp < 0xdc00) {
          if (p->i + 6 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') jp_fail(p, "lone surrogate");
          p->i += 2;
          uint32_t lo = jp_hex4(p);
          if (lo < 0xdc00 || lo >= 0xe000) jp_fail(p, "lone surrogate");
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        } else if (cp >= 0xdc00 && cp < 0xe000) {
          jp_fail(p, "lone surrogate");
        }
        jb_put(p->c, &b, o, (size_t)ju8_encode(cp, o));
        break;
      }
      default: jp_fail(p, "bad escape");
    }
  }
  if (!ju8_valid(b.p, b.len)) jp_fail(p, "invalid UTF-8 in a string");
  return jv_str(p->c, b.p, b.len);
}

static jval jp_value(jp *p) {
  jp_ws(p);
  if (p->i >= p->n) jp_fail(p, "unexpected end");
  if (++p->depth > 512) jp_fail(p, "nesting too deep");
  char ch = p->s[p->i];
  jval r;
  if (ch == '{') {
    p->i++;
    r = jv_dict(p->c);
    jp_ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
      p->i++;
    } else {
      while (1) {
        jp_ws(p);
        if (p->i >= p->n || p->s[p->i] != '"') jp_fail(p, "expected a key");
        jval k = jp_string(p);
        jp_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') jp_fail(p, "expected ':'");
        p->i++;
        jval v = jp_value(p);
        jd_set(p->c, r.d, k, v);  // a repeated key: the last value, at the first place (Python's dict)
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
          p->i++;
          continue;
        }
        if (p->i < p->n && p->s[p->i] == '}') {
          p->i++;
          break;
        }
        jp_fail(p, "expected ',' or '}'");
      }
    }
  } else if (ch == '[') {
    p->i++;
    r = jv_list(p->c, JL_LIST);
    jp_ws(p);
    if (p->i < p->n && p->s[p->i] == ']') {
      p->i++;
    } else {
      while (1) {
        jl_push(p->c, r.l, jp_value(p));
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
          p->i++;
          continue;
        }
        if (p->i < p->n && p->s[p->i] == ']') {
          p->i++;
          break;
        }
        jp_fail(p, "expected ',' or ']'");
      }
    }
  } else if (ch == '"') {
    r = jp_string(p);
  } else if (p->n - p->i >= 4 && memcmp(p->s + p->i, "true", 4) == 0) {
    p->i += 4;
    r = jv_bool(true);
  } else if (p->n - p->i >= 5 && memcmp(p->s + p->i, "false", 5) == 0) {
    p->i += 5;
    r = jv_bool(false);
  } else if (p->n - p->i >= 4 && memcmp(p->s + p->i, "null", 4) == 0) {
    p->i += 4;
    r = jv_none();
  } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
    size_t st = p->i;
    bool is_float = false;
    if (p->s[p->i] == '-') p->i++;
    while (p->i < p->n && ((p->s[p->i] >= '0' && p->s[p->i] <= '9') || p->s[p->i] == '.' || p->s[p->i] == 'e' ||
                           p->s[p->i] == 'E' || p->s[p->i] == '+' || p->s[p->i] == '-')) {
      if (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E') is_float = true;
      p->i++;
    }
    char tmp[64];
    if (p->i - st >= sizeof tmp) jp_fail(p, "number too long");
    memcpy(tmp, p->s + st, p->i - st);
    tmp[p->i - st] = 0;
    char *end;
    if (is_float) {
      r = jv_float(strtod(tmp, &end));
    } else {
      errno = 0;
      long long v = strtoll(tmp, &end, 10);
      if (errno == ERANGE) jp_fail(p, "integer out of range");
      r = jv_int(v);
    }
    if (*end) jp_fail(p, "bad number");
  } else {
    jp_fail(p, "unexpected character");
  }
  p->depth--;
  return r;
}

jval jjson_parse(jctx *c, const char *s, size_t n) {
  jp p = {.c = c, .s = s, .n = n};
  jval v = jp_value(&p);
  jp_ws(&p);
  if (p.i != n) jp_fail(&p, "trailing characters");
  return v;
}
