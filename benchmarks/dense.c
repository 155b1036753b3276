/* benchmarks/dense.c — the dense kernels against this machine's read bandwidth, measured in
 * the same run:
 *   bf16_gemm / bf16_gemm_f32  a 131072 x 2048 bf16 matrix (512 MiB, ~5x a 105 MiB L3;
 *                              half an lm_head) at M = 1, 8, 32: GB/s of weight bytes and
 *                              the fraction of the read figure (target >= 85% at M = 1)
 *   prefill GEMM               in_proj_qkv 8192 x 2048 at M = 64, 256, 512: our bf16_gemm
 *                              vs oneDNN's bf16 matmul (GFLOP/s; the faster one wins)
 *   attn decode                16 q heads / 2 kv heads, hd 256, 4096 cached tokens: a one-token
 *                              tile (the model's decode) and the GQA entry (K/V read once per
 *                              kv head) vs 16 single-head calls; each call reads the next of
 *                              A_COPIES caches (96 MiB in all), so K/V come from DRAM as in
 *                              the model's decode, where 10 layers' caches and the weights
 *                              pass between two reads of one layer's
 *   attn prefill               the same heads, the last 512 tokens of that 4096-token prompt
 *                              (causal): the GQA entry per token vs prompt tiles of 2/4/8 tokens
 *   gdn_step                   32 value heads of 128 x 128 fp32 state (one layer, one token)
 *   gdn prefill                the same heads over a 256-token prompt, rows laid out as the
 *                              model's (a projection row apart): one gdn_step per token vs
 *                              gdn_seq over the run (one pass over an L1-resident strip a token)
 * Rows are split over an epyq pool (numa/pool.h) of 1..N pinned threads, as in the runtime.
 *
 *   benchmarks/dense [-t 1,2] [--reps N] [--json] [--quick] [--only gemv|prefill|attn|gdn]
 * oneDNN picks its own ISA: on Sapphire Rapids it runs AMX tiles, which Zen 4/5 lack; set
 * ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 there to see what a Zen part would get.
 * Every figure is the median of --reps timed runs (default 7) after one warm-up, with the
 * min-max range. --json prints one object per row with kernel, shape, m, threads, gbps and
 * pct_read_bw (the columns of benchmarks/kernels). */
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels-x86/dnnl_gemm.h"
#include "core/util.h"
#include "kernels-x86/kern.h"
#include "kernels-x86/membw.h"
#include "numa/pool.h"

#define MAX_T 16
#define MAX_REPS 1000

static int reps = 7, json = 0;
static const epyq_kern_table *K;

typedef struct {
    double med, min, max; /* seconds */
} timing;

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Run fn(ctx) once untimed, then `reps` timed times. */
static timing time_it(void (*fn)(void *), void *ctx) {
    double t[MAX_REPS];
    fn(ctx);
    for (int r = 0; r < reps; r++) {
        const double t0 = epyq_now();
        fn(ctx);
        t[r] = epyq_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    const double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    return (timing){med, t[0], t[reps - 1]};
}

/* One output row. bytes: bytes streamed per call (0 = not a streaming kernel);
 * flops: per call (0 = not reported); read_gbps: membw read for this thread count. */
static void row(const char *kernel, const char *shape, int m, int threads, timing t,
                double bytes, double flops, double read_gbps, const char *note) {
    const double gbps = bytes / t.med / 1e9, pct = bytes > 0 ? 100.0 * gbps / read_gbps : 0.0;
    const double gflops = flops / t.med / 1e9;
    if (json) {
        printf("{\"bench\":\"dense\",\"kernel\":\"%s\",\"shape\":\"%s\",\"m\":%d,\"threads\":%d,"
               "\"kernels\":\"%s\",\"ms\":%.4f,\"ms_min\":%.4f,\"ms_max\":%.4f,\"gbps\":%.3f,"
               "\"pct_read_bw\":%.1f,\"gflops\":%.2f,\"read_gbps\":%.3f,\"note\":\"%s\"}\n",
               kernel, shape, m, threads, K->name, t.med * 1e3, t.min * 1e3, t.max * 1e3, gbps,
               pct, gflops, read_gbps, note);
    } else {
        printf("%-16s %-18s %4d %3d %9.3f %9.3f-%-9.3f", kernel, shape, m, threads, t.med * 1e3,
               t.min * 1e3, t.max * 1e3);
        if (bytes > 0)
            printf(" %8.2f %6.1f%%", gbps, pct);
        else
            printf(" %8s %7s", "-", "-");
        if (flops > 0)
            printf(" %9.1f", gflops);
        else
            printf(" %9s", "-");
        printf("  %s\n", note);
    }
    fflush(stdout);
}

/* ---- bf16 GEMM over a pool ------------------------------------------------------------ */

#define ROWS_PER_TASK 256

typedef struct {
    epyq_pool *pool;
    const uint16_t *w; /* [n][k] */
    int32_t n, k;
    epyq_act x;        /* [m][k] */
    float *y;          /* [m][n] */
    int exact;
} gemm_job;

static void gemm_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const gemm_job *j = ctx;
    const int32_t n0 = task * ROWS_PER_TASK;
    const int32_t n1 = n0 + ROWS_PER_TASK < j->n ? n0 + ROWS_PER_TASK : j->n;
    (j->exact ? K->bf16_gemm_f32 : K->bf16_gemm)(j->w, j->k, n0, n1, &j->x, j->y, j->n);
}

