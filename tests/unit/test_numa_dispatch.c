/* tests/unit/test_numa_dispatch.c — numa/dispatch.h: MoE output is bit-identical for 1, 2 and 4
 * logical nodes (--numa-split) and any chunking, equals a serial fixed-order reference, every
 * unit runs on the pool of the node that holds its expert (or its slice of the expert, when the
 * plan places slices), and bad router output is refused. */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "numa/dispatch.h"
#include "numa/place.h"
#include "numa/plan.h"
#include "numa/topo.h"
#include "tests/check_main.h"

enum { LAYERS = 3, EXPERTS = 16, TOPK = 4, INTER = 48, SLICES = 3, WIDTH = 300, MAX_T = 40 };

/* Synthetic experts: out[c] = w * sum over the slice's i of D[l][e][c][i] * x[t][i] * (1 + e/64). */
typedef struct {
    float *down;  /* [LAYERS][EXPERTS][WIDTH][INTER] */
    float *x;     /* [MAX_T][INTER] */
    const epyq_numa_plan *plan;
    atomic_int wrong_group;   /* a unit ran on a group that does not hold its expert */
    atomic_int wrong_thread;  /* a group > 0 unit ran on a thread not of that group's pool */
    atomic_int units;
} synth;

static uint32_t rng(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static float unit_row_value(const synth *sy, int32_t layer, int32_t e, int32_t slice, int32_t t, float w, int32_t c) {
    const float *d = sy->down + (((size_t)layer * EXPERTS + (size_t)e) * WIDTH + (size_t)c) * INTER;
    int32_t i0 = slice * (INTER / SLICES), i1 = i0 + INTER / SLICES;
    float acc = 0.0f;
    for (int32_t i = i0; i < i1; i++) acc += d[i] * sy->x[t * INTER + i] * (1.0f + (float)e / 64.0f);
    return w * acc;
}

static void synth_expert(void *ctx, const epyq_moe_unit *u, float *out, int32_t ldo, int32_t group, int32_t worker) {
    (void)worker;
    synth *sy = ctx;
    atomic_fetch_add(&sy->units, 1);
    const epyq_numa_plan *p = sy->plan;
    size_t at = (size_t)(u->layer * EXPERTS + u->expert) * (size_t)p->n_slices +
                (size_t)(p->n_slices > 1 ? u->slice : 0);
    if (p->expert_group[at] != group) atomic_store(&sy->wrong_group, 1);
    if (group > 0) {
        char name[32], want[32];
        pthread_getname_np(pthread_self(), name, sizeof name);
        snprintf(want, sizeof want, "numa%d_t", (int)group);
        if (strncmp(name, want, strlen(want)) != 0) atomic_store(&sy->wrong_thread, 1);
    }
    for (int32_t r = 0; r < u->n_tokens; r++)
        for (int32_t c = 0; c < WIDTH; c++)
            out[(size_t)r * (size_t)ldo + (size_t)c] =
                unit_row_value(sy, u->layer, u->expert, u->slice, u->tokens[r], u->weights[r], c);
}

/* The order the contract promises, written out serially. */
static void reference(const synth *sy, int32_t layer, int32_t T, const int32_t *ex, const float *w, const float *y0,
                      float *y) {
    for (int32_t t = 0; t < T; t++)
        for (int32_t c = 0; c < WIDTH; c++) {
            float acc = y0 ? y0[t * WIDTH + c] : 0.0f;
            for (int32_t k = 0; k < TOPK; k++)
                for (int32_t s = 0; s < SLICES; s++)
                    acc += unit_row_value(sy, layer, ex[t * TOPK + k], s, t, w[t * TOPK + k], c);
            y[t * WIDTH + c] = acc;
        }
}

static void route(uint32_t *seed, int32_t T, int32_t *ex, float *w) {
    for (int32_t t = 0; t < T; t++)
        for (int32_t k = 0; k < TOPK; k++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(rng(seed) % EXPERTS);
                dup = false;
                for (int32_t j = 0; j < k; j++) dup |= ex[t * TOPK + j] == e;
            } while (dup);
            ex[t * TOPK + k] = e;
            w[t * TOPK + k] = (float)(rng(seed) % 1000) / 1000.0f + 0.01f;
        }
}

