// A progress line for long work (loading or writing a checkpoint, training,
// a scaling sweep): redrawn in place on a terminal, at most 10 times a
// second, and erased when the work ends, so what stays on screen is exactly
// what the command prints without a terminal.
//
//   loading weights  [########------------]  41%  1.19/2.90 GiB  310 MiB/s  ETA 0:06
//
// Off unless the process turned it on (tpr_progress_enable: the command
// line does so on rank 0 when stderr is a terminal and --json is off), so
// library code reports progress unconditionally and costs nothing in tests,
// pipes, logs or on other ranks. Not thread-safe: one thread draws.
#ifndef TPR_PROGRESS_H
#define TPR_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

// Whether a progress line would be seen: stderr is a terminal (under
// mpirun: mpirun's stderr), TERM is not "dumb"; TPR_PROGRESS=0 / 1 force
// the answer (1 for a launcher tpr cannot see through, e.g. a remote rank 0).
bool tpr_progress_terminal(void);
// Turns drawing on or off for the whole process; out: where to draw (NULL:
// stderr). Tests pass a file to read what was drawn.
void tpr_progress_enable(bool on, FILE *out);
bool tpr_progress_enabled(void);

typedef struct tpr_progress {
  bool on, drawn;
  char what[48];
  char unit[16];   // "" : bytes (shown as KiB/MiB/GiB and a rate); else a count's unit ("steps")
  uint64_t total;  // 0: unknown (no bar, no ETA)
  uint64_t done;
  double t0, last_draw;
  char note[96];   // shown after the counts ("loss 3.2101")
} tpr_progress;

// unit NULL or "": bytes.
void tpr_progress_begin(tpr_progress *p, const char *what, uint64_t total, const char *unit);
// done: units finished so far; note: NULL keeps the last one. Draws when
// 0.1 s have passed since the last drawing, or the work is complete.
void tpr_progress_update(tpr_progress *p, uint64_t done, const char *note);
// Erases the line (if drawn) so other output can be printed; the next
// update draws it again below.
void tpr_progress_clear(tpr_progress *p);
// Erases the line; the work is over.
void tpr_progress_end(tpr_progress *p);

// The line as drawn (no control characters), for tests: width columns at most.
void tpr_progress_format(const tpr_progress *p, double now, int width, char *buf, size_t cap);

#endif
