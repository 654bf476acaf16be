// A byte-level pushdown automaton for JSON text, plain or constrained by a
// JSON schema: what structured output (response_format json_object /
// json_schema) and forced tool calls decode under (token_constraint.h turns
// it into a token mask per step, docs/serve.md "Structured output").
//
// The language: one JSON value (json_object mode: an object) from its first
// byte, with whitespace between tokens as llama.cpp's JSON grammar allows it
// (none, one space, or a newline and an indent of at most TPR_JSON_MAX_WS
// spaces or tabs), numbers
// of at most TPR_JSON_MAX_NUMBER bytes and nesting at most
// TPR_JSON_MAX_DEPTH deep; nothing after the value. Schemas: "type" object
// (properties in the schema's order, each optional one skippable, required
// ones not; no other keys), array ("items", "minItems", "maxItems"), string
// ("minLength", "maxLength" in code points),
// number, integer, boolean, null, a list of types, "enum", "const", "anyOf"
// / "oneOf" of literal-free alternatives is refused; an empty schema or {}
// is any value. A schema keyword that would change the language and is not
// implemented ($ref, pattern, minLength, ...) is refused when compiling,
// never ignored.
#ifndef TPR_ENGINE_JSON_GRAMMAR_H
#define TPR_ENGINE_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define TPR_JSON_MAX_WS 20
#define TPR_JSON_MAX_NUMBER 24
#define TPR_JSON_MAX_DEPTH 24

typedef struct tpr_json_grammar tpr_json_grammar;

// schema NULL: any JSON object (OpenAI's json_object). prefix / suffix
// (NULL: none): literal text before and after the value (a tool call's
// tags). NULL with err set when the schema uses what is not implemented.
tpr_json_grammar *tpr_json_grammar_new(const cJSON *schema, const char *prefix, const char *suffix, char *err,
                                       size_t errlen);
void tpr_json_grammar_free(tpr_json_grammar *g);

// One tool call among n functions: {"<name_key>": one of names, "<args_key>":
// an object valid under that function's parameters schema (params[i]; NULL:
// any object)}, with prefix / suffix as above (a forced tool call).
tpr_json_grammar *tpr_json_grammar_new_call(int n, const char *const *names, const cJSON *const *params,
                                            const char *name_key, const char *args_key, const char *prefix,
                                            const char *suffix, char *err, size_t errlen);

typedef struct tpr_json_frame {
  const void *node;
  int32_t phase, idx, pos, ws;
  int32_t sel;    // objects: which literal a selector property's value was (a tool call's name)
  uint64_t cand;  // literal candidates; objects: the key's candidates, then the property whose value comes
} tpr_json_frame;

// The automaton's state: a plain value (copy it to branch).
typedef struct tpr_json_state {
  int32_t depth;  // frames in use; 0 with done: the value is complete
  bool done, dead;
  tpr_json_frame f[TPR_JSON_MAX_DEPTH];
} tpr_json_state;

void tpr_json_state_init(tpr_json_state *s, const tpr_json_grammar *g);
// Feeds bytes; false (and s dead) when they leave the language.
bool tpr_json_state_feed(tpr_json_state *s, const char *bytes, size_t n);
// Whether the text so far is a whole sentence of the language (the end of
// the output may come here).
bool tpr_json_state_complete(const tpr_json_state *s);

// A canonical form of a state, for telling states apart by what may follow
// them (token_constraint.c caches masks by it): states with equal keys
// accept the same byte strings and are complete alike. It keeps what the
// automaton reads (the frames in use, and the frame just popped when an
// object reads it next) and drops what it cannot tell apart (a string's or
// an array's count beyond the bounds it is compared with). Writes at most
// TPR_JSON_KEY_WORDS words; returns how many.
#define TPR_JSON_KEY_WORDS (2 + 5 * (TPR_JSON_MAX_DEPTH + 1))
int tpr_json_state_key(const tpr_json_state *s, uint64_t *key);

#endif
