// The processes tpr bench serve runs: the server and the tpr bench model
// baseline, each either tpr alone (one rank) or under mpirun.
#ifndef TPR_BENCH_SERVE_PROC_H
#define TPR_BENCH_SERVE_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

// A command line being built (argv, NULL-terminated once built).
#define TPR_PROC_ARGV_MAX 256
typedef struct tpr_proc_argv {
  char *v[TPR_PROC_ARGV_MAX + 1];
  int n;
  bool overflow;
} tpr_proc_argv;

// Appends a copy of arg (or of a formatted one).
void tpr_proc_push(tpr_proc_argv *a, const char *arg);
void tpr_proc_pushf(tpr_proc_argv *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Starts a tpr command line: `tpr` alone for np = 1, else
// `mpirun -np NP --oversubscribe tpr`.
void tpr_proc_push_launcher(tpr_proc_argv *a, int np, const char *mpirun, const char *tpr);
// The command as one line, for the progress messages.
const char *tpr_proc_line(const tpr_proc_argv *a, char *buf, size_t cap);
void tpr_proc_argv_free(tpr_proc_argv *a);

typedef struct tpr_proc {
  pid_t pid;
  bool mpirun;  // pid is mpirun; the ranks are its children
} tpr_proc;

// Starts a->v with stdin from /dev/null, stdout to out_path and stderr to
// err_path (the same file when the paths are equal). false (and a message)
// when it cannot be started; a program that is not found exits 127.
bool tpr_proc_start(const tpr_proc_argv *a, bool mpirun, const char *out_path, const char *err_path, tpr_proc *p);

// An exit status as a number: the exit code, or -signal when killed.
int tpr_proc_status_code(int wait_status);
// Waits for p to exit; its status code.
int tpr_proc_wait(const tpr_proc *p);

typedef enum tpr_port_wait { TPR_PORT_READY, TPR_PORT_EXITED, TPR_PORT_TIMEOUT } tpr_port_wait;
// Polls port_file (the port and a newline, written by tpr serve --port-file
// once it listens) until it holds a port, p exits (*code: its status code)
// or timeout_s passes.
tpr_port_wait tpr_proc_wait_port_file(const tpr_proc *p, const char *port_file, double timeout_s, int *port,
                                      int *code);

typedef struct tpr_proc_stop {
  int code;       // the status code
  int signalled;  // processes sent SIGTERM (the ranks under mpirun)
  bool killed;    // still running after the timeout: SIGKILL
} tpr_proc_stop;
// Stops a server: SIGTERM to the process, or under mpirun to its ranks (Open
// MPI 4.1's mpirun exits 1 on a SIGTERM of its own, whatever its ranks do;
// ranks that exit 0 make it exit 0), then waits for it; past timeout_s every
// one gets SIGKILL.
tpr_proc_stop tpr_proc_stop_server(const tpr_proc *p, double timeout_s);

// The last `lines` lines of a file, to stderr, each indented.
void tpr_proc_print_tail(const char *path, int lines);

#endif
