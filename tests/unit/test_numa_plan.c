/* tests/unit/test_numa_plan.c — numa/plan.h on synthetic and XML topologies (NPS4, NPS1, Genoa
 * interleaved numbering, asymmetric, memoryless, CPU-less), split mode, balance and determinism
 * of plans, memory checks and the errors for impossible requests. The topologies themselves:
 * test_numa_topo.c. */
#include <check.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "numa/plan.h"
#include "numa/topo.h"
#include "tests/check_main.h"
#include "tests/testutil.h"
#include "tests/unit/numa_topo_util.h"

static epyq_numa_plan *plan(const epyq_topo *t, const epyq_numa_model *m, const epyq_numa_opts *o) {
    epyq_numa_plan *p = NULL;
    epyq_err err = {0};
    epyq_status st = epyq_numa_plan_make(t, m, o, &p, &err);
    ck_assert_msg(st == EPYQ_OK, "plan on %s: %s", t->source, err.msg);
    return p;
}

static epyq_status plan_err(const epyq_topo *t, const epyq_numa_model *m, const epyq_numa_opts *o, epyq_err *err) {
    epyq_numa_plan *p = NULL;
    epyq_status st = epyq_numa_plan_make(t, m, o, &p, err);
    ck_assert_ptr_null(p);
    return st;
}

/* ---- plans ----------------------------------------------------------------------------- */

static void check_no_node_over_memory(const epyq_numa_plan *p) {
    for (int32_t g = 0; g < p->n_groups; g++)
        ck_assert_msg(p->groups[g].expert_bytes + p->groups[g].dense_bytes <= p->groups[g].capacity,
                      "node %d over its memory", p->groups[g].node);
}

/* Recount the plan's expert table independently of the plan's own tallies. */
static void count_experts(const epyq_numa_plan *p, int32_t layer, int64_t *per_group) {
    for (int32_t g = 0; g < p->n_groups; g++) per_group[g] = 0;
    for (int32_t l = 0; l < p->n_layers; l++)
        if (layer < 0 || l == layer)
            for (int32_t e = 0; e < p->n_experts; e++) {
                int16_t g = p->expert_group[l * p->n_experts + e];
                ck_assert(g >= 0 && g < p->n_groups);
                per_group[g]++;
            }
}

