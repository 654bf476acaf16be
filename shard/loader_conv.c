// Loading a directory written by tpr convert: manifest.pb must describe the
// requested mesh and plan; the rank file's size, header and every tensor
// read are checked against its XXH3 checksums, so a flipped byte or a cut
// file is reported by file and tensor instead of loading wrong weights.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "manifest.pb-c.h"
#include "runtime/file_io.h"
#include "shard/loader_impl.h"

typedef TprManifest__Manifest manifest;

// Every name and shape in the manifest is the file's word: checked with the
// shared helpers before anything compares, sizes or prints by them.
static tpr_status check_manifest_fields(const char *path, const manifest *m) {
  char what[96];
  for (size_t k = 0; k < m->n_kinds; k++) {
    const TprManifest__Kind *g = m->kinds[k];
    snprintf(what, sizeof what, "%s: kind %zu", path, k);
    TPR_CHECK(tpr_name_check(what, g->name, strlen(g->name)));
    if (g->n_global_shape > TPR_MAX_DIMS || g->n_rank_shape > TPR_MAX_DIMS ||
        tpr_shape_check((int)g->n_global_shape, g->global_shape) != TPR_OK ||
        tpr_shape_check((int)g->n_rank_shape, g->rank_shape) != TPR_OK)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s has an invalid shape", what);
  }
  for (size_t i = 0; i < m->n_shards; i++) {
    const TprManifest__Shard *s = m->shards[i];
    snprintf(what, sizeof what, "%s: shard %zu", path, i);
    TPR_CHECK(tpr_name_check(what, s->file, strlen(s->file)));
    for (size_t j = 0; j < s->n_tensors; j++) {
      const TprManifest__Tensor *t = s->tensors[j];
      snprintf(what, sizeof what, "%s: shard %zu tensor %zu", path, i, j);
      TPR_CHECK(tpr_name_check(what, t->name, strlen(t->name)));
      uint64_t end;
      if (t->n_shape > TPR_MAX_DIMS || tpr_shape_check((int)t->n_shape, t->shape) != TPR_OK ||
          t->nbytes > (uint64_t)TPR_SHAPE_MAX_BYTES || __builtin_add_overflow(t->offset, t->nbytes, &end))
        return TPR_FAIL(TPR_ERR_FORMAT, "%s has an invalid shape, size or offset", what);
    }
  }
  return TPR_OK;
}

static tpr_status read_manifest(const char *dir, manifest **out) {
  char *path = tpr_path_join(dir, "manifest.pb");
  if (!path) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  uint8_t *bytes = NULL;
  size_t len = 0;
  tpr_status rc = tpr_file_read(path, &bytes, &len);
  manifest *m = rc == TPR_OK ? tpr_manifest__manifest__unpack(NULL, len, bytes) : NULL;
  free(bytes);
  if (rc == TPR_OK && !m) rc = TPR_FAIL(TPR_ERR_FORMAT, "%s is not a valid manifest (protobuf parse failed)", path);
  else if (rc == TPR_OK && m->format_version != TPR_MANIFEST_VERSION)
    rc = TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s has format version %u; this build reads version %d", path,
                  m->format_version, TPR_MANIFEST_VERSION);
  else if (rc == TPR_OK && !m->mesh) rc = TPR_FAIL(TPR_ERR_FORMAT, "%s has no mesh", path);
  else if (rc == TPR_OK && check_manifest_fields(path, m) != TPR_OK) rc = TPR_ERR_FORMAT;
  free(path);
  if (rc != TPR_OK) {
    if (m) tpr_manifest__manifest__free_unpacked(m, NULL);
    return rc;
  }
  *out = m;
  return TPR_OK;
}

static tpr_status check_mesh(const tpr_loader *l, const manifest *m) {
  const TprManifest__Mesh *g = m->mesh;
  const tpr_shard_plan *p = l->plan;
  if (g->tp == p->tp && g->ep == p->ep && g->etp == p->etp && g->dp == p->dp) return TPR_OK;
  return TPR_FAIL(TPR_ERR_INVALID_ARG,
                  "%s was converted for the mesh tp=%d ep=%d etp=%d dp=%d (world %d), but the requested mesh is "
                  "tp=%d ep=%d etp=%d dp=%d (world %d): convert the original checkpoint for this mesh",
                  l->dir, g->tp, g->ep, g->etp, g->dp, g->world, p->tp, p->ep, p->etp, p->dp, p->world);
}

static bool same_shape(const int64_t *a, size_t na, const int64_t *b, int nb) {
  if (na != (size_t)nb) return false;
  for (int d = 0; d < nb; d++)
    if (a[d] != b[d]) return false;
  return true;
}

