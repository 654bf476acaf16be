// The OpenAI request JSON of tpr serve (tpr_oai_parse): the input is a
// request body, parsed as a completion and as a chat request under every
// built-in chat template (and none).
#include <stdbool.h>

#include "fuzz_common.h"
#include "serve/serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (int t = TPR_CHAT_NONE; t <= TPR_CHAT_TEMPLATE_COUNT; t++) {  // the last: a completion
    bool chat = t < TPR_CHAT_TEMPLATE_COUNT;
    tpr_oai_request r;
    int status = 0;
    char err[256];
    if (tpr_oai_parse((const char *)data, size, chat, chat ? (tpr_chat_template)t : TPR_CHAT_CHATML, "tpr-model", &r,
                      &status, err, sizeof err)) {
      fz_require(r.prompt != NULL && r.n_stop >= 0 && r.n_stop <= TPR_SERVE_MAX_STOP, "a parsed request is whole");
      tpr_oai_request_free(&r);
    } else {
      fz_require(status == 400 || status == 404, "a refused request has a 4xx status");
    }
  }
  return 0;
}
