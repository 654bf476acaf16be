// Internals of the Jinja interpreter (jinja.h): values, the arena they live
// in, the syntax tree and the render context. Every allocation of a parse or
// a render comes from one arena freed at the end, and every error unwinds
// with longjmp to the entry point, so no code path frees anything by hand.
#ifndef TPR_JINJA_IMPL_H
#define TPR_JINJA_IMPL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja/jinja.h"

// --- arena -------------------------------------------------------------------
typedef struct jchunk jchunk;
typedef struct jarena {
  jchunk *head;
  size_t used, limit;
} jarena;

typedef struct jctx jctx;

// --- values ------------------------------------------------------------------
typedef enum jtype {
  JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
  JV_NS,      // namespace(): a dict whose attributes can be set
  JV_LOOP,    // the loop variable of a for
  JV_MACRO,   // a macro (or caller)
  JV_FUNC,    // a global function (range, dict, namespace, ...)
  JV_METHOD,  // a bound method of a str, list or dict
} jtype;

// The kinds of a sequence. Python's generators (what select/map/... return)
// are always true, have no len and are used up by iterating; views
// (dict.items(), range()) have a len but no printable form.
enum { JL_LIST, JL_TUPLE, JL_GEN, JL_VIEW };

typedef struct jstr {
  size_t len;
  bool markup;  // from |safe or |e: + and % on it would escape the other side
  char s[];
} jstr;

typedef struct jval jval;
typedef struct jlist jlist;
typedef struct jdict jdict;
struct jval {
  jtype t;
  union {
    bool b;
    int64_t i;
    double f;
    jstr *s;
    jlist *l;
    jdict *d;  // JV_DICT, JV_NS
    struct jloop *loop;
    struct jmacro *m;
    int fn;
    struct jmethod *me;
    const char *undef;  // JV_UNDEF: what was undefined (for messages)
  };
};
struct jlist {
  size_t n, cap, pos;  // pos: a generator's first unconsumed item
  int kind;
  jval *v;
};
struct jdict {
  size_t n, cap;
  jval *k, *v;
};
typedef struct jmethod {
  jval self;
  const char *name;
} jmethod;

// --- syntax tree ---------------------------------------------------------------
typedef enum jnk {
  // expressions
  N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_UNARY, N_BINARY,
  N_AND, N_OR, N_NOT, N_COND, N_CONCAT, N_COMPARE,
  // statements
  S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_BREAK, S_CONTINUE, S_FILTERBLOCK,
  S_GENERATION, S_WITH,
} jnk;

typedef struct jnode jnode;
typedef struct jnlist {
  jnode **v;
  int n, cap;
} jnlist;

struct jnode {
  jnk k;
  int line;
  int op;              // operator token of unary/binary/compare
  const char *name;    // N_NAME, N_ATTR, N_FILTER, N_TEST, S_MACRO, S_SET target name
  jval lit;            // N_LIT
  jnode *a, *b, *c;    // operands; S_IF cond; S_FOR target/iter/filter; S_SET target/value
  bool negate;         // N_TEST: is not; N_COMPARE ops: not in
  jnlist args;         // N_LIST/N_TUPLE items, N_DICT k,v,k,v, N_CALL/N_FILTER/N_TEST args, S_MACRO defaults
  const char **kw;     // args[i]'s keyword name or NULL (calls); S_MACRO parameter names
  jnlist body, orelse; // statements
  jnode *call;         // S_CALLBLOCK: the call; S_FILTERBLOCK: the filter chain (a on the innermost)
  jnlist ops;          // N_COMPARE: the right operands (op in each node's op)
};

struct tpr_jinja_template {
  jarena arena;
  jnlist body;
};

// --- render context -----------------------------------------------------------
typedef struct jscope {
  struct jscope *parent;
  jdict vars;
} jscope;

typedef struct jmacro {
  const jnode *def;     // S_MACRO, or the S_CALLBLOCK whose body is the caller
  jscope *closure;
  struct jmacro *caller;
  int nparams;
  const char **params;
} jmacro;

typedef struct jloop {
  jlist *items;
  size_t i;
  int depth;
} jloop;

enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };  // jctx's flow

struct jctx {
  jarena *a;
  jmp_buf jb;
  tpr_jinja_error *err;
  int line;
  // render
  char *out;
  size_t len, cap, max_output;
  int64_t steps, max_steps;
  int depth, max_depth;
  jscope *globals;
  int parse_depth;
  int repr_depth;
  int flow;  // FLOW_BREAK / FLOW_CONTINUE on the way out of a loop body
};

_Noreturn void jfail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
_Noreturn void jraise(jctx *c, const char *msg);

void *jalloc(jctx *c, size_t n);
void jarena_free(jarena *a);
char *jstrdup(jctx *c, const char *s, size_t n);

// values
static inline jval jv_undef(const char *what) { jval v = {.t = JV_UNDEF}; v.undef = what; return v; }
static inline jval jv_none(void) { jval v = {.t = JV_NONE}; return v; }
static inline jval jv_bool(bool b) { jval v = {.t = JV_BOOL}; v.b = b; return v; }
static inline jval jv_int(int64_t i) { jval v = {.t = JV_INT}; v.i = i; return v; }
static inline jval jv_float(double f) { jval v = {.t = JV_FLOAT}; v.f = f; return v; }
jval jv_str(jctx *c, const char *s, size_t n);
jval jv_cstr(jctx *c, const char *s);
jval jv_list(jctx *c, int kind);
jval jv_dict(jctx *c);
void jl_push(jctx *c, jlist *l, jval v);
void jd_set(jctx *c, jdict *d, jval k, jval v);
jval *jd_get(const jdict *d, jval k);
jval *jd_gets(const jdict *d, const char *k);
const char *jtype_name(jval v);

