// tpr_convert: one safetensors file per rank plus manifest.pb, published
// atomically (see convert.h).
#include "shard/convert.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "manifest.pb-c.h"
#include "runtime/file_io.h"
#include "runtime/log.h"
#include "runtime/progress.h"
#include "shard/loader_impl.h"

// What a converted directory holds, and nothing else may be removed from one.
static bool converted_file(const char *name) {
  int r, w, end = 0;
  return !strcmp(name, "manifest.pb") || !strcmp(name, "config.json") ||
         (sscanf(name, "rank-%5d-of-%5d.safetensors%n", &r, &w, &end) == 2 && end && !name[end]);
}

static bool is_converted(const char *dir) {
  char *m = tpr_path_join(dir, "manifest.pb");
  struct stat st;
  bool yes = m && stat(m, &st) == 0;
  free(m);
  return yes;
}

// Size and XXH3 of the whole file and of its header (8-byte length + JSON),
// read back from disk: what the loader will see.
static tpr_status hash_file(const char *path, TprManifest__Shard *s) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return TPR_FAIL(TPR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  enum { CHUNK = 1 << 20 };
  uint8_t *buf = malloc(CHUNK);
  XXH3_state_t *st = XXH3_createState(), *hs = XXH3_createState();
  tpr_status rc = buf && st && hs ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "out of memory");
  if (rc == TPR_OK) XXH3_64bits_reset(st), XXH3_64bits_reset(hs);
  uint64_t pos = 0, hdr = 0;
  ssize_t got = 0;
  while (rc == TPR_OK && (got = read(fd, buf, CHUNK)) > 0) {
    if (pos == 0 && got >= 8)
      for (int i = 7; i >= 0; i--) hdr = hdr << 8 | buf[i];
    if (pos == 0) hdr += 8;
    if (pos < hdr) XXH3_64bits_update(hs, buf, (size_t)(hdr - pos < (uint64_t)got ? hdr - pos : (uint64_t)got));
    XXH3_64bits_update(st, buf, (size_t)got);
    pos += (uint64_t)got;
  }
  if (rc == TPR_OK && (got < 0 || pos < hdr)) rc = TPR_FAIL(TPR_ERR_IO, "cannot read back %s", path);
  if (rc == TPR_OK) {
    s->size = pos, s->xxh3 = XXH3_64bits_digest(st);
    s->header_bytes = hdr, s->header_xxh3 = XXH3_64bits_digest(hs);
  }
  XXH3_freeState(st), XXH3_freeState(hs);
  free(buf);
  close(fd);
  return rc;
}

static void free_shard(TprManifest__Shard *s) {
  for (size_t i = 0; i < s->n_tensors; i++) free(s->tensors[i]->name);
  if (s->n_tensors) free(s->tensors[0]);  // one array of messages
  free(s->tensors);
  if (s->file != protobuf_c_empty_string) free(s->file);  // the init value of a rank never reached
}

// Every tensor's file offset: tpr_st_write leaves no gap, so the tensor
// placed first starts right after the header.
static tpr_status record_offsets(const char *path, TprManifest__Shard *s) {
  tpr_st_set *set;
  TPR_CHECK(tpr_st_open(path, &set));
  const uint8_t *base = NULL;
  for (int i = 0; i < tpr_st_count(set); i++) {
    const uint8_t *d = tpr_st_get(set, i)->data;
    if (!base || d < base) base = d;
  }
  tpr_status rc = TPR_OK;
  for (size_t i = 0; i < s->n_tensors; i++) {
    const tpr_st_tensor *t = tpr_st_find(set, s->tensors[i]->name);
    if (!t) {
      rc = TPR_FAIL(TPR_ERR_INTERNAL, "%s: tensor '%s' was not written", path, s->tensors[i]->name);
      break;
    }
    s->tensors[i]->offset = s->header_bytes + (uint64_t)((const uint8_t *)t->data - base);
  }
  tpr_st_close(set);
  return rc;
}

