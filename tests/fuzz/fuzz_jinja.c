// The Jinja interpreter of chat templates (jinja/): the input is a template,
// parsed and, when it parses, rendered over a fixed conversation with tight
// limits. A template is untrusted input (it ships with a checkpoint): it
// must end in output or an error naming why, never a crash, a hang or an
// unbounded allocation.
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "jinja/jinja.h"

static const char vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>r</think>ok\", \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, null, true]}}}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tpr_jinja_template *t = NULL;
  tpr_jinja_error err;
  if (tpr_jinja_parse((const char *)data, size, &t, &err) != TPR_OK) {
    fz_require(err.message[0] != 0 && memchr(err.message, 0, sizeof err.message) != NULL, "a refused template says why");
    return 0;
  }
  tpr_jinja_limits lim = {.max_output = 1 << 16, .max_steps = 20000, .max_depth = 16, .max_memory = 32 << 20};
  char *out = NULL;
  size_t len = 0;
  if (tpr_jinja_render_json(t, vars, sizeof vars - 1, &lim, &out, &len, &err) == TPR_OK) {
    fz_require(out && out[len] == 0 && len <= lim.max_output, "a render is whole and within its limit");  // NULs in it may be the template's
  } else {
    fz_require(out == NULL && (err.raised || err.message[0] != 0), "a failed render says why");  // raise_exception("") is allowed
  }
  free(out);
  tpr_jinja_free(t);
  return 0;
}
