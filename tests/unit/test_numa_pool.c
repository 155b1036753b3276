/* tests/unit/test_numa_pool.c — numa/pool.h: every task runs exactly once, back-to-back runs,
 * pinning and thread names, nested and detached use, clear errors, and idle pools that sleep. */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "numa/pool.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

static bool fast_mode(void) {
    const char *f = getenv("EPYQ_FAST");
    return f && *f && strcmp(f, "0") != 0;
}

static int allowed_cpus(int *list, int max) {
    cpu_set_t m;
    int n = 0;
    if (sched_getaffinity(0, sizeof m, &m) != 0) return 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &m)) list[n++] = c;
    return n;
}

static epyq_pool *make_pool(int32_t n, const int32_t *cpus, int32_t node, bool detached) {
    epyq_pool *p = NULL;
    epyq_err err = {0};
    epyq_pool_opts o = {.n_threads = n, .cpus = cpus, .node = node, .detached = detached};
    epyq_status st = epyq_pool_create(&p, &o, &err);
    ck_assert_msg(st == EPYQ_OK, "pool create: %s", err.msg);
    return p;
}

/* ---- exactly once ------------------------------------------------------------------ */

typedef struct {
    atomic_int *hits;     /* [n_tasks] */
    int32_t n_workers;
    atomic_int bad_worker;
    pthread_t driver;
    atomic_int worker0_not_driver;
} count_ctx;

static void count_task(void *vctx, int32_t task, int32_t worker) {
    count_ctx *c = vctx;
    atomic_fetch_add(&c->hits[task], 1);
    if (worker < 0 || worker >= c->n_workers) atomic_store(&c->bad_worker, 1);
    if (worker == 0 && !pthread_equal(pthread_self(), c->driver)) atomic_store(&c->worker0_not_driver, 1);
}

/* detached: worker 0 is a pool thread, not the driver. */
static void check_exactly_once(epyq_pool *p, int32_t n_tasks, bool detached) {
    count_ctx c = {.n_workers = epyq_pool_size(p), .driver = pthread_self()};
    c.hits = calloc((size_t)(n_tasks > 0 ? n_tasks : 1), sizeof *c.hits);
    ck_assert_ptr_nonnull(c.hits);
    epyq_pool_run(p, count_task, &c, n_tasks);
    for (int32_t t = 0; t < n_tasks; t++)
        ck_assert_msg(atomic_load(&c.hits[t]) == 1, "n_tasks %d: task %d ran %d times", (int)n_tasks,
                      (int)t, atomic_load(&c.hits[t]));
    ck_assert_int_eq(atomic_load(&c.bad_worker), 0);
    if (!detached) ck_assert_int_eq(atomic_load(&c.worker0_not_driver), 0);
    free(c.hits);
}

START_TEST(test_exactly_once_sizes) {
    int32_t sizes[] = {0, 1, 2, 3, 17, 1000, 100000};
    int cpus[CPU_SETSIZE];
    int n_cpu = allowed_cpus(cpus, CPU_SETSIZE);
    for (int32_t n = 1; n <= n_cpu && n <= 4; n++) {
        epyq_pool *p = make_pool(n, NULL, -1, false);
        ck_assert_int_eq(epyq_pool_size(p), n);
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) check_exactly_once(p, sizes[i], false);
        epyq_pool_free(p);
    }
}
END_TEST

START_TEST(test_default_size_is_allowed_cpus) {
    int cpus[CPU_SETSIZE];
    int n_cpu = allowed_cpus(cpus, CPU_SETSIZE);
    epyq_pool *p = make_pool(0, NULL, -1, false);
    ck_assert_int_eq(epyq_pool_size(p), n_cpu);
    epyq_pool_free(p);
}
END_TEST

/* Many short runs back to back: a lost wakeup or a stale task counter shows up as a hang
 * (Check's timeout) or a wrong sum. */
typedef struct {
    int64_t *slots; /* [n_tasks] */
} sum_ctx;

static void sum_task(void *vctx, int32_t task, int32_t worker) {
    (void)worker;
    sum_ctx *c = vctx;
    c->slots[task] += task + 1;
}

