/* tests/unit/test_model_sample.c — the sampler: greedy, seeded determinism, the distribution a
 * draw follows (chi-square-free frequency bounds over 40000 draws), top-k / top-p / min-p
 * truncation, repetition and presence penalties, eos ids and generation_config defaults;
 * epyq_argmax against the one-pass definition on random rows with ties, NaNs, infinities
 * and signed zeros. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sample.h"
#include "tests/check_main.h"

static epyq_sampler *mk(float temp, int top_k, float top_p, float min_p, uint64_t seed) {
    epyq_sample_params p = {.temperature = temp, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                            .repetition_penalty = 1.0f, .seed = seed};
    epyq_sampler *s = NULL;
    epyq_err err = {0};
    ck_assert(epyq_sampler_create(&s, &p, 5, &err) == EPYQ_OK);
    return s;
}

/* probabilities 0.5, 0.3, 0.15, 0.05, 0 */
static const float L[5] = {-0.6931472f, -1.2039728f, -1.89712f, -2.9957323f, -40.0f};

static void freq(epyq_sampler *s, double *f) {
    memset(f, 0, 5 * sizeof(double));
    for (int i = 0; i < 40000; i++) f[epyq_sampler_sample(s, L)] += 1.0 / 40000;
}

START_TEST(test_greedy_and_seed) {
    epyq_sampler *g = mk(0.0f, 0, 1.0f, 0.0f, 1);
    ck_assert_int_eq(epyq_sampler_sample(g, L), 0);
    float tie[5] = {1, 3, 3, 0, 0};
    ck_assert_int_eq(epyq_sampler_sample(g, tie), 1); /* ties to the lower id */
    epyq_sampler *a = mk(1.0f, 0, 1.0f, 0.0f, 42), *b = mk(1.0f, 0, 1.0f, 0.0f, 42), *c = mk(1.0f, 0, 1.0f, 0.0f, 43);
    int same = 1, diff = 0;
    for (int i = 0; i < 200; i++) {
        int x = epyq_sampler_sample(a, L), y = epyq_sampler_sample(b, L), z = epyq_sampler_sample(c, L);
        same &= x == y;
        diff += x != z;
    }
    ck_assert(same && diff > 0);
    epyq_sampler_free(g), epyq_sampler_free(a), epyq_sampler_free(b), epyq_sampler_free(c);
}
END_TEST

