// tpr_checkpoint_generate: the tensor list comes from the sharding plan at
// tp = 1 (whose rank shapes are the global shapes), so a generated
// checkpoint has exactly the tensors the loader will ask for.
#include "shard/checkpoint_gen.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/file_io.h"
#include "runtime/progress.h"
#include "runtime/rng.h"
#include "shard/loader_impl.h"

static uint64_t fnv1a(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

// Random values of one tensor in dtype dt: *out malloc'ed (n elements).
static tpr_status fill(const char *name, uint64_t seed, int64_t n, tpr_dtype dt, void **out) {
  float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
  void *b = malloc((size_t)(n ? n : 1) * tpr_dtype_size(dt));
  if (!f || !b) {
    free(f), free(b);
    return TPR_FAIL(TPR_ERR_OOM, "out of memory generating %s", name);
  }
  tpr_rng rng = {seed ^ fnv1a(name)};
  bool norm = strstr(name, "norm") != NULL, bias = strstr(name, "bias") != NULL;
  tpr_rng_fill_normal(&rng, f, (size_t)n, norm || bias ? 0.1 : 0.02);
  if (norm)
    for (int64_t i = 0; i < n; i++) f[i] += 1.0f;
  tpr_dtype_convert(f, TPR_F32, b, dt, (size_t)n);
  free(f);
  *out = b;
  return TPR_OK;
}

// FP8-E4M3 in 128 x 128 blocks as DeepSeek-V3 and MiniMax-M2 release their
// weights: each block's multiplier (scale_inv) maps its largest magnitude
// to 448, E4M3's largest finite value. w (R, C) f32 -> q (R, C) bytes,
// scale (ceil(R/128), ceil(C/128)) f32.
static void quantize_fp8(const float *w, int64_t R, int64_t C, uint8_t *q, float *scale) {
  const int64_t B = TPR_ST_FP8_BLOCK, SC = (C + B - 1) / B;
  for (int64_t rb = 0; rb * B < R; rb++)
    for (int64_t cb = 0; cb < SC; cb++) {
      float amax = 0;
      for (int64_t r = rb * B; r < R && r < (rb + 1) * B; r++)
        for (int64_t c = cb * B; c < C && c < (cb + 1) * B; c++) amax = fmaxf(amax, fabsf(w[r * C + c]));
      float sc = amax > 0 ? amax / 448.0f : 1.0f;
      scale[rb * SC + cb] = sc;
      for (int64_t r = rb * B; r < R && r < (rb + 1) * B; r++)
        for (int64_t c = cb * B; c < C && c < (cb + 1) * B; c++) q[r * C + c] = tpr_f32_to_f8e4m3(w[r * C + c] / sc);
    }
}

typedef struct gen {
  const tpr_shard_plan *p;
  tpr_load_item *items;
  int64_t n;
  tpr_dtype base, *dt;  // the requested dtype; each item's (n)
  uint64_t seed, total;
  cJSON *weight_map;
  tpr_progress bar;  // bytes written
  uint64_t written;
} gen;

// Writes items [from, to) as file `name` in dir.
// An FP8 item: its bytes into *q, its scale_inv into *scale (both malloc'ed)
// and the scale's entry into e (name in sname[TPR_LOAD_NAME_MAX + 16]).
static tpr_status fp8_item(gen *g, const tpr_load_item *it, const tpr_shard_tensor *k, void **q, void **scale,
                           char *sname, int64_t *sshape) {
  void *f = NULL;
  TPR_CHECK(fill(it->name, g->seed, it->numel, TPR_F32, &f));
  const int64_t R = k->rank_shape[0], C = k->rank_shape[1], B = TPR_ST_FP8_BLOCK;
  sshape[0] = (R + B - 1) / B, sshape[1] = (C + B - 1) / B;
  *q = malloc((size_t)(R * C) + 1);
  *scale = malloc((size_t)(sshape[0] * sshape[1]) * sizeof(float) + 1);
  tpr_status rc = *q && *scale ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "out of memory quantizing %s", it->name);
  if (rc == TPR_OK) quantize_fp8(f, R, C, *q, *scale);
  free(f);
  snprintf(sname, TPR_LOAD_NAME_MAX + 16, "%s_scale_inv", it->name);
  return rc;
}

