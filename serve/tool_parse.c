// The output parser of tool_parse.h: a small state machine over a pending
// buffer. In content it looks for `<think>` (reasoning on) and the format's
// start tag; in reasoning for `</think>`; inside a call block for the end
// tag, then hands the block's text to the format's parse function. Bytes
// that may begin a tag wait until the next feed decides.
#include "serve/tool_parse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { S_CONTENT = 0, S_REASONING = 1, S_CALL = 2 };

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

// --- buffers ---------------------------------------------------------------------

static void buf_add(tpr_out_parser *p, tpr_text_buf *b, const char *s, size_t n) {
  if (!n) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) cap *= 2;
    char *t = realloc(b->s, cap);
    if (!t) {
      p->oom = true;
      return;
    }
    b->s = t, b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = 0;
}

static void buf_drop_front(tpr_text_buf *b, size_t n) {
  if (!n) return;
  memmove(b->s, b->s + n, b->len - n);
  b->len -= n;
  if (b->s) b->s[b->len] = 0;
}

static bool add_call(tpr_out_parser *p, const char *name, size_t name_len, char *arguments) {
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

bool tpr_text_blank(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isspace((unsigned char)s[i])) return false;
  return true;
}

// Python's str.strip(): [*b, *e) without leading and trailing whitespace.
static void strip(const char **b, const char **e) {
  while (*b < *e && isspace((unsigned char)**b)) (*b)++;
  while (*e > *b && isspace((unsigned char)(*e)[-1])) (*e)--;
}

static const char *find_in(const char *s, const char *e, const char *needle) {
  size_t m = strlen(needle);
  for (const char *q = s; q + m <= e; q++)
    if (*q == needle[0] && memcmp(q, needle, m) == 0) return q;
  return NULL;
}

// --- Hermes / Qwen: a JSON object {"name", "arguments"} per block -------------

static int parse_hermes(tpr_out_parser *p, const char *s, size_t n) {
  const char *b = s, *e = s + n;
  strip(&b, &e);
  cJSON *j = cJSON_ParseWithLength(b, (size_t)(e - b));
  const cJSON *name = j ? cJSON_GetObjectItemCaseSensitive(j, "name") : NULL;
  if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !name->valuestring[0]) {
    cJSON_Delete(j);
    return 0;
  }
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
  if (!args) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");  // an older spelling some models emit
  // vLLM: json.dumps(arguments); absent arguments: an empty object.
  char *a = args ? cJSON_PrintUnformatted(args) : strdup("{}");
  bool ok = a && add_call(p, name->valuestring, strlen(name->valuestring), a);
  if (!ok) free(a), p->oom = true;
  cJSON_Delete(j);
  return ok;
}

// --- MiniMax-M2: <invoke name="f"><parameter name="p">value</parameter></invoke> --

// vLLM's _extract_name: stripped, one pair of surrounding quotes removed.
static void unquote(const char **b, const char **e) {
  strip(b, e);
  if (*e - *b >= 2 && (**b == '"' || **b == '\'') && (*e)[-1] == **b) (*b)++, (*e)--;
}

// The JSON schema type of parameter pname of tool fname ("string" when the
// tools do not say, as vLLM defaults). A list of types: its first that is
// not "null".
static const char *param_type(const cJSON *tools, const char *fname, const char *pname) {
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
    return "string";
  }
  return "string";
}

static bool is_one_of(const char *t, const char *a, const char *b, const char *c) {
  return !strcasecmp(t, a) || !strcasecmp(t, b) || (c && !strcasecmp(t, c));
}