static tpr_status convert_rank(const char *src, const tpr_shard_plan *p, int rank, const char *tmp, tpr_dtype dt,
                               TprManifest__Shard *s, bool **moe, tpr_convert_stats *stats) {
  char file[64], rank_s[16], world_s[16];
  tpr_loader_rank_file(rank, p->world, file, sizeof file);
  snprintf(rank_s, sizeof rank_s, "%d", rank);
  snprintf(world_s, sizeof world_s, "%d", p->world);
  tpr_loader *l = NULL;
  tpr_rank_weights w = {0};
  tpr_st_write_entry *e = NULL;
  char *path = tpr_path_join(tmp, file);
  tpr_status rc = TPR_OK;
  s->rank = rank;
  if (!path || !(s->file = strdup(file))) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    goto done;
  }
  TPR_CHECK_GOTO(tpr_loader_open(src, p, rank, &l), rc, done);
  TPR_CHECK_GOTO(tpr_loader_load_all(l, dt, &w), rc, done);
  stats->bytes_read += w.bytes_read;
  e = calloc((size_t)(w.n ? w.n : 1), sizeof *e);
  TprManifest__Tensor *tv = calloc((size_t)(w.n ? w.n : 1), sizeof *tv);
  s->tensors = calloc((size_t)(w.n ? w.n : 1), sizeof *s->tensors);
  if (!e || !tv || !s->tensors) {
    free(tv);
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    goto done;
  }
  for (int64_t i = 0; i < w.n; i++) {
    const tpr_load_item *it = &w.items[i];
    const tpr_shard_tensor *k = &p->tensors[it->kind];
    uint64_t nb = (uint64_t)it->numel * tpr_dtype_size(w.dtype[i]);
    e[i] = (tpr_st_write_entry){it->rank_name, w.dtype[i], k->ndim, k->rank_shape, tpr_rank_weights_data(&w, i)};
    TprManifest__Tensor *t = &tv[i];
    tpr_manifest__tensor__init(t);
    s->tensors[s->n_tensors++] = t;
    if (!(t->name = strdup(it->rank_name))) {
      rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
      goto done;
    }
    t->kind = it->kind, t->layer = it->layer, t->local_expert = it->local_expert, t->expert = it->expert;
    t->dtype = (char *)tpr_dtype_name(w.dtype[i]);
    t->n_shape = (size_t)k->ndim, t->shape = (int64_t *)k->rank_shape;  // the plan outlives the manifest
    t->nbytes = nb, t->xxh3 = XXH3_64bits(tpr_rank_weights_data(&w, i), nb);
  }
  if (!w.n) free(tv);  // else free_shard frees it through s->tensors[0]
  const char *meta[] = {"format", "tpr-rank-shard", "rank", rank_s, "world", world_s, NULL};
  TPR_CHECK_GOTO(tpr_st_write(path, e, (int)w.n, meta), rc, done);
  TPR_CHECK_GOTO(hash_file(path, s), rc, done);
  TPR_CHECK_GOTO(record_offsets(path, s), rc, done);
  stats->bytes_written += s->size;
  stats->files++;
  if (!*moe) *moe = l->moe, l->moe = NULL;  // the manifest lists the MoE layers once
done:
  tpr_loader_close(l);
  tpr_rank_weights_free(&w);
  free(e);
  free(path);
  return rc;
}

