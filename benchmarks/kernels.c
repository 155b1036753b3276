/* benchmarks/kernels.c — speed of the weight kernels against this machine's memory and
 * instruction limits, measured side by side in one run.
 *
 * Rows (each at M = 1, 8, 32 activation rows, on 1 and 2 threads; int4 rows on both
 * numeric paths A16 and A8):
 *   w4_expert  one routed expert: gate/up 512x2048 + down 2048x512 int4 g128, fused
 *   w4_moe8    one MoE layer's 8 routed experts as a batch (experts split across threads)
 *   w4_gemm    DeltaNet in_proj_qkv 8192x2048 int4, and lm_head 248320x2048 int4
 *   bf16_gemm  DeltaNet in_proj_qkv 8192x2048 BF16, and lm_head 248320x2048 BF16
 *   bf16_gemm_f32  lm_head 248320x2048 BF16 with x kept fp32 (what the model runs)
 * Every working set is many distinct weight copies totalling --ws-mib (default 512 MiB, far
 * beyond any L3), visited round-robin, so M = 1 figures are DRAM figures, not cache.
 * Threads are plain pthreads pinned one per allowed CPU; rows are split between them (experts
 * of a batch, intermediate slices of one expert) and a spin barrier ends every item, as a
 * layer boundary would. Activations are prepared once per row (untimed).
 *
 * Columns: median time per item and its min-max over --reps passes (default 5), GB/s of
 * weight bytes streamed (packed int4 incl. scales, or bf16), that as % of the read bandwidth
 * (median over passes of each pass's GB/s over a read probe run by the same threads right
 * after it, with the table's stream_read over a --ws-mib buffer; the membw figure of the
 * header, measured once at the start, is for reference), GOPS (2 m n k per item) and % of the
 * register-only instruction peak (VPDPBUSD for A8, VPDPWSSD for A16, VDPBF16PS for bf16, fp32 FMA
 * for bf16_gemm_f32) times the thread count. --json prints one object per row. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/kern.h"
#include "kernels-x86/membw.h"
#include "kernels-x86/w4_impl.h"

#define MAX_THREADS 64
#define MAX_REPS 101
#define MAX_M 512 /* activation rows: prefill chunks and many-sequence steps */

/* ---- options ----------------------------------------------------------------------------- */

typedef struct {
    int json;
    int reps;
    int n_threads, threads[8];
    int n_m, ms[8];
    size_t ws_bytes;
    const char *only; /* run only rows whose "kernel shape" contains this */
    int path_mask;    /* bit 0: A16, bit 1: A8 (int4 rows) */
} opts;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: benchmarks/kernels [--json] [-r REPS] [-t 1,2] [-m 1,8,32] [--ws-mib 512]\n"
        "                          [--only KERNEL] [--path A16|A8]\n"
        "  Times the int4 and bf16 weight kernels of the dispatch table (EPYQ_MAX_ISA caps it)\n"
        "  against the memory read bandwidth and the instruction peak measured in the same run.\n"
        "  --json        one JSON object per row (kernel, shape, path, m, threads, gbps,\n"
        "                pct_read_bw, ...)\n"
        "  -r, --reps    timed passes per row, median reported (default 5)\n"
        "  -t, --threads thread counts (default 1,2)\n"
        "  -m            activation rows, 1 to 512 (default 1,8,32; prefill: 64,256,512)\n"
        "  --ws-mib      working set per row in MiB (default 512; keep it >> L3)\n"
        "  --only        only rows whose \"kernel shape\" contains KERNEL (w4_expert, w4_moe8,\n"
        "                w4_gemm, bf16_gemm, bf16_gemm_f32, in_proj_qkv, lm_head)\n"
        "  --path        A16 or A8: only that numeric path for the int4 rows\n");
}

