#define _GNU_SOURCE  // renameat2
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/file_io.h"
#include "runtime/log.h"
#include "shard/safetensors.h"
#include "train/checkpoint_impl.h"
#include "train/state.h"

tpr_status tpr__collect_push(tpr__collect *c, char *name, tpr_dtype dt, int ndim, int64_t *shape, void *data) {
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 64;
    tpr_st_write_entry *e = realloc(c->e, (size_t)cap * sizeof *e);
    if (!e) {
      free(name), free(shape), free(data);
      return TPR_FAIL(TPR_ERR_OOM, "checkpoint tensors");
    }
    c->e = e, c->cap = cap;
  }
  c->e[c->n++] = (tpr_st_write_entry){.name = name, .dtype = dt, .ndim = ndim, .shape = shape, .data = data};
  return TPR_OK;
}

static tpr_status collect_add(void *ctx, const char *name, int ndim, const int64_t *shape, const float *data) {
  int64_t n = ndim == 2 ? shape[0] * shape[1] : shape[0];
  int64_t *sh = malloc(2 * sizeof *sh);
  float *copy = malloc((size_t)n * sizeof *copy);
  char *nm = strdup(name);
  if (!sh || !copy || !nm) {
    free(sh), free(copy), free(nm);
    return TPR_FAIL(TPR_ERR_OOM, "checkpoint tensors");
  }
  memcpy(sh, shape, (size_t)ndim * sizeof *sh);
  memcpy(copy, data, (size_t)n * sizeof *copy);
  return tpr__collect_push(ctx, nm, TPR_F32, ndim, sh, copy);
}

void tpr__collect_free(tpr__collect *c) {
  for (int i = 0; i < c->n; i++) free((void *)c->e[i].name), free((void *)c->e[i].shape), free((void *)c->e[i].data);
  free(c->e);
  memset(c, 0, sizeof *c);
}

tpr_status tpr_train_write_full(tpr_train_state *t, bool grads, const char *path) {
  const tpr_session *s = tpr_train_state_session(t);
  tpr__collect c = {0};
  tpr_status rc = tpr_train_export(t, grads, collect_add, &c);
  // The model a save publishes is in the layout transformers loads; the
  // gradient dumps keep tpr's names (the tests compare them by those).
  if (rc == TPR_OK && !grads && tpr_session_mesh(s)->world_rank == 0)
    rc = tpr__train_hf_layout(s, tpr_session_model_dir(s), &c);
  if (rc == TPR_OK && tpr_session_mesh(s)->world_rank == 0) rc = tpr_st_write(path, c.e, c.n, NULL);
  tpr__collect_free(&c);
  return rc;
}

void tpr__train_rank_file(int rank, int world, char *buf, size_t n) {
  snprintf(buf, n, "optim-rank-%05d-of-%05d.safetensors", rank, world);
}

// What a checkpoint carries from the model it was trained from besides its
// weights: the config (required), and the files that make the directory a
// model `tpr run` / `tpr serve` / transformers can use on its own (the
// tokenizer, its chat template, the generation defaults) when the source
// has them.
static const char *const carried_files[] = {"config.json",          "tokenizer.json",      "tokenizer_config.json",
                                            "special_tokens_map.json", "chat_template.jinja", "generation_config.json"};

// What a training checkpoint holds (nothing else is removed with an old one),
// and the writer's partial "<file>.tmp.<pid>" that a rank killed while
// writing one leaves in DIR.tmp: the next save must clear those too.
static bool our_file(const char *name) {
  char base[128];
  size_t n = strlen(name);
  const char *t = strstr(name, ".tmp.");
  if (t && t[5] && strspn(t + 5, "0123456789") == strlen(t + 5) && (size_t)(t - name) < sizeof base) {
    memcpy(base, name, (size_t)(t - name));
    base[t - name] = 0;
    name = base, n = strlen(base);
  }
  int r, w, end = 0;
  for (size_t i = 0; i < sizeof carried_files / sizeof carried_files[0]; i++)
    if (!strcmp(name, carried_files[i])) return true;
  return !strcmp(name, "model.safetensors") || !strcmp(name, "trainer_state.json") ||
         (sscanf(name, "optim-rank-%5d-of-%5d.safetensors%n", &r, &w, &end) == 2 && (size_t)end == n);
}

