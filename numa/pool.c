/* numa/pool.c — pinned worker pools with a spin-then-futex handoff (see pool.h).
 *
 * One run is a "generation": the driver publishes (fn, ctx, n_tasks), bumps `gen` and wakes
 * sleepers; workers pull task indices from `next` until it passes n_tasks, then decrement
 * `pending`; the last one out wakes the driver if it went to sleep. Both waits spin with
 * `pause` for a bounded time first, because during decode the next run usually arrives
 * within microseconds and a futex round trip costs more than that. */
#include "numa/pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"

#define CACHE_LINE 64
#define DEFAULT_SPIN_US 2000 /* see pool.h */

typedef struct {
    epyq_pool *pool;
    pthread_t thread;
    int32_t id;     /* worker index in [0, n) */
    bool started;
} worker;

struct epyq_pool {
    /* Hot words, each on its own line so workers polling `gen` do not false-share with the
     * task counter they all hammer. */
    _Alignas(CACHE_LINE) atomic_uint gen;   /* futex word: bumped once per run and at stop */
    _Alignas(CACHE_LINE) atomic_int next;   /* next task index to hand out */
    _Alignas(CACHE_LINE) atomic_uint pending; /* futex word: workers still in the current run */
    atomic_int sleepers;                    /* workers blocked (or about to block) on gen */
    atomic_int driver_sleeping;             /* driver blocked (or about to block) on pending */

    _Alignas(CACHE_LINE) epyq_task_fn fn;   /* current run, written before gen is bumped */
    void *ctx;
    int32_t n_tasks;
    int32_t first_worker;                   /* lowest worker id taking part in the run */
    bool stop;

    int32_t n;                              /* workers including worker 0 */
    int32_t node;
    bool detached;
    bool running;                           /* a start() has not been waited for yet */
    int64_t spin_ns;
    worker *workers;                        /* [n] */
    int32_t n_spawned;                      /* threads we created (n-1, or n if detached) */

    bool pinned_creator;                    /* worker 0 pinned the creating thread */
    pthread_t creator;
    cpu_set_t creator_mask;                 /* affinity to restore at free */
    uint64_t runs, wait_ns;                 /* driver only: runs waited on, ns spent waiting */
};

/* Pool threads alive in the process; when they outnumber usable CPUs spinning is harmful. */
static atomic_int g_live_threads;
static atomic_int g_cpus_allowed = 1;

/* Worker identity of the current thread, for inline nested runs. */
static _Thread_local epyq_pool *tls_pool;
static _Thread_local int32_t tls_worker;

/* A creator pinned by its pools still owns the CPUs it inherited: later pools (other nodes)
 * check their CPUs against that mask, not against the one CPU it is pinned to now. */
static _Thread_local int tls_pin_depth;
static _Thread_local cpu_set_t tls_inherited_mask;

static long futex_wait(atomic_uint *addr, unsigned expected) {
    return syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *addr, int count) {
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static int64_t effective_spin_ns(const epyq_pool *p) {
    if (atomic_load_explicit(&g_live_threads, memory_order_relaxed) + 1 >
        atomic_load_explicit(&g_cpus_allowed, memory_order_relaxed))
        return 0;
    return p->spin_ns;
}

/* Spin until *word != seen or the spin budget runs out; returns the last value read. */
static unsigned spin_while_equal(const epyq_pool *p, atomic_uint *word, unsigned seen) {
    unsigned v = atomic_load_explicit(word, memory_order_acquire);
    int64_t budget = effective_spin_ns(p);
    if (v != seen || budget <= 0) return v;
    int64_t deadline = epyq_now_ns() + budget;
    for (;;) {
        /* Read the clock only every 64 pauses: it costs more than a pause. */
        for (int i = 0; i < 64; i++) {
            cpu_relax();
            v = atomic_load_explicit(word, memory_order_acquire);
            if (v != seen) return v;
        }
        if (epyq_now_ns() >= deadline) return v;
    }
}

static void run_tasks(epyq_pool *p, int32_t w) {
    epyq_task_fn fn = p->fn;
    void *ctx = p->ctx;
    int32_t n = p->n_tasks;
    for (;;) {
        int32_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= n) break;
        fn(ctx, t, w);
    }
}

static void *worker_main(void *arg) {
    worker *wk = arg;
    epyq_pool *p = wk->pool;
    tls_pool = p;
    tls_worker = wk->id;

    unsigned seen = 0;
    for (;;) {
        unsigned g = spin_while_equal(p, &p->gen, seen);
        if (g == seen) {
            /* Announce the sleep before re-checking gen, so the driver either sees a sleeper
             * (and wakes us) or we see its new generation (seq_cst orders both sides). */
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen) futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        seen = g;
        if (p->stop) break;
        if (wk->id >= p->first_worker) run_tasks(p, wk->id);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->driver_sleeping))
            futex_wake(&p->pending, 1);
    }
    return NULL;
}

