// tpr serve: an OpenAI-compatible HTTP server over the batched engine.
//
// Rank 0 has two threads: an HTTP thread runs a libuv event loop with
// Debian's http-parser (http.c), turns requests into queued engine sequences
// (routes.c, submit.c, openai_request.c, chat_template.c) and writes their
// answers (answer.c, openai_json.c); the engine thread runs the steps
// (engine_loop.c). Before every step rank 0 broadcasts a flag (step / stop)
// so the other ranks run the same collective steps and nothing else; an idle
// server sends nothing. serve_impl.h describes how the threads meet.
#ifndef TPR_SERVE_H
#define TPR_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>
#include <uv.h>

#include "collectives/tpr_comm.h"
#include "engine/engine.h"
#include "runtime/status.h"
#include "serve/http_reader.h"
#include "serve/tool_parse.h"
#include "tokenizer/tokenizer.h"

// --- http.c -----------------------------------------------------------------
typedef struct tpr_http_conn tpr_http_conn;
typedef struct tpr_http_server tpr_http_server;


// Called once per complete request; the handler answers with exactly one of
// tpr_http_respond or tpr_http_stream_begin ... tpr_http_stream_end, now or
// later. Until then the connection reads nothing more.
typedef void (*tpr_http_handler)(void *ctx, tpr_http_conn *c, const tpr_http_request *r);

typedef struct tpr_http_opts {
  const char *host;
  int port;
  size_t max_body;  // larger bodies: 413
  int max_connections;  // open connections; past it a new one gets 503 (0: no limit)
  double request_timeout;  // seconds for a whole request to arrive (408 after); <= 0: none
  tpr_http_handler handler;
  void *ctx;
  // Called when a connection whose answer is still pending goes away.
  void (*on_close)(void *ctx, tpr_http_conn *c);
  // Called when the HTTP layer itself answers an error (400, 408, 413, 417, 503).
  void (*on_refused)(void *ctx, int status);
} tpr_http_opts;

tpr_status tpr_http_listen(uv_loop_t *loop, const tpr_http_opts *o, tpr_http_server **out);
// Stops accepting; open connections finish their answers and then close.
void tpr_http_stop_accepting(tpr_http_server *s);
// Closes every handle; run the loop afterwards until it has no more work.
void tpr_http_close_all(tpr_http_server *s);
// After the loop has run every close: frees the server.
void tpr_http_free(tpr_http_server *s);
int tpr_http_port(const tpr_http_server *s);  // the bound port (0 asked: the chosen one)
int tpr_http_open_conns(const tpr_http_server *s);

void tpr_http_respond(tpr_http_conn *c, int status, const char *content_type, const char *body, size_t len);
void tpr_http_stream_begin(tpr_http_conn *c);  // 200, text/event-stream, chunked (HTTP/1.0: close-delimited)
void tpr_http_stream_send(tpr_http_conn *c, const char *data, size_t len);  // one chunk
void tpr_http_stream_end(tpr_http_conn *c);
const char *tpr_http_status_text(int status);

// --- chat_template.c --------------------------------------------------------
// Built-in chat templates (the formats are described in chat_template.c).
typedef enum tpr_chat_template {
  TPR_CHAT_NONE = -1,  // the checkpoint declares a template tpr does not have: chat requests get 400
  TPR_CHAT_CHATML = 0,
  TPR_CHAT_MINIMAX_M2 = 1,
  TPR_CHAT_HUNYUAN_MOE = 2,
  TPR_CHAT_TEMPLATE_COUNT
} tpr_chat_template;

