// Tool-call formats whose arguments are JSON (tool_formats.h), and the
// helpers every format shares. Each follows the vLLM parser of the same
// name: what counts as a call, the name, the arguments (re-serialized as
// compact JSON; absent: {}).
#define _GNU_SOURCE
#include "serve/tool_formats.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// --- helpers -----------------------------------------------------------------------

bool tool_add_call(tpr_out_parser *p, const char *name, size_t name_len, char *arguments) {
  if (p->n_calls == p->cap_calls) {
    int cap = p->cap_calls ? 2 * p->cap_calls : 4;
    tpr_tool_call *c = realloc(p->calls, (size_t)cap * sizeof *c);
    if (!c) return false;
    p->calls = c, p->cap_calls = cap;
  }
  char *nm = strndup(name, name_len);
  if (!nm) return false;
  p->calls[p->n_calls++] = (tpr_tool_call){.name = nm, .arguments = arguments};
  return true;
}

void tool_drop_calls(tpr_out_parser *p, int first) {
  for (int i = first; i < p->n_calls; i++) free(p->calls[i].name), free(p->calls[i].arguments);
  if (first < p->n_calls) p->n_calls = first;
}

void tool_strip(const char **b, const char **e) {
  while (*b < *e && isspace((unsigned char)**b)) (*b)++;
  while (*e > *b && isspace((unsigned char)(*e)[-1])) (*e)--;
}

const char *tool_find(const char *s, const char *e, const char *needle) {
  size_t m = strlen(needle);
  for (const char *q = s; q + m <= e; q++)
    if (*q == needle[0] && memcmp(q, needle, m) == 0) return q;
  return NULL;
}

void tool_unquote(const char **b, const char **e) {
  tool_strip(b, e);
  if (*e - *b >= 2 && (**b == '"' || **b == '\'') && (*e)[-1] == **b) (*b)++, (*e)--;
}

const char *tool_param_type(const cJSON *tools, const char *fname, const char *pname, const char *fallback) {
  const cJSON *t;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (!cJSON_IsString(nm) || strcmp(nm->valuestring, fname) != 0) continue;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "parameters"),
                                                          "properties");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, pname), "type");
    if (cJSON_IsString(ty)) return ty->valuestring;
    const cJSON *x;
    cJSON_ArrayForEach(x, ty) {
      if (cJSON_IsString(x) && strcmp(x->valuestring, "null") != 0) return x->valuestring;
    }
    return fallback;
  }
  return fallback;
}

static bool is_one_of(const char *t, const char *a, const char *b, const char *c) {
  return !strcasecmp(t, a) || !strcasecmp(t, b) || (c && !strcasecmp(t, c));
}

cJSON *tool_convert_value(const char *v, const char *type) {
  if (!strcasecmp(v, "null")) return cJSON_CreateNull();
  if (is_one_of(type, "string", "str", "text")) return cJSON_CreateString(v);
  char *end = NULL;
  if (is_one_of(type, "integer", "int", NULL)) {
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (v[0] && !*end && !errno) return cJSON_CreateNumber((double)x);
    return cJSON_CreateString(v);
  }
  if (is_one_of(type, "number", "float", NULL)) {
    double x = strtod(v, &end);
    if (v[0] && !*end && isfinite(x)) return cJSON_CreateNumber(x);  // cJSON prints an integral value as one
    return cJSON_CreateString(v);
  }
  if (is_one_of(type, "boolean", "bool", NULL)) return cJSON_CreateBool(!strcasecmp(v, "true") || !strcmp(v, "1"));
  cJSON *j = cJSON_Parse(v);  // object, array, or a type vLLM does not name: JSON if it is JSON
  return j ? j : cJSON_CreateString(v);
}

int tool_each_block(tpr_out_parser *p, const char *s, const char *e, const char *open, const char *close,
                    tool_block_fn one, const void *ctx) {
  int first = p->n_calls, found = 0;
  size_t no = strlen(open), nc = strlen(close);
  for (const char *q = s; (q = tool_find(q, e, open));) {
    q += no;
    const char *c = tool_find(q, e, close);
    if (!c || !one(p, q, c, ctx)) {
      tool_drop_calls(p, first);
      return 0;
    }
    found++;
    q = c + nc;
  }
  return found;
}

