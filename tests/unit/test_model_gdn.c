/* tests/unit/test_model_gdn.c — the two forms of the Gated DeltaNet delta rule, and prefill vs
 * token-by-token decode of the whole model (synthetic tiny checkpoint, no ../shared needed).
 *   - epyq_gdn_chunk_head (chunk 64, fp32, with every host-runnable kernel table) and the
 *     gdn_step kernel (recurrent, fp32) against a
 *     double-precision recurrence on random inputs over 150 tokens (two full chunks and a tail)
 *     with a non-zero initial state: outputs and final state within 2e-5 · max|value|;
 *   - whole model (BF16 weights, fp32 activations), one 40-token prefill with the chunked form
 *     vs with the recurrent form, and vs 40 single-token decode steps: max |dlogit| below
 *     1e-4 max|logit| and identical argmax on every row;
 *   - EPYQ_GDN_CHUNK: the default, an override, an explicit option winning, malformed values
 *     refused. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"
#include "tests/check_main.h"
#include "tests/e2e/conform.h"
#include "tests/e2e/synth_model.h"

#define DK 64
#define DV 48
#define NT 150

static uint64_t rng = 12345;
static double urand(void) { /* xorshift64*, uniform [0, 1) */
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 2685821657736338717ull) >> 11) * 0x1p-53;
}

static double maxabs(const float *v, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
    return m;
}

START_TEST(test_chunk_vs_recurrent) {
    static float q[NT][DK], k[NT][DK], v[NT][DV], g[NT], beta[NT], o_chunk[NT][DV], o_step[NT][DV];
    static float S0[DK * DV], S_chunk[DK * DV], S_step[DK * DV];
    static double S_ref[DK * DV], o_ref[NT][DV];
    for (int t = 0; t < NT; t++) {
        double nq = 0, nk = 0;
        for (int i = 0; i < DK; i++) {
            q[t][i] = (float)(urand() - 0.5), k[t][i] = (float)(urand() - 0.5);
            nq += q[t][i] * q[t][i], nk += k[t][i] * k[t][i];
        }
        for (int i = 0; i < DK; i++) q[t][i] /= (float)(sqrt(nq) * 8.0), k[t][i] /= (float)sqrt(nk);
        for (int j = 0; j < DV; j++) v[t][j] = (float)(2 * urand() - 1);
        g[t] = (float)(-3.0 * urand() * urand()); /* decays from 0.05 to 1 */
        beta[t] = (float)urand();
    }
    for (int i = 0; i < DK * DV; i++) S0[i] = (float)(urand() - 0.5), S_ref[i] = S0[i];
    memcpy(S_chunk, S0, sizeof S0);
    memcpy(S_step, S0, sizeof S0);

    /* double recurrence: decay, delta update, read with the updated state */
    for (int t = 0; t < NT; t++) {
        double a = exp((double)g[t]);
        for (int i = 0; i < DK * DV; i++) S_ref[i] *= a;
        for (int j = 0; j < DV; j++) {
            double mj = 0;
            for (int i = 0; i < DK; i++) mj += S_ref[i * DV + j] * k[t][i];
            double d = beta[t] * (v[t][j] - mj);
            for (int i = 0; i < DK; i++) S_ref[i * DV + j] += k[t][i] * d;
        }
        for (int j = 0; j < DV; j++) {
            double s = 0;
            for (int i = 0; i < DK; i++) s += S_ref[i * DV + j] * q[t][i];
            o_ref[t][j] = s;
        }
    }
    const epyq_kern_table *kt = epyq_kern();
    for (int t = 0; t < NT; t++) kt->gdn_step(S_step, k[t], v[t], q[t], expf(g[t]), beta[t], DK, DV, o_step[t]);
    double om = maxabs(&o_step[0][0], (size_t)NT * DV), sm = maxabs(S_step, DK * DV);
    double eo_s = 0, es_s = 0;
    for (int t = 0; t < NT; t++)
        for (int j = 0; j < DV; j++) eo_s = fmax(eo_s, fabs(o_step[t][j] - o_ref[t][j]));
    for (int i = 0; i < DK * DV; i++) es_s = fmax(es_s, fabs(S_step[i] - S_ref[i]));
    printf("recurrent (%s): out %.2e state %.2e (max |o| %.2f |S| %.2f)\n", kt->name, eo_s, es_s,
           om, sm);
    ck_assert(eo_s < 2e-5 * om && es_s < 2e-5 * sm);
    /* the chunked form with every kernel table this host runs (its products are f32_gemm) */
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        memcpy(S_chunk, S0, sizeof S0);
        epyq_err err = {0};
        ck_assert(epyq_gdn_chunk_head(t, S_chunk, &q[0][0], &k[0][0], &v[0][0], g, beta, NT, DK, DV,
                                      DK, DV, &o_chunk[0][0], DV, &err) == EPYQ_OK);
        double eo_c = 0, es_c = 0;
        for (int tk = 0; tk < NT; tk++)
            for (int j = 0; j < DV; j++) eo_c = fmax(eo_c, fabs(o_chunk[tk][j] - o_ref[tk][j]));
        for (int i = 0; i < DK * DV; i++) es_c = fmax(es_c, fabs(S_chunk[i] - S_ref[i]));
        printf("chunked (%s): out %.2e state %.2e\n", t->name, eo_c, es_c);
        ck_assert(eo_c < 2e-5 * om && es_c < 2e-5 * sm);
    }
}
END_TEST

