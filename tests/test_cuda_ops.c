// Op-by-op comparison of the CUDA backend against the CPU backend (the
// reference): every op kind with a CUDA kernel runs on fresh random inputs
// (seed printed; rerun with TPR_TEST_SEED=...) over several shapes, edge
// sizes (1, odd) and strided inputs (permuted, sliced and every-other-element
// views), on both backends; the CUDA output is poisoned with NaN bytes
// before each run so an element the kernel does not write shows up. Each op
// has a negative control: one input element is changed on the CUDA side
// only, and the same comparison must then fail.
//
// Bounds, max |cuda - cpu| / max |cpu| over the output:
//   0 (bit for bit): cast, embedding, index_select, embedding_shard,
//     cache_write -- byte moves and exact conversion rules;
//   1e-5: elementwise, norms, sum_squares, softmax, rope, router, sparse
//     attention (double scores on both sides) -- the same
//     formulas; only f32 sums run in another order and expf/sinf/cosf/powf
//     differ from glibc's by an ulp or two;
//   1e-4: matmul, attention, moe_experts, lightning attention (prefill, its
//     backward, decode, the engine's paged step and its state pool) -- GEMM-sized sums accumulated in
//     another order (cuBLAS vs OpenBLAS).
//
// Without a CUDA device it exits 77 (ctest: skipped). TPR_CUDA_OPS_SELFTEST=1
// runs everything with a second CPU backend in place of the GPU instead: the
// comparisons are then exact and the negative controls must still fail, which
// checks this test itself on machines without a GPU.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ops_harness.h"
#include "runtime/backend_cuda.h"

// ---------------------------------------------------------------- ops

static void test_matmul(void **state) {
  static const int64_t dims[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {64, 128, 96}};  // M, K, N
  static const int lay[] = {0, L_PERM, L_SLICE};
  for (int d = 0; d < 4; d++) {
    const int64_t M = dims[d][0], K = dims[d][1], N = dims[d][2];
    for (int t = 0; t < 4; t++) {
      const bool ta = t & 1, tb = t & 2;
      tpr_op_attrs at = {.n_i = 2, .i = {ta, tb}};
      const int64_t as[2] = {ta ? K : M, ta ? M : K}, bs[2] = {tb ? N : K, tb ? K : N};
      char tag[64];
      snprintf(tag, sizeof tag, "M=%lld K=%lld N=%lld ta=%d tb=%d", (long long)M, (long long)K, (long long)N, ta, tb);
      for (int la = 0; la < 3; la++)
        for (int lb = 0; lb < 3; lb++) {
          pair in[2] = {rand_pair(2, as, lay[la]), rand_pair(2, bs, lay[lb])};
          op_case *k = check(TPR_OP_MATMUL, &at, 2, in, "%s layouts %d,%d", tag, lay[la], lay[lb]);
          if (d == 1 && t == 0 && la == 1 && lb == 2) negative(k, 0, 0, 1.0);
        }
      // Batched: (2, 3, ...) @ (2, 3, ...), and @ a shared 2-D b. A reversed
      // 3-D stack has no unit stride in its matrices: the scratch-copy path.
      const int64_t ab[4] = {2, 3, as[0], as[1]}, bb[4] = {2, 3, bs[0], bs[1]}, a3[3] = {5, as[0], as[1]};
      for (int l = 0; l < 3; l++) {
        const pair b4 = rand_pair(4, bb, lay[2 - l]), b2 = rand_pair(2, bs, lay[l]), b2r = rand_pair(2, bs, lay[2 - l]);
        check(TPR_OP_MATMUL, &at, 2, (pair[]){rand_pair(4, ab, lay[l]), b4}, "batched %s layout %d", tag, lay[l]);
        check(TPR_OP_MATMUL, &at, 2, (pair[]){rand_pair(4, ab, lay[l]), b2}, "shared b %s layout %d", tag, lay[l]);
        check(TPR_OP_MATMUL, &at, 2, (pair[]){rand_pair(3, a3, lay[l]), b2r}, "stack %s layout %d", tag, lay[l]);
      }
    }
  }
}

static void test_add_mul(void **state) {
  static const struct { int na, nb; int64_t a[3], b[3]; } sh[] = {
      {3, 3, {3, 5, 7}, {3, 5, 7}}, {3, 2, {4, 1, 6}, {5, 1}}, {1, 2, {1}, {2, 3}},
      {1, 1, {7}, {1}},             {3, 1, {2, 3, 4}, {4}},   {0, 1, {0}, {3}},
  };
  for (int s = 0; s < 6; s++)
    for (int l = 0; l < N_LAYOUTS; l++)
      for (int op = 0; op < 2; op++) {
        const int lb = sh[s].nb ? layouts[(l + 2) % N_LAYOUTS] : 0;
        pair in[2] = {rand_pair(sh[s].na, sh[s].a, sh[s].na ? layouts[l] : 0), rand_pair(sh[s].nb, sh[s].b, lb)};
        op_case *k = check(op ? TPR_OP_MUL : TPR_OP_ADD, NULL, 2, in, "shapes #%d layouts %d,%d", s, layouts[l], lb);
        if (s == 1 && l == 1) negative(k, 0, 0, 1.0);
      }
}

