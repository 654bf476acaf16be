// Building a rank's buffer from a Hugging Face checkpoint: box reads of the
// rank's slice, with the plan's transform applied while copying.
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"
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

// ---- Where an item lives in the checkpoint.
//
// Plan kinds carry the Qwen3-MoE / MiniMax-M2 hub names. A checkpoint of
// transformers' Qwen3VLMoeForConditionalGeneration holds the text decoder
// under "model.language_model." (lm_head stays at the top; model.visual.*
// is the vision tower, which no plan kind names, so it is never read) and
// each MoE layer's experts fused: mlp.experts.gate_up_proj (gate rows, then
// up rows: the modeling code's chunk(2)) and mlp.experts.down_proj, in one
// of two layouts:
//  - the module's, which save_pretrained writes (transformers 5.23: the
//    reverse of its load-time Transpose(1, 2, check_dims) leaves a tensor
//    alone whose shape already matches the parameter): (E, 2I, H) and
//    (E, H, I), each expert's slab an nn.Linear weight;
//  - the hub releases': (E, H, 2I) and (E, I, H), transposed.
// They are told apart by shape as transformers does: the module's shape
// wins, so when 2I == H (I == H for down) the tensor is read untransposed,
// exactly as transformers would read it.
typedef enum src_part { SRC_WHOLE, SRC_GATE, SRC_UP, SRC_DOWN } src_part;

typedef struct hf_src {
  const tpr_st_tensor *t;  // the checkpoint tensor
  src_part part;           // SRC_WHOLE: t is the item; else the item (expert it->expert) is this part of fused t
  bool transposed;         // fused in the hub layout
} hf_src;

#define VL_PREFIX "model.language_model."

// name, else (for "model.X") "model.language_model.X".
static const tpr_st_tensor *find_prefixed(const tpr_st_set *set, const char *name) {
  const tpr_st_tensor *t = tpr_st_find(set, name);
  if (t || strncmp(name, "model.", 6)) return t;
  char alt[2 * TPR_LOAD_NAME_MAX + sizeof VL_PREFIX];
  snprintf(alt, sizeof alt, VL_PREFIX "%s", name + 6);
  return tpr_st_find(set, alt);
}

// The fused tensor holding expert item `it` (".experts.{E}.gate_proj/
// up_proj/down_proj.weight"), and which part it is; NULL if none.
static const tpr_st_tensor *find_fused(const tpr_loader *l, const tpr_load_item *it, src_part *part) {
  static const struct {
    const char *suffix, *fused;
    src_part part;
  } forms[] = {{".gate_proj.weight", "gate_up_proj", SRC_GATE},
               {".up_proj.weight", "gate_up_proj", SRC_UP},
               {".down_proj.weight", "down_proj", SRC_DOWN}};
  const tpr_shard_tensor *k = &l->plan->tensors[it->kind];
  if (it->expert < 0 || (k->transform != TPR_XFORM_EXPERT_COLUMN && k->transform != TPR_XFORM_EXPERT_ROW))
    return NULL;
  const char *e = strstr(it->name, ".experts.");
  if (!e) return NULL;
  e += strlen(".experts.");
  const char *rest = e + strspn(e, "0123456789");
  for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
    if (strcmp(rest, forms[i].suffix)) continue;
    char name[TPR_LOAD_NAME_MAX + 32];
    snprintf(name, sizeof name, "%.*s%s", (int)(e - it->name), it->name, forms[i].fused);
    *part = forms[i].part;
    return find_prefixed(l->set, name);
  }
  return NULL;
}

static void fmt_shape(const int64_t *s, int nd, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "(");
  for (int d = 0; d < nd && k < n; d++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)s[d]);
  if (k < n) snprintf(buf + k, n - k, ")");
}

static bool shape_is(const tpr_st_tensor *t, int nd, int64_t a, int64_t b, int64_t c) {
  const int64_t want[3] = {a, b, c};
  bool ok = t->ndim == nd;
  for (int d = 0; ok && d < nd; d++) ok = t->shape[d] == want[d];
  return ok;
}

// A fused expert tensor of either layout (see above), or TPR_ERR_FORMAT.
static tpr_status check_fused(const tpr_loader *l, hf_src *s) {
  const tpr_model_config *c = &l->plan->config;
  int64_t E = c->num_experts, I = c->moe_intermediate_size, H = c->hidden_size, W = s->part == SRC_DOWN ? H : 2 * I;
  int64_t Wt = s->part == SRC_DOWN ? I : H;  // (E, W, Wt): the module's layout
  if (shape_is(s->t, 3, E, W, Wt)) s->transposed = false;
  else if (shape_is(s->t, 3, E, Wt, W)) s->transposed = true;
  else {
    char got[96];
    fmt_shape(s->t->shape, s->t->ndim, got, sizeof got);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: fused expert tensor '%s' has shape %s, but the model config gives "
                    "(%lld, %lld, %lld) or, transposed as hub releases store it, (%lld, %lld, %lld)", s->t->path,
                    s->t->name, got, (long long)E, (long long)W, (long long)Wt, (long long)E, (long long)Wt,
                    (long long)W);
  }
  if (s->t->dtype == TPR_F8E4M3 && scale_of(l->set, s->t))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: fused expert tensor '%s' is FP8 with block scales; tpr reads block "
                    "scales of 2-D weights only", s->t->path, s->t->name);
  return TPR_OK;
}

