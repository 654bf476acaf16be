#include "host_mem.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

uint64_t tpr_host_mem_available(void) {
  const char *dbg = getenv("TPR_DEBUG_MEM_AVAILABLE");
  if (dbg && *dbg) return strtoull(dbg, NULL, 10);
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  unsigned long long kib = 0;
  bool found = false;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      found = true;
      break;
    }
  if (f) fclose(f);
  if (found) return (uint64_t)kib * 1024u;
  // Kernels before 3.14 have no MemAvailable: free plus buffers is close.
  struct sysinfo si;
  if (sysinfo(&si) != 0) return 0;
  return ((uint64_t)si.freeram + (uint64_t)si.bufferram) * (uint64_t)(si.mem_unit ? si.mem_unit : 1);
}

tpr_status tpr_host_mem_check(uint64_t bytes, const char *what) {
  return tpr_host_mem_check_node(bytes, 1, tpr_host_mem_available(), what);
}

tpr_status tpr_host_mem_check_node(uint64_t bytes, int ranks, uint64_t avail, const char *what) {
  if (ranks < 1) ranks = 1;
  uint64_t total;
  if (__builtin_mul_overflow(bytes, (uint64_t)ranks, &total)) total = UINT64_MAX;
  if (!avail || total <= avail) return TPR_OK;
  const double gib = 1073741824.0;
  if (ranks == 1)
    return TPR_FAIL(TPR_ERR_OOM,
                    "%s needs %llu bytes (%.2f GiB) of host memory; only %llu bytes (%.2f GiB) are available "
                    "(MemAvailable in /proc/meminfo): refused before allocating",
                    what, (unsigned long long)bytes, (double)bytes / gib, (unsigned long long)avail,
                    (double)avail / gib);
  return TPR_FAIL(TPR_ERR_OOM,
                  "%s needs %llu bytes (%.2f GiB) of host memory on each of the %d ranks of this node, %.2f GiB in "
                  "all; only %llu bytes (%.2f GiB) are available (MemAvailable in /proc/meminfo): refused before "
                  "allocating (fewer ranks per node, or more tp/ep to shard it further)",
                  what, (unsigned long long)bytes, (double)bytes / gib, ranks, (double)total / gib,
                  (unsigned long long)avail, (double)avail / gib);
}