static void test_rms_norm_swiglu(void **state) {
  static const struct { int nd; int64_t s[3]; } sh[] = {{2, {5, 33}}, {2, {1, 1}}, {3, {2, 3, 64}}, {2, {4, 1000}}};
  for (int s = 0; s < 4; s++)
    for (int l = 0; l < N_LAYOUTS; l++) {
      const int nd = sh[s].nd;
      const int64_t *shape = sh[s].s, H = shape[nd - 1];
      tpr_op_attrs at = {.n_f = 1, .f = {1e-6f}};
      pair in[2] = {rand_pair(nd, shape, layouts[l]), rand_pair(1, &H, l % 2 ? L_COL : 0)};
      op_case *k = check(TPR_OP_RMS_NORM, &at, 2, in, "shape #%d layout %d", s, layouts[l]);
      if (s == 0 && l == 1) negative(k, 0, 0, 1.0);
      pair sw[2] = {rand_pair(nd, shape, layouts[l]), rand_pair(nd, shape, layouts[(l + 1) % N_LAYOUTS])};
      k = check(TPR_OP_SWIGLU, NULL, 2, sw, "shape #%d layout %d", s, layouts[l]);
      if (s == 0 && l == 1) negative(k, 1, 0, 1.0);
      // sigmoid and its backward on fresh inputs (a negative control leaves
      // its input changed on the GPU side), x from N(0, 30) with the edges
      // +-100, +-17.5 and 0 first.
      const int64_t n = tpr_shape_numel(nd, shape);
      float *x = rand_f32(n);
      static const float edge[] = {100.0f, -100.0f, 17.5f, -17.5f, 0.0f};
      for (int64_t i = 0; i < n; i++) x[i] = i < 5 ? edge[i] : 30.0f * x[i];
      pair sg[2] = {pair_from(TPR_F32, nd, shape, layouts[l], x), rand_pair(nd, shape, layouts[(l + 2) % N_LAYOUTS])};
      k = check(TPR_OP_SIGMOID_BWD, NULL, 2, sg, "shape #%d layout %d", s, layouts[l]);
      if (s == 0 && l == 1) negative(k, 1, 4, 1.0);  // dy at x = 0, where the slope is 1/4
      k = check(TPR_OP_SIGMOID, NULL, 1, sg, "shape #%d layout %d", s, layouts[l]);
      if (s == 0 && l == 1) negative(k, 0, 4, 1.0);
    }
}

static void test_softmax(void **state) {
  static const struct { int nd; int64_t s[3]; } sh[] = {{2, {4, 37}}, {2, {3, 1}}, {3, {2, 3, 128}}, {2, {2, 1000}}};
  for (int s = 0; s < 4; s++)
    for (int l = 0; l < N_LAYOUTS; l++) {
      op_case *k = check(TPR_OP_SOFTMAX, NULL, 1, (pair[]){rand_pair(sh[s].nd, sh[s].s, layouts[l])},
                         "shape #%d layout %d", s, layouts[l]);
      if (s == 0 && l == 2) negative(k, 0, 0, 1.0);
    }
  // Degenerate rows: all -inf (zeros), a +inf (NaN), a NaN (NaN), some -inf.
  float *x = rand_f32(24);
  for (int i = 0; i < 6; i++) x[i] = -INFINITY;
  x[8] = INFINITY, x[15] = NAN, x[19] = x[22] = -INFINITY;
  check(TPR_OP_SOFTMAX, NULL, 1, (pair[]){pair_from(TPR_F32, 2, (const int64_t[]){4, 6}, L_PERM, x)}, "special rows");
}

static void test_sum_squares_rms_scale(void **state) {
  static const struct { int nd; int64_t s[3]; } sh[] = {{2, {4, 1000}}, {2, {3, 1}}, {3, {2, 3, 7}}, {2, {2, 0}}};
  for (int s = 0; s < 4; s++)
    for (int l = 0; l < N_LAYOUTS; l++) {
      const int nd = sh[s].nd;
      int64_t ss[3];
      memcpy(ss, sh[s].s, sizeof ss);
      ss[nd - 1] = 1;
      op_case *k = check(TPR_OP_SUM_SQUARES, NULL, 1, (pair[]){rand_pair(nd, sh[s].s, layouts[l])},
                         "shape #%d layout %d", s, layouts[l]);
      if (s == 0 && l == 1) negative(k, 0, 0, 1.0);
      const int64_t N = sh[s].s[nd - 1], rows = tpr_shape_numel(nd, ss);
      float *sq = rand_f32(rows);
      for (int64_t r = 0; r < rows; r++) sq[r] = fabsf(sq[r]) * (float)N + 0.1f;  // positive like a sum of squares
      tpr_op_attrs at = {.n_f = 2, .f = {48.0f, 1e-6f}};
      pair in[3] = {rand_pair(nd, sh[s].s, layouts[l]), pair_from(TPR_F32, nd, ss, l % 2 ? L_COL : 0, sq),
                    rand_pair(1, &N, l % 2 ? 0 : L_COL)};
      k = check(TPR_OP_RMS_SCALE, &at, 3, in, "shape #%d layout %d", s, layouts[l]);
      if (s == 0 && l == 1) negative(k, 1, 0, 5.0);
    }
}

// Any-dtype gathers: f32 tables, and others as random bytes moved unchanged.
static const tpr_dtype gather_dts[] = {TPR_F32, TPR_BF16, TPR_U8, TPR_I64};

static void test_embedding(void **state) {
  for (int d = 0; d < 4; d++)
    for (int l = 0; l < 3; l++)
      for (int h = 0; h < 2; h++) {
        const tpr_dtype dt = gather_dts[d], idt = l % 2 ? TPR_I64 : TPR_I32;
        const int64_t V = 11, H = h ? 6 : 1, ts[2] = {V, H}, is[2] = {2, 3};
        void *ids = rand_ids(idt, 6, 0, V - 1);
        set_id(ids, idt, 0, 0), set_id(ids, idt, 5, V - 1);
        pair in[2] = {pair_from(dt, 2, ts, layouts[l], rand_any(dt, V * H)),
                      pair_from(idt, 2, is, layouts[2 - l], ids)};
        op_case *k = check(TPR_OP_EMBEDDING, NULL, 2, in, "%s table H=%lld layout %d", tpr_dtype_name(dt), (long long)H,
                           layouts[l]);
        if (d == 0 && l == 1 && h) negative(k, 1, 0, 3);  // another token id
      }
}