static int parse_opts(int argc, char **argv, opts *o) {
    *o = (opts){.reps = 5, .n_threads = 2, .threads = {1, 2}, .n_m = 3, .ms = {1, 8, 32},
                .ws_bytes = (size_t)512 << 20, .path_mask = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if ((!strcmp(a, "-r") || !strcmp(a, "--reps")) && v) {
            o->reps = atoi(v);
            i++;
            if (o->reps < 1 || o->reps > MAX_REPS) return -1;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && v) {
            o->n_threads = epyq_parse_int_list(v, o->threads, 8);
            i++;
            if (o->n_threads < 1) return -1;
            for (int j = 0; j < o->n_threads; j++)
                if (o->threads[j] < 1 || o->threads[j] > MAX_THREADS) return -1;
        } else if (!strcmp(a, "-m") && v) {
            o->n_m = epyq_parse_int_list(v, o->ms, 8);
            i++;
            if (o->n_m < 1) return -1;
            for (int j = 0; j < o->n_m; j++)
                if (o->ms[j] < 1 || o->ms[j] > MAX_M) return -1;
        } else if (!strcmp(a, "--ws-mib") && v) {
            const long mib = atol(v);
            i++;
            if (mib < 1 || mib > (1L << 20)) return -1;
            o->ws_bytes = (size_t)mib << 20;
        } else if (!strcmp(a, "--path") && v) {
            o->path_mask = !strcmp(v, "A16") ? 1 : !strcmp(v, "A8") ? 2 : 0;
            i++;
            if (!o->path_mask) return -1;
        } else if (!strcmp(a, "--only") && v) {
            o->only = v;
            i++;
        } else {
            return -1;
        }
    }
    return 0;
}

/* ---- threads ----------------------------------------------------------------------------- */

/* Sense-reversing spin barrier: the per-item synchronisation a layer boundary costs. */
typedef struct {
    atomic_int count, sense;
    int n;
} spin_barrier;

static void barrier_wait(spin_barrier *b, int *local_sense) {
    *local_sense = !*local_sense;
    if (atomic_fetch_add(&b->count, 1) == b->n - 1) {
        atomic_store(&b->count, 0);
        atomic_store(&b->sense, *local_sense);
    } else {
        /* Spin, then yield: on a shared or oversubscribed machine a pure spin would take
         * the CPU from the thread being waited for. */
        for (int spins = 0;
             atomic_load_explicit(&b->sense, memory_order_acquire) != *local_sense; spins++) {
            if (spins < 4096)
                __builtin_ia32_pause();
            else
                sched_yield();
        }
    }
}

struct row;
/* Compute thread tid's share of item `item`. */
typedef void (*item_fn)(struct row *r, int tid, int item);

typedef struct row {
    const epyq_kern_table *kt;
    int threads, m, n_items, reps;
    item_fn fn;
    spin_barrier bar;
    double times[MAX_REPS]; /* seconds per pass over all items */
    double ptimes[MAX_REPS]; /* seconds of the read probe right after each pass */
    /* kernel-specific state */
    epyq_w4 *w4;            /* [n_copies] int4 matrices (gemm) or [n_copies][3] (experts) */
    const uint16_t *bf16;   /* [n_copies][n][k] */
    int bf16_f32;           /* 1: the fp32-x variant (bf16_gemm_f32) */
    int32_t n, k, n_copies;
    epyq_act x;             /* prepared activations [m][k] */
    float *y[MAX_THREADS];  /* per-thread outputs */
    void *scratch[MAX_THREADS];
    float rw[MAX_M];
} row;

typedef struct {
    row *r;
    int tid;
    int cpu;
} worker_arg;

static void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

/* The read probe every pass is paired with: this buffer, read by the same pinned threads
 * with the table's stream_read, right after the pass. The machine is shared and its
 * bandwidth drifts by tens of percent within a minute, so a figure measured once at the
 * start is not what a pass saw; each pass's %read uses its own neighbour. */
static const float *probe_buf;
static size_t probe_floats;
static double probe_sink;