static void synth_init(synth *sy) {
    memset(sy, 0, sizeof *sy);
    size_t nd = (size_t)LAYERS * EXPERTS * WIDTH * INTER;
    sy->down = malloc(nd * sizeof *sy->down);
    sy->x = malloc((size_t)MAX_T * INTER * sizeof *sy->x);
    ck_assert(sy->down && sy->x);
    uint32_t s = 12345;
    for (size_t i = 0; i < nd; i++) sy->down[i] = (float)((int32_t)(rng(&s) % 2001) - 1000) / 997.0f;
    for (size_t i = 0; i < (size_t)MAX_T * INTER; i++) sy->x[i] = (float)((int32_t)(rng(&s) % 2001) - 1000) / 311.0f;
}

typedef struct {
    epyq_numa_plan *plan;
    epyq_numa_rt *rt;
    epyq_moe_dispatch *d;
} setup;

/* sliced: the plan places each expert's SLICES slices on their own (round the groups). */
static setup make_setup_plan(int32_t split, int32_t max_unit_tokens, bool sliced) {
    setup su = {0};
    epyq_topo *t = NULL;
    epyq_err err = {0};
    ck_assert_msg(epyq_topo_load(&t, NULL, &err) == EPYQ_OK, "%s", err.msg);
    epyq_numa_model m = {.name = "synthetic",
                         .n_layers = LAYERS,
                         .n_experts = EXPERTS,
                         .top_k = TOPK,
                         .expert_bytes = 4096 * SLICES,
                         .n_slices = sliced ? SLICES : 0,
                         .dense_bytes = 4096};
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    o.split = split;
    ck_assert_msg(epyq_numa_plan_make(t, &m, &o, &su.plan, &err) == EPYQ_OK, "%s", err.msg);
    epyq_topo_free(t);
    ck_assert_msg(epyq_numa_rt_create(&su.rt, su.plan, &err) == EPYQ_OK, "%s", err.msg);
    epyq_moe_dims dims = {.max_tokens = MAX_T, .top_k = TOPK, .n_slices = SLICES, .width = WIDTH,
                          .max_unit_tokens = max_unit_tokens};
    ck_assert_msg(epyq_moe_dispatch_create(&su.d, su.rt, &dims, &err) == EPYQ_OK, "%s", err.msg);
    return su;
}

static setup make_setup(int32_t split, int32_t max_unit_tokens) {
    return make_setup_plan(split, max_unit_tokens, false);
}

static void free_setup(setup *su) {
    epyq_moe_dispatch_free(su->d);
    epyq_numa_rt_free(su->rt);
    epyq_numa_plan_free(su->plan);
}