START_TEST(test_back_to_back_runs) {
    int cpus[CPU_SETSIZE];
    int n_cpu = allowed_cpus(cpus, CPU_SETSIZE);
    int runs = fast_mode() ? 2000 : 20000;
    const char *spins[] = {"0", "100"};
    for (int s = 0; s < 2; s++) {
        setenv("EPYQ_SPIN_US", spins[s], 1);
        epyq_pool *p = make_pool(n_cpu < 2 ? n_cpu : 2, NULL, -1, false);
        int64_t slots[8] = {0};
        sum_ctx c = {slots};
        for (int r = 0; r < runs; r++) epyq_pool_run(p, sum_task, &c, 2 + r % 7);
        /* slot t was touched by every run with n_tasks > t. */
        for (int t = 0; t < 8; t++) {
            int64_t times = 0;
            for (int r = 0; r < runs; r++) times += (2 + r % 7) > t;
            ck_assert_int_eq(slots[t], times * (t + 1));
        }
        epyq_pool_free(p);
    }
    unsetenv("EPYQ_SPIN_US");
}
END_TEST

START_TEST(test_create_free_loop) {
    int runs = fast_mode() ? 20 : 200;
    for (int r = 0; r < runs; r++) {
        epyq_pool *p = make_pool(2, NULL, r % 3 - 1, r % 2 == 0);
        check_exactly_once(p, r % 5, r % 2 == 0);
        epyq_pool_free(p);
    }
}
END_TEST

/* ---- determinism ------------------------------------------------------------------- */

/* Each task sums a long float series whose order is fixed inside the task, so the result must
 * not depend on which worker ran it or on the pool size. */
static float series(int32_t task) {
    float acc = 0.0f;
    uint32_t x = 2463534242u ^ (uint32_t)task * 2654435761u;
    for (int i = 0; i < 4096; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        acc += (float)(x & 0xffff) * 1e-3f - 32.0f;
    }
    return acc;
}

static void series_task(void *vctx, int32_t task, int32_t worker) {
    (void)worker;
    float *out = vctx;
    out[task] = series(task);
}

START_TEST(test_outputs_deterministic) {
    enum { N = 257 };
    float want[N], got[N];
    for (int32_t t = 0; t < N; t++) want[t] = series(t);
    int cpus[CPU_SETSIZE];
    int n_cpu = allowed_cpus(cpus, CPU_SETSIZE);
    for (int32_t n = 1; n <= n_cpu && n <= 4; n++) {
        epyq_pool *p = make_pool(n, NULL, -1, false);
        for (int rep = 0; rep < 3; rep++) {
            memset(got, 0, sizeof got);
            epyq_pool_run(p, series_task, got, N);
            ck_assert_int_eq(memcmp(got, want, sizeof want), 0);
        }
        epyq_pool_free(p);
    }
}
END_TEST

/* ---- nesting and detached pools ---------------------------------------------------- */

typedef struct {
    epyq_pool *pool;
    atomic_int inner_hits;
    atomic_int inner_wrong_worker;
} nest_ctx;

typedef struct {
    nest_ctx *outer;
    int32_t outer_worker;
} inner_arg;

static void inner_task(void *vctx, int32_t task, int32_t worker) {
    (void)task;
    inner_arg *a = vctx;
    atomic_fetch_add(&a->outer->inner_hits, 1);
    /* An inline nested run stays on the worker that issued it. */
    if (worker != a->outer_worker) atomic_store(&a->outer->inner_wrong_worker, 1);
}

static void outer_task(void *vctx, int32_t task, int32_t worker) {
    (void)task;
    nest_ctx *c = vctx;
    inner_arg a = {c, worker};
    epyq_pool_run(c->pool, inner_task, &a, 5);
}

START_TEST(test_nested_run_is_inline) {
    nest_ctx c = {0};
    c.pool = make_pool(2, NULL, -1, false);
    epyq_pool_run(c.pool, outer_task, &c, 6);
    ck_assert_int_eq(atomic_load(&c.inner_hits), 30);
    ck_assert_int_eq(atomic_load(&c.inner_wrong_worker), 0);
    epyq_pool_free(c.pool);
}
END_TEST

typedef struct {
    atomic_int *hits;   /* [n] */
    pthread_t driver;
    atomic_int ran_on_driver;
} det_ctx;

static void det_task(void *vctx, int32_t task, int32_t worker) {
    (void)worker;
    det_ctx *c = vctx;
    atomic_fetch_add(&c->hits[task], 1);
    if (pthread_equal(pthread_self(), c->driver)) atomic_store(&c->ran_on_driver, 1);
}