// The checkpoint tensor behind `it`, present and of the planned shape.
static tpr_status find_checked(const tpr_loader *l, const tpr_load_item *it, hf_src *out) {
  const tpr_shard_tensor *k = &l->plan->tensors[it->kind];
  *out = (hf_src){.t = find_prefixed(l->set, it->name), .part = SRC_WHOLE};
  if (!out->t && (out->t = find_fused(l, it, &out->part))) return check_fused(l, out);
  const tpr_st_tensor *t = out->t;
  if (!t)
    return TPR_FAIL(TPR_ERR_FORMAT, "tensor '%s' is missing from the checkpoint %s (no file of it holds it%s)",
                    it->name, l->dir, strncmp(it->name, "model.", 6) ? "" : ", nor under " VL_PREFIX);
  bool ok = t->ndim == k->ndim;
  for (int d = 0; ok && d < k->ndim; d++) ok = t->shape[d] == k->global_shape[d];
  if (!ok) {
    char got[96], want[96];
    fmt_shape(t->shape, t->ndim, got, sizeof got);
    fmt_shape(k->global_shape, k->ndim, want, sizeof want);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s' has shape %s, but the model config gives %s", t->path, t->name,
                    got, want);
  }
  return TPR_OK;
}

// Expert `e`'s part of a fused tensor, this rank's etp slice only: gate/up
// rows [r0, r0+Ir) of the logical (I, H), down columns [r0, r0+Ir) of the
// logical (H, I). A transposed source is read as its (H, Ir) / (Ir, H) box
// and transposed while copying.
static tpr_status read_fused(hf_ctx *c, const hf_src *s, const tpr_shard_tensor *k, const tpr_mesh *m, int64_t e,
                             uint8_t *dst) {
  const int64_t I = k->transform == TPR_XFORM_EXPERT_COLUMN ? k->global_shape[0] : k->global_shape[1];
  const int64_t H = k->transform == TPR_XFORM_EXPERT_COLUMN ? k->global_shape[1] : k->global_shape[0];
  const int64_t Ir = k->transform == TPR_XFORM_EXPERT_COLUMN ? k->rank_shape[0] : k->rank_shape[1];
  const int64_t r0 = m->etp_rank * Ir + (s->part == SRC_UP ? I : 0);  // along the fused I (2I) axis
  const bool down = s->part == SRC_DOWN;
  // Module layout: gate/up (E, 2I, H) rows, down (E, H, I) columns; the box is dst itself.
  // Hub layout: gate/up (E, H, 2I) columns, down (E, I, H) rows; the box is dst transposed.
  int64_t start[3] = {e, 0, 0}, len[3] = {1, 0, 0};
  bool rows = down == s->transposed;  // the I axis is dim 1
  start[rows ? 1 : 2] = r0;
  len[1] = rows ? Ir : H, len[2] = rows ? H : Ir;
  size_t bytes = (size_t)(Ir * H) * c->esz;
  uint8_t *box = s->transposed ? malloc(bytes ? bytes : 1) : dst;
  if (!box) return TPR_FAIL(TPR_ERR_OOM, "out of memory reading '%s'", s->t->name);
  tpr_status rc = tpr_st_read(c->set, s->t->name, start, len, c->dt, box);
  if (rc == TPR_OK && s->transposed)  // box (len[1], len[2]) -> dst (len[2], len[1])
    for (int64_t i = 0; i < len[1]; i++)
      for (int64_t j = 0; j < len[2]; j++)
        memcpy(dst + (size_t)(j * len[1] + i) * c->esz, box + (size_t)(i * len[2] + j) * c->esz, c->esz);
  if (s->transposed) free(box);
  TPR_CHECK(rc);
  c->read += (uint64_t)(Ir * H) * tpr_dtype_size(s->t->dtype);
  size_t slab = s->t->nbytes / (size_t)s->t->shape[0];  // the expert's bytes: released whatever the box touched
  tpr__drop_pages((const uint8_t *)s->t->data + (size_t)e * slab, slab);
  return TPR_OK;
}