const char *tpr_chat_template_name(tpr_chat_template t);  // "chatml", "minimax_m2", "hunyuan_moe"; "none"
bool tpr_chat_template_parse(const char *s, tpr_chat_template *out);
// The template a checkpoint declares (chat_template.jinja, else
// tokenizer_config.json's chat_template), recognised by its markers; ChatML
// when it declares none; TPR_CHAT_NONE when it declares one tpr lacks. why:
// where the answer came from.
tpr_chat_template tpr_chat_template_detect(const char *model_dir, char *why, size_t whylen);
// messages: a cJSON array of {role, content} (content a string or a list of
// {"type":"text","text":...} parts). Returns the prompt (malloc'ed), or NULL
// with err set: a bad message list, a role the template cannot render, or
// TPR_CHAT_NONE.
char *tpr_chat_render(tpr_chat_template t, const cJSON *messages, char *err, size_t errlen);
// The same for the first n_messages messages (0 <= n_messages <= the list's
// length; the whole list is still checked to be a non-empty array), the
// generation prompt (the assistant turn's opening) appended only when
// add_generation_prompt, as the Jinja templates' flag of that name does.
// tpr_chat_render is this with every message and the prompt. tpr data
// prepare --chat renders prefixes of a conversation to find which bytes are
// the assistant's replies.
char *tpr_chat_render_prefix(tpr_chat_template t, const cJSON *messages, int n_messages, bool add_generation_prompt,
                             char *err, size_t errlen);

// How /v1/chat/completions makes its prompt: the checkpoint's own Jinja
// template rendered as transformers renders it (jinja/chat.h) when `jinja`
// is set, else the built-in `builtin`.
struct tpr_chat_jinja;
typedef struct tpr_chat_renderer {
  const struct tpr_chat_jinja *jinja;
  tpr_chat_template builtin;
  // How answers are read back (tpr serve's --tool-call-parser and
  // --reasoning-parser; zero: neither): requests' tool calls in this format
  // (tools need `jinja` to be rendered), <think> reasoning separated.
  tpr_tool_format tool_format;
  bool reasoning;
  const char *think_open;  // the tag that opens reasoning ("<think>", Hy3's "<think:opensource>"; NULL: "<think>")
  // tool_format's start tag is a special token of the tokenizer (Kimi K2,
  // DeepSeek, Mistral): answers parsed for tool calls keep special tokens in
  // their text, as vLLM turns skip_special_tokens off for those parsers.
  bool keep_special;
} tpr_chat_renderer;
// "jinja (tokenizer_config.json)" or the built-in's name, for start-up lines.
void tpr_chat_renderer_describe(const tpr_chat_renderer *r, char *buf, size_t cap);
// --chat-template's choice, for tpr serve and tpr data prepare. arg "auto":
// the checkpoint's Jinja template when it declares one (loaded into *j); one
// tpr cannot parse leaves r->builtin TPR_CHAT_NONE and warn saying why
// (never an approximation); ChatML built in when it declares none. A
// built-in's name. Anything else: a file of Jinja text (into *j), with the
// checkpoint's special tokens. TPR_ERR_INVALID_ARG: arg is none of these.
tpr_status tpr_chat_renderer_pick(const char *model_dir, const char *arg, struct tpr_chat_jinja *j,
                                  tpr_chat_renderer *r, char *warn, size_t cap);
// messages[:n] (0 <= n <= the list's length) rendered, with the generation
// prompt or not (malloc'ed), or NULL with err set (a template's raise
// included). tools: a list of tool definitions, or NULL. A Jinja template
// reads them as an OpenAI request's (jinja/chat.h's request_json: tool-call
// arguments given as JSON text become mappings, as tpr serve passes them), so
// a conversation renders here as it renders when served.
char *tpr_chat_renderer_render(const tpr_chat_renderer *r, const cJSON *messages, int n, const cJSON *tools,
                               bool add_generation_prompt,
                               char *err, size_t errlen);

// --- openai_request.c: the request bodies -----------------------------------
#define TPR_SERVE_MAX_STOP 4
#define TPR_SERVE_MAX_N 64            // choices per request ("n")
#define TPR_SERVE_MAX_TOP_LOGPROBS 20

// A refused request: the HTTP status (400, 404), the parameter at fault
// (OpenAI's error "param"; empty when none) and the message.
typedef struct tpr_oai_error {
  int status;
  char param[64];
  char message[512];
} tpr_oai_error;

