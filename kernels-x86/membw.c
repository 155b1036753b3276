/* kernels-x86/membw.c — STREAM-style read/copy/triad bandwidth on pinned pthreads (see
 * membw.h). Timing is done by thread 0 between two barriers, so a repetition lasts from
 * the moment every thread may start until the last one has finished its slice. */
#include "kernels-x86/membw.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/util.h"
#include "kernels-x86/kern.h"

#define MEMBW_MAX_THREADS 1024
#define MEMBW_ALIGN (2u << 20) /* 2 MiB: lets THP back the buffer with huge pages */

typedef struct {
    epyq_membw_op op;
    int threads, reps;
    size_t n;                  /* floats per array per thread */
    float *arr[3];             /* [3][threads * n]: arrays a, b, c (READ uses a only) */
    const int *cpus;           /* [threads] CPU to pin thread i to */
    pthread_barrier_t bar;
    pthread_mutex_t mu;        /* guards gate */
    pthread_cond_t cv;
    int gate;                  /* 0 = wait, 1 = go, -1 = abort (a thread failed to start) */
    double *secs;              /* [reps + 1] written by thread 0; [0] is the warm-up */
    volatile double sink;      /* keeps the READ sums alive */
} membw_job;

typedef struct {
    membw_job *job;
    int id;
} membw_arg;

static void pin_self(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    /* Failure (e.g. a cpuset changed under us) only costs accuracy, never correctness. */
    (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void run_slice(membw_job *j, int id, double *acc) {
    const size_t off = (size_t)id * j->n, n = j->n;
    float *a = j->arr[0] + off;
    switch (j->op) {
    case EPYQ_MEMBW_READ:
        *acc += epyq_kern()->stream_read(a, n);
        break;
    case EPYQ_MEMBW_COPY: {
        const float *b = j->arr[1] + off;
        memcpy(a, b, n * sizeof *a);
        break;
    }
    case EPYQ_MEMBW_TRIAD: {
        const float *b = j->arr[1] + off, *c = j->arr[2] + off;
        const float s = 3.0f;
        for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        break;
    }
    }
}

static void *membw_thread(void *p) {
    const membw_arg *arg = p;
    membw_job *j = arg->job;
    const int id = arg->id;
    pthread_mutex_lock(&j->mu);
    while (j->gate == 0) pthread_cond_wait(&j->cv, &j->mu);
    const int go = j->gate > 0;
    pthread_mutex_unlock(&j->mu);
    if (!go) return NULL;
    pin_self(j->cpus[id]);
    /* First touch from the pinned thread: each slice lands on its thread's NUMA node. */
    for (int a = 0; a < 3; a++)
        if (j->arr[a]) {
            float *s = j->arr[a] + (size_t)id * j->n;
            for (size_t i = 0; i < j->n; i++) s[i] = (float)(i & 1023) * 0.001f;
        }
    double acc = 0.0;
    for (int r = 0; r <= j->reps; r++) {
        pthread_barrier_wait(&j->bar);
        const double t0 = epyq_now();
        run_slice(j, id, &acc);
        pthread_barrier_wait(&j->bar);
        if (id == 0) j->secs[r] = epyq_now() - t0;
    }
    if (id == 0) j->sink = acc;
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* CPUs this process may run on, in id order; thread i gets cpus[i % count]. */
static int allowed_cpus(int *cpus, int max) {
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &set)) cpus[n++] = c;
    return n;
}

static void *alloc_array(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, MEMBW_ALIGN, bytes) != 0) return NULL;
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint; 4 KiB pages only cost TLB misses */
    return p;
}