// Packs and writes manifest.pb: the last file, so its presence means complete.
static tpr_status write_manifest(const char *src, const tpr_shard_plan *p, const char *tmp, tpr_dtype dt,
                                 const bool *moe, TprManifest__Shard *shards, tpr_convert_stats *stats) {
  const tpr_model_config *c = &p->config;
  TprManifest__Manifest m = TPR_MANIFEST__MANIFEST__INIT;
  TprManifest__Mesh mesh = TPR_MANIFEST__MESH__INIT;
  mesh.tp = p->tp, mesh.ep = p->ep, mesh.etp = p->etp, mesh.dp = p->dp, mesh.world = p->world;
  m.format_version = TPR_MANIFEST_VERSION;
  m.mesh = &mesh;
  m.model_type = (char *)tpr_model_family_name(c->family);
  m.source = (char *)src;
  m.dtype = (char *)(dt == TPR_LOAD_SOURCE_DTYPE ? "source" : tpr_dtype_name(dt));
  TprManifest__Kind kinds[TPR_SHARD_MAX_TENSORS], *kp[TPR_SHARD_MAX_TENSORS];
  for (int k = 0; k < p->n_tensors; k++) {
    const tpr_shard_tensor *t = &p->tensors[k];
    tpr_manifest__kind__init(&kinds[k]);
    kinds[k].name = (char *)t->name, kinds[k].transform = (char *)tpr_shard_transform_name(t->transform);
    kinds[k].n_global_shape = kinds[k].n_rank_shape = (size_t)t->ndim;
    kinds[k].global_shape = (int64_t *)t->global_shape, kinds[k].rank_shape = (int64_t *)t->rank_shape;
    kinds[k].kv_layout = t->kv_layout, kinds[k].count = t->count;
    kp[k] = &kinds[k];
  }
  m.n_kinds = (size_t)p->n_tensors, m.kinds = kp;
  TprManifest__Shard **sp = malloc((size_t)p->world * sizeof *sp);
  int64_t *layers = malloc((size_t)(c->num_layers + 1) * sizeof *layers);
  uint8_t *cfg = NULL, *bytes = NULL;
  size_t cfg_len = 0;
  char *cfg_path = tpr_path_join(src, "config.json"), *out_cfg = tpr_path_join(tmp, "config.json");
  char *man_path = tpr_path_join(tmp, "manifest.pb");
  tpr_status rc = TPR_OK;
  if (!sp || !layers || !cfg_path || !out_cfg || !man_path) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    goto done;
  }
  for (int r = 0; r < p->world; r++) sp[r] = &shards[r];
  m.n_shards = (size_t)p->world, m.shards = sp;
  for (int64_t l = 0; l < c->num_layers; l++)
    if (moe[l]) layers[m.n_moe_layers++] = l;
  m.moe_layers = layers;
  TPR_CHECK_GOTO(tpr_file_read(cfg_path, &cfg, &cfg_len), rc, done);
  m.config_json = (char *)cfg;  // NUL-terminated by tpr_file_read
  TPR_CHECK_GOTO(tpr_file_create_synced(out_cfg, cfg, cfg_len), rc, done);
  size_t len = tpr_manifest__manifest__get_packed_size(&m);
  if (!(bytes = malloc(len ? len : 1))) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    goto done;
  }
  tpr_manifest__manifest__pack(&m, bytes);
  TPR_CHECK_GOTO(tpr_file_create_synced(man_path, bytes, len), rc, done);
  stats->bytes_written += cfg_len + len;
done:
  free(sp), free(layers), free(cfg), free(bytes), free(cfg_path), free(out_cfg), free(man_path);
  return rc;
}

static bool is_converted_dir(const char *dir) { return is_converted(dir); }

// What a killed convert leaves in its "<out>.tmp-<pid>": converted files and
// the safetensors writer's partial "<file>.tmp.<pid>".
static bool stale_file(const char *name) {
  const char *t = strstr(name, ".tmp.");
  char base[96];
  if (t && t[5] && strspn(t + 5, "0123456789") == strlen(t + 5) && (size_t)(t - name) < sizeof base) {
    memcpy(base, name, (size_t)(t - name));
    base[t - name] = 0;
    name = base;
  }
  return converted_file(name);
}