/* The one-pass definition epyq_argmax must agree with. */
static int32_t argmax_naive(const float *v, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

START_TEST(test_argmax) {
    enum { N = 1031 };
    static float v[N];
    uint64_t st = 7;
    for (int c = 0; c < 3000; c++) {
        const int32_t n = 1 + (int32_t)(c % 67 == 0 ? N - 1 : (c * 37) % 64);
        for (int32_t i = 0; i < n; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            const uint32_t r = (uint32_t)(st >> 33);
            /* few distinct values, so ties are common; some NaNs, infinities and signed zeros */
            switch (r % 16) {
            case 0: v[i] = NAN; break;
            case 1: v[i] = -0.0f; break;
            case 2: v[i] = 0.0f; break;
            case 3: v[i] = (r >> 8) % 4 ? -INFINITY : INFINITY; break;
            default: v[i] = (float)((int)((r >> 8) % 9) - 4); break;
            }
        }
        ck_assert_msg(epyq_argmax(v, n) == argmax_naive(v, n), "case %d (n %d): %d, want %d", c, n,
                      epyq_argmax(v, n), argmax_naive(v, n));
    }
    const float nan0[3] = {NAN, 1.0f, 2.0f}, zeros[3] = {-0.0f, 0.0f, -1.0f};
    ck_assert_int_eq(epyq_argmax(nan0, 3), 0);
    ck_assert_int_eq(epyq_argmax(zeros, 3), 0);
    ck_assert_int_eq(epyq_argmax(zeros, 0), 0);
}
END_TEST

START_TEST(test_distributions) {
    double f[5];
    epyq_sampler *s = mk(1.0f, 0, 1.0f, 0.0f, 7);
    freq(s, f); /* 4 sigma of a binomial with n = 40000 is < 0.011 */
    ck_assert(fabs(f[0] - 0.5) < 0.011 && fabs(f[1] - 0.3) < 0.011 && fabs(f[2] - 0.15) < 0.011);
    ck_assert(f[4] == 0.0);
    epyq_sampler_free(s);
    s = mk(1.0f, 2, 1.0f, 0.0f, 7); /* top-2: 0.625 / 0.375 */
    freq(s, f);
    ck_assert(fabs(f[0] - 0.625) < 0.011 && f[2] == 0.0 && f[3] == 0.0);
    epyq_sampler_free(s);
    s = mk(1.0f, 0, 0.85f, 0.0f, 7); /* top-p 0.85 keeps 0.5, 0.3, 0.15 (cumulative 0.95) */
    freq(s, f);
    ck_assert(f[2] > 0.1 && f[3] == 0.0);
    epyq_sampler_free(s);
    s = mk(1.0f, 0, 0.75f, 0.0f, 7); /* cumulative 0.75 reached with two tokens */
    freq(s, f);
    ck_assert(f[2] == 0.0 && fabs(f[0] - 0.625) < 0.011);
    epyq_sampler_free(s);
    s = mk(1.0f, 0, 1.0f, 0.35f, 7); /* min-p 0.35 * 0.5 = 0.175: keeps 0.5 and 0.3 */
    freq(s, f);
    ck_assert(f[2] == 0.0 && f[1] > 0.3);
    epyq_sampler_free(s);
    s = mk(0.5f, 0, 1.0f, 0.0f, 7); /* temperature 0.5 squares the odds: 0.25/0.09/... */
    freq(s, f);
    double z = 0.25 + 0.09 + 0.0225 + 0.0025;
    ck_assert(fabs(f[0] - 0.25 / z) < 0.011 && fabs(f[1] - 0.09 / z) < 0.011);
    epyq_sampler_free(s);
}
END_TEST

START_TEST(test_penalties) {
    epyq_sample_params p = {.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 2.0f};
    epyq_sampler *s = NULL;
    epyq_err err = {0};
    float l[5] = {2.0f, 1.5f, -1.0f, -1.2f, 0.0f};
    ck_assert(epyq_sampler_create(&s, &p, 5, &err) == EPYQ_OK);
    epyq_sampler_accept(s, 0, false); /* prompt token: 2.0 / 2 = 1.0 < 1.5 */
    ck_assert_int_eq(epyq_sampler_sample(s, l), 1);
    epyq_sampler_free(s);
    p.repetition_penalty = 1.0f, p.presence_penalty = 1.0f;
    ck_assert(epyq_sampler_create(&s, &p, 5, &err) == EPYQ_OK);
    epyq_sampler_accept(s, 0, false); /* presence counts generated tokens only */
    ck_assert_int_eq(epyq_sampler_sample(s, l), 0);
    epyq_sampler_accept(s, 0, true); /* 2.0 - 1.0 < 1.5 */
    ck_assert_int_eq(epyq_sampler_sample(s, l), 1);
    ck_assert(l[0] == 2.0f); /* logits untouched */
    epyq_sampler_free(s);
    /* frequency: 0.3 per earlier generation; prompt tokens do not count */
    p.presence_penalty = 0.0f, p.frequency_penalty = 0.3f;
    ck_assert(epyq_sampler_create(&s, &p, 5, &err) == EPYQ_OK);
    epyq_sampler_accept(s, 0, false);
    ck_assert_int_eq(epyq_sampler_sample(s, l), 0);
    epyq_sampler_accept(s, 0, true); /* 2.0 - 0.3 = 1.7 > 1.5 */
    ck_assert_int_eq(epyq_sampler_sample(s, l), 0);
    epyq_sampler_accept(s, 0, true); /* 2.0 - 0.6 = 1.4 < 1.5 */
    ck_assert_int_eq(epyq_sampler_sample(s, l), 1);
    epyq_sampler_free(s);
    p.frequency_penalty = 0.0f;
    p.top_k = -1;
    ck_assert(epyq_sampler_create(&s, &p, 5, &err) == EPYQ_E_ARG);
}
END_TEST

START_TEST(test_defaults_and_eos) {
    epyq_config c;
    memset(&c, 0, sizeof c);
    c.do_sample = true, c.temperature = 0.6f, c.top_k = 20, c.top_p = 0.95f, c.repetition_penalty = 1.0f;
    c.eos_ids[0] = 1002, c.eos_ids[1] = 1000, c.n_eos = 2;
    epyq_sample_params p;
    epyq_sample_defaults(&p, &c);
    ck_assert(p.temperature == 0.6f && p.top_k == 20 && p.top_p == 0.95f);
    c.do_sample = false;
    epyq_sample_defaults(&p, &c);
    ck_assert(p.temperature == 0.0f);
    ck_assert(epyq_is_eos(&c, 1000) && epyq_is_eos(&c, 1002) && !epyq_is_eos(&c, 1001));
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_sample");
    TCase *tc = epyq_test_case(s, "sample", 0);
    EPYQ_TESTS_ADD(tc, test_greedy_and_seed, test_argmax, test_distributions, test_penalties,
                   test_defaults_and_eos);
    return epyq_test_run(s);
}