static void gemm_run(void *ctx) {
    gemm_job *j = ctx;
    epyq_pool_run(j->pool, gemm_task, j, (j->n + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
}

typedef struct {
    gemm_job *g;
    int threads;
    epyq_status st;
    epyq_err err;
} dnnl_job;

static void dnnl_run(void *ctx) {
    dnnl_job *d = ctx;
    if (d->st == EPYQ_OK)
        d->st = epyq_dnnl_gemm_bf16(d->g->x.f32, d->g->x.m, d->g->k, d->g->w, d->g->n, d->g->y,
                                    d->g->n, d->threads, &d->err);
}

static uint16_t *alloc_bf16(size_t n) {
    uint16_t *p = NULL;
    if (posix_memalign((void **)&p, 2u << 20, n * sizeof *p) != 0) return NULL;
    for (size_t i = 0; i < n; i++) p[i] = epyq_f32_to_bf16((float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f);
    return p;
}

static float *alloc_f32(size_t n) {
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, n * sizeof *p) != 0) return NULL;
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 40503u) % 997) * 1e-3f - 0.5f;
    return p;
}

/* ---- attention and GDN -------------------------------------------------------------------- */

enum { A_HEADS = 16, A_KV = 2, A_HD = 256, A_CTX = 4096, G_HEADS = 32, G_D = 128, G_TOK = 256 };
enum { A_COPIES = 12 }; /* decode rows rotate over this many caches of 8 MiB */

typedef struct {
    epyq_pool *pool;
    const float *q;      /* [A_HEADS][A_HD] */
    const uint16_t *kv;  /* [A_COPIES][2 (k,v)][A_KV][A_CTX][A_HD]: the model's cache layout (a
                            kv head's rows contiguous in its plane, stride A_HD) */
    float *out;          /* [A_HEADS][A_HD] */
    int multi;           /* 1 the GQA entry, 2 a one-token tile (the model's decode), 0 per head */
    int copy;            /* the cache this call reads */
} attn_job;

static void attn_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const attn_job *a = ctx;
    const size_t stride = A_HD, plane = (size_t)A_CTX * A_HD;
    const uint16_t *k = a->kv + (size_t)a->copy * 2 * A_KV * plane + (size_t)task * plane,
                   *v = k + A_KV * plane;
    const int g = A_HEADS / A_KV; /* q heads per kv head (task = kv head) */
    const float *q = a->q + (size_t)task * g * A_HD;
    float *o = a->out + (size_t)task * g * A_HD;
    const int32_t n = A_CTX;
    if (a->multi == 2)
        K->attn_bf16_tile(q, 1, g, 0, A_HD, &n, k, v, A_HD, (int32_t)stride, 0.0625f, o, 0, A_HD);
    else if (a->multi)
        K->attn_bf16_multi(q, g, A_HD, k, v, A_CTX, A_HD, (int32_t)stride, 0.0625f, o, A_HD);
    else
        for (int h = 0; h < g; h++)
            K->attn_bf16(q + (size_t)h * A_HD, k, v, A_CTX, A_HD, (int32_t)stride, 0.0625f,
                         o + (size_t)h * A_HD);
}