epyq_status epyq_membw_measure(epyq_membw_op op, size_t bytes, int threads, int reps,
                               epyq_membw_result *out, epyq_err *err) {
    if (threads < 1 || threads > MEMBW_MAX_THREADS || reps < 1 || reps > 10000 ||
        (unsigned)op > EPYQ_MEMBW_TRIAD)
        return epyq_err_set(err, EPYQ_E_ARG, "membw: threads %d (1..%d), reps %d (1..10000)",
                            threads, MEMBW_MAX_THREADS, reps);
    if (bytes < (1u << 20))
        return epyq_err_set(err, EPYQ_E_ARG, "membw: buffer of %zu bytes, need >= 1 MiB", bytes);
    const int narr = op == EPYQ_MEMBW_READ ? 1 : op == EPYQ_MEMBW_COPY ? 2 : 3;
    /* floats per thread per array, a whole number of 64-byte lines */
    const size_t n = bytes / (size_t)narr / (size_t)threads / 64u * 16u;
    if (n == 0)
        return epyq_err_set(err, EPYQ_E_ARG, "membw: %zu bytes over %d threads is < 1 line each",
                            bytes, threads);

    int cpus_all[MEMBW_MAX_THREADS], cpus[MEMBW_MAX_THREADS];
    const int ncpu = allowed_cpus(cpus_all, MEMBW_MAX_THREADS);
    if (ncpu == 0) return epyq_err_set(err, EPYQ_E_INTERNAL, "membw: sched_getaffinity failed");
    for (int i = 0; i < threads; i++) cpus[i] = cpus_all[i % ncpu];

    membw_job job = {.op = op, .threads = threads, .reps = reps, .n = n, .cpus = cpus};
    epyq_status st = EPYQ_OK;
    pthread_t tid[MEMBW_MAX_THREADS];
    membw_arg args[MEMBW_MAX_THREADS];
    int started = 0;
    const size_t arr_bytes = n * (size_t)threads * sizeof(float);
    for (int a = 0; a < narr; a++)
        if (!(job.arr[a] = alloc_array(arr_bytes))) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "membw: cannot allocate %zu bytes", arr_bytes);
            goto done;
        }
    job.secs = calloc((size_t)reps + 1, sizeof *job.secs);
    if (!job.secs) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "membw: %d timings", reps);
        goto done;
    }
    if (pthread_barrier_init(&job.bar, NULL, (unsigned)threads) != 0) {
        st = epyq_err_set(err, EPYQ_E_INTERNAL, "membw: pthread_barrier_init failed");
        goto done;
    }
    pthread_mutex_init(&job.mu, NULL);
    pthread_cond_init(&job.cv, NULL);
    /* Threads wait at a gate until all of them exist, so a failed pthread_create can still
     * send the started ones home instead of leaving them stuck in the barrier. Worker 0 is
     * a thread of its own too, so the caller's affinity is left untouched. */
    for (; started < threads; started++) {
        args[started] = (membw_arg){.job = &job, .id = started};
        if (pthread_create(&tid[started], NULL, membw_thread, &args[started]) != 0) break;
    }
    pthread_mutex_lock(&job.mu);
    job.gate = started == threads ? 1 : -1;
    pthread_cond_broadcast(&job.cv);
    pthread_mutex_unlock(&job.mu);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&job.bar);
    pthread_cond_destroy(&job.cv);
    pthread_mutex_destroy(&job.mu);
    if (started < threads) {
        st = epyq_err_set(err, EPYQ_E_INTERNAL, "membw: could not start thread %d of %d",
                          started, threads);
        goto done;
    }

    double *t = job.secs + 1; /* drop the warm-up pass */
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    const double moved = (double)arr_bytes * narr;
    const double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    *out = (epyq_membw_result){.median_gbps = moved / med / 1e9,
                               .min_gbps = moved / t[reps - 1] / 1e9,
                               .max_gbps = moved / t[0] / 1e9,
                               .reps = reps,
                               .bytes = (size_t)moved};
done:
    free(job.secs);
    for (int a = 0; a < 3; a++) free(job.arr[a]);
    return st;
}

double epyq_membw_read_gbps(size_t bytes, int threads) {
    epyq_membw_result r;
    if (epyq_membw_measure(EPYQ_MEMBW_READ, bytes, threads, 5, &r, NULL) != EPYQ_OK) return -1.0;
    return r.median_gbps;
}

const char *epyq_membw_op_name(epyq_membw_op op) {
    switch (op) {
    case EPYQ_MEMBW_READ: return "read";
    case EPYQ_MEMBW_COPY: return "copy";
    case EPYQ_MEMBW_TRIAD: return "triad";
    }
    return "unknown";
}