/* prefill of n tokens in one batch (chunk_min decides the DeltaNet form) or one per call */
static float *run(epyq_model *m, const int *ids, int n, int chunk_min, bool one_by_one) {
    const int V = epyq_model_config(m)->vocab_size;
    epyq_model_set_gdn_chunk_min(m, chunk_min);
    epyq_err err = {0};
    epyq_seq *s = NULL;
    ck_assert(epyq_seq_create(&s, m, n, EPYQ_KV_BF16, &err) == EPYQ_OK);
    epyq_seq *ss[64];
    for (int i = 0; i < n; i++) ss[i] = s;
    float *out = malloc((size_t)n * V * sizeof(float));
    if (one_by_one) {
        for (int t = 0; t < n; t++) {
            epyq_batch b = {1, ss, &ids[t], NULL};
            ck_assert(epyq_model_forward(m, &b, out + (size_t)t * V, NULL, &err) == EPYQ_OK);
        }
    } else {
        epyq_batch b = {n, ss, ids, NULL};
        ck_assert_msg(epyq_model_forward(m, &b, out, NULL, &err) == EPYQ_OK, "%s", err.msg);
    }
    epyq_seq_free(s);
    return out;
}

static void expect_close(const char *what, const float *a, const float *b, int rows, int V) {
    conform_stats st;
    conform_init(&st);
    conform_add(&st, a, b, rows, V);
    conform_print(what, &st);
    ck_assert_msg(st.max_abs < 1e-4 * st.max_logit, "%s: max |dlogit| %g", what, st.max_abs);
    for (int r = 0; r < rows; r++)
        ck_assert_int_eq(conform_argmax_f(a + (size_t)r * V, V), conform_argmax_f(b + (size_t)r * V, V));
}

START_TEST(test_prefill_forms) {
    /* BF16 weights with fp32 activations: the whole pass is fp32 math, so the forms must agree
     * far below the bf16 noise floor that would otherwise hide a real difference */
    char *dir = synth_model("bf16", 7);
    ck_assert(dir != NULL);
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts o = {.n_threads = 2, .f32_act = true};
    ck_assert_msg(epyq_model_load(&m, dir, &o, &err) == EPYQ_OK, "%s", err.msg);
    const int V = epyq_model_config(m)->vocab_size, n = 40;
    int ids[40];
    for (int i = 0; i < n; i++) ids[i] = (i * 379 + 11) % 991;
    float *chunked = run(m, ids, n, 1, false), *recur = run(m, ids, n, -1, false);
    float *decode = run(m, ids, n, 1, true);
    expect_close("prefill chunked vs recurrent", recur, chunked, n, V);
    expect_close("prefill vs token-by-token decode", decode, chunked, n, V);
    free(chunked), free(recur), free(decode), free(dir);
    epyq_model_free(m);
}
END_TEST

/* gdn_chunk_min = 0 takes the default or EPYQ_GDN_CHUNK; a malformed value fails the load
 * with a message naming the variable, never a silent fallback. */
START_TEST(test_chunk_env) {
    char *dir = synth_model("bf16", 7);
    ck_assert(dir != NULL);
    static const struct {
        const char *env;
        int32_t want; /* INT32_MIN: the load must fail */
    } cases[] = {
        {NULL, EPYQ_GDN_CHUNK_DEFAULT}, {"96", 96}, {"0", -1}, {"-5", -1}, {"12x", INT32_MIN},
        {"99999999999", INT32_MIN}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (cases[i].env) setenv("EPYQ_GDN_CHUNK", cases[i].env, 1);
        else
            unsetenv("EPYQ_GDN_CHUNK");
        epyq_err err = {0};
        epyq_model *m = NULL;
        epyq_model_opts o = {.n_threads = 1};
        const epyq_status st = epyq_model_load(&m, dir, &o, &err);
        if (cases[i].want == INT32_MIN) {
            ck_assert_msg(st != EPYQ_OK && strstr(err.msg, "EPYQ_GDN_CHUNK") &&
                              strstr(err.msg, cases[i].env),
                          "EPYQ_GDN_CHUNK=%s: status %d, '%s'", cases[i].env, (int)st, err.msg);
            ck_assert_ptr_null(m);
        } else {
            ck_assert_msg(st == EPYQ_OK, "%s", err.msg);
            ck_assert_int_eq(m->gdn_chunk_min, cases[i].want);
            epyq_model_free(m);
        }
        /* an explicit value wins over the environment */
        o.gdn_chunk_min = 7;
        ck_assert(epyq_model_load(&m, dir, &o, &err) == EPYQ_OK);
        ck_assert_int_eq(m->gdn_chunk_min, 7);
        epyq_model_free(m);
    }
    unsetenv("EPYQ_GDN_CHUNK");
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_gdn");
    TCase *tc = epyq_test_case(s, "gdn", 0);
    EPYQ_TESTS_ADD(tc, test_chunk_vs_recurrent, test_prefill_forms, test_chunk_env);
    return epyq_test_run(s);
}
