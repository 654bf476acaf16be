// The `mpi` communicator under mpirun (np 1..4): every collective, dtype,
// reduction op and count {0, 1, 7, 1000, 1 Mi}, in place and out of place,
// with EXACT expected results. Rank 0's seed is broadcast, so every rank
// computes every rank's input from (seed, case, rank, index) and checks
// what it received element by element; guard bytes after every output must
// survive. Also: the int-count limit (chunked, derived-type and
// point-to-point paths, exercised by lowering the limit), the staging of
// device buffers (against fake device memory that faults when MPI touches
// it), negative controls of the checkers, and the front's argument errors.
//
// A rank never stops early in a test: failed checks are counted and printed,
// every rank keeps making the same collective calls, and at the end of each
// test all ranks fail together if any rank failed (a rank that returned
// early would leave the others waiting in a collective).
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "collectives/comm_mpi.h"
#include "collectives/comm_stage.h"
#include "collectives/tpr_comm.h"
#include "test_util.h"

#define GUARD 64
#define MI ((size_t)1 << 20)

static tpr_comm_t world;  // the communicator under test (world, or a copy for staging)
static tpr_comm_t comm;
static int R, N;
static uint64_t seed, case_no;
static int fails;  // this rank's failed checks in the running test

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

// All ranks pass or fail the test together.
static void agree(void) {
  int all = fails;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  fails = 0;
  if (all) fail_msg("%d failed checks over all ranks (details on stderr)", all);
}

static const char *op_name(tpr_red_op op) { return op == TPR_SUM ? "sum" : op == TPR_MAX ? "max" : "min"; }

// --- deterministic inputs -----------------------------------------------

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Random bits for (case, rank, index), the same on every rank.
static uint64_t H(uint64_t salt, uint64_t s, uint64_t i) {
  return mix64(mix64(seed ^ (salt << 20) ^ (s << 8)) ^ i);
}

// A reduction input element, chosen so that every expected result is exact
// whatever order MPI combines the ranks in:
//  - f32 SUM: k * 2^-4 with |k| <= 2^16. Every partial sum of up to 4 such
//    values is a multiple of 2^-4 below 2^14 in magnitude, which needs at most
//    19 significant bits: f32 (24) holds each exactly, so no order rounds.
//  - bf16 SUM: k * 2^-3 with |k| <= 127 (8 significant bits, exact in bf16);
//    f16 SUM: k * 2^-4 with |k| <= 1023 (11 bits, exact in f16). Their f32
//    sums are exact as above, so the backend's single rounding of the f32 sum
//    to bf16/f16 is the only rounding, and the expected value is that exact
//    sum rounded once. (A backend that summed in bf16 would round twice.)
//  - MAX/MIN: any finite value of the type (comparisons are exact).
//  - i32/i64 SUM: small enough that 4 ranks cannot overflow.
typedef struct val {
  double f;   // float types: a value exactly representable in the dtype
  int64_t i;  // integer types
} val;

static uint16_t finite16(uint64_t h, uint16_t exp_mask) {
  uint16_t b = (uint16_t)h;
  if ((b & exp_mask) == exp_mask) b &= (uint16_t)~0x4000;  // inf/NaN exponent -> a finite one
  return b;
}

static val red_value(tpr_dtype dt, tpr_red_op op, uint64_t h) {
  val v = {0, 0};
  bool sum = op == TPR_SUM;
  switch (dt) {
    case TPR_F32:
      if (sum) v.f = (double)((int64_t)(h % 131073) - 65536) * 0.0625;
      else {
        uint32_t b = (uint32_t)h;
        if ((b & 0x7f800000u) == 0x7f800000u) b &= ~0x40000000u;
        float f;
        memcpy(&f, &b, sizeof f);
        v.f = f;
      }
      break;
    case TPR_BF16: v.f = sum ? (double)((int64_t)(h % 255) - 127) * 0.125 : tpr_bf16_to_f32(finite16(h, 0x7f80)); break;
    case TPR_F16: v.f = sum ? (double)((int64_t)(h % 2047) - 1023) * 0.0625 : tpr_f16_to_f32(finite16(h, 0x7c00)); break;
    case TPR_I32: v.i = sum ? (int64_t)(h % (1u << 25)) - (1 << 24) : (int32_t)(uint32_t)h; break;
    case TPR_I64: v.i = sum ? (int64_t)(h >> 12) - ((int64_t)1 << 51) : (int64_t)h; break;
    default: break;
  }
  return v;
}

static bool is_int(tpr_dtype dt) { return dt == TPR_I32 || dt == TPR_I64; }

static void store_val(void *buf, tpr_dtype dt, size_t i, val v) {
  if (dt == TPR_I32) ((int32_t *)buf)[i] = (int32_t)v.i;
  else if (dt == TPR_I64) ((int64_t *)buf)[i] = v.i;
  else tpr_dtype_store(buf, dt, i, v.f);  // exact: v.f is representable
}

static val load_val(const void *buf, tpr_dtype dt, size_t i) {
  val v = {0, 0};
  if (dt == TPR_I32) v.i = ((const int32_t *)buf)[i];
  else if (dt == TPR_I64) v.i = ((const int64_t *)buf)[i];
  else v.f = tpr_dtype_load(buf, dt, i);
  return v;
}

// Rank s's reduction input: elements [base, base + count) of its vector.
static void fill_red(void *buf, tpr_dtype dt, tpr_red_op op, uint64_t salt, int s, size_t base, size_t count) {
  for (size_t i = 0; i < count; i++) store_val(buf, dt, i, red_value(dt, op, H(salt, (uint64_t)s, base + i)));
}

