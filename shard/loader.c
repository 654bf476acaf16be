// The loader's front: open a Hugging Face or converted directory for one
// rank, list what the rank holds, read one buffer or all of them.
#include "shard/loader.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/file_io.h"
#include "runtime/host_mem.h"
#include "runtime/progress.h"
#include "shard/loader_impl.h"

// A rank file without manifest.pb beside it is what an interrupted convert
// leaves (the manifest is written last); say so rather than failing later
// on tensor names a Hugging Face checkpoint would have.
static tpr_status refuse_partial_convert(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return TPR_OK;
  struct dirent *e;
  const char *found = NULL;
  while (!found && (e = readdir(d))) {
    int r, w, end = 0;
    if (sscanf(e->d_name, "rank-%5d-of-%5d.safetensors%n", &r, &w, &end) == 2 && end && !e->d_name[end])
      found = e->d_name;
  }
  tpr_status rc = found ? TPR_FAIL(TPR_ERR_FORMAT,
                                   "%s holds the converted rank file %s but no manifest.pb: an interrupted or "
                                   "unfinished `tpr convert` (the manifest is written last); convert again",
                                   dir, found)
                        : TPR_OK;
  closedir(d);
  return rc;
}

// quantization_config.weight_block_size of an FP8 release ([128, 128] for
// MiniMax-M2 and DeepSeek-V3, also the default): the scale_inv block shape.
static tpr_status fp8_block(tpr_loader *l, const char *json, size_t len, const char *origin) {
  cJSON *root = json ? cJSON_ParseWithLength(json, len) : NULL;
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
  tpr_status rc = TPR_OK;
  if (b) {
    const cJSON *r = cJSON_GetArrayItem(b, 0), *c = cJSON_GetArrayItem(b, 1);
    if (cJSON_GetArraySize(b) != 2 || !cJSON_IsNumber(r) || !cJSON_IsNumber(c) || r->valuedouble < 1 ||
        c->valuedouble < 1 || r->valuedouble > 1e6 || c->valuedouble > 1e6)
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: \"quantization_config.weight_block_size\" must be two positive integers",
                    origin);
    else rc = tpr_st_set_fp8_block(l->set, (int)r->valuedouble, (int)c->valuedouble);
  }
  cJSON_Delete(root);
  return rc;
}

static tpr_status open_hf(tpr_loader *l) {
  TPR_CHECK(refuse_partial_convert(l->dir));
  char *cfg = tpr_path_join(l->dir, "config.json");
  if (!cfg) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  uint8_t *text = NULL;
  size_t len = 0;
  struct stat st;
  tpr_status rc = TPR_OK;
  // config.json says which layers are MoE (only needed when the model mixes
  // dense and MoE layers) and the FP8 block size; the plan came from it or
  // from an equivalent file, so a checkpoint without one is still read.
  int64_t L = l->plan->config.num_layers, Lm = l->plan->config.num_moe_layers;
  if ((Lm > 0 && Lm < L) || stat(cfg, &st) == 0) rc = tpr_file_read(cfg, &text, &len);
  if (rc == TPR_OK) rc = tpr__moe_layers((const char *)text, len, cfg, &l->plan->config, &l->moe);
  if (rc == TPR_OK) rc = tpr_st_open(l->dir, &l->set);
  if (rc == TPR_OK) rc = fp8_block(l, (const char *)text, len, cfg);
  free(text);
  free(cfg);
  TPR_CHECK(rc);
  tpr__hf_layout_note(l);
  return tpr__load_items(l->plan, &l->mesh, l->moe, &l->items, &l->n, &l->kind_start);
}

