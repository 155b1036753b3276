/* tests/failnth/alloc_fail.h — fail the Nth allocation (SQLite's habit), for tests only.
 *
 * A program that links tests/failnth/alloc_fail.c with the linker flags of FAILNTH_WRAP
 * (tests/local.am: -Wl,--wrap=malloc,...) has every call of malloc, calloc, realloc, strdup,
 * strndup, aligned_alloc and posix_memalign made by the code it links statically (libepyq.a,
 * the test itself) go through a counter first; cJSON's allocations are routed through it too
 * (cJSON_InitHooks). The libraries epyq loads as shared objects (PCRE2, utf8proc, hwloc, libc's
 * own internal buffers) allocate outside it, so their failures are not injected.
 * Nothing is wrapped in libepyq.a or the epyq binary: production code has no hook. */
#ifndef EPYQ_TEST_ALLOC_FAIL_H
#define EPYQ_TEST_ALLOC_FAIL_H

#include <stdbool.h>

/* Start counting from zero; the nth allocation from now (1-based) fails, and with persist
 * every one after it as well; n = 0 fails none (counting only). */
void epyq_alloc_fail_at(long n, bool persist);
/* Allocations counted since the last epyq_alloc_fail_at. */
long epyq_alloc_count(void);
/* Allocations made to fail since the last epyq_alloc_fail_at. */
long epyq_alloc_failures(void);
/* Route cJSON's allocations through the counter (call once before any cJSON use). */
void epyq_alloc_fail_hook_cjson(void);

#endif
