// Shared by the libFuzzer targets (tests/fuzz/fuzz_*.c) and their replay
// driver (replay.c). Each target defines LLVMFuzzerTestOneInput; parsers
// that take a path get the input written to a per-process scratch directory
// (on /dev/shm when there is one: a file per execution must not cost a disk
// write). A target returns 0 for every input: a refused input is a clean
// TPR_ERR_*; only a crash, a sanitizer report, a hang or a broken invariant
// (fz_require) is a finding.
#ifndef TPR_FUZZ_COMMON_H
#define TPR_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// The scratch directory (created on first use, removed at exit).
const char *fz_dir(void);
// Writes data to fz_dir()/name (replacing it); returns the path, valid
// until the next call.
const char *fz_write(const char *name, const uint8_t *data, size_t size);
// tests/fixtures of the source tree the binary was built from.
const char *fz_fixtures(void);
// An invariant the target checks on what the parser accepted: abort (a
// finding) with the message when it does not hold.
void fz_require(int ok, const char *what);

#endif
