// The Jinja lexer and parser: template text to a syntax tree (jinja_impl.h).
// The lexer follows jinja2's (lexer.py) with trim_blocks and lstrip_blocks
// on, as transformers configures it: newlines normalised to \n, one trailing
// newline dropped, `-`/`+` whitespace control. The parser follows jinja2's
// precedence (parser.py): condexpr < or < and < not < compare < +,- < ~ <
// *,/,//,% < ** < unary < filters/tests/calls < postfix.
#define _GNU_SOURCE  // memmem
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"

enum { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct tok {
  int t, line;
  const char *s;  // T_TEXT/T_STR: the text (unescaped); T_NAME/T_OP: the spelling
  size_t n;
  int64_t i;
  double f;
} tok;

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
      jnode *call = node(P, N_CALL);
      call->a = n;
      call_args(P, call);
      n = call;
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
      jnode *call = node(P, N_CALL);
      call->a = n;
      call_args(P, call);
      n = call;
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
  lexer L = {.c = c, .src = s, .n = n, .line = 1};
  lex(&L);
  parser P = {.c = c, .t = L.v};
  body(&P, out, NULL);
  jcheck_names(c, out);
}