// The exact result at element g of the reduction over ranks 0..nsrc-1.
static val reduced(tpr_dtype dt, tpr_red_op op, uint64_t salt, int nsrc, size_t g) {
  val acc = red_value(dt, op, H(salt, 0, g));
  for (int s = 1; s < nsrc; s++) {
    val v = red_value(dt, op, H(salt, (uint64_t)s, g));
    if (is_int(dt)) acc.i = op == TPR_SUM ? acc.i + v.i : op == TPR_MAX ? (v.i > acc.i ? v.i : acc.i)
                                                                         : (v.i < acc.i ? v.i : acc.i);
    else acc.f = op == TPR_SUM ? acc.f + v.f : op == TPR_MAX ? (v.f > acc.f ? v.f : acc.f)
                                                              : (v.f < acc.f ? v.f : acc.f);
  }
  // The exact sum (a double holding an f32-exact value) rounded once to dt.
  if (dt == TPR_BF16) acc.f = tpr_bf16_to_f32(tpr_f32_to_bf16((float)acc.f));
  if (dt == TPR_F16) acc.f = tpr_f16_to_f32(tpr_f32_to_f16((float)acc.f));
  return acc;
}

// Mismatches of got[0, count) against the reduction over ranks 0..nsrc-1 of
// elements [base, base + count); prints the first.
static size_t check_reduced(const void *got, tpr_dtype dt, tpr_red_op op, uint64_t salt, int nsrc, size_t base,
                            size_t count, const char *what) {
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    val w = reduced(dt, op, salt, nsrc, base + i), g = load_val(got, dt, i);
    bool same = is_int(dt) ? g.i == w.i : g.f == w.f;
    if (!same && bad++ == 0)
      fprintf(stderr, "[rank %d] %s: element %zu is %.17g / %lld, want %.17g / %lld\n", R, what, i, g.f,
              (long long)g.i, w.f, (long long)w.i);
  }
  return bad;
}

// Data movement copies bits: element i of rank s's buffer is the low bytes of
// H(salt, s, base + i) (any pattern, NaNs included).
static void fill_move(void *buf, tpr_dtype dt, uint64_t salt, int s, size_t base, size_t count) {
  size_t esz = tpr_dtype_size(dt);
  for (size_t i = 0; i < count; i++) {
    uint64_t h = H(salt, (uint64_t)s, base + i);
    memcpy((char *)buf + i * esz, &h, esz);
  }
}

static size_t check_moved(const void *got, tpr_dtype dt, uint64_t salt, int s, size_t base, size_t count,
                          const char *what) {
  size_t esz = tpr_dtype_size(dt), bad = 0;
  for (size_t i = 0; i < count; i++) {
    uint64_t h = H(salt, (uint64_t)s, base + i);
    if (memcmp((const char *)got + i * esz, &h, esz) != 0 && bad++ == 0)
      fprintf(stderr, "[rank %d] %s: element %zu differs from rank %d's element %zu\n", R, what, i, s, base + i);
  }
  return bad;
}

static void guard_set(void *p) {
  for (int k = 0; k < GUARD; k++) ((unsigned char *)p)[k] = (unsigned char)(0xC3 ^ (k * 7));
}

static bool guard_ok(const void *p) {
  for (int k = 0; k < GUARD; k++)
    if (((const unsigned char *)p)[k] != (unsigned char)(0xC3 ^ (k * 7))) return false;
  return true;
}

// --- buffers: host, or fake device memory --------------------------------
// Fake device memory is host memory that is PROT_NONE while a collective
// runs: only the staging hooks below open it, so MPI touching it directly
// faults (the test dies), and a result that arrives proves the staging.

typedef struct region {
  unsigned char *p;
  size_t len;
} region;
static region fake[16];
static int nfake, fake_copies;
static bool fake_closed;

static void fake_protect(bool closed) {
  for (int k = 0; k < nfake; k++) mprotect(fake[k].p, fake[k].len, closed ? PROT_NONE : PROT_READ | PROT_WRITE);
  fake_closed = closed;
}

// bytes + GUARD bytes, prefilled with 0xA5; never NULL.
static unsigned char *tb_alloc(size_t bytes, bool dev) {
  size_t n = bytes + GUARD;
  unsigned char *p;
  if (dev) {
    long page = sysconf(_SC_PAGESIZE);
    size_t len = (n + (size_t)page - 1) / (size_t)page * (size_t)page;
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || nfake == 16) fail_msg("fake device memory");
    fake[nfake++] = (region){p, len};
  } else {
    p = malloc(n);
    if (!p) fail_msg("out of memory");
  }
  memset(p, 0xA5, n);
  return p;
}

static void tb_free(void *p) {
  for (int k = 0; k < nfake; k++)
    if (fake[k].p == p) {
      munmap(fake[k].p, fake[k].len);
      fake[k] = fake[--nfake];
      return;
    }
  free(p);
}

static bool fake_is_device(const void *p) {
  for (int k = 0; k < nfake; k++)
    if ((const unsigned char *)p >= fake[k].p && (const unsigned char *)p < fake[k].p + fake[k].len) return true;
  return false;
}

static tpr_status fake_memcpy(void *dst, const void *src, size_t bytes) {
  bool closed = fake_closed;
  fake_protect(false);
  memcpy(dst, src, bytes);
  fake_protect(closed);
  fake_copies++;
  return TPR_OK;
}

static tpr_status fake_sync(void) { return TPR_OK; }

static tpr_status fake_host_alloc(size_t bytes, void **out) {
  *out = malloc(bytes ? bytes : 1);
  return *out ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "fake pinned memory");
}

static const tpr_stage_hooks fake_hooks = {
    .is_device = fake_is_device,
    .memcpy = fake_memcpy,
    .sync = fake_sync,
    .host_alloc = fake_host_alloc,
    .host_free = free,
};

// mem: bit 0 = send in (fake) device memory, bit 1 = recv in device memory.
#define DEV_SEND(mem) (((mem) & 1) != 0)
#define DEV_RECV(mem) (((mem) & 2) != 0)

// --- one case per op ------------------------------------------------------