static int count_allowed_cpus(cpu_set_t *mask) {
    if (tls_pin_depth > 0)
        *mask = tls_inherited_mask;
    else if (sched_getaffinity(0, sizeof *mask, mask) != 0)
        return 1;
    return CPU_COUNT(mask);
}

static int64_t spin_from_env(void) {
    const char *s = getenv("EPYQ_SPIN_US");
    if (!s || !*s) return (int64_t)DEFAULT_SPIN_US * 1000;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1000000) return (int64_t)DEFAULT_SPIN_US * 1000;
    return (int64_t)v * 1000;
}

static epyq_status check_cpus(const epyq_pool_opts *o, const cpu_set_t *allowed, epyq_err *err) {
    for (int32_t i = 0; i < o->n_threads; i++) {
        int32_t c = o->cpus[i];
        if (c < 0 || c >= CPU_SETSIZE || !CPU_ISSET(c, allowed))
            return epyq_err_set(err, EPYQ_E_NUMA,
                                "pool for node %d: worker %d asks for cpu %d, which is not in this "
                                "process's allowed CPU set (taskset/cgroup)", (int)o->node, (int)i, (int)c);
        for (int32_t j = 0; j < i; j++)
            if (o->cpus[j] == c)
                return epyq_err_set(err, EPYQ_E_NUMA,
                                    "pool for node %d: cpu %d is listed for workers %d and %d; a pool "
                                    "gets each PU once", (int)o->node, (int)c, (int)j, (int)i);
    }
    return EPYQ_OK;
}

static epyq_status spawn(epyq_pool *p, const int32_t *cpus, epyq_err *err) {
    /* Workers take no signals: SIGINT/SIGTERM must reach the driver thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    epyq_status st = EPYQ_OK;
    int32_t first = p->detached ? 0 : 1;
    for (int32_t i = first; i < p->n; i++) {
        worker *wk = &p->workers[i];
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        if (cpus) {
            /* Pin before the thread starts, so its stack is first touched on its node. */
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpus[i], &one);
            pthread_attr_setaffinity_np(&attr, sizeof one, &one);
        }
        int rc = pthread_create(&wk->thread, &attr, worker_main, wk);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "pool for node %d: cannot start worker %d of %d: %s",
                              (int)p->node, (int)i, (int)p->n, strerror(rc));
            break;
        }
        wk->started = true;
        p->n_spawned++;
        /* Named by the creator, so the name is there when pool_create returns. Linux keeps
         * 15 characters: format wide, then cut. */
        char name[32];
        if (p->node >= 0)
            snprintf(name, sizeof name, "numa%d_t%d", (int)p->node, (int)i);
        else
            snprintf(name, sizeof name, "epyq_t%d", (int)i);
        name[15] = '\0';
        pthread_setname_np(wk->thread, name);
        atomic_fetch_add(&g_live_threads, 1);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return st;
}

static void stop_workers(epyq_pool *p) {
    p->stop = true;
    atomic_store(&p->pending, (unsigned)p->n_spawned);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen, INT_MAX);
    for (int32_t i = 0; i < p->n; i++) {
        if (!p->workers[i].started) continue;
        pthread_join(p->workers[i].thread, NULL);
        atomic_fetch_sub(&g_live_threads, 1);
    }
}

epyq_status epyq_pool_create(epyq_pool **out, const epyq_pool_opts *opts, epyq_err *err) {
    *out = NULL;
    cpu_set_t allowed;
    int n_allowed = count_allowed_cpus(&allowed);
    atomic_store_explicit(&g_cpus_allowed, n_allowed, memory_order_relaxed);

    epyq_pool_opts o = *opts;
    if (o.n_threads < 0)
        return epyq_err_set(err, EPYQ_E_ARG, "pool: n_threads %d is negative", (int)o.n_threads);
    if (o.n_threads == 0) {
        if (o.cpus)
            return epyq_err_set(err, EPYQ_E_ARG, "pool: a cpu list needs n_threads > 0");
        o.n_threads = n_allowed;
    }
    if (o.cpus) {
        epyq_status st = check_cpus(&o, &allowed, err);
        if (st != EPYQ_OK) return st;
    } else if (o.n_threads > n_allowed) {
        return epyq_err_set(err, EPYQ_E_NUMA,
                            "pool for node %d: %d threads requested but this process may use only %d "
                            "CPUs (taskset/cgroup); a pool does not oversubscribe",
                            (int)o.node, (int)o.n_threads, n_allowed);
    }

    epyq_pool *p = aligned_alloc(CACHE_LINE, (sizeof *p + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE);
    if (!p) return epyq_err_set(err, EPYQ_E_NOMEM, "pool: out of memory");
    memset(p, 0, sizeof *p);
    p->n = o.n_threads;
    p->node = o.node;
    p->detached = o.detached;
    p->spin_ns = spin_from_env();
    p->workers = calloc((size_t)p->n, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return epyq_err_set(err, EPYQ_E_NOMEM, "pool: out of memory for %d workers", (int)o.n_threads);
    }
    for (int32_t i = 0; i < p->n; i++) {
        p->workers[i].pool = p;
        p->workers[i].id = i;
    }

    if (o.cpus && !o.detached) {
        p->creator = pthread_self();
        if (pthread_getaffinity_np(p->creator, sizeof p->creator_mask, &p->creator_mask) == 0) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(o.cpus[0], &one);
            if (tls_pin_depth == 0) tls_inherited_mask = p->creator_mask;
            p->pinned_creator = pthread_setaffinity_np(p->creator, sizeof one, &one) == 0;
            if (p->pinned_creator) tls_pin_depth++;
        }
    }

    epyq_status st = spawn(p, o.cpus, err);
    if (st != EPYQ_OK) {
        epyq_pool_free(p);
        return st;
    }
    *out = p;
    return EPYQ_OK;
}

