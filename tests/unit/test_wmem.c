/* tests/unit/test_wmem.c — the weight arena (src/model/wmem.c):
 *   - 4 threads carve 1,000 buffers of random sizes (1 B to 40 MiB, so some take chunks of
 *     their own) at once: every buffer 64-byte aligned, zero when handed out, owned by the
 *     arena, and no two overlap (each is filled with its own byte and all are read back after
 *     every thread is done); releasing arena memory leaves it intact, a heap pointer is freed;
 *   - the chunks are advised for huge pages: /proc/self/smaps shows "hg" in the VmFlags of
 *     the mapping that holds a buffer;
 *   - a tiny synthetic model loaded with --numa off keeps its packed linears (lm_head, every
 *     routed expert, the projections) in its arena, and with --numa-split 2 has none (the node
 *     buffers hold them).
 * In sanitizer builds there is no arena (ASan must see every buffer's bounds): the checks
 * then assert the heap fallback (zeroed, aligned, not owned, freed by release). */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"
#include "numa/plan.h"
#include "tests/check_main.h"
#include "tests/e2e/synth_model.h"

/* sanitizer builds have no arena (wmem.c); every other build must have one */
#if defined(__SANITIZE_ADDRESS__)
#define EXPECT_ARENA 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EXPECT_ARENA 0
#endif
#endif
#ifndef EXPECT_ARENA
#define EXPECT_ARENA 1
#endif

#define THREADS 4
#define PER_THREAD 250

typedef struct {
    epyq_wmem *w;
    uint64_t seed;
    uint8_t *p[PER_THREAD];
    size_t len[PER_THREAD];
    int bad_align, bad_zero, missing;
} carver;

static uint64_t next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void *carve(void *arg) {
    carver *c = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        uint64_t r = next(&c->seed);
        /* mostly expert-sized pieces, some tiny ones, a few larger than a quarter chunk */
        size_t len = r % 100 == 0 ? (size_t)(16u << 20) + r % (24u << 20)
                     : r % 7 == 0 ? 1 + r % 200
                                  : (size_t)(256u << 10) + r % (1u << 20);
        uint8_t *p = epyq_wmem_alloc(c->w, len, 1);
        c->p[i] = p, c->len[i] = len;
        if (!p) {
            c->missing++;
            continue;
        }
        if ((uintptr_t)p % 64) c->bad_align++;
        for (size_t j = 0; j < len; j += 4093) c->bad_zero += p[j] != 0;
        c->bad_zero += p[len - 1] != 0;
    }
    return NULL;
}

static uint8_t tag(int t, int i) { return (uint8_t)(1 + (t * PER_THREAD + i) % 251); }

