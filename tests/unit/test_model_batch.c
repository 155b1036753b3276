/* tests/unit/test_model_batch.c — sequences and batches of the runtime model, on a synthetic
 * tiny compressed-tensors checkpoint (no ../shared needed):
 *   - a sequence alone vs the same sequence inside batches with four others (prefill chunks and
 *     decode steps mixed, its tokens interleaved with theirs): bit-identical logits with the
 *     ref kernels and with this host's SIMD kernels;
 *   - 1 thread vs 2 threads: bit-identical (with 2 threads a decode step spreads each expert
 *     over both, src/model/moe.c split mode; with 1 it runs whole), and with 2 threads the
 *     split mode on vs off: bit-identical;
 *   - a 40-token prompt (norms, residual adds, routing and MoE sums then run on the pool)
 *     on 1 vs 2 threads: bit-identical; with block timing on, the same bits again, every
 *     block counted once per forward and the blocks' sum within the call's wall time;
 *   - context: a batch past a sequence's context is refused with nothing changed;
 *   - fp8 e4m3 KV cache vs bf16: same distributions within the fixtures' bf16 criteria. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/model.h"
#include "tests/check_main.h"
#include "tests/e2e/conform.h"
#include "tests/e2e/synth_model.h"

static char *g_dir;

static epyq_model *load_with(int threads, epyq_numpath path, const epyq_kern_table *kt) {
    epyq_err err = {0};
    epyq_model *m = NULL;
    /* chunked DeltaNet for 8+ tokens: A uses it for its prefill, the others stay recurrent */
    epyq_model_opts o = {.path = path, .n_threads = threads, .kernels = kt, .gdn_chunk_min = 8};
    ck_assert_msg(epyq_model_load(&m, g_dir, &o, &err) == EPYQ_OK, "%s", err.msg);
    return m;
}

static epyq_model *load(int threads, epyq_numpath path) { return load_with(threads, path, NULL); }

/* deterministic prompt of n ids below 1000 */
static void prompt(int *ids, int n, int salt) {
    for (int i = 0; i < n; i++) ids[i] = (int)((i * 131u + (unsigned)salt * 977u + 7u) % 997u);
}

/* Sequence A: prefill 9 tokens (one chunk), then 3 decode steps feeding fixed ids. Returns
 * [4][V] logits: last prefill row + 3 decode rows. */
static float *run_alone(epyq_model *m, epyq_kv_type kv) {
    const int V = epyq_model_config(m)->vocab_size;
    epyq_err err = {0};
    epyq_seq *s = NULL;
    ck_assert(epyq_seq_create(&s, m, 64, kv, &err) == EPYQ_OK);
    int ids[12];
    prompt(ids, 12, 1);
    epyq_seq *ss[9];
    for (int i = 0; i < 9; i++) ss[i] = s;
    uint8_t want[9] = {0};
    want[8] = 1;
    float *out = malloc((size_t)4 * V * sizeof(float));
    epyq_batch b = {9, ss, ids, want};
    ck_assert_msg(epyq_model_forward(m, &b, out, NULL, &err) == EPYQ_OK, "%s", err.msg);
    for (int d = 0; d < 3; d++) {
        epyq_batch bd = {1, ss, &ids[9 + d], NULL};
        ck_assert(epyq_model_forward(m, &bd, out + (size_t)(d + 1) * V, NULL, &err) == EPYQ_OK);
    }
    epyq_seq_free(s);
    return out;
}

