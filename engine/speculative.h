// Speculative decoding's drafts (engine/engine.h): a drafter proposes up to
// k tokens to follow a sequence; the engine verifies them in its next step
// with the full model (k + 1 rows of that sequence) and keeps the longest
// agreeing prefix plus the target's own next token.
//
// Drafters:
//   lookup:n:k  prompt lookup (vLLM's "ngram"): the sequence's last m
//               tokens, for m = n down to 1, are looked for earlier in its
//               prompt and output so far; at the latest earlier match, the
//               k tokens that followed it are the draft (past the end of
//               the sequence they repeat the span from the match on, so a
//               loop "a b c a b c" drafts its next k in full). Rank 0
//               alone, from the token history: no model runs.
//   self:N:k    self-speculation (seed 002): the model's own first N
//               decoder layers, then its final norm and lm head, run k
//               times (one token each, greedy) to draft k tokens. They
//               write those layers' KV rows of the drafts into the
//               sequence's own blocks, and read the rows the verified tokens
//               left there (no separate draft cache); the verification
//               then rewrites every layer's rows. Run on every rank (tensor
//               and expert parallel like any step), k small steps before
//               the step that verifies.
//   external    the engine's caller drafts (tpr_engine_opts.draft): the
//               interface for a separate draft model. It is called on rank
//               0 before each step is planned, with a sequence's tokens
//               (prompt and output so far), and returns up to k drafts.
//               Only through the API (tpr_spec_parse does not make it).
#ifndef TPR_ENGINE_SPECULATIVE_H
#define TPR_ENGINE_SPECULATIVE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/status.h"

#define TPR_SPEC_MAX_K 32  // drafts per verification
#define TPR_SPEC_MAX_N 64  // the longest n-gram looked up

typedef enum tpr_spec_kind { TPR_SPEC_NONE = 0, TPR_SPEC_LOOKUP, TPR_SPEC_SELF, TPR_SPEC_EXTERNAL } tpr_spec_kind;

typedef struct tpr_spec {
  tpr_spec_kind kind;  // NONE: no drafts (every other field ignored)
  int32_t n;           // lookup: the longest n-gram matched (1..TPR_SPEC_MAX_N); self: the layers (>= 1)
  int32_t k;           // drafts per step (1..TPR_SPEC_MAX_K)
  // n is ignored by an external drafter.
} tpr_spec;

// "lookup:n:k", "self:N:k", or "off"/"none" (kind NONE). Anything else, or
// n / k out of range: TPR_ERR_INVALID_ARG naming the form. (Whether N is
// below the model's layer count is the engine's check.)
tpr_status tpr_spec_parse(const char *text, tpr_spec *out);
// The parseable form ("lookup:3:4", "off") into buf; returns buf.
const char *tpr_spec_format(const tpr_spec *s, char *buf, size_t size);
// TPR_ERR_INVALID_ARG when a spec's fields are out of range.
tpr_status tpr_spec_check(const tpr_spec *s);

// Up to s->k drafts to follow tokens (len) into draft; returns how many
// (0: no match). Self and external drafts are the engine's to get: 0.
int64_t tpr_spec_draft(const tpr_spec *s, const int32_t *tokens, int64_t len, int32_t *draft);

#endif