static tpr_status write_file(gen *g, const char *dir, const char *name, int64_t from, int64_t to) {
  int64_t m = to - from, ne = 0;
  // Room for an FP8 item's scale_inv beside each item.
  tpr_st_write_entry *e = calloc((size_t)(2 * m + 1), sizeof *e);
  void **bufs = calloc((size_t)(2 * m + 1), sizeof *bufs);
  char (*snames)[TPR_LOAD_NAME_MAX + 16] = calloc((size_t)(m + 1), sizeof *snames);
  int64_t (*sshapes)[2] = calloc((size_t)(m + 1), sizeof *sshapes);
  char *path = tpr_path_join(dir, name);
  tpr_status rc = e && bufs && snames && sshapes && path ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "out of memory");
  for (int64_t i = 0; rc == TPR_OK && i < m; i++) {
    const tpr_load_item *it = &g->items[from + i];
    const tpr_shard_tensor *k = &g->p->tensors[it->kind];
    tpr_dtype dt = g->dt[from + i];
    if (dt == TPR_F8E4M3) {
      rc = fp8_item(g, it, k, &bufs[ne], &bufs[ne + 1], snames[i], sshapes[i]);
      e[ne] = (tpr_st_write_entry){it->name, dt, k->ndim, k->rank_shape, bufs[ne]};
      e[ne + 1] = (tpr_st_write_entry){snames[i], TPR_F32, 2, sshapes[i], bufs[ne + 1]};
      if (rc == TPR_OK && !cJSON_AddStringToObject(g->weight_map, snames[i], name))
        rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
      ne += 2;
    } else {
      rc = fill(it->name, g->seed, it->numel, dt, &bufs[ne]);
      e[ne++] = (tpr_st_write_entry){it->name, dt, k->ndim, k->rank_shape, bufs[ne - 1]};
    }
    if (rc == TPR_OK && !cJSON_AddStringToObject(g->weight_map, it->name, name))
      rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    g->written += (uint64_t)it->numel * tpr_dtype_size(dt);  // filled in memory: the file follows at once
    tpr_progress_update(&g->bar, g->written, NULL);
  }
  if (rc == TPR_OK) rc = tpr_st_write(path, e, (int)ne, (const char *const[]){"format", "pt", NULL});
  for (int64_t i = 0; bufs && i < 2 * m + 1; i++) free(bufs[i]);
  free(bufs), free(e), free(snames), free(sshapes), free(path);
  return rc;
}

static tpr_status write_text(const char *dir, const char *name, const char *text, size_t len) {
  char *path = tpr_path_join(dir, name);
  if (!path) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  tpr_status rc = tpr_file_write(path, (const uint8_t *)text, len);
  free(path);
  return rc;
}

