// Counts heap allocations per thread for the allocation tests (AllocationCounter.h). Every
// allocation of the process comes through here; only the counting thread's are counted, in
// thread-local variables (initial-exec TLS in the executable: reading them never allocates).
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include "AllocationCounter.h"

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

static __thread long counted = 0;
static __thread int counting = 0;

void sg_allocations_start(void) {
    counted = 0;
    counting = 1;
}

long sg_allocations_stop(void) {
    counting = 0;
    return counted;
}

void *malloc(size_t size) {
    if (counting) counted++;
    return __libc_malloc(size);
}

void *calloc(size_t count, size_t size) {
    if (counting) counted++;
    return __libc_calloc(count, size);
}

// A realloc may move the block: counted as an allocation (a buffer growing is what it costs).
void *realloc(void *pointer, size_t size) {
    if (counting) counted++;
    return __libc_realloc(pointer, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
    if (counting) counted++;
    void *pointer = __libc_memalign(alignment, size);
    if (pointer == NULL) return ENOMEM;
    *out = pointer;
    return 0;
}

void *aligned_alloc(size_t alignment, size_t size) {
    if (counting) counted++;
    return __libc_memalign(alignment, size);
}
