// A session opened and closed: the config, the mesh and its communicators,
// the plan, the weights (session_weights.c), the KV pool (session_pool.c)
// and decode's program (session_programs.c); the accessors.
#include "engine/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/session_impl.h"
#include "runtime/host_mem.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const tpr_model_config *tpr_session_config(const tpr_session *s) { return &s->cfg; }
const tpr_session_info *tpr_session_stats(const tpr_session *s) { return &s->stats; }
const tpr_shard_plan *tpr_session_plan(const tpr_session *s) { return &s->plan; }
const tpr_mesh *tpr_session_mesh(const tpr_session *s) { return &s->mesh; }
const char *tpr_session_model_dir(const tpr_session *s) { return s->o.model_dir; }
int64_t tpr_session_max_seq(const tpr_session *s) { return s->o.max_seq; }

const tpr_session_opts *tpr__session_opts(const tpr_session *s) { return &s->o; }
tpr_backend *tpr__session_backend(const tpr_session *s) { return s->be; }
const tpr_family *tpr__session_family(const tpr_session *s) { return s->family; }
tpr_comm_t tpr__session_world(const tpr_session *s) { return s->world; }
tpr_comm_t tpr__session_axis(const tpr_session *s, tpr_mesh_axis axis) { return s->comms.axis[axis]; }
const tpr_exec_collectives *tpr__session_collectives(const tpr_session *s) { return &s->hook; }

// The ranks of one node share its memory: `bytes` (this rank's ask) times
// the node's ranks against MemAvailable, every rank's figures read before
// any allocates (collective: the largest ask and the smallest MemAvailable,
// so every rank reaches the same verdict).
tpr_status tpr__session_check_node_memory(tpr_session *s, uint64_t bytes, const char *what) {
  uint64_t avail = tpr_host_mem_available();
  int64_t v[2] = {avail > INT64_MAX ? INT64_MAX : (int64_t)avail, bytes > INT64_MAX ? -INT64_MAX : -(int64_t)bytes};
  TPR_CHECK(tpr_comm_all_reduce(s->world, v, v, 2, TPR_I64, TPR_MIN));
  return tpr_host_mem_check_node((uint64_t)-v[1], tpr_local_ranks_from_env(), (uint64_t)v[0], what);
}

// Fills in the mesh sizes left at 0 (see tpr_session_opts).
static tpr_status resolve_mesh(tpr_session_opts *o, int world) {
  if (o->tp < 0 || o->dp < 0 || o->ep < 0 || o->etp < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "mesh sizes must be positive (tp %d, dp %d, ep %d, etp %d)", o->tp, o->dp,
                    o->ep, o->etp);
  if (!o->dp) o->dp = o->tp && world % o->tp == 0 ? world / o->tp : 1;
  if (!o->tp) o->tp = world % o->dp == 0 ? world / o->dp : 0;
  if (o->tp * o->dp != world)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--tp %d x --dp %d must equal the world of %d ranks (mpirun -np)", o->tp,
                    o->dp, world);
  if (!o->ep) o->ep = 1;
  if (!o->etp) o->etp = world % o->ep == 0 ? world / o->ep : 0;
  if (o->etp < 1 || world % (o->ep * o->etp))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--ep %d x --etp %d must divide the world of %d ranks", o->ep, o->etp, world);
  return TPR_OK;
}

static tpr_status open_session(tpr_session *s) {
  int world = tpr_comm_size(s->world), rank = tpr_comm_rank(s->world);
  tpr_session_opts *o = &s->o;
  TPR_CHECK(tpr_model_config_load(o->model_dir, &s->cfg));
  TPR_CHECK(resolve_mesh(o, world));
  TPR_CHECK(tpr_shard_plan_build(&s->cfg, o->tp, o->ep, o->etp, o->dp, TPR_F32, &s->plan));
  TPR_CHECK(tpr_moe_opts_check(&o->moe, &s->plan));
  TPR_CHECK(tpr_mesh_init(world, rank, o->tp, o->ep, o->etp, &s->mesh));
  TPR_CHECK(tpr_mesh_comms_init(s->world, &s->mesh, &s->comms));
  s->hook = tpr_mesh_comms_exec_hook(&s->comms);
  if (o->force_tp_rank >= o->tp)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--debug-force-tp-rank %d: the tp group has ranks 0..%d", o->force_tp_rank,
                    o->tp - 1);
  tpr_mesh claimed = s->mesh;
  if (o->force_tp_rank >= 0) claimed.tp_rank = o->force_tp_rank;  // negative control
  TPR_CHECK(tpr_mesh_rank_tensor(&claimed, s->be, &s->rank));
  if (o->moe_stats && s->cfg.num_experts == 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--moe-stats: %s is a dense model (no experts, nothing is routed)",
                    tpr_model_family_name(s->cfg.family));
  if (o->moe_stats)
    TPR_CHECK(tpr_moe_stats_init(&s->moe_stats, s->cfg.num_layers, s->cfg.num_experts, s->plan.ep));
  TPR_CHECK(tpr_family_find(s->cfg.family, &s->family));
  if (o->dense_sparse_layers && s->cfg.family != TPR_FAMILY_MINICPM_SALA)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--dense-sparse-layers: only minicpm_sala has sparse attention layers to "
                    "run dense (this is %s)", tpr_model_family_name(s->cfg.family));
  if (s->family->constants) TPR_CHECK(s->family->constants(&s->plan, s->be, &s->consts));
  TPR_CHECK(tpr_loader_open(s->o.model_dir, &s->plan, s->mesh.world_rank, &s->loader));
  s->kind_dtype = malloc((size_t)s->plan.n_tensors * sizeof *s->kind_dtype);
  s->kind_block = calloc((size_t)s->plan.n_tensors, sizeof *s->kind_block);
  if (!s->kind_dtype || !s->kind_block) return TPR_FAIL(TPR_ERR_OOM, "session: weight dtypes");
  if (o->training) return TPR_OK;
  s->pool.batch = o->max_batch > 0 ? o->max_batch : 1;
  s->pool.block_size = o->block_size > 0 ? o->block_size : 16;
  s->pool.max_blocks = o->max_seq / s->pool.block_size + (o->max_seq % s->pool.block_size != 0);  // no overflow near INT64_MAX
  return TPR_OK;
}


