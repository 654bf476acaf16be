// Host memory headroom: a request larger than the machine must fail with a
// clear message before anything is allocated, not end in the kernel's OOM
// killer once the pages are touched (Linux overcommits, so malloc of a size
// far beyond RAM often succeeds and the process dies later).
#ifndef TPR_HOST_MEM_H
#define TPR_HOST_MEM_H

#include <stdint.h>

#include "status.h"

// Bytes the kernel says can be allocated without swapping: MemAvailable from
// /proc/meminfo, else sysinfo's free + buffer RAM; 0 when neither answers.
// TPR_DEBUG_MEM_AVAILABLE=N (bytes) replaces the answer (tests only).
uint64_t tpr_host_mem_available(void);

// TPR_ERR_OOM naming `what`, the bytes asked and the bytes available when
// bytes exceed the available memory (an unknown amount never refuses).
tpr_status tpr_host_mem_check(uint64_t bytes, const char *what);

// The node's check: `ranks` processes of one node each ask `bytes` of the
// same memory, `avail` (MemAvailable as every one of them read it before
// any allocated). TPR_ERR_OOM naming the per-rank and the total bytes when
// ranks x bytes exceed avail; ranks 1 is tpr_host_mem_check's message.
tpr_status tpr_host_mem_check_node(uint64_t bytes, int ranks, uint64_t avail, const char *what);

#endif
