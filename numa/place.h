/* numa/place.h — applying a plan: pinned per-node pools and node-bound memory, verified.
 *
 * Promise: memory from epyq_numa_buf_alloc() is bound to its node (mbind, MPOL_BIND) before
 * any page is touched, so no page can land elsewhere by first touch; epyq_numa_buf_fill()
 * then writes it in chunks from the workers of that node's pool (pinned there), so the
 * pages are faulted in by the node that will read them and the loader's pread/repack runs
 * there too. epyq_numa_verify() asks the kernel (move_pages) where every page actually is
 * and names the first page on the wrong node. epyq_numa_rt_create() builds one pinned pool
 * per plan group: pool 0 is driven by (and pins) the creating thread, the others are
 * detached so one thread can drive them all (see dispatch.h).
 * On a topology that is not this machine (synthetic, XML) nothing here applies: binding to
 * CPUs or nodes it names fails with an error rather than pretending. */
#ifndef EPYQ_NUMA_PLACE_H
#define EPYQ_NUMA_PLACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "numa/plan.h"
#include "numa/pool.h"

typedef struct {
    uint8_t *ptr;        /* [len] usable bytes */
    size_t len;
    void *map;           /* the whole mapping (ptr is 2 MiB aligned inside it) */
    size_t map_len;
    int32_t n_nodes;     /* nodes the memory is bound to; 0 = unbound (kernel policy) */
    int32_t nodes[8];    /* [n_nodes] OS node ids (interleaved when n_nodes > 1) */
} epyq_numa_buf;

/* len bytes bound to OS node os_node (-1 = no binding: inherited policy / first touch). */
epyq_status epyq_numa_buf_alloc(epyq_numa_buf *b, size_t len, int32_t os_node, epyq_err *err);

/* len bytes interleaved page by page over os_nodes[0..n) (dense weights); n = 1 binds. */
epyq_status epyq_numa_buf_alloc_interleaved(epyq_numa_buf *b, size_t len, const int32_t *os_nodes, int32_t n,
                                            epyq_err *err);

void epyq_numa_buf_free(epyq_numa_buf *b);

/* Bind the whole pages inside [addr, addr + len) to OS node os_node (MPOL_BIND), moving those
 * already touched (MPOL_MF_MOVE): for memory that is not an epyq_numa_buf (a sequence's
 * recurrent states). A range holding no whole page is left alone. EPYQ_E_NUMA names `what`. */
epyq_status epyq_numa_bind_range(void *addr, size_t len, int32_t os_node, const char *what,
                                 epyq_err *err);

/* Write b in chunks of `chunk` bytes (0 = 2 MiB) on pool's workers: fn(ctx, dst, offset, len)
 * produces bytes [offset, offset + len) at dst (pread, copy, repack). The first failure (lowest
 * offset) is returned. */
typedef epyq_status (*epyq_numa_fill_fn)(void *ctx, uint8_t *dst, size_t offset, size_t len, epyq_err *err);
epyq_status epyq_numa_buf_fill(epyq_numa_buf *b, epyq_pool *pool, size_t chunk, epyq_numa_fill_fn fn, void *ctx,
                               epyq_err *err);

typedef struct {
    size_t pages;          /* pages checked */
    size_t on_node;        /* on one of the expected nodes */
    size_t elsewhere;      /* on another node */
    size_t absent;         /* never touched (no page yet) */
    size_t first_bad;      /* byte offset of the first page elsewhere */
    int32_t first_bad_node;
} epyq_numa_verify_report;

/* Where is every page of [addr, addr+len)? Expected: one of os_nodes[0..n). Returns
 * EPYQ_E_NUMA naming `what`, the count and the first offending page if any page is elsewhere;
 * absent pages are counted, not errors. */
epyq_status epyq_numa_verify(const void *addr, size_t len, const int32_t *os_nodes, int32_t n, const char *what,
                             epyq_numa_verify_report *rep, epyq_err *err);

/* Kernel settings that undo placement: automatic NUMA balancing migrates pages away, THP
 * "never" multiplies TLB misses on 18 GB of weights. Reads <root>/proc/sys/kernel/numa_balancing
 * and <root>/sys/kernel/mm/transparent_hugepage/enabled (root NULL = "/"); writes one line per
 * finding into msg and returns a bitmask of EPYQ_NUMA_WARN_*. */
enum { EPYQ_NUMA_WARN_BALANCING = 1, EPYQ_NUMA_WARN_THP_NEVER = 2 };
unsigned epyq_numa_sys_check(const char *root, char *msg, size_t size);

/* The distinct OS nodes the plan's dense weights are interleaved over (one entry for a single
 * node or a split of one node), for epyq_numa_buf_alloc_interleaved; 0 when the plan binds
 * nothing. With replicate-dense, allocate one bound copy per group instead. */
int32_t epyq_numa_plan_dense_nodes(const epyq_numa_plan *plan, int32_t *out, int32_t max);

/* Pools for a plan's groups (see the header comment). */
typedef struct {
    const epyq_numa_plan *plan;
    int32_t n_groups;
    epyq_pool **pools;     /* [n_groups] */
} epyq_numa_rt;

epyq_status epyq_numa_rt_create(epyq_numa_rt **out, const epyq_numa_plan *plan, epyq_err *err);
void epyq_numa_rt_free(epyq_numa_rt *rt);

/* What a program does at load, in one call: this machine's topology, the plan for model and
 * opts (isolate picks the caller's node), the plan table and any kernel-setting warnings on
 * log (NULL = quiet), then the pools. Call it from the thread that will drive the pools. */
typedef struct {
    epyq_topo *topo;
    epyq_numa_plan *plan;
    epyq_numa_rt *rt;
} epyq_numa_setup;

epyq_status epyq_numa_setup_create(epyq_numa_setup **out, const epyq_numa_model *model, const epyq_numa_opts *opts,
                                   FILE *log, epyq_err *err);
void epyq_numa_setup_free(epyq_numa_setup *s);

#endif