static void case_all_reduce(tpr_dtype dt, tpr_red_op op, size_t count, bool in_place, int mem) {
  uint64_t salt = ++case_no;
  size_t bytes = count * tpr_dtype_size(dt);
  unsigned char *send = tb_alloc(bytes, in_place ? mem != 0 : DEV_SEND(mem));
  unsigned char *recv = in_place ? send : tb_alloc(bytes, DEV_RECV(mem)), *copy = malloc(bytes + GUARD);
  fill_red(send, dt, op, salt, R, 0, count);
  guard_set(send + bytes), guard_set(recv + bytes);
  memcpy(copy, send, bytes + GUARD);
  char what[128];
  snprintf(what, sizeof what, "all_reduce %s %s count %zu%s mem %d", tpr_dtype_name(dt), op_name(op), count,
           in_place ? " in place" : "", mem);
  fake_protect(true);
  EXPECT_OK(tpr_comm_all_reduce(comm, send, recv, count, dt, op));
  fake_protect(false);
  EXPECT(check_reduced(recv, dt, op, salt, N, 0, count, what) == 0, "%s: wrong result", what);
  EXPECT(guard_ok(recv + bytes), "%s: wrote past the end", what);
  if (!in_place) EXPECT(memcmp(send, copy, bytes + GUARD) == 0, "%s: send changed", what);
  if (!in_place) tb_free(recv);
  tb_free(send), free(copy);
}

static void case_reduce_scatter(tpr_dtype dt, tpr_red_op op, size_t count, bool in_place, int mem) {
  uint64_t salt = ++case_no;
  size_t bytes = count * tpr_dtype_size(dt), total = bytes * (size_t)N;
  unsigned char *send = tb_alloc(total, in_place ? mem != 0 : DEV_SEND(mem));
  unsigned char *recv = in_place ? send + (size_t)R * bytes : tb_alloc(bytes, DEV_RECV(mem));
  unsigned char *copy = malloc(total + GUARD);
  fill_red(send, dt, op, salt, R, 0, (size_t)N * count);
  guard_set(send + total);
  if (!in_place) guard_set(recv + bytes);
  memcpy(copy, send, total + GUARD);
  char what[128];
  snprintf(what, sizeof what, "reduce_scatter %s %s count %zu%s mem %d", tpr_dtype_name(dt), op_name(op), count,
           in_place ? " in place" : "", mem);
  fake_protect(true);
  EXPECT_OK(tpr_comm_reduce_scatter(comm, send, recv, count, dt, op));
  fake_protect(false);
  EXPECT(check_reduced(recv, dt, op, salt, N, (size_t)R * count, count, what) == 0, "%s: wrong result", what);
  EXPECT(guard_ok(send + total), "%s: wrote past send", what);
  if (!in_place) {
    EXPECT(guard_ok(recv + bytes), "%s: wrote past recv", what);
    EXPECT(memcmp(send, copy, total + GUARD) == 0, "%s: send changed", what);
    tb_free(recv);
  }
  tb_free(send), free(copy);
}

static void case_all_gather(tpr_dtype dt, size_t count, bool in_place, int mem) {
  uint64_t salt = ++case_no;
  size_t bytes = count * tpr_dtype_size(dt), total = bytes * (size_t)N;
  unsigned char *recv = tb_alloc(total, in_place ? mem != 0 : DEV_RECV(mem));
  unsigned char *send = in_place ? recv + (size_t)R * bytes : tb_alloc(bytes, DEV_SEND(mem));
  unsigned char *copy = malloc(bytes + GUARD);
  fill_move(send, dt, salt, R, 0, count);
  guard_set(recv + total);
  if (!in_place) guard_set(send + bytes);
  memcpy(copy, send, bytes + GUARD);
  char what[128];
  snprintf(what, sizeof what, "all_gather %s count %zu%s mem %d", tpr_dtype_name(dt), count,
           in_place ? " in place" : "", mem);
  fake_protect(true);
  EXPECT_OK(tpr_comm_all_gather(comm, send, recv, count, dt));
  fake_protect(false);
  for (int s = 0; s < N; s++)
    EXPECT(check_moved(recv + (size_t)s * bytes, dt, salt, s, 0, count, what) == 0, "%s: block %d", what, s);
  EXPECT(guard_ok(recv + total), "%s: wrote past the end", what);
  if (!in_place) {
    EXPECT(memcmp(send, copy, bytes + GUARD) == 0, "%s: send changed", what);
    tb_free(send);
  }
  tb_free(recv), free(copy);
}

static void case_all_to_all(tpr_dtype dt, size_t count, int mem) {
  uint64_t salt = ++case_no;
  size_t bytes = count * tpr_dtype_size(dt), total = bytes * (size_t)N;
  unsigned char *send = tb_alloc(total, DEV_SEND(mem)), *recv = tb_alloc(total, DEV_RECV(mem));
  unsigned char *copy = malloc(total + GUARD);
  fill_move(send, dt, salt, R, 0, (size_t)N * count);  // block j goes to rank j
  guard_set(send + total), guard_set(recv + total);
  memcpy(copy, send, total + GUARD);
  char what[128];
  snprintf(what, sizeof what, "all_to_all %s count %zu mem %d", tpr_dtype_name(dt), count, mem);
  fake_protect(true);
  EXPECT_OK(tpr_comm_all_to_all(comm, send, recv, count, dt));
  fake_protect(false);
  for (int s = 0; s < N; s++)  // block s came from rank s's block R
    EXPECT(check_moved(recv + (size_t)s * bytes, dt, salt, s, (size_t)R * count, count, what) == 0,
           "%s: block from rank %d", what, s);
  EXPECT(guard_ok(recv + total), "%s: wrote past the end", what);
  EXPECT(memcmp(send, copy, total + GUARD) == 0, "%s: send changed", what);
  tb_free(send), tb_free(recv), free(copy);
}