bool tool_add_object_call(tpr_out_parser *p, const char *name, size_t name_len, cJSON *args) {
  char *a = args ? cJSON_PrintUnformatted(args) : strdup("{}");
  bool ok = a && tool_add_call(p, name, name_len, a);
  if (!ok) free(a), p->oom = true;
  return ok;
}

// A JSON value's compact text from [b, e) (surrounding whitespace allowed);
// NULL when it is not JSON. Empty: {}.
static cJSON *json_of(const char *b, const char *e) {
  tool_strip(&b, &e);
  if (b == e) return cJSON_CreateObject();
  return cJSON_ParseWithLength(b, (size_t)(e - b));
}

// One {"name": ..., "arguments"|"parameters": ...} object as a call.
static bool add_named_object(tpr_out_parser *p, const cJSON *j) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
  if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !name->valuestring[0]) return false;
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
  if (!args) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");  // Llama 3's spelling, and older Hermes
  return tool_add_object_call(p, name->valuestring, strlen(name->valuestring), (cJSON *)args);
}

// --- Hermes / Qwen2.5 / Qwen3: <tool_call>{"name", "arguments"}</tool_call> -----

int tool_parse_hermes(tpr_out_parser *p, const char *s, size_t n) {
  cJSON *j = json_of(s, s + n);
  int found = j && add_named_object(p, j);
  cJSON_Delete(j);
  return found;
}

// --- Llama 3.1/3.2/3.3: the answer is {"name", "parameters"} objects joined by "; " --

int tool_parse_llama3_json(tpr_out_parser *p, const char *s, size_t n) {
  static const char PYTHON_TAG[] = "<|python_tag|>";
  char *text = strndup(s, n);
  if (!text) return p->oom = true, 0;
  const char *q = text;
  if (!strncmp(q, PYTHON_TAG, sizeof PYTHON_TAG - 1)) q += sizeof PYTHON_TAG - 1;
  int first = p->n_calls, found = 0;
  while (1) {
    while (isspace((unsigned char)*q)) q++;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(q, &end, false);
    bool ok = j && add_named_object(p, j);
    cJSON_Delete(j);
    if (!ok) {
      found = 0;
      break;
    }
    found++;
    q = end;
    while (isspace((unsigned char)*q)) q++;
    if (!*q) break;
    if (*q != ';') {
      found = 0;
      break;
    }
    q++;
  }
  if (!found) tool_drop_calls(p, first);
  free(text);
  return found;
}

// --- Mistral: [TOOL_CALLS] then a JSON list, or name[ARGS]{...} per [TOOL_CALLS] --

int tool_parse_mistral(tpr_out_parser *p, const char *s, size_t n) {
  static const char TAG[] = "[TOOL_CALLS]", ARGS[] = "[ARGS]", CALL_ID[] = "[CALL_ID]";
  const char *b = s, *e = s + n;
  tool_strip(&b, &e);
  int first = p->n_calls, found = 0;
  if (b < e && *b == '[') {  // before tokenizer v11: a JSON list of {"name", "arguments"}
    cJSON *list = cJSON_ParseWithLength(b, (size_t)(e - b)), *j;
    bool ok = cJSON_IsArray(list);
    cJSON_ArrayForEach(j, list) {
      if (!(ok = ok && add_named_object(p, j))) break;
      found++;
    }
    cJSON_Delete(list);
    if (!ok) found = 0;
  } else {  // v11 and later: name[ARGS]{json}, calls separated by [TOOL_CALLS]
    for (const char *q = b; q < e;) {
      const char *next = tool_find(q, e, TAG), *ce = next ? next : e;
      const char *a = tool_find(q, ce, ARGS);
      if (!a) {
        found = 0;
        break;
      }
      const char *nb = q, *ne = a, *id = tool_find(q, a, CALL_ID);
      if (id) ne = id;
      tool_strip(&nb, &ne);
      cJSON *args = json_of(a + sizeof ARGS - 1, ce);
      bool ok = nb < ne && cJSON_IsObject(args) && tool_add_object_call(p, nb, (size_t)(ne - nb), args);
      cJSON_Delete(args);
      if (!ok) {
        found = 0;
        break;
      }
      found++;
      q = next ? next + sizeof TAG - 1 : e;
    }
  }
  if (!found) tool_drop_calls(p, first);
  return found;
}

