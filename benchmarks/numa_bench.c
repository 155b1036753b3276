/* benchmarks/numa_bench.c — synchronisation cost of the per-node pools and of MoE dispatch,
 * for 1, 2, 4 logical nodes cut from this machine (--numa-split), with and without spinning.
 *
 *   benchmarks/numa_bench [--split 1,2,4] [--iters N] [--tokens 1,16] [--json]
 *
 * Rows:
 *   barrier   one empty task per worker on every node's pool: start the detached pools, run
 *             node 0's on the caller, wait for all — the handoff every parallel step pays.
 *   dispatch  one MoE layer of Qwen3.6-35B-A3B routing (top-8 of 256 experts, 4 slices,
 *             hidden 2048) with an empty expert callback: list building, handoff to the nodes
 *             holding the experts, and the fixed-order reduction of the 8 x 4 output rows per
 *             token; i.e. what the dispatch adds on top of the expert kernels.
 * Times are per operation (median and 90th percentile over --iters). On a machine shared with
 * other work, medians are the figure to quote. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "numa/dispatch.h"
#include "numa/place.h"
#include "numa/plan.h"
#include "numa/pool.h"
#include "numa/topo.h"

#define MAX_LIST 8

static void usage(FILE *f) {
    fprintf(f, "usage: numa_bench [--split LIST] [--iters N] [--tokens LIST] [--json]\n"
               "  --split LIST    logical node counts (default 1,2,4)\n"
               "  --iters N       timed operations per row (default 20000)\n"
               "  --tokens LIST   batch sizes for the dispatch rows (default 1,16)\n"
               "  --json          one JSON object per row instead of a table\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double median_us, p90_us;
} stats;

static stats summarize(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return (stats){t[n / 2] * 1e6, t[(n * 9) / 10] * 1e6};
}

static void empty_task(void *ctx, int32_t task, int32_t worker) {
    (void)ctx;
    (void)task;
    (void)worker;
}

/* The expert kernel's work is not dispatch overhead: the callback leaves its rows as they are
 * (the reduction still reads them, as it would after a real kernel). */
static void no_expert(void *ctx, const epyq_moe_unit *u, float *out, int32_t ldo, int32_t group, int32_t worker) {
    (void)ctx;
    (void)u;
    (void)out;
    (void)ldo;
    (void)group;
    (void)worker;
}

static void barrier_once(epyq_numa_rt *rt) {
    for (int32_t g = 1; g < rt->n_groups; g++)
        epyq_pool_start(rt->pools[g], empty_task, NULL, epyq_pool_size(rt->pools[g]));
    epyq_pool_run(rt->pools[0], empty_task, NULL, epyq_pool_size(rt->pools[0]));
    for (int32_t g = 1; g < rt->n_groups; g++) epyq_pool_wait(rt->pools[g]);
}

