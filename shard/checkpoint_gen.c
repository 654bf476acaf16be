// tpr_checkpoint_generate: the tensor list comes from the sharding plan at
// tp = 1 (whose rank shapes are the global shapes), so a generated
// checkpoint has exactly the tensors the loader will ask for.
#include "shard/checkpoint_gen.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/file_io.h"
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

typedef struct gen {
  const tpr_shard_plan *p;
  tpr_load_item *items;
  int64_t n;
  tpr_dtype base, *dt;  // the requested dtype; each item's (n)
  uint64_t seed, total;
  cJSON *weight_map;
} gen;

// Writes items [from, to) as file `name` in dir.
static tpr_status write_file(gen *g, const char *dir, const char *name, int64_t from, int64_t to) {
  int64_t m = to - from;
  tpr_st_write_entry *e = calloc((size_t)(m ? m : 1), sizeof *e);
  void **bufs = calloc((size_t)(m ? m : 1), sizeof *bufs);
  char *path = tpr_path_join(dir, name);
  tpr_status rc = e && bufs && path ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "out of memory");
  for (int64_t i = 0; rc == TPR_OK && i < m; i++) {
    const tpr_load_item *it = &g->items[from + i];
    const tpr_shard_tensor *k = &g->p->tensors[it->kind];
    rc = fill(it->name, g->seed, it->numel, g->dt[from + i], &bufs[i]);
    e[i] = (tpr_st_write_entry){it->name, g->dt[from + i], k->ndim, k->rank_shape, bufs[i]};
    if (rc == TPR_OK && !cJSON_AddStringToObject(g->weight_map, it->name, name))
      rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
  }
  if (rc == TPR_OK) rc = tpr_st_write(path, e, (int)m, (const char *const[]){"format", "pt", NULL});
  for (int64_t i = 0; bufs && i < m; i++) free(bufs[i]);
  free(bufs), free(e), free(path);
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
    g->total += (uint64_t)g->items[i].numel * tpr_dtype_size(g->dt[i]);
  }
  if (n_files > g->n) n_files = (int)g->n;
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
    TPR_CHECK(write_file(g, dir, name, from, to));
    from = to;
  }
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