START_TEST(test_arena_carves_disjoint_zeroed_buffers) {
    epyq_err err = {0};
    epyq_wmem *w = NULL;
    ck_assert_msg(epyq_wmem_create(&w, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(w != NULL, EXPECT_ARENA);
    static carver c[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        memset(&c[t], 0, sizeof c[t]);
        c[t].w = w, c[t].seed = 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1);
        ck_assert_int_eq(pthread_create(&th[t], NULL, carve, &c[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    /* each buffer gets its own byte only now, after all carving: an overlap shows as a
     * neighbour's byte when read back */
    for (int t = 0; t < THREADS; t++) {
        ck_assert_msg(!c[t].missing && !c[t].bad_align && !c[t].bad_zero,
                      "thread %d: %d buffers missing, %d misaligned, %d bytes not zero", t,
                      c[t].missing, c[t].bad_align, c[t].bad_zero);
        for (int i = 0; i < PER_THREAD; i++) memset(c[t].p[i], tag(t, i), c[t].len[i]);
    }
    uint64_t total = 0;
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < PER_THREAD; i++) {
            const uint8_t *p = c[t].p[i];
            size_t len = c[t].len[i];
            total += len;
            for (size_t j = 0; j < len; j += 509)
                ck_assert_msg(
                    p[j] == tag(t, i),
                    "thread %d buffer %d (%zu bytes): byte %zu is %u, expected %u (overlap)", t, i,
                    len, j, p[j], tag(t, i));
            ck_assert_msg(p[len - 1] == tag(t, i), "thread %d buffer %d: last byte overwritten", t,
                          i);
            ck_assert_msg(epyq_wmem_owns(w, p) == (w != NULL),
                          "thread %d buffer %d: owned %d, arena %p", t, i, epyq_wmem_owns(w, p),
                          (void *)w);
        }
    if (w) {
        ck_assert_msg(epyq_wmem_bytes(w) >= total, "arena holds %llu bytes for %llu handed out",
                      (unsigned long long)epyq_wmem_bytes(w), (unsigned long long)total);
        /* releasing arena memory must not free or change it */
        epyq_wmem_release(w, c[0].p[0]);
        ck_assert_int_eq(c[0].p[0][0], tag(0, 0));
        /* a heap pointer is not the arena's and is freed by release (ASan/LSan would see a leak
         * or a bad free otherwise) */
        void *h = malloc(100);
        ck_assert(!epyq_wmem_owns(w, h));
        epyq_wmem_release(w, h);
    } else {
        for (int t = 0; t < THREADS; t++)
            for (int i = 0; i < PER_THREAD; i++) epyq_wmem_release(NULL, c[t].p[i]);
    }
    epyq_wmem_free(w);
}
END_TEST

/* The VmFlags line of the smaps entry whose range holds p; "" when not found. */
static void vm_flags_of(const void *p, char *out, size_t size) {
    out[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return;
    char line[512];
    int inside = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (inside && !strncmp(line, "VmFlags:", 8)) {
            snprintf(out, size, "%s", line + 8);
            break;
        }
    }
    fclose(f);
}

START_TEST(test_arena_advises_huge_pages) {
    epyq_err err = {0};
    epyq_wmem *w = NULL;
    ck_assert_msg(epyq_wmem_create(&w, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(w != NULL, EXPECT_ARENA);
    if (!w) return; /* sanitizer build: the heap, nothing advised (checked above) */
    uint8_t *small = epyq_wmem_alloc(w, 512u << 10, 1), *big = epyq_wmem_alloc(w, 40u << 20, 1);
    ck_assert(small && big);
    ck_assert_msg((uintptr_t)big % (2u << 20) == 0,
                  "a chunk of its own starts on a 2 MiB boundary");
    char flags[512];
    vm_flags_of(small, flags, sizeof flags);
    ck_assert_msg(strstr(flags, " hg"), "expert-sized buffer: VmFlags%s lacks hg (MADV_HUGEPAGE)",
                  flags);
    vm_flags_of(big, flags, sizeof flags);
    ck_assert_msg(strstr(flags, " hg"), "large buffer: VmFlags%s lacks hg (MADV_HUGEPAGE)", flags);
    epyq_wmem_free(w);
}
END_TEST

static int lin_in_arena(const epyq_model *m, const epyq_rlin *l) {
    const void *p = l->q4 ? (const void *)l->w4.mem : (const void *)l->bf16;
    return epyq_wmem_owns(m->wmem, p);
}

START_TEST(test_model_weights_in_arena) {
    char *dir = synth_model("ct", 3);
    ck_assert(dir);
    epyq_err err = {0};
    ck_assert(epyq_kern_init(&err) == EPYQ_OK);
    epyq_model *m = NULL;
    epyq_model_opts mo = {.path = EPYQ_PATH_A8, .n_threads = 1};
    ck_assert_msg(epyq_model_load(&m, dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(m->wmem != NULL, EXPECT_ARENA);
    if (m->wmem) {
        ck_assert_msg(lin_in_arena(m, &m->lm_head), "lm_head outside the arena");
        int outside = 0, n = 0;
        for (int32_t l = 0; l < m->d.L; l++) {
            const epyq_layer_rw *ly = &m->layers[l];
            const epyq_rlin *proj = ly->full ? &ly->at.q : &ly->g.qkv;
            outside += !lin_in_arena(m, proj), n++;
            for (int32_t e = 0; e < m->d.E; e++)
                outside += !lin_in_arena(m, &ly->m.gate[e]) + !lin_in_arena(m, &ly->m.up[e]) +
                           !lin_in_arena(m, &ly->m.down[e]),
                    n += 3;
        }
        ck_assert_msg(outside == 0, "%d of %d packed linears outside the arena", outside, n);
    }
    epyq_model_free(m);
    /* NUMA mode: the node buffers hold the weights, no arena */
    epyq_numa_opts no;
    epyq_numa_opts_init(&no);
    no.split = 2;
    mo.numa = &no;
    ck_assert_msg(epyq_model_load(&m, dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(m->wmem == NULL, "NUMA-placed model has an arena");
    epyq_model_free(m);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("wmem");
    TCase *tc = epyq_test_case(s, "arena", 120);
    EPYQ_TESTS_ADD(tc, test_arena_carves_disjoint_zeroed_buffers, test_arena_advises_huge_pages,
                   test_model_weights_in_arena);
    return epyq_test_failures(s, false) ? 1 : 0;
}
