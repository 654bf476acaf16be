// The tool-call formats behind tool_parse.h's table: each parse function gets
// the text of one call block (between the format's start and end tags, or
// from the start tag to the end of the answer) and appends the calls it
// holds to p (returning how many; 0: the block is not a call and stays
// content, and whatever it appended is taken back). Shared helpers first.
#ifndef TPR_SERVE_TOOL_FORMATS_H
#define TPR_SERVE_TOOL_FORMATS_H

#include "serve/tool_parse.h"

// Appends a call (arguments: malloc'ed JSON object text, owned by p on
// success). False: out of memory.
bool tool_add_call(tpr_out_parser *p, const char *name, size_t name_len, char *arguments);
// Drops the calls from index first on (a block that did not parse).
void tool_drop_calls(tpr_out_parser *p, int first);
// Python's str.strip() on [*b, *e).
void tool_strip(const char **b, const char **e);
// The first needle in [s, e), or NULL.
const char *tool_find(const char *s, const char *e, const char *needle);
// Stripped, one pair of surrounding quotes removed (vLLM's _extract_name).
void tool_unquote(const char **b, const char **e);
// The JSON schema type of parameter pname of tool fname in the request's
// tools (a list of types: its first that is not "null"); fallback when the
// tools do not say.
const char *tool_param_type(const cJSON *tools, const char *fname, const char *pname, const char *fallback);
// vLLM's _convert_param_value: "null" is null; then by the schema type; a
// value that does not convert stays a string; an unknown type: JSON if it is.
cJSON *tool_convert_value(const char *v, const char *type);
// Calls one(p, b, e, ctx) on the inside [b, e) of each open ... close in
// [s, e), in order. Every one must add its call, else the calls they added
// are taken back and the result is 0 (the block stays content); no open at
// all is 0 too. Returns how many.
typedef bool (*tool_block_fn)(tpr_out_parser *p, const char *b, const char *e, const void *ctx);
int tool_each_block(tpr_out_parser *p, const char *s, const char *e, const char *open, const char *close,
                    tool_block_fn one, const void *ctx);
// Adds the call name(arguments) from key/value pairs: keys[i] = values[i]
// typed by the schema (typing: tool_convert_value's). False: out of memory.
bool tool_add_object_call(tpr_out_parser *p, const char *name, size_t name_len, cJSON *args);

// The formats (tool_parse.h's tpr_tool_format, in its order).
int tool_parse_hermes(tpr_out_parser *p, const char *s, size_t n);
int tool_parse_minimax_m2(tpr_out_parser *p, const char *s, size_t n);
int tool_parse_qwen3_coder(tpr_out_parser *p, const char *s, size_t n);
int tool_parse_glm45(tpr_out_parser *p, const char *s, size_t n);
int tool_parse_hunyuan(tpr_out_parser *p, const char *s, size_t n);
int tool_parse_kimi_k2(tpr_out_parser *p, const char *s, size_t n);
int tool_parse_deepseek(tpr_out_parser *p, const char *s, size_t n);
int tool_parse_mistral(tpr_out_parser *p, const char *s, size_t n);
int tool_parse_llama3_json(tpr_out_parser *p, const char *s, size_t n);

#endif
