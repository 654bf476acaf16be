// The JSON automaton of json_grammar.h. A schema compiles to a tree of
// nodes; the state is a stack of frames, one per open value (object, array,
// string, number, literal), each with a phase. A frame that finishes on a
// byte it consumed ('}', ']', the closing quote) pops; one that finishes on a
// byte it cannot take (a number's end) pops and hands the byte to its parent.
// A parent sets its own next phase before it pushes a child, so a popped
// child leaves the parent ready for what follows the value.
#define _GNU_SOURCE
#include "engine/json_grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum kind { K_ANY, K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_LITERALS, K_SEQ, K_ONE_OF_TYPES, K_BY_SELECTOR };

typedef struct node node;
struct node {
  enum kind k;
  // K_OBJECT: properties in order (any: n_props < 0, any keys); K_ARRAY: items (any: NULL)
  int n_props;
  char **keys;  // each key as JSON text, quotes included
  node **vals;
  uint64_t required;
  node *items;
  int min_items, max_items;  // max < 0: none; K_STRING: minLength, maxLength (code points)
  // K_LITERALS: the accepted texts (enum, const, true/false/null)
  int n_lits;
  char **lits;
  // K_SEQ: prefix literal, inner, suffix literal; K_ONE_OF_TYPES: alternatives by first byte;
  // K_BY_SELECTOR: alts[i] when the object's selector property had literal i
  node *inner, *pre, *suf;
  int n_alts;
  node **alts;
};

struct tpr_json_grammar {
  node *root;
  node **all;  // every node, for freeing
  int n_all, cap_all;
};

// ---- compiling ------------------------------------------------------------------------

static node *new_node(tpr_json_grammar *g, enum kind k) {
  if (g->n_all == g->cap_all) {
    int cap = g->cap_all ? 2 * g->cap_all : 16;
    node **a = realloc(g->all, (size_t)cap * sizeof *a);
    if (!a) return NULL;
    g->all = a, g->cap_all = cap;
  }
  node *n = calloc(1, sizeof *n);
  if (n) g->all[g->n_all++] = n, n->k = k, n->n_props = -1, n->max_items = -1;
  return n;
}

static node *literals(tpr_json_grammar *g, int n, const char *const *texts) {
  node *x = new_node(g, K_LITERALS);
  if (!x || !(x->lits = calloc((size_t)n, sizeof *x->lits))) return NULL;
  for (x->n_lits = 0; x->n_lits < n; x->n_lits++)
    if (!(x->lits[x->n_lits] = strdup(texts[x->n_lits]))) return NULL;
  return x;
}

static node *compile(tpr_json_grammar *g, const cJSON *s, int depth, char *err, size_t errlen);