/* The dispatch pattern: start node 1 (detached), run node 0 on the driver, wait for node 1. */
START_TEST(test_detached_overlaps_driver_pool) {
    epyq_pool *p0 = make_pool(1, NULL, 0, false);
    epyq_pool *p1 = make_pool(1, NULL, 1, true);
    enum { N = 64 };
    for (int rep = 0; rep < 200; rep++) {
        atomic_int h0[N] = {0}, h1[N] = {0};
        det_ctx c0 = {.hits = h0, .driver = pthread_self()};
        det_ctx c1 = {.hits = h1, .driver = pthread_self()};
        int32_t n1 = rep % 3 == 0 ? 1 : N; /* a detached pool runs even one task on its thread */
        epyq_pool_start(p1, det_task, &c1, n1);
        epyq_pool_run(p0, det_task, &c0, N);
        epyq_pool_wait(p1);
        for (int t = 0; t < N; t++) {
            ck_assert_int_eq(atomic_load(&h0[t]), 1);
            ck_assert_int_eq(atomic_load(&h1[t]), t < n1 ? 1 : 0);
        }
        ck_assert_int_eq(atomic_load(&c1.ran_on_driver), 0);
    }
    /* Wait without a start, and start on a non-detached pool of one: both must be harmless. */
    epyq_pool_wait(p1);
    atomic_int h[4] = {0};
    det_ctx c = {.hits = h, .driver = pthread_self()};
    epyq_pool_start(p0, det_task, &c, 4);
    epyq_pool_wait(p0);
    for (int t = 0; t < 4; t++) ck_assert_int_eq(atomic_load(&h[t]), 1);
    epyq_pool_free(p1);
    epyq_pool_free(p0);
}
END_TEST

/* ---- pinning, names, errors -------------------------------------------------------- */

typedef struct {
    const int32_t *cpus; /* [n] */
    atomic_int wrong_cpu;
} pin_ctx;

static void pin_task(void *vctx, int32_t task, int32_t worker) {
    (void)task;
    pin_ctx *c = vctx;
    if (sched_getcpu() != c->cpus[worker]) atomic_store(&c->wrong_cpu, 1);
}

START_TEST(test_pinning_and_names) {
    int cpus[CPU_SETSIZE];
    int n_cpu = allowed_cpus(cpus, CPU_SETSIZE);
    int32_t list[2];
    int32_t n = n_cpu >= 2 ? 2 : 1;
    /* Reverse order, so a pool that ignored the list would be caught on a 2-CPU machine. */
    for (int32_t i = 0; i < n; i++) list[i] = cpus[n - 1 - i];
    cpu_set_t before, during, after;
    sched_getaffinity(0, sizeof before, &before);
    epyq_pool *p = make_pool(n, list, 3, false);
    pthread_getaffinity_np(pthread_self(), sizeof during, &during);
    ck_assert_int_eq(CPU_COUNT(&during), 1);
    ck_assert(CPU_ISSET(list[0], &during));
    pin_ctx c = {.cpus = list};
    for (int rep = 0; rep < 50; rep++) epyq_pool_run(p, pin_task, &c, 16);
    ck_assert_int_eq(atomic_load(&c.wrong_cpu), 0);
    ck_assert_int_eq(epyq_test_threads_named("numa3_t"), n - 1);
    epyq_pool_free(p);
    ck_assert_int_eq(epyq_test_threads_named_settled("numa3_t", 0), 0);
    pthread_getaffinity_np(pthread_self(), sizeof after, &after);
    ck_assert(CPU_EQUAL(&before, &after));
}
END_TEST

