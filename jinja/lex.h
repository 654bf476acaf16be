// The Jinja lexer's tokens (lex.c), for the parser (parse.c).
#ifndef TPR_JINJA_LEX_H
#define TPR_JINJA_LEX_H

#include "jinja/jinja_impl.h"

enum { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct tok {
  int t, line;
  const char *s;  // T_TEXT/T_STR: the text (unescaped); T_NAME/T_OP: the spelling
  size_t n;
  int64_t i;
  double f;
} tok;

// Splits template text (newlines already \n) into tokens, the last T_EOF;
// the array lives in c's arena. Errors jfail with the line.
tok *jlex(jctx *c, const char *src, size_t n);

#endif