void tpr__hf_layout_note(const tpr_loader *l) {
  if (l->mesh.world_rank != 0) return;
  int64_t visual = 0, fused = 0, prefixed = 0;
  for (int i = 0; i < tpr_st_count(l->set); i++) {
    const char *n = tpr_st_get(l->set, i)->name;
    visual += !strncmp(n, "model.visual.", 13);
    prefixed += !strncmp(n, VL_PREFIX, strlen(VL_PREFIX));
    fused += strstr(n, ".mlp.experts.gate_up_proj") || strstr(n, ".mlp.experts.down_proj");
  }
  if (visual || prefixed || fused)
    TPR_LOG_INF("loader: %s: %lld tensors under " VL_PREFIX ", %lld fused expert tensors (sliced per rank); "
                "%lld vision-tower tensors (model.visual.*) are not read", l->dir, (long long)prefixed,
                (long long)fused, (long long)visual);
}

tpr_dtype tpr__hf_item_dtype(const tpr_loader *l, const tpr_load_item *it) {
  src_part part;
  const tpr_st_tensor *t = find_prefixed(l->set, it->name);
  if (!t) t = find_fused(l, it, &part);
  if (!t) return l->plan->dtype;
  return scale_of(l->set, t) ? TPR_BF16 : t->dtype;  // block-scaled FP8 means nothing without its scales
}

tpr_status tpr__hf_read(tpr_loader *l, const tpr_load_item *it, tpr_dtype dt, void *dst, uint64_t *bytes_read) {
  hf_src src;
  TPR_CHECK(find_checked(l, it, &src));
  const tpr_st_tensor *t = src.t;
  if (src.part != SRC_WHOLE) {  // check_fused refused block-scaled FP8
    if (dt == TPR_LOAD_SOURCE_DTYPE) dt = t->dtype;
    hf_ctx c = {.set = l->set, .t = t, .dt = dt, .esz = tpr_dtype_size(dt)};
    TPR_CHECK(read_fused(&c, &src, &l->plan->tensors[it->kind], &l->mesh, it->expert, dst));
    if (bytes_read) *bytes_read += c.read;
    return TPR_OK;
  }
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

// ---- FP8 kept as FP8: the rank's raw bytes and per-row scales.
//
// Every transform moves whole rows or whole columns, so an element (i, j) of
// a rank's buffer comes from source (row_src[i], col_src[j]) (-1: padding,
// a zero). A scale block of the rank's layout -- `block` columns of one row
// -- must lie inside one source block of the checkpoint's scale_inv; the
// block tpr__hf_fp8_block returns guarantees it on every rank.

// row_src (rank rows), col_src (rank columns) of item it.
static void source_maps(const tpr_loader *l, const tpr_load_item *it, int64_t *row_src, int64_t *col_src) {
  const tpr_shard_plan *p = l->plan;
  const tpr_shard_tensor *k = &p->tensors[it->kind];
  const tpr_attn_plan *a = &p->attn;
  const tpr_mesh *m = &l->mesh;
  const int64_t R = k->rank_shape[0], C = k->rank_shape[1], D = a->head_dim;
  const int64_t per = k->kv_layout ? a->kv_per_rank : a->q_per_rank;
  const int32_t *map = k->kv_layout ? a->kv_head_map : a->q_head_map;
  for (int64_t i = 0; i < R; i++) row_src[i] = i;
  for (int64_t j = 0; j < C; j++) col_src[j] = j;
  switch (k->transform) {
    case TPR_XFORM_COLUMN_HEADS:
      for (int64_t i = 0; i < R; i++) {
        int32_t h = map[m->tp_rank * per + i / D];
        row_src[i] = h < 0 ? -1 : h * D + i % D;
      }
      break;
    case TPR_XFORM_ROW_HEADS:
      for (int64_t j = 0; j < C; j++) {
        int32_t h = map[m->tp_rank * per + j / D];
        col_src[j] = h < 0 ? -1 : h * D + j % D;
      }
      break;
    case TPR_XFORM_VOCAB:
      for (int64_t i = 0; i < R; i++) row_src[i] = m->tp_rank * R + i < k->global_shape[0] ? m->tp_rank * R + i : -1;
      break;
    case TPR_XFORM_EXPERT_COLUMN:
      for (int64_t i = 0; i < R; i++) row_src[i] = m->etp_rank * R + i;
      break;
    case TPR_XFORM_COLUMN:
      for (int64_t i = 0; i < R; i++) row_src[i] = m->tp_rank * R + i;
      break;
    case TPR_XFORM_EXPERT_ROW:
      for (int64_t j = 0; j < C; j++) col_src[j] = m->etp_rank * C + j;
      break;
    case TPR_XFORM_ROW:
      for (int64_t j = 0; j < C; j++) col_src[j] = m->tp_rank * C + j;
      break;
    default: break;  // REPLICATE: the identity
  }
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b, b = t;
  }
  return a;
}

