/* tests/unit/test_numa_place.c — numa/place.h on the real machine: node-bound buffers filled by
 * pinned workers and verified with move_pages, wrong-node reports, bad nodes, kernel-setting
 * warnings, and pools built from plans (split mode here; synthetic plans must refuse to bind). */
#include <check.h>
#include <dirent.h>
#include <numa.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "numa/place.h"
#include "numa/plan.h"
#include "numa/topo.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

static epyq_topo *real_topo(void) {
    epyq_topo *t = NULL;
    epyq_err err = {0};
    ck_assert_msg(epyq_topo_load(&t, NULL, &err) == EPYQ_OK, "%s", err.msg);
    return t;
}

/* The node this process may allocate on (node 0 on the build machine). */
static int32_t home_node(void) {
    epyq_topo *t = real_topo();
    int32_t os = -1;
    for (int32_t i = 0; i < t->n_nodes && os < 0; i++)
        if (t->nodes[i].mem_allowed && t->nodes[i].mem_bytes > 0 && t->nodes[i].n_pus > 0) os = t->nodes[i].os_index;
    epyq_topo_free(t);
    ck_assert_int_ge(os, 0);
    return os;
}

static uint8_t pattern(size_t off) { return (uint8_t)((off * 2654435761u) >> 13); }

static epyq_status fill_pattern(void *ctx, uint8_t *dst, size_t off, size_t len, epyq_err *err) {
    (void)ctx;
    (void)err;
    for (size_t i = 0; i < len; i++) dst[i] = pattern(off + i);
    return EPYQ_OK;
}

static epyq_status fill_fail_from_3(void *ctx, uint8_t *dst, size_t off, size_t len, epyq_err *err) {
    size_t chunk = *(size_t *)ctx;
    if (off >= 3 * chunk) return epyq_err_set(err, EPYQ_E_IO, "shard x: short read at %zu", off);
    return fill_pattern(ctx, dst, off, len, err);
}

static epyq_pool *pool_on(int32_t node) {
    epyq_topo *t = real_topo();
    int32_t idx = epyq_topo_find_os(t, node);
    ck_assert_int_ge(idx, 0);
    epyq_pool *p = NULL;
    epyq_err err = {0};
    int32_t n = t->nodes[idx].n_pus < 2 ? t->nodes[idx].n_pus : 2;
    epyq_pool_opts o = {.n_threads = n, .cpus = t->nodes[idx].pus, .node = node};
    ck_assert_msg(epyq_pool_create(&p, &o, &err) == EPYQ_OK, "%s", err.msg);
    epyq_topo_free(t);
    return p;
}

