// tpr bench model --speculative: decode with and without speculative
// decoding in the same run, on the same prompts (engine/speculative.h).
#ifndef TPR_BENCH_SPEC_H
#define TPR_BENCH_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/session.h"
#include "engine/speculative.h"
#include "launch/model_cli.h"
#include "launch/world.h"

typedef struct tpr_bench_spec_opts {
  tpr_spec spec;
  int64_t batch, gen_len, repeat;
  const int32_t *prompt;  // (prompt_len) every sequence's prompt
  int64_t prompt_len;
  const char *prompt_what;  // how the prompt was made, for the report
  bool json;
} tpr_bench_spec_opts;

// Collective. Rank 0 prints a table (or one JSON object): per mode (plain,
// speculative), the best of `repeat` runs' decode tok/s, after a warm-up
// of each that builds their programs; the speed-up; drafts, acceptance and
// tokens per verification; and whether every sequence's greedy tokens are
// the same with and without (a difference is a failure:
// TPR_ERR_INTERNAL).
tpr_status tpr_bench_spec(tpr_session *s, tpr_world *w, const tpr_model_engine *g, const tpr_bench_spec_opts *o);

// A copy-heavy prompt of len tokens: a random span of `span` tokens
// repeated (prompt lookup finds its continuation each time).
void tpr_bench_spec_copy_prompt(int32_t *tok, int64_t len, int64_t span, int64_t vocab, uint64_t seed);

#endif
