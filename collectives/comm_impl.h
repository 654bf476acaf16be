// Internals of tpr_comm shared by the front (comm.c), the agreement check
// (comm_check.c) and the watchdog (watchdog.c).
#ifndef TPR_COMM_IMPL_H
#define TPR_COMM_IMPL_H

#include <stdint.h>

#include "tpr_comm.h"

// What a rank is doing; values travel between ranks in check mode and in the
// watchdog's queries, so append only.
typedef enum tpr__coll_op {
  TPR__OP_NONE = 0,
  TPR__OP_ALL_REDUCE,
  TPR__OP_ALL_GATHER,
  TPR__OP_REDUCE_SCATTER,
  TPR__OP_ALL_TO_ALL,
  TPR__OP_ALL_TO_ALLV,
  TPR__OP_BROADCAST,
  TPR__OP_BARRIER,
  TPR__OP_SEND,
  TPR__OP_RECV,
  TPR__OP_SPLIT,
  TPR__OP_IALL_GATHER,
  TPR__OP_IREDUCE_SCATTER,
  TPR__OP_IBROADCAST,
  TPR__OP_COUNT
} tpr__coll_op;

const char *tpr__coll_op_name(tpr__coll_op op);

struct tpr_comm_s {
  const tpr_comm_vtable *vt;
  void *ctx;
  int rank, size;
  int *world_ranks;  // (size) world rank of each member
  char name[24];     // "world", "tp", ...
  struct tpr_comm_s *host;  // same ranks over host buffers; NULL: this one
  bool check;        // agree on every collective before running it
  uint64_t seq;      // collectives entered on this comm (p2p not counted)
};

// One call as the agreement check compares it.
typedef struct tpr__call {
  tpr__coll_op op;
  uint64_t seq;
  size_t count;
  tpr_dtype dtype;
  int red_op;  // -1 when the op has none
  int root;    // -1 when the op has none
} tpr__call;

// Check mode: all ranks of c exchange their calls (over host buffers) and
// fail together, naming the ranks that disagree. For all_to_allv it also
// checks that recv_counts match what each peer sends.
tpr_status tpr__comm_agree(tpr_comm_t c, const tpr__call *call, const size_t *send_counts,
                           const size_t *recv_counts);

// "tp (world ranks 0,1,2,3)" into buf.
const char *tpr__comm_describe(tpr_comm_t c, char *buf, size_t cap);

// The watchdog's view of the current call (cheap no-ops when it is off).
void tpr__watch_enter(tpr_comm_t c, tpr__coll_op op, uint64_t seq, size_t count, tpr_dtype dt, int peer);
void tpr__watch_leave(void);

#endif