// all_to_allv layouts: the count rank s sends rank j (zero a quarter of the
// time, else up to maxc: not divisible by anything in particular), and each
// rank's blocks placed in a random order with random gaps. Displacements of
// empty blocks are garbage: they must be ignored.
static size_t pair_count(uint64_t salt, int s, int j, size_t maxc) {
  uint64_t h = H(salt ^ 0xa2a, (uint64_t)s, (uint64_t)j);
  return h % 4 == 0 ? 0 : (size_t)((h >> 8) % (maxc + 1));
}

static size_t layout(uint64_t salt, int who, const size_t *counts, size_t *displs) {
  int order[64];
  for (int k = 0; k < N; k++) order[k] = k;
  for (int k = N - 1; k > 0; k--) {  // Fisher-Yates
    int m = (int)(H(salt, (uint64_t)who, (uint64_t)k) % (uint64_t)(k + 1)), t = order[k];
    order[k] = order[m], order[m] = t;
  }
  size_t pos = H(salt, (uint64_t)who, 99) % 3;
  for (int k = 0; k < N; k++) {
    int j = order[k];
    displs[j] = counts[j] ? pos : (size_t)0x7fffffff + H(salt, (uint64_t)who, 100 + (uint64_t)j) % 1000;
    pos += counts[j] + H(salt, (uint64_t)who, 200 + (uint64_t)k) % 4;
  }
  return pos;
}

static void v_layouts(uint64_t salt, int me, size_t maxc, size_t *sc, size_t *sd, size_t *rc, size_t *rd,
                      size_t *sext, size_t *rext) {
  for (int j = 0; j < N; j++) sc[j] = pair_count(salt, me, j, maxc), rc[j] = pair_count(salt, j, me, maxc);
  *sext = layout(salt ^ 0x5e, me, sc, sd);
  *rext = layout(salt ^ 0x7e, me, rc, rd);
}

// Received blocks come from the right sender and position; gaps and the
// guard keep their fill. Returns mismatches.
static size_t check_v(const unsigned char *recv, const unsigned char *before, tpr_dtype dt, uint64_t salt,
                      size_t maxc, const size_t *rc, const size_t *rd, size_t rext, const char *what) {
  size_t esz = tpr_dtype_size(dt), bad = 0;
  unsigned char *covered = calloc(rext + 1, 1);
  for (int j = 0; j < N; j++) {
    if (!rc[j]) continue;
    size_t jsc[64], jsd[64], jrc[64], jrd[64], a, b;
    v_layouts(salt, j, maxc, jsc, jsd, jrc, jrd, &a, &b);  // where rank j took our block from
    bad += check_moved(recv + rd[j] * esz, dt, salt, j, jsd[R], rc[j], what);
    memset(covered + rd[j], 1, rc[j]);
  }
  for (size_t e = 0; e < rext; e++)
    if (!covered[e] && memcmp(recv + e * esz, before + e * esz, esz) != 0 && bad++ == 0)
      fprintf(stderr, "[rank %d] %s: gap element %zu was written\n", R, what, e);
  if (memcmp(recv + rext * esz, before + rext * esz, GUARD) != 0 && bad++ == 0)
    fprintf(stderr, "[rank %d] %s: wrote past the end\n", R, what);
  free(covered);
  return bad;
}

static void case_all_to_allv(tpr_dtype dt, size_t maxc, int mem) {
  uint64_t salt = ++case_no;
  size_t esz = tpr_dtype_size(dt), sc[64], sd[64], rc[64], rd[64], sext, rext;
  v_layouts(salt, R, maxc, sc, sd, rc, rd, &sext, &rext);
  unsigned char *send = tb_alloc(sext * esz, DEV_SEND(mem)), *recv = tb_alloc(rext * esz, DEV_RECV(mem));
  unsigned char *before = malloc(rext * esz + GUARD), *copy = malloc(sext * esz + GUARD);
  fill_move(send, dt, salt, R, 0, sext);  // element p of the send buffer: H(salt, R, p), gaps too
  guard_set(send + sext * esz), guard_set(recv + rext * esz);
  memcpy(before, recv, rext * esz + GUARD);
  memcpy(copy, send, sext * esz + GUARD);
  char what[128];
  snprintf(what, sizeof what, "all_to_allv %s maxc %zu mem %d", tpr_dtype_name(dt), maxc, mem);
  fake_protect(true);
  EXPECT_OK(tpr_comm_all_to_allv(comm, send, sc, sd, recv, rc, rd, dt));
  fake_protect(false);
  EXPECT(check_v(recv, before, dt, salt, maxc, rc, rd, rext, what) == 0, "%s: wrong result", what);
  EXPECT(memcmp(send, copy, sext * esz + GUARD) == 0, "%s: send changed", what);
  tb_free(send), tb_free(recv), free(before), free(copy);
}

// variant 0: out of place, send NULL off the root; 1: out of place, a send
// buffer everywhere (read on the root only); 2: in place (send == recv).
static void case_broadcast(tpr_dtype dt, size_t count, int root, int variant, int mem) {
  uint64_t salt = ++case_no;
  size_t bytes = count * tpr_dtype_size(dt);
  unsigned char *recv = tb_alloc(bytes, DEV_RECV(mem)), *send = NULL, *copy = malloc(bytes + GUARD);
  if (variant == 2) send = recv;
  else if (variant == 1 || R == root) send = tb_alloc(bytes, DEV_SEND(mem));
  if (R == root) fill_move(send, dt, salt, root, 0, count);
  else if (send && send != recv) fill_move(send, dt, salt ^ 1, R, 0, count);  // wrong data: must not be sent
  guard_set(recv + bytes);
  if (send && send != recv) guard_set(send + bytes), memcpy(copy, send, bytes + GUARD);
  char what[128];
  snprintf(what, sizeof what, "broadcast %s count %zu root %d variant %d mem %d", tpr_dtype_name(dt), count, root,
           variant, mem);
  fake_protect(true);
  EXPECT_OK(tpr_comm_broadcast(comm, send, recv, count, dt, root));
  fake_protect(false);
  EXPECT(check_moved(recv, dt, salt, root, 0, count, what) == 0, "%s: wrong result", what);
  EXPECT(guard_ok(recv + bytes), "%s: wrote past the end", what);
  if (send && send != recv) {
    EXPECT(memcmp(send, copy, bytes + GUARD) == 0, "%s: send changed", what);
    tb_free(send);
  }
  tb_free(recv), free(copy);
}

