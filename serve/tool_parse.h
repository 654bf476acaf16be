// Splits a chat answer's generated text into reasoning, tool calls and
// plain content, fed incrementally (any chunk boundaries, down to one byte),
// as vLLM's reasoning and tool-call parsers do for /v1/chat/completions.
// Pure text in, text out: no engine, no tokenizer.
//
// Reasoning: `<think>...</think>`; with starts_in_reasoning the text starts
// inside it (the prompt opened `<think>`, as Qwen3's and MiniMax-M2's
// generation prompts can) and only the closing tag comes. Reasoning never
// closed stays reasoning.
// Tool calls: one format per server (the table `formats` in tool_parse.c;
// adding one is a row there: its name, its start and end tags, a function
// turning the text between them into calls, and the marker that detects it
// in a chat template). A block that does not parse is left as content,
// tags included: nothing generated is ever lost. A block unfinished when
// generation ends is content too.
#ifndef TPR_SERVE_TOOL_PARSE_H
#define TPR_SERVE_TOOL_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include <cJSON.h>

typedef enum tpr_tool_format {
  TPR_TOOL_FMT_NONE = 0,     // no tool calls parsed: everything outside reasoning is content
  TPR_TOOL_FMT_HERMES,       // <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (Hermes, Qwen2.5/3)
  TPR_TOOL_FMT_MINIMAX_M2,   // <minimax:tool_call><invoke name="f"><parameter name="p">v</parameter></invoke>...
  TPR_TOOL_FMT_QWEN3_CODER,  // <tool_call><function=f><parameter=p>\nv\n</parameter></function></tool_call>
  TPR_TOOL_FMT_GLM45,        // <tool_call>f\n<arg_key>p</arg_key><arg_value>v</arg_value></tool_call> (GLM-4.5+)
  TPR_TOOL_FMT_HUNYUAN,      // Hy3: <tool_calls:opensource><tool_call:opensource>f<tool_sep:opensource><arg_key:...
  TPR_TOOL_FMT_HUNYUAN_PREVIEW,  // Hy3-preview: the same tags without ":opensource"
  TPR_TOOL_FMT_KIMI_K2,      // <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{..}
  TPR_TOOL_FMT_DEEPSEEK,     // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{..}<｜tool▁call▁end｜> (V3.1; V3/R1)
  TPR_TOOL_FMT_MISTRAL,      // [TOOL_CALLS]f[ARGS]{..} or [TOOL_CALLS][{"name", "arguments"}] to the end
  TPR_TOOL_FMT_LLAMA3_JSON,  // the whole answer {"name": f, "parameters": {..}}; ... (Llama 3.1-3.3)
  TPR_TOOL_FMT_COUNT
} tpr_tool_format;

const char *tpr_tool_format_name(tpr_tool_format f);  // "none", "hermes", "minimax_m2", ...
bool tpr_tool_format_parse(const char *s, tpr_tool_format *out);
// Every format's name, "none, hermes, ... or llama3_json" (for messages).
const char *tpr_tool_format_names(void);
// The text that opens a call block of f in generated text (NULL: none, or a
// format whose block is recognised by its first character): tpr serve keeps
// special tokens in the answer's text when this is one.
const char *tpr_tool_format_start(tpr_tool_format f);
// The format whose start tag the chat template's text mentions; NONE: none.
tpr_tool_format tpr_tool_format_detect(const char *template_text);
// The tag that opens reasoning in a template's text: "<think>", Hy3's
// "<think:opensource>"; NULL: none (reasoning parsing off). The closing tag
// is the same with "</".
const char *tpr_reasoning_detect(const char *template_text);
// Whether a rendered prompt ends inside an open reasoning tag (whitespace
// after it allowed): the answer then starts in reasoning. think_open NULL:
// "<think>".
bool tpr_prompt_opens_think(const char *prompt, const char *think_open);

typedef struct tpr_tool_call {
  char *name;
  char *arguments;  // a JSON object's text, as OpenAI's function.arguments
} tpr_tool_call;

typedef struct tpr_text_buf {
  char *s;  // NUL-terminated (len bytes before it; NUL bytes may occur inside)
  size_t len, cap;
} tpr_text_buf;

typedef struct tpr_out_parser {
  tpr_tool_format fmt;
  bool reasoning;          // <think> ... </think> separated
  const cJSON *tools;      // the request's tools (borrowed; NULL: none): MiniMax-M2's parameter types
  int state;               // 0 content, 1 reasoning, 2 inside a tool call block
  bool start_decided;      // a block that can only begin the answer: whether that moment has passed
  char think_open[40], think_close[40];  // the reasoning tags (tpr_out_parser_init: <think>, </think>)
  tpr_text_buf pending;    // bytes not classified yet (may begin a tag)
  tpr_text_buf content, reasoning_text;
  tpr_tool_call *calls;
  int n_calls, cap_calls;
  bool oom;
} tpr_out_parser;

void tpr_out_parser_init(tpr_out_parser *p, tpr_tool_format fmt, bool reasoning, bool starts_in_reasoning,
                         const cJSON *tools);
// Another reasoning tag pair than <think>...</think> (open: e.g.
// "<think:opensource>"; the close is derived). Before the first feed.
void tpr_out_parser_think_tag(tpr_out_parser *p, const char *open);
// Appends what it can classify to content, reasoning_text and calls; a
// possible tag's beginning waits in pending for the next bytes.
void tpr_out_parser_feed(tpr_out_parser *p, const char *s, size_t n);
// Generation ended: pending goes where its state says (an unfinished call
// block: content, its start tag included).
void tpr_out_parser_finish(tpr_out_parser *p);
void tpr_out_parser_free(tpr_out_parser *p);

// Whether s[0, n) is all whitespace (content beside tool calls that is only
// whitespace is shown as null, as vLLM does).
bool tpr_text_blank(const char *s, size_t n);

#endif
