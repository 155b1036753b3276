/* numa/pool.h — pinned worker pools (one per NUMA node) with a low-latency barrier.
 *
 * Promise: epyq_pool_run() runs fn(ctx, task, worker) for every task in [0, n_tasks) on the
 * pool's workers plus the calling thread (worker 0 is the caller), and returns when all tasks
 * are done. Tasks are handed out in a fixed order from an atomic counter; callers that need
 * bit-identical results make each task's output independent of which worker ran it. Workers
 * spin briefly, then sleep (futex), so an idle pool costs no CPU. A pool never creates more
 * workers than the PUs it was given; no OpenMP threads are used.
 *
 * Pinning: worker i runs on cpus[i]. The creating thread is worker 0, so creating a pinned,
 * non-detached pool pins the creating thread to cpus[0]; epyq_pool_free() restores the
 * creator's previous affinity when called from the same thread.
 *
 * Detached pools (opts.detached): every worker, 0 included, is a pool thread. The creator
 * starts work with epyq_pool_start() and collects it with epyq_pool_wait(), so one thread
 * can drive several node pools at once (start nodes 1..N-1, run node 0, wait for the rest).
 *
 * A pool serves one driver thread at a time. A task that calls epyq_pool_run() on the pool
 * that runs it gets its tasks run inline on its own worker (no deadlock, no new threads).
 *
 * Environment: EPYQ_SPIN_US (default 2000) bounds how long an idle worker or a waiting
 * driver spins before it sleeps; 0 sleeps at once. Long enough to ride out a vCPU of the
 * other thread being descheduled for a moment on a shared host: waking a sleeping vCPU
 * costs tens of microseconds, and a decode step hands work over some 300 times (4-layer
 * 35b-shaped model, 2 threads, this VM with ~30% steal, three alternating pairs: 62% ->
 * 84% of the read bandwidth, median, with 100 -> 2000 us). When the process holds more pool
 * threads than CPUs it may use, nobody spins (spinning would only steal the CPU from the
 * thread being waited for). */
#ifndef EPYQ_POOL_H
#define EPYQ_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

typedef struct epyq_pool epyq_pool;
typedef void (*epyq_task_fn)(void *ctx, int32_t task, int32_t worker);

typedef struct {
    int32_t n_threads;      /* total workers including the caller; 0 = one per allowed PU */
    const int32_t *cpus;    /* [n_threads] OS cpu ids to pin worker i to, or NULL = no pinning */
    int32_t node;           /* NUMA node the pool serves (-1 = none); names threads numa<node>_t<i> */
    bool detached;          /* worker 0 is a pool thread too; drive with epyq_pool_start/_wait */
} epyq_pool_opts;

epyq_status epyq_pool_create(epyq_pool **out, const epyq_pool_opts *opts, epyq_err *err);
void epyq_pool_free(epyq_pool *p);
int32_t epyq_pool_size(const epyq_pool *p);
void epyq_pool_run(epyq_pool *p, epyq_task_fn fn, void *ctx, int32_t n_tasks);

/* Start a run without taking part in it and return at once; epyq_pool_wait() returns when it
 * is done. On a non-detached pool only workers 1..n-1 take part (worker 0, the caller, is busy
 * elsewhere), so a pool of one runs the tasks inside epyq_pool_wait(). */
void epyq_pool_start(epyq_pool *p, epyq_task_fn fn, void *ctx, int32_t n_tasks);
void epyq_pool_wait(epyq_pool *p);

/* Since the pool was created: the runs its driver collected (threaded runs only) and the ns
 * the driver spent waiting at their ends for workers still busy (imbalance, late wake-ups).
 * Read by the driver thread. */
void epyq_pool_stats(const epyq_pool *p, uint64_t *runs, uint64_t *wait_ns);

#endif