// Ring: two messages to the next rank, two from the previous, in order.
// Even ranks send first, odd ranks receive first, so blocking sends of any
// size cannot deadlock.
static void case_send_recv(tpr_dtype dt, size_t count, int mem) {
  if (N == 1) return;
  uint64_t salt = ++case_no;
  size_t bytes = count * tpr_dtype_size(dt);
  int next = (R + 1) % N, prev = (R + N - 1) % N;
  unsigned char *a = tb_alloc(bytes, DEV_SEND(mem)), *b = tb_alloc(bytes, DEV_SEND(mem));
  unsigned char *ra = tb_alloc(bytes, DEV_RECV(mem)), *rb = tb_alloc(bytes, DEV_RECV(mem));
  fill_move(a, dt, salt, R, 0, count), fill_move(b, dt, salt, R, count, count);
  guard_set(ra + bytes), guard_set(rb + bytes);
  char what[128];
  snprintf(what, sizeof what, "send/recv %s count %zu mem %d", tpr_dtype_name(dt), count, mem);
  fake_protect(true);
  for (int phase = 0; phase < 2; phase++) {
    if ((phase == 0) == (R % 2 == 0)) {
      EXPECT_OK(tpr_comm_send(comm, a, count, dt, next));
      EXPECT_OK(tpr_comm_send(comm, b, count, dt, next));
    } else {
      EXPECT_OK(tpr_comm_recv(comm, ra, count, dt, prev));
      EXPECT_OK(tpr_comm_recv(comm, rb, count, dt, prev));
    }
  }
  fake_protect(false);
  EXPECT(check_moved(ra, dt, salt, prev, 0, count, what) == 0, "%s: first message", what);
  EXPECT(check_moved(rb, dt, salt, prev, count, count, what) == 0, "%s: second message", what);
  EXPECT(guard_ok(ra + bytes) && guard_ok(rb + bytes), "%s: wrote past the end", what);
  tb_free(a), tb_free(b), tb_free(ra), tb_free(rb);
}

// --- the matrix -----------------------------------------------------------

static const tpr_dtype reducible[] = {TPR_F32, TPR_BF16, TPR_F16, TPR_I32, TPR_I64};
static const tpr_dtype all_types[] = {TPR_U8, TPR_BF16, TPR_F16, TPR_F32, TPR_I32, TPR_I64, TPR_F8E4M3};
static const size_t counts[] = {0, 1, 7, 1000};  // 1 Mi: a representative subset (run time)
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static void test_identity(void **state) {
  int mr, ms, cmp = MPI_UNEQUAL, level = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mr);
  MPI_Comm_size(MPI_COMM_WORLD, &ms);
  EXPECT(tpr_comm_rank(comm) == mr && tpr_comm_size(comm) == ms, "rank/size %d/%d, MPI says %d/%d",
         tpr_comm_rank(comm), tpr_comm_size(comm), mr, ms);
  EXPECT(strcmp(tpr_comm_backend(comm), "mpi") == 0, "backend %s", tpr_comm_backend(comm));
  EXPECT(strcmp(tpr_comm_name(comm), "world") == 0, "name %s", tpr_comm_name(comm));
  for (int r = 0; r < N; r++) EXPECT(tpr_comm_world_rank(comm, r) == r, "world rank of %d", r);
  EXPECT(tpr_comm_world_rank(comm, N) == -1 && tpr_comm_world_rank(comm, -1) == -1, "world rank out of range");
  MPI_Comm h = tpr__comm_mpi_handle(comm);
  EXPECT(h != MPI_COMM_NULL && h != MPI_COMM_WORLD, "the handle is a duplicate of the world");
  if (h != MPI_COMM_NULL) MPI_Comm_compare(h, MPI_COMM_WORLD, &cmp);
  EXPECT(cmp == MPI_CONGRUENT, "handle compares %d to MPI_COMM_WORLD", cmp);
  tpr_comm_t self;
  EXPECT_OK(tpr_comm_init_self(&self));
  EXPECT(tpr__comm_mpi_handle(self) == MPI_COMM_NULL && tpr__comm_mpi_handle(NULL) == MPI_COMM_NULL,
         "no MPI handle behind self");
  tpr_comm_free(self);
  MPI_Query_thread(&level);
  EXPECT(tpr__comm_mpi_thread_level() == level, "thread level %d, MPI says %d", tpr__comm_mpi_thread_level(), level);
  if (level < MPI_THREAD_MULTIPLE && R == 0) print_message("note: MPI grants thread level %d only\n", level);
  for (int k = 0; k < 3; k++) EXPECT_OK(tpr_comm_barrier(comm));
  agree();
}

static void test_all_reduce(void **state) {
  for (size_t d = 0; d < LEN(reducible); d++)
    for (tpr_red_op op = TPR_SUM; op <= TPR_MIN; op++)
      for (size_t k = 0; k < LEN(counts); k++)
        for (int ip = 0; ip < 2; ip++) case_all_reduce(reducible[d], op, counts[k], ip, 0);
  case_all_reduce(TPR_F32, TPR_SUM, MI, false, 0);
  case_all_reduce(TPR_BF16, TPR_SUM, MI, true, 0);
  agree();
}