typedef struct tpr_oai_request {
  bool chat;
  char *prompt;            // completions: the prompt; chat: the rendered template; NULL: prompt_ids
  int32_t *prompt_ids;     // completions given token ids ("prompt": [1, 2, 3]); NULL otherwise
  size_t n_prompt_ids;
  int64_t max_tokens;      // 0: absent, up to the context
  double temperature, top_p;
  int64_t top_k;
  bool has_seed;           // false: the server draws a fresh seed
  uint64_t seed;
  char *stop[TPR_SERVE_MAX_STOP];
  int n_stop;
  bool stream;
  bool include_usage;      // stream_options.include_usage: a last chunk with the usage
  bool ignore_eos;         // vLLM's extension: generate max_tokens whatever comes
  int64_t n;               // choices, [1, TPR_SERVE_MAX_N]
  bool echo;               // completions: the prompt's text first
  bool logprobs;           // chat: logprobs; completions: "logprobs" given (an int)
  int top_logprobs;        // chat: top_logprobs; completions: the "logprobs" int
  double frequency_penalty, presence_penalty, repetition_penalty;  // repetition 1: off
  int64_t min_tokens;
  int32_t *bias_ids;       // logit_bias (n_bias entries)
  float *bias;
  int64_t n_bias;
  // chat: tools and reasoning (docs/serve.md "Tool calls and reasoning")
  cJSON *tools;            // the request's tools (a list, owned); NULL: none
  tpr_tool_format tool_format;  // the calls parsed from the answer (NONE: tool_choice "none" or no parser)
  bool reasoning;          // <think> reasoning separated from the content
  bool starts_in_reasoning;  // the rendered prompt ends inside an open <think>
  const char *think_open;  // the reasoning tag (tpr_chat_renderer's; static)
  bool parallel_tool_calls;  // false: only the first call is kept
  bool keep_special;       // the answer's text keeps special tokens (tpr_chat_renderer's keep_special)
  // Structured output (owned; NULL: none): response_format json_object /
  // json_schema, or the forced tool call of tool_choice "required" / a
  // named function, decoded under this grammar (engine/json_grammar.h).
  struct tpr_json_grammar *grammar;
  const char *grammar_what;  // "response_format" or "tool_choice": for messages
  tpr_spec spec;           // "speculative" (tpr's extension), when spec_given; else the server's
  bool spec_given;
} tpr_oai_request;

// Parses a body (every parameter OpenAI or vLLM defines for the endpoint
// is either honoured or refused; unknown ones are refused, as OpenAI does).
// chat: messages rendered with `tmpl` (tpr_chat_render). false: *e says why.
bool tpr_oai_parse(const char *body, size_t len, bool chat, const tpr_chat_renderer *tmpl, const char *model_id,
                   tpr_oai_request *out, tpr_oai_error *e);
void tpr_oai_request_free(tpr_oai_request *r);

// --- openai_json.c: the response bodies -------------------------------------
// {"error":{"message":..., "type":..., "param":..., "code":status}}
// (malloc'ed); param NULL or "": null.
char *tpr_oai_error_json(int status, const char *message, const char *param);

// One token's logprobs as the response shows them: its text, its logprob,
// and the most likely tokens at its position.
typedef struct tpr_oai_logprob {
  const char *token;       // its text (valid UTF-8), token_len bytes
  size_t token_len;
  double logprob;
  int64_t text_offset;     // completions: where its text starts in the choice's text
  int n_top;
  const char *top_token[TPR_SERVE_MAX_TOP_LOGPROBS + 1];
  size_t top_len[TPR_SERVE_MAX_TOP_LOGPROBS + 1];
  double top_logprob[TPR_SERVE_MAX_TOP_LOGPROBS + 1];
} tpr_oai_logprob;