static void test_index_select(void **state) {
  const int64_t xs[3] = {4, 5, 6};
  for (int d = 0; d < 4; d++)
    for (int dim = 0; dim < 3; dim++)
      for (int l = 0; l < 3; l++) {
        const tpr_dtype dt = gather_dts[d], idt = l == 1 ? TPR_I64 : TPR_I32;
        const int64_t n = dim == 1 ? 1 : 5;  // repeats when n exceeds the dim
        tpr_op_attrs at = {.n_i = 1, .i = {dim}};
        void *idx = rand_ids(idt, n, 0, xs[dim] - 1);
        pair in[2] = {pair_from(dt, 3, xs, layouts[l], rand_any(dt, 120)), pair_from(idt, 1, &n, l ? L_COL : 0, idx)};
        op_case *k = check(TPR_OP_INDEX_SELECT, &at, 2, in, "%s dim %d n=%lld layout %d", tpr_dtype_name(dt), dim,
                           (long long)n, layouts[l]);
        if (d == 0 && dim == 0 && l == 1) negative(k, 1, 0, (((int64_t *)idx)[0] + 1) % xs[dim]);  // another index
      }
}

// Every dtype pair, from a strided source holding the awkward values: NaN,
// infinities, ties and overflow of the narrow formats, subnormals, values
// past the integer ranges; narrow floats and ints as random bit patterns.
static void test_cast(void **state) {
  static const float special[] = {NAN, INFINITY, -INFINITY, 1e20f, -1e20f, 464.0f, 480.0f, 448.0f, 65520.0f,
                                  65504.0f, 1e-40f, -0.0f, 0.5f, 2.5f, -2.5f, 255.5f, 3e9f, -3e9f, 1e-7f};
  const int64_t shape[2] = {5, 7}, n = 35;
  for (int s = 0; s < TPR_DTYPE_COUNT; s++) {
    void *x = rand_any((tpr_dtype)s, n);
    if (s == TPR_F32) {
      float *f = x;
      for (int i = 0; i < n; i++) f[i] *= 300.0f;
      memcpy(f, special, sizeof special);
    } else if (s == TPR_I32 || s == TPR_I64) {  // half small values, half anything
      for (int i = 0; i < n / 2; i++) set_id(x, (tpr_dtype)s, i, tt_randint(-300, 300));
    }
    for (int d = 0; d < TPR_DTYPE_COUNT; d++)
      for (int l = 0; l < 3; l++) {
        tpr_op_attrs at = {.n_i = 1, .i = {d}};
        op_case *k =
            check(TPR_OP_CAST, &at, 1, (pair[]){pair_from((tpr_dtype)s, 2, shape, layouts[l], x)}, "%s -> %s layout %d",
                  tpr_dtype_name((tpr_dtype)s), tpr_dtype_name((tpr_dtype)d), layouts[l]);
        if (s == TPR_F32 && d == TPR_BF16 && l == 1) negative(k, 0, n - 1, 1e3);  // past a bf16 ulp at any |x| here
      }
  }
}

static void test_embedding_shard(void **state) {
  const int64_t Vl = 5, NS = 3, H = 6, fs[2] = {NS * Vl, H}, is[2] = {2, 4}, rs[1] = {4};
  for (int d = 0; d < 2; d++)
    for (int l = 0; l < 2; l++) {
      const tpr_dtype dt = d ? TPR_BF16 : TPR_F32, idt = l ? TPR_I64 : TPR_I32;
      void *v = rand_ids(idt, 8, 0, NS * Vl - 1);
      set_id(v, idt, 0, 0), set_id(v, idt, 1, Vl), set_id(v, idt, 2, NS * Vl - 1);  // shard edges
      set_id(v, idt, 3, 1000);  // an id past the vocabulary
      pair full = pair_from(dt, 2, fs, layouts[l], rand_any(dt, NS * Vl * H));
      pair ids = pair_from(idt, 2, is, l ? L_PERM : 0, v);
      int32_t rank_h[4] = {7, 9, 0, (int32_t)NS};  // (dp_rank, dp_size, tp_rank, tp_size)
      pair rank = pair_from(TPR_I32, 1, rs, 0, rank_h), shard = rank;
      shard.c = view_slice(rank.c, 0, 2, 1), shard.g = view_slice(rank.g, 0, 2, 1);
      for (int s = 0; s < NS; s++) {  // the shard is the rank tensor's contents, nothing else
        rank_h[2] = s;
        TT_OK(tpr_tensor_from_host(rank.rc, rank_h, sizeof rank_h));
        TT_OK(tpr_tensor_from_host(rank.rg, rank_h, sizeof rank_h));
        pair table = full;
        table.c = view_slice(full.c, 0, s * Vl, Vl), table.g = view_slice(full.g, 0, s * Vl, Vl);
        op_case *k = check(TPR_OP_EMBEDDING_SHARD, NULL, 3, (pair[]){table, ids, shard}, "%s shard %d layout %d",
                           tpr_dtype_name(dt), s, layouts[l]);
        if (s == 1 && d == 0 && l == 0) negative(k, 2, 0, 2);  // another shard value
      }
    }
}

