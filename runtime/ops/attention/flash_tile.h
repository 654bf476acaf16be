// The per-tile math of the blocked attention (flash.c), included
// twice there: once for baseline x86-64 and once under
// `#pragma GCC target("avx2,fma")`, with ATT_FN naming each copy. One call of
// the kernel runs one copy throughout (scores, tile updates, chunk merges and
// the final division), so its results never mix the two instruction sets.
//
// A row's state is (m, l, acc[D]) at st[0], st[1], st + 2: the running max of
// its scores, the sum of exp(score - m) and the sum of exp(score - m) * v.
// Every function works on one query row at a time with a fixed order of
// operations, so a row's bits never depend on which other rows, threads or
// work items share its tile.

#ifndef ATT_SHUF2
// GCC's __builtin_shuffle takes a mask vector; clang (the fuzz build) only
// has __builtin_shufflevector with constant indices: the same lanes either way.
#if defined(__clang__)
#define ATT_SHUF2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define ATT_SHUF2(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
#endif
#endif

// Lane u of the result: the sum of v[u]'s lanes, always in the order
// ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
static inline v8f ATT_FN(hsum8x8)(const v8f *v) {
  v8f t[4], w[2];
  for (int i = 0; i < 4; i++)
    t[i] = ATT_SHUF2(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           ATT_SHUF2(v[2 * i], v[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; i++)
    w[i] = ATT_SHUF2(t[2 * i], t[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
           ATT_SHUF2(t[2 * i], t[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  const v8f x = ATT_SHUF2(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14) +
                ATT_SHUF2(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15);
  return ATT_SHUF2(x, x, 0, 2, 1, 3, 4, 6, 5, 7);
}

// s[0, nk) := scale * (q . key j), keys krow[j] (row-major, D stride 1). A
// score's sum: eight lane partial sums over d = lane mod 8 (D rounded down to
// 8), combined by hsum8x8, then the remaining d in order -- the same for
// every row and key, whichever 8 keys share the call.
static void ATT_FN(scores)(const float *restrict q, const float *const *krow, int64_t nk, int64_t D, float scale,
                           float *restrict s) {
  const int64_t D8 = D & ~(int64_t)7;
  for (int64_t j0 = 0; j0 < nk; j0 += 8) {
    const float *k[8];
    for (int u = 0; u < 8; u++) k[u] = krow[j0 + u < nk ? j0 + u : nk - 1];  // spare lanes: a real key, ignored
    v8f a[8];
    for (int u = 0; u < 8; u++) a[u] = (v8f){0};
    for (int64_t d = 0; d < D8; d += 8) {
      const v8f qd = ld8(q + d);
      for (int u = 0; u < 8; u++) a[u] += qd * ld8(k[u] + d);
    }
    v8f sum = ATT_FN(hsum8x8)(a);
    for (int64_t d = D8; d < D; d++)
      for (int u = 0; u < 8; u++) sum[u] += q[d] * k[u][d];
    st8(s + j0, sum * scale);
  }
}

// exp(x) for x <= 0 (Cephes' expf: 2^n times a degree-7 polynomial of the
// remainder; within 2 ulp); 0 below -87.3 (where f32 turns subnormal).
static inline v8f ATT_FN(exp8)(v8f x) {
  const v8f lo = (v8f){0} + -87.33654f;
  const v8i dead = x < lo;
  x = (v8f)(((v8i)x & ~dead) | ((v8i)lo & dead));
  const v8f fx = x * 1.44269504088896341f + 0.5f;
  v8i n = __builtin_convertvector(fx, v8i);  // toward zero, then down: floor
  n += (v8i)(__builtin_convertvector(n, v8f) > fx);
  const v8f nf = __builtin_convertvector(n, v8f);
  const v8f r = x - nf * 0.693359375f - nf * -2.12194440e-4f;
  v8f y = (v8f){0} + 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const v8f res = y * (v8f)((n + 127) << 23);
  return (v8f)((v8i)res & ~dead);
}

// Folds nv >= 1 visible scores s of one tile (keys with value rows vrow) into
// st; p (KB) is scratch.
static void ATT_FN(tile_row)(float *restrict s, int64_t nv, const float *const *vrow, int64_t D,
                             float *restrict st, float *restrict p) {
  const int64_t n8 = (nv + 7) & ~(int64_t)7;
  const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int64_t j = nv; j < n8; j++) s[j] = s[0];  // spare lanes: a real score, later zeroed
  v8f mx = ld8(s);
  for (int64_t j = 8; j < n8; j += 8) {
    const v8f x = ld8(s + j);
    const v8i gt = x > mx;
    mx = (v8f)(((v8i)x & gt) | ((v8i)mx & ~gt));
  }
  float mt = mx[0];
  for (int u = 1; u < 8; u++) mt = mx[u] > mt ? mx[u] : mt;
  const float m = st[0], mn = m > mt ? m : mt;
  const float alpha = expf(m - mn);  // 0 while the row saw nothing (m = -inf), 1 when the max stays
  v8f sum8 = {0};
  for (int64_t j = 0; j < n8; j += 8) {  // keys past nv (masked) are exactly 0
    const v8f e = ATT_FN(exp8)(ld8(s + j) - mn);
    const v8f pj = (v8f)((v8i)e & (lane + (int)j < (int)nv));
    st8(p + j, pj);
    sum8 += pj;
  }
  const float sum = ((sum8[0] + sum8[4]) + (sum8[2] + sum8[6])) + ((sum8[1] + sum8[5]) + (sum8[3] + sum8[7]));
  st[0] = mn;
  st[1] = st[1] * alpha + sum;
  const float a = tpr__attention_skip_rescale ? 1.0f : alpha;
  float *acc = st + 2;
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {  // 8 accumulators stay in registers over the tile's keys
    v8f r[8];
    for (int u = 0; u < 8; u++) r[u] = ld8(acc + d0 + 8 * u) * a;
    for (int64_t j = 0; j < nv; j++) {
      const float pj = p[j], *vj = vrow[j] + d0;
      for (int u = 0; u < 8; u++) r[u] += pj * ld8(vj + 8 * u);
    }
    for (int u = 0; u < 8; u++) st8(acc + d0 + 8 * u, r[u]);
  }
  for (; d0 + 8 <= D; d0 += 8) {
    v8f r = ld8(acc + d0) * a;
    for (int64_t j = 0; j < nv; j++) r += p[j] * ld8(vrow[j] + d0);
    st8(acc + d0, r);
  }
  for (; d0 < D; d0++) {
    float r = acc[d0] * a;
    for (int64_t j = 0; j < nv; j++) r += p[j] * vrow[j][d0];
    acc[d0] = r;
  }
}

// R := R merged with a chunk's partial P (both rows of D + 2 floats). An
// empty P (its row saw no key of the chunk) changes nothing; an empty R takes
// P's bits.
static void ATT_FN(merge)(float *restrict R, const float *restrict P, int64_t D) {
  if (P[0] == -INFINITY) return;
  if (R[0] == -INFINITY) {
    memcpy(R, P, (size_t)(D + 2) * sizeof *R);
    return;
  }
  const float m = R[0] > P[0] ? R[0] : P[0], a = expf(R[0] - m), b = expf(P[0] - m);
  R[0] = m;
  R[1] = R[1] * a + P[1] * b;
  for (int64_t d = 0; d < D; d++) R[2 + d] = R[2 + d] * a + P[2 + d] * b;
}

// out (D) := acc / l. Every finished row saw at least its own key: l >= 1.
static void ATT_FN(finish)(float *restrict out, const float *restrict R, int64_t D) {
  const float inv = 1.0f / R[1];
  for (int64_t d = 0; d < D; d++) out[d] = R[2 + d] * inv;
}

// One work item (see flash.c): the rows of tokens [t0, t0 + tb) of
// run it->run and the query heads of KV head it->g, over key chunk it->c
// (its partial goes to the job's partial buffer) or over every chunk in
// order (merged as they come, then finished into out).
static void ATT_FN(item)(const attn_job *J, const attn_item *it, float *ws, const float **krow) {
  const float **vrow = krow + KB;
  const tpr__attn_run *r = &J->runs[it->run];
  const int64_t group = J->Hq / J->Hkv, D = J->D, W = D + 2, g = it->g;
  const int64_t tb = r->n - it->t0 < J->tb ? r->n - it->t0 : J->tb, nrow = tb * group;
  const int64_t last = r->start + it->t0 + tb;  // the block's last token sees keys [0, last)
  float *s = ws, *p = s + KB, *P = p + KB, *R = P + nrow * W;
  const bool split = it->c >= 0;
  const int64_t n_ch = (last + CHUNK - 1) / CHUNK, c_lo = split ? it->c : 0, c_hi = split ? it->c + 1 : n_ch;
  for (int64_t i = 0; i < nrow && !split; i++) R[i * W] = -INFINITY;
  for (int64_t c = c_lo; c < c_hi; c++) {
    for (int64_t i = 0; i < nrow; i++) {
      float *st = split ? part_row(J, r, it->t0 + i / group, g * group + i % group) + c * W : P + i * W;
      st[0] = -INFINITY, st[1] = 0.0f;
      memset(st + 2, 0, (size_t)D * sizeof *st);
    }
    const int64_t end = (c + 1) * CHUNK < last ? (c + 1) * CHUNK : last;
    for (int64_t j0 = c * CHUNK; j0 < end; j0 += KB) {
      const int64_t n = end - j0 < KB ? end - j0 : KB;
      for (int64_t jj = 0; jj < n; jj++) {
        krow[jj] = kv_row(&J->k, J->blk ? J->blk + r->blk_off : NULL, J->bs, g, j0 + jj);
        vrow[jj] = kv_row(&J->v, J->blk ? J->blk + r->blk_off : NULL, J->bs, g, j0 + jj);
      }
      for (int64_t i = 0; i < nrow; i++) {
        const int64_t t = it->t0 + i / group, h = g * group + i % group;
        const int64_t hi = r->start + t + 1 - j0 < n ? r->start + t + 1 - j0 : n;  // causal, by position
        // The document form: keys before lo[t] belong to an earlier document.
        const int64_t first = r->lo && r->lo[t] > j0 ? r->lo[t] - j0 : 0, nv = hi - first;
        if (nv <= 0) continue;
        float *st = split ? part_row(J, r, t, h) + c * W : P + i * W;
        ATT_FN(scores)(r->q + t * J->q_ld + h * J->q_hs, krow + first, nv, D, J->scale, s);
        ATT_FN(tile_row)(s, nv, vrow + first, D, st, p);
      }
    }
    for (int64_t i = 0; i < nrow && !split; i++) ATT_FN(merge)(R + i * W, P + i * W, D);
  }
  for (int64_t i = 0; i < nrow && !split; i++) {
    const int64_t t = it->t0 + i / group, h = g * group + i % group;
    ATT_FN(finish)(r->o + (t * J->Hq + h) * D, R + i * W, D);
  }
}

// Split rows: merges a row's chunk partials in chunk order, then finishes it.
static void ATT_FN(merge_row)(const attn_job *J, const tpr__attn_run *r, int64_t t, int64_t h, float *R) {
  const int64_t D = J->D, W = D + 2, n_ch = (r->start + r->n + CHUNK - 1) / CHUNK;
  const float *P = part_row(J, r, t, h);
  R[0] = -INFINITY;
  for (int64_t c = 0; c < n_ch; c++) ATT_FN(merge)(R, P + c * W, D);
  ATT_FN(finish)(r->o + (t * J->Hq + h) * D, R, D);
}