START_TEST(test_impossible_requests) {
    int cpus[CPU_SETSIZE];
    int n_cpu = allowed_cpus(cpus, CPU_SETSIZE);
    epyq_pool *p = NULL;
    epyq_err err = {0};

    /* A CPU outside the allowed set (one past the highest allowed id is never allowed). */
    int32_t outside[1] = {cpus[n_cpu - 1] + 1};
    epyq_pool_opts o = {.n_threads = 1, .cpus = outside, .node = 2};
    ck_assert_int_eq(epyq_pool_create(&p, &o, &err), EPYQ_E_NUMA);
    ck_assert_ptr_null(p);
    char want[64];
    snprintf(want, sizeof want, "cpu %d", (int)outside[0]);
    ck_assert_msg(strstr(err.msg, want) && strstr(err.msg, "allowed"), "message: %s", err.msg);

    int32_t dup[2] = {cpus[0], cpus[0]};
    o = (epyq_pool_opts){.n_threads = 2, .cpus = dup, .node = 0};
    ck_assert_int_eq(epyq_pool_create(&p, &o, &err), EPYQ_E_NUMA);
    ck_assert_msg(strstr(err.msg, "listed for workers 0 and 1"), "message: %s", err.msg);

    o = (epyq_pool_opts){.n_threads = n_cpu + 1, .node = -1};
    ck_assert_int_eq(epyq_pool_create(&p, &o, &err), EPYQ_E_NUMA);
    ck_assert_msg(strstr(err.msg, "oversubscribe"), "message: %s", err.msg);

    o = (epyq_pool_opts){.n_threads = -1, .node = -1};
    ck_assert_int_eq(epyq_pool_create(&p, &o, &err), EPYQ_E_ARG);
    ck_assert_ptr_null(p);
}
END_TEST

/* ---- idle pools sleep -------------------------------------------------------------- */

typedef struct {
    int tid;
    char state;
    long long ticks; /* utime + stime */
} task_stat;

static int read_tasks(task_stat *out, int max) {
    DIR *d = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (e->d_name[0] == '.') continue;
        char path[300], buf[1024];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        /* Fields after the parenthesised comm: state is 3rd, utime/stime are 14th/15th. */
        char *rp = strrchr(buf, ')');
        if (!rp) continue;
        long long ut = 0, stt = 0;
        char state = '?';
        if (sscanf(rp + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &state, &ut, &stt) != 3)
            continue;
        out[n++] = (task_stat){atoi(e->d_name), state, ut + stt};
    }
    closedir(d);
    return n;
}

START_TEST(test_idle_pool_sleeps) {
    int cpus[CPU_SETSIZE];
    int n_cpu = allowed_cpus(cpus, CPU_SETSIZE);
    int32_t n = n_cpu >= 2 ? 2 : 1;
    task_stat base[64];
    int n_base = read_tasks(base, 64);
    epyq_pool *p0 = make_pool(n, NULL, 0, false);
    epyq_pool *p1 = make_pool(1, NULL, 1, true);
    float out[64];
    for (int rep = 0; rep < 100; rep++) {
        epyq_pool_run(p0, series_task, out, 64);
        epyq_pool_run(p1, series_task, out, 8);
    }
    /* Past the spin budget (2 ms by default) every worker must be asleep in the kernel. */
    usleep(50 * 1000);
    task_stat a[64], b[64];
    int na = read_tasks(a, 64);
    ck_assert_int_eq(na, n_base + (n - 1) + 1);
    usleep(300 * 1000);
    int nb = read_tasks(b, 64);
    ck_assert_int_eq(nb, na);
    int self = (int)gettid();
    for (int i = 0; i < nb; i++) {
        if (b[i].tid == self) continue;
        ck_assert_msg(b[i].state == 'S', "thread %d is in state %c while the pools are idle", b[i].tid,
                      b[i].state);
        for (int j = 0; j < na; j++)
            if (a[j].tid == b[i].tid)
                /* 300 ms of spinning would be ~30 ticks; allow one tick of bookkeeping. */
                ck_assert_msg(b[i].ticks - a[j].ticks <= 1, "thread %d used %lld ticks while idle",
                              b[i].tid, b[i].ticks - a[j].ticks);
    }
    epyq_pool_free(p1);
    epyq_pool_free(p0);
    /* pthread_join returns when the thread is done; the kernel may list its tid a moment longer. */
    int left = read_tasks(a, 64);
    for (int i = 0; i < 100 && left != n_base; i++) {
        usleep(1000);
        left = read_tasks(a, 64);
    }
    ck_assert_int_eq(left, n_base);
}
END_TEST

static Suite *pool_suite(void) {
    Suite *s = suite_create("numa_pool");
    TCase *tc = epyq_test_case(s, "pool", 120);
    EPYQ_TESTS_ADD(tc, test_exactly_once_sizes, test_default_size_is_allowed_cpus,
                   test_back_to_back_runs, test_create_free_loop, test_outputs_deterministic,
                   test_nested_run_is_inline, test_detached_overlaps_driver_pool,
                   test_pinning_and_names, test_impossible_requests, test_idle_pool_sleeps);
    return s;
}

int main(void) { return epyq_test_run(pool_suite()); }
