// Human-readable listing of a program: one line per value, as the CLI's
// `tpr program` prints it and as one reads it when debugging a model builder.
#include <stdio.h>

#include "program_impl.h"

static const char *kind_name(const tpr_value_rec *r) {
  if (r->kind == TPR_VALUE_INPUT) return "input";
  if (r->kind == TPR_VALUE_PARAM) return "param";
  return r->is_output ? "output" : "node";
}

void tpr_program_dump(const tpr_program *p, FILE *f) {
  char desc[160];
  for (int v = 0; v < p->n_values; v++) {
    const tpr_value_rec *r = &p->values[v];
    fprintf(f, "%%%-4d %-6s %-22s", v, kind_name(r), tpr_tensor_describe(&r->desc, desc, sizeof desc));
    if (r->producer >= 0) {
      const tpr_node *n = &p->nodes[r->producer];
      fprintf(f, " = %s(", tpr_op_name(n->op));
      for (int i = 0; i < n->n_in; i++) fprintf(f, i ? ", %%%d" : "%%%d", n->in[i]);
      for (int i = 0; i < n->attrs.n_i; i++) fprintf(f, "%s%lld", i || n->n_in ? ", " : "", (long long)n->attrs.i[i]);
      for (int i = 0; i < n->attrs.n_f; i++) fprintf(f, ", %g", (double)n->attrs.f[i]);
      fprintf(f, ")%s", tpr_op_is_view(n->op) ? "  [view]" : "");
    }
    if (r->name) fprintf(f, "  '%s'", r->name);
    fputc('\n', f);
  }
}