tpr_status tpr_loader_open(const char *dir, const tpr_shard_plan *plan, int rank, tpr_loader **out) {
  if (!out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_loader_open: out is NULL");
  *out = NULL;
  if (!dir || !plan) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_loader_open: dir or plan is NULL");
  struct stat st;
  if (stat(dir, &st) != 0) return TPR_FAIL(TPR_ERR_IO, "checkpoint directory %s: %s", dir, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return TPR_FAIL(TPR_ERR_IO, "checkpoint %s is not a directory", dir);
  tpr_loader *l = calloc(1, sizeof *l);
  if (!l || !(l->dir = strdup(dir))) {
    free(l);
    return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  }
  l->plan = plan;
  tpr_status rc;
  TPR_CHECK_GOTO(tpr_mesh_init(plan->world, rank, plan->tp, plan->ep, plan->etp, &l->mesh), rc, fail);
  char *man = tpr_path_join(dir, "manifest.pb");
  if (!man) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    goto fail;
  }
  l->converted = stat(man, &st) == 0;
  free(man);
  TPR_CHECK_GOTO(l->converted ? tpr__conv_open(l) : open_hf(l), rc, fail);
  *out = l;
  return TPR_OK;
fail:
  tpr_loader_close(l);
  return rc;
}

void tpr_loader_close(tpr_loader *l) {
  if (!l) return;
  tpr_st_close(l->set);
  free(l->dir);
  free(l->moe);
  free(l->items);
  free(l->kind_start);
  free(l->rank_path);
  free(l->conv);
  free(l);
}

bool tpr_loader_converted(const tpr_loader *l) { return l->converted; }
const tpr_mesh *tpr_loader_mesh(const tpr_loader *l) { return &l->mesh; }
int64_t tpr_loader_count(const tpr_loader *l) { return l->n; }

const tpr_load_item *tpr_loader_item(const tpr_loader *l, int64_t i) {
  return i >= 0 && i < l->n ? &l->items[i] : NULL;
}

tpr_status tpr_loader_find(const tpr_loader *l, int kind, int64_t layer, int64_t local_expert,
                           const tpr_load_item **out) {
  *out = NULL;
  if (kind < 0 || kind >= l->plan->n_tensors)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "loader: tensor kind %d of %d", kind, l->plan->n_tensors);
  for (int64_t i = l->kind_start[kind]; i < l->kind_start[kind + 1]; i++)
    if (l->items[i].layer == layer && l->items[i].local_expert == local_expert) {
      *out = &l->items[i];
      return TPR_OK;
    }
  return TPR_FAIL(TPR_ERR_INVALID_ARG, "loader: rank %d holds no %s for layer %lld, local expert %lld",
                  l->mesh.world_rank, l->plan->tensors[kind].name, (long long)layer, (long long)local_expert);
}

// Index of `it` in l->items; callers may pass copies (tpr_rank_weights).
static int64_t item_index(const tpr_loader *l, const tpr_load_item *it) {
  if (it >= l->items && it < l->items + l->n) return it - l->items;
  const tpr_load_item *f;
  if (tpr_loader_find(l, it->kind, it->layer, it->local_expert, &f) != TPR_OK) return -1;
  return f - l->items;
}

tpr_dtype tpr_loader_item_dtype(const tpr_loader *l, const tpr_load_item *it) {
  if (!l->converted) return tpr__hf_item_dtype(l, it);
  int64_t i = item_index(l, it);
  return i < 0 ? l->plan->dtype : l->conv[i].dtype;
}

tpr_status tpr_loader_read(tpr_loader *l, const tpr_load_item *it, tpr_dtype dt, void *dst, uint64_t *bytes_read) {
  if (!l || !it || (it->numel && !dst)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_loader_read: NULL argument");
  if (dt != TPR_LOAD_SOURCE_DTYPE && !tpr_dtype_valid(dt))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_loader_read: invalid dtype %d", (int)dt);
  int64_t i = item_index(l, it);
  if (i < 0) return tpr__propagate(TPR_ERR_INVALID_ARG, __FILE__, __LINE__);  // tpr_loader_find said why
  if (!l->converted) TPR_CHECK(tpr__hf_read(l, &l->items[i], dt, dst, bytes_read));
  else TPR_CHECK(tpr__conv_read(l, &l->items[i], dt, dst, bytes_read));
  return TPR_OK;
}

bool tpr_loader_kind_fp8(const tpr_loader *l, int kind) {
  if (!l || l->converted || kind < 0 || kind >= l->plan->n_tensors) return false;
  return tpr__hf_kind_fp8(l, kind);
}

int tpr_loader_fp8_block(const tpr_loader *l, int kind) {
  if (!l || l->converted || kind < 0 || kind >= l->plan->n_tensors) return 0;
  return tpr__hf_fp8_block(l, kind);
}

tpr_status tpr_loader_read_fp8(tpr_loader *l, const tpr_load_item *it, int block, uint8_t *dst, float *scale,
                               uint64_t *bytes_read) {
  if (!l || !it || !dst || !scale) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_loader_read_fp8: NULL argument");
  if (l->converted)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "tpr_loader_read_fp8: a converted directory holds no FP8 (%s)", it->name);
  int64_t i = item_index(l, it);
  if (i < 0) return tpr__propagate(TPR_ERR_INVALID_ARG, __FILE__, __LINE__);
  return tpr__hf_read_fp8(l, &l->items[i], block, dst, scale, bytes_read);
}

void tpr_rank_weights_free(tpr_rank_weights *w) {
  if (!w) return;
  for (int64_t i = 0; w->scales && i < w->n; i++) free(w->scales[i]);
  free(w->scales);
  free(w->block);
  free(w->items);
  free(w->dtype);
  free(w->offset);
  free(w->arena);
  memset(w, 0, sizeof *w);
}