static void test_reduce_scatter(void **state) {
  for (size_t d = 0; d < LEN(reducible); d++)
    for (tpr_red_op op = TPR_SUM; op <= TPR_MIN; op++)
      for (size_t k = 0; k < LEN(counts); k++)
        for (int ip = 0; ip < 2; ip++) case_reduce_scatter(reducible[d], op, counts[k], ip, 0);
  case_reduce_scatter(TPR_F32, TPR_SUM, MI, false, 0);
  agree();
}

static void test_all_gather(void **state) {
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(counts); k++)
      for (int ip = 0; ip < 2; ip++) case_all_gather(all_types[d], counts[k], ip, 0);
  case_all_gather(TPR_F32, MI, false, 0);
  agree();
}

static void test_all_to_all(void **state) {
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(counts); k++) case_all_to_all(all_types[d], counts[k], 0);
  case_all_to_all(TPR_F32, MI, 0);
  agree();
}

static void test_all_to_allv(void **state) {
  const size_t maxcs[] = {0, 1, 7, 1000};
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(maxcs); k++)
      for (int rep = 0; rep < 2; rep++) case_all_to_allv(all_types[d], maxcs[k], 0);
  // Nothing moves: NULL buffers are fine.
  size_t zero[64] = {0}, garbage[64];
  for (int j = 0; j < N; j++) garbage[j] = (size_t)1 << 40;
  EXPECT_OK(tpr_comm_all_to_allv(comm, NULL, zero, garbage, NULL, zero, garbage, TPR_F32));
  agree();
}

static void test_broadcast(void **state) {
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(counts); k++)
      for (int root = 0; root < N; root++)
        for (int variant = 0; variant < 3; variant++) case_broadcast(all_types[d], counts[k], root, variant, 0);
  case_broadcast(TPR_BF16, MI, N - 1, 0, 0);
  agree();
}

static void test_send_recv(void **state) {
  for (size_t d = 0; d < LEN(all_types); d++)
    for (size_t k = 0; k < LEN(counts); k++) case_send_recv(all_types[d], counts[k], 0);
  case_send_recv(TPR_U8, MI, 0);
  agree();
}

// Beyond an int: the same checks with the per-call limit lowered, so that
// reductions run in chunks, data movement uses derived types and
// all_to_allv goes point to point (counts and displacements above it).
static void test_count_limit(void **state) {
  const size_t limits[] = {64, 7};
  for (size_t l = 0; l < LEN(limits); l++) {
    tpr__comm_mpi_set_max_count(limits[l]);
    const size_t cs[] = {1, 7, 64, 65, 1000};
    for (size_t k = 0; k < LEN(cs); k++) {
      for (int ip = 0; ip < 2; ip++) {
        case_all_reduce(TPR_F32, TPR_SUM, cs[k], ip, 0);
        case_all_reduce(TPR_BF16, TPR_SUM, cs[k], ip, 0);
        case_all_reduce(TPR_I64, TPR_MAX, cs[k], ip, 0);
        case_reduce_scatter(TPR_I32, TPR_SUM, cs[k], ip, 0);
        case_reduce_scatter(TPR_F16, TPR_MIN, cs[k], ip, 0);
        case_all_gather(TPR_I64, cs[k], ip, 0);
        case_all_gather(TPR_U8, cs[k], ip, 0);
      }
      case_all_to_all(TPR_BF16, cs[k], 0);
      case_broadcast(TPR_F32, cs[k], N - 1, 0, 0);
      case_broadcast(TPR_U8, cs[k], 0, 2, 0);
      case_send_recv(TPR_I64, cs[k], 0);
    }
    for (int rep = 0; rep < 3; rep++) case_all_to_allv(TPR_F32, 300, 0), case_all_to_allv(TPR_U8, 50, 0);
  }
  tpr__comm_mpi_set_max_count(0);
  agree();
}

// Device buffers: fake device memory (see tb_alloc) for send, recv or both,
// on a communicator of its own (staging caches buffers per communicator).
static void test_device_staging(void **state) {
  tpr_comm_t saved = comm, dup = NULL;
  EXPECT_OK(tpr_comm_split(world, 0, R, "staged", &dup));
  if (!dup) {
    agree();
    return;
  }
  tpr__stage_set_hooks(&fake_hooks);
  comm = dup;
  fake_copies = 0;
  const size_t cs[] = {0, 1, 7, 1000};
  const tpr_dtype ts[] = {TPR_F32, TPR_BF16, TPR_I64};
  const tpr_dtype ms[] = {TPR_U8, TPR_F16, TPR_I64};
  for (int mem = 1; mem <= 3; mem++)
    for (size_t k = 0; k < LEN(cs); k++)
      for (size_t d = 0; d < 3; d++) {
        for (int ip = 0; ip < 2; ip++) {
          case_all_reduce(ts[d], d == 2 ? TPR_MIN : TPR_SUM, cs[k], ip, mem);
          case_reduce_scatter(ts[d], TPR_MAX, cs[k], ip, mem);
          case_all_gather(ms[d], cs[k], ip, mem);
        }
        case_all_to_all(ms[d], cs[k], mem);
        for (int root = 0; root < N; root++)
          for (int variant = 0; variant < 3; variant++) case_broadcast(ms[d], cs[k], root, variant, mem);
        case_send_recv(ms[d], cs[k], mem);
      }
  for (int mem = 1; mem <= 3; mem++)
    for (int rep = 0; rep < 3; rep++) case_all_to_allv(TPR_F32, 100, mem), case_all_to_allv(TPR_U8, 7, mem);
  EXPECT(fake_copies > 0, "no device buffer was staged");
  comm = saved;
  tpr_comm_free(dup);
  tpr__stage_set_hooks(NULL);
  agree();
}