// One of "object", "array", ... (the schema's other keywords in s apply).
static node *compile_type(tpr_json_grammar *g, const char *type, const cJSON *s, int depth, char *err, size_t errlen) {
  if (!strcmp(type, "string")) {
    node *n = new_node(g, K_STRING);
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minLength"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    if (!n) return NULL;
    if ((mn && (!cJSON_IsNumber(mn) || mn->valuedouble < 0)) || (mx && (!cJSON_IsNumber(mx) || mx->valuedouble < 0)))
      return snprintf(err, errlen, "minLength and maxLength must be >= 0"), NULL;
    n->min_items = mn ? (int)mn->valuedouble : 0;
    n->max_items = mx ? (int)mx->valuedouble : -1;
    if (n->max_items >= 0 && n->max_items < n->min_items) return snprintf(err, errlen, "maxLength < minLength"), NULL;
    return n;
  }
  if (!strcmp(type, "number")) return new_node(g, K_NUMBER);
  if (!strcmp(type, "integer")) return new_node(g, K_INTEGER);
  if (!strcmp(type, "boolean")) return literals(g, 2, (const char *const[]){"true", "false"});
  if (!strcmp(type, "null")) return literals(g, 1, (const char *const[]){"null"});
  if (!strcmp(type, "array")) {
    node *a = new_node(g, K_ARRAY);
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items"), *mn = cJSON_GetObjectItemCaseSensitive(s, "minItems"),
                *mx = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
    if (!a) return NULL;
    if (items && !(a->items = compile(g, items, depth + 1, err, errlen))) return NULL;
    if (mn && (!cJSON_IsNumber(mn) || mn->valuedouble < 0)) return snprintf(err, errlen, "minItems must be >= 0"), NULL;
    if (mx && (!cJSON_IsNumber(mx) || mx->valuedouble < 0)) return snprintf(err, errlen, "maxItems must be >= 0"), NULL;
    a->min_items = mn ? (int)mn->valuedouble : 0;
    a->max_items = mx ? (int)mx->valuedouble : -1;
    if (a->max_items >= 0 && a->max_items < a->min_items) return snprintf(err, errlen, "maxItems < minItems"), NULL;
    return a;
  }
  if (!strcmp(type, "object")) {
    node *o = new_node(g, K_OBJECT);
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties"), *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (!o) return NULL;
    if (!props) {
      if (req && cJSON_GetArraySize(req)) return snprintf(err, errlen, "'required' without 'properties'"), NULL;
      return o;  // any keys, any values
    }
    if (addl && !cJSON_IsFalse(addl))
      return snprintf(err, errlen, "additionalProperties other than false beside 'properties' is not supported"), NULL;
    int n = cJSON_GetArraySize(props);
    if (!cJSON_IsObject(props) || n > 64) return snprintf(err, errlen, "'properties' must be an object of at most 64"), NULL;
    o->n_props = n;
    o->keys = calloc((size_t)n + 1, sizeof *o->keys), o->vals = calloc((size_t)n + 1, sizeof *o->vals);
    if (!o->keys || !o->vals) return NULL;
    int i = 0;
    for (const cJSON *p = props->child; p; p = p->next, i++) {
      cJSON *k = cJSON_CreateString(p->string);
      o->keys[i] = k ? cJSON_PrintUnformatted(k) : NULL;
      cJSON_Delete(k);
      if (!o->keys[i] || !(o->vals[i] = compile(g, p, depth + 1, err, errlen))) return NULL;
    }
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
      int j = 0;
      for (const cJSON *p = props->child; p && (!cJSON_IsString(r) || strcmp(p->string, r->valuestring)); p = p->next) j++;
      if (j == n) return snprintf(err, errlen, "required property '%s' is not in 'properties'", cJSON_IsString(r) ? r->valuestring : "?"), NULL;
      o->required |= 1ull << j;
    }
    return o;
  }
  snprintf(err, errlen, "type '%s' is not a JSON schema type", type);
  return NULL;
}

static node *compile(tpr_json_grammar *g, const cJSON *s, int depth, char *err, size_t errlen) {
  if (depth > TPR_JSON_MAX_DEPTH) return snprintf(err, errlen, "the schema nests deeper than %d", TPR_JSON_MAX_DEPTH), NULL;
  if (cJSON_IsTrue(s)) return new_node(g, K_ANY);
  if (!cJSON_IsObject(s)) return snprintf(err, errlen, "a schema must be an object"), NULL;
  static const char *const known[] = {"type", "properties", "required", "items", "minItems", "maxItems", "enum", "const",
                                      "minLength", "maxLength",
                                      "additionalProperties", "title", "description", "default", "examples", "$schema",
                                      "strict", NULL};
  for (const cJSON *k = s->child; k; k = k->next) {
    int i = 0;
    while (known[i] && strcmp(known[i], k->string)) i++;
    if (!known[i]) return snprintf(err, errlen, "the schema keyword '%s' is not supported", k->string), NULL;
  }
  const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
  if (en || cn) {  // the literal texts, compact as a model writes them
    int n = en ? cJSON_GetArraySize(en) : 1;
    if ((en && (!cJSON_IsArray(en) || n == 0 || n > 64)) || (en && cn))
      return snprintf(err, errlen, "'enum' must be a list of 1 to 64 values (and not beside 'const')"), NULL;
    char **t = calloc((size_t)n, sizeof *t);
    if (!t) return NULL;
    const cJSON *v = en ? en->child : cn;
    for (int i = 0; i < n; i++, v = v->next) t[i] = cJSON_PrintUnformatted(v);
    node *x = literals(g, n, (const char *const *)t);
    for (int i = 0; i < n; i++) free(t[i]);
    free(t);
    return x;
  }
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
  if (!ty) {
    if (cJSON_GetObjectItemCaseSensitive(s, "properties")) return compile_type(g, "object", s, depth, err, errlen);
    return new_node(g, K_ANY);
  }
  if (cJSON_IsString(ty)) return compile_type(g, ty->valuestring, s, depth, err, errlen);
  if (!cJSON_IsArray(ty) || !cJSON_GetArraySize(ty)) return snprintf(err, errlen, "'type' must be a string or a list"), NULL;
  node *u = new_node(g, K_ONE_OF_TYPES);
  int n = cJSON_GetArraySize(ty);
  if (!u || !(u->alts = calloc((size_t)n, sizeof *u->alts))) return NULL;
  const cJSON *t;
  cJSON_ArrayForEach(t, ty) {
    if (!cJSON_IsString(t)) return snprintf(err, errlen, "'type' lists strings"), NULL;
    if (!(u->alts[u->n_alts++] = compile_type(g, t->valuestring, s, depth, err, errlen))) return NULL;
  }
  return u;
}