static void test_rope(void **state) {
  static const struct { int64_t T, NH, D, rd; float theta; } cs[] = {
      {3, 2, 8, 8, 1e4f}, {5, 3, 10, 6, 1e4f}, {1, 1, 2, 2, 1e4f}, {4, 2, 64, 64, 1e6f}, {7, 3, 33, 32, 5e6f}};
  for (int c = 0; c < 5; c++)
    for (int l = 0; l < 3; l++) {
      const tpr_dtype pdt = l % 2 ? TPR_I64 : TPR_I32;
      const int64_t xs[3] = {cs[c].T, cs[c].NH, cs[c].D};
      void *pos = rand_ids(pdt, cs[c].T, 0, 100000);
      tpr_op_attrs at = {.n_i = 1, .i = {cs[c].rd}, .n_f = 1, .f = {cs[c].theta}};
      pair in[2] = {rand_pair(3, xs, layouts[l]), pair_from(pdt, 1, &cs[c].T, l ? L_COL : 0, pos)};
      op_case *k = check(TPR_OP_ROPE, &at, 2, in, "case %d layout %d", c, layouts[l]);
      if (c == 0 && l == 1) negative(k, 0, 0, 1.0);
    }
}

static void test_attention(void **state) {
  static const struct { int64_t T, S, start, Hq, Hkv, D; } cs[] = {
      {1, 9, 8, 4, 2, 8}, {6, 6, 0, 2, 2, 16}, {3, 12, 5, 6, 2, 1}, {4, 10, 2, 3, 1, 33}, {130, 140, 7, 2, 1, 16},
      {2, 8, 1, 1, 1, 130}};
  static const int kl[] = {0, L_PERM, L_SLICE};
  for (int c = 0; c < 6; c++)
    for (int l = 0; l < 3; l++) {
      const int64_t qs[3] = {cs[c].T, cs[c].Hq, cs[c].D}, ks[3] = {cs[c].S, cs[c].Hkv, cs[c].D};
      tpr_op_attrs at = {.n_f = 1, .f = {1.0f / sqrtf((float)cs[c].D)}};
      pair in[4] = {rand_pair(3, qs, l == 1 ? L_PERM : 0), rand_pair(3, ks, kl[l]), rand_pair(3, ks, kl[(l + 2) % 3]),
                    scalar_pair(l == 2 ? TPR_I64 : TPR_I32, cs[c].start)};
      op_case *k = check(TPR_OP_ATTENTION, &at, 4, in, "T=%lld S=%lld start=%lld Hq=%lld Hkv=%lld D=%lld layout %d",
                         (long long)cs[c].T, (long long)cs[c].S, (long long)cs[c].start, (long long)cs[c].Hq,
                         (long long)cs[c].Hkv, (long long)cs[c].D, l);
      if (c == 0 && l == 1) negative(k, 0, 0, 1.0);
      if (c == 1 && l == 0) negative(k, 2, 0, 1.0);  // v row 0: seen by every query
    }
}

// Attention's document form (ops.h: + lo (T) i32, contiguous as the CUDA
// kernel needs it): random document starts, one always inside the keys.
static void test_attention_docs(void **state) {
  static const struct { int64_t T, S, start, Hq, Hkv, D; } cs[] = {
      {6, 6, 0, 2, 2, 16}, {16, 16, 0, 4, 2, 8}, {5, 12, 7, 6, 2, 33}, {130, 140, 0, 2, 1, 16}};
  for (int c = 0; c < 4; c++) {
    const int64_t T = cs[c].T, start = cs[c].start, qs[3] = {T, cs[c].Hq, cs[c].D}, ks[3] = {cs[c].S, cs[c].Hkv, cs[c].D};
    int32_t *lo = hold_host(malloc((size_t)T * sizeof *lo));
    int64_t doc = 0, cut = 1 + tt_randint(0, start + T - 2);  // one document start in [1, start + T)
    for (int64_t t = 0; t < T; t++) {
      if (start + t == cut || (start + t > cut && tt_randint(0, 5) == 0)) doc = start + t;
      lo[t] = (int32_t)doc;
    }
    tpr_op_attrs at = {.n_i = 1, .i = {1}, .n_f = 1, .f = {1.0f / sqrtf((float)cs[c].D)}};
    pair in[5] = {rand_pair(3, qs, c % 2 ? L_PERM : 0), rand_pair(3, ks, 0), rand_pair(3, ks, c % 2 ? L_SLICE : 0),
                  scalar_pair(TPR_I32, start), pair_from(TPR_I32, 1, &T, 0, lo)};
    op_case *k = check(TPR_OP_ATTENTION, &at, 5, in, "documents T=%lld S=%lld start=%lld Hq=%lld Hkv=%lld D=%lld",
                       (long long)T, (long long)cs[c].S, (long long)start, (long long)cs[c].Hq, (long long)cs[c].Hkv,
                       (long long)cs[c].D);
    if (c == 1) negative(k, 4, T - 1, 0.0);  // the last query sees the earlier documents too
  }
}

