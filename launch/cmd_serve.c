// tpr serve: an OpenAI-compatible HTTP server (serve/serve.h). Rank 0 serves
// HTTP and drives the batched engine; every other rank runs the engine steps
// rank 0 broadcasts.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "jinja/chat.h"
#include "launch/model_cli.h"
#include "runtime/file_io.h"
#include "serve/serve.h"

// config.json's eos_token_id (an id or a list: the first) and
// max_position_embeddings; -1 / 0 when absent.
static void read_config(const char *model, int64_t *eos, int64_t *max_pos) {
  *eos = -1;
  *max_pos = 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", model);
  uint8_t *bytes = NULL;
  size_t len = 0;
  if (tpr_file_read(path, &bytes, &len) != TPR_OK) return;
  cJSON *j = cJSON_ParseWithLength((const char *)bytes, len);
  free(bytes);
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
  if (cJSON_IsArray(e)) e = cJSON_GetArrayItem(e, 0);
  if (cJSON_IsNumber(e)) *eos = (int64_t)e->valuedouble;
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "max_position_embeddings");
  if (cJSON_IsNumber(m)) *max_pos = (int64_t)m->valuedouble;
  cJSON_Delete(j);
}

// --tool-call-parser and --reasoning-parser: "auto" reads the chat
// template's text (the Jinja source, its tool_use variant included); a
// built-in rendering has no tool syntax, and only minimax_m2's opens <think>.
static bool pick_parsers(tpr_chat_renderer *t, const char *tools, const char *reasoning) {
  const tpr_chat_jinja *j = t->jinja;
  if (!strcmp(tools, "auto")) {
    t->tool_format = j ? tpr_tool_format_detect(j->text) : TPR_TOOL_FMT_NONE;
    if (j && !t->tool_format) t->tool_format = tpr_tool_format_detect(j->text_tools);
  } else if (!tpr_tool_format_parse(tools, &t->tool_format)) {
    fprintf(stderr, "tpr serve: --tool-call-parser must be auto, %s (not '%s')\n", tpr_tool_format_names(), tools);
    return false;
  }
  if (!strcmp(reasoning, "auto")) {
    t->think_open = j ? tpr_reasoning_detect(j->text) : NULL;
    if (j && !t->think_open) t->think_open = tpr_reasoning_detect(j->text_tools);
    t->reasoning = j ? t->think_open != NULL : t->builtin == TPR_CHAT_MINIMAX_M2;
  } else if (!strcmp(reasoning, "think") || !strcmp(reasoning, "none")) {
    t->reasoning = !strcmp(reasoning, "think");
  } else {
    fprintf(stderr, "tpr serve: --reasoning-parser must be auto, think or none (not '%s')\n", reasoning);
    return false;
  }
  return true;
}