// The grammar around a root value: prefix and suffix literals.
static tpr_json_grammar *finish_grammar(tpr_json_grammar *g, node *value, const char *prefix, const char *suffix,
                                        char *err, size_t errlen) {
  if (value && (prefix || suffix)) {
    node *seq = new_node(g, K_SEQ);
    if (seq) {
      seq->inner = value;
      seq->pre = prefix ? literals(g, 1, &prefix) : NULL;
      seq->suf = suffix ? literals(g, 1, &suffix) : NULL;
    }
    value = seq && (!prefix || seq->pre) && (!suffix || seq->suf) ? seq : NULL;
  }
  if (!value) {
    if (!err[0]) snprintf(err, errlen, "out of memory");
    tpr_json_grammar_free(g);
    return NULL;
  }
  g->root = value;
  return g;
}

tpr_json_grammar *tpr_json_grammar_new_call(int n, const char *const *names, const cJSON *const *params,
                                            const char *name_key, const char *args_key, const char *prefix,
                                            const char *suffix, char *err, size_t errlen) {
  tpr_json_grammar *g = calloc(1, sizeof *g);
  if (!g) return snprintf(err, errlen, "out of memory"), NULL;
  err[0] = 0;
  if (n < 1 || n > 64) return snprintf(err, errlen, "a call among 1 to 64 functions"), tpr_json_grammar_free(g), NULL;
  node *o = new_node(g, K_OBJECT), *dep = new_node(g, K_BY_SELECTOR);
  char **quoted = calloc((size_t)n, sizeof *quoted);
  bool ok = o && dep && quoted && (o->keys = calloc(2, sizeof *o->keys)) && (o->vals = calloc(2, sizeof *o->vals)) &&
            (dep->alts = calloc((size_t)n, sizeof *dep->alts));
  for (int i = 0; ok && i < n; i++) {
    cJSON *s = cJSON_CreateString(names[i]);
    quoted[i] = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    cJSON *any_obj = NULL;
    const cJSON *p = params[i];
    if (!p) p = any_obj = cJSON_Parse("{\"type\": \"object\"}");
    ok = quoted[i] && p && (dep->alts[i] = compile(g, p, 1, err, errlen)) != NULL;
    cJSON_Delete(any_obj);
    dep->n_alts = i + 1;
  }
  node *name = ok ? literals(g, n, (const char *const *)quoted) : NULL;
  for (int i = 0; quoted && i < n; i++) free(quoted[i]);
  free(quoted);
  if (ok && name) {
    cJSON *k0 = cJSON_CreateString(name_key), *k1 = cJSON_CreateString(args_key);
    o->keys[0] = k0 ? cJSON_PrintUnformatted(k0) : NULL, o->keys[1] = k1 ? cJSON_PrintUnformatted(k1) : NULL;
    cJSON_Delete(k0), cJSON_Delete(k1);
    o->n_props = 2, o->vals[0] = name, o->vals[1] = dep, o->required = 3;
  }
  return finish_grammar(g, ok && name && o->keys[0] && o->keys[1] ? o : NULL, prefix, suffix, err, errlen);
}

void tpr_json_grammar_free(tpr_json_grammar *g) {
  if (!g) return;
  for (int i = 0; i < g->n_all; i++) {
    node *n = g->all[i];
    for (int j = 0; n->keys && j < n->n_props; j++) free(n->keys[j]);
    for (int j = 0; j < n->n_lits; j++) free(n->lits[j]);
    free(n->keys), free(n->vals), free(n->lits), free(n->alts), free(n);
  }
  free(g->all);
  free(g);
}