static void print_row(bool json, const char *test, int split, int threads, int spin, int tokens, stats s) {
    if (json)
        printf("{\"test\":\"%s\",\"nodes\":%d,\"threads\":%d,\"spin_us\":%d,\"tokens\":%d,\"median_us\":%.3f,"
               "\"p90_us\":%.3f}\n", test, split, threads, spin, tokens, s.median_us, s.p90_us);
    else
        printf("| %-8s | %5d | %7d | %7d | %6d | %10.2f | %8.2f |\n", test, split, threads, spin, tokens, s.median_us,
               s.p90_us);
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"split", required_argument, NULL, 's'},
                                         {"iters", required_argument, NULL, 'i'},
                                         {"tokens", required_argument, NULL, 'k'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int splits[MAX_LIST] = {1, 2, 4}, n_split = 3;
    int tokens[MAX_LIST] = {1, 16}, n_tokens = 2;
    long iters = 20000;
    bool json = false;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 's':
            n_split = epyq_parse_int_list(optarg, splits, MAX_LIST);
            for (int i = 0; i < n_split; i++)
                if (splits[i] < 1 || splits[i] > 64) n_split = -1;
            if (n_split < 1) {
                fprintf(stderr, "numa_bench: --split %s: expected a list of 1..64\n", optarg);
                return 2;
            }
            break;
        case 'k':
            n_tokens = epyq_parse_int_list(optarg, tokens, MAX_LIST);
            for (int i = 0; i < n_tokens; i++)
                if (tokens[i] < 1 || tokens[i] > 512) n_tokens = -1;
            if (n_tokens < 1) {
                fprintf(stderr, "numa_bench: --tokens %s: expected a list of 1..512\n", optarg);
                return 2;
            }
            break;
        case 'i':
            iters = strtol(optarg, &end, 10);
            if (!end || *end || iters < 10 || iters > 10000000) {
                fprintf(stderr, "numa_bench: --iters %s: expected 10..10000000\n", optarg);
                return 2;
            }
            break;
        case 'j': json = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "numa_bench: unexpected argument %s\n", argv[optind]);
        return 2;
    }

    epyq_err err = {0};
    epyq_topo *topo = NULL;
    if (epyq_topo_load(&topo, NULL, &err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    epyq_numa_model model;
    epyq_numa_model_35b_a3b(&model, true);
    double *t = malloc(sizeof *t * (size_t)iters);
    int max_tok = 1;
    for (int i = 0; i < n_tokens; i++) max_tok = tokens[i] > max_tok ? tokens[i] : max_tok;
    /* A fixed pool of router outputs, cycled, so every configuration sees the same routing. */
    enum { ROUTES = 64, TOPK = 8, SLICES = 4, HIDDEN = 2048 };
    int32_t *ex = malloc(sizeof *ex * (size_t)ROUTES * (size_t)max_tok * TOPK);
    float *w = malloc(sizeof *w * (size_t)ROUTES * (size_t)max_tok * TOPK);
    float *y = malloc(sizeof *y * (size_t)max_tok * HIDDEN);
    if (!t || !ex || !w || !y) {
        fprintf(stderr, "epyq: out of memory\n");
        return 1;
    }
    uint32_t s = 2463534242u;
    for (size_t i = 0; i < (size_t)ROUTES * (size_t)max_tok; i++)
        for (int k = 0; k < TOPK; k++) {
            int32_t e;
            bool dup;
            do {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                e = (int32_t)(s % 256);
                dup = false;
                for (int j = 0; j < k; j++) dup |= ex[i * TOPK + (size_t)j] == e;
            } while (dup);
            ex[i * TOPK + (size_t)k] = e;
            w[i * TOPK + (size_t)k] = 0.125f;
        }

    if (!json) {
        printf("| test     | nodes | threads | spin us | tokens |  median us |   p90 us |\n");
        printf("| -------- | ----: | ------: | ------: | -----: | ---------: | -------: |\n");
    }
    const int spins[] = {100, 0};
    int rc = 0;
    for (int si = 0; si < 2 && rc == 0; si++) {
        char spin_env[16];
        snprintf(spin_env, sizeof spin_env, "%d", spins[si]);
        setenv("EPYQ_SPIN_US", spin_env, 1); /* read when the pools are created */
        for (int n = 0; n < n_split && rc == 0; n++) {
            epyq_numa_opts o;
            epyq_numa_opts_init(&o);
            o.split = splits[n];
            o.reserve_bytes = 0;
            o.fallback = true;
            epyq_numa_plan *plan = NULL;
            epyq_numa_rt *rt = NULL;
            epyq_moe_dispatch *d = NULL;
            epyq_moe_dims dims = {.max_tokens = max_tok, .top_k = TOPK, .n_slices = SLICES, .width = HIDDEN};
            if (epyq_numa_plan_make(topo, &model, &o, &plan, &err) != EPYQ_OK ||
                epyq_numa_rt_create(&rt, plan, &err) != EPYQ_OK ||
                epyq_moe_dispatch_create(&d, rt, &dims, &err) != EPYQ_OK) {
                fprintf(stderr, "epyq: --numa-split %d: %s\n", splits[n], err.msg);
                rc = 1;
            } else {
                for (long i = 0; i < iters / 10; i++) barrier_once(rt); /* warm-up */
                for (long i = 0; i < iters; i++) {
                    double t0 = epyq_now();
                    barrier_once(rt);
                    t[i] = epyq_now() - t0;
                }
                print_row(json, "barrier", splits[n], plan->n_threads, spins[si], 0, summarize(t, (int)iters));
                for (int k = 0; k < n_tokens && rc == 0; k++) {
                    int T = tokens[k];
                    for (long i = 0; i < iters + iters / 10 && rc == 0; i++) {
                        size_t r = (size_t)(i % ROUTES) * (size_t)max_tok * TOPK;
                        double t0 = epyq_now();
                        if (epyq_moe_dispatch_run(d, (int32_t)(i % 40), T, ex + r, w + r, no_expert, NULL, y, HIDDEN,
                                                  false, &err) != EPYQ_OK) {
                            fprintf(stderr, "epyq: %s\n", err.msg);
                            rc = 1;
                        }
                        if (i >= iters / 10) t[i - iters / 10] = epyq_now() - t0;
                    }
                    if (rc == 0)
                        print_row(json, "dispatch", splits[n], plan->n_threads, spins[si], T, summarize(t, (int)iters));
                }
            }
            epyq_moe_dispatch_free(d);
            epyq_numa_rt_free(rt);
            epyq_numa_plan_free(plan);
        }
    }
    free(t);
    free(ex);
    free(w);
    free(y);
    epyq_topo_free(topo);
    return rc;
}