static bool is_checkpoint(const char *dir) {
  char *p = tpr_path_join(dir, "trainer_state.json");
  struct stat st;
  bool yes = p && stat(p, &st) == 0;
  free(p);
  return yes;
}

static tpr_status write_state(const char *tmp, const tpr_session *s, int64_t step, const tpr_train_opts *o) {
  const tpr_shard_plan *pl = tpr_session_plan(s);
  cJSON *j = cJSON_CreateObject();
  if (!j) return TPR_FAIL(TPR_ERR_OOM, "trainer state");
  cJSON_AddNumberToObject(j, "step", (double)step);
  cJSON_AddNumberToObject(j, "world", pl->world);
  cJSON_AddNumberToObject(j, "tp", pl->tp);
  cJSON_AddNumberToObject(j, "dp", pl->dp);
  cJSON_AddNumberToObject(j, "ep", pl->ep);
  cJSON_AddNumberToObject(j, "etp", pl->etp);
  cJSON_AddNumberToObject(j, "seq_len", (double)o->seq_len);
  cJSON_AddNumberToObject(j, "micro_batch", (double)o->micro_batch);
  cJSON_AddNumberToObject(j, "grad_accum", (double)o->grad_accum);
  cJSON_AddNumberToObject(j, "seed", (double)o->seed);
  cJSON_AddStringToObject(j, "data", o->data ? o->data : "");
  cJSON_AddStringToObject(j, "data_order", o->data_sequential ? "sequential" : "random");
  cJSON_AddBoolToObject(j, "sft", o->sft);
  char *text = cJSON_Print(j), *path = tpr_path_join(tmp, "trainer_state.json");
  cJSON_Delete(j);
  tpr_status rc = text && path ? tpr_file_create_synced(path, text, strlen(text)) : TPR_FAIL(TPR_ERR_OOM, "state");
  free(text), free(path);
  return rc;
}

static tpr_status copy_model_files(const tpr_session *s, const char *tmp) {
  tpr_status rc = TPR_OK;
  for (size_t i = 0; rc == TPR_OK && i < sizeof carried_files / sizeof carried_files[0]; i++) {
    char *src = tpr_path_join(tpr_session_model_dir(s), carried_files[i]), *dst = tpr_path_join(tmp, carried_files[i]);
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (!src || !dst) rc = TPR_FAIL(TPR_ERR_OOM, "checkpoint");
    else if (i == 0 || access(src, F_OK) == 0) rc = tpr_file_read(src, &bytes, &len);
    if (rc == TPR_OK && bytes) rc = tpr_file_create_synced(dst, bytes, len);
    free(src), free(dst), free(bytes);
  }
  return rc;
}

// This rank's moments under "<param>.exp_avg" / ".exp_avg_sq".
static tpr_status write_moments(const tpr_train_state *t, const char *tmp, int64_t step,
                                const tpr_adamw_state *adam) {
  const tpr_session *s = tpr_train_state_session(t);
  int n = tpr_train_num_params(t);
  tpr_st_write_entry *e = calloc((size_t)(2 * n + 1), sizeof *e);
  char (*names)[192] = calloc((size_t)(2 * n + 1), sizeof *names);
  int64_t *shapes = calloc((size_t)(n + 1), sizeof *shapes);
  tpr_status rc = e && names && shapes ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "optimizer state");
  for (int i = 0; rc == TPR_OK && i < n; i++) {
    const tpr_train_param *p = tpr_train_param_at(t, i);
    shapes[i] = p->numel;
    for (int k = 0; k < 2; k++) {
      snprintf(names[2 * i + k], sizeof names[0], "%s.%s", p->name, k ? "exp_avg_sq" : "exp_avg");
      e[2 * i + k] = (tpr_st_write_entry){names[2 * i + k], TPR_F32, 1, &shapes[i], k ? adam[i].v : adam[i].m};
    }
  }
  char file[64], stepbuf[32];
  tpr__train_rank_file(tpr_session_mesh(s)->world_rank, tpr_session_mesh(s)->world_size, file, sizeof file);
  snprintf(stepbuf, sizeof stepbuf, "%lld", (long long)step);
  // Whether the moments are FSDP chunks: a resume on another dp degree
  // recomputes every old rank's chunk from it (train/checkpoint_reshard.c).
  bool chunks = false;
  for (int i = 0; i < n; i++) chunks = chunks || tpr_train_param_at(t, i)->shards > 1;
  const char *meta[] = {"step", stepbuf, "fsdp", chunks ? "1" : "0", NULL};
  char *path = rc == TPR_OK ? tpr_path_join(tmp, file) : NULL;
  if (rc == TPR_OK) rc = path ? tpr_st_write(path, e, 2 * n, meta) : TPR_FAIL(TPR_ERR_OOM, "path");
  free(path), free(e), free(names), free(shapes);
  return rc;
}