// Lightning attention (ops.h): the blocked prefill, its backward and the
// decode step, T around the block size, q/k/v strided; the slopes are
// transformers' (positive, as the kernels require).
static void test_lightning(void **state) {
  static const struct { int64_t T, H, D, B; } cs[] = {{1, 2, 8, 4}, {4, 3, 16, 4}, {11, 2, 8, 4}, {37, 4, 16, 8},
                                                       {5, 1, 33, 64}, {130, 2, 64, 64}};
  for (int c = 0; c < 6; c++) {
    const int64_t T = cs[c].T, H = cs[c].H, D = cs[c].D, xs[3] = {T, H, D}, ss[3] = {H, D, D},
                  nd = T * H * D + H * D * D, bs[4] = {T, H, D, D};
    float *sl = hold_host(malloc((size_t)H * sizeof *sl));
    tpr_lightning_slopes(H, c % 3, 3, sl);
    const int l = c % 2 ? L_PERM : L_SLICE;
    tpr_op_attrs at = {.n_i = 1, .i = {cs[c].B}};
    pair in[6] = {rand_pair(3, xs, l), rand_pair(3, xs, 0), rand_pair(3, xs, l), rand_pair(3, ss, c % 2 ? L_PERM : 0),
                  pair_from(TPR_F32, 1, &H, 0, sl), rand_pair(1, &nd, 0)};
    // Decode, backward, then prefill: each negative control changes an input
    // on the GPU side that no later check of this case reads.
    pair din[5] = {in[0], in[1], in[2], rand_pair(4, bs, c % 2 ? L_SLICE : 0), in[4]};
    op_case *k = check(TPR_OP_LIGHTNING_DECODE, NULL, 5, din, "decode B=%lld H=%lld D=%lld", (long long)T, (long long)H,
                       (long long)D);
    if (c == 2) negative(k, 3, 0, 1.0);
    k = check(TPR_OP_LIGHTNING_ATTENTION_BWD, &at, 6, in, "backward T=%lld H=%lld D=%lld block %lld", (long long)T,
              (long long)H, (long long)D, (long long)cs[c].B);
    if (c == 2) negative(k, 5, nd - 1, 1.0);  // d(final state): reaches every gradient
    k = check(TPR_OP_LIGHTNING_ATTENTION, &at, 5, in, "prefill T=%lld H=%lld D=%lld block %lld", (long long)T,
              (long long)H, (long long)D, (long long)cs[c].B);
    if (c == 2) negative(k, 0, 0, 1.0);
  }
}

// InfLLM-v2 sparse attention (ops.h sparse_attention_paged): a sparse
// prefill past dense_len, a dense decode token and a padded token over a pool
// whose blocks are shuffled; scores and softmax are double on both backends.
static void test_sparse_attention(void **state) {
  static const struct { int64_t Hq, Hkv, D, pbs; int layout; } cs[] = {{4, 2, 8, 4, 0}, {6, 2, 33, 16, L_SLICE}};
  for (int c = 0; c < 2; c++) {
    const int64_t L0 = 70, L1 = 21, T = L0 + 2, Hq = cs[c].Hq, Hkv = cs[c].Hkv, D = cs[c].D, pbs = cs[c].pbs;
    const int64_t MB = (L0 + pbs - 1) / pbs, NB = 2 * MB + 1, qs[3] = {T, Hq, D}, ps[4] = {NB, pbs, Hkv, D};
    const int64_t bts[2] = {2, MB};
    int32_t *bt = hold_host(malloc((size_t)(2 * MB) * 4)), *seq = hold_host(malloc((size_t)T * 4));
    int32_t *pos = hold_host(malloc((size_t)T * 4)), *perm = hold_host(malloc((size_t)NB * 4));
    for (int64_t i = 0; i < NB; i++) perm[i] = (int32_t)i;
    for (int64_t i = NB - 1; i > 0; i--) {
      const int64_t j = tt_randint(0, i);
      const int32_t x = perm[i];
      perm[i] = perm[j], perm[j] = x;
    }
    for (int64_t i = 0; i < 2 * MB; i++) bt[i] = perm[i];
    for (int64_t t = 0; t < L0; t++) seq[t] = 0, pos[t] = (int32_t)t;  // sequence 0: a prefill of 70
    seq[L0] = 1, pos[L0] = (int32_t)(L1 - 1);                           // sequence 1: one decode token (dense)
    seq[L0 + 1] = -1, pos[L0 + 1] = 0;                                  // padding
    const tpr_sparse_attn sa = {.kernel_size = 4, .kernel_stride = 2, .block_size = 8, .topk = 3, .init_blocks = 1,
                                .window_size = 16, .dense_len = 48, .scale = 1.0f / sqrtf((float)D)};
    const tpr_op_attrs at = tpr_sparse_attn_attrs(&sa);
    pair in[6] = {rand_pair(3, qs, cs[c].layout ? L_PERM : 0), rand_pair(4, ps, cs[c].layout),
                  rand_pair(4, ps, cs[c].layout), pair_from(TPR_I32, 2, bts, 0, bt), pair_from(TPR_I32, 1, &T, 0, seq),
                  pair_from(TPR_I32, 1, &T, 0, pos)};
    op_case *k = check(TPR_OP_SPARSE_ATTENTION_PAGED, &at, 6, in, "Hq=%lld Hkv=%lld D=%lld pool blocks of %lld",
                       (long long)Hq, (long long)Hkv, (long long)D, (long long)pbs);
    if (c == 0) negative(k, 0, (L0 - 1) * Hq * D, 1.0);  // the last prefill token's query
    // The prefill-length form: each row decides dense or sparse by max(p + 1,
    // prefill_len) (0: the call's length); the control sets row 40's 30
    // (dense there) to 0 (sparse: the call's 70).
    int32_t *pl = hold_host(malloc((size_t)T * 4));
    for (int64_t t = 0; t < T; t++) pl[t] = t < L0 ? (int32_t[]){0, 30, 60}[t % 3] : 0;
    tpr_op_attrs atl = at;
    atl.n_i = 8, atl.i[7] = TPR_SPARSE_PREFILL_LEN;
    pair inl[7] = {rand_pair(3, qs, cs[c].layout ? L_PERM : 0),  // fresh: the control above changed q's GPU copy
                   in[1], in[2], in[3], in[4], in[5], pair_from(TPR_I32, 1, &T, 0, pl)};
    k = check(TPR_OP_SPARSE_ATTENTION_PAGED, &atl, 7, inl, "prefill-length form, Hq=%lld D=%lld", (long long)Hq,
              (long long)D);
    if (c == 0) negative(k, 6, 40, 0);
  }
}