// Item i's dtype as held: its kind's, the checkpoint's (TPR_LOAD_SOURCE_DTYPE) or dt.
static tpr_dtype held_dtype(const tpr_loader *l, int64_t i, tpr_dtype dt, const tpr_dtype *kind_dt) {
  tpr_dtype want = kind_dt ? kind_dt[l->items[i].kind] : dt;
  return want == TPR_LOAD_SOURCE_DTYPE ? tpr_loader_item_dtype(l, &l->items[i]) : want;
}

// The next buffer's offset after one of nb bytes at off: 64-byte aligned,
// whatever its neighbours' dtypes.
static uint64_t next_offset(uint64_t off, uint64_t nb) { return (off + nb + 63) & ~(uint64_t)63; }

uint64_t tpr_loader_arena_bytes(const tpr_loader *l, tpr_dtype dt, const tpr_dtype *kind_dt) {
  uint64_t off = 0;
  for (int64_t i = 0; i < l->n; i++)
    off = next_offset(off, (uint64_t)l->items[i].numel * tpr_dtype_size(held_dtype(l, i, dt, kind_dt)));
  return off;
}

tpr_status tpr_loader_load_all(tpr_loader *l, tpr_dtype dt, tpr_rank_weights *out) {
  return tpr_loader_load_all_as(l, dt, NULL, NULL, out);
}

tpr_status tpr_loader_load_all_as(tpr_loader *l, tpr_dtype dt, const tpr_dtype *kind_dt, const int *kind_block,
                                  tpr_rank_weights *out) {
  memset(out, 0, sizeof *out);
  int64_t n = l->n;
  tpr_rank_weights w = {.n = n};
  w.items = malloc((size_t)(n ? n : 1) * sizeof *w.items);
  w.dtype = malloc((size_t)(n ? n : 1) * sizeof *w.dtype);
  w.offset = malloc((size_t)(n + 1) * sizeof *w.offset);
  w.scales = calloc((size_t)(n ? n : 1), sizeof *w.scales);
  w.block = calloc((size_t)(n ? n : 1), sizeof *w.block);
  tpr_status rc = TPR_OK;
  if (!w.items || !w.dtype || !w.offset || !w.scales || !w.block) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    goto fail;
  }
  uint64_t off = 0;
  for (int64_t i = 0; i < n; i++) {
    w.items[i] = l->items[i];
    w.dtype[i] = held_dtype(l, i, dt, kind_dt);
    uint64_t nb = (uint64_t)l->items[i].numel * tpr_dtype_size(w.dtype[i]);
    w.offset[i] = off;
    w.bytes_held += nb;
    off = next_offset(off, nb);
  }
  w.offset[n] = off;
  // A checkpoint larger than the machine: refused here with its size, since
  // the lazily touched arena below would otherwise end in the OOM killer
  // halfway through the reads.
  char what[96];
  snprintf(what, sizeof what, "rank %d: loading its weights", l->mesh.world_rank);
  TPR_CHECK_GOTO(tpr_host_mem_check(off, what), rc, fail);
  // Pages are touched only as buffers are filled, so resident memory grows
  // with the load, never beyond what the rank holds.
  if (off && posix_memalign((void **)&w.arena, 64, (size_t)off) != 0) {
    w.arena = NULL;
    rc = TPR_FAIL(TPR_ERR_OOM, "rank %d: cannot allocate %llu bytes for its weights", l->mesh.world_rank,
                  (unsigned long long)off);
    goto fail;
  }
  tpr_progress bar;
  tpr_progress_begin(&bar, "loading weights", off, NULL);
  for (int64_t i = 0; i < n; i++) {
    tpr_progress_update(&bar, w.offset[i], NULL);
    const tpr_load_item *it = &l->items[i];
    int block = kind_block && w.dtype[i] == TPR_F8E4M3 ? kind_block[it->kind] : 0;
    if (block <= 0) {
      TPR_CHECK_GOTO(tpr_loader_read(l, it, w.dtype[i], w.arena + w.offset[i], &w.bytes_read), rc, fail_bar);
      continue;
    }
    const int64_t *rs = l->plan->tensors[it->kind].rank_shape, nsc = rs[0] * ((rs[1] + block - 1) / block);
    if (!(w.scales[i] = malloc((size_t)(nsc + 1) * sizeof *w.scales[i]))) {
      rc = TPR_FAIL(TPR_ERR_OOM, "rank %d: scales of %s", l->mesh.world_rank, it->name);
      goto fail_bar;
    }
    w.block[i] = block;
    w.bytes_held += (uint64_t)nsc * sizeof(float);
    TPR_CHECK_GOTO(tpr_loader_read_fp8(l, it, block, w.arena + w.offset[i], w.scales[i], &w.bytes_read), rc,
                   fail_bar);
  }
  tpr_progress_end(&bar);
  *out = w;
  return TPR_OK;
fail_bar:
  tpr_progress_end(&bar);
fail:
  tpr_rank_weights_free(&w);
  return rc;
}