// The checkers catch what they must: a wrong expectation (rank 0's values
// alone, another root, another sender) and tampered outputs and guards.
static void test_negative_controls(void **state) {
  size_t count = 1000;
  uint64_t salt = ++case_no;
  float *x = malloc(count * sizeof *x + GUARD);
  fill_red(x, TPR_F32, TPR_SUM, salt, R, 0, count);
  guard_set(x + count);
  EXPECT_OK(tpr_comm_all_reduce(comm, x, x, count, TPR_F32, TPR_SUM));
  EXPECT(check_reduced(x, TPR_F32, TPR_SUM, salt, N, 0, count, "control") == 0, "the real result is right");
  if (N > 1)
    EXPECT(check_reduced(x, TPR_F32, TPR_SUM, salt, 1, 0, count, "expected mismatch (rank 0 only)") > 0,
           "rank-0-only expectation not detected");
  x[count / 2] += 0.0625f;
  EXPECT(check_reduced(x, TPR_F32, TPR_SUM, salt, N, 0, count, "expected mismatch (tampered)") == 1,
         "one tampered element not detected exactly once");
  EXPECT(guard_ok(x + count), "guard");
  ((unsigned char *)(x + count))[GUARD - 1] ^= 1;
  EXPECT(!guard_ok(x + count), "tampered guard not detected");
  free(x);

  // The bf16 SUM inputs do exercise the final rounding: from 3 ranks on,
  // sums of k * 2^-3 (|k| <= 127) need 9 or more significant bits, so some
  // of 1000 results must differ from the exact sum (else a backend that
  // never rounded, or rounded twice, could pass unnoticed).
  salt = ++case_no;
  uint16_t *h = malloc(count * sizeof *h);
  fill_red(h, TPR_BF16, TPR_SUM, salt, R, 0, count);
  EXPECT_OK(tpr_comm_all_reduce(comm, h, h, count, TPR_BF16, TPR_SUM));
  EXPECT(check_reduced(h, TPR_BF16, TPR_SUM, salt, N, 0, count, "bf16 control") == 0, "bf16 result");
  size_t rounded = 0;
  for (size_t i = 0; i < count; i++) {
    double exact = 0;
    for (int s = 0; s < N; s++) exact += red_value(TPR_BF16, TPR_SUM, H(salt, (uint64_t)s, i)).f;
    if (tpr_bf16_to_f32(h[i]) != exact) rounded++;
  }
  if (N >= 3) EXPECT(rounded > 0, "no bf16 sum needed rounding: the rounding is untested");
  else EXPECT(rounded == 0, "a bf16 sum of %d ranks is exact, yet %zu were rounded", N, rounded);
  free(h);

  // Moved data: another sender, and a tampered element.
  salt = ++case_no;
  size_t bytes = count * 8;
  unsigned char *send = malloc(bytes), *recv = malloc(bytes * (size_t)N);
  fill_move(send, TPR_I64, salt, R, 0, count);
  EXPECT_OK(tpr_comm_all_gather(comm, send, recv, count, TPR_I64));
  EXPECT(check_moved(recv, TPR_I64, salt, 0, 0, count, "control") == 0, "block 0 is rank 0's");
  EXPECT(check_moved(recv, TPR_I64, salt, N - 1, 0, count, "expected mismatch (wrong sender)") > 0 || N == 1,
         "wrong sender not detected");
  recv[bytes / 2] ^= 0x10;
  EXPECT(check_moved(recv, TPR_I64, salt, 0, 0, count, "expected mismatch (tampered)") == 1, "tamper not detected");
  free(send), free(recv);

  // all_to_allv: a tampered block element and a written gap are both caught.
  salt = ++case_no;
  size_t sc[64], sd[64], rc[64], rd[64], sext, rext, maxc = 50;
  v_layouts(salt, R, maxc, sc, sd, rc, rd, &sext, &rext);
  unsigned char *vs = tb_alloc(sext * 4, false), *vr = tb_alloc(rext * 4, false), *before = malloc(rext * 4 + GUARD);
  fill_move(vs, TPR_F32, salt, R, 0, sext);
  guard_set(vr + rext * 4);
  memcpy(before, vr, rext * 4 + GUARD);
  EXPECT_OK(tpr_comm_all_to_allv(comm, vs, sc, sd, vr, rc, rd, TPR_F32));
  EXPECT(check_v(vr, before, TPR_F32, salt, maxc, rc, rd, rext, "control") == 0, "all_to_allv control");
  int j = -1;
  for (int k = 0; k < N; k++)
    if (rc[k]) j = k;
  if (j >= 0) {
    vr[rd[j] * 4] ^= 1;
    EXPECT(check_v(vr, before, TPR_F32, salt, maxc, rc, rd, rext, "expected mismatch (tampered)") > 0,
           "tampered block not detected");
    vr[rd[j] * 4] ^= 1;
  }
  size_t gap = (size_t)-1;
  unsigned char *cov = calloc(rext + 1, 1);
  for (int k = 0; k < N; k++)
    if (rc[k]) memset(cov + rd[k], 1, rc[k]);
  for (size_t e = 0; e < rext && gap == (size_t)-1; e++)
    if (!cov[e]) gap = e;
  if (gap != (size_t)-1) {
    vr[gap * 4] ^= 1;
    EXPECT(check_v(vr, before, TPR_F32, salt, maxc, rc, rd, rext, "expected mismatch (gap)") > 0,
           "written gap not detected");
  }
  free(cov), tb_free(vs), tb_free(vr), free(before);
  agree();
}

