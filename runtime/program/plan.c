// The memory planner: greedy by size (largest first) into the lowest arena
// offset that no time-overlapping buffer occupies -- the heuristic TFLite's
// arena planner and ggml-alloc use. It is deterministic: ties break by id.
#include <stdlib.h>
#include <string.h>

#include "program_impl.h"

typedef struct buffer {
  tpr_value_id id;
  size_t size;
  int first, last;  // inclusive node interval during which the bytes are live
  size_t offset;
} buffer;

static size_t align_up(size_t n) { return (n + TPR_PLAN_ALIGN - 1) / TPR_PLAN_ALIGN * TPR_PLAN_ALIGN; }

static int by_size_desc(const void *a, const void *b) {
  const buffer *x = a, *y = b;
  if (x->size != y->size) return x->size < y->size ? 1 : -1;
  return x->id - y->id;
}

static int by_offset(const void *a, const void *b) {
  const buffer *const *x = a, *const *y = b;
  if ((*x)->offset != (*y)->offset) return (*x)->offset < (*y)->offset ? -1 : 1;
  return (*x)->id - (*y)->id;
}

// Lifetimes: a buffer is live from its producer to the last node reading it
// or any view of it; outputs (or views of them) live to the end.
static void compute_lifetimes(const tpr_program *p, int *last_use) {
  for (int v = 0; v < p->n_values; v++) last_use[v] = p->values[v].producer;
  for (int n = 0; n < p->n_nodes; n++)
    for (int i = 0; i < p->nodes[n].n_in; i++) {
      tpr_value_id b = p->values[p->nodes[n].in[i]].base;
      if (last_use[b] < n) last_use[b] = n;
    }
  for (int v = 0; v < p->n_values; v++)
    if (p->values[v].is_output) last_use[p->values[v].base] = p->n_nodes;
}

static size_t place(buffer *b, buffer **placed, int n_placed, buffer **scratch) {
  int n = 0;
  for (int i = 0; i < n_placed; i++)
    if (placed[i]->first <= b->last && b->first <= placed[i]->last) scratch[n++] = placed[i];
  qsort(scratch, (size_t)n, sizeof *scratch, by_offset);
  size_t offset = 0;
  for (int i = 0; i < n; i++) {
    if (scratch[i]->offset >= offset + b->size) break;  // the gap before it fits
    size_t end = scratch[i]->offset + scratch[i]->size;
    if (end > offset) offset = end;
  }
  return offset;
}

tpr_status tpr_program_plan_memory(const tpr_program *p, tpr_memory_plan *plan, size_t *offsets) {
  memset(plan, 0, sizeof *plan);
  int nv = p->n_values;
  int *last_use = malloc((size_t)(nv ? nv : 1) * sizeof *last_use);
  buffer *bufs = malloc((size_t)(nv ? nv : 1) * sizeof *bufs);
  buffer **placed = malloc((size_t)(nv ? nv : 1) * sizeof *placed);
  buffer **scratch = malloc((size_t)(nv ? nv : 1) * sizeof *scratch);
  if (!last_use || !bufs || !placed || !scratch) {
    free(last_use), free(bufs), free(placed), free(scratch);
    return TPR_FAIL(TPR_ERR_OOM, "memory planner");
  }
  compute_lifetimes(p, last_use);
  int *issue = malloc((size_t)(p->n_nodes ? p->n_nodes : 1) * sizeof *issue);
  if (!issue) {
    free(last_use), free(bufs), free(placed), free(scratch);
    return TPR_FAIL(TPR_ERR_OOM, "memory planner");
  }
  tpr__program_gather_issue(p, issue);
  int nb = 0;
  for (int v = 0; v < nv; v++) {
    if (offsets) offsets[v] = TPR_PLAN_NONE;
    const tpr_value_rec *r = &p->values[v];
    if (r->kind != TPR_VALUE_NODE || r->base != v) continue;
    // A prefetched gather owns its bytes from the node that starts it.
    bufs[nb++] = (buffer){.id = v, .size = align_up(tpr_tensor_nbytes(&r->desc)), .first = issue[r->producer],
                          .last = last_use[v]};
  }
  qsort(bufs, (size_t)nb, sizeof *bufs, by_size_desc);
  for (int i = 0; i < nb; i++) {
    bufs[i].offset = place(&bufs[i], placed, i, scratch);
    placed[i] = &bufs[i];
    if (bufs[i].offset + bufs[i].size > plan->arena_bytes) plan->arena_bytes = bufs[i].offset + bufs[i].size;
    plan->naive_bytes += bufs[i].size;
    if (offsets) offsets[bufs[i].id] = bufs[i].offset;
  }
  plan->n_buffers = nb;
  free(issue);
  free(last_use), free(bufs), free(placed), free(scratch);
  return TPR_OK;
}