// One choice, or one streamed piece of it.
typedef struct tpr_oai_choice {
  int64_t index;
  const char *text;        // text_len bytes, NUL bytes included (escaped as \u0000); NULL: no text field (chat delta)
  size_t text_len;
  const char *finish;      // NULL: null
  bool role;               // chat stream: the first chunk's role delta
  bool has_logprobs;       // logprobs asked for: an object (else null)
  const tpr_oai_logprob *lp;  // (n_lp)
  int64_t n_lp;
  // chat with a tool-call or reasoning parser (request's tool_format or reasoning)
  bool parsed;             // message: content null when content_null; reasoning_content; tool_calls
  bool content_null;       // message.content null (only tool calls, or nothing besides reasoning)
  bool has_reasoning;      // message: reasoning_content shown (null when reasoning is NULL)
  const char *reasoning;   // reasoning_len bytes; NULL: null (message) / absent (delta)
  size_t reasoning_len;
  const tpr_tool_call *calls;  // (n_calls); a delta's calls are numbered from call_index0
  int n_calls, call_index0;
  const char (*call_ids)[32];  // (n_calls) "call_<24 hex>"
} tpr_oai_choice;

// A full (non-streamed) response with n choices (malloc'ed).
char *tpr_oai_response_json(bool chat, const char *id, int64_t created, const char *model, const tpr_oai_choice *c,
                            int64_t n, int64_t prompt_tokens, int64_t completion_tokens);
// One streamed chunk of one choice.
char *tpr_oai_chunk_json(bool chat, const char *id, int64_t created, const char *model, const tpr_oai_choice *c);
// The last streamed chunk of stream_options.include_usage: no choices, the usage.
char *tpr_oai_usage_chunk_json(bool chat, const char *id, int64_t created, const char *model, int64_t prompt_tokens,
                               int64_t completion_tokens);

// --- parsed_answer.c: a chat choice's text split into the response's fields --
// The request's tool_format / reasoning through tool_parse.h. Every call
// gets a "call_<24 hex>" id once, the same in the full answer and in chunks.
typedef struct tpr_parsed_choice {
  tpr_out_parser p;
  size_t fed;                            // text bytes fed
  size_t sent_content, sent_reasoning;   // bytes of p's buffers already in deltas
  int sent_calls;                        // calls already in deltas
  bool parallel, has_reasoning;          // the request's parallel_tool_calls, reasoning
  char (*ids)[32];                       // (n_ids) the shown calls' ids
  int n_ids;
} tpr_parsed_choice;

void tpr_parsed_init(tpr_parsed_choice *pc, const tpr_oai_request *r);  // r->tools must outlive pc
void tpr_parsed_free(tpr_parsed_choice *pc);
// Feeds text[pc->fed, upto) (final: generation has ended). false: out of memory.
bool tpr_parsed_feed(tpr_parsed_choice *pc, const char *text, size_t upto, bool final);
// A chunk's fields: what was classified since the last delta (content,
// reasoning_content, the calls completed since, each whole); the finish
// given ("stop" becomes "tool_calls" when the answer has calls). Points into
// pc. True: the delta carries something.
bool tpr_parsed_delta(tpr_parsed_choice *pc, const char *finish, tpr_oai_choice *oc);
// The whole answer's message fields (after the final feed): content null when
// only whitespace is left beside calls or nothing beside reasoning.
void tpr_parsed_full(const tpr_parsed_choice *pc, const char *finish, tpr_oai_choice *oc);

// --- server.c ------------------------------------------------------------
typedef struct tpr_serve_opts {
  const char *host;
  int port;
  size_t max_body;
  const char *model_id;
  const char *port_file;   // rank 0 writes the bound port here (tests), NULL: none
  const char *pid_file;    // rank 0 writes its pid here (to signal it directly), NULL: none
  int max_connections;     // open connections; past it a new one gets 503 (0: no limit)
  int32_t eos;             // -1: none
  int64_t max_seq;
  tpr_chat_renderer chat_template;
  double request_timeout;  // seconds for a request to arrive whole (408 after)
  double drain_timeout;    // seconds SIGTERM waits for in-flight requests; then they are cut off (503)
  tpr_spec speculative;    // every request's drafter unless it names one (--speculative; kind NONE: off)
} tpr_serve_opts;

// Collective: serves until SIGTERM/SIGINT (rank 0) and the drain.
tpr_status tpr_serve_run(tpr_comm_t world, int rank, tpr_engine *e, const tpr_tokenizer *tok,
                         const tpr_serve_opts *o);

#endif
