/* tests/failnth/alloc_fail.c — see alloc_fail.h. The __wrap_X / __real_X pairs are GNU ld's
 * --wrap=X: references to X in the objects being linked bind to __wrap_X, and __real_X to
 * the real X (libc's, or the sanitizer's interceptor, so ASan still tracks every block). */
#include "tests/failnth/alloc_fail.h"

#include <errno.h>
#include <execinfo.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);
int __wrap_posix_memalign(void **p, size_t a, size_t n);

/* Atomic: the model's pool threads allocate too (tests run the model on one thread so that
 * the Nth allocation is the same one every run). */
static atomic_long g_count, g_fail_at, g_failures;
static atomic_bool g_persist;

void epyq_alloc_fail_at(long n, bool persist) {
    atomic_store(&g_fail_at, 0);
    atomic_store(&g_count, 0);
    atomic_store(&g_failures, 0);
    atomic_store(&g_persist, persist);
    atomic_store(&g_fail_at, n);
}

long epyq_alloc_count(void) { return atomic_load(&g_count); }
long epyq_alloc_failures(void) { return atomic_load(&g_failures); }

static bool should_fail(void) {
    long c = atomic_fetch_add(&g_count, 1) + 1, at = atomic_load(&g_fail_at);
    if (!at || c < at || (c > at && !atomic_load(&g_persist))) return false;
    /* EPYQ_FAILNTH_BACKTRACE=1: where each injected failure happens (finding the code that
     * mishandled one); backtrace() itself may allocate once, outside the counter. */
    if (atomic_fetch_add(&g_failures, 1) == 0 && getenv("EPYQ_FAILNTH_BACKTRACE")) {
        void *frames[32];
        fprintf(stderr, "alloc_fail: allocation %ld fails here:\n", c);
        backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
    }
    errno = ENOMEM;
    return true;
}

void *__wrap_malloc(size_t n) { return should_fail() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t k, size_t n) { return should_fail() ? NULL : __real_calloc(k, n); }
/* A failed realloc leaves the block as it was, as the real one does. */
void *__wrap_realloc(void *p, size_t n) { return should_fail() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return should_fail() ? NULL : __real_strdup(s); }
char *__wrap_strndup(const char *s, size_t n) { return should_fail() ? NULL : __real_strndup(s, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { return should_fail() ? NULL : __real_aligned_alloc(a, n); }
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
    return should_fail() ? ENOMEM : __real_posix_memalign(p, a, n);
}

static void cjson_free(void *p) { free(p); }

void epyq_alloc_fail_hook_cjson(void) {
    cJSON_Hooks h = {.malloc_fn = __wrap_malloc, .free_fn = cjson_free};
    cJSON_InitHooks(&h);
}