tpr_json_grammar *tpr_json_grammar_new(const cJSON *schema, const char *prefix, const char *suffix, char *err,
                                       size_t errlen) {
  tpr_json_grammar *g = calloc(1, sizeof *g);
  if (!g) return snprintf(err, errlen, "out of memory"), NULL;
  err[0] = 0;
  node *value = schema ? compile(g, schema, 0, err, errlen) : new_node(g, K_OBJECT);
  return finish_grammar(g, value, prefix, suffix, err, errlen);
}

// ---- the automaton ---------------------------------------------------------------------

// Phases. Objects: O_OPEN expects '{'; O_FIRST a key or '}'; O_KEY a key;
// O_COLON ':'; O_VALUE a value; O_AFTER ',' or '}'. Arrays likewise.
enum { O_OPEN, O_FIRST, O_KEY, O_COLON, O_VALUE, O_AFTER };
enum { A_OPEN, A_FIRST, A_VALUE, A_AFTER };
// S_U: pos hex digits still to come (their value in cand, bit 16 set in the
// low half of a surrogate pair); S_LO_BS, S_LO_U: the '\' and 'u' of the low
// half that must follow a high surrogate.
enum { S_OPEN, S_IN, S_ESC, S_U, S_LO_BS, S_LO_U };
enum { N_START, N_SIGN, N_ZERO, N_INT, N_FRAC0, N_FRAC, N_EXP0, N_EXPS, N_EXP };
enum { Q_PRE, Q_INNER, Q_SUF, Q_DONE };
enum { R_TAKEN, R_REJECT, R_POP_REFEED };  // what a frame did with a byte

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool push(tpr_json_state *s, const node *n) {
  if (s->depth == TPR_JSON_MAX_DEPTH) return false;
  s->f[s->depth++] = (tpr_json_frame){.node = n};
  return true;
}

// Literal candidates of a K_LITERALS frame: bit i set while lits[i] still matches.
static uint64_t all_lits(const node *n) { return n->n_lits >= 64 ? ~0ull : (1ull << n->n_lits) - 1; }

static bool literal_complete(const tpr_json_frame *f) {
  const node *n = f->node;
  for (int i = 0; i < n->n_lits; i++)
    if ((f->cand >> i & 1) && (int)strlen(n->lits[i]) == f->pos) return true;
  return false;
}

static bool number_final(const tpr_json_frame *f) {
  return f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC || f->phase == N_EXP;
}

// Whitespace between tokens, as llama.cpp's JSON grammar allows it: nothing,
// one space, or a newline and at most MAX_WS spaces or tabs (an indent).
// f->ws: 0 none yet, 1 a space (no more), 2 + k a newline and k indent bytes.
static int take_ws(tpr_json_frame *f, char c) {
  if (f->ws == 0 && (c == ' ' || c == '\n')) return f->ws = c == ' ' ? 1 : 2, R_TAKEN;
  if (f->ws >= 2 && (c == ' ' || c == '\t') && f->ws < 2 + TPR_JSON_MAX_WS) return f->ws++, R_TAKEN;
  return R_REJECT;
}

// A value of node n starts with byte c (a parent is pushing it): the frame's
// opening phase, or for K_ANY / K_ONE_OF_TYPES the concrete node c selects.
static const node *start_of(const node *n, char c) {
  static node any_obj = {.k = K_OBJECT, .n_props = -1, .max_items = -1},
              any_arr = {.k = K_ARRAY, .n_props = -1, .max_items = -1}, str = {.k = K_STRING, .max_items = -1},
              num = {.k = K_NUMBER};
  static char *tf[] = {"true", "false", "null"};
  static node lits = {.k = K_LITERALS, .n_lits = 3, .lits = tf};
  if (n->k == K_ANY) {
    if (c == '{') return &any_obj;
    if (c == '[') return &any_arr;
    if (c == '"') return &str;
    if (c == '-' || is_digit(c)) return &num;
    if (c == 't' || c == 'f' || c == 'n') return &lits;
    return NULL;
  }
  if (n->k == K_ONE_OF_TYPES) {  // the first alternative whose value can start with c
    for (int i = 0; i < n->n_alts; i++) {
      const node *a = n->alts[i];
      bool can = a->k == K_OBJECT ? c == '{' : a->k == K_ARRAY ? c == '[' : a->k == K_STRING ? c == '"' : false;
      if (a->k == K_NUMBER || a->k == K_INTEGER) can = c == '-' || is_digit(c);
      for (int j = 0; a->k == K_LITERALS && j < a->n_lits; j++) can |= a->lits[j][0] == c;
      if (can) return a;
    }
    return NULL;
  }
  return n;
}

