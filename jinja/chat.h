// A checkpoint's Jinja chat template rendered the way transformers'
// apply_chat_template renders it (utils/chat_template_utils.py,
// render_jinja_template): the template from chat_template.jinja, else
// tokenizer_config.json's chat_template (a string, or a list of {name,
// template}: "tool_use" when tools are given and it exists, else "default");
// the variables messages (keys whose value is null dropped; reasoning_content
// also given as "thinking"), tools, documents, add_generation_prompt, the
// named special tokens (bos_token, eos_token, unk_token, sep_token,
// pad_token, cls_token, mask_token, as the checkpoint declares them), then
// the extra keyword arguments (enable_thinking, ...), which override them.
#ifndef TPR_JINJA_CHAT_H
#define TPR_JINJA_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "jinja/jinja.h"

#define TPR_CHAT_SPECIAL_TOKENS 7

typedef struct tpr_chat_jinja {
  char *text;      // the template's source (malloc'ed)
  char *text_tools;  // a "tool_use" template of a named list, or NULL
  tpr_jinja_template *t, *t_tools;
  // bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
  // mask_token: the checkpoint's, NULL when it declares none.
  char *special[TPR_CHAT_SPECIAL_TOKENS];
  char source[256];  // where the template came from
} tpr_chat_jinja;

extern const char *const tpr_chat_special_names[TPR_CHAT_SPECIAL_TOKENS];

// From a checkpoint directory. TPR_ERR_IO: it declares no chat template.
tpr_status tpr_chat_jinja_load(const char *model_dir, tpr_chat_jinja *out, tpr_jinja_error *err);
// The checkpoint's special tokens (tokenizer_config.json, else
// special_tokens_map.json; a string or an AddedToken's "content"), replacing out's.
void tpr_chat_jinja_special_tokens(const char *model_dir, tpr_chat_jinja *out);
// From template text (no special tokens until the caller sets them).
tpr_status tpr_chat_jinja_from_text(const char *text, size_t len, tpr_chat_jinja *out, tpr_jinja_error *err);
void tpr_chat_jinja_free(tpr_chat_jinja *c);

typedef struct tpr_chat_inputs {
  const char *messages_json;   // a JSON list of message objects (required)
  const char *tools_json;      // a JSON list, or NULL: tools=None
  const char *documents_json;  // a JSON list, or NULL: documents=None
  bool add_generation_prompt;
  const char *kwargs_json;     // a JSON object of extra variables, or NULL
  // An OpenAI chat request body (what tpr serve receives), or NULL. When
  // given, its "messages", "tools", "documents" and "chat_template_kwargs"
  // (vLLM's) members are used instead of the fields above: read from the
  // body's own text, so numbers keep Python's int/float distinction, which
  // a cJSON round trip would lose (1.0 printed as 1). An assistant turn's
  // tool-call arguments, JSON text in OpenAI's format, reach the template
  // parsed into a mapping, and a null content as "", as vLLM passes them.
  const char *request_json;
} tpr_chat_inputs;

tpr_status tpr_chat_jinja_render(const tpr_chat_jinja *c, const tpr_chat_inputs *in, const tpr_jinja_limits *limits,
                                 char **out, size_t *out_len, tpr_jinja_error *err);

#endif