START_TEST(test_plan_nps4_full_model) {
    epyq_topo *t = load(NPS4);
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true);
    /* docs/architecture.md §7: 34 660 610 688 text params; W4A16 g128 with BF16 embedding/lm_head ≈
     * 19.4 GB. */
    uint64_t total = m.expert_bytes * 40 * 256 + m.dense_bytes;
    ck_assert_uint_eq(m.expert_bytes, 3145728ull / 128 * 66);
    ck_assert(total > 19300000000ull && total < 19500000000ull);
    /* §8.2: 2.31 GB per token at int4, of which 8 x 40 experts are 0.52 GB. */
    uint64_t per_token = m.dense_token_bytes + 8ull * 40 * m.expert_bytes;
    ck_assert(per_token > 2300000000ull && per_token < 2320000000ull);
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    epyq_numa_plan *p = plan(t, &m, &o);
    ck_assert_int_eq(p->mode, EPYQ_NUMA_DISTRIBUTE);
    ck_assert_int_eq(p->n_groups, 8);
    ck_assert(p->bind_memory);
    int64_t cnt[8];
    count_experts(p, -1, cnt);
    for (int32_t g = 0; g < 8; g++) {
        ck_assert_int_eq(cnt[g], 1280);
        ck_assert_int_eq(p->groups[g].n_experts, 1280);
        ck_assert_int_eq(p->groups[g].os_index, g);
        ck_assert_int_eq(p->groups[g].n_threads, 8);
        /* One worker per physical core, in core order. */
        for (int32_t w = 0; w < 8; w++) ck_assert_int_eq(p->groups[g].cpus[w], 16 * g + 2 * w);
        ck_assert_uint_eq(p->groups[g].dense_bytes * 8 / 8, p->groups[g].dense_bytes);
    }
    for (int32_t l = 0; l < 40; l++) {
        count_experts(p, l, cnt);
        for (int32_t g = 0; g < 8; g++) ck_assert_int_eq(cnt[g], 32);
    }
    uint64_t dense = 0;
    double dense_tok = 0.0;
    for (int32_t g = 0; g < 8; g++) {
        /* rows cut by threads (8 each): one eighth of the dense bytes per node, both columns shown
         */
        ck_assert_uint_eq(p->groups[g].dense_bytes, p->groups[g].dense_split);
        ck_assert_uint_eq(p->groups[g].dense_copy, m.dense_bytes);
        ck_assert(p->groups[g].dense_split + 1 >= m.dense_bytes / 8 &&
                  p->groups[g].dense_split <= m.dense_bytes / 8 + 8);
        dense += p->groups[g].dense_bytes;
        dense_tok += p->groups[g].dense_traffic;
    }
    ck_assert_uint_eq(dense, m.dense_bytes);
    ck_assert_double_eq_tol(dense_tok, (double)m.dense_token_bytes, 1.0);
    check_no_node_over_memory(p);
    ck_assert_msg(strstr(p->notes, "dense weights are 78% of the bytes read per token") &&
                      strstr(p->notes, "replicate-dense"), "%s", p->notes);

    /* Same inputs, same plan. */
    epyq_numa_plan *q = plan(t, &m, &o);
    ck_assert_int_eq(memcmp(p->expert_group, q->expert_group, sizeof *p->expert_group * 40 * 256), 0);
    epyq_numa_plan_free(q);

    /* The table names every node with its share. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    epyq_numa_plan_print(f, p);
    fclose(f);
    ck_assert(strstr(text, "GiB experts"));
    ck_assert(strstr(text, "1280"));
    ck_assert(strstr(text, "112,114"));
    free(text);
    epyq_numa_plan_free(p);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_plan_balance_odd_nodes) {
    /* 3 nodes do not divide 256: totals must still differ by at most one expert. */
    epyq_topo *t = load("pack:1 numa:3(memory=64GiB) core:4 pu:1");
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true);
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    epyq_numa_plan *p = plan(t, &m, &o);
    int64_t cnt[3];
    count_experts(p, -1, cnt);
    int64_t lo = cnt[0], hi = cnt[0];
    for (int32_t g = 1; g < 3; g++) {
        lo = cnt[g] < lo ? cnt[g] : lo;
        hi = cnt[g] > hi ? cnt[g] : hi;
    }
    ck_assert_int_le(hi - lo, 1);
    for (int32_t l = 0; l < 40; l++) {
        count_experts(p, l, cnt);
        for (int32_t g = 0; g < 3; g++) ck_assert(cnt[g] == 85 || cnt[g] == 86);
    }
    uint64_t blo = p->groups[0].expert_bytes, bhi = blo;
    for (int32_t g = 1; g < 3; g++) {
        blo = p->groups[g].expert_bytes < blo ? p->groups[g].expert_bytes : blo;
        bhi = p->groups[g].expert_bytes > bhi ? p->groups[g].expert_bytes : bhi;
    }
    ck_assert_uint_le(bhi - blo, m.expert_bytes);
    epyq_numa_plan_free(p);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_plan_traffic_balance) {
    /* Skewed routing: each layer has a few hot experts. Per layer, every node's expected
     * traffic must be within one expert's traffic of every other's. */
    enum { L = 4, E = 64, K = 4, N = 4 };
    static float freq[L * E];
    for (int32_t l = 0; l < L; l++) {
        double sum = 0.0;
        for (int32_t e = 0; e < E; e++) sum += freq[l * E + e] = (float)(1.0 / (1.0 + ((e * 7 + l) % E)));
        for (int32_t e = 0; e < E; e++) freq[l * E + e] = (float)(freq[l * E + e] * K / sum);
    }
    epyq_numa_model m = {.name = "skewed", .n_layers = L, .n_experts = E, .top_k = K, .expert_bytes = 1 << 20,
                         .dense_bytes = 1 << 24, .expert_freq = freq};
    epyq_topo *t = load("pack:1 numa:4(memory=8GiB) core:2 pu:1");
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    o.reserve_bytes = 0;
    epyq_numa_plan *p = plan(t, &m, &o);
    for (int32_t l = 0; l < L; l++) {
        double tr[N] = {0}, fmax = 0.0;
        for (int32_t e = 0; e < E; e++) {
            tr[p->expert_group[l * E + e]] += freq[l * E + e];
            fmax = freq[l * E + e] > fmax ? freq[l * E + e] : fmax;
        }
        double lo = tr[0], hi = tr[0];
        for (int32_t g = 1; g < N; g++) {
            lo = tr[g] < lo ? tr[g] : lo;
            hi = tr[g] > hi ? tr[g] : hi;
        }
        ck_assert_msg(hi - lo <= fmax + 1e-6, "layer %d traffic spread %.3f > hottest expert %.3f", l, hi - lo, fmax);
    }
    epyq_numa_plan_free(p);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_plan_genoa_threads_follow_nodes) {
    /* llama.cpp#5121: a linear CPU loop puts node 1's threads on 64-95. */
    epyq_topo *t = load(xml_path("genoa-2s-nps1-interleaved.xml"));
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true);
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    o.n_threads = 128;
    epyq_numa_plan *p = plan(t, &m, &o);
    char buf[256];
    for (int32_t g = 0; g < 2; g++) {
        ck_assert_int_eq(p->groups[g].n_threads, 64);
        /* Cores first (0-31), then their SMT siblings (64-95). */
        ck_assert_int_eq(p->groups[g].cpus[0], 32 * g);
        ck_assert_int_eq(p->groups[g].cpus[32], 64 + 32 * g);
        int32_t sorted[64];
        memcpy(sorted, p->groups[g].cpus, sizeof sorted);
        for (int a = 1; a < 64; a++)
            for (int b = a; b > 0 && sorted[b - 1] > sorted[b]; b--) {
                int32_t x = sorted[b];
                sorted[b] = sorted[b - 1];
                sorted[b - 1] = x;
            }
        list_str(sorted, 64, buf, sizeof buf);
        ck_assert_str_eq(buf, g == 0 ? "0-31,64-95" : "32-63,96-127");
    }
    epyq_numa_plan_free(p);
    o.n_threads = 10;
    p = plan(t, &m, &o);
    ck_assert_int_eq(p->groups[0].n_threads, 5);
    ck_assert_int_eq(p->groups[1].n_threads, 5);
    ck_assert_int_eq(p->groups[1].cpus[4], 36);
    epyq_numa_plan_free(p);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_plan_asymmetric_memoryless_cpuless) {
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true);
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);

    epyq_topo *t = load(xml_path("asymmetric-2node.xml"));
    epyq_numa_plan *p = plan(t, &m, &o);
    /* Shares follow threads: 16 vs 8 cores. */
    ck_assert_int_eq(p->groups[0].n_threads, 16);
    ck_assert_int_eq(p->groups[1].n_threads, 8);
    ck_assert_int_le(p->groups[0].n_experts - 2 * p->groups[1].n_experts, 2);
    ck_assert_int_ge(p->groups[0].n_experts - 2 * p->groups[1].n_experts, -2);
    check_no_node_over_memory(p);
    epyq_numa_plan_free(p);
    epyq_topo_free(t);

    t = load(xml_path("memoryless-node.xml"));
    p = plan(t, &m, &o);
    ck_assert_int_eq(p->n_groups, 2);
    ck_assert_int_eq(p->groups[0].node, 0);
    ck_assert_int_eq(p->groups[1].node, 2);
    /* Node 1's CPUs (8-15) join node 0, the nearer one (distance 12 vs 32). */
    ck_assert_int_eq(p->groups[0].n_threads, 16);
    ck_assert_int_eq(p->groups[0].cpus[8], 8);
    ck_assert(strstr(p->groups[0].note, "memoryless node 1"));
    epyq_numa_plan_free(p);
    epyq_topo_free(t);

    t = load(xml_path("cxl-cpuless-node.xml"));
    p = plan(t, &m, &o);
    ck_assert_int_eq(p->n_groups, 2);
    ck_assert(strstr(p->notes, "node 2 has no usable CPU"));
    epyq_numa_plan_free(p);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_plan_modes) {
    epyq_topo *t = load(NPS4);
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true);
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);

    o.mode = EPYQ_NUMA_OFF;
    epyq_numa_plan *p = plan(t, &m, &o);
    ck_assert_int_eq(p->n_groups, 1);
    ck_assert_int_eq(p->groups[0].os_index, -1);
    ck_assert(!p->bind_memory);
    ck_assert_int_eq(p->n_threads, 64);
    epyq_numa_plan_free(p);

    o.mode = EPYQ_NUMA_ISOLATE;
    o.nodes = "5,6";
    p = plan(t, &m, &o);
    ck_assert_int_eq(p->n_groups, 1);
    ck_assert_int_eq(p->groups[0].os_index, 5);
    ck_assert_int_eq(p->groups[0].n_experts, 40 * 256);
    epyq_numa_plan_free(p);
    o.nodes = NULL;
    o.home_cpu = 70; /* node 4 holds CPUs 64-79 */
    p = plan(t, &m, &o);
    ck_assert_int_eq(p->groups[0].os_index, 4);
    epyq_numa_plan_free(p);
    o.home_cpu = -1;

    o.mode = EPYQ_NUMA_REPLICATE_DENSE;
    p = plan(t, &m, &o);
    ck_assert(p->replicate_dense);
    for (int32_t g = 0; g < 8; g++) ck_assert_uint_eq(p->groups[g].dense_bytes, m.dense_bytes);
    epyq_numa_plan_free(p);

    o.mode = EPYQ_NUMA_NUMACTL;
    p = plan(t, &m, &o);
    ck_assert(!p->bind_memory);
    ck_assert_int_eq(p->n_groups, 8);
    for (int32_t g = 0; g < 8; g++) ck_assert_int_eq(p->groups[g].os_index, -1);
    epyq_numa_plan_free(p);

    o.mode = EPYQ_NUMA_DISTRIBUTE;
    o.nodes = "1,3";
    p = plan(t, &m, &o);
    ck_assert_int_eq(p->n_groups, 2);
    ck_assert_int_eq(p->groups[1].node, 3);
    ck_assert_int_eq(p->groups[0].n_experts, 5120);
    epyq_numa_plan_free(p);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_plan_split_this_machine) {
    epyq_topo *t = load(NULL);
    epyq_numa_model m = {.name = "small", .n_layers = 4, .n_experts = 16, .top_k = 2, .expert_bytes = 4096,
                         .dense_bytes = 65536};
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    for (int32_t n = 1; n <= 4; n++) {
        o.split = n;
        epyq_numa_plan *p = plan(t, &m, &o);
        ck_assert_int_eq(p->n_groups, n);
        ck_assert(p->split);
        int64_t cnt[4];
        count_experts(p, 0, cnt);
        for (int32_t g = 0; g < n; g++) ck_assert(cnt[g] == 16 / n || cnt[g] == (16 + n - 1) / n);
        for (int32_t g = 0; g < n; g++) ck_assert_int_eq(p->groups[g].node, g);
        epyq_numa_plan_free(p);
    }
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_plan_impossible_requests) {
    epyq_topo *t = load(NPS4);
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true);
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    epyq_err err = {0};

    o.nodes = "1,9";
    ck_assert_int_eq(plan_err(t, &m, &o, &err), EPYQ_E_NUMA);
    ck_assert_msg(strstr(err.msg, "node 9 does not exist") && strstr(err.msg, "0-7"), "%s", err.msg);
    o.nodes = NULL;

    o.cpu_range = "0-3,200";
    ck_assert_int_eq(plan_err(t, &m, &o, &err), EPYQ_E_NUMA);
    ck_assert_msg(strstr(err.msg, "cpu 200") && strstr(err.msg, "0-127"), "%s", err.msg);
    o.cpu_range = "0-3,x";
    ck_assert_int_eq(plan_err(t, &m, &o, &err), EPYQ_E_ARG);
    o.cpu_range = NULL;

    o.n_threads = 4;
    ck_assert_int_eq(plan_err(t, &m, &o, &err), EPYQ_E_NUMA);
    ck_assert_msg(strstr(err.msg, "fewer than the 8 NUMA nodes"), "%s", err.msg);
    o.n_threads = 129;
    ck_assert_int_eq(plan_err(t, &m, &o, &err), EPYQ_E_NUMA);
    ck_assert_msg(strstr(err.msg, "only 128 CPUs"), "%s", err.msg);
    o.n_threads = 0;

    /* -C on the real machine: one CPU past the allowed ones. */
    epyq_topo *real = load(NULL);
    char range[32];
    const epyq_topo_node *last = &real->nodes[real->n_nodes - 1];
    snprintf(range, sizeof range, "%d", (int)last->pus[last->n_pus - 1] + 1);
    o.cpu_range = range;
    ck_assert_int_eq(plan_err(real, &m, &o, &err), EPYQ_E_NUMA);
    ck_assert_msg(strstr(err.msg, "not available to this process"), "%s", err.msg);
    o.cpu_range = NULL;
    epyq_topo_free(real);

    epyq_numa_model bad = m;
    bad.top_k = 0;
    ck_assert_int_eq(plan_err(t, &bad, &o, &err), EPYQ_E_ARG);
    bad = m;
    bad.expert_bytes = UINT64_MAX / 4;
    ck_assert_int_eq(plan_err(t, &bad, &o, &err), EPYQ_E_ARG);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_plan_memory_checks) {
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true); /* 18.1 GiB */
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    epyq_err err = {0};

    /* Two 8 GiB nodes cannot hold 18 GiB: an error naming the node and bytes, with or without
     * fallback. An 8 GiB node keeps 1/16 (512 MiB), not the whole 1 GiB default. */
    epyq_topo *t = load("pack:2 numa:1(memory=8GiB) core:2 pu:1");
    o.mode = EPYQ_NUMA_DISTRIBUTE;
    ck_assert_int_eq(plan_err(t, &m, &o, &err), EPYQ_E_NOMEM);
    ck_assert_msg(strstr(err.msg, "node 0 needs 9.04 GiB") && strstr(err.msg, "has 7.50 GiB after the 512.0 MiB reserve"),
                  "%s", err.msg);
    o.fallback = true;
    ck_assert_int_eq(plan_err(t, &m, &o, &err), EPYQ_E_NOMEM);
    ck_assert_msg(strstr(err.msg, "the model needs"), "%s", err.msg);
    epyq_topo_free(t);

    /* Node 1 has a third of the cores but a fifth of the memory: its share of a 201 GiB expert
     * set overflows it; a fallback moves experts to node 0 and says so. */
    t = load(xml_path("asymmetric-2node.xml"));
    epyq_numa_model big = m;
    big.expert_bytes *= 13;
    o.fallback = false;
    ck_assert_int_eq(plan_err(t, &big, &o, &err), EPYQ_E_NOMEM);
    ck_assert_msg(strstr(err.msg, "node 1 needs"), "%s", err.msg);
    o.fallback = true;
    epyq_numa_plan *p = plan(t, &big, &o);
    ck_assert(p->fallback_used);
    ck_assert(strstr(p->notes, "fallback: node 1"));
    check_no_node_over_memory(p);
    int64_t cnt[2];
    count_experts(p, -1, cnt);
    ck_assert_int_eq(cnt[0] + cnt[1], 40 * 256);
    ck_assert_int_eq(cnt[0], p->groups[0].n_experts);
    epyq_numa_plan_free(p);
    /* auto implies the fallback. */
    o.fallback = false;
    o.mode = EPYQ_NUMA_AUTO;
    p = plan(t, &big, &o);
    ck_assert(p->fallback_used);
    epyq_numa_plan_free(p);
    /* Replicating 2.6 GiB of dense weights on a node with no room is an error even so. */
    epyq_numa_model fat = m;
    fat.dense_bytes = 70 * GIB;
    o.mode = EPYQ_NUMA_REPLICATE_DENSE;
    o.fallback = true;
    ck_assert_int_eq(plan_err(t, &fat, &o, &err), EPYQ_E_NOMEM);
    ck_assert_msg(strstr(err.msg, "dense weights alone"), "%s", err.msg);
    epyq_topo_free(t);
}
END_TEST