START_TEST(test_bit_identical_across_splits) {
    synth sy;
    synth_init(&sy);
    const int32_t batches[] = {1, 1, 7, MAX_T};
    const int32_t splits[] = {1, 2, 4};
    const int32_t chunks[] = {0, 3};
    float y0[MAX_T * WIDTH], want[MAX_T * WIDTH], got[MAX_T * WIDTH];
    int32_t ex[MAX_T * TOPK];
    float w[MAX_T * TOPK];
    for (int32_t i = 0; i < MAX_T * WIDTH; i++) y0[i] = (float)(i % 17) * 0.25f;
    for (int sliced = 0; sliced < 2; sliced++)
        for (size_t si = 0; si < 3; si++)
            for (size_t ci = 0; ci < 2; ci++) {
                setup su = make_setup_plan(splits[si], chunks[ci], sliced);
                ck_assert_int_eq(su.plan->n_slices, sliced ? SLICES : 1);
                ck_assert_int_eq(su.plan->n_groups, splits[si]);
                sy.plan = su.plan;
                uint32_t seed = 777; /* same routing for every configuration */
                for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++)
                    for (int32_t layer = 0; layer < LAYERS; layer++) {
                        int32_t T = batches[b];
                        route(&seed, T, ex, w);
                        bool acc = (layer + (int32_t)b) % 2 == 1;
                        reference(&sy, layer, T, ex, w, acc ? y0 : NULL, want);
                        memcpy(got, y0, sizeof got);
                        epyq_err err = {0};
                        ck_assert_msg(epyq_moe_dispatch_run(su.d, layer, T, ex, w, synth_expert,
                                                            &sy, got, WIDTH, acc, &err) == EPYQ_OK,
                                      "%s", err.msg);
                        ck_assert_msg(
                            memcmp(got, want, sizeof(float) * (size_t)T * WIDTH) == 0,
                            "split %d chunk %d batch %d layer %d differs from the fixed-order sum",
                            (int)splits[si], (int)chunks[ci], (int)T, (int)layer);
                        int32_t units = 0;
                        for (int32_t g = 0; g < su.plan->n_groups; g++)
                            units += epyq_moe_dispatch_units(su.d, g);
                        int32_t want_units = 0;
                        /* Count (expert, chunk) groups independently: distinct experts, chunked. */
                        for (int32_t e = 0; e < EXPERTS; e++) {
                            int32_t n = 0;
                            for (int32_t i = 0; i < T * TOPK; i++) n += ex[i] == e;
                            int32_t ch = chunks[ci] ? chunks[ci] : MAX_T * TOPK;
                            want_units += (n + ch - 1) / ch * SLICES;
                        }
                        ck_assert_int_eq(units, want_units);
                        /* sliced over 2 or 4 groups: an expert's slices run on different groups, so
                         * a single token's work reaches every group that holds one of its slices */
                        if (sliced && T == 1 && !chunks[ci]) {
                            int32_t busy = 0;
                            for (int32_t g = 0; g < su.plan->n_groups; g++)
                                busy += epyq_moe_dispatch_units(su.d, g) > 0;
                            ck_assert_int_ge(busy, su.plan->n_groups < SLICES ? su.plan->n_groups
                                                                              : SLICES);
                        }
                    }
                ck_assert_int_eq(atomic_load(&sy.wrong_group), 0);
                ck_assert_int_eq(atomic_load(&sy.wrong_thread), 0);
                free_setup(&su);
            }
    free(sy.down);
    free(sy.x);
}
END_TEST

START_TEST(test_many_decode_steps) {
    /* Back-to-back decode-sized runs over 4 logical nodes: no lost wakeups, stable output. */
    synth sy;
    synth_init(&sy);
    setup su = make_setup(4, 0);
    sy.plan = su.plan;
    int32_t ex[TOPK];
    float w[TOPK], first[WIDTH], y[WIDTH];
    uint32_t seed = 99;
    route(&seed, 1, ex, w);
    epyq_err err = {0};
    ck_assert_int_eq(epyq_moe_dispatch_run(su.d, 0, 1, ex, w, synth_expert, &sy, first, WIDTH, false, &err), EPYQ_OK);
    for (int i = 0; i < 300; i++) {
        ck_assert_int_eq(epyq_moe_dispatch_run(su.d, 0, 1, ex, w, synth_expert, &sy, y, WIDTH,
                                               false, &err), EPYQ_OK);
        ck_assert_int_eq(memcmp(y, first, sizeof y), 0);
    }
    free_setup(&su);
    free(sy.down);
    free(sy.x);
}
END_TEST

