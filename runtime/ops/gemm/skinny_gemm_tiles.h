// The part of a vector variant of the skinny GEMM that does not depend on
// the vector width: the table of register-tile instances and the loop over
// weight rows. Included by skinny_gemm_avx2.c and skinny_gemm_avx512.c, in
// their target region, after they define
//   DT_F32, DT_BF16, DT_FP8                           the weight dtypes
//   MRMAX                                             activation rows per tile, 2 or 6
//   unsigned tile(p, n, m0, RR, MR, dt)               an RR x MR register tile, the bitmask
//                                                     of rows the portable code must redo
//   void row_dot1(p, n, dt)                           one activation row, f32 or bf16 weights
// Tiles span 4 weight rows, or 1 for the rows left at the end.
#ifndef TPR_SKINNY_GEMM_TILES_H
#define TPR_SKINNY_GEMM_TILES_H

#define SG_RR 4

typedef unsigned (*tile_fn)(const tpr__sg_args *, int64_t, int64_t);
#define INST(DT, RR, MR) \
  static unsigned tile_##DT##_##RR##_##MR(const tpr__sg_args *p, int64_t n, int64_t m0) { return tile(p, n, m0, RR, MR, DT); }
#if MRMAX == 6
#define INST_MR(DT, RR) INST(DT, RR, 1) INST(DT, RR, 2) INST(DT, RR, 3) INST(DT, RR, 4) INST(DT, RR, 5) INST(DT, RR, 6)
#define ROW_MR(DT, RR) {tile_##DT##_##RR##_1, tile_##DT##_##RR##_2, tile_##DT##_##RR##_3, \
                        tile_##DT##_##RR##_4, tile_##DT##_##RR##_5, tile_##DT##_##RR##_6}
#elif MRMAX == 2
#define INST_MR(DT, RR) INST(DT, RR, 1) INST(DT, RR, 2)
#define ROW_MR(DT, RR) {tile_##DT##_##RR##_1, tile_##DT##_##RR##_2}
#else
#error "skinny_gemm_tiles.h: MRMAX must be 2 or 6"
#endif
INST_MR(DT_F32, 4) INST_MR(DT_F32, 1) INST_MR(DT_BF16, 4) INST_MR(DT_BF16, 1) INST_MR(DT_FP8, 4) INST_MR(DT_FP8, 1)
static const tile_fn tiles[3][2][MRMAX] = {
    {ROW_MR(DT_F32, 4), ROW_MR(DT_F32, 1)},
    {ROW_MR(DT_BF16, 4), ROW_MR(DT_BF16, 1)},
    {ROW_MR(DT_FP8, 4), ROW_MR(DT_FP8, 1)},
};

static int weight_dt(const tpr__sg_args *p) {
  return p->w->dtype == TPR_F32 ? DT_F32 : p->w->dtype == TPR_BF16 ? DT_BF16 : DT_FP8;
}

static void rows_dot1_f32(const tpr__sg_args *p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n++) row_dot1(p, n, DT_F32);
}
static void rows_dot1_bf16(const tpr__sg_args *p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n++) row_dot1(p, n, DT_BF16);
}

// Output columns [n0, n1) through the tiles. Row tile outer, activation rows
// inner: the tile's weights stay in cache while each group of MRMAX
// activation rows passes over them. Rows a tile flags (an FP8 NaN byte, a
// scale too large for the bit trick) are redone by the portable code.
static void rows_tiled(const tpr__sg_args *p, int64_t n0, int64_t n1, int dt) {
  for (int64_t n = n0; n < n1;) {
    int rr = n1 - n >= SG_RR ? SG_RR : 1;
    unsigned bad = 0;
    for (int64_t m0 = 0; m0 < p->M; m0 += MRMAX) {
      int64_t mr = p->M - m0 < MRMAX ? p->M - m0 : MRMAX;
      bad |= tiles[dt][rr == SG_RR ? 0 : 1][mr - 1](p, n, m0);
    }
    for (int r = 0; r < rr; r++)
      if (bad & (1u << r)) tpr__sg_rows_portable(p, n + r, n + r + 1);
    n += rr;
  }
}

#endif
