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

#endif
