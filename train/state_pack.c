// Packed sequences (docs/training.md "Packed sequences"): a training window
// holds several documents, each ended by the tokenizer's EOS. As Megatron-LM's
// get_ltor_masks_and_position_ids with reset_position_ids,
// reset_attention_mask and eod_mask_loss: a new document starts right after
// every EOS inside the window (the window's first token starts one, whatever
// came before it); positions restart at 0 there; a token attends only the
// tokens of its own document up to itself (the program's attention in its
// document form, lower bound "attn_lo"); the loss skips every position whose
// input token is EOS, which would predict the next document's first token.
// When the data records where its documents start (tpr data prepare's
// document offsets), those starts replace the EOS rule: needed where the
// EOS token also ends every turn inside a document (ChatML's <|im_end|>).
#include <stdlib.h>
#include <string.h>

#include "train/state_impl.h"

// A document begins at position i (> 0): recorded, or the input before it is EOS.
static bool begins(const tpr_train_state *t, const int32_t *inputs, int64_t i) {
  return t->doc_starts ? t->doc_starts[i] != 0 : inputs[i - 1] == t->o.eos_id;
}

// The target at i predicts the next document's first token: ignored.
static bool crosses(const tpr_train_state *t, const int32_t *inputs, int64_t i) {
  return t->doc_starts ? t->doc_starts[i + 1] != 0 : inputs[i] == t->o.eos_id;
}

void tpr_train_set_doc_starts(tpr_train_state *t, const uint8_t *starts) { t->doc_starts = starts; }
bool tpr_train_packed(const tpr_train_state *t) { return t->o.pack; }

int64_t tpr_train_scored(const tpr_train_state *t, const int32_t *inputs, const int32_t *targets) {
  int64_t n = 0;
  for (int64_t i = 0; i < t->o.seq_len; i++) n += targets[i] != -100 && !(t->o.pack && crosses(t, inputs, i));
  return n;
}

tpr_status tpr__train_bind_pack(tpr_train_state *t, const int32_t *inputs, const int32_t *targets,
                                const int32_t **targets_out) {
  const int64_t T = t->o.seq_len;
  if (!t->pack_host && !(t->pack_host = malloc((size_t)(5 * T) * sizeof *t->pack_host)))
    return TPR_FAIL(TPR_ERR_OOM, "train: packed sequence staging");
  int32_t *lo = t->pack_host, *tg = lo + T, *pos = tg + T;  // (T), (T), (3, T)
  int64_t doc = 0;  // the current document's first position
  for (int64_t i = 0; i < T; i++) {
    if (i > 0 && begins(t, inputs, i)) doc = i;
    lo[i] = (int32_t)doc;
    pos[i] = (int32_t)(t->o.pack_debug & TPR_PACK_DEBUG_NO_POSITIONS ? i : i - doc);
    tg[i] = crosses(t, inputs, i) ? -100 : targets[i];
  }
  TPR_CHECK(tpr_tensor_from_host(t->positions, pos, (size_t)T * sizeof *pos));
  if (t->attn_lo) TPR_CHECK(tpr_tensor_from_host(t->attn_lo, lo, (size_t)T * sizeof *lo));
  if (t->pos3) {  // MRoPE: a text document's rows are all its positions (get_rope_index's text rule)
    memcpy(pos + T, pos, (size_t)T * sizeof *pos);
    memcpy(pos + 2 * T, pos, (size_t)T * sizeof *pos);
    TPR_CHECK(tpr_tensor_from_host(t->pos3, pos, (size_t)(3 * T) * sizeof *pos));
  }
  *targets_out = tg;
  return TPR_OK;
}
