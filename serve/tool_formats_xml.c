// Tool-call formats that spell each argument in tags (tool_formats.h): the
// values are text, typed by the tool's JSON schema as the vLLM parser of the
// same name types them.
#define _GNU_SOURCE
#include "serve/tool_formats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Sets args[key] = value (a later duplicate key wins, as a Python dict).
static bool put(cJSON *args, const char *key, cJSON *v) {
  if (!v) return false;
  if (cJSON_GetObjectItemCaseSensitive(args, key)) cJSON_ReplaceItemInObjectCaseSensitive(args, key, v);
  else cJSON_AddItemToObject(args, key, v);
  return true;
}

// key [kb, ke) = value [vb, ve), typed by the schema of fname (or, where
// the schema does not name the parameter, by `untyped`).
static bool put_typed(const tpr_out_parser *p, cJSON *args, const char *fname, const char *kb, const char *ke,
                      const char *vb, const char *ve, const char *untyped) {
  char *key = strndup(kb, (size_t)(ke - kb)), *val = strndup(vb, (size_t)(ve - vb));
  bool ok = key && val && put(args, key, tool_convert_value(val, tool_param_type(p->tools, fname, key, untyped)));
  free(key), free(val);
  return ok;
}

// Adds name(args) and frees args; false: it failed (args freed too).
static bool finish_call(tpr_out_parser *p, const char *nb, const char *ne, cJSON *args, bool ok) {
  ok = ok && nb < ne && tool_add_object_call(p, nb, (size_t)(ne - nb), args);
  cJSON_Delete(args);
  return ok;
}

// --- one call as name> then <PSTART key>value</parameter> (MiniMax-M2, Qwen3-Coder) --

typedef struct param_tags {
  const char *pstart;  // "<parameter name=" or "<parameter="
  bool strip_value;    // MiniMax-M2: the value stripped; Qwen3-Coder: one newline at each end is layout
} param_tags;

// The inside of one call block: the name up to '>' (quotes and spaces
// around it dropped), then each parameter, typed by the schema.
static bool params_call(tpr_out_parser *p, const char *s, const char *e, const void *ctx) {
  static const char PEND[] = "</parameter>";
  const param_tags *t = ctx;
  const char *gt = memchr(s, '>', (size_t)(e - s));
  if (!gt) return false;
  const char *nb = s, *ne = gt;
  tool_unquote(&nb, &ne);
  char *fname = strndup(nb, (size_t)(ne - nb));
  cJSON *args = cJSON_CreateObject();
  bool ok = fname && args;
  for (const char *q = gt + 1; ok && (q = tool_find(q, e, t->pstart));) {
    q += strlen(t->pstart);
    const char *pe = tool_find(q, e, PEND), *pg = pe ? memchr(q, '>', (size_t)(pe - q)) : NULL;
    if (!pe || !pg) {
      ok = false;
      break;
    }
    const char *kb = q, *ke = pg, *vb = pg + 1, *ve = pe;
    tool_unquote(&kb, &ke);
    if (t->strip_value) {
      tool_strip(&vb, &ve);
    } else {
      if (vb < ve && *vb == '\n') vb++;
      if (ve > vb && ve[-1] == '\n') ve--;
    }
    ok = put_typed(p, args, fname, kb, ke, vb, ve, "string");
    q = pe + sizeof PEND - 1;
  }
  ok = finish_call(p, nb, ne, args, ok);
  free(fname);
  return ok;
}

// MiniMax-M2: <invoke name="f"><parameter name="p">value</parameter></invoke>...
int tool_parse_minimax_m2(tpr_out_parser *p, const char *s, size_t n) {
  static const param_tags t = {"<parameter name=", true};
  return tool_each_block(p, s, s + n, "<invoke name=", "</invoke>", params_call, &t);
}

// Qwen3-Coder, Qwen3.5: <function=f>\n<parameter=p>\nvalue\n</parameter>\n</function> (vLLM's qwen3_coder).
int tool_parse_qwen3_coder(tpr_out_parser *p, const char *s, size_t n) {
  static const param_tags t = {"<parameter=", false};
  return tool_each_block(p, s, s + n, "<function=", "</function>", params_call, &t);
}

// --- arg_key/arg_value pairs after the name (GLM-4.5/4.6/4.7, Hunyuan Hy3) ---------

// name [nb, ne), then <arg_key>k</arg_key><arg_value>v</arg_value>... up to e.
// Values are stripped; one the schema does not type as a string is JSON when
// it parses as JSON (vLLM's glm4_moe parser).
// sfx: the tags' suffix (Hy3: ":opensource"; else "").
static bool key_value_call(tpr_out_parser *p, const char *nb, const char *ne, const char *q, const char *e,
                           const char *sfx) {
  char KS[48], KE[48], VS[48], VE[48];
  snprintf(KS, sizeof KS, "<arg_key%s>", sfx), snprintf(KE, sizeof KE, "</arg_key%s>", sfx);
  snprintf(VS, sizeof VS, "<arg_value%s>", sfx), snprintf(VE, sizeof VE, "</arg_value%s>", sfx);
  tool_strip(&nb, &ne);
  char *fname = strndup(nb, (size_t)(ne - nb));
  cJSON *args = cJSON_CreateObject();
  bool ok = fname && args;
  while (ok && (q = tool_find(q, e, KS))) {
    const char *kb = q + strlen(KS), *ke = tool_find(kb, e, KE);
    const char *vs = ke ? tool_find(ke, e, VS) : NULL, *vb = vs ? vs + strlen(VS) : NULL;
    const char *ve = vb ? tool_find(vb, e, VE) : NULL;
    if (!ve) {
      ok = false;
      break;
    }
    tool_strip(&kb, &ke);
    tool_strip(&vb, &ve);
    ok = put_typed(p, args, fname, kb, ke, vb, ve, "any");
    q = ve + strlen(VE);
  }
  ok = finish_call(p, nb, ne, args, ok);
  free(fname);
  return ok;
}

// GLM: the block is "name\n<arg_key>..." (4.7: no newline before the first key).
int tool_parse_glm45(tpr_out_parser *p, const char *s, size_t n) {
  const char *e = s + n, *k = tool_find(s, e, "<arg_key>"), *nl = memchr(s, '\n', n);
  const char *ne = k ? k : e;
  if (nl && nl < ne) ne = nl;
  return key_value_call(p, s, ne, ne, e, "") ? 1 : 0;
}

// Hy3: <tool_calls> holds <tool_call>name<tool_sep>pairs</tool_call> per call
// (the released Hy3's tags end in ":opensource", Hy3-preview's do not).
static bool hunyuan_call(tpr_out_parser *p, const char *b, const char *e, const void *ctx) {
  const char *sfx = ctx;
  char SEP[48];
  snprintf(SEP, sizeof SEP, "<tool_sep%s>", sfx);
  const char *sep = tool_find(b, e, SEP);
  return sep && key_value_call(p, b, sep, sep + strlen(SEP), e, sfx);
}

int tool_parse_hunyuan(tpr_out_parser *p, const char *s, size_t n) {
  const char *e = s + n, *sfx = tool_find(s, e, "<tool_call:opensource>") ? ":opensource" : "";
  char CS[48], CE[48];
  snprintf(CS, sizeof CS, "<tool_call%s>", sfx), snprintf(CE, sizeof CE, "</tool_call%s>", sfx);
  return tool_each_block(p, s, e, CS, CE, hunyuan_call, sfx);
}