/* NPS1-like 2 nodes of 10 GiB: the row split (7.73 GiB experts + 1.31 GiB dense a node) fits,
 * a dense copy per node (2.62 GiB each) does not, and the refusal gives the numbers. */
START_TEST(test_replicate_memory_refused) {
    epyq_topo *t = load("pack:2 numa:1(memory=10GiB) core:8 pu:1");
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true);
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    o.mode = EPYQ_NUMA_DISTRIBUTE;
    epyq_numa_plan *p = plan(t, &m, &o);
    ck_assert_int_eq(p->n_groups, 2);
    for (int32_t g = 0; g < 2; g++) {
        ck_assert_uint_eq(p->groups[g].dense_bytes, p->groups[g].dense_split);
        ck_assert_uint_eq(p->groups[g].dense_copy, m.dense_bytes);
    }
    epyq_numa_plan_free(p);
    o.mode = EPYQ_NUMA_REPLICATE_DENSE;
    epyq_err err = {0};
    ck_assert_int_eq(plan_err(t, &m, &o, &err), EPYQ_E_NOMEM);
    ck_assert_msg(strstr(err.msg, "node 0 needs") && strstr(err.msg, "dense 2.62 GiB") &&
                      strstr(err.msg, "but has"),
                  "%s", err.msg);
    ck_assert_ptr_null(strchr(err.msg, '\n'));
    epyq_topo_free(t);
}
END_TEST

