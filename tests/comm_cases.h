// Collective test cases with EXACT expected results, for tests under mpirun.
// All ranks share one seed, so every rank computes every rank's input from
// (seed, case, rank, index) and checks what it received element by element;
// guard bytes after every output must survive. Each case_* runs one call on
// `comm` and counts failed checks in `fails` instead of stopping: every rank
// keeps making the same collective calls, and agree() at the end of a test
// fails all ranks together if any rank failed (a rank that returned early
// would leave the others waiting in a collective).
//
// Buffers come from tb_alloc: host memory, or fake device memory that is
// PROT_NONE while a collective runs. Only the staging hooks (fake_hooks, for
// tpr__stage_set_hooks) open it, so MPI touching it directly faults, and a
// right result proves the staging.
#ifndef TPR_TEST_COMM_CASES_H
#define TPR_TEST_COMM_CASES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "collectives/comm_stage.h"
#include "collectives/tpr_comm.h"
#include "test_util.h"

#define GUARD 64
#define MI ((size_t)1 << 20)

extern tpr_comm_t comm;      // the communicator under test
extern int R, N;             // its rank and size
extern uint64_t seed;        // the same on every rank
extern uint64_t case_no;     // salt of the next case (every rank counts alike)
extern int fails;            // this rank's failed checks in the running test
extern int fake_copies;      // copies made by fake_hooks
extern const tpr_stage_hooks fake_hooks;

#define EXPECT(cond, ...)                                       \
  do {                                                          \
    if (!(cond)) {                                              \
      if (++fails <= 20) {                                      \
        fprintf(stderr, "[rank %d] %s:%d: ", R, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                           \
        fputc('\n', stderr);                                    \
      }                                                         \
    }                                                           \
  } while (0)

#define EXPECT_OK(call)                                                                                \
  do {                                                                                                 \
    tpr_status e_rc = (call);                                                                          \
    EXPECT(e_rc == TPR_OK, "%s -> %s: %s", #call, tpr_status_name(e_rc), tpr_last_error());           \
  } while (0)

#define EXPECT_STATUS(call, want)                                                                      \
  do {                                                                                                 \
    tpr_status e_rc = (call);                                                                          \
    EXPECT(e_rc == (want), "%s -> %s, want %s (%s)", #call, tpr_status_name(e_rc), tpr_status_name(want), \
           tpr_last_error());                                                                          \
  } while (0)

// Sums fails over all ranks and fails the test everywhere if any failed.
void agree(void);
const char *op_name(tpr_red_op op);

// Random bits for (case, rank, index), the same on every rank.
uint64_t H(uint64_t salt, uint64_t s, uint64_t i);

typedef struct val {
  double f;   // float types: a value exactly representable in the dtype
  int64_t i;  // integer types
} val;

// Reduction inputs and results (see red_value in comm_cases.c for why every
// expected result is exact): rank s's elements [base, base + count); the
// exact result at element g over ranks 0..nsrc-1; mismatches of got.
val red_value(tpr_dtype dt, tpr_red_op op, uint64_t h);
void fill_red(void *buf, tpr_dtype dt, tpr_red_op op, uint64_t salt, int s, size_t base, size_t count);
val reduced(tpr_dtype dt, tpr_red_op op, uint64_t salt, int nsrc, size_t g);
size_t check_reduced(const void *got, tpr_dtype dt, tpr_red_op op, uint64_t salt, int nsrc, size_t base,
                     size_t count, const char *what);
// Moved data: element i of rank s's buffer is the low bytes of H(salt, s, base + i).
void fill_move(void *buf, tpr_dtype dt, uint64_t salt, int s, size_t base, size_t count);
size_t check_moved(const void *got, tpr_dtype dt, uint64_t salt, int s, size_t base, size_t count, const char *what);
void guard_set(void *p);  // GUARD bytes of a fixed pattern
bool guard_ok(const void *p);

// bytes + GUARD bytes prefilled with 0xA5, never NULL; dev: fake device memory.
unsigned char *tb_alloc(size_t bytes, bool dev);
void tb_free(void *p);
void fake_protect(bool closed);  // closed: fake device memory faults on access

// all_to_allv layouts of rank `me` (counts and displacements, extents) and
// the check of what it received (blocks from the right sender and place,
// gaps and guard untouched); returns mismatches.
void v_layouts(uint64_t salt, int me, size_t maxc, size_t *sc, size_t *sd, size_t *rc, size_t *rd, size_t *sext,
               size_t *rext);
size_t check_v(const unsigned char *recv, const unsigned char *before, tpr_dtype dt, uint64_t salt, size_t maxc,
               const size_t *rc, const size_t *rd, size_t rext, const char *what);

// One call each, checked. mem: bit 0 = send in (fake) device memory, bit 1 =
// recv in device memory (in place: the one buffer, if either bit).
#define DEV_SEND(mem) (((mem) & 1) != 0)
#define DEV_RECV(mem) (((mem) & 2) != 0)
void case_all_reduce(tpr_dtype dt, tpr_red_op op, size_t count, bool in_place, int mem);
void case_reduce_scatter(tpr_dtype dt, tpr_red_op op, size_t count, bool in_place, int mem);
void case_all_gather(tpr_dtype dt, size_t count, bool in_place, int mem);
void case_all_to_all(tpr_dtype dt, size_t count, int mem);
// Per-pair counts up to maxc (a quarter of them zero), random order and gaps.
void case_all_to_allv(tpr_dtype dt, size_t maxc, int mem);
// variant 0: send NULL off the root; 1: a send buffer everywhere (read on
// the root only); 2: in place.
void case_broadcast(tpr_dtype dt, size_t count, int root, int variant, int mem);
// A ring of two messages each way (nothing at np 1).
void case_send_recv(tpr_dtype dt, size_t count, int mem);
// Eight nonblocking all_gathers and reduce_scatters (f32, bf16, f16, i32,
// i64; in place and not) outstanding at once, completed in a random order
// per rank (the first through a tpr_comm_test loop): exact results, and
// equal bit for bit to the blocking calls on the same inputs.
void case_nonblocking(size_t count);

#endif
