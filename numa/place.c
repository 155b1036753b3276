/* numa/place.c — node-bound buffers, node-local fill, move_pages verification, pools (see place.h). */
#include "numa/place.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_2M ((size_t)2 << 20)
#define MASK_WORDS 16 /* node ids below 1024 */
#define BITS_PER_WORD (8 * sizeof(unsigned long))

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static epyq_status map_and_bind(epyq_numa_buf *b, size_t len, const int32_t *nodes, int32_t n, epyq_err *err) {
    memset(b, 0, sizeof *b);
    if (len == 0) return epyq_err_set(err, EPYQ_E_ARG, "numa alloc: zero bytes requested");
    if (n < 0 || n > (int32_t)(sizeof b->nodes / sizeof b->nodes[0]))
        return epyq_err_set(err, EPYQ_E_ARG, "numa alloc: %d nodes (at most %d can be interleaved)", (int)n,
                            (int)(sizeof b->nodes / sizeof b->nodes[0]));
    unsigned long mask[MASK_WORDS] = {0};
    for (int32_t i = 0; i < n; i++) {
        if (nodes[i] < 0 || nodes[i] >= (int32_t)(MASK_WORDS * BITS_PER_WORD) ||
            (numa_available() >= 0 && nodes[i] > numa_max_node()))
            return epyq_err_set(err, EPYQ_E_NUMA, "numa alloc: node %d does not exist on this machine (nodes 0-%d)",
                                (int)nodes[i], numa_available() >= 0 ? numa_max_node() : 0);
        mask[nodes[i] / BITS_PER_WORD] |= 1ul << (nodes[i] % BITS_PER_WORD);
    }
    /* Big buffers start on a 2 MiB boundary so transparent huge pages can back them. */
    size_t pg = page_size();
    size_t align = len >= HUGE_2M ? HUGE_2M : pg;
    size_t body = (len + pg - 1) / pg * pg;
    size_t map_len = body + (align > pg ? align : 0);
    if (map_len < len) return epyq_err_set(err, EPYQ_E_ARG, "numa alloc: %zu bytes overflows", len);
    void *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED)
        return epyq_err_set(err, EPYQ_E_NOMEM, "numa alloc: cannot map %zu bytes: %s", len, strerror(errno));
    uint8_t *ptr = (uint8_t *)(((uintptr_t)map + align - 1) / align * align);
    if (align > pg) madvise(ptr, body, MADV_HUGEPAGE);
    if (n > 0) {
        /* Bind before the first touch: with MPOL_BIND no fault can place a page elsewhere. */
        int mode = n > 1 ? MPOL_INTERLEAVE : MPOL_BIND;
        if (mbind(ptr, body, mode, mask, MASK_WORDS * BITS_PER_WORD, 0) != 0) {
            int e = errno;
            munmap(map, map_len);
            return epyq_err_set(err, EPYQ_E_NUMA, "numa alloc: binding %zu bytes to node %d%s failed: %s", len,
                                (int)nodes[0], n > 1 ? " (interleaved)" : "", strerror(e));
        }
    }
    b->ptr = ptr;
    b->len = len;
    b->map = map;
    b->map_len = map_len;
    b->n_nodes = n;
    for (int32_t i = 0; i < n; i++) b->nodes[i] = nodes[i];
    return EPYQ_OK;
}

epyq_status epyq_numa_buf_alloc(epyq_numa_buf *b, size_t len, int32_t os_node, epyq_err *err) {
    return map_and_bind(b, len, &os_node, os_node >= 0 ? 1 : 0, err);
}

epyq_status epyq_numa_buf_alloc_interleaved(epyq_numa_buf *b, size_t len, const int32_t *os_nodes, int32_t n,
                                            epyq_err *err) {
    return map_and_bind(b, len, os_nodes, n, err);
}

void epyq_numa_buf_free(epyq_numa_buf *b) {
    if (b && b->map) munmap(b->map, b->map_len);
    if (b) memset(b, 0, sizeof *b);
}

/* ---- fill on the node ------------------------------------------------------------------ */

typedef struct {
    epyq_numa_buf *buf;
    size_t chunk;
    epyq_numa_fill_fn fn;
    void *ctx;
    pthread_mutex_t lock;
    size_t bad_offset; /* lowest failing offset so far, SIZE_MAX if none */
    epyq_err first;
} fill_job;

static void fill_task(void *vctx, int32_t task, int32_t worker) {
    (void)worker;
    fill_job *j = vctx;
    size_t off = (size_t)task * j->chunk;
    size_t n = j->buf->len - off < j->chunk ? j->buf->len - off : j->chunk;
    epyq_err e = {0};
    if (j->fn(j->ctx, j->buf->ptr + off, off, n, &e) == EPYQ_OK) return;
    pthread_mutex_lock(&j->lock);
    if (off < j->bad_offset) {
        j->bad_offset = off;
        j->first = e;
    }
    pthread_mutex_unlock(&j->lock);
}

