// Internals of tpr_program shared by program.c, plan.c, exec.c, serialize.c.
#ifndef TPR_PROGRAM_IMPL_H
#define TPR_PROGRAM_IMPL_H

#include "program.h"

typedef struct tpr_value_rec {
  char *name;             // required for inputs/params/outputs, else NULL
  tpr_value_kind kind;
  bool is_output;
  tpr_tensor desc;        // dtype, shape, strides, offset (in base's elements); no storage
  int32_t producer;       // node index, -1 for inputs/params
  tpr_value_id base;      // value whose memory this one lives in (itself unless a view)
  bool remat;             // recomputed for the backward instead of kept alive (FSDP's
                          // reshard_after_forward; see tpr_pb_param_gather)
} tpr_value_rec;

typedef struct tpr_node {
  tpr_op_kind op;
  int n_in;
  tpr_value_id in[TPR_OP_MAX_INPUTS];
  tpr_op_attrs attrs;
  tpr_value_id out;
} tpr_node;

struct tpr_program {
  tpr_value_rec *values;
  int n_values, cap_values;
  tpr_node *nodes;
  int n_nodes, cap_nodes;
};

// Ops whose output is recomputed in the backward when their first input is
// (remat): views, index_select, cast -- cheap next to keeping the value.
bool tpr__op_cheap(tpr_op_kind op);

// Prefetch (tpr_pb_param_gather): issue[n] is the node at which node n's
// collective starts -- n itself, except for a prefetched param_gather of a
// param, which starts at the first node of the previous group of gathers
// (groups: consecutive param_gather nodes, in node order, with the same
// group attribute). Non-decreasing along the gathers in node order. The
// planner keeps the output's bytes from issue[n]; the exec starts it there.
void tpr__program_gather_issue(const tpr_program *p, int *issue);

// Finds a value by name; -1 if none.
tpr_value_id tpr__program_find(const tpr_program *p, const char *name);

#endif
