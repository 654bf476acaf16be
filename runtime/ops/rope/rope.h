// RoPE variants of the rope op (TPR_OP_ROPE): the pair layout and MRoPE's
// three position axes: two separate switches.
//
//  - pairing: which two dims of a head one angle rotates.
//      HALF (GPT-NeoX, transformers' rotate_half): (d, d + rd/2)
//      INTERLEAVE (GPT-J): (2d, 2d + 1)
//  - MRoPE layout: which position axis (temporal, height, width) angle d of
//    the half dimension reads, with positions (3, T) and mrope_section
//    [t, h, w] (t + h + w = rd/2):
//      NONE: positions (T), the plain rope
//      SECTIONED (Qwen2-VL / Qwen2.5-VL, apply_multimodal_rotary_pos_emb):
//        d in [0, t) -> T, [t, t+h) -> H, [t+h, rd/2) -> W
//      INTERLEAVED (Qwen3-VL, recomposition_frequencies): T everywhere,
//        except H at d in slice(1, 3h, 3) and W at d in slice(2, 3w, 3)
//        (python slice bounds: d < 3h, d < 3w)
//
// The op's attributes: i[0] rotary_dim, i[1] pairing, i[2] layout,
// i[3..5] section; f[0] theta. A one-attribute rope (n_i = 1) is the plain
// NeoX rope, so programs serialized before the variants read the same.
#ifndef TPR_OPS_ROPE_H
#define TPR_OPS_ROPE_H

#include <stdint.h>

#include "runtime/ops.h"

#ifdef __CUDACC__
#define TPR__ROPE_HD __host__ __device__
#else
#define TPR__ROPE_HD
#endif

typedef enum tpr_rope_pairing {
  TPR_ROPE_PAIR_HALF = 0,        // NeoX rotate-half
  TPR_ROPE_PAIR_INTERLEAVE = 1,  // GPT-J even/odd
} tpr_rope_pairing;

typedef enum tpr_mrope_layout {
  TPR_MROPE_NONE = 0,
  TPR_MROPE_SECTIONED = 1,    // Qwen2-VL, Qwen2.5-VL
  TPR_MROPE_INTERLEAVED = 2,  // Qwen3-VL
} tpr_mrope_layout;

typedef struct tpr_rope_opts {
  int64_t rotary_dim;
  float theta;
  tpr_rope_pairing pairing;
  tpr_mrope_layout layout;
  int64_t section[3];  // t, h, w (layout != NONE); sum = rotary_dim / 2
} tpr_rope_opts;

// The op attributes of `o` (no checks: the op's shape rule checks them).
tpr_op_attrs tpr_rope_attrs(const tpr_rope_opts *o);

// The attributes' variant; TPR_ERR_INVALID_ARG naming `op` when a value is
// out of range (pairing, layout, sections that do not sum to rotary_dim/2).
// Missing i[1..] read as HALF / NONE.
tpr_status tpr__rope_variant(const char *op, const tpr_op_attrs *at, tpr_rope_opts *o);

// The position axis (0 T, 1 H, 2 W) angle d (in [0, rotary_dim/2)) reads.
static inline TPR__ROPE_HD int tpr__mrope_axis(int layout, const int64_t *sec, int64_t d) {
  if (layout == TPR_MROPE_SECTIONED) return d < sec[0] ? 0 : d < sec[0] + sec[1] ? 1 : 2;
  if (layout == TPR_MROPE_INTERLEAVED) {
    if (d % 3 == 1 && d < 3 * sec[1]) return 1;
    if (d % 3 == 2 && d < 3 * sec[2]) return 2;
  }
  return 0;
}

// x (T, heads, D) f32, positions (T) i32/i64 (layout NONE) or (3, T)
// (rows T, H, W); out (T, heads, D). Angle d < rd/2 = (float)pos[axis(d)] *
// inv_freq[d] in f32 as tpr_rope computes it, applied to the pair of dims the
// pairing names; dims [rotary_dim, D) are copied. Positions are not range
// checked: any integer is an angle. (tpr_pb_rope_ex in program.h builds it.)
#ifndef __CUDACC__
tpr_status tpr_rope_ex(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *positions, const tpr_rope_opts *o,
                       tpr_tensor *out);
#endif

#endif
