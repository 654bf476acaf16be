// Building a rank's buffer from a Hugging Face checkpoint: box reads of the
// rank's slice, with the plan's transform applied while copying.
#include <stdlib.h>
#include <string.h>

#include "shard/loader_impl.h"

typedef struct hf_ctx {
  const tpr_st_set *set;
  const tpr_st_tensor *t;  // the checkpoint tensor
  tpr_dtype dt;            // destination dtype
  size_t esz;              // its size
  uint64_t read;           // checkpoint bytes read
  const uint8_t *lo, *hi;  // source bytes touched since pages were last released
} hf_ctx;

// A run of n units (heads, rows) of the buffer starting at unit dst, copied
// from source units [src, src+n), or zeros when src < 0.
typedef struct seg {
  int64_t dst, src, n;
} seg;

// Runs of map[from, from+cnt): neighbours merge when their sources are
// consecutive or both padding, so a sharded layout is one read.
static int64_t map_runs(const int32_t *map, int64_t from, int64_t cnt, seg *out) {
  int64_t k = 0;
  for (int64_t i = 0; i < cnt; i++) {
    int64_t s = map[from + i] < 0 ? -1 : map[from + i];
    seg *p = k ? &out[k - 1] : NULL;
    if (p && ((s < 0 && p->src < 0) || (s >= 0 && p->src >= 0 && p->src + p->n == s))) p->n++;
    else out[k++] = (seg){i, s, 1};
  }
  return k;
}

// Source bytes a read may leave mapped before they are released: peak
// resident memory is the rank's buffers plus about this, not plus the
// source tensor (embed_tokens alone is 1.2 GB in MiniMax-M2).
enum { DROP_SPAN = 4 << 20 };

// Rows [r0, r0+nr) x columns [c0, c0+nc) (a 1-D tensor: elements [r0, r0+nr))
// into dst, contiguous; in chunks of about DROP_SPAN source bytes, releasing
// the pages read once DROP_SPAN of them have gathered.
static tpr_status read_box(hf_ctx *c, int64_t r0, int64_t nr, int64_t c0, int64_t nc, void *dst) {
  const tpr_st_tensor *t = c->t;
  int64_t row = (t->ndim == 2 ? t->shape[1] : 1) * (int64_t)tpr_dtype_size(t->dtype);  // source bytes per row
  int64_t step = DROP_SPAN / row > 0 ? DROP_SPAN / row : 1, drow = (t->ndim == 2 ? nc : 1) * (int64_t)c->esz;
  for (int64_t r = r0; r < r0 + nr; r += step) {
    int64_t n = r0 + nr - r < step ? r0 + nr - r : step, start[2] = {r, c0}, len[2] = {n, nc};
    TPR_CHECK(tpr_st_read(c->set, t->name, start, len, c->dt, (uint8_t *)dst + (r - r0) * drow));
    const uint8_t *a = (const uint8_t *)t->data + r * row, *b = a + n * row;
    if (!c->lo || a < c->lo) c->lo = a;
    if (b > c->hi) c->hi = b;
    if (c->hi - c->lo >= DROP_SPAN) {
      tpr__drop_pages(c->lo, (size_t)(c->hi - c->lo));
      c->lo = c->hi = NULL;
    }
  }
  c->read += (uint64_t)(nr * (t->ndim == 2 ? nc : 1)) * tpr_dtype_size(t->dtype);
  return TPR_OK;
}

// Columns [c0, c0+w) of every row of the 2-D source into columns [dc, dc+w)
// of dst (R, ldc); one box read when that is the whole of dst's rows.
static tpr_status read_cols(hf_ctx *c, int64_t c0, int64_t w, uint8_t *dst, int64_t ldc, int64_t dc) {
  int64_t R = c->t->shape[0];
  if (w == ldc) return read_box(c, 0, R, c0, w, dst);
  for (int64_t r = 0; r < R; r++) TPR_CHECK(read_box(c, r, 1, c0, w, dst + (size_t)(r * ldc + dc) * c->esz));
  return TPR_OK;
}

static void zero_cols(hf_ctx *c, uint8_t *dst, int64_t ldc, int64_t dc, int64_t w) {
  for (int64_t r = 0; r < c->t->shape[0]; r++) memset(dst + (size_t)(r * ldc + dc) * c->esz, 0, (size_t)w * c->esz);
}

// The *_HEADS transforms: units of D rows (COLUMN), D columns (ROW) or D
// elements (NORM), laid out by the Q or KV head map.
static tpr_status read_heads(hf_ctx *c, const tpr_shard_plan *p, const tpr_shard_tensor *k, int tp_rank,
                             uint8_t *dst) {
  const tpr_attn_plan *a = &p->attn;
  int64_t D = a->head_dim, per = k->kv_layout ? a->kv_per_rank : a->q_per_rank;
  const int32_t *map = k->kv_layout ? a->kv_head_map : a->q_head_map;
  int64_t from = tp_rank * per, cnt = per;
  if (k->transform == TPR_XFORM_NORM_HEADS) from = 0, cnt = k->kv_layout ? a->nkv_eff : a->nq_padded;  // held whole
  seg *s = malloc((size_t)cnt * sizeof *s);
  if (!s) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  int64_t ns = map_runs(map, from, cnt, s), H = k->ndim == 2 ? c->t->shape[1] : 1;
  tpr_status rc = TPR_OK;
  for (int64_t i = 0; rc == TPR_OK && i < ns; i++) {
    int64_t d0 = s[i].dst * D, s0 = s[i].src * D, n = s[i].n * D;
    if (k->transform == TPR_XFORM_ROW_HEADS) {  // (H, nq*D) -> (H, per*D): columns
      if (s[i].src < 0) zero_cols(c, dst, per * D, d0, n);
      else rc = read_cols(c, s0, n, dst, per * D, d0);
    } else {  // (heads*D, H) -> (per*D, H) rows, or (heads*D) -> (heads'*D)
      uint8_t *at = dst + (size_t)(d0 * H) * c->esz;
      if (s[i].src < 0) memset(at, 0, (size_t)(n * H) * c->esz);
      else rc = read_box(c, s0, n, 0, H, at);
    }
  }
  free(s);
  return rc;
}