// --- calls between two markers: ID sep ARGS end (Kimi K2, DeepSeek V3.x) ------------

typedef struct marked {
  const char *sep;
  bool (*name_of)(const char **b, const char **e);
} marked;

// One `ID sep ARGS` (the inside of open ... close): name_of turns ID into the name.
static bool marked_call(tpr_out_parser *p, const char *b, const char *e, const void *ctx) {
  const marked *m = ctx;
  const char *sep = tool_find(b, e, m->sep), *nb = b, *ne = sep;
  if (!sep || !m->name_of(&nb, &ne)) return false;
  cJSON *args = json_of(sep + strlen(m->sep), e);
  bool ok = cJSON_IsObject(args) && tool_add_object_call(p, nb, (size_t)(ne - nb), args);
  cJSON_Delete(args);
  return ok;
}

// "functions.get_weather:0" -> "get_weather" (vLLM's kimi_k2 parser).
static bool kimi_name(const char **b, const char **e) {
  tool_strip(b, e);
  const char *colon = memchr(*b, ':', (size_t)(*e - *b));
  if (colon) *e = colon;
  for (const char *q = *e; q > *b; q--)
    if (q[-1] == '.') {
      *b = q;
      break;
    }
  return *b < *e;
}

int tool_parse_kimi_k2(tpr_out_parser *p, const char *s, size_t n) {
  static const marked m = {"<|tool_call_argument_begin|>", kimi_name};
  return tool_each_block(p, s, s + n, "<|tool_call_begin|>", "<|tool_call_end|>", marked_call, &m);
}

// V3.1: name<｜tool▁sep｜>{args}; V3 and R1: function<｜tool▁sep｜>name\n```json\n{args}\n```
// (then the name is not before the sep: the older form is tried instead).
static bool deepseek_name(const char **b, const char **e) {
  tool_strip(b, e);
  return *b < *e && !(*e - *b == 8 && !strncmp(*b, "function", 8));
}

static const char DS_OPEN[] = "<｜tool▁call▁begin｜>", DS_SEP[] = "<｜tool▁sep｜>", DS_CLOSE[] = "<｜tool▁call▁end｜>";

// V3 / R1: "function" before the sep, the name after it, then the fenced arguments.
static bool deepseek_fenced_call(tpr_out_parser *p, const char *b, const char *e, const void *ctx) {
  (void)ctx;
  const char *m = tool_find(b, e, DS_SEP), *tb = b, *te = m;
  if (!m) return false;
  tool_strip(&tb, &te);
  if (te - tb != 8 || strncmp(tb, "function", 8)) return false;
  const char *nb = m + sizeof DS_SEP - 1, *ne = tool_find(nb, e, "\n");
  const char *fb = ne ? tool_find(ne, e, "```json") : NULL, *fe = fb ? tool_find(fb + 7, e, "```") : NULL;
  if (!fe) return false;
  tool_strip(&nb, &ne);
  cJSON *args = json_of(fb + 7, fe);
  bool ok = nb < ne && cJSON_IsObject(args) && tool_add_object_call(p, nb, (size_t)(ne - nb), args);
  cJSON_Delete(args);
  return ok;
}

int tool_parse_deepseek(tpr_out_parser *p, const char *s, size_t n) {
  static const marked m = {DS_SEP, deepseek_name};
  int got = tool_each_block(p, s, s + n, DS_OPEN, DS_CLOSE, marked_call, &m);
  return got ? got : tool_each_block(p, s, s + n, DS_OPEN, DS_CLOSE, deepseek_fenced_call, NULL);
}
