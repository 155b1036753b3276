/* tests/unit/test_numa_topo.c — numa/topo.h on synthetic and XML topologies (NPS4, Genoa
 * interleaved numbering, memoryless and CPU-less nodes), numactl-like restriction, this machine,
 * node lists and the errors for bad specs. The plans built on them: test_numa_plan.c. */
#include <check.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numa/topo.h"
#include "tests/check_main.h"
#include "tests/unit/numa_topo_util.h"

START_TEST(test_topo_synthetic_nps4) {
    epyq_topo *t = load(NPS4);
    ck_assert_int_eq(t->n_nodes, 8);
    ck_assert_int_eq(t->n_packages, 2);
    ck_assert(!t->this_system);
    for (int32_t i = 0; i < 8; i++) {
        const epyq_topo_node *n = &t->nodes[i];
        ck_assert_int_eq(n->os_index, i);
        ck_assert_int_eq(n->package, i / 4);
        ck_assert_uint_eq(n->mem_bytes, 192 * GIB);
        ck_assert_int_eq(n->n_pus, 16);
        ck_assert_int_eq(n->pus[0], 16 * i);
        int32_t cores[32];
        ck_assert_int_eq(epyq_topo_node_cores(n, cores, 32), 8);
        /* pu:2 numbers siblings next to each other: cores start at even ids. */
        for (int32_t c = 0; c < 8; c++) ck_assert_int_eq(cores[c], 16 * i + 2 * c);
    }
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_topo_genoa_interleaved_xml) {
    epyq_topo *t = load(xml_path("genoa-2s-nps1-interleaved.xml"));
    ck_assert_int_eq(t->n_nodes, 2);
    char buf[256];
    list_str(t->nodes[0].pus, t->nodes[0].n_pus, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-31,64-95");
    list_str(t->nodes[1].pus, t->nodes[1].n_pus, buf, sizeof buf);
    ck_assert_str_eq(buf, "32-63,96-127");
    int32_t cores[64];
    int32_t nc = epyq_topo_node_cores(&t->nodes[1], cores, 64);
    list_str(cores, nc, buf, sizeof buf);
    ck_assert_str_eq(buf, "32-63");
    ck_assert_ptr_nonnull(t->distance);
    ck_assert_uint_eq(t->distance[0], 10);
    ck_assert_uint_eq(t->distance[1], 32);
    ck_assert_uint_eq(t->nodes[0].mem_bytes, 384 * GIB);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_topo_memoryless_and_cpuless) {
    epyq_topo *t = load(xml_path("memoryless-node.xml"));
    ck_assert_int_eq(t->n_nodes, 3);
    ck_assert_uint_eq(t->nodes[1].mem_bytes, 0);
    ck_assert_int_eq(t->nodes[1].n_pus, 8);
    ck_assert_int_eq(t->nodes[1].pus[0], 8);
    epyq_topo_free(t);
    t = load(xml_path("cxl-cpuless-node.xml"));
    ck_assert_int_eq(t->n_nodes, 3);
    /* The CXL node's locality is the whole machine; its CPUs must stay with nodes 0 and 1. */
    ck_assert_int_eq(t->nodes[2].n_pus, 0);
    ck_assert_int_eq(t->nodes[0].n_pus, 8);
    ck_assert_int_eq(t->nodes[1].n_pus, 8);
    ck_assert_uint_eq(t->nodes[2].mem_bytes, 256 * GIB);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_topo_restrict_like_numactl) {
    epyq_topo *t = load(xml_path("genoa-2s-nps1-interleaved.xml"));
    int32_t cpus[] = {32, 33, 96};
    int32_t mems[] = {1};
    epyq_err err = {0};
    ck_assert_int_eq(epyq_topo_restrict(t, cpus, 3, mems, 1, &err), EPYQ_OK);
    ck_assert_int_eq(t->n_nodes, 1);
    ck_assert_int_eq(t->nodes[0].os_index, 1);
    ck_assert_int_eq(t->nodes[0].n_pus, 3);
    ck_assert_uint_eq(t->distance[0], 10);
    /* Nothing left at all is an error, not an empty topology. */
    int32_t none[] = {5000};
    ck_assert_int_eq(epyq_topo_restrict(t, none, 1, NULL, 0, &err), EPYQ_OK);
    ck_assert_int_eq(t->n_nodes, 1); /* memory on node 1 is still usable */
    int32_t other[] = {0};
    ck_assert_int_eq(epyq_topo_restrict(t, none, 1, other, 1, &err), EPYQ_E_NUMA);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_topo_this_machine_and_split) {
    epyq_topo *t = load(NULL);
    ck_assert(t->this_system);
    cpu_set_t mask;
    sched_getaffinity(0, sizeof mask, &mask);
    int32_t total = 0;
    for (int32_t i = 0; i < t->n_nodes; i++) {
        total += t->nodes[i].n_pus;
        for (int32_t p = 0; p < t->nodes[i].n_pus; p++)
            ck_assert(CPU_ISSET(t->nodes[i].pus[p], &mask));
    }
    ck_assert_int_eq(total, CPU_COUNT(&mask));

    epyq_err err = {0};
    for (int32_t n = 1; n <= 4; n++) {
        epyq_topo *s = NULL;
        ck_assert_msg(epyq_topo_split(t, n, &s, &err) == EPYQ_OK, "%s", err.msg);
        ck_assert_int_eq(s->n_nodes, n);
        ck_assert_int_eq(s->split, n);
        uint64_t mem = 0;
        int32_t seen = 0;
        for (int32_t k = 0; k < n; k++) {
            ck_assert_int_ge(s->nodes[k].n_pus, 1);
            seen += s->nodes[k].n_pus;
            mem += s->nodes[k].mem_bytes;
            ck_assert_int_ge(epyq_topo_find_os(t, s->nodes[k].os_index), 0);
        }
        uint64_t real_mem = 0;
        for (int32_t i = 0; i < t->n_nodes; i++) real_mem += t->nodes[i].mem_bytes;
        ck_assert_uint_le(mem, real_mem);
        ck_assert_uint_ge(mem + (uint64_t)n, real_mem); /* only rounding is lost */
        /* Enough cores: every CPU in exactly one logical node. */
        if (!s->shared_cores) ck_assert_int_eq(seen, total);
        else
            ck_assert_int_gt(n, total);
        epyq_topo_free(s);
    }
    ck_assert_int_eq(epyq_topo_split(t, 0, &(epyq_topo *){NULL}, &err), EPYQ_E_ARG);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_topo_lists_and_bad_specs) {
    int32_t v[256];
    epyq_err err = {0};
    ck_assert_int_eq(epyq_topo_parse_list("64-95,0-31", 1024, v, 256, "-C", &err), 64);
    ck_assert_int_eq(v[0], 0);
    ck_assert_int_eq(v[32], 64);
    ck_assert_int_eq(epyq_topo_parse_list("3,1,3", 1024, v, 256, "-C", &err), 2);
    const char *bad[] = {"", "3-1", "a", "1,,2", "1-", "-1", "2048", "1 2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(epyq_topo_parse_list(bad[i], 1024, v, 256, "-C", &err) == -1,
                      "accepted \"%s\"", bad[i]);
        ck_assert(strstr(err.msg, "-C"));
    }
    char buf[64];
    int32_t w[] = {0, 1, 2, 5, 7, 8};
    epyq_topo_format_list(w, 6, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-2,5,7-8");

    epyq_topo *t = NULL;
    ck_assert_int_eq(epyq_topo_load(&t, "pack:2 bogus:3", &err), EPYQ_E_NUMA);
    ck_assert(strstr(err.msg, "synthetic"));
    ck_assert_int_eq(epyq_topo_load(&t, "/nonexistent/topo.xml", &err), EPYQ_E_NUMA);
    ck_assert(strstr(err.msg, "/nonexistent/topo.xml"));
    ck_assert_ptr_null(t);
}
END_TEST

static Suite *topo_suite(void) {
    Suite *s = suite_create("numa_topo");
    TCase *tc = epyq_test_case(s, "topo", 0);
    EPYQ_TESTS_ADD(tc, test_topo_synthetic_nps4, test_topo_genoa_interleaved_xml,
                   test_topo_memoryless_and_cpuless, test_topo_restrict_like_numactl,
                   test_topo_this_machine_and_split, test_topo_lists_and_bad_specs);
    return s;
}

int main(void) { return epyq_test_run(topo_suite()); }
