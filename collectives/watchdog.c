// The watchdog: no silent hangs. One thread per process watches the call the
// main thread is in (the front records it on entry and clears it on return).
// When a call has run longer than the timeout, the thread asks every other
// rank's watchdog, over its own duplicate of MPI_COMM_WORLD, what that rank
// is doing, prints which ranks of the group had arrived and where the others
// are, and aborts the whole job. Peers answer while their main thread is
// blocked in MPI, which needs MPI_THREAD_MULTIPLE; with less, the report
// names only this rank's call.
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"

enum { TAG_QUERY = 7101, TAG_REPLY = 7102, WATCH_EXIT_CODE = 124 };

// A rank's state as it travels in a reply (same binary on every rank).
typedef struct watch_state {
  int32_t op;            // tpr__coll_op; TPR__OP_NONE when not in a call
  int32_t peer;          // send/recv peer (group rank), broadcast root, or -1
  int32_t group_first;   // world rank of the group's rank 0: with the name, the group's identity
  int32_t group_size;
  int32_t dtype;
  int32_t world_rank;
  int64_t seq, count;
  double elapsed_s;      // how long the call has run (filled when snapshotted)
  char group[24];
} watch_state;

static struct {
  atomic_bool running, stop;
  pthread_t thread;
  pthread_mutex_t mu;
  MPI_Comm comm;
  int world_rank, world_size, multiple;
  double timeout_s, poll_s;
  watch_state now;     // guarded by mu
  double since;        // when `now` began, guarded by mu
  tpr_comm_t group;    // the communicator of the current call, guarded by mu
} wd = {.mu = PTHREAD_MUTEX_INITIALIZER, .comm = MPI_COMM_NULL};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// On every collective, so it only stores: the group's name and identity are
// read from the communicator (alive while the call is) when someone asks.
void tpr__watch_enter(tpr_comm_t c, tpr__coll_op op, uint64_t seq, size_t count, tpr_dtype dt, int peer) {
  if (!atomic_load_explicit(&wd.running, memory_order_relaxed)) return;
  pthread_mutex_lock(&wd.mu);
  wd.now.op = op, wd.now.peer = peer, wd.now.dtype = dt;
  wd.now.seq = (int64_t)seq, wd.now.count = (int64_t)count;
  wd.group = c;
  wd.since = now_s();
  pthread_mutex_unlock(&wd.mu);
}

void tpr__watch_leave(void) {
  if (!atomic_load_explicit(&wd.running, memory_order_relaxed)) return;
  pthread_mutex_lock(&wd.mu);
  wd.now.op = TPR__OP_NONE;
  wd.group = NULL;
  pthread_mutex_unlock(&wd.mu);
}

static watch_state snapshot(void) {
  pthread_mutex_lock(&wd.mu);
  watch_state s = wd.now;
  s.world_rank = wd.world_rank;
  s.elapsed_s = s.op != TPR__OP_NONE ? now_s() - wd.since : 0;
  if (wd.group) {
    s.group_first = wd.group->world_ranks[0];
    s.group_size = wd.group->size;
    snprintf(s.group, sizeof s.group, "%s", wd.group->name);
  }
  pthread_mutex_unlock(&wd.mu);
  return s;
}

// Answers a pending query, if any, and re-arms the receive.
static void serve_queries(MPI_Request *query, int *query_buf) {
  int done = 0;
  MPI_Status st;
  while (*query != MPI_REQUEST_NULL && MPI_Test(query, &done, &st) == MPI_SUCCESS && done) {
    watch_state s = snapshot();
    MPI_Send(&s, (int)sizeof s, MPI_BYTE, st.MPI_SOURCE, TAG_REPLY, wd.comm);
    MPI_Irecv(query_buf, 1, MPI_INT, MPI_ANY_SOURCE, TAG_QUERY, wd.comm, query);
  }
}