// "<out>.tmp-<pid>" directories of earlier runs: removed when that process is
// gone (a convert that was killed: its files are ours and useless), reported
// when it still runs (another convert into the same out, on this host; a pid
// from another host sharing the file system cannot be told apart). A
// directory holding files not of a conversion is reported and kept.
static void clear_stale_tmps(const char *out) {
  const char *slash = strrchr(out, '/');
  char *parent = slash ? strndup(out, slash == out ? 1 : (size_t)(slash - out)) : strdup(".");
  const char *base = slash ? slash + 1 : out;
  size_t blen = strlen(base);
  DIR *d = parent ? opendir(parent) : NULL;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    const char *n = e->d_name, *digits = n + blen + 5;
    if (strncmp(n, base, blen) || strncmp(n + blen, ".tmp-", 5) || !*digits ||
        strspn(digits, "0123456789") != strlen(digits))
      continue;
    long pid = strtol(digits, NULL, 10);
    char *path = tpr_path_join(parent, n);
    if (!path) break;
    // Our own pid on it: a killed run whose pid this one reuses (mkdir of ours comes after).
    if (pid > 0 && pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno == EPERM)) {
      TPR_LOG_WRN("convert: %s belongs to process %ld, which is still running (another convert into %s?); "
                  "left alone", path, pid, out);
    } else if (tpr_dir_remove_flat(path, stale_file)) {
      TPR_LOG_WRN("convert: removed %s, left by process %ld (no longer running) when it was stopped mid-convert",
                  path, pid);
    } else {
      TPR_LOG_WRN("convert: %s, left by process %ld (no longer running), holds files that are not a conversion's; "
                  "kept: remove it by hand", path, pid);
    }
    free(path);
  }
  if (d) closedir(d);
  free(parent);
}

tpr_status tpr_convert(const char *src, const tpr_shard_plan *p, const char *out, tpr_dtype dt, bool force,
                       tpr_convert_stats *stats) {
  tpr_convert_stats local = {0};
  stats = stats ? stats : &local;
  memset(stats, 0, sizeof *stats);
  if (!src || !p || !out || !*out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_convert: NULL argument");
  if (dt != TPR_LOAD_SOURCE_DTYPE && !tpr_dtype_valid(dt))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_convert: invalid dtype %d", (int)dt);
  struct stat a, b;
  if (stat(src, &a) == 0 && stat(out, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "convert: the output %s is the checkpoint being converted", out);
  if (!force && lstat(out, &b) == 0) return TPR_FAIL(TPR_ERR_IO, "%s exists; pass --force to replace it", out);
  size_t n = strlen(out) + 32;
  char *tmp = malloc(n), *dir = strdup(out);
  if (!tmp || !dir) {
    free(tmp), free(dir);
    return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  }
  for (size_t k = strlen(dir); k > 1 && dir[k - 1] == '/'; k--) dir[k - 1] = 0;  // "out/" names out, not a child
  out = dir;
  snprintf(tmp, n, "%s.tmp-%ld", out, (long)getpid());
  clear_stale_tmps(out);
  if (mkdir(tmp, 0755) != 0) {
    tpr_status rc = TPR_FAIL(TPR_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    free(tmp), free(dir);
    return rc;
  }
  TprManifest__Shard *shards = calloc((size_t)p->world, sizeof *shards);
  bool *moe = NULL;
  tpr_status rc = shards ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "out of memory");
  for (int r = 0; shards && r < p->world; r++) tpr_manifest__shard__init(&shards[r]);
  // One line for the ranks; each rank's load draws its own while it reads.
  tpr_progress bar;
  tpr_progress_begin(&bar, "converting", (uint64_t)p->world, "ranks");
  for (int r = 0; rc == TPR_OK && r < p->world; r++) {  // one rank's buffers in memory at a time
    rc = convert_rank(src, p, r, tmp, dt, &shards[r], &moe, stats);
    if (rc == TPR_OK) TPR_LOG_INF("convert: wrote rank %d of %d", r, p->world);
    tpr_progress_update(&bar, (uint64_t)r + 1, NULL);
  }
  tpr_progress_end(&bar);
  if (rc != TPR_OK) goto done;
  TPR_CHECK_GOTO(write_manifest(src, p, tmp, dt, moe, shards, stats), rc, done);
  TPR_CHECK_GOTO(tpr_dir_sync(tmp), rc, done);
  TPR_CHECK_GOTO(tpr_dir_publish(tmp, out, force, is_converted_dir, converted_file, "convert"), rc, done);
done:
  if (rc != TPR_OK) tpr_dir_remove_flat(tmp, NULL);  // everything in it is ours
  for (int r = 0; shards && r < p->world; r++) free_shard(&shards[r]);
  free(shards);
  free(moe);
  free(tmp), free(dir);
  return rc;
}