static void attn_run(void *ctx) {
    attn_job *a = ctx;
    epyq_pool_run(a->pool, attn_task, a, A_KV);
    a->copy = (a->copy + 1) % A_COPIES;
}

enum { A_UB = 512 }; /* prompt tokens of the prefill rows: positions A_CTX - A_UB .. A_CTX - 1 */

typedef struct {
    epyq_pool *pool;
    const float *q;     /* [A_UB][A_HEADS][A_HD] */
    const uint16_t *kv; /* as attn_job's, the first copy (a prompt's tiles reread it) */
    float *out;         /* [A_UB][A_HEADS][A_HD] */
    int nt;             /* tokens per tile; 0 = the GQA entry once per token */
} prefill_job;

static void prefill_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const prefill_job *a = ctx;
    const int32_t stride = A_HD, g = A_HEADS / A_KV, ld = A_HEADS * A_HD;
    const int32_t kvh = task % A_KV, nt = a->nt ? a->nt : 1, t0 = task / A_KV * nt;
    const size_t plane = (size_t)A_CTX * A_HD;
    const uint16_t *k = a->kv + (size_t)kvh * plane, *v = k + A_KV * plane;
    const float *q = a->q + (size_t)t0 * ld + (size_t)kvh * g * A_HD;
    float *o = a->out + (size_t)t0 * ld + (size_t)kvh * g * A_HD;
    int32_t n[A_UB];
    for (int32_t i = 0; i < nt; i++) n[i] = A_CTX - A_UB + t0 + i + 1;
    if (a->nt) K->attn_bf16_tile(q, nt, g, ld, A_HD, n, k, v, A_HD, stride, 0.0625f, o, ld, A_HD);
    else
        K->attn_bf16_multi(q, g, A_HD, k, v, n[0], A_HD, stride, 0.0625f, o, A_HD);
}

static void prefill_run(void *ctx) {
    prefill_job *a = ctx;
    epyq_pool_run(a->pool, prefill_task, a, A_UB / (a->nt ? a->nt : 1) * A_KV);
}

typedef struct {
    epyq_pool *pool;
    float *S;               /* [G_HEADS][G_D][G_D] */
    const float *k, *v, *q; /* [G_HEADS][G_D] */
    float *o;               /* [G_HEADS][G_D] */
} gdn_job;

static void gdn_task(void *ctx, int32_t h, int32_t worker) {
    (void)worker;
    const gdn_job *g = ctx;
    const size_t off = (size_t)h * G_D;
    /* alpha just below 1 keeps the state bounded over many repetitions */
    K->gdn_step(g->S + off * G_D, g->k + off, g->v + off, g->q + off, 0.999f, 0.5f, G_D, G_D,
                g->o + off);
}

static void gdn_run(void *ctx) {
    gdn_job *g = ctx;
    epyq_pool_run(g->pool, gdn_task, g, G_HEADS);
}

/* A prompt of G_TOK tokens per head: q | k | v of head h at h * 3 G_D in a token's row. */
typedef struct {
    epyq_pool *pool;
    int seq;              /* 1: gdn_seq over the run, 0: one gdn_step per token */
    float *S;             /* [G_HEADS][G_D][G_D] */
    const float *u;       /* [G_TOK][G_HEADS][3][G_D] */
    float *o;             /* [G_TOK][G_HEADS][G_D] */
    const float *al, *be; /* [G_TOK] */
} gdn_prompt_job;