// Pushes the value of node n for its first byte c; false: c cannot start it.
static bool push_value(tpr_json_state *s, const node *n, char c) {
  const node *m = start_of(n, c);
  if (!m || !push(s, m)) return false;
  tpr_json_frame *f = &s->f[s->depth - 1];
  if (m->k == K_LITERALS) f->cand = all_lits(m);
  return true;
}

// The properties a key may name now: those from idx on, up to and including
// the first required one not seen (properties come in the schema's order).
static uint64_t key_candidates(const node *o, const tpr_json_frame *f) {
  uint64_t c = 0;
  for (int i = f->idx; i < o->n_props; i++) {
    c |= 1ull << i;
    if (o->required >> i & 1) break;
  }
  return c;
}

static bool required_left(const node *o, const tpr_json_frame *f) {
  for (int i = f->idx; i < o->n_props; i++)
    if (o->required >> i & 1) return true;
  return false;
}

static int step_object(tpr_json_state *s, tpr_json_frame *f, char c) {
  const node *o = f->node;
  switch (f->phase) {
    case O_OPEN:
      if (c != '{') return R_REJECT;
      f->phase = O_FIRST, f->ws = 0;
      return R_TAKEN;
    case O_FIRST:
    case O_KEY:
      if (c == '}' && f->phase == O_FIRST && !(o->n_props >= 0 && required_left(o, f))) return s->depth--, R_TAKEN;
      if (c != '"') return take_ws(f, c);
      if (o->n_props >= 0 && !key_candidates(o, f)) return R_REJECT;
      f->phase = O_COLON, f->ws = 0;
      if (o->n_props < 0) {  // any key: a string
        static node str = {.k = K_STRING, .max_items = -1};
        if (!push(s, &str)) return R_REJECT;
        s->f[s->depth - 1].phase = S_IN;
        return R_TAKEN;
      }
      // A schema key: the object frame reads it itself, matching the
      // candidate properties' quoted names (cand: the candidates; idx < 0
      // marks the reading, the next property being -1 - idx).
      f->cand = key_candidates(o, f);
      f->pos = 1;  // the quote
      f->idx = -1 - f->idx;
      return R_TAKEN;
    case O_COLON:
      if (f->idx < 0) {  // reading a key: match it against the candidates
        int from = -1 - f->idx;
        uint64_t keep = 0;
        int done = -1;
        for (int i = from; i < o->n_props; i++) {
          if (!(f->cand >> i & 1)) continue;
          const char *k = o->keys[i];
          if (k[f->pos] == c) {
            keep |= 1ull << i;
            if (k[f->pos + 1] == 0) done = i;
          }
        }
        if (!keep) return R_REJECT;
        f->pos++;
        if (done >= 0) {  // the closing quote (keys are quoted, so none is a prefix of another)
          f->idx = done + 1;
          f->cand = (uint64_t)done;  // the property whose value comes
          f->pos = 0;
        } else {
          f->cand = keep;
        }
        return R_TAKEN;
      }
      if (c != ':') return take_ws(f, c);
      f->phase = O_VALUE, f->ws = 0;
      return R_TAKEN;
    case O_VALUE: {
      if (is_ws(c)) return take_ws(f, c);
      static node any = {.k = K_ANY};
      const node *v = o->n_props < 0 ? &any : o->vals[f->cand];
      if (v->k == K_BY_SELECTOR) v = v->alts[f->sel < v->n_alts ? f->sel : 0];
      f->phase = O_AFTER, f->ws = 0;
      if (!push_value(s, v, c)) return R_REJECT;
      return R_POP_REFEED - 10;  // the byte goes to the new frame (see feed_byte)
    }
    case O_AFTER:
      // The value just ended was a literal (its frame is still above the
      // stack's top): remember which, for a property chosen by it.
      if (o->n_props >= 0 && o->vals[f->cand]->k == K_LITERALS && f->ws == 0 && s->depth < TPR_JSON_MAX_DEPTH &&
          s->f[s->depth].node == o->vals[f->cand])
        f->sel = __builtin_ctzll(s->f[s->depth].cand | (1ull << 63));
      if (c == ',') {
        if (o->n_props >= 0 && f->idx >= o->n_props) return R_REJECT;
        return f->phase = O_KEY, f->ws = 0, R_TAKEN;
      }
      if (c == '}') {
        if (o->n_props >= 0 && required_left(o, f)) return R_REJECT;
        return s->depth--, R_TAKEN;
      }
      return take_ws(f, c);
  }
  return R_REJECT;
}

