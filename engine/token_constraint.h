// Which tokens may come next in a sequence under a grammar (structured
// output, docs/serve.md): the JSON automaton of json_grammar.h run over the
// bytes each token id stands for. Rank 0 computes a sequence's mask when it
// plans the step that samples it, from the tokens generated so far, and the
// step plan carries the mask to the ranks that sample (as vLLM's scheduler
// sends its grammar bitmasks to the workers).
#ifndef TPR_ENGINE_TOKEN_CONSTRAINT_H
#define TPR_ENGINE_TOKEN_CONSTRAINT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/json_grammar.h"
#include "runtime/status.h"
#include "tokenizer/tokenizer.h"

// Each id's bytes (its decoded text; special tokens and ids without text
// have none and are never allowed, the stop token aside).
typedef struct tpr_vocab_bytes tpr_vocab_bytes;
tpr_status tpr_vocab_bytes_new(const tpr_tokenizer *tok, int64_t vocab, tpr_vocab_bytes **out);
void tpr_vocab_bytes_free(tpr_vocab_bytes *v);
int64_t tpr_vocab_bytes_size(const tpr_vocab_bytes *v);
// From given byte strings (bytes[id] NULL or lens[id] 0: an id without
// bytes): a synthetic vocabulary (tests, measurements).
tpr_status tpr_vocab_bytes_from(int64_t vocab, const char *const *bytes, const size_t *lens, tpr_vocab_bytes **out);
// id's bytes (id in [0, size); *len 0: none), and how many nodes the vocabulary's byte trie has.
const char *tpr_vocab_bytes_token(const tpr_vocab_bytes *v, int64_t id, size_t *len);
int64_t tpr_vocab_bytes_trie_nodes(const tpr_vocab_bytes *v);

// A sequence's constraint: the grammar, the vocabulary and the stop token
// (allowed exactly when the text so far is complete; also the only token
// allowed once nothing else can follow). Borrowed pointers; the constraint
// caches the automaton's state over the generated tokens it has seen, so
// one constraint serves one sequence. Init a new one; tpr_token_constraint_free
// frees what its masks allocated.
typedef struct tpr_token_constraint {
  const tpr_json_grammar *grammar;
  const tpr_vocab_bytes *vocab;
  int32_t stop_token;
  // cache: the state after gen[0, n_fed)
  tpr_json_state state;
  int64_t n_fed;
  int32_t last_fed;  // gen[n_fed - 1] (a different history restarts the replay)
  // The last masks by state key (tpr_json_state_key): inside a string, say,
  // one step's state is the last one's as far as what may follow goes.
  struct tpr_mask_cache *cache;  // NULL until the first mask (or when there was no memory for it)
} tpr_token_constraint;

void tpr_token_constraint_init(tpr_token_constraint *c, const tpr_json_grammar *g, const tpr_vocab_bytes *v,
                               int32_t stop_token);
// Frees the constraint's mask cache (the constraint itself is the caller's).
void tpr_token_constraint_free(tpr_token_constraint *c);
// Brings the cached state to the one after gen[0, n) (the mask does this first).
void tpr_token_constraint_advance(tpr_token_constraint *c, const int32_t *gen, int64_t n);
// Words of a mask over vocab ids (bit id of word id / 64).
static inline int64_t tpr_mask_words(int64_t vocab) { return (vocab + 63) / 64; }
// Sets allow (tpr_mask_words(vocab) words) to the ids that may follow the
// generated tokens gen[0, n); returns how many are allowed (>= 1: when the
// text has left the grammar, which the mask prevents, only the stop token).
// A walk of the vocabulary's byte trie from the state: each byte of a prefix
// that tokens share is fed once; a state whose key one of the last masks
// had takes that mask (token_constraint.c).
int64_t tpr_token_constraint_mask(tpr_token_constraint *c, const int32_t *gen, int64_t n, uint64_t *allow);

#endif