static int describe_state(const watch_state *s, char *buf, size_t cap) {
  if (s->op == TPR__OP_NONE) return snprintf(buf, cap, "not in any collective");
  if (s->op == TPR__OP_BARRIER)
    return snprintf(buf, cap, "in barrier #%lld on group %s of %d for %.1f s", (long long)s->seq, s->group,
                    s->group_size, s->elapsed_s);
  const char *dt = tpr_dtype_valid((tpr_dtype)s->dtype) ? tpr_dtype_name((tpr_dtype)s->dtype) : "?";
  if (s->op == TPR__OP_SEND || s->op == TPR__OP_RECV)
    return snprintf(buf, cap, "in %s %s rank %d of group %s (count %lld %s) for %.1f s", tpr__coll_op_name(s->op),
                    s->op == TPR__OP_SEND ? "to" : "from", s->peer, s->group, (long long)s->count, dt, s->elapsed_s);
  return snprintf(buf, cap, "in %s #%lld on group %s of %d (count %lld %s) for %.1f s", tpr__coll_op_name(s->op),
                  (long long)s->seq, s->group, s->group_size, (long long)s->count, dt, s->elapsed_s);
}

static bool same_call(const watch_state *a, const watch_state *b) {
  return a->op == b->op && a->seq == b->seq && a->group_first == b->group_first && !strcmp(a->group, b->group);
}

// The call most members of the group are in (ties: the lowest rank's): the
// one the others are "missing" from, whichever rank prints the report.
static const watch_state *majority_call(tpr_comm_t group, const watch_state *st, const int *got, int n) {
  const watch_state *best = NULL;
  int best_votes = 0;
  for (int g = 0; g < group->size; g++) {
    int r = group->world_ranks[g], votes = 0;
    if (r >= n || !got[r] || st[r].op == TPR__OP_NONE || st[r].op == TPR__OP_SEND || st[r].op == TPR__OP_RECV)
      continue;
    for (int h = 0; h < group->size; h++) {
      int q = group->world_ranks[h];
      votes += q < n && got[q] && same_call(&st[q], &st[r]);
    }
    if (votes > best_votes) best = &st[r], best_votes = votes;
  }
  return best;
}

// Every rank that times out prints the whole picture, so the first report
// to reach the terminal (the job dies with it) names the missing ranks.
static void print_report(const watch_state *me, tpr_comm_t group, const watch_state *st, const int *got, int n) {
  char what[256], line[1024], desc[160];
  describe_state(me, what, sizeof what);
  fprintf(stderr, "tpr watchdog: rank %d: %s: exceeded --comm-timeout %.1f s; aborting the job\n", wd.world_rank,
          what, wd.timeout_s);
  if (!group) return;
  if (me->op == TPR__OP_SEND || me->op == TPR__OP_RECV) {
    int r = me->peer >= 0 && me->peer < group->size ? group->world_ranks[me->peer] : -1;
    if (r >= 0 && r < n && got[r]) describe_state(&st[r], what, sizeof what);
    else snprintf(what, sizeof what, "no answer");
    fprintf(stderr, "tpr watchdog: rank %d: peer rank %d: %s\n", wd.world_rank, r, what);
    return;
  }
  const watch_state *call = majority_call(group, st, got, n);
  if (!call) call = me;
  int used = snprintf(line, sizeof line, "tpr watchdog: rank %d: group %s: arrived at %s #%lld:", wd.world_rank,
                      tpr__comm_describe(group, desc, sizeof desc), tpr__coll_op_name(call->op), (long long)call->seq);
  for (int g = 0; g < group->size && used > 0 && (size_t)used + 12 < sizeof line; g++) {
    int r = group->world_ranks[g];
    if (r < n && got[r] && same_call(&st[r], call)) used += snprintf(line + used, sizeof line - (size_t)used, " %d", r);
  }
  fprintf(stderr, "%s\n", line);
  for (int g = 0; g < group->size; g++) {
    int r = group->world_ranks[g];
    if (r < n && got[r] && same_call(&st[r], call)) continue;
    if (r < n && got[r]) describe_state(&st[r], what, sizeof what);
    else snprintf(what, sizeof what, "%s", wd.multiple ? "no answer (exited or unresponsive)"
                                                         : "unknown (MPI without MPI_THREAD_MULTIPLE)");
    fprintf(stderr, "tpr watchdog: rank %d: missing from %s #%lld: rank %d: %s\n", wd.world_rank,
            tpr__coll_op_name(call->op), (long long)call->seq, r, what);
  }
}

