#include "launch/model_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/weight_dtype.h"

tpr_status tpr_cli_token_list(const char *flag, const char *text, int32_t **ids, int64_t *n) {
  *ids = NULL;
  *n = 0;
  if (!text || !*text) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: empty token list", flag);
  int64_t cap = 1;
  for (const char *p = text; *p; p++) cap += *p == ',';
  int32_t *out = malloc((size_t)cap * sizeof *out);
  if (!out) return TPR_FAIL(TPR_ERR_OOM, "%s: token list", flag);
  const char *p = text;
  for (int64_t i = 0; i < cap; i++) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
      free(out);
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: item %lld of '%s' is not a token id (a number in [0, 2^31))", flag,
                      (long long)i + 1, text);
    }
    out[i] = (int32_t)v;
    p = end + 1;
  }
  *ids = out;
  *n = cap;
  return TPR_OK;
}

tpr_status tpr_cli_session_opts(const tpr_world *w, const char *model, const tpr_model_mesh *m, int64_t max_seq,
                                const tpr_model_debug *d, tpr_session_opts *out) {
  const int64_t sizes[4] = {m->tp, m->dp, m->ep, m->etp};
  const char *names[4] = {"--tp", "--dp", "--ep", "--etp"};
  for (int i = 0; i < 4; i++)
    if (sizes[i] < 0 || sizes[i] > w->size)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s %lld: a mesh size must be in [1, %d], the world of %d ranks", names[i],
                      (long long)sizes[i], w->size, w->size);
  tpr_moe_opts moe = {.capacity_factor = m->capacity_factor,
                      .reroute_dropped = m->reroute_dropped,
                      .seed = (uint64_t)m->reroute_seed};
  if (!tpr_moe_dispatch_parse(m->moe_dispatch, &moe.dispatch))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--moe-dispatch %s: expected auto, alltoall or allreduce", m->moe_dispatch);
  tpr_dtype weight_dtype;
  TPR_CHECK(tpr_weight_dtype_parse(m->weight_dtype, &weight_dtype));
  const char *act = m->activation_dtype ? m->activation_dtype : "f32";
  if (strcmp(act, "f32") != 0 && strcmp(act, "bf16") != 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--activation-dtype %s: expected f32 or bf16", act);
  *out = (tpr_session_opts){.model_dir = model,
                           .max_seq = max_seq,
                           .tp = (int)m->tp,
                           .dp = (int)m->dp,
                           .ep = (int)m->ep,
                           .etp = (int)m->etp,
                           .moe = moe,
                           .weight_dtype = weight_dtype,
                           .bf16_activations = strcmp(act, "bf16") == 0,
                           .moe_stats = m->moe_stats,
                           .broadcast_program = d->broadcast_program,
                           .per_rank_qk_norm = d->per_rank_qk_norm,
                           .force_tp_rank = (int)d->force_tp_rank,
                           .dense_sparse_layers = m->dense_sparse_layers};
  return TPR_OK;
}

// What a family leaves out of the checkpoint, said once on rank 0's stderr.
static tpr_status family_note(const tpr_world *w, tpr_status rc, tpr_session *const *s) {
  if (rc != TPR_OK || w->rank != 0) return rc;
  tpr_model_family f = tpr_session_config(*s)->family;
  if (f == TPR_FAMILY_QWEN3_VL_MOE || f == TPR_FAMILY_QWEN2_VL)
    fprintf(stderr, "tpr: note: %s runs its text decoder only: vision-tower weights are not loaded, image "
                    "and video tokens are plain tokens; give their MRoPE positions with --positions-3d (forward)\n",
            tpr_model_family_name(f));
  return rc;
}

tpr_status tpr_cli_open_model(tpr_world *w, const char *model, const tpr_model_mesh *m, int64_t max_seq,
                              const tpr_model_debug *d, tpr_session **out) {
  tpr_session_opts o;
  TPR_CHECK(tpr_cli_session_opts(w, model, m, max_seq, d, &o));
  return family_note(w, tpr_session_open(&o, w->host, w->be, out), out);  // reads *out after the open
}

void tpr_cli_print_kv_pool(const tpr_session *s) {
  tpr_session_pool pool = tpr_session_pool_info(s);
  printf("KV pool: %lld blocks x %lld tokens = %lld tokens per replica, %.1f MiB per rank; max batch %lld",
         (long long)pool.blocks, (long long)pool.block_size, (long long)(pool.blocks * pool.block_size),
         (double)pool.bytes / (1 << 20), (long long)pool.batch);
  // What one sequence costs on a rank: KV rows grow with its length; a
  // hybrid model's recurrent state (its linear layers) is one slot whatever
  // the length. One line: scripts read the text after it.
  const double kv_token = (double)pool.bytes / (double)(pool.blocks * pool.block_size);
  const int64_t max_seq = tpr_session_max_seq(s);
  printf("; per sequence per rank: KV %.1f KiB per token (%.1f KiB at %lld tokens)", kv_token / 1024,
         kv_token * (double)max_seq / 1024, (long long)max_seq);
  if (pool.state_slots)
    printf(", recurrent state %.1f KiB (state slots: %lld, %.1f MiB; no prefix caching)",
           (double)pool.state_slot_bytes / 1024, (long long)pool.state_slots, (double)pool.state_bytes / (1 << 20));
  printf("\n");
}

tpr_status tpr_cli_open_engine_model(tpr_world *w, const char *model, const tpr_model_mesh *m, int64_t max_seq,
                                     const tpr_model_engine *g, const tpr_model_debug *d, tpr_session **out) {
  tpr_session_opts o;
  TPR_CHECK(tpr_cli_session_opts(w, model, m, max_seq, d, &o));
  const int64_t sizes[4] = {g->max_batch, g->max_tokens_per_step, g->block_size, g->kv_cache_bytes};
  const char *names[4] = {"--max-batch", "--max-tokens-per-step", "--block-size", "--kv-cache-bytes"};
  for (int i = 0; i < 4; i++)
    if (sizes[i] < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s %lld must be positive", names[i], (long long)sizes[i]);
  if (!(g->kv_cache_fraction >= 0 && g->kv_cache_fraction < 1))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--kv-cache-fraction %g must be in (0, 1)", g->kv_cache_fraction);
  o.max_batch = g->max_batch;
  o.block_size = g->block_size;
  o.kv_cache_bytes = g->kv_cache_bytes;
  o.kv_cache_fraction = g->kv_cache_fraction;
  return family_note(w, tpr_session_open(&o, w->host, w->be, out), out);  // reads *out after the open
}

tpr_status tpr_cli_speculative(const tpr_model_engine *g, tpr_spec *out) {
  *out = (tpr_spec){0};
  return g->speculative ? tpr_spec_parse(g->speculative, out) : TPR_OK;
}
