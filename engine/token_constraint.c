// token_constraint.h: a mask is the vocabulary tried against a copy of the
// automaton's state, token by token (a token whose first byte the state
// refuses is skipped after one lookup of that byte).
#include "engine/token_constraint.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct tpr_vocab_bytes {
  int64_t n;
  int64_t *off;  // (n + 1) offsets into bytes; an id without bytes has off[id] == off[id + 1]
  char *bytes;
};

tpr_status tpr_vocab_bytes_new(const tpr_tokenizer *tok, int64_t vocab, tpr_vocab_bytes **out) {
  tpr_vocab_bytes *v = calloc(1, sizeof *v);
  size_t cap = 1 << 16, len = 0;
  if (v) v->off = calloc((size_t)vocab + 1, sizeof *v->off), v->bytes = malloc(cap);
  if (!v || !v->off || !v->bytes) {
    tpr_vocab_bytes_free(v);
    return TPR_FAIL(TPR_ERR_OOM, "structured output: the vocabulary's bytes");
  }
  v->n = vocab;
  for (int64_t id = 0; id < vocab; id++) {
    v->off[id] = (int64_t)len;
    if (id >= tpr_tokenizer_vocab_size(tok) || tpr_tokenizer_is_special(tok, (int32_t)id)) continue;
    int32_t one = (int32_t)id;
    char *text = NULL;
    size_t n = 0;
    if (tpr_tokenizer_decode_known(tok, &one, 1, false, &text, &n) != TPR_OK) {
      tpr_clear_error();
      continue;
    }
    if (len + n > cap) {
      while (len + n > cap) cap *= 2;
      char *b = realloc(v->bytes, cap);
      if (!b) {
        free(text);
        tpr_vocab_bytes_free(v);
        return TPR_FAIL(TPR_ERR_OOM, "structured output: the vocabulary's bytes");
      }
      v->bytes = b;
    }
    memcpy(v->bytes + len, text, n);
    len += n;
    free(text);
  }
  v->off[vocab] = (int64_t)len;
  *out = v;
  return TPR_OK;
}

void tpr_vocab_bytes_free(tpr_vocab_bytes *v) {
  if (!v) return;
  free(v->off), free(v->bytes), free(v);
}

int64_t tpr_vocab_bytes_size(const tpr_vocab_bytes *v) { return v->n; }

void tpr_token_constraint_init(tpr_token_constraint *c, const tpr_json_grammar *g, const tpr_vocab_bytes *v,
                               int32_t stop_token) {
  memset(c, 0, sizeof *c);
  c->grammar = g, c->vocab = v, c->stop_token = stop_token;
  tpr_json_state_init(&c->state, g);
  c->last_fed = -1;
}

static void feed_token(tpr_token_constraint *c, int32_t id) {
  const tpr_vocab_bytes *v = c->vocab;
  if (id < 0 || id >= v->n) {
    c->state.dead = true;
    return;
  }
  tpr_json_state_feed(&c->state, v->bytes + v->off[id], (size_t)(v->off[id + 1] - v->off[id]));
}

// Copies the part of a state in use (its frames up to depth).
static void copy_state(tpr_json_state *dst, const tpr_json_state *src) {
  memcpy(dst, src, offsetof(tpr_json_state, f) + (size_t)src->depth * sizeof src->f[0]);
}

int64_t tpr_token_constraint_mask(tpr_token_constraint *c, const int32_t *gen, int64_t n, uint64_t *allow) {
  const tpr_vocab_bytes *v = c->vocab;
  // Bring the cached state to gen[0, n): go on from it when it saw a prefix of gen, else replay.
  if (c->n_fed > n || (c->n_fed > 0 && gen[c->n_fed - 1] != c->last_fed)) {
    tpr_json_state_init(&c->state, c->grammar);
    c->n_fed = 0;
  }
  for (; c->n_fed < n; c->n_fed++) feed_token(c, gen[c->n_fed]);
  c->last_fed = n > 0 ? gen[n - 1] : -1;
  memset(allow, 0, (size_t)tpr_mask_words(v->n) * sizeof *allow);
  int64_t count = 0;
  if (!c->state.dead) {
    // Which first bytes the state takes: most tokens are refused by their first.
    bool first_ok[256];
    tpr_json_state t;
    for (int b = 0; b < 256; b++) {
      copy_state(&t, &c->state);
      char ch = (char)b;
      first_ok[b] = tpr_json_state_feed(&t, &ch, 1);
    }
    for (int64_t id = 0; id < v->n; id++) {
      const int64_t o = v->off[id], len = v->off[id + 1] - o;
      if (!len || !first_ok[(unsigned char)v->bytes[o]]) continue;
      copy_state(&t, &c->state);
      if (tpr_json_state_feed(&t, v->bytes + o, (size_t)len)) allow[id / 64] |= 1ull << (id % 64), count++;
    }
  }
  const int32_t s = c->stop_token;
  if (s >= 0 && s < v->n && (count == 0 || tpr_json_state_complete(&c->state)) && !(allow[s / 64] >> (s % 64) & 1))
    allow[s / 64] |= 1ull << (s % 64), count++;
  return count;
}
