#ifndef ALLOCATION_COUNTER_H
#define ALLOCATION_COUNTER_H

/// Heap allocations (malloc, calloc, realloc, posix_memalign, aligned_alloc) made on the
/// calling thread while counting is on. The hooks are linked into the test executable: they
/// replace glibc's entry points process-wide and forward to glibc's own (`__libc_*`).
void sg_allocations_start(void);
/// Stops counting on this thread and returns how many allocations it made since the start.
long sg_allocations_stop(void);

#endif
