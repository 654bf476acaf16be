// tokenizer.json load + encode. The first byte picks the mode:
//  even: the rest is a tokenizer.json; loaded, it encodes and decodes a fixed
//        mixed-script text.
//  odd:  the rest is text, encoded by one of the fixture tokenizers
//        (bytelevel, llama, metaspace: byte 0 / 2 % 3), then decoded.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

static void round_trip(const tpr_tokenizer *t, const char *text, size_t len) {
  int32_t *ids = NULL;
  size_t n = 0;
  if (tpr_tokenizer_encode(t, text, len, true, &ids, &n) != TPR_OK) return;
  int32_t vocab = tpr_tokenizer_vocab_size(t);
  for (size_t i = 0; i < n; i++) fz_require(ids[i] >= 0 && ids[i] < vocab, "encoded ids are in the vocabulary");
  char *out = NULL;
  size_t out_len = 0;
  if (tpr_tokenizer_decode(t, ids, n, false, &out, &out_len) == TPR_OK) free(out);
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static tpr_tokenizer *fixed[3];
  static const char *names[3] = {"bytelevel", "llama", "metaspace"};
  if (data[0] & 1) {
    int k = (data[0] >> 1) % 3;
    if (!fixed[k]) {
      char path[1024];
      snprintf(path, sizeof path, "%s/tokenizer/%s", fz_fixtures(), names[k]);
      fz_require(tpr_tokenizer_load(path, &fixed[k]) == TPR_OK, "fixture tokenizer loads");
    }
    round_trip(fixed[k], (const char *)data + 1, size - 1);
    return 0;
  }
  tpr_tokenizer *t = NULL;
  if (tpr_tokenizer_load(fz_write("tokenizer.json", data + 1, size - 1), &t) != TPR_OK) return 0;
  static const char text[] = "Hello, world! 123 <s> </s> caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80\n\t  x";
  round_trip(t, text, sizeof text - 1);
  round_trip(t, "", 0);
  tpr_tokenizer_free(t);
  return 0;
}