// Asks every other rank where it is (waiting at most `grace` seconds, still
// answering peers that ask us), prints the report and aborts the job.
static void report_and_abort(MPI_Request *query, int *query_buf, const watch_state *me, tpr_comm_t group) {
  enum { MAX_ASK = 4096 };
  int n = wd.world_size < MAX_ASK ? wd.world_size : MAX_ASK;
  static watch_state replies[MAX_ASK];
  static MPI_Request reqs[2 * MAX_ASK];
  static int got[MAX_ASK];
  int ask = 1;
  for (int r = 0; r < n; r++) {
    got[r] = r == wd.world_rank;
    reqs[2 * r] = reqs[2 * r + 1] = MPI_REQUEST_NULL;
    if (got[r] || !wd.multiple) continue;
    MPI_Isend(&ask, 1, MPI_INT, r, TAG_QUERY, wd.comm, &reqs[2 * r]);
    MPI_Irecv(&replies[r], (int)sizeof replies[r], MPI_BYTE, r, TAG_REPLY, wd.comm, &reqs[2 * r + 1]);
  }
  replies[wd.world_rank] = *me;
  double grace = wd.timeout_s < 2.0 ? 1.0 : 2.0, until = now_s() + grace;
  for (int pending = wd.multiple; pending && now_s() < until;) {
    serve_queries(query, query_buf);
    pending = 0;
    for (int r = 0; r < n; r++) {
      int done = got[r];
      if (!done && MPI_Test(&reqs[2 * r + 1], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) got[r] = 1;
      pending |= !got[r];
    }
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  print_report(me, group, replies, got, n);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, WATCH_EXIT_CODE);
}

static void *watch_main(void *arg) {
  (void)arg;
  int query_buf = 0;
  MPI_Request query = MPI_REQUEST_NULL;
  if (wd.multiple) MPI_Irecv(&query_buf, 1, MPI_INT, MPI_ANY_SOURCE, TAG_QUERY, wd.comm, &query);
  struct timespec ts = {(time_t)wd.poll_s, (long)((wd.poll_s - (double)(time_t)wd.poll_s) * 1e9)};
  while (!atomic_load(&wd.stop)) {
    if (wd.multiple) serve_queries(&query, &query_buf);
    pthread_mutex_lock(&wd.mu);
    bool late = wd.now.op != TPR__OP_NONE && now_s() - wd.since > wd.timeout_s;
    tpr_comm_t group = wd.group;
    pthread_mutex_unlock(&wd.mu);
    if (late) {
      watch_state me = snapshot();
      report_and_abort(&query, &query_buf, &me, group);
    }
    nanosleep(&ts, NULL);
  }
  if (query != MPI_REQUEST_NULL) {
    MPI_Cancel(&query);
    MPI_Wait(&query, MPI_STATUS_IGNORE);
  }
  return NULL;
}

tpr_status tpr_comm_watchdog_start(double timeout_s) {
  if (atomic_load(&wd.running)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "watchdog: already running");
  if (!(timeout_s > 0)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "watchdog: timeout must be > 0 s, got %g", timeout_s);
  int inited = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&inited);
  if (!inited) return TPR_OK;  // no MPI: a world of one cannot hang in a collective
  MPI_Comm_size(MPI_COMM_WORLD, &wd.world_size);
  if (wd.world_size < 2) return TPR_OK;
  MPI_Comm_rank(MPI_COMM_WORLD, &wd.world_rank);
  MPI_Query_thread(&level);
  wd.multiple = level == MPI_THREAD_MULTIPLE;
  int err = MPI_Comm_dup(MPI_COMM_WORLD, &wd.comm);
  if (err != MPI_SUCCESS) return TPR_FAIL(TPR_ERR_COMM, "watchdog: MPI_Comm_dup failed (%d)", err);
  wd.timeout_s = timeout_s;
  wd.poll_s = timeout_s / 20 < 0.05 ? timeout_s / 20 : 0.05;
  if (wd.poll_s < 0.001) wd.poll_s = 0.001;
  wd.now.op = TPR__OP_NONE;
  atomic_store(&wd.stop, false);
  atomic_store(&wd.running, true);
  if (pthread_create(&wd.thread, NULL, watch_main, NULL) != 0) {
    atomic_store(&wd.running, false);
    MPI_Comm_free(&wd.comm);
    return TPR_FAIL(TPR_ERR_INTERNAL, "watchdog: cannot start its thread");
  }
  return TPR_OK;
}

void tpr_comm_watchdog_stop(void) {
  if (!atomic_load(&wd.running)) return;
  atomic_store(&wd.stop, true);
  pthread_join(wd.thread, NULL);
  atomic_store(&wd.running, false);
  MPI_Comm_free(&wd.comm);
}