// Publishes the finished tmp as dir. Over a previous checkpoint the two are
// swapped by one renameat2(RENAME_EXCHANGE): rank 0 may be killed at any
// instant of a save (mpirun ends it when another rank dies), and a
// rename-away-then-rename-over would leave a moment with no dir at all. After
// the swap tmp holds the previous checkpoint; it is removed, and a kill
// before that leaves it as the leftover the next save clears. File systems
// without the exchange get tpr_dir_publish (old moved aside first).
static tpr_status publish(const char *tmp, const char *dir) {
  if (!is_checkpoint(dir) || renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) != 0) {
    if (is_checkpoint(dir) && errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      return TPR_FAIL(TPR_ERR_IO, "train --save: cannot swap %s and %s: %s", tmp, dir, strerror(errno));
    return tpr_dir_publish(tmp, dir, true, is_checkpoint, our_file, "train --save");
  }
  char *parent = strdup(dir), *slash = parent ? strrchr(parent, '/') : NULL;
  if (slash) *(slash == parent ? slash + 1 : slash) = 0;
  tpr_status rc = parent ? tpr_dir_sync(slash ? parent : ".") : TPR_FAIL(TPR_ERR_OOM, "out of memory");
  free(parent);
  if (!tpr_dir_remove_flat(tmp, our_file))  // the previous checkpoint held files that are not ours: keep them
    TPR_LOG_WRN("train --save: kept the previous %s's files as %s (they are not all ours)", dir, tmp);
  return rc;
}

// Test only: TPR_DEBUG_SAVE_PAUSE_MS=N makes every rank sleep N ms inside
// each save, after writing its optimizer state to DIR.tmp and before the
// model is gathered, so a test can kill a rank in the middle of a save.
static void debug_pause(void) {
  const char *v = getenv("TPR_DEBUG_SAVE_PAUSE_MS");
  long ms = v ? strtol(v, NULL, 10) : 0;
  if (ms <= 0) return;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) continue;
}

tpr_status tpr_train_checkpoint_save(tpr_train_state *t, tpr_comm_t world, const char *dir, int64_t step,
                                     const tpr_train_opts *o, const tpr_adamw_state *adam) {
  const tpr_session *s = tpr_train_state_session(t);
  bool root = tpr_session_mesh(s)->world_rank == 0;
  size_t n = strlen(dir) + 8;
  char *tmp = malloc(n);
  if (!tmp) return TPR_FAIL(TPR_ERR_OOM, "checkpoint");
  snprintf(tmp, n, "%s.tmp", dir);
  tpr_status rc = TPR_OK;
  if (root) {  // a leftover of a save that was killed is ours to clear
    if (is_checkpoint(tmp) || access(tmp, F_OK) == 0) tpr_dir_remove_flat(tmp, our_file);
    if (mkdir(tmp, 0755) != 0)
      rc = TPR_FAIL(TPR_ERR_IO, "cannot create %s: %s%s", tmp, strerror(errno),
                    errno == EEXIST ? " (a leftover of an interrupted save that holds files not of a checkpoint; "
                                      "remove it)" : "");
  }
  rc = tpr_comm_agree(world, rc);
  if (rc == TPR_OK) {
    tpr_status mine = write_moments(t, tmp, step, adam);
    debug_pause();
    rc = tpr_comm_agree(world, mine);
  }
  if (rc == TPR_OK) {
    char *model = tpr_path_join(tmp, "model.safetensors");
    tpr_status mine = model ? tpr_train_write_full(t, false, model) : TPR_FAIL(TPR_ERR_OOM, "path");
    if (mine == TPR_OK && root) mine = copy_model_files(s, tmp);
    if (mine == TPR_OK && root) mine = write_state(tmp, s, step, o);  // written last: it marks a whole checkpoint
    if (mine == TPR_OK && root) mine = tpr_dir_sync(tmp);
    if (mine == TPR_OK && root) mine = publish(tmp, dir);
    free(model);
    rc = tpr_comm_agree(world, mine);
  }
  if (rc != TPR_OK) {
    if (root) tpr_dir_remove_flat(tmp, our_file);
    // The failed save was agreed, so the group still answers: hold every rank
    // until rank 0 has cleared DIR.tmp, or the first rank to report the error
    // (MPI_Abort) kills rank 0 mid-cleanup and leaves the partial save behind.
    // (A broken group, TPR_ERR_COMM, is left to the watchdog; a plain
    // all-reduce keeps the error message as it is.)
    int64_t held = 0;
    if (rc != TPR_ERR_COMM) (void)tpr_comm_all_reduce(world, &held, &held, 1, TPR_I64, TPR_MAX);
  }
  free(tmp);
  return rc;
}

