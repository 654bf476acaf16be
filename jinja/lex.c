// The Jinja lexer (lex.h): jinja2's (lexer.py) with trim_blocks and
// lstrip_blocks on, as transformers configures it, and `-`/`+` whitespace
// control.
#define _GNU_SOURCE  // memmem
#include "jinja/lex.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
  jctx *c;
  const char *src;
  size_t n, pos;
  int line;
  tok *v;
  size_t nt, cap;
} lexer;

static void emit(lexer *L, tok t) {
  if (L->nt == L->cap) {
    size_t cap = L->cap ? L->cap * 2 : 256;
    tok *nv = jalloc(L->c, cap * sizeof *nv);
    if (L->nt) memcpy(nv, L->v, L->nt * sizeof *nv);
    L->v = nv;
    L->cap = cap;
  }
  L->v[L->nt++] = t;
}

static int count_nl(const char *s, size_t n) {
  int k = 0;
  for (size_t i = 0; i < n; i++) k += s[i] == '\n';
  return k;
}

// Python's str.rstrip(): the length without trailing Unicode whitespace.
static size_t rstrip_len(const char *s, size_t n) {
  while (n > 0) {
    size_t st = n - 1;
    while (st > 0 && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
    uint32_t cp;
    if (ju8_decode(s + st, n - st, &cp) == 0 || !ju_isspace(cp)) break;
    n = st;
  }
  return n;
}

static bool all_space(const char *s, size_t n) { return rstrip_len(s, n) == 0; }

static bool is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_name_char(char ch) { return is_name_start(ch) || (ch >= '0' && ch <= '9'); }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

// Python's unicode-escape of a string literal's body.
static void unescape(lexer *L, const char *s, size_t n, tok *t) {
  jbuf b = {0};
  jb_put(L->c, &b, "", 0);
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '\\' || i + 1 >= n) {
      jb_put(L->c, &b, s + i, 1);
      continue;
    }
    char e = s[++i], o[4];
    uint32_t cp;
    int hex = 0;
    switch (e) {
      case '\n': break;
      case '\\': jb_puts(L->c, &b, "\\"); break;
      case '\'': jb_puts(L->c, &b, "'"); break;
      case '"': jb_puts(L->c, &b, "\""); break;
      case 'a': jb_puts(L->c, &b, "\a"); break;
      case 'b': jb_puts(L->c, &b, "\b"); break;
      case 'f': jb_puts(L->c, &b, "\f"); break;
      case 'n': jb_puts(L->c, &b, "\n"); break;
      case 'r': jb_puts(L->c, &b, "\r"); break;
      case 't': jb_puts(L->c, &b, "\t"); break;
      case 'v': jb_puts(L->c, &b, "\v"); break;
      case 'x': hex = 2; break;
      case 'u': hex = 4; break;
      case 'U': hex = 8; break;
      case 'N': jfail(L->c, "\\N{...} escapes are not supported");
      default:
        if (e >= '0' && e <= '7') {
          cp = (uint32_t)(e - '0');
          for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[++i] - '0');
          jb_put(L->c, &b, o, (size_t)ju8_encode(cp, o));
        } else {
          jb_put(L->c, &b, s + i - 1, 2);
        }
    }
    if (hex) {
      cp = 0;
      for (int k = 0; k < hex; k++) {
        if (i + 1 >= n) jfail(L->c, "truncated \\%c escape in a string", e);
        char h = s[++i];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) jfail(L->c, "truncated \\%c escape in a string", e);
        cp = cp * 16 + (uint32_t)d;
      }
      if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) jfail(L->c, "escape \\%c%x is not a character", e, cp);
      jb_put(L->c, &b, o, (size_t)ju8_encode(cp, o));
    }
  }
  t->s = b.p;
  t->n = b.len;
}

static const char *const ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};