/* Experts cut into 4 slices (the runtime's split placement): on 2, 3 and 8 nodes every expert's
 * slices land on distinct nodes as far as the node count allows, so a token's chosen experts
 * are computed by every node; totals differ by at most one slice; a fallback moves slices. */
static int16_t slice_group(const epyq_numa_plan *p, int32_t l, int32_t e, int32_t s) {
    return p->expert_group[((size_t)l * (size_t)p->n_experts + (size_t)e) * (size_t)p->n_slices +
                           (size_t)s];
}

START_TEST(test_plan_slices) {
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true);
    m.n_slices = 4;
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    o.mode = EPYQ_NUMA_DISTRIBUTE;
    const char *topos[] = {"pack:2 numa:1(memory=64GiB) core:4 pu:1",
                           "pack:1 numa:3(memory=64GiB) core:4 pu:1", NPS4};
    const int32_t groups[] = {2, 3, 8};
    for (int32_t ti = 0; ti < 3; ti++) {
        epyq_topo *t = load(topos[ti]);
        epyq_numa_plan *p = plan(t, &m, &o);
        const int32_t G = groups[ti];
        ck_assert_int_eq(p->n_groups, G);
        ck_assert_int_eq(p->n_slices, 4);
        int64_t parts[8] = {0};
        for (int32_t l = 0; l < 40; l++)
            for (int32_t e = 0; e < 256; e++) {
                int32_t seen[8] = {0}, distinct = 0;
                for (int32_t s = 0; s < 4; s++) {
                    int16_t g = slice_group(p, l, e, s);
                    ck_assert(g >= 0 && g < G);
                    parts[g]++;
                    distinct += !seen[g]++;
                }
                ck_assert_msg(distinct == (G < 4 ? G : 4),
                              "%d groups: layer %d expert %d on %d nodes", G, l, e, distinct);
            }
        int64_t lo = parts[0], hi = parts[0], sum = 0;
        uint64_t bytes = 0;
        for (int32_t g = 0; g < G; g++) {
            lo = parts[g] < lo ? parts[g] : lo;
            hi = parts[g] > hi ? parts[g] : hi;
            sum += parts[g];
            ck_assert_int_eq(p->groups[g].n_parts, parts[g]);
            ck_assert_int_eq(p->groups[g].n_experts, parts[g] / 4);
            ck_assert_uint_eq(p->groups[g].expert_bytes, (uint64_t)parts[g] * (m.expert_bytes / 4));
            bytes += p->groups[g].expert_bytes;
        }
        ck_assert_int_le(hi - lo, 1);
        ck_assert_int_eq(sum, 40 * 256 * 4);
        ck_assert_uint_eq(bytes, m.expert_bytes * 40 * 256);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        epyq_numa_plan_print(f, p);
        fclose(f);
        ck_assert_msg(strstr(text, "each cut into 4 slices"), "%s", text);
        /* 3 nodes hold 13654, 13653, 13653 slices: quarters of experts, shown as such */
        if (G == 3) ck_assert_msg(strstr(text, "3413.50") && strstr(text, "3413.25"), "%s", text);
        if (G == 2) ck_assert_msg(strstr(text, " 5120 ") && strstr(text, "10240"), "%s", text);
        free(text);
        epyq_numa_plan_free(p);
        epyq_topo_free(t);
    }

    /* A node short of memory gives up slices, not whole experts, and the plan still adds up. */
    epyq_topo *t = load(xml_path("asymmetric-2node.xml"));
    epyq_numa_model big = m;
    big.expert_bytes *= 13;
    o.fallback = true;
    epyq_numa_plan *p = plan(t, &big, &o);
    ck_assert(p->fallback_used);
    check_no_node_over_memory(p);
    ck_assert_int_eq(p->groups[0].n_parts + p->groups[1].n_parts, 40 * 256 * 4);
    ck_assert_uint_eq(p->groups[0].expert_bytes + p->groups[1].expert_bytes,
                      big.expert_bytes * 40 * 256);
    epyq_numa_plan_free(p);
    epyq_topo_free(t);

    /* Slices must cut the expert's bytes evenly, and there are at most 64. */
    t = load("pack:2 numa:1(memory=64GiB) core:4 pu:1");
    epyq_err err = {0};
    epyq_numa_model bad = m;
    bad.n_slices = 5;
    ck_assert_int_eq(plan_err(t, &bad, &o, &err), EPYQ_E_ARG);
    ck_assert_msg(strstr(err.msg, "5 slices per expert of 1622016 bytes"), "%s", err.msg);
    bad.n_slices = 65;
    ck_assert_int_eq(plan_err(t, &bad, &o, &err), EPYQ_E_ARG);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_opts_parse_and_env) {
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    epyq_err err = {0};
    char *argv[] = {"x", "--numa=isolate", "-t", "6", "-C", "0-3", "--nodes", "1", "--numa-split", "2",
                    "--numa-fallback", "-m", "model", "--threads", "x"};
    int argc = (int)(sizeof argv / sizeof argv[0]);
    int i = 1;
    ck_assert_int_eq(epyq_numa_opts_parse_arg(&o, argc, argv, &i, &err), 1);
    ck_assert_int_eq(o.mode, EPYQ_NUMA_ISOLATE);
    for (i = 2; i < 11; i++) ck_assert_int_eq(epyq_numa_opts_parse_arg(&o, argc, argv, &i, &err), 1);
    ck_assert_int_eq(o.n_threads, 6);
    ck_assert_str_eq(o.cpu_range, "0-3");
    ck_assert_str_eq(o.nodes, "1");
    ck_assert_int_eq(o.split, 2);
    ck_assert(o.fallback);
    ck_assert_int_eq(epyq_numa_opts_parse_arg(&o, argc, argv, &i, &err), 0); /* -m is not ours */
    i = 13;
    ck_assert_int_eq(epyq_numa_opts_parse_arg(&o, argc, argv, &i, &err), -1);
    ck_assert(strstr(err.msg, "--threads"));
    char *argv2[] = {"x", "--numa", "fast"};
    i = 1;
    ck_assert_int_eq(epyq_numa_opts_parse_arg(&o, 3, argv2, &i, &err), -1);
    ck_assert(strstr(err.msg, "fast"));

    epyq_numa_opts_init(&o);
    setenv("EPYQ_NUMA", "replicate-dense", 1);
    setenv("EPYQ_THREADS", "12", 1);
    setenv("EPYQ_NODES", "0,1", 1);
    setenv("EPYQ_CPU_RANGE", "0-11", 1);
    setenv("EPYQ_NUMA_SPLIT", "3", 1);
    ck_assert_int_eq(epyq_numa_opts_from_env(&o, &err), EPYQ_OK);
    ck_assert_int_eq(o.mode, EPYQ_NUMA_REPLICATE_DENSE);
    ck_assert_int_eq(o.n_threads, 12);
    ck_assert_str_eq(o.nodes, "0,1");
    ck_assert_str_eq(o.cpu_range, "0-11");
    ck_assert_int_eq(o.split, 3);
    setenv("EPYQ_NUMA", "sideways", 1);
    ck_assert_int_eq(epyq_numa_opts_from_env(&o, &err), EPYQ_E_ARG);
    ck_assert(strstr(err.msg, "EPYQ_NUMA"));
    unsetenv("EPYQ_NUMA");
    unsetenv("EPYQ_THREADS");
    unsetenv("EPYQ_NODES");
    unsetenv("EPYQ_CPU_RANGE");
    unsetenv("EPYQ_NUMA_SPLIT");
}
END_TEST