static int step_array(tpr_json_state *s, tpr_json_frame *f, char c) {
  const node *a = f->node;
  static node any = {.k = K_ANY};
  const node *item = a->items ? a->items : &any;
  switch (f->phase) {
    case A_OPEN:
      if (c != '[') return R_REJECT;
      f->phase = A_FIRST, f->ws = 0;
      return R_TAKEN;
    case A_FIRST:
    case A_VALUE:
      if (c == ']' && f->phase == A_FIRST && a->min_items == 0) return s->depth--, R_TAKEN;
      if (is_ws(c)) return take_ws(f, c);
      if (a->max_items >= 0 && f->idx >= a->max_items) return R_REJECT;
      f->phase = A_AFTER, f->ws = 0, f->idx++;
      if (!push_value(s, item, c)) return R_REJECT;
      return R_POP_REFEED - 10;
    case A_AFTER:  // no ',' once maxItems are there (it would lead nowhere)
      if (c == ',') return a->max_items >= 0 && f->idx >= a->max_items ? R_REJECT : (f->phase = A_VALUE, f->ws = 0, R_TAKEN);
      if (c == ']') {
        if (f->idx < a->min_items) return R_REJECT;
        return s->depth--, R_TAKEN;
      }
      return take_ws(f, c);
  }
  return R_REJECT;
}

static bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static int step_string(tpr_json_state *s, tpr_json_frame *f, char c) {
  const unsigned char u = (unsigned char)c;
  switch (f->phase) {
    case S_OPEN:
      if (c != '"') return R_REJECT;
      f->phase = S_IN;
      return R_TAKEN;
    case S_IN: {
      // f->idx counts code points (an escape is one), for minLength / maxLength.
      const node *n = f->node;
      if (c == '"') return f->idx < n->min_items ? R_REJECT : (s->depth--, R_TAKEN);
      if (u < 0x20) return R_REJECT;
      if ((u & 0xc0) != 0x80) {  // not a continuation byte: a new character
        if (n->max_items >= 0 && f->idx >= n->max_items) return R_REJECT;
        f->idx++;
      }
      if (c == '\\') f->phase = S_ESC;
      return R_TAKEN;
    }
    case S_ESC:
      if (c == 'u') return f->phase = S_U, f->pos = 4, f->cand = 0, R_TAKEN;
      return strchr("\"\\/bfnrt", c) && c ? (f->phase = S_IN, R_TAKEN) : R_REJECT;
    case S_U: {
      // \uXXXX: UTF-16 as RFC 8259 writes characters past the BMP, so a
      // high surrogate (D800-DBFF) must be followed by a \u low one
      // (DC00-DFFF), and a low one never comes alone. Parsers such as cJSON
      // and serde_json refuse lone surrogates: output that must parse
      // everywhere cannot hold them. Decided at the second digit, so that
      // no accepted prefix is a dead end (a mask would have nothing to
      // allow after "\udc").
      if (!is_hex(c)) return R_REJECT;
      const uint64_t low_half = f->cand >> 16 & 1;
      const uint64_t digit = (uint64_t)(is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
      f->cand = (((f->cand & 0xffff) << 4) | digit) | low_half << 16;
      const int seen = 5 - f->pos;  // digits read, this one included
      if (seen == 1 && low_half && digit != 0xd) return R_REJECT;
      if (seen == 2) {
        const uint64_t top = f->cand & 0xff;  // the first two digits
        if (low_half != (top >= 0xdc && top <= 0xdf)) return R_REJECT;
      }
      if (--f->pos > 0) return R_TAKEN;
      const uint64_t v = f->cand & 0xffff;
      f->cand = 0;
      f->phase = !low_half && v >= 0xd800 && v <= 0xdbff ? S_LO_BS : S_IN;
      return R_TAKEN;
    }
    case S_LO_BS:  // the pair's second escape: part of the same character (f->idx unchanged)
      return c == '\\' ? (f->phase = S_LO_U, R_TAKEN) : R_REJECT;
    case S_LO_U:
      return c == 'u' ? (f->phase = S_U, f->pos = 4, f->cand = 1ull << 16, R_TAKEN) : R_REJECT;
  }
  return R_REJECT;
}

static int step_number(tpr_json_state *s, tpr_json_frame *f, char c) {
  const bool integer = ((const node *)f->node)->k == K_INTEGER;
  int next = -1;
  switch (f->phase) {
    case N_START:
      next = c == '-' ? N_SIGN : c == '0' ? N_ZERO : is_digit(c) ? N_INT : -1;
      break;
    case N_SIGN: next = c == '0' ? N_ZERO : is_digit(c) ? N_INT : -1; break;
    case N_ZERO:
    case N_INT:
      if (f->phase == N_INT && is_digit(c)) next = N_INT;
      else if (!integer && c == '.') next = N_FRAC0;
      else if (!integer && (c == 'e' || c == 'E')) next = N_EXP0;
      break;
    case N_FRAC0: next = is_digit(c) ? N_FRAC : -1; break;
    case N_FRAC: next = is_digit(c) ? N_FRAC : (c == 'e' || c == 'E') ? N_EXP0 : -1; break;
    case N_EXP0: next = (c == '+' || c == '-') ? N_EXPS : is_digit(c) ? N_EXP : -1; break;
    case N_EXPS: next = is_digit(c) ? N_EXP : -1; break;
    case N_EXP: next = is_digit(c) ? N_EXP : -1; break;
  }
  if (next < 0) {
    if (!number_final(f)) return R_REJECT;
    s->depth--;
    return R_POP_REFEED;
  }
  if (++f->pos > TPR_JSON_MAX_NUMBER) return R_REJECT;
  f->phase = next;
  return R_TAKEN;
}

static int step_literals(tpr_json_state *s, tpr_json_frame *f, char c) {
  const node *n = f->node;
  uint64_t keep = 0;
  for (int i = 0; i < n->n_lits; i++)
    if ((f->cand >> i & 1) && n->lits[i][f->pos] == c) keep |= 1ull << i;
  if (!keep) {  // none goes on: the value ended before c, if one was whole
    if (!literal_complete(f)) return R_REJECT;
    s->depth--;
    return R_POP_REFEED;
  }
  f->cand = keep, f->pos++, f->ws = 0;
  // whole and no candidate longer: done now (a string literal's closing quote, true, ...)
  bool longer = false;
  for (int i = 0; i < n->n_lits; i++)
    if ((keep >> i & 1) && n->lits[i][f->pos]) longer = true;
  if (!longer) s->depth--;
  return R_TAKEN;
}

static int step_seq(tpr_json_state *s, tpr_json_frame *f, char c) {
  const node *q = f->node;
  (void)c;
  // Push the next part; the byte goes to it.
  while (f->phase < Q_DONE) {
    const node *part = f->phase == Q_PRE ? q->pre : f->phase == Q_INNER ? q->inner : q->suf;
    f->phase++;
    if (!part) continue;
    if (part->k == K_LITERALS) {
      if (!push(s, part)) return R_REJECT;
      s->f[s->depth - 1].cand = all_lits(part);
    } else if (!push_value(s, part, c)) {
      return R_REJECT;
    }
    return R_POP_REFEED - 10;
  }
  return R_REJECT;  // after the suffix nothing may follow
}

static int step(tpr_json_state *s, char c) {
  tpr_json_frame *f = &s->f[s->depth - 1];
  switch (((const node *)f->node)->k) {
    case K_OBJECT: return step_object(s, f, c);
    case K_ARRAY: return step_array(s, f, c);
    case K_STRING: return step_string(s, f, c);
    case K_NUMBER:
    case K_INTEGER: return step_number(s, f, c);
    case K_LITERALS: return step_literals(s, f, c);
    case K_SEQ: return step_seq(s, f, c);
    case K_BY_SELECTOR: return R_REJECT;  // resolved by its object before it is pushed
    case K_ANY:
    case K_ONE_OF_TYPES: {  // the root only: resolve to the concrete node
      s->depth--;
      if (!push_value(s, f->node, c)) return R_REJECT;
      return R_POP_REFEED - 10;
    }
  }
  return R_REJECT;
}

static bool feed_byte(tpr_json_state *s, char c) {
  for (int guard = 0; guard < 4 * TPR_JSON_MAX_DEPTH; guard++) {
    if (s->depth == 0) return false;  // the value is complete: nothing may follow
    int r = step(s, c);
    if (r == R_TAKEN) return true;
    if (r == R_REJECT) return false;
    // R_POP_REFEED: a frame ended before c; R_POP_REFEED - 10: a frame was pushed for c. Either way c goes on.
  }
  return false;
}

void tpr_json_state_init(tpr_json_state *s, const tpr_json_grammar *g) {
  memset(s, 0, sizeof *s);
  s->depth = 1;
  s->f[0].node = g->root;
  if (g->root->k == K_LITERALS) s->f[0].cand = all_lits(g->root);
}

bool tpr_json_state_feed(tpr_json_state *s, const char *bytes, size_t n) {
  if (s->dead) return false;
  for (size_t i = 0; i < n; i++)
    if (!feed_byte(s, bytes[i])) return s->dead = true, false;
  return true;
}

bool tpr_json_state_complete(const tpr_json_state *s) {
  if (s->dead) return false;
  // Open frames may end here only if each can end without another byte: a
  // whole number or literal on top, and a sequence with nothing left.
  for (int i = s->depth - 1; i >= 0; i--) {
    const tpr_json_frame *f = &s->f[i];
    const node *n = f->node;
    if (n->k == K_NUMBER || n->k == K_INTEGER) {
      if (i != s->depth - 1 || !number_final(f)) return false;
    } else if (n->k == K_LITERALS) {
      if (i != s->depth - 1 || !literal_complete(f)) return false;
    } else if (n->k == K_SEQ) {
      const node *q = n;
      if (f->phase < Q_DONE && !(f->phase == Q_SUF && !q->suf)) return false;
    } else {
      return false;
    }
  }
  return true;
}

// A frame's words: node; phase and idx; pos and ws; cand; sel. A string's or an array's idx is only compared with
// min_items and, when there is one, max_items (idx never exceeds it): with
// no maximum, every count from min_items on behaves alike.
static int frame_key(const tpr_json_frame *f, uint64_t *key) {
  const node *n = f->node;
  int32_t idx = f->idx;
  if ((n->k == K_STRING || n->k == K_ARRAY) && n->max_items < 0 && idx > n->min_items) idx = n->min_items;
  key[0] = (uint64_t)(uintptr_t)n;
  key[1] = (uint64_t)(uint32_t)f->phase << 32 | (uint32_t)idx;
  key[2] = (uint64_t)(uint32_t)f->pos << 32 | (uint32_t)f->ws;
  key[3] = f->cand;
  key[4] = (uint32_t)f->sel;
  return 5;
}

int tpr_json_state_key(const tpr_json_state *s, uint64_t *key) {
  int k = 0;
  key[k++] = (uint64_t)(uint32_t)s->depth << 2 | (uint64_t)s->done << 1 | (uint64_t)s->dead;
  if (s->dead) return k;
  key[k++] = 0;  // the frame above the top: none, or 1 and its words
  for (int i = 0; i < s->depth; i++) k += frame_key(&s->f[i], key + k);
  // An object whose value just ended reads the popped frame on the next byte (O_AFTER).
  const tpr_json_frame *top = s->depth > 0 ? &s->f[s->depth - 1] : NULL;
  if (top && s->depth < TPR_JSON_MAX_DEPTH && ((const node *)top->node)->k == K_OBJECT && top->phase == O_AFTER &&
      top->ws == 0 && s->f[s->depth].node) {
    key[1] = 1;
    k += frame_key(&s->f[s->depth], key + k);
  }
  return k;
}