// lightning_paged (ops.h), the engine's step: sequences' rows one run per
// state slot -- one starting at position 0 (its slot's old state must be
// ignored), ones continuing from their slot's random state, a one-row decode
// -- with padded rows between them and a slot no row uses (it must stay as
// it was: the whole pool is compared). Blocks smaller and larger than the
// runs; q, k, v strided. The pool is restored before each GPU run, so the
// negative controls (a q element; the decode row's position set to 0, which
// drops its state) differ only by the changed input.
static void test_lightning_paged(void **state) {
  static const struct { int64_t H, D, B, n[3]; } cs[] = {{2, 8, 4, {5, 3, 1}}, {3, 16, 64, {11, 1, 2}},
                                                         {1, 33, 2, {1, 9, 1}}, {4, 64, 8, {20, 17, 1}}};
  for (int c = 0; c < 4; c++) {
    const int64_t H = cs[c].H, D = cs[c].D, NS = 5;
    // Rows: a pad, run 0 (slot 3, from 0), a pad, run 1 (slot 0, from 7), run 2 (slot 4, from 30); slot 1, 2 unused.
    const int64_t slot_of[3] = {3, 0, 4}, pos0[3] = {0, 7, 30};
    int64_t T = 2 + cs[c].n[0] + cs[c].n[1] + cs[c].n[2];
    int32_t *slot = hold_host(malloc((size_t)T * sizeof *slot)), *pos = hold_host(malloc((size_t)T * sizeof *pos));
    int64_t t = 0, run2 = 0;  // run 2's first row
    for (int r = 0; r < 3; r++) {
      if (r < 2) slot[t] = -1, pos[t] = 0, t++;
      if (r == 2) run2 = t;
      for (int64_t i = 0; i < cs[c].n[r]; i++, t++) slot[t] = (int32_t)slot_of[r], pos[t] = (int32_t)(pos0[r] + i);
    }
    float *sl = hold_host(malloc((size_t)H * sizeof *sl));
    tpr_lightning_slopes(H, c % 3, 3, sl);
    const int64_t xs[3] = {T, H, D}, ps[4] = {NS, H, D, D};
    const int l = c % 2 ? L_PERM : L_SLICE;
    tpr_op_attrs at = {.n_i = 1, .i = {cs[c].B}};
    pair in[7] = {rand_pair(3, xs, l), rand_pair(3, xs, 0), rand_pair(3, xs, l), rand_pair(4, ps, 0),
                  pair_from(TPR_F32, 1, &H, 0, sl), pair_from(TPR_I32, 1, &T, c % 2 ? L_COL : 0, slot),
                  pair_from(TPR_I32, 1, &T, 0, pos)};
    op_case *k = check(TPR_OP_LIGHTNING_PAGED, &at, 7, in, "T=%lld H=%lld D=%lld block %lld runs %lld,%lld,%lld",
                       (long long)T, (long long)H, (long long)D, (long long)cs[c].B, (long long)cs[c].n[0],
                       (long long)cs[c].n[1], (long long)cs[c].n[2]);
    if (c == 0) negative(k, 0, 1 * H * D, 1.0);  // q of run 0's first row
    if (c == 2) negative(k, 6, run2, 0.0);       // the one-row run 2 restarts: its slot's state unread
  }
}

static void test_cache_write(void **state) {
  const int64_t S = 10, Hkv = 2, D = 4, cs[3] = {S, Hkv, D};
  static const int64_t Ts[] = {3, 1, 0};
  for (int d = 0; d < 4; d++)
    for (int t = 0; t < 3; t++)
      for (int l = 0; l < 3; l++) {
        const tpr_dtype dt = gather_dts[d];
        const int64_t T = Ts[t], ns[3] = {T, Hkv, D}, start = l == 0 ? 0 : l == 1 ? 4 : S - T;
        pair in[3] = {pair_from(dt, 3, cs, l == 1 ? L_PERM : 0, rand_any(dt, S * Hkv * D)),
                      pair_from(dt, 3, ns, layouts[(l + 1) % 4], rand_any(dt, T * Hkv * D)),
                      scalar_pair(l == 2 ? TPR_I64 : TPR_I32, start)};
        op_case *k = check(TPR_OP_CACHE_WRITE, NULL, 3, in, "%s T=%lld start=%lld layout %d", tpr_dtype_name(dt),
                           (long long)T, (long long)start, l);
        if (t == 0 && l == 1) negative(k, 1, 5, 1.0);
      }
}

