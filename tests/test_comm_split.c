// tpr_comm_split over the mpi world (np 1, 3, 4): groups by color, order by
// (key, parent rank), color < 0 -> no communicator, splits of splits. Each
// group is checked against the membership every rank computes for itself:
// size, rank, world ranks in order, and collectives inside the group (an
// all_reduce summing world ranks, an all_gather of world ranks, a broadcast
// and a ring of send/recv) with exact expected values.
//
// As in test_comm_mpi.c, a rank never stops early: failed checks are
// counted, and all ranks fail each test together (comm_cases.h).
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/comm_mpi.h"
#include "comm_cases.h"  // EXPECT, agree: every rank passes or fails together
#include "mpi_util.h"

static tpr_comm_t world;

// The expected group of world rank w: members (world ranks) sorted by
// (key, parent rank), as tpr_comm_split promises. parent[i] is the world rank
// of parent rank i; color/key are functions of the parent rank.
typedef int (*rank_fn)(int parent_rank, int parent_size);

static int expected_members(const int *parent, int psize, int my_prank, rank_fn color, rank_fn key, int *members) {
  int c = color(my_prank, psize), n = 0, pr[64];
  if (c < 0) return 0;
  for (int i = 0; i < psize; i++)
    if (color(i, psize) == c) pr[n++] = i;
  for (int a = 1; a < n; a++)  // insertion sort by (key, parent rank)
    for (int b = a; b > 0; b--) {
      int x = pr[b - 1], y = pr[b];
      if (key(x, psize) < key(y, psize) || (key(x, psize) == key(y, psize) && x < y)) break;
      pr[b - 1] = y, pr[b] = x;
    }
  for (int i = 0; i < n; i++) members[i] = parent[pr[i]];
  return n;
}

// Everything about group g (possibly NULL) against the expected members.
static void check_group(tpr_comm_t g, const int *members, int n, const char *name) {
  if (n == 0) {
    EXPECT(g == NULL, "%s: a rank with color < 0 got a communicator", name);
    return;
  }
  EXPECT(g != NULL, "%s: no communicator", name);
  if (!g) return;
  int me = -1;
  for (int i = 0; i < n; i++)
    if (members[i] == R) me = i;
  EXPECT(tpr_comm_size(g) == n, "%s: size %d, want %d", name, tpr_comm_size(g), n);
  EXPECT(tpr_comm_rank(g) == me, "%s: rank %d, want %d", name, tpr_comm_rank(g), me);
  EXPECT(strcmp(tpr_comm_name(g), name) == 0, "name %s, want %s", tpr_comm_name(g), name);
  EXPECT(strcmp(tpr_comm_backend(g), "mpi") == 0, "%s: backend %s", name, tpr_comm_backend(g));
  for (int i = 0; i < n; i++)
    EXPECT(tpr_comm_world_rank(g, i) == members[i], "%s: world rank of %d is %d, want %d", name, i,
           tpr_comm_world_rank(g, i), members[i]);
  EXPECT(tpr_comm_world_rank(g, n) == -1 && tpr_comm_world_rank(g, -1) == -1, "%s: out of range", name);
  MPI_Comm h = tpr__comm_mpi_handle(g);
  int hs = -1, hr = -1;
  if (h != MPI_COMM_NULL) MPI_Comm_size(h, &hs), MPI_Comm_rank(h, &hr);
  EXPECT(hs == n && hr == me, "%s: the MPI communicator is %d of %d", name, hr, hs);
  if (tpr_comm_size(g) != n || tpr_comm_rank(g) != me) return;  // the collectives below would hang

  // Sum of world ranks (i64 and f32: small integers, exact).
  int64_t want = 0, sum = R;
  for (int i = 0; i < n; i++) want += members[i];
  EXPECT_OK(tpr_comm_all_reduce(g, &sum, &sum, 1, TPR_I64, TPR_SUM));
  EXPECT(sum == want, "%s: sum of world ranks %lld, want %lld", name, (long long)sum, (long long)want);
  float fsum = (float)R, fmax = (float)R;
  EXPECT_OK(tpr_comm_all_reduce(g, &fsum, &fsum, 1, TPR_F32, TPR_SUM));
  EXPECT_OK(tpr_comm_all_reduce(g, &fmax, &fmax, 1, TPR_F32, TPR_MAX));
  int wmax = members[0];
  for (int i = 1; i < n; i++) wmax = members[i] > wmax ? members[i] : wmax;
  EXPECT(fsum == (float)want && fmax == (float)wmax, "%s: f32 sum %g max %g", name, fsum, fmax);
  // The group's order, as the members see it.
  int32_t mine = R, all[64];
  EXPECT_OK(tpr_comm_all_gather(g, &mine, all, 1, TPR_I32));
  for (int i = 0; i < n; i++) EXPECT(all[i] == members[i], "%s: gathered[%d] = %d, want %d", name, i, all[i], members[i]);
  // Broadcast from the last member; a ring of send/recv.
  int64_t b = me == n - 1 ? 1000 + R : -1;
  EXPECT_OK(tpr_comm_broadcast(g, &b, &b, 1, TPR_I64, n - 1));
  EXPECT(b == 1000 + members[n - 1], "%s: broadcast got %lld", name, (long long)b);
  if (n > 1) {
    int32_t out = R, in = -1, next = (me + 1) % n, prev = (me + n - 1) % n;
    for (int phase = 0; phase < 2; phase++) {
      if ((phase == 0) == (me % 2 == 0)) EXPECT_OK(tpr_comm_send(g, &out, 1, TPR_I32, next));
      else EXPECT_OK(tpr_comm_recv(g, &in, 1, TPR_I32, prev));
    }
    EXPECT(in == members[prev], "%s: ring got %d from group rank %d, want %d", name, in, prev, members[prev]);
  }
  EXPECT_OK(tpr_comm_barrier(g));
}

