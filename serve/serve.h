// tpr serve: an OpenAI-compatible HTTP server over the batched engine.
//
// Rank 0 runs a libuv event loop with Debian's http-parser (http.c); each
// request it accepts becomes an engine sequence (routes.c, openai_json.c,
// chat_template.c). loop.c alternates, on rank 0, a turn of the event loop
// with one engine step, and broadcasts before every step a flag (step / idle
// / stop) so the other ranks run the same collective steps and nothing else.
// Everything on rank 0 runs on one thread: the engine is touched only between
// event-loop turns.
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
  double request_timeout;  // seconds for a whole request to arrive (408 after); <= 0: none
  tpr_http_handler handler;
  void *ctx;
  // Called when a connection whose answer is still pending goes away.
  void (*on_close)(void *ctx, tpr_http_conn *c);
  // Called when the HTTP layer itself answers an error (400, 408, 413).
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
void tpr_http_stream_begin(tpr_http_conn *c);  // 200, text/event-stream, chunked
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

// --- openai_json.c ----------------------------------------------------------
#define TPR_SERVE_MAX_STOP 4

typedef struct tpr_oai_request {
  bool chat;
  char *prompt;            // completions: the prompt; chat: the rendered template; NULL: prompt_ids
  int32_t *prompt_ids;     // completions given token ids ("prompt": [1, 2, 3]); NULL otherwise
  size_t n_prompt_ids;
  int64_t max_tokens;
  double temperature, top_p;
  int64_t top_k, seed;
  char *stop[TPR_SERVE_MAX_STOP];
  int n_stop;
  bool stream;
  bool include_usage;      // stream_options.include_usage: a last chunk with the usage
  bool ignore_eos;         // vLLM's extension: generate max_tokens whatever comes
} tpr_oai_request;

// Parses a body. On a bad request returns false with *status (400 / 404)
// and err set to the message.
// chat: messages rendered with `tmpl` (tpr_chat_render).
bool tpr_oai_parse(const char *body, size_t len, bool chat, tpr_chat_template tmpl, const char *model_id,
                   tpr_oai_request *out, int *status, char *err, size_t errlen);
void tpr_oai_request_free(tpr_oai_request *r);
// {"error":{"message":..., "type":..., "code":status}} (malloc'ed).
char *tpr_oai_error_json(int status, const char *message);
// Full (non-streamed) response body (malloc'ed); text: text_len bytes, NUL
// bytes included (escaped as \u0000).
char *tpr_oai_response_json(bool chat, const char *id, int64_t created, const char *model, const char *text,
                            size_t text_len, const char *finish_reason, int64_t prompt_tokens,
                            int64_t completion_tokens);
// The last streamed chunk of stream_options.include_usage: no choices, the usage.
char *tpr_oai_usage_chunk_json(bool chat, const char *id, int64_t created, const char *model, int64_t prompt_tokens,
                               int64_t completion_tokens);
// One streamed chunk; text (text_len bytes) NULL: none; finish NULL: null;
// first: chat's role delta.
char *tpr_oai_chunk_json(bool chat, const char *id, int64_t created, const char *model, const char *text,
                         size_t text_len, const char *finish_reason, bool first);

// --- loop.c / routes.c ------------------------------------------------------
typedef struct tpr_serve_opts {
  const char *host;
  int port;
  size_t max_body;
  const char *model_id;
  const char *port_file;   // rank 0 writes the bound port here (tests), NULL: none
  int32_t eos;             // -1: none
  int64_t max_seq;
  tpr_chat_template chat_template;
  double request_timeout;  // seconds for a request to arrive whole (408 after)
  double drain_timeout;    // seconds SIGTERM waits for in-flight requests; then they are cut off (503)
} tpr_serve_opts;

// Collective: serves until SIGTERM/SIGINT (rank 0) and the drain.
tpr_status tpr_serve_run(tpr_comm_t world, int rank, tpr_engine *e, const tpr_tokenizer *tok,
                         const tpr_serve_opts *o);

#endif
