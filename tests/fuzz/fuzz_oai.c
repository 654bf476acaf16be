// The OpenAI request JSON of tpr serve (tpr_oai_parse): the input is a
// request body, parsed as a completion and as a chat request under every
// built-in chat template (and none).
#include <stdbool.h>
#include <string.h>

#include "fuzz_common.h"
#include "serve/serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (int t = TPR_CHAT_NONE; t <= TPR_CHAT_TEMPLATE_COUNT; t++) {  // the last: a completion
    bool chat = t < TPR_CHAT_TEMPLATE_COUNT;
    tpr_oai_request r;
    tpr_oai_error e;
    tpr_chat_renderer with = {.builtin = chat ? (tpr_chat_template)t : TPR_CHAT_CHATML};
    if (tpr_oai_parse((const char *)data, size, chat, &with, "tpr-model", &r, &e)) {
      fz_require((r.prompt != NULL) != (r.prompt_ids != NULL) && r.n_stop >= 0 && r.n_stop <= TPR_SERVE_MAX_STOP &&
                     r.n >= 1 && r.n <= TPR_SERVE_MAX_N && r.top_logprobs >= 0 &&
                     r.top_logprobs <= TPR_SERVE_MAX_TOP_LOGPROBS && (r.n_bias == 0 || (r.bias_ids && r.bias)),
                 "a parsed request is whole");
      tpr_oai_request_free(&r);
    } else {
      fz_require(e.status == 400 || e.status == 404 || e.status == 500, "a refused request has an error status");
      fz_require(memchr(e.message, 0, sizeof e.message) != NULL && e.message[0], "a refused request says why");
    }
  }
  return 0;
}