static void test_router(void **state) {
  static const int64_t cs[][3] = {{7, 16, 4}, {1, 1, 1}, {5, 8, 8}, {33, 64, 8}};  // T, E, k
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 3; l++) {
      const int64_t ls[2] = {cs[c][0], cs[c][1]};
      tpr_op_attrs at = {.n_i = 1, .i = {cs[c][2]}};
      pair in[2] = {rand_pair(2, ls, layouts[l]), rand_pair(1, &ls[1], l ? L_COL : 0)};
      op_case *k = check(TPR_OP_ROUTER_SIGMOID_TOPK, &at, 2, in, "T=%lld E=%lld k=%lld layout %d", (long long)ls[0],
                         (long long)ls[1], (long long)cs[c][2], layouts[l]);
      if (c == 0 && l == 1) {  // raise a chosen expert's logit in row 0: its weight (k >= 2) changes
        float *w = tt_to_host(k->out.c);
        int64_t e = 0;
        while (w[e] == 0.0f) e++;
        free(w);
        negative(k, 0, e, 1.0);
      }
    }
  // Ties go to the lower expert (row 0: all equal); a NaN logit ranks last (row 1).
  float *lg = rand_f32(18), *b = rand_f32(6);
  for (int e = 0; e < 6; e++) lg[e] = 0.25f, b[e] = 0.0f;
  lg[7] = NAN;
  tpr_op_attrs at = {.n_i = 1, .i = {3}};
  const int64_t ls[2] = {3, 6}, bs = 6;
  check(TPR_OP_ROUTER_SIGMOID_TOPK, &at, 2,
        (pair[]){pair_from(TPR_F32, 2, ls, 0, lg), pair_from(TPR_F32, 1, &bs, 0, b)}, "ties and NaN");
}

static void test_moe(void **state) {
  static const int64_t cs[][4] = {{6, 16, 4, 8}, {1, 8, 3, 4}, {33, 64, 8, 48}, {5, 12, 1, 6}};  // T, H, E, F
  static const int wl[] = {0, L_SWAP, L_PERM};  // row-major, column-major, copied
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 3; l++) {
      const int64_t T = cs[c][0], H = cs[c][1], E = cs[c][2], F = cs[c][3];
      const int64_t xs[2] = {T, H}, gs[2] = {T, E}, w13s[3] = {E, 2 * F, H}, w2s[3] = {E, H, F};
      float *g = rand_f32(T * E);
      for (int64_t i = 0; i < T * E; i++)
        if (tt_next_u64() & 1) g[i] = 0.0f;  // about half the routes
      g[0] = 0.7f;  // token 0 goes to expert 0
      for (int64_t t = 0; E > 1 && t < T; t++) g[t * E + E - 1] = 0.0f;  // an expert without tokens
      pair in[4] = {rand_pair(2, xs, layouts[l]), pair_from(TPR_F32, 2, gs, l == 1 ? L_PERM : 0, g),
                    rand_pair(3, w13s, wl[l]), rand_pair(3, w2s, wl[(l + 2) % 3])};
      op_case *k = check(TPR_OP_MOE_EXPERTS, NULL, 4, in, "T=%lld H=%lld E=%lld F=%lld layouts %d", (long long)T,
                         (long long)H, (long long)E, (long long)F, l);
      if (c == 0 && l == 1) negative(k, 0, 0, 1.0);
      if (c == 0 && l == 2) negative(k, 1, 0, 0.5);  // a gate weight
    }
}

// ---------------------------------------------------------------- errors

// A bad run-time index fails on both backends with the same status and a
// message holding `needle`; the GPU output keeps its poison (nothing written)
// and an in-place cache is left as it was.
static void expect_both_fail(tpr_op_kind op, const tpr_op_attrs *at, int n_in, const pair *in, const char *needle) {
  const tpr_tensor *cin[TPR_OP_MAX_INPUTS], *gin[TPR_OP_MAX_INPUTS];
  for (int i = 0; i < n_in; i++) cin[i] = in[i].c, gin[i] = in[i].g;
  pair o = out_pair(op, cin, n_in, at);
  const size_t nb = tpr_tensor_nbytes(o.g);
  TT_OK(gpu->vt->memset(gpu->ctx, tpr_tensor_data(o.g), 0xff, nb));
  for (int b = 0; b < 2; b++) {
    tpr_status rc = tpr_op_run(b ? gpu : tt_cpu(), op, b ? gin : cin, n_in, at, b ? o.g : o.c);
    if (rc != TPR_ERR_INVALID_ARG || !strstr(tpr_last_error(), needle) || !strstr(tpr_last_error(), tpr_op_name(op)))
      fail_msg("%s on %s: expected INVALID_ARG with '%s', got %s: %s", tpr_op_name(op), b ? gpu->vt->name : "cpu",
               needle, tpr_status_name(rc), tpr_last_error());
  }
  uint8_t *h = tt_to_host(o.g);
  for (size_t i = 0; i < nb; i++)
    if (h[i] != 0xff) fail_msg("%s (gpu): output written after a bad index", tpr_op_name(op));
  free(h);
  if (op == TPR_OP_CACHE_WRITE) assert_true(compare(in[0].rc, in[0].rg, true) == 0);
}