// The manifest's kinds are the plan's, in order: else the directory holds
// another model (or was converted by a different planner).
static tpr_status check_kinds(const tpr_loader *l, const manifest *m) {
  const tpr_shard_plan *p = l->plan;
  if (m->n_kinds != (size_t)p->n_tensors)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s/manifest.pb lists %zu tensor kinds, the model config plans %d", l->dir,
                    m->n_kinds, p->n_tensors);
  for (int k = 0; k < p->n_tensors; k++) {
    const TprManifest__Kind *g = m->kinds[k];
    const tpr_shard_tensor *t = &p->tensors[k];
    if (strcmp(g->name, t->name) || strcmp(g->transform, tpr_shard_transform_name(t->transform)) ||
        !same_shape(g->rank_shape, g->n_rank_shape, t->rank_shape, t->ndim) ||
        !same_shape(g->global_shape, g->n_global_shape, t->global_shape, t->ndim) || g->kv_layout != t->kv_layout ||
        g->count != t->count)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s/manifest.pb: tensor kind %d is '%s' (%s), but the model config plans '%s' "
                      "(%s) differently: the directory holds another model", l->dir, k, g->name, g->transform,
                      t->name, tpr_shard_transform_name(t->transform));
  }
  return TPR_OK;
}

static tpr_status read_moe_layers(tpr_loader *l, const manifest *m) {
  int64_t L = l->plan->config.num_layers;
  if (!(l->moe = calloc((size_t)(L ? L : 1), sizeof *l->moe))) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  for (size_t i = 0; i < m->n_moe_layers; i++) {
    if (m->moe_layers[i] < 0 || m->moe_layers[i] >= L || l->moe[m->moe_layers[i]])
      return TPR_FAIL(TPR_ERR_FORMAT, "%s/manifest.pb: MoE layer %lld listed twice or outside [0, %lld)", l->dir,
                      (long long)m->moe_layers[i], (long long)L);
    l->moe[m->moe_layers[i]] = true;
  }
  if ((int64_t)m->n_moe_layers != l->plan->config.num_moe_layers)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s/manifest.pb lists %zu MoE layers, the model config has %lld", l->dir,
                    m->n_moe_layers, (long long)l->plan->config.num_moe_layers);
  return TPR_OK;
}

// Size first (a truncated file names the first tensor it cuts), then the
// header bytes, before the safetensors parser reads them.
static tpr_status check_file(const tpr_loader *l, const TprManifest__Shard *s) {
  struct stat st;
  if (stat(l->rank_path, &st) != 0) return TPR_FAIL(TPR_ERR_IO, "cannot open %s: %s", l->rank_path, strerror(errno));
  if ((uint64_t)st.st_size != s->size) {
    const TprManifest__Tensor *cut = NULL;  // the lowest-placed tensor not wholly in the file
    for (size_t i = 0; i < s->n_tensors; i++) {
      const TprManifest__Tensor *t = s->tensors[i];
      if (t->offset + t->nbytes > (uint64_t)st.st_size && (!cut || t->offset < cut->offset)) cut = t;
    }
    return TPR_FAIL(TPR_ERR_FORMAT, "%s is %lld bytes, but manifest.pb records %llu: the file is %s; first tensor "
                    "affected: '%s'", l->rank_path, (long long)st.st_size, (unsigned long long)s->size,
                    (uint64_t)st.st_size < s->size ? "truncated" : "longer than written", cut ? cut->name : "(none)");
  }
  if (s->header_bytes < 8 || s->header_bytes > s->size)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s/manifest.pb: header size %llu of %s is impossible", l->dir,
                    (unsigned long long)s->header_bytes, s->file);
  uint8_t *buf = malloc(s->header_bytes);
  int fd = open(l->rank_path, O_RDONLY | O_CLOEXEC);
  ssize_t got = buf && fd >= 0 ? pread(fd, buf, s->header_bytes, 0) : -1;
  if (fd >= 0) close(fd);
  tpr_status rc = TPR_OK;
  if (got != (ssize_t)s->header_bytes) rc = TPR_FAIL(TPR_ERR_IO, "cannot read the header of %s", l->rank_path);
  else if (XXH3_64bits(buf, s->header_bytes) != s->header_xxh3)
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: the safetensors header fails its checksum in manifest.pb: the file is corrupt",
                  l->rank_path);
  free(buf);
  return rc;
}