// vLLM's _convert_param_value: "null" (any case) is null; then by the
// schema's type; a value that does not convert stays a string.
static cJSON *convert_value(const char *v, const char *type) {
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

// One <invoke name=...>...</invoke>'s inside (after "<invoke name="): the
// call, or false when it does not parse.
static bool parse_invoke(tpr_out_parser *p, const char *s, const char *e) {
  const char *gt = memchr(s, '>', (size_t)(e - s));
  if (!gt) return false;
  const char *nb = s, *ne = gt;
  unquote(&nb, &ne);
  if (nb == ne) return false;
  char *fname = strndup(nb, (size_t)(ne - nb));
  cJSON *args = cJSON_CreateObject();
  bool ok = fname && args;
  static const char PSTART[] = "<parameter name=", PEND[] = "</parameter>";
  for (const char *q = gt + 1; ok && (q = find_in(q, e, PSTART));) {
    q += sizeof PSTART - 1;
    const char *pe = find_in(q, e, PEND), *pg = pe ? memchr(q, '>', (size_t)(pe - q)) : NULL;
    if (!pe || !pg) {
      ok = false;
      break;
    }
    const char *kb = q, *ke = pg, *vb = pg + 1, *ve = pe;
    unquote(&kb, &ke);
    strip(&vb, &ve);
    char *key = strndup(kb, (size_t)(ke - kb)), *val = strndup(vb, (size_t)(ve - vb));
    cJSON *v = key && val ? convert_value(val, param_type(p->tools, fname, key)) : NULL;
    if (v && cJSON_GetObjectItemCaseSensitive(args, key)) cJSON_ReplaceItemInObjectCaseSensitive(args, key, v);
    else if (v) cJSON_AddItemToObject(args, key, v);
    ok = v != NULL;
    free(key), free(val);
    q = pe + sizeof PEND - 1;
  }
  char *a = ok ? cJSON_PrintUnformatted(args) : NULL;
  ok = a && add_call(p, fname, strlen(fname), a);
  if (!ok) free(a);
  free(fname);
  cJSON_Delete(args);
  return ok;
}

static int parse_minimax_m2(tpr_out_parser *p, const char *s, size_t n) {
  static const char ISTART[] = "<invoke name=", IEND[] = "</invoke>";
  const char *e = s + n;
  int first = p->n_calls, found = 0;
  for (const char *q = s; (q = find_in(q, e, ISTART));) {
    q += sizeof ISTART - 1;
    const char *ie = find_in(q, e, IEND);
    if (!ie || !parse_invoke(p, q, ie)) {
      found = 0;
      break;
    }
    found++;
    q = ie + sizeof IEND - 1;
  }
  if (!found) {  // the whole block becomes content: drop what it added
    for (int i = first; i < p->n_calls; i++) free(p->calls[i].name), free(p->calls[i].arguments);
    p->n_calls = first;
  }
  return found;
}

// --- the table of formats ---------------------------------------------------------

// To add a format: an enum value in tool_parse.h and a row here. parse gets
// the text between start and end and appends the calls it holds (returns
// how many; 0: the block is not a call and stays content).
static const struct format {
  const char *name, *start, *end;
  int (*parse)(tpr_out_parser *p, const char *s, size_t n);
} formats[TPR_TOOL_FMT_COUNT] = {
    [TPR_TOOL_FMT_NONE] = {"none", NULL, NULL, NULL},
    [TPR_TOOL_FMT_HERMES] = {"hermes", "<tool_call>", "</tool_call>", parse_hermes},
    [TPR_TOOL_FMT_MINIMAX_M2] = {"minimax_m2", "<minimax:tool_call>", "</minimax:tool_call>", parse_minimax_m2},
};

const char *tpr_tool_format_name(tpr_tool_format f) {
  return f >= 0 && f < TPR_TOOL_FMT_COUNT ? formats[f].name : "?";
}

bool tpr_tool_format_parse(const char *s, tpr_tool_format *out) {
  for (int f = 0; f < TPR_TOOL_FMT_COUNT; f++)
    if (!strcmp(s, formats[f].name)) return *out = (tpr_tool_format)f, true;
  return false;
}

tpr_tool_format tpr_tool_format_detect(const char *t) {
  // The longer tag first: "<minimax:tool_call>" does not contain "<tool_call>", but check it first anyway.
  if (t && strstr(t, "<minimax:tool_call>")) return TPR_TOOL_FMT_MINIMAX_M2;
  if (t && strstr(t, "<tool_call>")) return TPR_TOOL_FMT_HERMES;
  return TPR_TOOL_FMT_NONE;
}

bool tpr_reasoning_detect(const char *t) { return t && strstr(t, THINK_OPEN) != NULL; }

bool tpr_prompt_opens_think(const char *prompt) {
  if (!prompt) return false;
  size_t n = strlen(prompt);
  while (n && isspace((unsigned char)prompt[n - 1])) n--;
  size_t m = sizeof THINK_OPEN - 1;
  return n >= m && memcmp(prompt + n - m, THINK_OPEN, m) == 0;
}

// --- the state machine ------------------------------------------------------------

void tpr_out_parser_init(tpr_out_parser *p, tpr_tool_format fmt, bool reasoning, bool starts_in_reasoning,
                         const cJSON *tools) {
  memset(p, 0, sizeof *p);
  p->fmt = fmt >= 0 && fmt < TPR_TOOL_FMT_COUNT ? fmt : TPR_TOOL_FMT_NONE;
  p->reasoning = reasoning;
  p->tools = tools;
  p->state = reasoning && starts_in_reasoning ? S_REASONING : S_CONTENT;
}

// The length of the longest suffix of s[0, n) that is a proper prefix of tag.
static size_t partial_tag(const char *s, size_t n, const char *tag) {
  size_t m = strlen(tag);
  for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
    if (memcmp(s + n - k, tag, k) == 0) return k;
  return 0;
}

static const char *find_tag(const tpr_text_buf *b, const char *tag) {
  return tag ? find_in(b->s, b->s + b->len, tag) : NULL;
}

// One step; false: nothing more to do until more bytes come.
static bool step(tpr_out_parser *p) {
  tpr_text_buf *b = &p->pending;
  const struct format *f = &formats[p->fmt];
  if (!b->len) return false;
  if (p->state == S_CONTENT) {
    const char *th = p->reasoning ? find_tag(b, THINK_OPEN) : NULL, *tc = find_tag(b, f->start);
    const char *at = th && (!tc || th < tc) ? th : tc;
    if (at) {
      buf_add(p, &p->content, b->s, (size_t)(at - b->s));
      buf_drop_front(b, (size_t)(at - b->s) + strlen(at == th ? THINK_OPEN : f->start));
      p->state = at == th ? S_REASONING : S_CALL;
      return true;
    }
    size_t h1 = p->reasoning ? partial_tag(b->s, b->len, THINK_OPEN) : 0, h2 = f->start ? partial_tag(b->s, b->len, f->start) : 0;
    size_t hold = h1 > h2 ? h1 : h2;
    buf_add(p, &p->content, b->s, b->len - hold);
    buf_drop_front(b, b->len - hold);
    return false;
  }
  if (p->state == S_REASONING) {
    const char *at = find_tag(b, THINK_CLOSE);
    if (at) {
      buf_add(p, &p->reasoning_text, b->s, (size_t)(at - b->s));
      buf_drop_front(b, (size_t)(at - b->s) + sizeof THINK_CLOSE - 1);
      p->state = S_CONTENT;
      return true;
    }
    size_t hold = partial_tag(b->s, b->len, THINK_CLOSE);
    buf_add(p, &p->reasoning_text, b->s, b->len - hold);
    buf_drop_front(b, b->len - hold);
    return false;
  }
  const char *at = find_tag(b, f->end);  // S_CALL: the block waits whole for its end tag
  if (!at) return false;
  size_t body = (size_t)(at - b->s);
  if (f->parse(p, b->s, body) <= 0) {  // not a call: the block as it was generated
    buf_add(p, &p->content, f->start, strlen(f->start));
    buf_add(p, &p->content, b->s, body + strlen(f->end));
  }
  buf_drop_front(b, body + strlen(f->end));
  p->state = S_CONTENT;
  return true;
}

void tpr_out_parser_feed(tpr_out_parser *p, const char *s, size_t n) {
  buf_add(p, &p->pending, s, n);
  while (step(p)) {
  }
}

void tpr_out_parser_finish(tpr_out_parser *p) {
  tpr_text_buf *b = &p->pending;
  if (p->state == S_REASONING) {
    buf_add(p, &p->reasoning_text, b->s, b->len);
  } else {
    if (p->state == S_CALL) buf_add(p, &p->content, formats[p->fmt].start, strlen(formats[p->fmt].start));
    buf_add(p, &p->content, b->s, b->len);
  }
  b->len = 0;
  p->state = S_CONTENT;
}

void tpr_out_parser_free(tpr_out_parser *p) {
  free(p->pending.s), free(p->content.s), free(p->reasoning_text.s);
  for (int i = 0; i < p->n_calls; i++) free(p->calls[i].name), free(p->calls[i].arguments);
  free(p->calls);
  memset(p, 0, sizeof *p);
}