static tpr_status transform(hf_ctx *c, const tpr_shard_plan *p, const tpr_shard_tensor *k, const tpr_mesh *m,
                            uint8_t *dst) {
  int64_t H = k->ndim == 2 ? c->t->shape[1] : 0;
  switch (k->transform) {
    case TPR_XFORM_REPLICATE: return read_box(c, 0, c->t->shape[0], 0, H, dst);
    case TPR_XFORM_COLUMN_HEADS:
    case TPR_XFORM_ROW_HEADS:
    case TPR_XFORM_NORM_HEADS: return read_heads(c, p, k, m->tp_rank, dst);
    case TPR_XFORM_VOCAB: {  // (V, H) -> (Vp/tp, H); rows at or past V are zeros
      int64_t Vr = k->rank_shape[0], first = m->tp_rank * Vr, real = c->t->shape[0] - first;
      real = real < 0 ? 0 : real > Vr ? Vr : real;
      if (real) TPR_CHECK(read_box(c, first, real, 0, H, dst));
      memset(dst + (size_t)(real * H) * c->esz, 0, (size_t)((Vr - real) * H) * c->esz);
      return TPR_OK;
    }
    case TPR_XFORM_EXPERT_COLUMN:  // (I, H) -> rows block etp_rank
      return read_box(c, m->etp_rank * k->rank_shape[0], k->rank_shape[0], 0, H, dst);
    case TPR_XFORM_EXPERT_ROW:  // (H, I) -> columns block etp_rank
      return read_cols(c, m->etp_rank * k->rank_shape[1], k->rank_shape[1], dst, k->rank_shape[1], 0);
    case TPR_XFORM_COLUMN:  // (F, H) -> rows block tp_rank
      return read_box(c, m->tp_rank * k->rank_shape[0], k->rank_shape[0], 0, H, dst);
    case TPR_XFORM_ROW:  // (H, F) -> columns block tp_rank
      return read_cols(c, m->tp_rank * k->rank_shape[1], k->rank_shape[1], dst, k->rank_shape[1], 0);
    default: break;
  }
  return TPR_FAIL(TPR_ERR_INTERNAL, "%s: unknown transform %d", k->name, (int)k->transform);
}

static const tpr_st_tensor *scale_of(const tpr_st_set *set, const tpr_st_tensor *t) {
  char name[TPR_LOAD_NAME_MAX + 16];
  if (t->dtype != TPR_F8E4M3) return NULL;
  snprintf(name, sizeof name, "%s_scale_inv", t->name);
  return tpr_st_find(set, name);
}

tpr_dtype tpr__hf_item_dtype(const tpr_loader *l, const tpr_load_item *it) {
  const tpr_st_tensor *t = tpr_st_find(l->set, it->name);
  if (!t) return l->plan->dtype;
  return scale_of(l->set, t) ? TPR_BF16 : t->dtype;  // block-scaled FP8 means nothing without its scales
}

static void fmt_shape(const int64_t *s, int nd, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "(");
  for (int d = 0; d < nd && k < n; d++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)s[d]);
  if (k < n) snprintf(buf + k, n - k, ")");
}

// The checkpoint tensor behind `it`, present and of the planned shape.
static tpr_status find_checked(const tpr_loader *l, const tpr_load_item *it, const tpr_st_tensor **out) {
  const tpr_shard_tensor *k = &l->plan->tensors[it->kind];
  const tpr_st_tensor *t = tpr_st_find(l->set, it->name);
  if (!t)
    return TPR_FAIL(TPR_ERR_FORMAT, "tensor '%s' is missing from the checkpoint %s (no file of it holds it)", it->name,
                    l->dir);
  bool ok = t->ndim == k->ndim;
  for (int d = 0; ok && d < k->ndim; d++) ok = t->shape[d] == k->global_shape[d];
  if (!ok) {
    char got[96], want[96];
    fmt_shape(t->shape, t->ndim, got, sizeof got);
    fmt_shape(k->global_shape, k->ndim, want, sizeof want);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s' has shape %s, but the model config gives %s", t->path, it->name,
                    got, want);
  }
  *out = t;
  return TPR_OK;
}

tpr_status tpr__hf_read(tpr_loader *l, const tpr_load_item *it, tpr_dtype dt, void *dst, uint64_t *bytes_read) {
  const tpr_st_tensor *t = NULL;
  TPR_CHECK(find_checked(l, it, &t));
  const tpr_st_tensor *scale = scale_of(l->set, t);
  if (dt == TPR_LOAD_SOURCE_DTYPE) dt = scale ? TPR_BF16 : t->dtype;
  if (scale && dt == TPR_F8E4M3)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: tensor '%s' is FP8 with block scales; load it as bf16 or f32",
                    t->path, it->name);
  hf_ctx c = {.set = l->set, .t = t, .dt = dt, .esz = tpr_dtype_size(dt)};
  tpr_status rc = transform(&c, l->plan, &l->plan->tensors[it->kind], &l->mesh, dst);
  tpr__drop_pages(t->data, t->nbytes);
  if (scale) tpr__drop_pages(scale->data, scale->nbytes);
  TPR_CHECK(rc);
  if (bytes_read) *bytes_read += c.read;
  return TPR_OK;
}