/* Issue 13: the reserve scales with the node (min(1 GiB, node / 16)); sizes below 1 GiB print
 * in MiB; a synthetic string without memory= is planned without a memory check. */
START_TEST(test_plan_small_nodes) {
    ck_assert_uint_eq(epyq_numa_node_reserve(1ull << 30, 1ull << 30), 64ull << 20);
    ck_assert_uint_eq(epyq_numa_node_reserve(1ull << 30, 16ull << 30), 1ull << 30);
    ck_assert_uint_eq(epyq_numa_node_reserve(1ull << 30, 192ull << 30), 1ull << 30);
    ck_assert_uint_eq(epyq_numa_node_reserve(0, 1ull << 30), 0);
    char b[32];
    ck_assert_str_eq(epyq_numa_size(1536ull << 20, b, sizeof b), "1.50 GiB");
    ck_assert_str_eq(epyq_numa_size(3ull << 19, b, sizeof b), "1.5 MiB");

    /* A 24 MiB model (2 layers x 8 experts of 1 MiB, 8 MiB dense) on two 1 GiB nodes: each
     * keeps 64 MiB and holds its 12 MiB; before, the 1 GiB reserve left 0 bytes. */
    epyq_numa_model m = {.name = "small", .n_layers = 2, .n_experts = 8, .top_k = 2, .expert_bytes = 1 << 20,
                         .dense_bytes = 8 << 20};
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    o.mode = EPYQ_NUMA_DISTRIBUTE;
    epyq_err err = {0};
    epyq_topo *t = load("pack:2 numa:1(memory=1GiB) core:2 pu:1");
    epyq_numa_plan *p = NULL;
    ck_assert_msg(epyq_numa_plan_make(t, &m, &o, &p, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_uint_eq(p->groups[0].capacity, (1ull << 30) - (64ull << 20));
    ck_assert_uint_eq(p->groups[0].expert_bytes + p->groups[0].dense_bytes, 12ull << 20);
    epyq_numa_plan_free(p);
    epyq_topo_free(t);
    /* too small: the error speaks MiB */
    t = load("pack:2 numa:1(memory=8MiB) core:2 pu:1");
    ck_assert_int_eq(plan_err(t, &m, &o, &err), EPYQ_E_NOMEM);
    ck_assert_msg(strstr(err.msg, "node 0 needs 12.0 MiB (experts 8.0 MiB + dense 4.0 MiB) but has 7.5 MiB after the "
                                  "0.5 MiB reserve"), "%s", err.msg);
    epyq_topo_free(t);
    /* no memory given: the full 35b plan on 8 nodes is made and says memory was not checked */
    epyq_numa_model_35b_a3b(&m, true);
    o.mode = EPYQ_NUMA_AUTO;
    t = load("pack:2 numa:4 core:8 pu:1");
    ck_assert(t->mem_placeholder);
    p = NULL;
    ck_assert_msg(epyq_numa_plan_make(t, &m, &o, &p, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert(p->mem_unchecked);
    ck_assert_int_eq(p->n_groups, 8);
    epyq_numa_plan_free(p);
    epyq_topo_free(t);
}
END_TEST

/* `epyq inspect --numa`: stdout gets the table, usage errors exit 2, impossible plans exit 1. */
static int run_cli(const char *args, char *out, size_t size) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' inspect %s 2>&1", epyq_test_bin(), args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_inspect_numa_cli) {
    struct stat sb;
    if (stat(epyq_test_bin(), &sb) != 0) {
        printf("skip: %s not built\n", epyq_test_bin());
        return;
    }
    static char out[65536];
    char args[4200];
    snprintf(args, sizeof args, "--numa --topology '%s' -t 16", xml_path("genoa-2s-nps1-interleaved.xml"));
    ck_assert_int_eq(run_cli(args, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "NUMA plan: mode distribute") && strstr(out, "5120") && strstr(out, "32-39"), "%s", out);
    ck_assert_int_eq(run_cli("--numa=sideways", out, sizeof out), 2);
    ck_assert_msg(strstr(out, "sideways"), "%s", out);
    ck_assert_int_eq(run_cli("--numa --topology 'pack:2 numa:1(memory=4GiB) core:2 pu:1' --numa distribute", out,
                             sizeof out), 2); /* --numa takes its mode as --numa=MODE here */
    ck_assert_int_eq(run_cli("--numa=distribute --topology 'pack:2 numa:1(memory=4GiB) core:2 pu:1'", out,
                             sizeof out), 1);
    ck_assert_msg(strstr(out, "epyq: numa plan: node 0 needs"), "%s", out);
    /* the README's example, as printed there */
    ck_assert_int_eq(run_cli("--numa --topology \"pack:2 numa:4 core:8 pu:1\"", out, sizeof out), 0);
    ck_assert_msg(strstr(out, "memory not checked") && strstr(out, "not given"), "%s", out);

    /* An inherited taskset is obeyed: only that CPU is planned, others are refused. */
    if (stat("/usr/bin/taskset", &sb) != 0) {
        printf("skip: taskset not installed\n");
        return;
    }
    cpu_set_t mask;
    sched_getaffinity(0, sizeof mask, &mask);
    int first = -1, last = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mask)) {
            if (first < 0) first = c;
            last = c;
        }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "/usr/bin/taskset -c %d '%s' inspect --numa 2>&1", last, epyq_test_bin());
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    ck_assert_int_eq(pclose(p), 0);
    char want[64];
    snprintf(want, sizeof want, "1 cores / 1 PUs: %d\n", last);
    ck_assert_msg(strstr(out, want), "%s", out);
    if (first != last) {
        snprintf(cmd, sizeof cmd, "/usr/bin/taskset -c %d '%s' inspect --numa -C %d 2>&1", last, epyq_test_bin(), first);
        p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        n = fread(out, 1, sizeof out - 1, p);
        out[n] = '\0';
        int st = pclose(p);
        ck_assert_int_eq(WEXITSTATUS(st), 1);
        snprintf(want, sizeof want, "cpu %d is not available to this process", first);
        ck_assert_msg(strstr(out, want), "%s", out);
    }
}
END_TEST

static Suite *plan_suite(void) {
    Suite *s = suite_create("numa_plan");
    TCase *tc = epyq_test_case(s, "plan", 0);
    EPYQ_TESTS_ADD(tc, test_plan_nps4_full_model, test_plan_balance_odd_nodes,
                   test_plan_traffic_balance, test_plan_genoa_threads_follow_nodes,
                   test_plan_asymmetric_memoryless_cpuless, test_plan_modes,
                   test_plan_split_this_machine, test_plan_impossible_requests,
                   test_plan_memory_checks, test_plan_small_nodes, test_replicate_memory_refused,
                   test_plan_slices, test_opts_parse_and_env, test_inspect_numa_cli);
    return s;
}

int main(void) { return epyq_test_run(plan_suite()); }
