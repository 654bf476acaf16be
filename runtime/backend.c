// Backend-independent wrappers over the vtable: NULL entries become clear
// TPR_ERR_UNSUPPORTED errors instead of crashes.
#include "backend.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *tpr_backend_name(const tpr_backend *b) { return b && b->vt ? b->vt->name : "(none)"; }

void tpr_backend_free(tpr_backend *b) {
  if (!b) return;
  if (b->vt && b->vt->destroy) b->vt->destroy(b->ctx);
  free(b);
}

tpr_status tpr_backend_alloc(tpr_backend *b, size_t bytes, void **ptr) {
  *ptr = NULL;
  if (!b->vt->alloc) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backend %s cannot allocate", b->vt->name);
  return b->vt->alloc(b->ctx, bytes, ptr);
}

void tpr_backend_release(tpr_backend *b, void *ptr) {
  if (ptr && b->vt->free) b->vt->free(b->ctx, ptr);
}

tpr_status tpr_backend_sync(tpr_backend *b) {
  return b->vt->sync ? b->vt->sync(b->ctx) : TPR_OK;
}

static tpr_status check_whole_contiguous(const tpr_tensor *t, size_t nbytes, const char *what) {
  if (!t) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: NULL tensor", what);
  if (!tpr_tensor_is_contiguous(t))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: tensor is not contiguous (cast it into a contiguous one first)", what);
  if (nbytes != tpr_tensor_nbytes(t))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: host buffer has %zu bytes, tensor has %zu", what, nbytes,
                    tpr_tensor_nbytes(t));
  return TPR_OK;
}

tpr_status tpr_tensor_to_host(const tpr_tensor *t, void *dst, size_t nbytes) {
  TPR_CHECK(check_whole_contiguous(t, nbytes, "tpr_tensor_to_host"));
  if (nbytes == 0) return TPR_OK;
  tpr_backend *b = tpr_tensor_backend(t);
  if (!b->vt->copy_to_host) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backend %s: copy_to_host", b->vt->name);
  return b->vt->copy_to_host(b->ctx, dst, tpr_tensor_data(t), nbytes);
}

tpr_status tpr_tensor_from_host(tpr_tensor *t, const void *src, size_t nbytes) {
  TPR_CHECK(check_whole_contiguous(t, nbytes, "tpr_tensor_from_host"));
  if (nbytes == 0) return TPR_OK;
  tpr_backend *b = tpr_tensor_backend(t);
  if (!b->vt->copy_from_host) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backend %s: copy_from_host", b->vt->name);
  return b->vt->copy_from_host(b->ctx, tpr_tensor_data(t), src, nbytes);
}

tpr_status tpr_tensor_fill_zero(tpr_tensor *t) {
  TPR_CHECK(check_whole_contiguous(t, tpr_tensor_nbytes(t), "tpr_tensor_fill_zero"));
  tpr_backend *b = tpr_tensor_backend(t);
  if (!b->vt->memset) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backend %s: memset", b->vt->name);
  return b->vt->memset(b->ctx, tpr_tensor_data(t), 0, tpr_tensor_nbytes(t));
}

// Slurm's per-node task counts, "2(x3),1" = 2,2,2,1 (srun's
// SLURM_STEP_TASKS_PER_NODE, sbatch's SLURM_TASKS_PER_NODE): the count of node
// `node`, 0 when the list is malformed or shorter.
static int slurm_tasks_on_node(const char *list, long node) {
  const char *p = list;
  while (node >= 0 && *p) {
    char *end;
    long n = strtol(p, &end, 10), rep = 1;
    if (end == p || n <= 0) return 0;
    p = end;
    if (*p == '(') {
      if (p[1] != 'x') return 0;
      rep = strtol(p + 2, &end, 10);
      if (end == p + 2 || rep <= 0 || *end != ')') return 0;
      p = end + 1;
    }
    if (node < rep) return n > INT32_MAX ? 0 : (int)n;
    node -= rep;
    if (*p == ',') p++;
    else if (*p) return 0;
  }
  return 0;
}

static int positive_env(const char *name) {
  const char *s = getenv(name);
  return s && atoi(s) > 0 ? atoi(s) : 0;
}

int tpr_local_ranks_from_env(void) {
  // mpirun's own count first: mpirun inside an allocation inherits the
  // batch step's SLURM_* variables, which describe the batch step.
  int n = positive_env("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!n) n = positive_env("MPI_LOCALNRANKS");
  if (n) return n;
  // srun --mpi=pmix starts the ranks itself: no OMPI_COMM_WORLD_* before
  // MPI_Init. The step's per-node list, indexed by this node's SLURM_NODEID,
  // is this step's layout; SLURM_NTASKS_PER_NODE may be the allocation's
  // (sbatch --ntasks-per-node 2, then srun with 1 per node).
  const char *list = getenv("SLURM_STEP_TASKS_PER_NODE"), *node = getenv("SLURM_NODEID");
  if (list && node) {
    char *end;
    long id = strtol(node, &end, 10);
    n = (end != node && !*end && id >= 0) ? slurm_tasks_on_node(list, id) : 0;
    if (n > 0) return n;
  }
  n = positive_env("SLURM_NTASKS_PER_NODE");
  return n ? n : 1;
}

int tpr_cpus_per_rank_from_env(void) {
  // Slurm's --cpus-per-task: the CPUs the launcher gave this rank.
  const char *s = getenv("SLURM_CPUS_PER_TASK");
  if (!s) return 0;
  char *end;
  long n = strtol(s, &end, 10);
  return (end != s && !*end && n > 0 && n <= 1 << 16) ? (int)n : 0;
}