int tpr_cmd_serve(int argc, char **argv) {
  const char *model = NULL, *host = "127.0.0.1", *name = NULL, *port_file = NULL, *pid_file = NULL,
             *template_name = "auto", *tool_parser = "auto", *reasoning_parser = "auto";
  double request_timeout = 30, drain_timeout = 60;
  int64_t port = 8000, max_seq = 0, max_body = 1 << 20, max_connections = 1024;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_debug dbg = TPR_MODEL_DEBUG_DEFAULT;
  tpr_model_mesh mesh = TPR_MODEL_MESH_DEFAULT;
  tpr_model_engine eng = {0};
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory with config.json and tokenizer.json"},
      {"host", TPR_ARG_STR, &host, "address to listen on (default 127.0.0.1)"},
      {"port", TPR_ARG_INT, &port, "TCP port (default 8000; 0: any free port, printed)"},
      {"served-model-name", TPR_ARG_STR, &name, "the model id clients name (default: the directory's name)"},
      {"max-seq", TPR_ARG_SIZE, &max_seq,
       "longest sequence, prompt + max_tokens (default: max_position_embeddings, at most 4096)"},
      {"max-body-bytes", TPR_ARG_SIZE, &max_body, "largest request body; larger ones get 413 (default 1 MiB)"},
      {"chat-template", TPR_ARG_STR, &template_name,
       "chat template of /v1/chat/completions: auto (the checkpoint's own Jinja template, rendered as transformers "
       "does; ChatML when it has none), a file of Jinja text, or a built-in rendering: chatml, minimax_m2, "
       "hunyuan_moe"},
      {"tool-call-parser", TPR_ARG_STR, &tool_parser,
       "how tool calls are read from chat answers: auto (the format whose tags the chat template's text shows, "
       "else none), hermes (Hermes, Qwen2.5, Qwen3: <tool_call> JSON), minimax_m2, qwen3_coder (Qwen3-Coder, "
       "Qwen3.5), glm45 (GLM-4.5 and later), hunyuan (Hy3), hunyuan_preview, kimi_k2, deepseek_v3 (V3, R1, V3.1), mistral, "
       "llama3_json (Llama 3.1-3.3), or none (requests with tools then need tool_choice \"none\"); docs/serve.md"},
      {"reasoning-parser", TPR_ARG_STR, &reasoning_parser,
       "auto (on when the chat template mentions <think>, or Hy3's <think:opensource>), think (<think>...</think> "
       "becomes reasoning_content), or none"},
      {"request-timeout", TPR_ARG_FLOAT, &request_timeout,
       "seconds a client has to send a whole request, and an idle keep-alive connection stays open; 408 after "
       "(default 30; 0: none)"},
      {"drain-timeout", TPR_ARG_FLOAT, &drain_timeout,
       "on SIGTERM/SIGINT, seconds in-flight requests may take to finish before they are cut off with 503 "
       "(default 60; 0: no limit)"},
      {"max-connections", TPR_ARG_SIZE, &max_connections,
       "open client connections at most; a new one past it gets 503 (default 1024; 0: no limit)"},
      {"port-file", TPR_ARG_STR, &port_file, "write the bound port to this file once listening (for scripts)"},
      {"pid-file", TPR_ARG_STR, &pid_file,
       "write rank 0's pid to this file: SIGTERM to it drains and every rank and mpirun exit 0 (docs/serve.md)"},
      TPR_MODEL_ENGINE_ARGS(eng),
      TPR_MODEL_MESH_ARGS(mesh),
      TPR_WORLD_ARGS(wo),
      TPR_MODEL_DEBUG_ARGS(dbg),
  };
  const char *usage = "usage: [mpirun -np N] tpr serve --model DIR [--host 127.0.0.1] [--port 8000] "
                      "[--served-model-name NAME] [--max-seq N] [--max-body-bytes N]\n"
                      "       [--chat-template auto|FILE.jinja|chatml|minimax_m2|hunyuan_moe] [--request-timeout S] [--drain-timeout S]\n"
                      "       [--tool-call-parser auto|hermes|minimax_m2|qwen3_coder|glm45|hunyuan|hunyuan_preview|kimi_k2|deepseek_v3|mistral|llama3_json|none]\n"
                      "       [--reasoning-parser auto|think|none]\n"
                      "       [--max-connections N] [--port-file F] [--pid-file F]\n"
                      "       [--max-batch B (default 64 here)] [--max-tokens-per-step N] [--kv-cache-bytes N] [--tp T --dp D ...]\n"
                      "endpoints: GET /health, GET /v1/models, GET /metrics, POST /v1/completions, "
                      "POST /v1/chat/completions";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model) {
    fprintf(stderr, "tpr serve: --model is required\n%s\n", usage);
    return 2;
  }
  if (max_connections > 1000000) {
    fprintf(stderr, "tpr serve: --max-connections must be at most 1000000\n");
    return 2;
  }
  if (port < 0 || port > 65535 || max_body < 1) {
    fprintf(stderr, "tpr serve: %s\n", max_body < 1 ? "--max-body-bytes must be >= 1" : "--port must be in [0, 65535]");
    return 2;
  }
  if (!(request_timeout >= 0) || !(drain_timeout >= 0) || request_timeout > 86400 || drain_timeout > 86400) {
    fprintf(stderr, "tpr serve: --request-timeout and --drain-timeout must be in [0, 86400] seconds\n");
    return 2;
  }
  tpr_chat_jinja jinja = {0};
  tpr_chat_renderer tmpl;
  char tmpl_warn[1200];
  if (tpr_chat_renderer_pick(model, template_name, &jinja, &tmpl, tmpl_warn, sizeof tmpl_warn) != TPR_OK) {
    fprintf(stderr, "tpr serve: %s\n", tpr_last_error());
    return 2;
  }
  if (!pick_parsers(&tmpl, tool_parser, reasoning_parser)) {
    tpr_chat_jinja_free(&jinja);
    return 2;
  }
  int64_t eos = -1, max_pos = 0;
  read_config(model, &eos, &max_pos);
  if (max_seq == 0) max_seq = max_pos > 0 && max_pos < 4096 ? max_pos : 4096;
  if (!eng.max_batch) eng.max_batch = 64;
  char model_id[256];
  if (!name) {
    size_t l = strlen(model);
    while (l > 1 && model[l - 1] == '/') l--;
    size_t b = l;
    while (b > 0 && model[b - 1] != '/') b--;
    snprintf(model_id, sizeof model_id, "%.*s", (int)(l - b), model + b);
    name = model_id;
  }
  tpr_tokenizer *tok = NULL;
  tpr_world w;
  tpr_session *s = NULL;
  tpr_engine *e = NULL;
  tpr_status rc = tpr_world_init(&argc, &argv, &wo, &w);
  if (rc == TPR_OK) rc = tpr_cli_open_engine_model(&w, model, &mesh, max_seq, &eng, &dbg, &s);
  if (rc == TPR_OK && w.rank == 0) rc = tpr_tokenizer_load(model, &tok);
  if (rc == TPR_OK && w.rank == 0 && eos < 0) eos = tpr_tokenizer_eos_id(tok);
  rc = rc == TPR_OK ? tpr_comm_agree(w.host, rc) : rc;
  tpr_spec spec = {0};
  if (rc == TPR_OK) rc = tpr_cli_speculative(&eng, &spec);
  tpr_engine_opts eo = {.max_tokens_per_step = eng.max_tokens_per_step, .no_prefix_cache = eng.no_prefix_cache,
                        .max_draft = spec.kind ? spec.k : 0,
                        .draft_layers = spec.kind == TPR_SPEC_SELF ? spec.n : 0};
  if (rc == TPR_OK) rc = tpr_engine_new(s, &eo, &e);
  tpr_serve_opts so = {.host = host, .port = (int)port, .max_body = (size_t)max_body, .model_id = name,
                       .port_file = port_file, .pid_file = pid_file, .max_connections = (int)max_connections,
                       .eos = (int32_t)eos, .max_seq = s ? tpr_session_max_seq(s) : 0,
                       .chat_template = tmpl, .request_timeout = request_timeout, .drain_timeout = drain_timeout,
                       .speculative = spec};
  if (rc == TPR_OK && w.rank == 0 && tmpl_warn[0])
    fprintf(stderr, "tpr serve: warning: %s; until then chat requests get 400\n", tmpl_warn);
  if (rc == TPR_OK && w.rank == 0) tpr_cli_print_kv_pool(s);
  if (rc == TPR_OK && tok) {  // a tool format whose start tag is a special token: answers keep special tokens
    const char *start = tpr_tool_format_start(so.chat_template.tool_format);
    int32_t start_id = start ? tpr_tokenizer_token_to_id(tok, start) : -1;
    so.chat_template.keep_special = start_id >= 0 && tpr_tokenizer_is_special(tok, start_id);
  }
  if (rc == TPR_OK) rc = tpr_serve_run(w.host, w.rank, e, tok, &so);
  tpr_engine_free(e);
  tpr_tokenizer_free(tok);
  tpr_chat_jinja_free(&jinja);
  if (rc != TPR_OK) {
    tpr_session_close(s);
    return tpr_world_fail(&w, "serve");
  }
  tpr_session_close(s);
  tpr_world_finish(&w);
  return 0;
}