bool jtruthy(jctx *c, jval v);
bool jequal(jval a, jval b);
int jcompare(jctx *c, jval a, jval b);  // <0, 0, >0; unorderable: error
// Python's str(v) / repr(v), appended to a growing buffer.
typedef struct jbuf {
  char *p;
  size_t len, cap;
} jbuf;
void jb_put(jctx *c, jbuf *b, const char *s, size_t n);
static inline void jb_puts(jctx *c, jbuf *b, const char *s) { jb_put(c, b, s, __builtin_strlen(s)); }
void jstr_of(jctx *c, jbuf *b, jval v);
void jrepr_of(jctx *c, jbuf *b, jval v);
jval jv_to_str(jctx *c, jval v);
void jfmt_float(double f, char *buf, size_t n);
// json.dumps(v, ensure_ascii=False, indent, separators, sort_keys)
void jjson_of(jctx *c, jbuf *b, jval v, const char *indent, int level, const char *item_sep, const char *key_sep,
              bool sort_keys);
// Parses JSON text into values (ints stay ints).
jval jjson_parse(jctx *c, const char *s, size_t n);

// UTF-8
size_t ju8_count(const char *s, size_t n);
size_t ju8_offset(const char *s, size_t n, size_t cp);  // byte offset of code point cp (n if past the end)
int ju8_decode(const char *s, size_t n, uint32_t *cp);  // bytes used, 0 if invalid
int ju8_encode(uint32_t cp, char *out);
bool ju8_valid(const char *s, size_t n);
bool ju_isspace(uint32_t cp);

// parse.c
void jparse(jctx *c, const char *src, size_t len, jnlist *out);
void jn_push(jctx *c, jnlist *l, jnode *n);
// check.c: unknown filters and tests outside {% if %} and conditional
// expressions are load-time errors, as jinja2 compiles them.
void jcheck_names(jctx *c, const jnlist *body);

// eval.c
jval jeval(jctx *c, jscope *s, const jnode *n);
void jexec(jctx *c, jscope *s, const jnlist *body);
jval jcall(jctx *c, jscope *s, jval f, int n, const jval *args, const char **kw);
jval jgetattr(jctx *c, jval obj, const char *name);
jval jgetitem(jctx *c, jval obj, jval key);
jlist *jiterate(jctx *c, jval v);  // the items a for loop or filter sees
void jstep(jctx *c);

// Renders with the root variables that build() sets (the entry points).
typedef void (*jbuild_fn)(jctx *c, jdict *vars, const void *arg);
tpr_status jrender(const tpr_jinja_template *t, jbuild_fn build, const void *arg, const tpr_jinja_limits *limits,
                   char **out, size_t *out_len, tpr_jinja_error *err);

// builtins.c: arguments of filters, tests, methods and globals. jarg:
// argument `pos` (counting positional ones) or keyword `name`; NULL if absent.
const jval *jarg(int n, const jval *args, const char **kw, int pos, const char *name);
void jcheck_args(jctx *c, const char *what, int n, const char **kw, int max_pos, const char *const *names);
jstr *jneed_str(jctx *c, jval v, const char *what);
bool jis_none(const jval *v);  // absent or None

// methods.c: str/list/dict methods and the string operations filters share
typedef uint32_t (*cpmap)(uint32_t);
uint32_t jcp_upper(uint32_t cp);
uint32_t jcp_lower(uint32_t cp);
bool jis_alpha(uint32_t cp);
// Maps code points; mode 0: all with f, 1: capitalize (first up, rest low),
// 2: Python's str.title, 3: jinja's title filter.
jval jmap_case(jctx *c, jstr *s, cpmap f, int mode);
jval jstrip(jctx *c, jstr *s, const jstr *chars, bool left, bool right);  // chars NULL: whitespace
jval jreplace(jctx *c, jstr *s, jstr *old, jstr *new, int64_t count);     // count < 0: all
jval jsplitlines(jctx *c, jstr *s, bool keepends);
bool jin_list(const char *const *l, const char *n);
jval jview(jctx *c, jdict *d, int what);  // a dict's keys (0), values (1) or items (2)

// builtins.c
bool jfilter_known(const char *name);
// markupsafe's escape(): & < > " ' as entities; the result is Markup (a
// |safe or |e string), and Markup is returned unchanged.
jval jescape(jctx *c, jval v);
bool jtest_known(const char *name);
jval jfilter(jctx *c, jscope *s, const char *name, jval v, int n, const jval *args, const char **kw);
bool jtest(jctx *c, jscope *s, const char *name, jval v, int n, const jval *args);
jval jmethod_call(jctx *c, jval self, const char *name, int n, const jval *args, const char **kw);
bool jmethod_exists(jval self, const char *name);
jval jglobal_call(jctx *c, int fn, int n, const jval *args, const char **kw);
jval jpercent_format(jctx *c, jstr *fmt, int n, const jval *args, bool mapping);
enum { JF_RANGE, JF_DICT, JF_NAMESPACE, JF_RAISE, JF_STRFTIME, JF_COUNT };
extern const char *const jglobal_names[JF_COUNT];

#endif