START_TEST(test_bad_router_output) {
    synth sy;
    synth_init(&sy);
    setup su = make_setup(2, 0);
    sy.plan = su.plan;
    int32_t ex[2 * TOPK] = {0, 1, 2, 3, 4, 5, EXPERTS, 7};
    float w[2 * TOPK] = {1, 1, 1, 1, 1, 1, 1, 1};
    float y[2 * WIDTH];
    epyq_err err = {0};
    ck_assert_int_eq(epyq_moe_dispatch_run(su.d, 1, 2, ex, w, synth_expert, &sy, y, WIDTH, false, &err), EPYQ_E_ARG);
    ck_assert_msg(strstr(err.msg, "layer 1 token 1 slot 2 routes to expert 16 of 16"), "%s", err.msg);
    ck_assert_int_eq(atomic_load(&sy.units), 0);
    ck_assert_int_eq(epyq_moe_dispatch_run(su.d, 0, MAX_T + 1, ex, w, synth_expert, &sy, y, WIDTH, false, &err),
                     EPYQ_E_ARG);
    ck_assert_int_eq(epyq_moe_dispatch_run(su.d, LAYERS, 1, ex, w, synth_expert, &sy, y, WIDTH, false, &err),
                     EPYQ_E_ARG);
    ck_assert_int_eq(epyq_moe_dispatch_run(su.d, 0, 0, ex, w, synth_expert, &sy, y, WIDTH, false, &err), EPYQ_OK);
    epyq_moe_dispatch *d = NULL;
    epyq_moe_dims bad = {.max_tokens = 4, .top_k = EXPERTS + 1, .n_slices = 1, .width = 8};
    ck_assert_int_eq(epyq_moe_dispatch_create(&d, su.rt, &bad, &err), EPYQ_E_ARG);
    ck_assert_ptr_null(d);
    free_setup(&su);
    /* A plan that places 3 slices per expert cannot serve a dispatch cutting 2. */
    su = make_setup_plan(2, 0, true);
    epyq_moe_dims two = {.max_tokens = 4, .top_k = TOPK, .n_slices = 2, .width = 8};
    ck_assert_int_eq(epyq_moe_dispatch_create(&d, su.rt, &two, &err), EPYQ_E_ARG);
    ck_assert_msg(strstr(err.msg, "the plan places 3 slices per expert, the dispatch runs 2"), "%s",
                  err.msg);
    ck_assert_ptr_null(d);
    free_setup(&su);
    free(sy.down);
    free(sy.x);
}
END_TEST

/* Threads of this process other than the caller, and how many are not asleep. */
static int other_threads(int *awake) {
    DIR *dir = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(dir);
    int n = 0, self = (int)gettid();
    *awake = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.' || atoi(e->d_name) == self) continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *rp = strrchr(buf, ')');
        n++;
        if (rp && rp[2] != 'S') (*awake)++;
    }
    closedir(dir);
    return n;
}

START_TEST(test_idle_runtime_has_no_spinning_threads) {
    /* After a burst of MoE layers on 2 logical nodes, the process holds exactly the pool
     * threads the plan asked for (no OpenMP or helper threads), and all of them sleep. */
    synth sy;
    synth_init(&sy);
    setup su = make_setup(2, 0);
    sy.plan = su.plan;
    int32_t ex[TOPK];
    float w[TOPK], y[WIDTH];
    uint32_t seed = 5;
    route(&seed, 1, ex, w);
    epyq_err err = {0};
    for (int i = 0; i < 50; i++)
        ck_assert_int_eq(epyq_moe_dispatch_run(su.d, 1, 1, ex, w, synth_expert, &sy, y, WIDTH, false, &err), EPYQ_OK);
    usleep(100 * 1000); /* far past the 2 ms spin budget */
    int awake = 0;
    int n = other_threads(&awake);
    ck_assert_int_eq(n, su.plan->n_threads - 1);
    ck_assert_msg(awake == 0, "%d pool threads are not asleep while idle", awake);
    free_setup(&su);
    free(sy.down);
    free(sy.x);
}
END_TEST

static Suite *dispatch_suite(void) {
    Suite *s = suite_create("numa_dispatch");
    TCase *tc = epyq_test_case(s, "dispatch", 120);
    EPYQ_TESTS_ADD(tc, test_bit_identical_across_splits, test_many_decode_steps,
                   test_bad_router_output, test_idle_runtime_has_no_spinning_threads);
    return s;
}

int main(void) { return epyq_test_run(dispatch_suite()); }