static tpr_status generate(gen *g, const char *dir, int n_files, const char *cfg, size_t cfg_len) {
  for (int64_t i = 0; i < g->n; i++) {
    g->dt[i] = strstr(g->items[i].name, "e_score_correction_bias") ? TPR_F32 : g->base;
    // FP8 releases quantize the projections and experts; embeddings, the lm
    // head, the router and the norms stay bf16.
    const char *nm = g->items[i].name;
    if (g->base == TPR_F8E4M3)
      g->dt[i] = g->p->tensors[g->items[i].kind].ndim == 2 && !strstr(nm, "embed_tokens") && !strstr(nm, "lm_head") &&
                         !strstr(nm, ".gate.weight")
                     ? TPR_F8E4M3
                     : g->dt[i] == TPR_F32 ? TPR_F32 : TPR_BF16;
    g->total += (uint64_t)g->items[i].numel * tpr_dtype_size(g->dt[i]);
  }
  if (n_files > g->n) n_files = (int)g->n;
  tpr_progress_begin(&g->bar, "writing checkpoint", g->total, NULL);
  uint64_t done = 0;
  int64_t from = 0;
  for (int f = 0; f < n_files; f++) {
    // File f ends once the bytes so far reach its share of the total.
    uint64_t target = g->total / (uint64_t)n_files * (uint64_t)(f + 1);
    int64_t to = from;
    // At least one tensor per file, and at least one left for each later file.
    while (to < g->n - (n_files - f - 1) && (to == from || done < target || f == n_files - 1)) {
      done += (uint64_t)g->items[to].numel * tpr_dtype_size(g->dt[to]);
      to++;
    }
    char name[64];
    snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, n_files);
    tpr_status rc = write_file(g, dir, name, from, to);
    if (rc != TPR_OK) return tpr_progress_end(&g->bar), rc;
    from = to;
  }
  tpr_progress_end(&g->bar);
  cJSON *idx = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(idx, "metadata");
  cJSON_AddNumberToObject(meta, "total_size", (double)g->total);
  cJSON_AddItemReferenceToObject(idx, "weight_map", g->weight_map);
  char *text = cJSON_Print(idx);
  cJSON_Delete(idx);
  tpr_status rc = text ? write_text(dir, "model.safetensors.index.json", text, strlen(text))
                       : TPR_FAIL(TPR_ERR_OOM, "out of memory");
  free(text);
  TPR_CHECK(rc);
  return write_text(dir, "config.json", cfg, cfg_len);
}

tpr_status tpr_checkpoint_generate(const char *config_path, const char *out_dir, uint64_t seed, tpr_dtype dt,
                                   int n_files, uint64_t *total_bytes) {
  if (!config_path || !out_dir || n_files < 1 || !tpr_dtype_valid(dt) || !tpr_dtype_is_float(dt))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "make-checkpoint: config, output, >= 1 file and a float dtype are needed");
  uint8_t *cfg = NULL;
  size_t len = 0;
  tpr_model_config c;
  tpr_shard_plan p = {0};
  tpr_mesh m;
  gen g = {.p = &p, .seed = seed, .base = dt};
  bool *moe = NULL;
  int64_t *ks = NULL;
  tpr_status rc;
  TPR_CHECK(tpr_file_read(config_path, &cfg, &len));
  TPR_CHECK_GOTO(tpr_model_config_parse((const char *)cfg, len, config_path, &c), rc, done);
  TPR_CHECK_GOTO(tpr_shard_plan_build(&c, 1, 1, 1, 1, dt, &p), rc, done);
  TPR_CHECK_GOTO(tpr_mesh_init(1, 0, 1, 1, 1, &m), rc, done);
  TPR_CHECK_GOTO(tpr__moe_layers((const char *)cfg, len, config_path, &c, &moe), rc, done);
  TPR_CHECK_GOTO(tpr__load_items(&p, &m, moe, &g.items, &g.n, &ks), rc, done);
  if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {  // only once the config is known to be good
    rc = TPR_FAIL(TPR_ERR_IO, "cannot create %s: %s", out_dir, strerror(errno));
    goto done;
  }
  g.dt = malloc((size_t)(g.n ? g.n : 1) * sizeof *g.dt);
  g.weight_map = cJSON_CreateObject();
  if (!g.dt || !g.weight_map) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    goto done;
  }
  TPR_CHECK_GOTO(generate(&g, out_dir, n_files, (const char *)cfg, len), rc, done);
  if (total_bytes) *total_bytes = g.total;
done:
  cJSON_Delete(g.weight_map);
  free(g.dt), free(g.items), free(ks), free(moe), free(cfg);
  tpr_shard_plan_free(&p);
  return rc;
}