static void gdn_prompt_task(void *ctx, int32_t h, int32_t worker) {
    (void)worker;
    const gdn_prompt_job *g = ctx;
    const size_t ld = (size_t)G_HEADS * 3 * G_D, ldo = (size_t)G_HEADS * G_D;
    const float *q = g->u + (size_t)h * 3 * G_D, *k = q + G_D, *v = q + 2 * G_D;
    float *S = g->S + (size_t)h * G_D * G_D, *o = g->o + (size_t)h * G_D;
    if (g->seq) {
        K->gdn_seq(S, k, v, q, ld, NULL, G_TOK, g->al, g->be, G_D, G_D, o, ldo);
        return;
    }
    for (size_t t = 0; t < G_TOK; t++)
        K->gdn_step(S, k + t * ld, v + t * ld, q + t * ld, g->al[t], g->be[t], G_D, G_D,
                    o + t * ldo);
}

static void gdn_prompt_run(void *ctx) {
    gdn_prompt_job *g = ctx;
    epyq_pool_run(g->pool, gdn_prompt_task, g, G_HEADS);
}

static int section(const char *only, const char *name) { return !only || strcmp(only, name) == 0; }

static void usage(FILE *f) {
    fprintf(f, "usage: dense [-t|--threads LIST] [--reps N] [--json] [--quick]\n"
               "  -t LIST   thread counts (default 1,<allowed CPUs>)\n"
               "  --reps N  timed repetitions per row, median reported (default 7)\n"
               "  --json    one JSON object per row\n"
               "  --quick   smaller GEMV matrix (128 MiB) and no M=512 prefill row\n"
               "  --only S  one section: gemv, prefill, attn or gdn\n");
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"threads", required_argument, NULL, 't'},
                                         {"reps", required_argument, NULL, 'r'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"quick", no_argument, NULL, 'q'},
                                         {"only", required_argument, NULL, 'o'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int thr[MAX_T], nthr = 0, quick = 0, c;
    const char *only = NULL; /* NULL = every section */
    while ((c = getopt_long(argc, argv, "t:h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 't':
            nthr = epyq_parse_int_list(optarg, thr, MAX_T);
            for (int i = 0; i < nthr; i++)
                if (thr[i] < 1 || thr[i] > 1024) nthr = -1;
            if (nthr < 1) {
                fprintf(stderr, "dense: -t %s: expected thread counts like 1,2\n", optarg);
                return 2;
            }
            break;
        case 'r':
            reps = (int)strtol(optarg, &end, 10);
            if (!end || *end || reps < 1 || reps > MAX_REPS) {
                fprintf(stderr, "dense: --reps %s: expected 1..%d\n", optarg, MAX_REPS);
                return 2;
            }
            break;
        case 'j': json = 1; break;
        case 'q': quick = 1; break;
        case 'o':
            if (strcmp(optarg, "gemv") && strcmp(optarg, "prefill") && strcmp(optarg, "attn") &&
                strcmp(optarg, "gdn")) {
                fprintf(stderr, "dense: --only %s: expected gemv, prefill, attn or gdn\n", optarg);
                return 2;
            }
            only = optarg;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dense: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    epyq_err err;
    if (epyq_kern_init(&err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    K = epyq_kern();
    int32_t cpus[1024];
    int ncpu = 0;
    {
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) == 0)
            for (int i = 0; i < CPU_SETSIZE && ncpu < 1024; i++)
                if (CPU_ISSET(i, &set)) cpus[ncpu++] = i;
        if (ncpu == 0) cpus[ncpu++] = 0;
    }
    if (nthr == 0) {
        thr[nthr++] = 1;
        if (ncpu > 1) thr[nthr++] = ncpu;
    }

    const int32_t gn = quick ? 32768 : 131072, gk = 2048, pn = 8192, pk = 2048;
    uint16_t *gw = alloc_bf16((size_t)gn * gk), *pw = alloc_bf16((size_t)pn * pk);
    float *x = alloc_f32((size_t)512 * gk), *y = alloc_f32((size_t)512 * (size_t)gn);
    uint16_t *kv = alloc_bf16((size_t)A_COPIES * 2 * A_CTX * A_KV * A_HD);
    float *aq = alloc_f32((size_t)A_UB * A_HEADS * A_HD),
          *ao = alloc_f32((size_t)A_UB * A_HEADS * A_HD);
    float *S = alloc_f32((size_t)G_HEADS * G_D * G_D), *gv = alloc_f32((size_t)3 * G_HEADS * G_D);
    float *go = alloc_f32((size_t)G_HEADS * G_D);
    float *gu = alloc_f32((size_t)G_TOK * G_HEADS * 3 * G_D),
          *gpo = alloc_f32((size_t)G_TOK * G_HEADS * G_D);
    float *gab = alloc_f32(2 * (size_t)G_TOK);
    if (!gw || !pw || !x || !y || !kv || !aq || !ao || !S || !gv || !go || !gu || !gpo || !gab) {
        fprintf(stderr, "epyq: dense: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)G_HEADS * G_D * G_D; i++) S[i] *= 0.01f;
    /* unit k, q scaled by 1/sqrt(G_D) as the model feeds them; alpha < 1 keeps S bounded */
    for (size_t r = 0; r < (size_t)G_TOK * G_HEADS; r++)
        for (int part = 0; part < 2; part++) {
            float *w = gu + r * 3 * G_D + (size_t)part * G_D;
            double ss = 0.0;
            for (int i = 0; i < G_D; i++) ss += (double)w[i] * w[i];
            const float sc = (float)((part ? 1.0 : 1.0 / sqrt((double)G_D)) / sqrt(ss + 1e-6));
            for (int i = 0; i < G_D; i++) w[i] *= sc;
        }
    for (int t = 0; t < G_TOK; t++) gab[t] = 0.99f, gab[G_TOK + t] = 0.5f;

    if (!json)
        printf("dense: kernels %s, %d reps (+1 warm-up), times in ms (median min-max), GB = 1e9 B\n"
               "%-16s %-18s %4s %3s %9s %-19s %8s %7s %9s\n",
               K->name, reps, "kernel", "shape", "m", "thr", "median", "  min-max", "GB/s",
               "%read", "GFLOP/s");
    char shape[64];
    for (int ti = 0; ti < nthr; ti++) {
        const int t = thr[ti];
        int32_t pin[1024];
        for (int i = 0; i < t; i++) pin[i] = cpus[i % ncpu];
        epyq_pool *pool;
        const epyq_pool_opts po = {.n_threads = t, .cpus = pin, .node = -1};
        if (epyq_pool_create(&pool, &po, &err) != EPYQ_OK) {
            fprintf(stderr, "epyq: %s\n", err.msg);
            return 1;
        }
        const double rd = epyq_membw_read_gbps((size_t)1 << 30, t);
        if (json)
            printf("{\"bench\":\"dense\",\"kernel\":\"membw_read\",\"shape\":\"1024MiB\",\"m\":0,"
                   "\"threads\":%d,\"kernels\":\"%s\",\"gbps\":%.3f,\"pct_read_bw\":100.0}\n",
                   t, K->name, rd);
        else
            printf("%-16s %-18s %4s %3d %29s %8.2f %6.1f%%\n", "membw_read", "1024MiB", "-", t, "",
                   rd, 100.0);

        gemm_job g = {.pool = pool, .w = gw, .n = gn, .k = gk, .y = y};
        snprintf(shape, sizeof shape, "%dx%d", gn, gk);
        /* m = 3: a speculative verify step (the last token and 2 drafts); 8 and 32: batched
         * decode. The exact variant is the lm_head's, so it gets every row too. */
        static const int ms[] = {1, 3, 8, 32};
        for (int e = 0; e < 2 && section(only, "gemv"); e++)
            for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
                g.exact = e;
                g.x = (epyq_act){.m = ms[mi], .k = gk, .gs = 128, .path = EPYQ_PATH_A16, .f32 = x};
                row(e ? "bf16_gemm_f32" : "bf16_gemm", shape, ms[mi], t, time_it(gemm_run, &g),
                    (double)gn * gk * 2, 2.0 * ms[mi] * gn * gk, rd, "");
            }

        gemm_job p = {.pool = pool, .w = pw, .n = pn, .k = pk, .y = y};
        snprintf(shape, sizeof shape, "%dx%d", pn, pk);
        static const int pms[] = {64, 256, 512};
        for (size_t mi = 0; mi < (quick ? 2u : 3u) && section(only, "prefill"); mi++) {
            p.x = (epyq_act){.m = pms[mi], .k = pk, .gs = 128, .path = EPYQ_PATH_A16, .f32 = x};
            const double fl = 2.0 * pms[mi] * pn * pk;
            const timing ours = time_it(gemm_run, &p);
            row("bf16_gemm", shape, pms[mi], t, ours, (double)pn * pk * 2, fl, rd, "prefill");
            dnnl_job d = {.g = &p, .threads = t, .st = EPYQ_OK};
            if (!epyq_dnnl_available()) continue;
            const timing dn = time_it(dnnl_run, &d);
            if (d.st != EPYQ_OK) {
                fprintf(stderr, "epyq: %s\n", d.err.msg);
                continue;
            }
            row("dnnl_matmul", shape, pms[mi], t, dn, (double)pn * pk * 2, fl, rd,
                dn.med < ours.med ? "prefill, oneDNN wins" : "prefill, ours wins");
        }

        attn_job a = {.pool = pool, .q = aq, .kv = kv, .out = ao};
        const double kv_bytes = 2.0 * A_CTX * A_KV * A_HD * 2;
        for (int mq = 2; mq >= 0 && section(only, "attn"); mq--) {
            a.multi = mq;
            row(mq == 2 ? "attn_bf16_tile"
                : mq    ? "attn_bf16_multi"
                        : "attn_bf16 x16",
                "16q/2kv hd256 4096", 1, t, time_it(attn_run, &a), kv_bytes,
                4.0 * A_HEADS * A_CTX * A_HD, rd, "decode, one layer, cache from DRAM");
        }
        prefill_job pa = {.pool = pool, .q = aq, .kv = kv, .out = ao};
        /* keys seen: sum over the prompt's tokens of pos + 1, per kv head */
        const double seen = (double)A_UB * (A_CTX - A_UB) + (double)A_UB * (A_UB + 1) / 2;
        static const int nts[] = {0, 2, 4, 8};
        for (size_t i = 0; i < sizeof nts / sizeof *nts && section(only, "attn"); i++) {
            pa.nt = nts[i];
            snprintf(shape, sizeof shape, "16q/2kv hd256 %d", A_CTX);
            char what[64];
            snprintf(what, sizeof what, "prefill, last %d tokens; tiles of %d", A_UB,
                     nts[i] ? nts[i] : 1);
            row(nts[i] ? "attn_bf16_tile" : "attn_bf16_multi", shape, A_UB, t,
                time_it(prefill_run, &pa), 2.0 * seen * A_KV * A_HD * 2 / (nts[i] ? nts[i] : 1),
                4.0 * A_HEADS / A_KV * seen * A_KV * A_HD, rd, what);
        }
        gdn_job gj = {.pool = pool, .S = S, .k = gv, .v = gv + G_HEADS * G_D, .q = gv + 2 * G_HEADS * G_D, .o = go};
        if (section(only, "gdn"))
            row("gdn_step", "32 x 128x128", 1, t, time_it(gdn_run, &gj),
                (double)G_HEADS * G_D * G_D * 4 * 2, 6.0 * G_HEADS * G_D * G_D, rd,
                "one layer; bytes = state read+write (cache-resident)");
        for (int sq = 0; sq < 2 && section(only, "gdn"); sq++) {
            gdn_prompt_job gp = {pool, sq, S, gu, gpo, gab, gab + G_TOK};
            snprintf(shape, sizeof shape, "32 x 128x128 %d", G_TOK);
            row(sq ? "gdn_seq" : "gdn_step x tok", shape, G_TOK, t, time_it(gdn_prompt_run, &gp),
                0.0, 6.0 * G_TOK * G_HEADS * G_D * G_D, rd, "prompt, one layer");
        }
        epyq_pool_free(pool);
    }
    epyq_dnnl_release();
    free(gw);
    free(pw);
    free(x);
    free(y);
    free(kv);
    free(aq);
    free(ao);
    free(S);
    free(gv);
    free(go);
    free(gu);
    free(gpo);
    free(gab);
    return 0;
}