// --activation-dtype bf16 on the session's backend, or why it cannot apply.
static tpr_status set_bf16_activations(tpr_session *s, bool on) {
  if (on && s->o.training)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "bf16 activations: training multiplies f32 weights in f32 (inference only)");
  if (on && strcmp(tpr_backend_name(s->be), "cpu") != 0)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "bf16 activations: the cpu backend only (this session runs on %s)",
                    tpr_backend_name(s->be));
  if (on && s->stats.matrix_dtype != TPR_BF16)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "bf16 activations apply to bf16 weight matrices; these are held in %s "
                    "(give --weight-dtype bf16, or auto with a bf16 checkpoint)", tpr_dtype_name(s->stats.matrix_dtype));
  TPR_CHECK(tpr_backend_cpu_set_bf16_activations(s->be, on));
  s->stats.bf16_activations = on;
  return TPR_OK;
}

tpr_status tpr_session_open(const tpr_session_opts *o, tpr_comm_t world, tpr_backend *be,
                               tpr_session **out) {
  *out = NULL;
  if (!o->model_dir) return TPR_FAIL(TPR_ERR_INVALID_ARG, "session: no model directory");
  if (!o->training && (o->max_seq < 1 || o->max_batch < 0 || o->block_size < 0 || o->kv_cache_bytes < 0 ||
                       !(o->kv_cache_fraction >= 0 && o->kv_cache_fraction < 1)))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "session: max_seq %lld, max_batch %lld, block_size %lld, kv_cache_bytes %lld, "
                    "kv_cache_fraction %g (need max_seq >= 1, the others >= 0, a fraction below 1)",
                    (long long)o->max_seq, (long long)o->max_batch, (long long)o->block_size,
                    (long long)o->kv_cache_bytes, o->kv_cache_fraction);
  tpr_session *s = calloc(1, sizeof *s);
  if (!s) return TPR_FAIL(TPR_ERR_OOM, "session");
  double t0 = now_s();
  s->o = *o;
  s->be = be;
  s->world = world;
  step_program *decode;
  tpr_status rc = tpr_comm_agree(world, open_session(s));
  if (rc == TPR_OK) rc = tpr__session_load_weights(s);  // collective inside, agreed
  if (rc == TPR_OK && o->bf16_activations) rc = tpr_comm_agree(world, set_bf16_activations(s, true));
  if (rc == TPR_OK && !o->training) rc = tpr_comm_agree(world, tpr__session_alloc_pool(s));  // collective inside
  // Decode's program first: it is never evicted. Building it is collective
  // (hash check, or the broadcast of rank 0's bytes).
  if (rc == TPR_OK && !o->training) rc = tpr_comm_agree(world, tpr__session_program_for(s, 1, 1, 0, &decode));
  if (rc != TPR_OK) {
    tpr_session_close(s);
    return rc;
  }
  s->stats.load_s = now_s() - t0;
  *out = s;
  return TPR_OK;
}

void tpr_session_close(tpr_session *s) {
  if (!s) return;
  if (s->stats.bf16_activations) (void)set_bf16_activations(s, false);  // the backend outlives the session
  tpr__session_free_programs(s);
  int64_t layers = s->cfg.num_layers;
  for (int64_t i = 0; s->item_tensors && i < s->weights.n; i++) tpr_tensor_free(s->item_tensors[i]);
  for (int64_t i = 0; s->item_scales && i < s->weights.n; i++) tpr_tensor_free(s->item_scales[i]);
  for (int64_t i = 0; i < 2 * layers; i++) {
    if (s->experts) tpr_tensor_free(s->experts[i]), tpr_tensor_free(s->experts[2 * layers + i]);
    if (s->pools) tpr_tensor_free(s->pools[i]);
  }
  for (int64_t L = 0; s->states && L < layers; L++) tpr_tensor_free(s->states[L]);
  for (int64_t L = 0; s->ck_pools && L < layers; L++) tpr_tensor_free(s->ck_pools[L]);
  free(s->states), free(s->ck_pools);
  free(s->item_tensors), free(s->item_scales), free(s->kind_dtype), free(s->kind_block), free(s->experts), free(s->pools), free(s->logits_t), free(s->gates_host), free(s->host_in);
  tpr_moe_stats_free(&s->moe_stats);
  tpr_family_consts_free(&s->consts);
  tpr_tensor_free(s->rank);
  tpr_rank_weights_free(&s->weights);
  tpr_loader_close(s->loader);
  tpr_mesh_comms_free(&s->comms);
  tpr_shard_plan_free(&s->plan);
  free(s);
}