static void *worker(void *p) {
    worker_arg *a = p;
    row *r = a->r;
    int sense = 0;
    pin(a->cpu);
    const size_t per = probe_floats / (size_t)r->threads / 16 * 16;
    for (int rep = -1; rep < r->reps; rep++) { /* rep -1: untimed warm-up */
        barrier_wait(&r->bar, &sense);
        const double t0 = epyq_now();
        for (int it = 0; it < r->n_items; it++) {
            r->fn(r, a->tid, it);
            barrier_wait(&r->bar, &sense);
        }
        const double t1 = epyq_now();
        const double sink = r->kt->stream_read(probe_buf + (size_t)a->tid * per, per);
        barrier_wait(&r->bar, &sense);
        if (a->tid == 0 && rep >= 0) {
            r->times[rep] = t1 - t0;
            r->ptimes[rep] = epyq_now() - t1;
            probe_sink += sink;
        }
    }
    return NULL;
}

static int cpu_list[MAX_THREADS], n_cpus;

static void run_row(row *r) {
    pthread_t th[MAX_THREADS];
    worker_arg args[MAX_THREADS];
    r->bar = (spin_barrier){.n = r->threads};
    for (int t = 0; t < r->threads; t++)
        args[t] = (worker_arg){r, t, n_cpus > 0 ? cpu_list[t % n_cpus] : -1};
    for (int t = 1; t < r->threads; t++) pthread_create(&th[t], NULL, worker, &args[t]);
    worker(&args[0]);
    for (int t = 1; t < r->threads; t++) pthread_join(th[t], NULL);
}

/* ---- the kernels' items ------------------------------------------------------------------- */

/* Rows [n0, n1) of thread tid's share of n, in whole 16-row tiles. */
static void split(int32_t n, int threads, int tid, int32_t *n0, int32_t *n1) {
    const int32_t tiles = (n + 15) / 16;
    *n0 = (int32_t)((int64_t)tiles * tid / threads) * 16;
    *n1 = (int32_t)((int64_t)tiles * (tid + 1) / threads) * 16;
    if (*n1 > n) *n1 = n;
}

static void item_w4_gemm(row *r, int tid, int item) {
    int32_t n0, n1;
    split(r->n, r->threads, tid, &n0, &n1);
    r->kt->w4_gemm(&r->w4[item % r->n_copies], n0, n1, &r->x, r->y[0], r->n);
}

static void item_bf16_gemm(row *r, int tid, int item) {
    int32_t n0, n1;
    split(r->n, r->threads, tid, &n0, &n1);
    const uint16_t *w = r->bf16 + (size_t)(item % r->n_copies) * (size_t)r->n * (size_t)r->k;
    (r->bf16_f32 ? r->kt->bf16_gemm_f32 : r->kt->bf16_gemm)(w, r->k, n0, n1, &r->x, r->y[0], r->n);
}

/* One expert; threads take equal intermediate slices (whole groups) and write own y. */
static void item_w4_expert(row *r, int tid, int item) {
    const epyq_w4 *e = &r->w4[(size_t)(item % r->n_copies) * 3];
    const int32_t groups = e[2].k / e[2].gs;
    const int32_t i0 = groups * tid / r->threads * e[2].gs;
    const int32_t i1 = groups * (tid + 1) / r->threads * e[2].gs;
    if (i1 > i0)
        r->kt->w4_expert(&e[0], &e[1], &e[2], i0, i1, &r->x, r->rw, r->y[tid], e[2].n,
                         r->scratch[tid]);
}

/* Eight experts of one layer; thread tid runs experts tid, tid + T, ... whole. */
static void item_w4_moe8(row *r, int tid, int item) {
    for (int j = tid; j < 8; j += r->threads) {
        const epyq_w4 *e = &r->w4[(size_t)((item * 8 + j) % r->n_copies) * 3];
        r->kt->w4_expert(&e[0], &e[1], &e[2], 0, e[0].n, &r->x, r->rw, r->y[tid], e[2].n,
                         r->scratch[tid]);
    }
}

