// The Precompiled normalizer: SentencePiece's normalization rules compiled
// into a charsmap (base64 in tokenizer.json): a little-endian u32 byte size,
// a Darts double-array trie over the rules' source strings, then the
// NUL-terminated replacement strings the trie's values point into.
//
// As in the reference: the text is cut into extended grapheme clusters; a
// cluster under 6 bytes is looked up whole, else (or when it has no rule)
// each character on its own. A lookup takes the trie's first, i.e. shortest,
// rule that is a prefix of the key, so a cluster "k + combining acute" with a
// rule for "k" becomes that rule's output alone.
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_impl.h"

static int b64v(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

tpr_status tok_precompiled_parse(const char *file, const char *b64, tok_norm *nm) {
  size_t n = strlen(b64), nb = 0;
  unsigned char *raw = malloc(n / 4 * 3 + 3);
  if (!raw) return TPR_FAIL(TPR_ERR_OOM, "%s: precompiled_charsmap", file);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n && b64[i] != '='; i++) {
    int v = b64v(b64[i]);
    if (v < 0) {
      free(raw);
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: normalizer Precompiled: precompiled_charsmap is not base64", file);
    }
    acc = acc << 6 | (uint32_t)v, bits += 6;
    if (bits >= 8) bits -= 8, raw[nb++] = (unsigned char)(acc >> bits);
  }
  uint32_t tsize = 0;  // little-endian
  for (int k = 3; nb >= 4 && k >= 0; k--) tsize = tsize << 8 | raw[k];
  if (nb < 4 || tsize % 4 || tsize > nb - 4 || tsize == 0) {
    free(raw);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: normalizer Precompiled: charsmap of %zu bytes has no valid trie", file, nb);
  }
  nm->pc_n = tsize / 4;
  nm->pc = malloc(tsize);
  nm->str_len = nb - 4 - tsize;
  nm->str = malloc(nm->str_len + 1);
  if (!nm->pc || !nm->str) {
    free(raw);
    return TPR_FAIL(TPR_ERR_OOM, "%s: precompiled_charsmap", file);
  }
  for (size_t i = 0; i < nm->pc_n; i++) {
    const unsigned char *u = raw + 4 + 4 * i;
    nm->pc[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
  }
  memcpy(nm->str, raw + 4 + tsize, nm->str_len);
  nm->str[nm->str_len] = 0;
  free(raw);
  if (tok_utf8_valid_prefix(nm->str, nm->str_len) != nm->str_len)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: normalizer Precompiled: replacement strings are not UTF-8", file);
  return TPR_OK;
}

// The replacement of the shortest rule that prefixes s[0..n), or NULL.
static const char *lookup(const tok_norm *nm, const char *s, size_t n, size_t *len) {
  const uint32_t *a = nm->pc;
  size_t pos = 0;
#define OFFSET(u) (((u) >> 10) << (((u) & (1u << 9)) >> 6))
  pos ^= OFFSET(a[0]);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == 0) break;
    pos ^= c;
    if (pos >= nm->pc_n) return NULL;
    uint32_t u = a[pos];
    if ((u & (0x80000000u | 0xFF)) != c) return NULL;  // label
    pos ^= OFFSET(u);
    if (pos >= nm->pc_n) return NULL;
    if ((u >> 8) & 1) {  // has a leaf: its value indexes the replacements
      size_t v = a[pos] & 0x7FFFFFFFu;
      if (v > nm->str_len) return NULL;
      *len = strlen(nm->str + v);
      return nm->str + v;
    }
  }
#undef OFFSET
  return NULL;
}

tpr_status tok_precompiled_apply(const tok_norm *nm, const char *in, size_t n, tok_buf *out) {
  utf8proc_int32_t state = 0;
  for (size_t gs = 0; gs < n;) {
    int32_t cp, next;
    size_t ge = gs + (size_t)tok_utf8_next(in + gs, n - gs, &cp);
    while (ge < n) {  // the end of this grapheme cluster
      int l = tok_utf8_next(in + ge, n - ge, &next);
      // a mark newer than utf8proc's tables extends the cluster, as the reference's do
      if (utf8proc_grapheme_break_stateful(cp, next, &state) && !tok_hf_grapheme_join(next)) break;
      cp = next, ge += (size_t)l;
    }
    size_t rl;
    const char *r = ge - gs < 6 ? lookup(nm, in + gs, ge - gs, &rl) : NULL;
    if (r) TPR_CHECK(tok_buf_put(out, r, rl));
    for (size_t i = gs; !r && i < ge;) {
      int l = tok_utf8_next(in + i, ge - i, &cp);
      const char *c = lookup(nm, in + i, (size_t)l, &rl);
      TPR_CHECK(c ? tok_buf_put(out, c, rl) : tok_buf_put(out, in + i, (size_t)l));
      i += (size_t)l;
    }
    gs = ge;
  }
  return TPR_OK;
}