/* _i: bit 0 = A8, bit 1 = ref kernels (else this host's best) */
START_TEST(test_alone_vs_batch) {
    const epyq_kern_table *kt = _i & 2 ? epyq_kern_for_isa(EPYQ_ISA_REF) : epyq_kern();
    epyq_model *m = load_with(2, _i & 1 ? EPYQ_PATH_A8 : EPYQ_PATH_A16, kt);
    const int V = epyq_model_config(m)->vocab_size;
    float *alone = run_alone(m, EPYQ_KV_BF16);

    epyq_err err = {0};
    epyq_seq *s[5];
    for (int i = 0; i < 5; i++) ck_assert(epyq_seq_create(&s[i], m, 64, EPYQ_KV_BF16, &err) == EPYQ_OK);
    int a[12], o[4][20];
    prompt(a, 12, 1);
    for (int i = 0; i < 4; i++) prompt(o[i], 20, 10 + i);
    /* warm the others up to different positions first */
    for (int i = 0; i < 4; i++) {
        epyq_seq *ss[20];
        for (int t = 0; t < 3 + 2 * i; t++) ss[t] = s[1 + i];
        epyq_batch b = {3 + 2 * i, ss, o[i], NULL};
        ck_assert(epyq_model_forward(m, &b, NULL, NULL, &err) == EPYQ_OK);
    }
    /* batch 1: A's 9 prompt tokens interleaved with prefill chunks of the others */
    epyq_seq *bs[64];
    int bt[64], n = 0, ai = 0;
    uint8_t want[64] = {0};
    int a_row = -1;
    for (int k = 0; k < 9; k++) {
        bs[n] = s[0], bt[n] = a[ai++], want[n] = k == 8, n++;
        if (k % 2 == 0) {
            int j = k / 2 % 4;
            bs[n] = s[1 + j], bt[n] = o[j][10 + k], n++;
        }
    }
    for (int i = 0, w = 0; i < n; i++)
        if (want[i]) a_row = w++;
    float *got = malloc((size_t)4 * V * sizeof(float));
    epyq_batch b1 = {n, bs, bt, want};
    ck_assert_msg(epyq_model_forward(m, &b1, got, NULL, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(a_row, 0);
    /* batches 2..4: A's decode step among decode steps and a prefill chunk of the others */
    for (int d = 0; d < 3; d++) {
        n = 0;
        bs[n] = s[1 + d], bt[n] = 5, n++;
        bs[n] = s[4 - d], bt[n] = 6, n++;
        bs[n] = s[0], bt[n] = a[9 + d], n++;
        for (int k = 0; k < 5; k++) bs[n] = s[1 + (d + 1) % 4], bt[n] = 100 + k, n++;
        float *rows = malloc((size_t)n * V * sizeof(float));
        epyq_batch b = {n, bs, bt, NULL};
        ck_assert_msg(epyq_model_forward(m, &b, rows, NULL, &err) == EPYQ_OK, "%s", err.msg);
        memcpy(got + (size_t)(d + 1) * V, rows + (size_t)2 * V, (size_t)V * sizeof(float));
        free(rows);
    }
    ck_assert_int_eq(epyq_seq_pos(s[0]), 12);
    conform_stats st;
    conform_init(&st);
    conform_add(&st, alone, got, 4, V);
    int identical = memcmp(alone, got, (size_t)4 * V * sizeof(float)) == 0;
    printf("alone vs batched (%s, %s): %s; max|dlogit| %.3e KL max %.3e\n", kt->name,
           _i & 1 ? "a8" : "a16", identical ? "bit-identical" : "differ", st.max_abs, st.kl_max);
    /* The model keeps tokens independent (per-row work only, per-token expert sums in top-k
     * order) and every kernel sums a row in an order that does not depend on how many rows
     * share the call (tests/kern/test_w4.c test_rows_independent), so alone and batched are
     * bit-identical on every kernel table. */
    ck_assert_msg(identical, "%s: alone and batched differ: max |dlogit| %g, KL max %g", kt->name,
                  st.max_abs, st.kl_max);
    for (int i = 0; i < 5; i++) epyq_seq_free(s[i]);
    free(alone), free(got);
    epyq_model_free(m);
}
END_TEST

START_TEST(test_threads_identical) {
    epyq_model *m1 = load(1, EPYQ_PATH_A16), *m2 = load(2, EPYQ_PATH_A16);
    const int V = epyq_model_config(m1)->vocab_size;
    float *a = run_alone(m1, EPYQ_KV_BF16), *b = run_alone(m2, EPYQ_KV_BF16);
    ck_assert(memcmp(a, b, (size_t)4 * V * sizeof(float)) == 0);
    free(a), free(b);
    epyq_model_free(m1), epyq_model_free(m2);
}
END_TEST

/* All rows' logits [n][V] of one n-token prompt on a fresh sequence; *wall_s its forward. */
static float *run_prompt(epyq_model *m, int n, double *wall_s) {
    const int V = epyq_model_config(m)->vocab_size;
    epyq_err err = {0};
    epyq_seq *s = NULL;
    ck_assert(epyq_seq_create(&s, m, 64, EPYQ_KV_BF16, &err) == EPYQ_OK);
    int ids[64];
    epyq_seq *ss[64];
    prompt(ids, n, 3);
    for (int i = 0; i < n; i++) ss[i] = s;
    float *out = malloc((size_t)n * V * sizeof(float));
    epyq_batch b = {n, ss, ids, NULL};
    double t0 = epyq_now();
    ck_assert_msg(epyq_model_forward(m, &b, out, NULL, &err) == EPYQ_OK, "%s", err.msg);
    if (wall_s) *wall_s = epyq_now() - t0;
    epyq_seq_free(s);
    return out;
}

START_TEST(test_prompt_threads_profile) {
    enum { N = 40 };
    epyq_model *m1 = load(1, EPYQ_PATH_A8), *m2 = load(2, EPYQ_PATH_A8);
    const int V = epyq_model_config(m1)->vocab_size;
    float *a = run_prompt(m1, N, NULL), *b = run_prompt(m2, N, NULL);
    ck_assert_msg(memcmp(a, b, (size_t)N * V * sizeof(float)) == 0, "1 vs 2 threads differ");
    epyq_prof pf;
    ck_assert(!epyq_model_prof_read(m2, &pf)); /* off by default */
    ck_assert(epyq_model_prof_enable(m2, true));
    double wall = 0;
    float *c = run_prompt(m2, N, &wall);
    ck_assert_msg(memcmp(b, c, (size_t)N * V * sizeof(float)) == 0, "profiling changed the logits");
    ck_assert(epyq_model_prof_read(m2, &pf));
    ck_assert_int_eq((int)pf.forwards, 1);
    double sum = 0;
    for (int ph = 0; ph < EPYQ_PROF_N; ph++) sum += (double)pf.ns[ph] * 1e-9;
    const epyq_prof_phase must[] = {EPYQ_PROF_EMBED,   EPYQ_PROF_NORM,    EPYQ_PROF_ROUTER,
                                    EPYQ_PROF_EXPERTS, EPYQ_PROF_MOE_SUM, EPYQ_PROF_HEAD};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        ck_assert_msg(pf.ns[must[i]] > 0, "%s not counted", epyq_prof_phase_name(must[i]));
    ck_assert(pf.ns[EPYQ_PROF_GDN_CORE] + pf.ns[EPYQ_PROF_ATTN_CORE] > 0);
    ck_assert_msg(sum <= wall + 1e-6, "blocks %.6f s > forward %.6f s", sum, wall);
    ck_assert(pf.pool_runs > 0);
    printf("profile of a %d-token prompt, 2 threads: %.3f of %.3f ms in blocks, %llu pool runs\n",
           N, sum * 1e3, wall * 1e3, (unsigned long long)pf.pool_runs);
    /* paused (bench -d's context fill): a forward call leaves every counter as it was */
    epyq_model_prof_pause(m2, true);
    epyq_prof held;
    ck_assert(!epyq_model_prof_read(m2, &held));
    free(run_prompt(m2, N, NULL));
    epyq_model_prof_pause(m2, false);
    ck_assert(epyq_model_prof_read(m2, &held));
    ck_assert_int_eq((int)held.forwards, 1);
    ck_assert(memcmp(held.ns, pf.ns, sizeof pf.ns) == 0);
    ck_assert_uint_eq(held.pool_runs, pf.pool_runs);
    ck_assert_uint_eq(held.pool_wait_ns, pf.pool_wait_ns);
    ck_assert(epyq_model_prof_enable(m2, false));
    ck_assert(!epyq_model_prof_read(m2, &pf));
    free(a), free(b), free(c);
    epyq_model_free(m1), epyq_model_free(m2);
}
END_TEST

START_TEST(test_moe_split_identical) {
    epyq_model *m = load(2, EPYQ_PATH_A8);
    const int V = epyq_model_config(m)->vocab_size;
    float *on = run_alone(m, EPYQ_KV_BF16);
    epyq_model_set_moe_split(m, false);
    float *off = run_alone(m, EPYQ_KV_BF16);
    ck_assert(memcmp(on, off, (size_t)4 * V * sizeof(float)) == 0);
    free(on), free(off);
    epyq_model_free(m);
}
END_TEST

START_TEST(test_context_refusal) {
    epyq_model *m = load(1, EPYQ_PATH_A16);
    epyq_err err = {0};
    epyq_seq *s = NULL, *bad = NULL;
    const epyq_config *c = epyq_model_config(m);
    ck_assert(epyq_seq_create(&bad, m, 0, EPYQ_KV_BF16, &err) == EPYQ_E_ARG);
    ck_assert(c->max_position_embeddings < INT32_MAX);
    ck_assert(epyq_seq_create(&bad, m, (int32_t)c->max_position_embeddings + 1, EPYQ_KV_BF16, &err) ==
              EPYQ_E_ARG);
    ck_assert(epyq_seq_create(&s, m, 8, EPYQ_KV_BF16, &err) == EPYQ_OK);
    ck_assert(epyq_seq_bytes(s) > 0);
    int ids[9];
    prompt(ids, 9, 3);
    epyq_seq *ss[9];
    for (int i = 0; i < 9; i++) ss[i] = s;
    epyq_batch b = {9, ss, ids, NULL};
    ck_assert(epyq_model_forward(m, &b, NULL, NULL, &err) == EPYQ_E_CTX_FULL);
    ck_assert_msg(strstr(err.msg, "9") && strstr(err.msg, "8"), "message lacks the counts: %s", err.msg);
    ck_assert_int_eq(epyq_seq_pos(s), 0);
    b.n = 8;
    ck_assert(epyq_model_forward(m, &b, NULL, NULL, &err) == EPYQ_OK);
    ck_assert_int_eq(epyq_seq_pos(s), 8);
    b.n = 1;
    ck_assert(epyq_model_forward(m, &b, NULL, NULL, &err) == EPYQ_E_CTX_FULL);
    int bad_id = c->vocab_size;
    epyq_seq_reset(s);
    epyq_batch bb = {1, ss, &bad_id, NULL};
    ck_assert(epyq_model_forward(m, &bb, NULL, NULL, &err) == EPYQ_E_ARG);
    ck_assert_int_eq(epyq_seq_pos(s), 0);
    epyq_seq_free(s);
    epyq_model_free(m);
}
END_TEST

START_TEST(test_fp8_kv) {
    epyq_model *m = load(2, EPYQ_PATH_A16);
    const int V = epyq_model_config(m)->vocab_size;
    float *a = run_alone(m, EPYQ_KV_BF16), *b = run_alone(m, EPYQ_KV_FP8);
    conform_stats st;
    conform_init(&st);
    conform_add(&st, a, b, 4, V);
    conform_print("fp8 KV vs bf16 KV", &st);
    ck_assert(st.kl_mean < 1e-3 && st.kl_max < 1e-2 && st.top1_ok == st.top1_n);
    ck_assert(memcmp(a, b, (size_t)4 * V * sizeof(float)) != 0); /* fp8 really was used */
    free(a), free(b);
    epyq_model_free(m);
}
END_TEST

int main(void) {
    g_dir = synth_model("ct", 1);
    if (!g_dir) return EXIT_FAILURE;
    Suite *s = suite_create("model_batch");
    TCase *tc = epyq_test_case(s, "batch", 0);
    /* EPYQ_FAST (sanitizer runs): skip the slow ref-kernel variants */
    tcase_add_loop_test(tc, test_alone_vs_batch, 0, getenv("EPYQ_FAST") ? 2 : 4);
    EPYQ_TESTS_ADD(tc, test_threads_identical, test_prompt_threads_profile,
                   test_moe_split_identical, test_context_refusal, test_fp8_kv);
    int nf = epyq_test_failures(s, false);
    free(g_dir);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