static int mod2(int r, int n) { return r % 2; }
static int half(int r, int n) { return r / 2; }
static int zero(int r, int n) { return 0; }
static int reversed(int r, int n) { return n - 1 - r; }
static int negated(int r, int n) { return -r; }
static int last_out(int r, int n) { return r == n - 1 ? -1 : 0; }
static int odd_out(int r, int n) { return r % 2 ? -1 : 1 + r % 3; }
static int shuffled(int r, int n) { return (r * 5 + 3) % 7; }  // ties when n > 7; order by parent rank then

static void split_and_check(tpr_comm_t parent, const int *pworld, rank_fn color, rank_fn key, const char *name) {
  int psize = tpr_comm_size(parent), prank = tpr_comm_rank(parent), members[64];
  int n = expected_members(pworld, psize, prank, color, key, members);
  tpr_comm_t g = NULL;
  EXPECT_OK(tpr_comm_split(parent, color(prank, psize), key(prank, psize), name, &g));
  check_group(g, members, n, name);
  tpr_comm_free(g);
}

static int world_ranks[64];

static void test_split_world(void **state) {
  const struct {
    rank_fn color, key;
    const char *name;
  } cases[] = {
      {mod2, zero, "mod2"},          {mod2, reversed, "mod2_rev"}, {half, zero, "half"},
      {half, negated, "half_rev"},   {zero, reversed, "all_rev"}, {zero, zero, "all"},
      {last_out, zero, "last_out"},  {odd_out, shuffled, "odd_out"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    split_and_check(world, world_ranks, cases[k].color, cases[k].key, cases[k].name);
  agree();
}

// A split of a split: world ranks stay world ranks (not parent ranks).
static void test_split_nested(void **state) {
  int members[64];
  int n = expected_members(world_ranks, N, R, zero, reversed, members);  // world in reverse order
  tpr_comm_t rev = NULL;
  EXPECT_OK(tpr_comm_split(world, 0, N - 1 - R, "rev", &rev));
  check_group(rev, members, n, "rev");
  if (rev) {
    split_and_check(rev, members, mod2, zero, "rev_mod2");
    split_and_check(rev, members, half, reversed, "rev_half_rev");
    split_and_check(rev, members, last_out, negated, "rev_last_out");
  }
  tpr_comm_free(rev);
  // Groups live side by side: collectives on one do not disturb another.
  tpr_comm_t a = NULL, b = NULL;
  EXPECT_OK(tpr_comm_split(world, R % 2, 0, "a", &a));
  EXPECT_OK(tpr_comm_split(world, R / 2, 0, "b", &b));
  int ma[64], mb[64];
  int na = expected_members(world_ranks, N, R, mod2, zero, ma), nb = expected_members(world_ranks, N, R, half, zero, mb);
  for (int rep = 0; rep < 3; rep++) check_group(a, ma, na, "a"), check_group(b, mb, nb, "b");
  tpr_comm_free(a);
  tpr_comm_free(b);
  agree();
}

// Split of the self communicator: a world of one, or nothing.
static void test_split_self(void **state) {
  tpr_comm_t self = NULL, g = NULL;
  EXPECT_OK(tpr_comm_init_self(&self));
  if (self) {
    EXPECT_OK(tpr_comm_split(self, 3, 9, "solo", &g));
    EXPECT(g && tpr_comm_size(g) == 1 && tpr_comm_rank(g) == 0 && strcmp(tpr_comm_name(g), "solo") == 0,
           "self split");
    if (g) EXPECT(tpr_comm_world_rank(g, 0) == 0, "self split world rank");
    tpr_comm_free(g);
    g = (tpr_comm_t)1;
    EXPECT_OK(tpr_comm_split(self, -1, 0, "none", &g));
    EXPECT(g == NULL, "color < 0 gives no communicator");
  }
  tpr_comm_free(self);
  agree();
}

int main(int argc, char **argv) {
  world = tt_mpi_world(&argc, &argv);
  R = tpr_comm_rank(world), N = tpr_comm_size(world);
  if (N > 64) {
    fprintf(stderr, "this test handles up to 64 ranks\n");
    return 1;
  }
  for (int i = 0; i < N; i++) world_ranks[i] = i;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_world),
      cmocka_unit_test(test_split_nested),
      cmocka_unit_test(test_split_self),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(world, failed);
}
