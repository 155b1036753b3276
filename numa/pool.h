/* numa/pool.h — pinned worker pools (one per NUMA node) with a low-latency barrier.
 *
 * Promise: epyq_pool_run() runs fn(ctx, task, worker) for every task in [0, n_tasks) on the
 * pool's workers plus the calling thread (worker 0 is the caller), and returns when all tasks
 * are done. Tasks are handed out in a fixed order from an atomic counter; callers that need
 * bit-identical results make each task's output independent of which worker ran it. Workers
 * spin briefly, then sleep (futex), so an idle pool costs no CPU. A pool never creates more
 * workers than the PUs it was given; no OpenMP threads are used. */
#ifndef EPYQ_POOL_H
#define EPYQ_POOL_H

#include <stdint.h>

#include "core/status.h"

typedef struct epyq_pool epyq_pool;
typedef void (*epyq_task_fn)(void *ctx, int32_t task, int32_t worker);

typedef struct {
    int32_t n_threads;      /* total workers including the caller; 0 = one per allowed PU */
    const int32_t *cpus;    /* [n_threads] OS cpu ids to pin worker i to, or NULL = no pinning */
    int32_t node;           /* NUMA node the pool serves (-1 = none); names threads numa<node>_t<i> */
} epyq_pool_opts;

epyq_status epyq_pool_create(epyq_pool **out, const epyq_pool_opts *opts, epyq_err *err);
void epyq_pool_free(epyq_pool *p);
int32_t epyq_pool_size(const epyq_pool *p);
void epyq_pool_run(epyq_pool *p, epyq_task_fn fn, void *ctx, int32_t n_tasks);

#endif
