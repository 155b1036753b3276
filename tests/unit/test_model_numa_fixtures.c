/* tests/unit/test_model_numa_fixtures.c — the NUMA modes on the conformance fixtures.
 *
 * For every int4 fixture (gptq, ct, quark; ../shared/fixtures/models), the prompt and greedy
 * decode logits with the dense linears split by rows over 1, 2 and 4 logical nodes, and with
 * replicate-dense, must be --numa off's bits (whole experts: moe_slice = the intermediate
 * size), with the MTP head loaded so its layer's linears are placed too; move_pages must find
 * every weight page, and every DeltaNet state, KV plane and conv block, on its node, and every
 * pool's reads must be local. Exits 77 without fixtures. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/numa_moe.h"
#include "tests/check_main.h"
#include "tests/testutil.h"
#include "tests/unit/model_greedy.h"

#define N_PROMPT 5
#define N_DECODE 3

static const char *const folders[] = {"tiny-gptq", "tiny-ct", "tiny-quark"};

/* [N_PROMPT + N_DECODE][vocab] logits; numa NULL = off. */
static float *run(const char *dir, const epyq_numa_opts *numa, int32_t *vocab) {
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.n_threads = 2, .numa = numa, .moe_slice = 0};
    ck_assert_msg(epyq_model_load(&m, dir, &mo, &err) == EPYQ_OK, "%s: %s", dir, err.msg);
    const epyq_config *c = epyq_model_config(m);
    if (numa) { /* whole experts: the single-pool path's units, for its exact bits */
        mo.moe_slice = c->moe_intermediate_size; /* before the free: c is the model's */
        epyq_model_free(m);
        ck_assert_msg(epyq_model_load(&m, dir, &mo, &err) == EPYQ_OK, "%s: %s", dir, err.msg);
        c = epyq_model_config(m);
    }
    const int32_t V = c->vocab_size;
    *vocab = V;
    float *lg = malloc((size_t)(N_PROMPT + N_DECODE) * V * sizeof(float));
    ck_assert_ptr_nonnull(lg);
    epyq_seq *s = NULL;
    ck_assert_msg(epyq_seq_create(&s, m, 32, EPYQ_KV_BF16, &err) == EPYQ_OK, "%s", err.msg);
    int32_t tok[N_PROMPT] = {9, 321, 77, 500, 18};
    epyq_test_greedy(m, s, tok, N_PROMPT, N_DECODE, V, lg);
    if (numa) {
        size_t pages = 0, elsewhere = 0;
        ck_assert_msg(epyq_model_numa_verify(m, &pages, &elsewhere, &err) == EPYQ_OK, "%s",
                      err.msg);
        ck_assert_uint_eq(elsewhere, 0);
        ck_assert_msg(epyq_seq_numa_verify(s, &pages, &elsewhere, &err) == EPYQ_OK, "%s", err.msg);
        ck_assert_msg(pages > 0 && elsewhere == 0, "%zu DeltaNet state pages, %zu elsewhere", pages,
                      elsewhere);
        /* the caches, conv histories and states of every head on its owner's node */
        epyq_seq_numa_pages k[EPYQ_SEQ_NUMA_KINDS];
        ck_assert_msg(epyq_seq_numa_verify_kinds(s, k, &err) == EPYQ_OK, "%s", err.msg);
        const epyq_seq_numa_kind kinds[] = {EPYQ_SEQ_NUMA_STATE, EPYQ_SEQ_NUMA_KV,
                                            EPYQ_SEQ_NUMA_CONV};
        for (int i = 0; i < 3; i++) {
            const epyq_seq_numa_pages *p = &k[kinds[i]];
            ck_assert_msg(p->bound && p->on_node > 0 && p->elsewhere == 0,
                          "%s: buffer kind %d: bound %d, %zu pages on their node, %zu elsewhere",
                          dir, (int)kinds[i], (int)p->bound, p->on_node, p->elsewhere);
        }
        for (int32_t g = 0; g < epyq_model_numa_groups(m); g++) {
            uint64_t local = 0, remote = 0;
            ck_assert_int_eq(epyq_model_numa_reads(m, g, &local, &remote, &err), EPYQ_OK);
            ck_assert_msg(local > 0 && remote == 0, "%s: node %d read %llu local, %llu remote", dir,
                          (int)g, (unsigned long long)local, (unsigned long long)remote);
            ck_assert_int_eq(epyq_model_numa_seq_reads(m, g, &local, &remote, &err), EPYQ_OK);
            ck_assert_msg(remote == 0, "%s: node %d read %llu remote sequence bytes", dir, (int)g,
                          (unsigned long long)remote);
        }
    }
    epyq_seq_free(s);
    epyq_model_free(m);
    return lg;
}

START_TEST(test_fixture_modes) {
    char sub[256];
    snprintf(sub, sizeof sub, "fixtures/models/%s", folders[_i]);
    const char *found = epyq_test_shared(sub);
    if (!found) return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", found);
    int32_t V;
    float *off = run(dir, NULL, &V);
    const size_t bytes = (size_t)(N_PROMPT + N_DECODE) * V * sizeof(float);
    const epyq_numa_mode modes[] = {EPYQ_NUMA_DISTRIBUTE, EPYQ_NUMA_REPLICATE_DENSE};
    const int32_t splits[] = {1, 2, 4};
    for (int mi = 0; mi < 2; mi++)
        for (int i = 0; i < 3; i++) {
            epyq_numa_opts o;
            epyq_numa_opts_init(&o);
            o.mode = modes[mi];
            o.split = splits[i];
            float *lg = run(dir, &o, &V);
            ck_assert_msg(!memcmp(lg, off, bytes),
                          "%s: --numa %s --numa-split %d differs from --numa off", folders[_i],
                          epyq_numa_mode_name(modes[mi]), (int)splits[i]);
            free(lg);
        }
    free(off);
}
END_TEST

int main(void) {
    const int nf = (int)(sizeof folders / sizeof folders[0]);
    bool any = false;
    char sub[256];
    for (int i = 0; i < nf; i++) {
        snprintf(sub, sizeof sub, "fixtures/models/%s", folders[i]);
        any = any || epyq_test_shared(sub);
    }
    if (!any) {
        printf("skip: ../shared/fixtures/models not found\n");
        return 77;
    }
    Suite *s = suite_create("model_numa_fixtures");
    TCase *tc = epyq_test_case(s, "fixtures", 300);
    tcase_add_loop_test(tc, test_fixture_modes, 0, nf);
    return epyq_test_failures(s, true) ? 1 : 0;
}