static void test_bad_indices(void **state) {
  const int64_t ts[2] = {4, 3}, n5 = 5, n2 = 2, qs[3] = {2, 2, 4}, ks[3] = {6, 1, 4};
  const int32_t ids[5] = {0, 1, 2, 3, 4}, neg[2] = {1, -3};
  const int64_t ids64[5] = {0, 1, -1, 3, 2};
  pair table = rand_pair(2, ts, L_PERM);
  expect_both_fail(TPR_OP_EMBEDDING, NULL, 2, (pair[]){table, pair_from(TPR_I32, 1, &n5, L_COL, ids)},
                   "token id 4 at position 4 is out of range [0, 4)");
  expect_both_fail(TPR_OP_EMBEDDING, NULL, 2, (pair[]){table, pair_from(TPR_I64, 1, &n5, 0, ids64)},
                   "token id -1 at position 2");
  tpr_op_attrs dim0 = {.n_i = 1, .i = {0}};
  expect_both_fail(TPR_OP_INDEX_SELECT, &dim0, 2, (pair[]){table, pair_from(TPR_I32, 1, &n5, 0, ids)},
                   "index 4 at position 4 is out of range [0, 4)");
  pair okids = pair_from(TPR_I32, 1, &n2, 0, ids);
  expect_both_fail(TPR_OP_EMBEDDING_SHARD, NULL, 3, (pair[]){table, okids, scalar_pair(TPR_I64, -1)},
                   "shard index -1 at position 0 is negative");
  expect_both_fail(TPR_OP_EMBEDDING_SHARD, NULL, 3,
                   (pair[]){table, pair_from(TPR_I32, 1, &n2, 0, neg), scalar_pair(TPR_I32, 0)},
                   "token id -3 at position 1 is negative");
  tpr_op_attrs sc = {.n_f = 1, .f = {0.5f}};
  pair q = rand_pair(3, qs, 0), k = rand_pair(3, ks, 0);
  expect_both_fail(TPR_OP_ATTENTION, &sc, 4, (pair[]){q, k, k, scalar_pair(TPR_I32, 5)}, "start 5 + T 2");
  expect_both_fail(TPR_OP_ATTENTION, &sc, 4, (pair[]){q, k, k, scalar_pair(TPR_I64, -1)}, "start -1 is negative");
  pair nw = rand_pair(3, (const int64_t[]){2, 1, 4}, 0);
  expect_both_fail(TPR_OP_CACHE_WRITE, NULL, 3, (pair[]){rand_pair(3, ks, L_PERM), nw, scalar_pair(TPR_I32, 5)},
                   "start 5 + T 2");
}

// Every op kind that reaches a kernel (not a view, not a collective) up to
// moe_experts has one on the backend under test; a NULL entry is refused by
// tpr_op_run with TPR_ERR_UNSUPPORTED naming the op (shown on a copy of the
// backend with its softmax entry cleared).
static void test_missing_kernel(void **state) {
  for (int op = 0; op <= TPR_OP_MOE_EXPERTS; op++)
    if (!tpr_op_is_view((tpr_op_kind)op) && !tpr_op_is_collective((tpr_op_kind)op) && !gpu->vt->kernels[op])
      fail_msg("backend %s has no %s kernel", gpu->vt->name, tpr_op_name((tpr_op_kind)op));
  tpr_backend_vtable vt = *gpu->vt;
  vt.kernels[TPR_OP_SOFTMAX] = NULL;
  tpr_backend fake = {.vt = &vt, .ctx = gpu->ctx};
  tpr_tensor *x, *y;
  TT_OK(tpr_tensor_new(&fake, TPR_F32, 2, (const int64_t[]){4, 8}, &x));
  TT_OK(tpr_tensor_new(&fake, TPR_F32, 2, (const int64_t[]){4, 8}, &y));
  assert_int_equal(tpr_softmax(&fake, x, y), TPR_ERR_UNSUPPORTED);
  assert_non_null(strstr(tpr_last_error(), "softmax"));
  tpr_tensor_free(x), tpr_tensor_free(y);
}

// The caching allocator hands a freed block to the next allocation of its
// size class, and never a block that is still live.
static void test_allocator_reuse(void **state) {
  if (selftest) skip();
  const int64_t sizes[] = {1000, (3 << 20) / 4};  // a small class, a 2 MiB-rounded one
  for (int s = 0; s < 2; s++) {
    const int64_t n = sizes[s], n2 = n - 7;
    tpr_tensor *a, *b, *c, *d;
    TT_OK(tpr_tensor_new(gpu, TPR_F32, 1, &n, &a));
    void *pa = tpr_tensor_data(a);
    tpr_tensor_free(a);
    TT_OK(tpr_tensor_new(gpu, TPR_F32, 1, &n, &b));
    assert_ptr_equal(tpr_tensor_data(b), pa);
    TT_OK(tpr_tensor_new(gpu, TPR_F32, 1, &n2, &c));
    assert_ptr_not_equal(tpr_tensor_data(c), pa);
    tpr_tensor_free(b);
    TT_OK(tpr_tensor_new(gpu, TPR_F32, 1, &n2, &d));  // same class as n
    assert_ptr_equal(tpr_tensor_data(d), pa);
    tpr_tensor_free(c), tpr_tensor_free(d);
  }
}

int main(void) {
  const char *st = getenv("TPR_CUDA_OPS_SELFTEST");
  selftest = st && atoi(st) > 0;
  if (!selftest && tpr_cuda_device_count() == 0) {
    printf("no CUDA device: skipped (the CUDA-vs-CPU op comparison needs a GPU; TPR_CUDA_OPS_SELFTEST=1 runs it "
           "against a second CPU backend to check the test itself)\n");
    return 77;
  }
  tt_seed_from_env();
  tpr_cpu_options opts = {.n_threads = 1};
  if ((selftest ? tpr_backend_cpu_new(&opts, &gpu) : tpr_backend_cuda_new(0, &gpu)) != TPR_OK) {
    fprintf(stderr, "backend under test: %s\n", tpr_last_error());
    return 1;
  }
  printf("# backend under test: %s\n", gpu->vt->name);
#define T(f) cmocka_unit_test_teardown(f, release_all)
  const struct CMUnitTest tests[] = {
      T(test_matmul),       T(test_add_mul),          T(test_rms_norm_swiglu),  T(test_softmax),
      T(test_sum_squares_rms_scale), T(test_embedding), T(test_index_select),   T(test_cast),
      T(test_embedding_shard), T(test_rope),          T(test_attention),        T(test_attention_docs),   T(test_cache_write),
      T(test_lightning),    T(test_sparse_attention), T(test_lightning_paged),
      T(test_router),       T(test_moe),              T(test_bad_indices),      T(test_missing_kernel),
      T(test_allocator_reuse),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(gpu);
  return failed;
}