epyq_status epyq_numa_buf_fill(epyq_numa_buf *b, epyq_pool *pool, size_t chunk, epyq_numa_fill_fn fn, void *ctx,
                               epyq_err *err) {
    if (chunk == 0) chunk = HUGE_2M;
    size_t n_tasks = (b->len + chunk - 1) / chunk;
    if (n_tasks > INT32_MAX)
        return epyq_err_set(err, EPYQ_E_ARG, "numa fill: %zu chunks of %zu bytes is too many", n_tasks, chunk);
    fill_job j = {.buf = b, .chunk = chunk, .fn = fn, .ctx = ctx, .bad_offset = SIZE_MAX};
    pthread_mutex_init(&j.lock, NULL);
    epyq_pool_run(pool, fill_task, &j, (int32_t)n_tasks);
    pthread_mutex_destroy(&j.lock);
    if (j.bad_offset == SIZE_MAX) return EPYQ_OK;
    if (err) *err = j.first;
    return j.first.code != EPYQ_OK ? j.first.code : EPYQ_E_INTERNAL;
}

epyq_status epyq_numa_bind_range(void *addr, size_t len, int32_t os_node, const char *what,
                                 epyq_err *err) {
    size_t pg = page_size();
    uintptr_t a = ((uintptr_t)addr + pg - 1) / pg * pg, b = ((uintptr_t)addr + len) / pg * pg;
    if (b <= a) return EPYQ_OK;
    if (os_node < 0 || os_node >= (int32_t)(MASK_WORDS * BITS_PER_WORD) ||
        (numa_available() >= 0 && os_node > numa_max_node()))
        return epyq_err_set(err, EPYQ_E_NUMA,
                            "%s: node %d does not exist on this machine (nodes 0-%d)", what,
                            (int)os_node, numa_available() >= 0 ? numa_max_node() : 0);
    unsigned long mask[MASK_WORDS] = {0};
    mask[os_node / BITS_PER_WORD] |= 1ul << (os_node % BITS_PER_WORD);
    if (mbind((void *)a, b - a, MPOL_BIND, mask, MASK_WORDS * BITS_PER_WORD, MPOL_MF_MOVE) != 0)
        return epyq_err_set(err, EPYQ_E_NUMA, "%s: binding %zu bytes to node %d failed: %s", what,
                            (size_t)(b - a), (int)os_node, strerror(errno));
    return EPYQ_OK;
}

/* ---- verification ------------------------------------------------------------------------ */

epyq_status epyq_numa_verify(const void *addr, size_t len, const int32_t *os_nodes, int32_t n, const char *what,
                             epyq_numa_verify_report *rep, epyq_err *err) {
    enum { BATCH = 1024 };
    memset(rep, 0, sizeof *rep);
    rep->first_bad_node = -1;
    size_t pg = page_size();
    uintptr_t start = (uintptr_t)addr / pg * pg;
    uintptr_t end = (uintptr_t)addr + len;
    void *pages[BATCH];
    int status[BATCH];
    for (uintptr_t p = start; p < end;) {
        int count = 0;
        for (; count < BATCH && p < end; count++, p += pg) pages[count] = (void *)p;
        /* nodes == NULL: query only, status[i] = node of page i or -errno. */
        if (move_pages(0, (unsigned long)count, pages, NULL, status, 0) != 0)
            return epyq_err_set(err, EPYQ_E_NUMA, "%s: move_pages query failed: %s", what, strerror(errno));
        for (int i = 0; i < count; i++) {
            rep->pages++;
            if (status[i] == -ENOENT) {
                rep->absent++;
                continue;
            }
            if (status[i] < 0)
                return epyq_err_set(err, EPYQ_E_NUMA, "%s: page at offset %zu: move_pages says %s", what,
                                    (size_t)((uintptr_t)pages[i] - start), strerror(-status[i]));
            bool ok = false;
            for (int32_t k = 0; k < n && !ok; k++) ok = status[i] == os_nodes[k];
            if (ok) {
                rep->on_node++;
            } else {
                if (rep->elsewhere == 0) {
                    rep->first_bad = (size_t)((uintptr_t)pages[i] - start);
                    rep->first_bad_node = status[i];
                }
                rep->elsewhere++;
            }
        }
    }
    if (rep->elsewhere == 0) return EPYQ_OK;
    return epyq_err_set(err, EPYQ_E_NUMA,
                        "%s: %zu of %zu pages are not on node %d%s (first at offset %zu is on node %d)", what,
                        rep->elsewhere, rep->pages, n > 0 ? (int)os_nodes[0] : -1, n > 1 ? " or its interleave set" : "",
                        rep->first_bad, (int)rep->first_bad_node);
}

/* ---- system settings ---------------------------------------------------------------------- */

static bool read_small(const char *root, const char *rel, char *buf, size_t size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root ? root : "", rel);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = '\0';
    return true;
}

