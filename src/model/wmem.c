/* src/model/wmem.c — the weight arena: where a model's packed weights live when no NUMA plan
 * places them (see model_impl.h, epyq_wmem_*).
 *
 * Why not aligned_alloc per linear: a routed expert's projection is ~0.5 MB, so 30,720 of them
 * come from malloc's heap or its own small mappings, and those get 4 KiB pages unless a free
 * huge page happens to be there at the fault (this machine's THP defrag is "madvise": no
 * compaction for unadvised memory, and after reading a 22 GB checkpoint through the page cache
 * there are none). 18 GB on 4 KiB pages is 4.7 M page-table entries (36 MB), more than the L3,
 * so a decoded token's streams stall on table walks: the full synthetic 35b-a3b decoded at
 * 8.4 t/s on 4 KiB pages and 11.7-12.1 t/s on huge pages (2 threads, Zen 5 VM). Here weights are
 * carved from 2 MiB aligned chunks advised MADV_HUGEPAGE, as the NUMA loader's node buffers
 * (numa/place.c) and the bandwidth probe's buffer already are, so decode and the probe it is
 * compared with read the same kind of memory.
 *
 * Sanitizer builds keep the heap (no arena): ASan then sees every weight buffer's bounds. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/model_impl.h"
#include "numa/place.h"

#if defined(__SANITIZE_ADDRESS__)
#define WMEM_HEAP_ONLY 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WMEM_HEAP_ONLY 1
#endif
#endif

enum {
    WMEM_CHUNK = 64u << 20, /* a chunk's size; a request of a quarter of it or more gets its own */
    WMEM_ALIGN = 64,        /* every weight buffer starts on a cache line */
};

struct epyq_wmem {
    pthread_mutex_t mu;    /* loads pack experts in parallel (model.c) */
    epyq_numa_buf *chunks; /* [n] mappings, each 2 MiB aligned and advised for huge pages */
    size_t n, cap;
    size_t cur;     /* index of the chunk being carved, SIZE_MAX when none */
    size_t used;    /* bytes of chunks[cur] handed out */
    uint64_t bytes; /* bytes of all chunks */
};

epyq_status epyq_wmem_create(epyq_wmem **out, epyq_err *err) {
    *out = NULL;
#ifdef WMEM_HEAP_ONLY
    (void)err;
    return EPYQ_OK;
#else
    epyq_wmem *w = calloc(1, sizeof *w);
    if (!w) return epyq_err_set(err, EPYQ_E_NOMEM, "weight arena: out of memory");
    pthread_mutex_init(&w->mu, NULL);
    w->cur = SIZE_MAX;
    *out = w;
    return EPYQ_OK;
#endif
}

/* A new chunk of at least len bytes; its index, or SIZE_MAX when it cannot be mapped. */
static size_t chunk_add(epyq_wmem *w, size_t len) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        epyq_numa_buf *c = realloc(w->chunks, cap * sizeof *c);
        if (!c) return SIZE_MAX;
        w->chunks = c, w->cap = cap;
    }
    epyq_err e = {0};
    if (epyq_numa_buf_alloc(&w->chunks[w->n], len, -1, &e) != EPYQ_OK) return SIZE_MAX;
    w->bytes += len;
    return w->n++;
}

void *epyq_wmem_alloc(epyq_wmem *w, size_t n, size_t size) {
    if (!w) return epyq_model_alloc(n, size);
    size_t bytes;
    if (!epyq_mul_size(n, size, &bytes) || !epyq_add_size(bytes, WMEM_ALIGN - 1, &bytes))
        return NULL;
    bytes &= ~(size_t)(WMEM_ALIGN - 1);
    if (!bytes) bytes = WMEM_ALIGN;
    void *p = NULL;
    pthread_mutex_lock(&w->mu);
    if (bytes >= WMEM_CHUNK / 4) {
        size_t c = chunk_add(w, bytes);
        if (c != SIZE_MAX) p = w->chunks[c].ptr;
    } else {
        if (w->cur == SIZE_MAX || w->chunks[w->cur].len - w->used < bytes) {
            w->cur = chunk_add(w, WMEM_CHUNK);
            w->used = 0;
        }
        if (w->cur != SIZE_MAX) {
            p = w->chunks[w->cur].ptr + w->used;
            w->used += bytes;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return p; /* fresh anonymous memory reads as zeros, as epyq_model_alloc's does */
}

bool epyq_wmem_owns(const epyq_wmem *w, const void *p) {
    if (!w || !p) return false;
    const uint8_t *b = p;
    for (size_t i = 0; i < w->n; i++)
        if (b >= w->chunks[i].ptr && b < w->chunks[i].ptr + w->chunks[i].len) return true;
    return false;
}

void epyq_wmem_release(epyq_wmem *w, void *p) {
    if (!epyq_wmem_owns(w, p)) free(p);
    /* arena memory goes with the arena */
}

uint64_t epyq_wmem_bytes(const epyq_wmem *w) { return w ? w->bytes : 0; }

void epyq_wmem_free(epyq_wmem *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) epyq_numa_buf_free(&w->chunks[i]);
    free(w->chunks);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
