// Loading AdamW moments saved on another dp degree (FSDP resharding): the
// rank-layout tensor of a param depends only on tp, ep and etp, so each
// element of this rank's chunk sits in the file of an old rank at the same
// tp (dense) or ep/etp (experts) coordinates -- in its chunk when the old
// run sharded (shard/fsdp.h), anywhere in its whole tensor otherwise.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/file_io.h"
#include "shard/fsdp.h"
#include "shard/safetensors.h"
#include "train/checkpoint_impl.h"
#include "train/state.h"

typedef struct old_files {
  const char *dir;
  int world;
  int64_t step;
  tpr_st_set **sets;  // (world) opened on first use
  bool *chunked;      // (world) the file holds FSDP chunks
} old_files;

static tpr_status open_old(old_files *f, int w, tpr_st_set **out) {
  if (!f->sets[w]) {
    char file[64];
    tpr__train_rank_file(w, f->world, file, sizeof file);
    char *path = tpr_path_join(f->dir, file);
    tpr_status rc = path ? tpr_st_open(path, &f->sets[w]) : TPR_FAIL(TPR_ERR_OOM, "path");
    const char *st = rc == TPR_OK ? tpr_st_metadata(f->sets[w], "step") : NULL;
    const char *fs = rc == TPR_OK ? tpr_st_metadata(f->sets[w], "fsdp") : NULL;
    if (rc == TPR_OK && (!st || strtoll(st, NULL, 10) != f->step))
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: its step (%s) is not trainer_state.json's (%lld)", path, st ? st : "none",
                    (long long)f->step);
    if (rc == TPR_OK) f->chunked[w] = fs && !strcmp(fs, "1");
    free(path);
    if (rc != TPR_OK) return rc;
  }
  *out = f->sets[w];
  return TPR_OK;
}

// The elements [lo, hi) of the rank-layout tensor old rank w holds for p,
// and its file (opened here); an empty range and no file when w laid p out
// otherwise (another tp rank for dense tensors, another ep/etp place for
// experts).
static tpr_status old_range(old_files *f, int w, const tpr_train_param *p, const tpr_session *s, tpr_st_set **set,
                            int64_t *lo, int64_t *hi) {
  const tpr_shard_plan *pl = tpr_session_plan(s);
  const tpr_mesh *me = tpr_session_mesh(s);
  tpr_mesh m;
  TPR_CHECK(tpr_mesh_init(f->world, w, pl->tp, pl->ep, pl->etp, &m));
  *lo = *hi = 0, *set = NULL;
  bool same = p->expert ? m.ep_rank == me->ep_rank && m.etp_rank == me->etp_rank : m.tp_rank == me->tp_rank;
  if (!same) return TPR_OK;
  TPR_CHECK(open_old(f, w, set));
  if (!f->chunked[w]) {
    *hi = p->full_numel;
    return TPR_OK;
  }
  int n, r;
  tpr_fsdp_group(&m, p->expert, &n, &r);
  int64_t chunk = tpr_fsdp_chunk(p->full_numel, n);
  *lo = (int64_t)r * chunk;
  *hi = *lo + chunk < p->full_numel ? *lo + chunk : p->full_numel;
  if (*lo > *hi) *lo = *hi;
  return TPR_OK;
}

// Fills moment k (0 exp_avg, 1 exp_avg_sq) of param p: this rank's
// [offset, offset + numel) minus the zero padding past full_numel.
static tpr_status load_param(old_files *f, const tpr_session *s, const tpr_train_param *p, float *dst) {
  int64_t lo = p->offset, hi = p->offset + p->numel < p->full_numel ? p->offset + p->numel : p->full_numel;
  memset(dst, 0, 2 * (size_t)p->numel * sizeof *dst);
  int64_t filled = 0;
  for (int w = 0; w < f->world && lo + filled < hi; w++) {
    tpr_st_set *set = NULL;
    int64_t a = 0, b = 0;
    TPR_CHECK(old_range(f, w, p, s, &set, &a, &b));
    int64_t from = lo + filled > a ? lo + filled : a, to = hi < b ? hi : b;
    if (from >= to || from != lo + filled) continue;  // chunks are visited in order: take the next piece only
    for (int k = 0; k < 2; k++) {
      char name[192];
      snprintf(name, sizeof name, "%s.%s", p->name, k ? "exp_avg_sq" : "exp_avg");
      const tpr_st_tensor *t = tpr_st_find(set, name);
      if (!t || t->ndim != 1 || t->shape[0] < b - a)
        return TPR_FAIL(TPR_ERR_FORMAT, "%s: old rank %d's %s is missing or shorter than its %lld elements", f->dir, w,
                        name, (long long)(b - a));
      TPR_CHECK(tpr_st_read_f32(set, name, (const int64_t[]){from - a}, (const int64_t[]){to - from},
                                dst + (size_t)k * (size_t)p->numel + (from - lo)));
    }
    filled = to - lo;
  }
  if (lo + filled < hi)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: no rank of the saved mesh holds elements %lld..%lld of %s's moments", f->dir,
                    (long long)(lo + filled), (long long)hi, p->name);
  return TPR_OK;
}

tpr_status tpr__train_load_moments(const tpr_train_state *t, const char *dir, int old_world, int64_t step,
                                   tpr_adamw_state *adam) {
  const tpr_session *s = tpr_train_state_session(t);
  old_files f = {.dir = dir, .world = old_world, .step = step};
  f.sets = calloc((size_t)old_world, sizeof *f.sets);
  f.chunked = calloc((size_t)old_world, sizeof *f.chunked);
  float *both = NULL;
  tpr_status rc = f.sets && f.chunked ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "checkpoint files");
  for (int i = 0; rc == TPR_OK && i < tpr_train_num_params(t); i++) {
    const tpr_train_param *p = tpr_train_param_at(t, i);
    free(both);
    both = malloc(2 * (size_t)p->numel * sizeof *both);
    rc = both ? load_param(&f, s, p, both) : TPR_FAIL(TPR_ERR_OOM, "moments of %s", p->name);
    if (rc == TPR_OK) {
      memcpy(adam[i].m, both, (size_t)p->numel * sizeof *both);
      memcpy(adam[i].v, both + p->numel, (size_t)p->numel * sizeof *both);
    }
  }
  for (int w = 0; f.sets && w < old_world; w++) tpr_st_close(f.sets[w]);
  free(f.sets), free(f.chunked), free(both);
  return rc;
}