// dir's trainer_state.json parsed; *path (malloc'ed, for messages) set even
// on failure. The caller frees both.
static tpr_status load_state_json(const char *dir, char **path, cJSON **out) {
  *out = NULL;
  *path = tpr_path_join(dir, "trainer_state.json");
  uint8_t *bytes = NULL;
  size_t len = 0;
  tpr_status rc = *path ? tpr_file_read(*path, &bytes, &len) : TPR_FAIL(TPR_ERR_OOM, "path");
  if (rc == TPR_OK && !(*out = cJSON_ParseWithLength((const char *)bytes, len)))
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s is not valid JSON", *path);
  free(bytes);
  return rc;
}

static tpr_status read_state(const char *dir, const tpr_shard_plan *pl, int64_t *step, int *old_world) {
  char *path;
  cJSON *j;
  tpr_status rc = load_state_json(dir, &path, &j);
  const char *keys[] = {"step", "world", "tp", "dp", "ep", "etp"};
  double v[6] = {0};
  for (int i = 0; rc == TPR_OK && i < 6; i++) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, keys[i]);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0)
      rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" is missing or not a number", path, keys[i]);
    else
      v[i] = x->valuedouble;
  }
  // The moments are resharded over another dp degree; tp, ep and etp fix
  // each rank's layout, so they must stay.
  if (rc == TPR_OK && (v[2] != pl->tp || v[4] != pl->ep || v[5] != pl->etp || v[1] < 1 || v[1] > 1 << 20 ||
                       v[1] != v[2] * v[3]))
    rc = TPR_FAIL(TPR_ERR_INVALID_ARG,
                  "%s was saved on the mesh world %g tp %g dp %g ep %g etp %g; this run is world %d tp %d dp %d ep %d "
                  "etp %d (resume with the same tp, ep and etp, giving --ep and --etp explicitly where their defaults follow the world size; dp may change)", dir, v[1], v[2], v[3], v[4], v[5],
                  pl->world, pl->tp, pl->dp, pl->ep, pl->etp);
  if (rc == TPR_OK) *step = (int64_t)v[0], *old_world = (int)v[1];
  cJSON_Delete(j);
  free(path);
  return rc;
}

tpr_status tpr_train_checkpoint_data_order(const char *dir, uint64_t *seed, bool *sequential) {
  char *path;
  cJSON *j;
  tpr_status rc = load_state_json(dir, &path, &j);
  const cJSON *sd = cJSON_GetObjectItemCaseSensitive(j, "seed");
  const cJSON *ord = cJSON_GetObjectItemCaseSensitive(j, "data_order");
  // A seed is a uint64 written as a JSON number: exact up to 2^53.
  bool order_ok = cJSON_IsString(ord) && (!strcmp(ord->valuestring, "random") || !strcmp(ord->valuestring, "sequential"));
  if (rc == TPR_OK && (!cJSON_IsNumber(sd) || sd->valuedouble < 0 || sd->valuedouble > 9007199254740992.0 || !order_ok))
    rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: \"seed\" (a number) or \"data_order\" (random | sequential) is missing or wrong",
                  path);
  if (rc == TPR_OK) *seed = (uint64_t)sd->valuedouble, *sequential = !strcmp(ord->valuestring, "sequential");
  cJSON_Delete(j);
  free(path);
  return rc;
}

tpr_status tpr_train_checkpoint_load(tpr_train_state *t, const char *dir, tpr_adamw_state *adam, int64_t *step) {
  const tpr_session *s = tpr_train_state_session(t);
  int old_world = 0;
  TPR_CHECK(read_state(dir, tpr_session_plan(s), step, &old_world));
  return tpr__train_load_moments(t, dir, old_world, *step, adam);
}