// Every item of the kind this rank holds is block-scaled FP8 (a kind is one
// dtype in the rank's layout; mixed kinds are held widened).
bool tpr__hf_kind_fp8(const tpr_loader *l, int kind) {
  bool any = false;
  for (int64_t i = 0; i < l->n; i++) {
    if (l->items[i].kind != kind) continue;
    const tpr_st_tensor *t = find_prefixed(l->set, l->items[i].name);  // fused experts: never kept as FP8
    if (!t || !scale_of(l->set, t)) return false;
    any = true;
  }
  return any;
}

int tpr__hf_fp8_block(const tpr_loader *l, int kind) {
  const tpr_shard_tensor *k = &l->plan->tensors[kind];
  if (k->ndim != 2 || !tpr__hf_kind_fp8(l, kind)) return 0;
  int br, bc;
  tpr__st_fp8_block(l->set, &br, &bc);
  // The columns a rank's layout starts a run of source columns at: 0 for
  // whole rows, every head (D) for head layouts, every rank's slice (C_r)
  // for a column split. A block dividing all of them and bc stays inside
  // one source block.
  int64_t unit = bc;
  if (k->transform == TPR_XFORM_ROW_HEADS) unit = l->plan->attn.head_dim;
  if (k->transform == TPR_XFORM_ROW || k->transform == TPR_XFORM_EXPERT_ROW) unit = k->rank_shape[1];
  int64_t g = gcd64(bc, unit);
  return g >= 16 && g <= 128 ? (int)g : 0;
}

tpr_status tpr__hf_read_fp8(tpr_loader *l, const tpr_load_item *it, int block, uint8_t *dst, float *scale,
                            uint64_t *bytes_read) {
  hf_src src;
  TPR_CHECK(find_checked(l, it, &src));
  const tpr_st_tensor *t = src.t, *st = src.part == SRC_WHOLE ? scale_of(l->set, t) : NULL;
  const tpr_shard_tensor *k = &l->plan->tensors[it->kind];
  if (!st || k->ndim != 2 || block < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: tensor '%s' is not a block-scaled FP8 matrix", t->path, it->name);
  int br, bc;
  tpr__st_fp8_block(l->set, &br, &bc);
  const int64_t R = k->rank_shape[0], C = k->rank_shape[1], nb = (C + block - 1) / block;
  if (st->ndim != 2 || st->shape[0] != (t->shape[0] + br - 1) / br || st->shape[1] != (t->shape[1] + bc - 1) / bc ||
      !tpr_dtype_is_float(st->dtype) || st->dtype == TPR_F8E4M3)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: '%s' (%s, %d dims) does not hold one float scale per %d x %d block of FP8 "
                    "weight '%s' (%lld, %lld)", st->path, st->name, tpr_dtype_name(st->dtype), st->ndim, br, bc,
                    it->name, (long long)t->shape[0], (long long)t->shape[1]);
  const int64_t SR = st->shape[0], SC = st->shape[1];
  int64_t *row_src = malloc((size_t)(R + C + 1) * sizeof *row_src), *col_src = row_src + R;
  float *src_scale = malloc((size_t)(SR * SC + 1) * sizeof *src_scale);
  tpr_status rc = row_src && src_scale ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "out of memory");
  if (rc == TPR_OK) {  // the raw FP8 bytes, laid out by the plan
    hf_ctx c = {.set = l->set, .t = t, .dt = TPR_F8E4M3, .esz = 1};
    rc = transform(&c, l->plan, k, &l->mesh, dst);
    if (bytes_read) *bytes_read += c.read;
  }
  if (rc == TPR_OK) rc = tpr_st_read(l->set, st->name, (const int64_t[]){0, 0}, (const int64_t[]){SR, SC}, TPR_F32,
                                     src_scale);
  if (rc == TPR_OK) source_maps(l, it, row_src, col_src);
  for (int64_t i = 0; rc == TPR_OK && i < R; i++)
    for (int64_t b = 0; rc == TPR_OK && b < nb; b++) {
      int64_t sb = -1;  // the source column block of the block's real columns
      for (int64_t j = b * block; j < (b + 1) * block && j < C; j++) {
        if (col_src[j] < 0) continue;
        if (sb < 0) sb = col_src[j] / bc;
        else if (col_src[j] / bc != sb)
          rc = TPR_FAIL(TPR_ERR_INTERNAL, "%s: scale block %lld of '%s' spans two source blocks", t->path,
                        (long long)b, it->name);
      }
      // Padding (a zero row or columns) keeps scale 0: its bytes are zeros.
      scale[i * nb + b] = row_src[i] < 0 || sb < 0 ? 0.0f : src_scale[(row_src[i] / br) * SC + sb];
    }
  tpr__drop_pages(t->data, t->nbytes);
  tpr__drop_pages(st->data, st->nbytes);
  free(row_src);
  free(src_scale);
  return rc;
}
