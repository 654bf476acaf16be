// Collective test cases with exact expected results, shared by the mpi
// backend's tests (see comm_cases.h).
#include "comm_cases.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

tpr_comm_t comm;
int R, N;
uint64_t seed, case_no;
int fails;

void agree(void) {
  int all = fails;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  fails = 0;
  if (all) fail_msg("%d failed checks over all ranks (details on stderr)", all);
}

const char *op_name(tpr_red_op op) { return op == TPR_SUM ? "sum" : op == TPR_MAX ? "max" : "min"; }

// --- deterministic inputs -----------------------------------------------

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Random bits for (case, rank, index), the same on every rank.
uint64_t H(uint64_t salt, uint64_t s, uint64_t i) {
  return mix64(mix64(seed ^ (salt << 20) ^ (s << 8)) ^ i);
}

static uint16_t finite16(uint64_t h, uint16_t exp_mask) {
  uint16_t b = (uint16_t)h;
  if ((b & exp_mask) == exp_mask) b &= (uint16_t)~0x4000;  // inf/NaN exponent -> a finite one
  return b;
}

// A reduction input element, chosen so that every expected result is exact
// whatever order MPI combines the ranks in (for up to 64 ranks, the tests'
// limit):
//  - f32 SUM: k * 2^-4 with |k| <= 2^16. Every partial sum of up to 64 such
//    values is a multiple of 2^-4 below 2^18 in magnitude, which needs at most
//    23 significant bits: f32 (24) holds each exactly, so no order rounds.
//  - bf16 SUM: k * 2^-3 with |k| <= 127 (8 significant bits, exact in bf16);
//    f16 SUM: k * 2^-4 with |k| <= 1023 (11 bits, exact in f16). Their f32
//    sums are exact as above, so the backend's single rounding of the f32 sum
//    to bf16/f16 is the only rounding, and the expected value is that exact
//    sum rounded once. (A backend that summed in bf16 would round twice.)
//  - MAX/MIN: any finite value of the type (comparisons are exact).
//  - i32/i64 SUM: small enough that 64 ranks cannot overflow.
val red_value(tpr_dtype dt, tpr_red_op op, uint64_t h) {
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
void fill_red(void *buf, tpr_dtype dt, tpr_red_op op, uint64_t salt, int s, size_t base, size_t count) {
  for (size_t i = 0; i < count; i++) store_val(buf, dt, i, red_value(dt, op, H(salt, (uint64_t)s, base + i)));
}

// The exact result at element g of the reduction over ranks 0..nsrc-1.
val reduced(tpr_dtype dt, tpr_red_op op, uint64_t salt, int nsrc, size_t g) {
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
size_t check_reduced(const void *got, tpr_dtype dt, tpr_red_op op, uint64_t salt, int nsrc, size_t base,
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
void fill_move(void *buf, tpr_dtype dt, uint64_t salt, int s, size_t base, size_t count) {
  size_t esz = tpr_dtype_size(dt);
  for (size_t i = 0; i < count; i++) {
    uint64_t h = H(salt, (uint64_t)s, base + i);
    memcpy((char *)buf + i * esz, &h, esz);
  }
}

size_t check_moved(const void *got, tpr_dtype dt, uint64_t salt, int s, size_t base, size_t count,
                          const char *what) {
  size_t esz = tpr_dtype_size(dt), bad = 0;
  for (size_t i = 0; i < count; i++) {
    uint64_t h = H(salt, (uint64_t)s, base + i);
    if (memcmp((const char *)got + i * esz, &h, esz) != 0 && bad++ == 0)
      fprintf(stderr, "[rank %d] %s: element %zu differs from rank %d's element %zu\n", R, what, i, s, base + i);
  }
  return bad;
}

void guard_set(void *p) {
  for (int k = 0; k < GUARD; k++) ((unsigned char *)p)[k] = (unsigned char)(0xC3 ^ (k * 7));
}

bool guard_ok(const void *p) {
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
static int nfake;
int fake_copies;
static bool fake_closed;

void fake_protect(bool closed) {
  for (int k = 0; k < nfake; k++) mprotect(fake[k].p, fake[k].len, closed ? PROT_NONE : PROT_READ | PROT_WRITE);
  fake_closed = closed;
}

// bytes + GUARD bytes, prefilled with 0xA5; never NULL.
unsigned char *tb_alloc(size_t bytes, bool dev) {
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

void tb_free(void *p) {
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

const tpr_stage_hooks fake_hooks = {
    .is_device = fake_is_device,
    .memcpy = fake_memcpy,
    .sync = fake_sync,
    .host_alloc = fake_host_alloc,
    .host_free = free,
};


// --- one case per op ------------------------------------------------------

void case_all_reduce(tpr_dtype dt, tpr_red_op op, size_t count, bool in_place, int mem) {
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

void case_reduce_scatter(tpr_dtype dt, tpr_red_op op, size_t count, bool in_place, int mem) {
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

void case_all_gather(tpr_dtype dt, size_t count, bool in_place, int mem) {
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

void case_all_to_all(tpr_dtype dt, size_t count, int mem) {
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

void v_layouts(uint64_t salt, int me, size_t maxc, size_t *sc, size_t *sd, size_t *rc, size_t *rd,
                      size_t *sext, size_t *rext) {
  for (int j = 0; j < N; j++) sc[j] = pair_count(salt, me, j, maxc), rc[j] = pair_count(salt, j, me, maxc);
  *sext = layout(salt ^ 0x5e, me, sc, sd);
  *rext = layout(salt ^ 0x7e, me, rc, rd);
}

// Received blocks come from the right sender and position; gaps and the
// guard keep their fill. Returns mismatches.
size_t check_v(const unsigned char *recv, const unsigned char *before, tpr_dtype dt, uint64_t salt,
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

void case_all_to_allv(tpr_dtype dt, size_t maxc, int mem) {
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
void case_broadcast(tpr_dtype dt, size_t count, int root, int variant, int mem) {
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
void case_send_recv(tpr_dtype dt, size_t count, int mem) {
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

// --- nonblocking ----------------------------------------------------------

typedef struct nb_case {
  bool gather;
  tpr_dtype dt;
  tpr_red_op op;
  bool in_place;
  uint64_t salt;
  size_t bytes, total;           // one block, n blocks
  unsigned char *send, *recv;    // recv inside send (reduce_scatter) or send inside recv (gather) in place
  unsigned char *base;           // the allocation that holds both in place
  tpr_comm_request req;
} nb_case;

static const struct {
  bool gather;
  tpr_dtype dt;
  tpr_red_op op;
  bool in_place;
} nb_mix[] = {
    {true, TPR_F32, TPR_SUM, false},  {false, TPR_F32, TPR_SUM, false}, {false, TPR_BF16, TPR_SUM, true},
    {true, TPR_I64, TPR_SUM, true},   {false, TPR_I32, TPR_MAX, true},  {false, TPR_F16, TPR_MIN, false},
    {false, TPR_I64, TPR_SUM, false}, {true, TPR_BF16, TPR_SUM, false},
};
#define NB_K (sizeof nb_mix / sizeof nb_mix[0])

// Buffers of case k filled with its inputs (guards after each output).
static void nb_setup(nb_case *c, size_t count) {
  c->bytes = count * tpr_dtype_size(c->dt), c->total = c->bytes * (size_t)N;
  if (c->gather) {
    c->base = c->recv = tb_alloc(c->total, false);
    c->send = c->in_place ? c->recv + (size_t)R * c->bytes : tb_alloc(c->bytes, false);
    fill_move(c->send, c->dt, c->salt, R, 0, count);
    guard_set(c->recv + c->total);
  } else {
    c->base = c->send = tb_alloc(c->total, false);
    c->recv = c->in_place ? c->send + (size_t)R * c->bytes : tb_alloc(c->bytes, false);
    fill_red(c->send, c->dt, c->op, c->salt, R, 0, (size_t)N * count);
    if (!c->in_place) guard_set(c->recv + c->bytes);
  }
}

static void nb_release(nb_case *c) {
  if (!c->in_place) tb_free(c->gather ? c->send : c->recv);
  tb_free(c->base);
}

static tpr_status nb_start(nb_case *c, size_t count) {
  return c->gather ? tpr_comm_iall_gather(comm, c->send, c->recv, count, c->dt, &c->req)
                   : tpr_comm_ireduce_scatter(comm, c->send, c->recv, count, c->dt, c->op, &c->req);
}

void case_nonblocking(size_t count) {
  nb_case cs[NB_K], bl[NB_K];
  int order[NB_K];
  uint64_t salt = ++case_no;
  for (size_t k = 0; k < NB_K; k++) {
    cs[k] = (nb_case){.gather = nb_mix[k].gather, .dt = nb_mix[k].dt, .op = nb_mix[k].op,
                      .in_place = nb_mix[k].in_place, .salt = salt * 64 + k};
    nb_setup(&cs[k], count);
    order[k] = (int)k;
  }
  // Every rank starts them in the same order; each completes them in its
  // own random order (MPI allows it), the first through a test() loop.
  for (size_t k = NB_K - 1; k > 0; k--) {
    size_t j = H(salt, (uint64_t)R + 1000, k) % (k + 1);
    int t = order[k];
    order[k] = order[j], order[j] = t;
  }
  for (size_t k = 0; k < NB_K; k++) EXPECT_OK(nb_start(&cs[k], count));
  bool done = false;
  long polls = 0;
  while (!done && polls < 100000000L) {
    tpr_status rc = tpr_comm_test(cs[order[0]].req, &done);
    polls++;
    if (rc != TPR_OK) {
      EXPECT_OK(rc);
      break;
    }
  }
  EXPECT(done, "nonblocking count %zu: test() never reported completion", count);
  for (size_t k = 0; k < NB_K; k++) EXPECT_OK(tpr_comm_wait(cs[order[k]].req));
  // Exact results, and the blocking call on the same inputs, bit for bit.
  for (size_t k = 0; k < NB_K; k++) {
    nb_case *c = &cs[k];
    char what[160];
    snprintf(what, sizeof what, "i%s %s %s count %zu%s (completed %s)", c->gather ? "all_gather" : "reduce_scatter",
             tpr_dtype_name(c->dt), c->gather ? "" : op_name(c->op), count, c->in_place ? " in place" : "",
             k == (size_t)order[0] ? "by test" : "by wait");
    if (c->gather) {
      for (int s = 0; s < N; s++)
        EXPECT(check_moved(c->recv + (size_t)s * c->bytes, c->dt, c->salt, s, 0, count, what) == 0, "%s: block %d",
               what, s);
      EXPECT(guard_ok(c->recv + c->total), "%s: wrote past recv", what);
    } else {
      EXPECT(check_reduced(c->recv, c->dt, c->op, c->salt, N, (size_t)R * count, count, what) == 0,
             "%s: wrong result", what);
      if (!c->in_place) EXPECT(guard_ok(c->recv + c->bytes), "%s: wrote past recv", what);
    }
    bl[k] = *c;
    nb_setup(&bl[k], count);
    EXPECT_OK(c->gather ? tpr_comm_all_gather(comm, bl[k].send, bl[k].recv, count, c->dt)
                        : tpr_comm_reduce_scatter(comm, bl[k].send, bl[k].recv, count, c->dt, c->op));
    size_t out = c->gather ? c->total : c->bytes;
    EXPECT(memcmp(c->recv, bl[k].recv, out) == 0, "%s: differs from the blocking call", what);
    nb_release(&bl[k]);
    nb_release(c);
  }
  if (R == 0 && count >= 1000)
    printf("# nonblocking: %zu requests outstanding (count %zu), first completed after %ld test() polls\n", NB_K,
           count, polls);
}