// Lexes the inside of {{ }} or {% %} up to its end; returns true when the end
// marker ended with a newline (the next text starts a line).
static bool lex_tag(lexer *L, bool block) {
  int depth = 0;
  char stack[256];
  while (1) {
    while (L->pos < L->n && (L->src[L->pos] == ' ' || L->src[L->pos] == '\t' || L->src[L->pos] == '\n' ||
                             L->src[L->pos] == '\r' || L->src[L->pos] == '\f' || L->src[L->pos] == '\v')) {
      if (L->src[L->pos] == '\n') L->line++;
      L->pos++;
    }
    if (L->pos >= L->n) jfail(L->c, "unexpected end of template: an unclosed %s", block ? "{%" : "{{");
    const char *p = L->src + L->pos;
    size_t left = L->n - L->pos;
    if (depth == 0) {
      const char *end = block ? "%}" : "}}";
      bool minus = left >= 3 && p[0] == '-' && memcmp(p + 1, end, 2) == 0;
      bool plus = block && left >= 3 && p[0] == '+' && memcmp(p + 1, end, 2) == 0;
      if (minus || plus || (left >= 2 && memcmp(p, end, 2) == 0)) {
        emit(L, (tok){.t = block ? T_BEND : T_VEND, .line = L->line});
        L->pos += minus || plus ? 3 : 2;
        bool nl = false;
        if (minus) {
          while (L->pos < L->n) {
            uint32_t cp;
            int k = ju8_decode(L->src + L->pos, L->n - L->pos, &cp);
            if (!k || !ju_isspace(cp)) break;
            if (cp == '\n') L->line++;
            nl = cp == '\n';
            L->pos += (size_t)k;
          }
        } else if (block && !plus && L->pos < L->n && L->src[L->pos] == '\n') {  // trim_blocks
          L->pos++;
          L->line++;
          nl = true;
        }
        return nl;
      }
    }
    tok t = {.line = L->line};
    if (is_name_start(p[0])) {
      size_t k = 1;
      while (k < left && is_name_char(p[k])) k++;
      t.t = T_NAME;
      t.s = p;
      t.n = k;
      L->pos += k;
    } else if (is_digit(p[0])) {
      size_t k = 0;
      bool is_float = false;
      while (k < left && (is_digit(p[k]) || p[k] == '_')) k++;
      if (k + 1 < left && p[k] == '.' && is_digit(p[k + 1])) {
        is_float = true;
        k++;
        while (k < left && (is_digit(p[k]) || p[k] == '_')) k++;
      }
      if (k < left && (p[k] == 'e' || p[k] == 'E')) {
        size_t e = k + 1;
        if (e < left && (p[e] == '+' || p[e] == '-')) e++;
        if (e < left && is_digit(p[e])) {
          while (e < left && (is_digit(p[e]) || p[e] == '_')) e++;
          k = e;
          is_float = true;
        }
      }
      char tmp[64];
      size_t m = 0;
      for (size_t i = 0; i < k && m < sizeof tmp - 1; i++)
        if (p[i] != '_') tmp[m++] = p[i];
      tmp[m] = 0;
      errno = 0;
      if (is_float) {
        t.t = T_FLOAT;
        t.f = strtod(tmp, NULL);
      } else {
        t.t = T_INT;
        t.i = strtoll(tmp, NULL, 10);
        if (errno == ERANGE) jfail(L->c, "integer literal %s is out of range", tmp);
      }
      L->pos += k;
    } else if (p[0] == '\'' || p[0] == '"') {
      size_t k = 1;
      while (k < left && p[k] != p[0]) k += p[k] == '\\' ? 2 : 1;
      if (k >= left) jfail(L->c, "unterminated string");
      unescape(L, p + 1, k - 1, &t);
      t.t = T_STR;
      L->line += count_nl(p, k);
      L->pos += k + 1;
    } else {
      size_t k = 0;
      for (int i = 0; ops2[i]; i++)
        if (left >= 2 && memcmp(p, ops2[i], 2) == 0) k = 2;
      if (!k) {
        if (!strchr("+-/*%~[](){}><=.:|,;", p[0])) jfail(L->c, "unexpected character '%c'", p[0]);
        k = 1;
      }
      if (k == 1 && strchr("([{", p[0])) {
        if (depth >= (int)sizeof stack) jfail(L->c, "brackets nested too deep");
        stack[depth++] = p[0] == '(' ? ')' : p[0] == '[' ? ']' : '}';
      } else if (k == 1 && strchr(")]}", p[0])) {
        if (depth == 0) jfail(L->c, "unexpected '%c'", p[0]);
        if (stack[--depth] != p[0]) jfail(L->c, "unexpected '%c', expected '%c'", p[0], stack[depth]);
      }
      t.t = T_OP;
      t.s = p;
      t.n = k;
      L->pos += k;
    }
    emit(L, t);
  }
}