// The front rejects bad arguments before any rank communicates (every rank
// makes the same bad call, so no rank is left waiting), and writes nothing.
static void test_errors(void **state) {
  unsigned char a[256], b[256], keep[256];
  memset(a, 1, sizeof a), memset(b, 7, sizeof b), memcpy(keep, b, sizeof b);
  size_t cnt[64], dsp[64];
  for (int j = 0; j < N; j++) cnt[j] = 1, dsp[j] = (size_t)j;
  unsigned char *big = malloc((size_t)N * 256), *big2 = malloc((size_t)N * 256);
  // NULL buffers with count > 0.
  EXPECT_STATUS(tpr_comm_all_reduce(comm, NULL, b, 4, TPR_F32, TPR_SUM), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, NULL, 4, TPR_F32, TPR_SUM), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_gather(comm, NULL, big, 4, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_reduce_scatter(comm, big, NULL, 4, TPR_I32, TPR_MAX), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_to_all(comm, NULL, big, 4, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_to_allv(comm, NULL, cnt, dsp, big, cnt, dsp, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_to_allv(comm, big, NULL, dsp, big2, cnt, dsp, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_broadcast(comm, a, NULL, 4, TPR_U8, 0), TPR_ERR_INVALID_ARG);
  if (N > 1) {
    EXPECT_STATUS(tpr_comm_send(comm, NULL, 4, TPR_U8, (R + 1) % N), TPR_ERR_INVALID_ARG);
    EXPECT_STATUS(tpr_comm_recv(comm, NULL, 4, TPR_U8, (R + 1) % N), TPR_ERR_INVALID_ARG);
  }
  // Bad dtypes and ops; u8 and f8 do not reduce.
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_DTYPE_COUNT, TPR_SUM), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, (tpr_dtype)-1, TPR_SUM), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_all_gather(comm, a, big, 4, (tpr_dtype)99), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_all_to_all(comm, big, big2, 4, (tpr_dtype)99), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_broadcast(comm, a, b, 4, (tpr_dtype)99, 0), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_F32, (tpr_red_op)3), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_F32, (tpr_red_op)-1), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_reduce_scatter(comm, big, b, 4, TPR_I64, (tpr_red_op)7), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_U8, TPR_SUM), TPR_ERR_DTYPE);
  EXPECT(strstr(tpr_last_error(), "u8") != NULL, "message names u8: %s", tpr_last_error());
  EXPECT_STATUS(tpr_comm_all_reduce(comm, a, b, 4, TPR_F8E4M3, TPR_MAX), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_reduce_scatter(comm, big, b, 4, TPR_U8, TPR_SUM), TPR_ERR_DTYPE);
  EXPECT_STATUS(tpr_comm_reduce_scatter(comm, big, b, 4, TPR_F8E4M3, TPR_MIN), TPR_ERR_DTYPE);
  // Roots and peers out of range; a peer may not be this rank.
  EXPECT_STATUS(tpr_comm_broadcast(comm, a, b, 4, TPR_U8, -1), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_broadcast(comm, a, b, 4, TPR_U8, N), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_send(comm, a, 4, TPR_U8, N), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_send(comm, a, 4, TPR_U8, -1), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_send(comm, a, 4, TPR_U8, R), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_recv(comm, b, 4, TPR_U8, R), TPR_ERR_INVALID_ARG);
  EXPECT_STATUS(tpr_comm_recv(comm, b, 4, TPR_U8, N + 3), TPR_ERR_INVALID_ARG);
  // all_to_all is out of place only.
  EXPECT_STATUS(tpr_comm_all_to_all(comm, big, big + 1, 2, TPR_U8), TPR_ERR_INVALID_ARG);
  EXPECT(memcmp(b, keep, sizeof b) == 0, "a failed call wrote into recv");
  // Zero counts with NULL buffers are fine everywhere.
  EXPECT_OK(tpr_comm_all_reduce(comm, NULL, NULL, 0, TPR_BF16, TPR_MAX));
  EXPECT_OK(tpr_comm_reduce_scatter(comm, NULL, NULL, 0, TPR_I64, TPR_SUM));
  EXPECT_OK(tpr_comm_all_gather(comm, NULL, NULL, 0, TPR_U8));
  EXPECT_OK(tpr_comm_all_to_all(comm, NULL, NULL, 0, TPR_F16));
  EXPECT_OK(tpr_comm_broadcast(comm, NULL, NULL, 0, TPR_F32, N - 1));
  if (N > 1) {  // an empty message still pairs a send with a recv
    int next = (R + 1) % N, prev = (R + N - 1) % N;
    for (int phase = 0; phase < 2; phase++) {
      if ((phase == 0) == (R % 2 == 0)) EXPECT_OK(tpr_comm_send(comm, NULL, 0, TPR_F32, next));
      else EXPECT_OK(tpr_comm_recv(comm, NULL, 0, TPR_F32, prev));
    }
  }
  free(big), free(big2);
  agree();
}

int main(int argc, char **argv) {
  if (tpr_comm_mpi_init(&argc, &argv) != TPR_OK || tpr_comm_init_mpi_world(&world) != TPR_OK) {
    fprintf(stderr, "MPI setup failed: %s\n", tpr_last_error());
    return 1;
  }
  comm = world;
  R = tpr_comm_rank(comm), N = tpr_comm_size(comm);
  if (N > 64) {
    fprintf(stderr, "this test handles up to 64 ranks\n");
    return 1;
  }
  // One seed for all ranks: each rank computes everyone's inputs from it.
  seed = R == 0 ? tt_seed_from_env() : 0;
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_identity),       cmocka_unit_test(test_all_reduce),
      cmocka_unit_test(test_reduce_scatter), cmocka_unit_test(test_all_gather),
      cmocka_unit_test(test_all_to_all),     cmocka_unit_test(test_all_to_allv),
      cmocka_unit_test(test_broadcast),      cmocka_unit_test(test_send_recv),
      cmocka_unit_test(test_count_limit),    cmocka_unit_test(test_device_staging),
      cmocka_unit_test(test_negative_controls), cmocka_unit_test(test_errors),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  int any = failed;  // every rank must agree on success, or ctest sees only rank 0's view
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  tpr_comm_free(world);
  tpr_comm_mpi_finalize();
  return any ? 1 : 0;
}
