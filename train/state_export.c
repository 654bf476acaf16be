// A training state's tensors reassembled on world rank 0 from every rank's
// slices (FSDP chunks gathered back first), under the checkpoint's names:
// what a save writes, and the full gradients a test compares.
#include <stdlib.h>

#include "shard/unshard.h"
#include "train/state_impl.h"

// One piece gathered from every rank; on rank 0 each checkpoint tensor it
// covers (one, or one per ep group for experts) is assembled and handed on.
static tpr_status export_piece(tpr_train_state *t, const piece *pc, const float *mine, tpr_train_export_fn fn,
                               void *ctx) {
  const tpr_shard_plan *pl = t->plan;
  const tpr_shard_tensor *k = &pl->tensors[pc->kind];
  int64_t n = tpr__kind_numel(k), world = pl->world;
  TPR_CHECK(tpr_comm_all_gather(t->world, mine, t->gather, (size_t)n, TPR_F32));
  if (t->mesh->world_rank != 0) return TPR_OK;
  int64_t gn = k->ndim == 2 ? k->global_shape[0] * k->global_shape[1] : k->global_shape[0];
  int groups = pc->local_expert >= 0 ? pl->ep : 1;
  float *hf = calloc((size_t)(groups * gn), sizeof *hf);
  if (!hf) return TPR_FAIL(TPR_ERR_OOM, "export %s", k->name);
  tpr_status rc = TPR_OK;
  for (int64_t r = 0; rc == TPR_OK && r < world; r++) {
    tpr_mesh m;
    rc = tpr_mesh_init((int)world, (int)r, pl->tp, pl->ep, pl->etp, &m);
    int grp = groups > 1 ? m.ep_rank : 0;
    if (rc == TPR_OK) tpr_unshard_place(pl, k, &m, t->gather + r * n, hf + grp * gn);
  }
  for (int g = 0; rc == TPR_OK && g < groups; g++) {
    char name[TPR_LOAD_NAME_MAX];
    int64_t expert = pc->local_expert >= 0 ? g * pl->experts_per_rank + pc->local_expert : -1;
    rc = tpr_loader_tensor_name(k->name, pc->layer, expert, name);
    if (rc == TPR_OK) rc = fn(ctx, name, k->ndim, k->global_shape, hf + g * gn);
  }
  free(hf);
  return rc;
}

tpr_status tpr_train_export(tpr_train_state *t, bool grads, tpr_train_export_fn fn, void *ctx) {
  int n = grads ? t->n_trained : t->n_params;
  float *whole = NULL;  // an FSDP param gathered back into its rank layout
  tpr_status rc = TPR_OK;
  for (int i = 0; rc == TPR_OK && i < n; i++) {
    const train_param *p = &t->params[i];
    const float *base = grads ? p->pub.grad : p->pub.data;
    if (p->pub.shards > 1) {
      free(whole);
      whole = malloc((size_t)(p->pub.shards * p->pub.numel) * sizeof *whole);
      rc = whole ? tpr__train_fsdp_unshard(t, p, grads, whole) : TPR_FAIL(TPR_ERR_OOM, "export %s", p->name);
      base = whole;
    }
    for (int j = 0; rc == TPR_OK && j < p->n_pieces; j++)
      rc = export_piece(t, &p->pieces[j], base + p->pieces[j].offset, fn, ctx);
  }
  free(whole);
  return rc;
}