START_TEST(test_bound_fill_and_verify) {
    int32_t node = home_node();
    epyq_pool *pool = pool_on(node);
    epyq_numa_buf b;
    epyq_err err = {0};
    size_t len = (size_t)9 << 20; /* 9 MiB: a ragged last chunk */
    ck_assert_msg(epyq_numa_buf_alloc(&b, len, node, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_uint_eq((uintptr_t)b.ptr % (2u << 20), 0);

    /* Before the fill nothing is resident: binding alone places no page. */
    epyq_numa_verify_report rep;
    ck_assert_int_eq(epyq_numa_verify(b.ptr, len, &node, 1, "experts", &rep, &err), EPYQ_OK);
    ck_assert_uint_eq(rep.absent, rep.pages);

    ck_assert_msg(epyq_numa_buf_fill(&b, pool, 0, fill_pattern, NULL, &err) == EPYQ_OK, "%s", err.msg);
    for (size_t i = 0; i < len; i += 4093) ck_assert_uint_eq(b.ptr[i], pattern(i));
    ck_assert_uint_eq(b.ptr[len - 1], pattern(len - 1));

    ck_assert_msg(epyq_numa_verify(b.ptr, len, &node, 1, "experts", &rep, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_uint_eq(rep.pages, len / (size_t)sysconf(_SC_PAGESIZE));
    ck_assert_uint_eq(rep.on_node, rep.pages);
    ck_assert_uint_eq(rep.elsewhere, 0);

    /* A page on another node than expected is reported with its offset and node. This machine
     * has one node, so "expect node+1" stands in for a page that landed elsewhere. */
    int32_t other = node + 1;
    ck_assert_int_eq(epyq_numa_verify(b.ptr + 8192, 3 * 4096, &other, 1, "layer 7 experts", &rep, &err), EPYQ_E_NUMA);
    ck_assert_uint_eq(rep.elsewhere, 3);
    char want[128];
    snprintf(want, sizeof want, "3 of 3 pages are not on node %d (first at offset 0 is on node %d)", (int)other,
             (int)node);
    ck_assert_msg(strstr(err.msg, want) && strstr(err.msg, "layer 7 experts"), "%s", err.msg);

    epyq_numa_buf_free(&b);
    epyq_pool_free(pool);
}
END_TEST

START_TEST(test_interleaved_and_unbound) {
    int32_t node = home_node();
    epyq_pool *pool = pool_on(node);
    epyq_numa_buf b;
    epyq_err err = {0};
    ck_assert_int_eq(epyq_numa_buf_alloc_interleaved(&b, 1 << 20, &node, 1, &err), EPYQ_OK);
    ck_assert_int_eq(epyq_numa_buf_fill(&b, pool, 65536, fill_pattern, NULL, &err), EPYQ_OK);
    epyq_numa_verify_report rep;
    ck_assert_int_eq(epyq_numa_verify(b.ptr, b.len, &node, 1, "dense", &rep, &err), EPYQ_OK);
    ck_assert_uint_eq(rep.on_node, rep.pages);
    epyq_numa_buf_free(&b);
    /* Unbound (--numa off/numactl): the kernel's policy decides; on one node that is node 0. */
    ck_assert_int_eq(epyq_numa_buf_alloc(&b, 12345, -1, &err), EPYQ_OK);
    ck_assert_int_eq(b.n_nodes, 0);
    memset(b.ptr, 1, b.len);
    epyq_numa_buf_free(&b);
    epyq_pool_free(pool);
}
END_TEST

/* Memory that is not an epyq_numa_buf (a sequence's states): its whole pages are bound, and
 * moved when already touched; a node that does not exist is an error naming it. */
START_TEST(test_bind_range) {
    int32_t node = home_node();
    epyq_err err = {0};
    void *p = NULL;
    ck_assert_int_eq(posix_memalign(&p, 4096, 16 * 4096), 0);
    memset(p, 3, 16 * 4096); /* touched first: the binding has to move, not just place */
    ck_assert_msg(epyq_numa_bind_range(p, 16 * 4096, node, "state", &err) == EPYQ_OK, "%s",
                  err.msg);
    epyq_numa_verify_report rep;
    ck_assert_int_eq(epyq_numa_verify(p, 16 * 4096, &node, 1, "state", &rep, &err), EPYQ_OK);
    ck_assert_uint_eq(rep.pages, 16);
    ck_assert_uint_eq(rep.on_node, 16);
    /* less than a whole page: nothing to bind, no error */
    ck_assert_int_eq(epyq_numa_bind_range((uint8_t *)p + 100, 200, node, "state", &err), EPYQ_OK);
    ck_assert_int_eq(epyq_numa_bind_range(p, 4096, 1000, "DeltaNet state of layer 2 head 5", &err),
                     EPYQ_E_NUMA);
    ck_assert_msg(strstr(err.msg, "node 1000") && strstr(err.msg, "layer 2 head 5"), "%s", err.msg);
    free(p);
}
END_TEST

START_TEST(test_fill_reports_first_failure) {
    int32_t node = home_node();
    epyq_pool *pool = pool_on(node);
    epyq_numa_buf b;
    epyq_err err = {0};
    size_t chunk = 65536;
    ck_assert_int_eq(epyq_numa_buf_alloc(&b, 10 * chunk, node, &err), EPYQ_OK);
    ck_assert_int_eq(epyq_numa_buf_fill(&b, pool, chunk, fill_fail_from_3, &chunk, &err), EPYQ_E_IO);
    char want[64];
    snprintf(want, sizeof want, "short read at %zu", 3 * chunk);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    epyq_numa_buf_free(&b);
    epyq_pool_free(pool);
}
END_TEST

START_TEST(test_bad_nodes) {
    epyq_numa_buf b;
    epyq_err err = {0};
    int32_t missing = numa_available() >= 0 ? numa_max_node() + 1 : 1;
    ck_assert_int_eq(epyq_numa_buf_alloc(&b, 4096, missing, &err), EPYQ_E_NUMA);
    char want[64];
    snprintf(want, sizeof want, "node %d does not exist", (int)missing);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    ck_assert_ptr_null(b.ptr);
    ck_assert_int_eq(epyq_numa_buf_alloc(&b, 0, 0, &err), EPYQ_E_ARG);
}
END_TEST

static void write_file(const char *dir, const char *rel, const char *text) {
    char path[4096], tmp[4096];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    /* mkdir -p of the parent */
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + strlen(dir) + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_sys_check) {
    char *dir = epyq_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    char msg[1024];
    write_file(dir, "proc/sys/kernel/numa_balancing", "1\n");
    write_file(dir, "sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]\n");
    unsigned bits = epyq_numa_sys_check(dir, msg, sizeof msg);
    ck_assert_uint_eq(bits, EPYQ_NUMA_WARN_BALANCING | EPYQ_NUMA_WARN_THP_NEVER);
    ck_assert(strstr(msg, "numa_balancing=0"));
    ck_assert(strstr(msg, "huge pages are disabled"));
    write_file(dir, "proc/sys/kernel/numa_balancing", "0\n");
    write_file(dir, "sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
    ck_assert_uint_eq(epyq_numa_sys_check(dir, msg, sizeof msg), 0);
    ck_assert_str_eq(msg, "");
    /* Missing files (containers without /sys) are not findings. */
    ck_assert_uint_eq(epyq_numa_sys_check("/nonexistent-root", msg, sizeof msg), 0);
    free(dir);
}
END_TEST

START_TEST(test_rt_pools_from_plans) {
    epyq_topo *t = real_topo();
    epyq_numa_model m = {.name = "tiny", .n_layers = 2, .n_experts = 8, .top_k = 2, .expert_bytes = 4096,
                         .dense_bytes = 4096};
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    o.split = 2;
    epyq_numa_plan *p = NULL;
    epyq_err err = {0};
    ck_assert_msg(epyq_numa_plan_make(t, &m, &o, &p, &err) == EPYQ_OK, "%s", err.msg);
    epyq_numa_rt *rt = NULL;
    ck_assert_msg(epyq_numa_rt_create(&rt, p, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(rt->n_groups, 2);
    /* Pool 0's worker 0 is this thread; pool 1 is detached, all its workers are threads. */
    ck_assert_int_eq(epyq_test_threads_named("numa0_t"), p->groups[0].n_threads - 1);
    ck_assert_int_eq(epyq_test_threads_named("numa1_t"), p->groups[1].n_threads);
    int32_t dn[4];
    ck_assert_int_eq(epyq_numa_plan_dense_nodes(p, dn, 4), 1);
    epyq_numa_rt_free(rt);
    ck_assert_int_eq(epyq_test_threads_named_settled("numa1_t", 0), 0);
    epyq_numa_plan_free(p);

    /* A plan for a synthetic machine names CPUs this one does not have: pools refuse. */
    epyq_topo *syn = NULL;
    ck_assert_int_eq(epyq_topo_load(&syn, "pack:2 numa:4(memory=8GiB) core:8 pu:1", &err), EPYQ_OK);
    o.split = 0;
    ck_assert_int_eq(epyq_numa_plan_make(syn, &m, &o, &p, &err), EPYQ_OK);
    ck_assert_int_eq(epyq_numa_plan_dense_nodes(p, dn, 4), 4);
    ck_assert_int_eq(epyq_numa_rt_create(&rt, p, &err), EPYQ_E_NUMA);
    ck_assert_msg(strstr(err.msg, "not in this process's allowed CPU set"), "%s", err.msg);
    ck_assert_ptr_null(rt);
    epyq_numa_plan_free(p);
    epyq_topo_free(syn);
    epyq_topo_free(t);
}
END_TEST

START_TEST(test_setup_in_one_call) {
    epyq_numa_model m = {.name = "tiny", .n_layers = 2, .n_experts = 8, .top_k = 2, .expert_bytes = 4096,
                         .dense_bytes = 4096};
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    o.split = 2;
    char *text = NULL;
    size_t len = 0;
    FILE *log = open_memstream(&text, &len);
    epyq_numa_setup *s = NULL;
    epyq_err err = {0};
    ck_assert_msg(epyq_numa_setup_create(&s, &m, &o, log, &err) == EPYQ_OK, "%s", err.msg);
    fclose(log);
    ck_assert_msg(strstr(text, "NUMA plan: mode distribute") && strstr(text, "split 2 of this machine"), "%s", text);
    ck_assert_int_eq(s->rt->n_groups, 2);
    free(text);
    epyq_numa_setup_free(s);

    o.split = 0;
    o.nodes = "7";
    ck_assert_int_eq(epyq_numa_setup_create(&s, &m, &o, NULL, &err), EPYQ_E_NUMA);
    ck_assert_ptr_null(s);
    ck_assert(strstr(err.msg, "node 7"));

    /* isolate: the node of the calling thread. */
    o.nodes = NULL;
    o.mode = EPYQ_NUMA_ISOLATE;
    ck_assert_msg(epyq_numa_setup_create(&s, &m, &o, NULL, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(s->plan->n_groups, 1);
    epyq_numa_setup_free(s);
}
END_TEST

static Suite *place_suite(void) {
    Suite *s = suite_create("numa_place");
    TCase *tc = epyq_test_case(s, "place", 60);
    EPYQ_TESTS_ADD(tc, test_bound_fill_and_verify, test_interleaved_and_unbound,
                   test_fill_reports_first_failure, test_bind_range, test_bad_nodes, test_sys_check,
                   test_rt_pools_from_plans, test_setup_in_one_call);
    return s;
}

int main(void) { return epyq_test_run(place_suite()); }