// Pairs every manifest tensor of this rank's shard with a loader item.
static tpr_status match_tensors(tpr_loader *l, const TprManifest__Shard *s) {
  if (!(l->conv = calloc((size_t)(l->n ? l->n : 1), sizeof *l->conv))) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  if (s->n_tensors != (size_t)l->n)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s/manifest.pb lists %zu tensors for %s; rank %d holds %lld", l->dir,
                    s->n_tensors, s->file, l->mesh.world_rank, (long long)l->n);
  for (size_t j = 0; j < s->n_tensors; j++) {
    const TprManifest__Tensor *g = s->tensors[j];
    const tpr_load_item *it = NULL;
    tpr_dtype dt;
    if (g->kind < 0 || g->kind >= l->plan->n_tensors ||
        tpr_loader_find(l, g->kind, g->layer, g->local_expert, &it) != TPR_OK || strcmp(it->rank_name, g->name) ||
        tpr_dtype_parse(g->dtype, &dt) != TPR_OK)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s/manifest.pb: tensor '%s' of %s is not one rank %d holds", l->dir, g->name,
                      s->file, l->mesh.world_rank);
    const tpr_shard_tensor *k = &l->plan->tensors[it->kind];
    const tpr_st_tensor *t = tpr_st_find(l->set, it->rank_name);
    if (!t || t->dtype != dt || !same_shape(t->shape, (size_t)t->ndim, k->rank_shape, k->ndim) ||
        !same_shape(g->shape, g->n_shape, k->rank_shape, k->ndim) || t->nbytes != g->nbytes)
      return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s' is %s or differs from manifest.pb and the plan in dtype or "
                      "shape", l->rank_path, g->name, t ? "present" : "missing");
    tpr__conv_tensor *c = &l->conv[it - l->items];
    if (c->seen) return TPR_FAIL(TPR_ERR_FORMAT, "%s/manifest.pb lists '%s' twice", l->dir, g->name);
    *c = (tpr__conv_tensor){.xxh3 = g->xxh3, .nbytes = g->nbytes, .offset = g->offset, .dtype = dt, .seen = true};
  }
  return TPR_OK;
}

tpr_status tpr__conv_open(tpr_loader *l) {
  manifest *m = NULL;
  TPR_CHECK(read_manifest(l->dir, &m));
  const TprManifest__Shard *s = NULL;
  char want[64];
  tpr_status rc;
  TPR_CHECK_GOTO(check_mesh(l, m), rc, done);
  TPR_CHECK_GOTO(check_kinds(l, m), rc, done);
  TPR_CHECK_GOTO(read_moe_layers(l, m), rc, done);
  TPR_CHECK_GOTO(tpr__load_items(l->plan, &l->mesh, l->moe, &l->items, &l->n, &l->kind_start), rc, done);
  tpr_loader_rank_file(l->mesh.world_rank, l->plan->world, want, sizeof want);
  for (size_t i = 0; i < m->n_shards && !s; i++)
    if (m->shards[i]->rank == l->mesh.world_rank) s = m->shards[i];
  if (!s || strcmp(s->file, want)) {  // names are fixed: no path from the manifest reaches open()
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s/manifest.pb has no shard %s for rank %d", l->dir, want, l->mesh.world_rank);
    goto done;
  }
  if (!(l->rank_path = tpr_path_join(l->dir, want))) {
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
    goto done;
  }
  TPR_CHECK_GOTO(check_file(l, s), rc, done);
  TPR_CHECK_GOTO(tpr_st_open(l->rank_path, &l->set), rc, done);
  TPR_CHECK_GOTO(match_tensors(l, s), rc, done);
done:
  tpr_manifest__manifest__free_unpacked(m, NULL);
  return rc;
}

tpr_status tpr__conv_read(tpr_loader *l, const tpr_load_item *it, tpr_dtype dt, void *dst, uint64_t *bytes_read) {
  const tpr__conv_tensor *c = &l->conv[it - l->items];
  const tpr_st_tensor *t = tpr_st_find(l->set, it->rank_name);  // present: match_tensors checked
  if (dt == TPR_LOAD_SOURCE_DTYPE) dt = c->dtype;
  // Rows in chunks of a few MiB: hash the stored bytes, copy them (converted
  // if asked), release the mapped pages, so only a chunk is ever resident.
  enum { SPAN = 4 << 20 };
  int64_t rows = t->ndim ? t->shape[0] : 1, row = rows ? (int64_t)t->nbytes / rows : 0;
  int64_t step = row && SPAN / row > 0 ? SPAN / row : 1, drow = row / (int64_t)tpr_dtype_size(c->dtype) *
                                                                  (int64_t)tpr_dtype_size(dt);
  XXH3_state_t *h = XXH3_createState();
  if (!h) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  XXH3_64bits_reset(h);
  tpr_status rc = TPR_OK;
  for (int64_t r = 0; rc == TPR_OK && r < rows && row; r += step) {
    int64_t n = rows - r < step ? rows - r : step, start[TPR_MAX_DIMS] = {r}, len[TPR_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) len[d] = d ? t->shape[d] : n;
    const uint8_t *src = (const uint8_t *)t->data + r * row;
    XXH3_64bits_update(h, src, (size_t)(n * row));
    rc = tpr_st_read(l->set, t->name, t->ndim ? start : NULL, t->ndim ? len : NULL, dt, (uint8_t *)dst + r * drow);
    tpr__drop_pages(src, (size_t)(n * row));
  }
  uint64_t got = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  TPR_CHECK(rc);
  if (got != c->xxh3)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: tensor '%s' fails its checksum (xxh3 %016llx, manifest.pb records %016llx): "
                    "the file is corrupt", l->rank_path, it->rank_name, (unsigned long long)got,
                    (unsigned long long)c->xxh3);
  if (bytes_read) *bytes_read += t->nbytes;
  return TPR_OK;
}