/* ---- weights ------------------------------------------------------------------------------ */

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static void *xalloc(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "epyq: benchmarks/kernels: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

/* One packed random int4 matrix (symmetric, g128), then copies of its bytes: the data does not
 * change the speed, distinct memory does. */
static void make_w4_copies(epyq_w4 *out, int stride, int n_copies, int32_t n, int32_t k) {
    const int32_t gs = 128, G = k / gs;
    uint8_t *q = xalloc((size_t)n * (size_t)k);
    float *s = xalloc((size_t)n * (size_t)G * sizeof(float));
    for (size_t i = 0; i < (size_t)n * (size_t)k; i++) q[i] = (uint8_t)(rnd() & 15);
    for (size_t i = 0; i < (size_t)n * (size_t)G; i++) s[i] = 0.01f + (float)(rnd() % 100) * 1e-4f;
    const epyq_q4_canon c = {.n = n, .k = k, .gs = gs, .q = q, .s = s, .z = NULL};
    const size_t bytes = epyq_w4_pack_bytes(n, k, gs, 0);
    epyq_err err;
    void *mem0 = xalloc(bytes);
    if (epyq_w4_pack(&out[0], mem0, &c, &err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        exit(1);
    }
    for (int i = 1; i < n_copies; i++) {
        out[(size_t)i * stride] = out[0];
        out[(size_t)i * stride].mem = xalloc(bytes);
        memcpy(out[(size_t)i * stride].mem, mem0, bytes);
    }
    free(q);
    free(s);
}

static void free_w4(epyq_w4 *w, size_t count) {
    for (size_t i = 0; i < count; i++) free(w[i].mem);
    free(w);
}

/* ---- reporting ---------------------------------------------------------------------------- */

typedef struct {
    double read_gbps[MAX_THREADS + 1]; /* by thread count */
    double peak[6];                    /* ops/s of one thread by peak_kind; 0 = ISA lacks it */
} limits;

/* The instruction a row is judged against. */
enum peak_kind { PEAK_BF16, PEAK_A8, PEAK_A16, PEAK_AMX, PEAK_AMX_A16, PEAK_FMA };

/* The peak an int4 row is judged against: the tiles' from 16 activation rows where the
 * table has them (kernels-x86/avx512/w4_amx.c, AMX_MIN_ROWS), else VPDPBUSD / VPDPWSSD. */
static enum peak_kind int4_peak(const limits *lim, int a8, int m) {
    if (lim->peak[PEAK_AMX] > 0 && m >= 16) return a8 ? PEAK_AMX : PEAK_AMX_A16;
    return a8 ? PEAK_A8 : PEAK_A16;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const opts *o, const limits *lim, const row *r, const char *kernel,
                   const char *shape, const char *path, double bytes_per_item,
                   double ops_per_item, enum peak_kind pk) {
    double t[MAX_REPS], ratio[MAX_REPS], probe[MAX_REPS];
    memcpy(t, r->times, (size_t)r->reps * sizeof(double));
    qsort(t, (size_t)r->reps, sizeof(double), cmp_d);
    const double per = 1.0 / r->n_items;
    const double med = t[r->reps / 2] * per, tmin = t[0] * per, tmax = t[r->reps - 1] * per;
    const double gbps = bytes_per_item / med / 1e9;
    /* %read: median over passes of (this pass's GB/s) / (its probe's GB/s) */
    const size_t probe_bytes = probe_floats / (size_t)r->threads / 16 * 16 * (size_t)r->threads * sizeof(float);
    for (int i = 0; i < r->reps; i++) {
        probe[i] = (double)probe_bytes / r->ptimes[i] / 1e9;
        ratio[i] = bytes_per_item * r->n_items / r->times[i] / 1e9 / probe[i];
    }
    qsort(ratio, (size_t)r->reps, sizeof(double), cmp_d);
    qsort(probe, (size_t)r->reps, sizeof(double), cmp_d);
    const double rd = probe[r->reps / 2];
    const double pct_bw = 100.0 * ratio[r->reps / 2];
    const double gops = ops_per_item / med / 1e9;
    const double peak = lim->peak[pk] * r->threads / 1e9;
    const double pct_peak = peak > 0 ? 100.0 * gops / peak : NAN;
    if (o->json) {
        printf("{\"kernel\":\"%s\",\"shape\":\"%s\",\"path\":\"%s\",\"table\":\"%s\",\"m\":%d,"
               "\"threads\":%d,\"time_us\":%.2f,\"time_us_min\":%.2f,\"time_us_max\":%.2f,"
               "\"gbps\":%.2f,\"gbps_min\":%.2f,\"gbps_max\":%.2f,\"read_gbps\":%.2f,"
               "\"pct_read_bw\":%.1f,\"gops\":%.1f,\"peak_gops\":%.1f,\"pct_peak\":%.1f,"
               "\"reps\":%d}\n",
               kernel, shape, path, r->kt->name, r->m, r->threads, med * 1e6, tmin * 1e6,
               tmax * 1e6, gbps, bytes_per_item / tmax / 1e9, bytes_per_item / tmin / 1e9, rd,
               pct_bw, gops, peak, pct_peak, r->reps);
    } else {
        /* One table per kernel and shape: a blank line and the header when either changes. */
        static char last[128];
        char key[128];
        snprintf(key, sizeof key, "%s %s", kernel, shape);
        if (strcmp(key, last) != 0) {
            snprintf(last, sizeof last, "%s", key);
            printf("\n%-13s %-26s %-4s %3s %2s %10s [%9s-%9s] %7s %7s %8s %7s\n", "kernel",
                   "shape", "path", "m", "t", "us/item", "min", "max", "GB/s", "%read", "GOPS",
                   "%peak");
        }
        printf("%-13s %-26s %-4s %3d %2d %10.1f [%9.1f-%9.1f] %7.2f %6.1f%% %8.1f %6.1f%%\n",
               kernel, shape, path, r->m, r->threads, med * 1e6, tmin * 1e6, tmax * 1e6, gbps,
               pct_bw, gops, pct_peak);
    }
    fflush(stdout);
}

/* ---- the rows ----------------------------------------------------------------------------- */

static void prep_x(row *r, int32_t k, epyq_numpath path, void **xbuf, float **xf) {
    *xf = xalloc((size_t)r->m * (size_t)k * sizeof(float));
    for (size_t i = 0; i < (size_t)r->m * (size_t)k; i++)
        (*xf)[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    *xbuf = xalloc(epyq_act_bytes(r->m, k, 128, path));
    r->kt->act_prep(&r->x, *xf, r->m, k, 128, path, *xbuf);
    for (int t = 0; t < r->m; t++) r->rw[t] = 0.125f;
}

static void bench_gemm_w4(const opts *o, const limits *lim, const epyq_kern_table *kt,
                          const char *shape, int32_t n, int32_t k) {
    const size_t one = epyq_w4_pack_bytes(n, k, 128, 0);
    const int copies = (int)(o->ws_bytes / one > 0 ? o->ws_bytes / one : 1);
    epyq_w4 *w = calloc((size_t)copies, sizeof *w);
    make_w4_copies(w, 1, copies, n, k);
    for (int p = 0; p < 2; p++)
        for (int mi = 0; mi < o->n_m && (o->path_mask >> p & 1); mi++)
            for (int ti = 0; ti < o->n_threads; ti++) {
                row r = {.kt = kt, .threads = o->threads[ti], .m = o->ms[mi], .reps = o->reps,
                         .fn = item_w4_gemm, .w4 = w, .n = n, .k = k, .n_copies = copies,
                         .n_items = copies};
                void *xb;
                float *xf;
                prep_x(&r, k, p ? EPYQ_PATH_A8 : EPYQ_PATH_A16, &xb, &xf);
                r.y[0] = xalloc((size_t)r.m * (size_t)n * sizeof(float));
                run_row(&r);
                report(o, lim, &r, "w4_gemm", shape, p ? "A8" : "A16", (double)w[0].bytes,
                       2.0 * r.m * n * (double)k, int4_peak(lim, p, r.m));
                free(r.y[0]);
                free(xb);
                free(xf);
            }
    free_w4(w, (size_t)copies);
}

/* f32: time bf16_gemm_f32 (x kept fp32: the model's exact linears, lm_head among them)
 * instead of bf16_gemm. */
static void bench_gemm_bf16(const opts *o, const limits *lim, const epyq_kern_table *kt,
                            const char *shape, int32_t n, int32_t k, int f32) {
    const size_t one = (size_t)n * (size_t)k * 2;
    const int copies = (int)(o->ws_bytes / one > 0 ? o->ws_bytes / one : 1);
    uint16_t *w = xalloc((size_t)copies * one);
    for (size_t i = 0; i < (size_t)copies * one / 2; i++)
        w[i] = epyq_f32_to_bf16((float)((int)(rnd() % 2001) - 1000) * 1e-4f);
    for (int mi = 0; mi < o->n_m; mi++)
        for (int ti = 0; ti < o->n_threads; ti++) {
            row r = {.kt = kt, .threads = o->threads[ti], .m = o->ms[mi], .reps = o->reps,
                     .fn = item_bf16_gemm, .bf16 = w, .bf16_f32 = f32, .n = n, .k = k,
                     .n_copies = copies, .n_items = copies};
            void *xb;
            float *xf;
            prep_x(&r, k, EPYQ_PATH_A16, &xb, &xf);
            r.y[0] = xalloc((size_t)r.m * (size_t)n * sizeof(float));
            run_row(&r);
            report(o, lim, &r, f32 ? "bf16_gemm_f32" : "bf16_gemm", shape, "bf16", (double)one,
                   2.0 * r.m * n * (double)k, f32 ? PEAK_FMA : PEAK_BF16);
            free(r.y[0]);
            free(xb);
            free(xf);
        }
    free(w);
}

/* Experts of the real model: gate/up [512][2048], down [2048][512], int4 g128. */
static void bench_experts(const opts *o, const limits *lim, const epyq_kern_table *kt, int moe8) {
    const int32_t hid = 2048, inter = 512;
    const size_t one = 2 * epyq_w4_pack_bytes(inter, hid, 128, 0) +
                       epyq_w4_pack_bytes(hid, inter, 128, 0);
    int copies = (int)(o->ws_bytes / one);
    if (copies < 8) copies = 8;
    epyq_w4 *w = calloc((size_t)copies * 3, sizeof *w);
    make_w4_copies(w + 0, 3, copies, inter, hid);
    make_w4_copies(w + 1, 3, copies, inter, hid);
    make_w4_copies(w + 2, 3, copies, hid, inter);
    for (int p = 0; p < 2; p++)
        for (int mi = 0; mi < o->n_m && (o->path_mask >> p & 1); mi++)
            for (int ti = 0; ti < o->n_threads; ti++) {
                row r = {.kt = kt, .threads = o->threads[ti], .m = o->ms[mi], .reps = o->reps,
                         .fn = moe8 ? item_w4_moe8 : item_w4_expert, .w4 = w, .n = hid,
                         .k = hid, .n_copies = copies, .n_items = moe8 ? copies / 8 : copies};
                void *xb;
                float *xf;
                prep_x(&r, hid, p ? EPYQ_PATH_A8 : EPYQ_PATH_A16, &xb, &xf);
                for (int t = 0; t < r.threads; t++) {
                    r.y[t] = xalloc((size_t)r.m * (size_t)hid * sizeof(float));
                    r.scratch[t] = xalloc(kt->w4_expert_scratch_bytes(r.m, inter, hid));
                }
                run_row(&r);
                const double per = moe8 ? 8.0 : 1.0;
                report(o, lim, &r, moe8 ? "w4_moe8" : "w4_expert",
                       moe8 ? "8x(2x512x2048+2048x512)" : "2x512x2048+2048x512", p ? "A8" : "A16",
                       per * (double)(w[0].bytes + w[1].bytes + w[2].bytes),
                       per * 2.0 * r.m * 3.0 * inter * (double)hid, int4_peak(lim, p, r.m));
                for (int t = 0; t < r.threads; t++) {
                    free(r.y[t]);
                    free(r.scratch[t]);
                }
                free(xb);
                free(xf);
            }
    free_w4(w, (size_t)copies * 3);
}

/* ---- limits ------------------------------------------------------------------------------- */

static uint64_t run_peak(enum peak_kind pk, uint64_t iters) {
    int32_t si;
    float sf;
    return pk == PEAK_A8    ? epyq_w4_peak_dpbusd_avx512vnni(iters, &si)
           : pk == PEAK_A16 ? epyq_w4_peak_dpwssd_avx512vnni(iters, &si)
           : pk == PEAK_AMX ? epyq_w4_peak_tdpbssd_amx(iters, &si)
           : pk == PEAK_FMA ? epyq_w4_peak_fma_avx512(iters, &sf)
                            : epyq_w4_peak_dpbf16_avx512bf16(iters, &sf);
}

static double time_peak(enum peak_kind pk) {
    uint64_t iters = 1 << 16, ops = 0;
    double dt = 0;
    for (;;) { /* grow until one run lasts >= 0.2 s; take the best of 3 */
        const double t0 = epyq_now();
        ops = run_peak(pk, iters);
        dt = epyq_now() - t0;
        if (dt >= 0.2) break;
        iters *= 2;
    }
    double best = (double)ops / dt;
    for (int i = 0; i < 2; i++) {
        const double t0 = epyq_now();
        ops = run_peak(pk, iters);
        dt = epyq_now() - t0;
        if ((double)ops / dt > best) best = (double)ops / dt;
    }
    return best;
}

static void measure_limits(const opts *o, const epyq_kern_table *kt, limits *lim) {
    memset(lim, 0, sizeof *lim);
    for (int i = 0; i < o->n_threads; i++) {
        const int t = o->threads[i];
        lim->read_gbps[t] = epyq_membw_read_gbps(2 * o->ws_bytes, t);
    }
    pin(n_cpus > 0 ? cpu_list[0] : -1);
    if (kt->isa >= EPYQ_ISA_AVX512_VNNI) lim->peak[PEAK_A8] = time_peak(PEAK_A8);
    if (kt->isa >= EPYQ_ISA_AVX512_VNNI) lim->peak[PEAK_A16] = time_peak(PEAK_A16);
    if (kt->isa >= EPYQ_ISA_AVX512_BF16) lim->peak[PEAK_BF16] = time_peak(PEAK_BF16);
    if (kt->isa >= EPYQ_ISA_AVX512) lim->peak[PEAK_FMA] = time_peak(PEAK_FMA);
    double amx = 0;
    if (kt->isa >= EPYQ_ISA_AVX512_AMX) {
        /* The int4 cores run on tiles from 16 activation rows: judge those rows against the
         * tiles. A8 uses every byte product; A16 needs two tile multiplies per 64 bytes of
         * int16 of which half the products are with zero bytes (w4_amx.c), so 1/4. */
        amx = time_peak(PEAK_AMX);
        lim->peak[PEAK_AMX] = amx;
        lim->peak[PEAK_AMX_A16] = amx / 4;
    }
    if (!o->json) {
        printf("# benchmarks/kernels: table %s (host %s), reps %d, working set %zu MiB per row\n",
               kt->name, epyq_isa_name(epyq_cpu_isa()), o->reps, o->ws_bytes >> 20);
        for (int i = 0; i < o->n_threads; i++)
            printf("# read bandwidth, %d thread(s): %.2f GB/s (median of 5, %zu MiB buffer)\n",
                   o->threads[i], lim->read_gbps[o->threads[i]], (2 * o->ws_bytes) >> 20);
        printf("# peak per thread: VPDPBUSD %.1f GOPS, VPDPWSSD %.1f GOPS, VDPBF16PS %.1f GFLOPS, "
               "fp32 FMA %.1f GFLOPS (register-only, 0 = not on this table)\n",
               lim->peak[PEAK_A8] / 1e9, lim->peak[PEAK_A16] / 1e9, lim->peak[PEAK_BF16] / 1e9,
               lim->peak[PEAK_FMA] / 1e9);
        if (amx > 0)
            printf("# peak per thread: AMX TDPBSSD %.1f GOPS; int4 rows with m >= 16 run on tiles "
                   "and are judged against it (A8) and a quarter of it (A16)\n",
                   amx / 1e9);
    } else {
        for (int i = 0; i < o->n_threads; i++)
            printf("{\"kernel\":\"read_bw\",\"shape\":\"%zuMiB\",\"m\":0,\"threads\":%d,"
                   "\"gbps\":%.2f,\"pct_read_bw\":100.0}\n",
                   (2 * o->ws_bytes) >> 20, o->threads[i], lim->read_gbps[o->threads[i]]);
        printf("{\"kernel\":\"peak\",\"shape\":\"register\",\"m\":0,\"threads\":1,\"gbps\":0,"
               "\"pct_read_bw\":0,\"dpbusd_gops\":%.1f,\"dpwssd_gops\":%.1f,\"dpbf16_gflops\":%.1f,"
               "\"fma_gflops\":%.1f,\"table\":\"%s\"}\n",
               lim->peak[PEAK_A8] / 1e9, lim->peak[PEAK_A16] / 1e9, lim->peak[PEAK_BF16] / 1e9,
               lim->peak[PEAK_FMA] / 1e9, kt->name);
    }
}

/* --only matches "kernel shape", so both "w4_gemm" and "lm_head" select rows. */
static int want(const opts *o, const char *kernel, const char *shape) {
    char name[128];
    snprintf(name, sizeof name, "%s %s", kernel, shape);
    return !o->only || strstr(name, o->only);
}

int main(int argc, char **argv) {
    opts o;
    if (parse_opts(argc, argv, &o) != 0) {
        fprintf(stderr, "benchmarks/kernels: bad arguments (try --help)\n");
        return 2;
    }
    epyq_err err;
    if (epyq_kern_init(&err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    const epyq_kern_table *kt = epyq_kern();
    cpu_set_t cs;
    if (sched_getaffinity(0, sizeof cs, &cs) == 0)
        for (int c = 0; c < CPU_SETSIZE && n_cpus < MAX_THREADS; c++)
            if (CPU_ISSET(c, &cs)) cpu_list[n_cpus++] = c;
    limits lim;
    measure_limits(&o, kt, &lim);
    /* the per-pass probe: as large as a row's working set, far beyond the last-level cache */
    probe_floats = o.ws_bytes / sizeof(float);
    float *pb = aligned_alloc(64, probe_floats * sizeof(float));
    if (!pb) {
        fprintf(stderr, "benchmarks/kernels: cannot allocate the %zu MiB read probe\n", o.ws_bytes >> 20);
        return 1;
    }
    for (size_t i = 0; i < probe_floats; i++) pb[i] = 1.0f;
    probe_buf = pb;
    if (want(&o, "w4_expert", "expert")) bench_experts(&o, &lim, kt, 0);
    if (want(&o, "w4_moe8", "experts")) bench_experts(&o, &lim, kt, 1);
    if (want(&o, "w4_gemm", "in_proj_qkv"))
        bench_gemm_w4(&o, &lim, kt, "in_proj_qkv 8192x2048", 8192, 2048);
    if (want(&o, "w4_gemm", "lm_head"))
        bench_gemm_w4(&o, &lim, kt, "lm_head 248320x2048", 248320, 2048);
    if (want(&o, "bf16_gemm", "in_proj_qkv"))
        bench_gemm_bf16(&o, &lim, kt, "in_proj_qkv 8192x2048", 8192, 2048, 0);
    if (want(&o, "bf16_gemm", "lm_head"))
        bench_gemm_bf16(&o, &lim, kt, "lm_head 248320x2048", 248320, 2048, 0);
    if (want(&o, "bf16_gemm_f32", "lm_head"))
        bench_gemm_bf16(&o, &lim, kt, "lm_head 248320x2048", 248320, 2048, 1);
    free(pb);
    return probe_sink < 0; /* the probe's sums are positive; this keeps them alive */
}
