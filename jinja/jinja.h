// A Jinja2 interpreter for chat templates (docs/chat-templates.md): the subset
// of Jinja that published chat templates use, rendered the way transformers
// renders them (jinja2's ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks and loopcontrols; raise_exception, strftime_now; tojson as
// json.dumps(ensure_ascii=False)). Values print with Python's semantics
// (True, None, 1.0, ['a'], {'k': 1}).
//
// Anything outside the subset is an error naming the construct and the line:
// unknown tags, filters and tests when the template is parsed, the rest
// (methods, operand types) when it is rendered. A render is bounded (output
// bytes, loop iterations, call depth, memory), so an untrusted template
// cannot hang or exhaust the process.
#ifndef TPR_JINJA_H
#define TPR_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr_jinja_template tpr_jinja_template;

typedef struct tpr_jinja_limits {
  size_t max_output;       // bytes of output (0: 16 MiB)
  int64_t max_steps;       // loop iterations and macro calls, all together (0: 10 million)
  int max_depth;           // nested macro calls (0: 64)
  size_t max_memory;       // bytes the render may allocate (0: 256 MiB)
} tpr_jinja_limits;

// Why a parse or render failed. raised: the template called
// raise_exception(message) (message is its argument); else message says
// what is unsupported or wrong, with the template's line.
typedef struct tpr_jinja_error {
  bool raised;
  int line;
  char message[1024];
} tpr_jinja_error;

// Parses the template text (UTF-8). On failure returns non-OK with err set
// (and tpr_last_error holding the same message).
tpr_status tpr_jinja_parse(const char *src, size_t len, tpr_jinja_template **out, tpr_jinja_error *err);
void tpr_jinja_free(tpr_jinja_template *t);

// Renders with the variables given as a JSON object's text (its members, in
// order, are the template's variables; numbers keep Python's int/float
// distinction: 1 is an int, 1.0 a float). limits NULL: the defaults.
// *out: malloc'ed NUL-terminated text (*out_len bytes).
tpr_status tpr_jinja_render_json(const tpr_jinja_template *t, const char *vars_json, size_t vars_len,
                                 const tpr_jinja_limits *limits, char **out, size_t *out_len, tpr_jinja_error *err);

#endif