unsigned epyq_numa_sys_check(const char *root, char *msg, size_t size) {
    unsigned bits = 0;
    size_t used = 0;
    char buf[256];
    if (size) msg[0] = '\0';
    if (read_small(root, "proc/sys/kernel/numa_balancing", buf, sizeof buf) && atoi(buf) != 0) {
        bits |= EPYQ_NUMA_WARN_BALANCING;
        int w = snprintf(msg + used, size - used,
                         "automatic NUMA balancing is on: the kernel may migrate expert pages off their node "
                         "(sysctl kernel.numa_balancing=0)\n");
        if (w > 0) used += (size_t)w < size - used ? (size_t)w : size - used - 1;
    }
    /* The selected THP mode is the bracketed word. */
    if (read_small(root, "sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof buf) && strstr(buf, "[never]")) {
        bits |= EPYQ_NUMA_WARN_THP_NEVER;
        if (used < size)
            snprintf(msg + used, size - used,
                     "transparent huge pages are disabled (never): weights use 4 KiB pages and more TLB misses "
                     "(echo madvise > /sys/kernel/mm/transparent_hugepage/enabled)\n");
    }
    return bits;
}

int32_t epyq_numa_plan_dense_nodes(const epyq_numa_plan *plan, int32_t *out, int32_t max) {
    int32_t n = 0;
    if (!plan->bind_memory) return 0;
    for (int32_t g = 0; g < plan->n_groups; g++) {
        int32_t os = plan->groups[g].os_index;
        bool seen = false;
        for (int32_t k = 0; k < n && !seen; k++) seen = out[k] == os;
        if (!seen && os >= 0 && n < max) out[n++] = os;
    }
    return n;
}

/* ---- pools per group ---------------------------------------------------------------------- */

void epyq_numa_rt_free(epyq_numa_rt *rt) {
    if (!rt) return;
    /* Detached pools first; pool 0 last so the creator's affinity is restored at the end. */
    for (int32_t g = rt->n_groups - 1; g >= 0; g--) epyq_pool_free(rt->pools[g]);
    free(rt->pools);
    free(rt);
}

epyq_status epyq_numa_rt_create(epyq_numa_rt **out, const epyq_numa_plan *plan, epyq_err *err) {
    *out = NULL;
    epyq_numa_rt *rt = calloc(1, sizeof *rt);
    if (!rt) return epyq_err_set(err, EPYQ_E_NOMEM, "numa runtime: out of memory");
    rt->plan = plan;
    rt->pools = calloc((size_t)plan->n_groups, sizeof *rt->pools);
    if (!rt->pools) {
        free(rt);
        return epyq_err_set(err, EPYQ_E_NOMEM, "numa runtime: out of memory");
    }
    for (int32_t g = 0; g < plan->n_groups; g++) {
        const epyq_numa_group *gr = &plan->groups[g];
        epyq_pool_opts o = {.n_threads = gr->n_threads, .cpus = gr->cpus, .node = gr->node >= 0 ? gr->node : 0,
                            .detached = g > 0};
        epyq_status st = epyq_pool_create(&rt->pools[g], &o, err);
        if (st != EPYQ_OK) {
            rt->n_groups = g;
            epyq_numa_rt_free(rt);
            return st;
        }
        rt->n_groups = g + 1;
    }
    *out = rt;
    return EPYQ_OK;
}

/* ---- one-call setup ------------------------------------------------------------------------ */

void epyq_numa_setup_free(epyq_numa_setup *s) {
    if (!s) return;
    epyq_numa_rt_free(s->rt);
    epyq_numa_plan_free(s->plan);
    epyq_topo_free(s->topo);
    free(s);
}

epyq_status epyq_numa_setup_create(epyq_numa_setup **out, const epyq_numa_model *model, const epyq_numa_opts *opts,
                                   FILE *log, epyq_err *err) {
    *out = NULL;
    epyq_numa_setup *s = calloc(1, sizeof *s);
    if (!s) return epyq_err_set(err, EPYQ_E_NOMEM, "numa setup: out of memory");
    epyq_numa_opts o = *opts;
    if (o.mode == EPYQ_NUMA_ISOLATE && o.home_cpu < 0) o.home_cpu = sched_getcpu();
    epyq_status st = epyq_topo_load(&s->topo, NULL, err);
    if (st == EPYQ_OK) st = epyq_numa_plan_make(s->topo, model, &o, &s->plan, err);
    if (st == EPYQ_OK && log) {
        epyq_numa_plan_print(log, s->plan);
        char warn[1024];
        if (s->plan->bind_memory && epyq_numa_sys_check(NULL, warn, sizeof warn)) {
            /* One "warning:" line per finding. */
            char *save = NULL;
            for (char *line = strtok_r(warn, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
                fprintf(log, "warning: %s\n", line);
        }
    }
    if (st == EPYQ_OK) st = epyq_numa_rt_create(&s->rt, s->plan, err);
    if (st != EPYQ_OK) {
        epyq_numa_setup_free(s);
        return st;
    }
    *out = s;
    return EPYQ_OK;
}