void epyq_pool_free(epyq_pool *p) {
    if (!p) return;
    stop_workers(p);
    if (p->pinned_creator && pthread_equal(p->creator, pthread_self())) {
        pthread_setaffinity_np(p->creator, sizeof p->creator_mask, &p->creator_mask);
        tls_pin_depth--;
    }
    free(p->workers);
    free(p);
}

int32_t epyq_pool_size(const epyq_pool *p) { return p->n; }

void epyq_pool_start(epyq_pool *p, epyq_task_fn fn, void *ctx, int32_t n_tasks) {
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks > 0 ? n_tasks : 0;
    p->first_worker = p->detached ? 0 : 1;
    p->running = true;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, (unsigned)p->n_spawned, memory_order_relaxed);
    /* seq_cst: pairs with the sleeper announcement in worker_main. */
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->gen, INT_MAX);
}

/* The driver's wait, begun at t0, for the workers still in the run: spin, then sleep. */
static void wait_pending(epyq_pool *p, int64_t t0) {
    unsigned v;
    int64_t budget = effective_spin_ns(p);
    int64_t deadline = t0 + budget;
    while (budget > 0) {
        for (int i = 0; i < 64; i++) {
            cpu_relax();
            if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
        }
        if (epyq_now_ns() >= deadline) break;
    }
    atomic_store(&p->driver_sleeping, 1);
    while ((v = atomic_load(&p->pending)) != 0) futex_wait(&p->pending, v);
    atomic_store(&p->driver_sleeping, 0);
}

void epyq_pool_wait(epyq_pool *p) {
    if (!p->running) return;
    p->running = false;
    /* A non-detached pool of one has no threads: the driver runs the tasks itself. */
    if (p->n_spawned == 0) {
        epyq_pool *saved = tls_pool;
        int32_t saved_w = tls_worker;
        tls_pool = p;
        tls_worker = 0;
        run_tasks(p, 0);
        tls_pool = saved;
        tls_worker = saved_w;
        return;
    }
    p->runs++;
    unsigned v = atomic_load_explicit(&p->pending, memory_order_acquire);
    if (v == 0) return;
    int64_t t0 = epyq_now_ns();
    wait_pending(p, t0);
    p->wait_ns += (uint64_t)(epyq_now_ns() - t0);
}

void epyq_pool_stats(const epyq_pool *p, uint64_t *runs, uint64_t *wait_ns) {
    *runs = p->runs;
    *wait_ns = p->wait_ns;
}

void epyq_pool_run(epyq_pool *p, epyq_task_fn fn, void *ctx, int32_t n_tasks) {
    if (n_tasks <= 0) return;
    /* Inline paths: a nested call from one of this pool's workers, a single task, or a pool
     * with nobody to hand work to. Waking workers would only add latency. A detached pool
     * never runs inline: its work belongs on its own (node-pinned) threads. */
    bool nested = tls_pool == p;
    if (nested || (!p->detached && (n_tasks == 1 || p->n_spawned == 0))) {
        int32_t w = nested ? tls_worker : 0;
        for (int32_t t = 0; t < n_tasks; t++) fn(ctx, t, w);
        return;
    }
    epyq_pool_start(p, fn, ctx, n_tasks);
    if (!p->detached) {
        /* The driver is worker 0: take tasks from the same counter. */
        epyq_pool *saved = tls_pool;
        int32_t saved_w = tls_worker;
        tls_pool = p;
        tls_worker = 0;
        run_tasks(p, 0);
        tls_pool = saved;
        tls_worker = saved_w;
    }
    epyq_pool_wait(p);
}