static void lex(lexer *L) {
  bool line_starting = true;
  while (L->pos < L->n) {
    const char *p = L->src + L->pos;
    size_t left = L->n - L->pos;
    // The next tag opener.
    size_t k = 0;
    int kind = 0;  // 1 {{, 2 {%, 3 {#
    for (; k + 1 < left; k++)
      if (p[k] == '{' && (p[k + 1] == '{' || p[k + 1] == '%' || p[k + 1] == '#')) {
        kind = p[k + 1] == '{' ? 1 : p[k + 1] == '%' ? 2 : 3;
        break;
      }
    if (!kind) {
      emit(L, (tok){.t = T_TEXT, .line = L->line, .s = p, .n = left});
      L->line += count_nl(p, left);
      L->pos = L->n;
      break;
    }
    char sign = k + 2 < left && (p[k + 2] == '-' || p[k + 2] == '+') ? p[k + 2] : 0;
    size_t tn = k;
    if (sign == '-') {
      tn = rstrip_len(p, k);
    } else if (sign != '+' && kind != 1) {  // lstrip_blocks
      size_t lpos = k;
      while (lpos > 0 && p[lpos - 1] != '\n') lpos--;
      if ((lpos > 0 || line_starting) && all_space(p + lpos, k - lpos)) tn = lpos;
    }
    if (tn) emit(L, (tok){.t = T_TEXT, .line = L->line, .s = p, .n = tn});
    L->line += count_nl(p, k);
    L->pos += k + 2 + (sign ? 1 : 0);
    if (kind == 3) {  // comment
      const char *q = L->src + L->pos;
      size_t ql = L->n - L->pos, e = 0;
      while (e + 1 < ql && !(q[e] == '#' && q[e + 1] == '}')) e++;
      if (e + 1 >= ql) jfail(L->c, "missing end of comment tag");
      char before = e > 0 ? q[e - 1] : 0;
      L->line += count_nl(q, e);
      L->pos += e + 2;
      line_starting = false;
      if (before == '-') {
        while (L->pos < L->n) {
          uint32_t cp;
          int kk = ju8_decode(L->src + L->pos, L->n - L->pos, &cp);
          if (!kk || !ju_isspace(cp)) break;
          if (cp == '\n') L->line++;
          line_starting = cp == '\n';
          L->pos += (size_t)kk;
        }
      } else if (before != '+' && L->pos < L->n && L->src[L->pos] == '\n') {
        L->pos++;
        L->line++;
        line_starting = true;
      }
      continue;
    }
    if (kind == 2) {  // {% raw %}: the text up to {% endraw %} as it is
      size_t q = L->pos;
      while (q < L->n && (L->src[q] == ' ' || L->src[q] == '\t' || L->src[q] == '\n')) q++;
      if (L->n - q >= 3 && memcmp(L->src + q, "raw", 3) == 0 && !(q + 3 < L->n && is_name_char(L->src[q + 3]))) {
        q += 3;
        while (q < L->n && (L->src[q] == ' ' || L->src[q] == '\t' || L->src[q] == '\n')) q++;
        bool minus = q < L->n && L->src[q] == '-';
        if (minus) q++;
        if (q + 1 >= L->n || L->src[q] != '%' || L->src[q + 1] != '}') jfail(L->c, "bad raw tag");
        q += 2;
        if (minus)
          while (q < L->n && (L->src[q] == ' ' || L->src[q] == '\t' || L->src[q] == '\n' || L->src[q] == '\r')) q++;
        const char *end = NULL;
        for (size_t s = q; s + 1 < L->n && !end; s++) {
          if (L->src[s] != '{' || L->src[s + 1] != '%') continue;
          size_t r = s + 2;
          if (r < L->n && (L->src[r] == '-' || L->src[r] == '+')) r++;
          while (r < L->n && (L->src[r] == ' ' || L->src[r] == '\t' || L->src[r] == '\n')) r++;
          if (L->n - r >= 6 && memcmp(L->src + r, "endraw", 6) == 0) end = L->src + s;
        }
        if (!end) jfail(L->c, "missing {%% endraw %%}");
        size_t dn = (size_t)(end - (L->src + q));
        size_t keep = end[2] == '-' ? rstrip_len(L->src + q, dn) : dn;
        if (keep) emit(L, (tok){.t = T_TEXT, .line = L->line, .s = L->src + q, .n = keep});
        L->line += count_nl(L->src + L->pos, (size_t)(end - (L->src + L->pos)));
        L->pos = (size_t)(end - L->src) + 2;
        if (L->pos < L->n && (L->src[L->pos] == '-' || L->src[L->pos] == '+')) L->pos++;
        while (L->pos < L->n && L->src[L->pos] != '%') L->pos++;
        L->pos += 2;
        line_starting = false;
        if (L->src[L->pos - 3] == '-') {
          while (L->pos < L->n && (L->src[L->pos] == ' ' || L->src[L->pos] == '\t' || L->src[L->pos] == '\n'))
            line_starting = L->src[L->pos++] == '\n';
        } else if (L->pos < L->n && L->src[L->pos] == '\n') {
          L->pos++;
          line_starting = true;
        }
        continue;
      }
    }
    emit(L, (tok){.t = kind == 1 ? T_VBEGIN : T_BBEGIN, .line = L->line});
    line_starting = lex_tag(L, kind == 2);
  }
  emit(L, (tok){.t = T_EOF, .line = L->line});
}

tok *jlex(jctx *c, const char *src, size_t n) {
  lexer L = {.c = c, .src = src, .n = n, .line = 1};
  lex(&L);
  return L.v;
}
