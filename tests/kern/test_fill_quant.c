/* tests/kern/test_fill_quant.c — the counter-based normal fill, min/max and int4 rounding
 * entries (kern.h fill_normal, minmax, quant_codes): the ref twin against a transcription of
 * kern.h's definitions written here with libm (rintf, nearbyint-based bf16 rounding), and
 * every table this host can run against the ref twin, bit for bit. Outputs are poisoned
 * (NaN / 0xEE) and a guard past n must stay untouched; sizes cover empty, short and ragged
 * tails, index ranges that cross a 2^32 boundary, and rounding ties. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels-x86/counter_rng.h"
#include "kernels-x86/kern.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint32_t rnd_u32(void) { return (uint32_t)(epyq_test_xorshift(&rng_state) >> 16); }

/* Uniform in [-1, 1). */
static float rnd_f(void) { return (float)((double)rnd_u32() / 2147483648.0 - 1.0); }

/* bf16 rounding (8 significant bits, half to even) computed without the library's bit trick. */
static float bf16_of(float v) {
    if (v == 0.0f || !isfinite(v)) return v;
    int e;
    frexp(v, &e); /* v = m 2^e, 0.5 <= |m| < 1: ldexp(v, 8 - e) has 8 integer bits */
    return (float)ldexp(nearbyint(ldexp(v, 8 - e)), e - 8);
}

static bool same_bits(float a, float b) { return !memcmp(&a, &b, sizeof a); }

/* ---- fill_normal ---------------------------------------------------------------------- */

/* kern.h's definition, step by step in fp32 (each step a separate statement: no FMA). */
static float normal_at(uint64_t key, float mean, float sigma, uint64_t i) {
    const uint32_t x = epyq_rng_bits(key, i);
    const int32_t bytes = (int32_t)(x & 0xFF) + (int32_t)((x >> 8) & 0xFF) + (int32_t)((x >> 16) & 0xFF) +
                          (int32_t)(x >> 24);
    const float unit = (float)(bytes - 510) * (1.0f / 147.80054f);
    const float dev = sigma * unit;
    return bf16_of(mean + dev);
}

START_TEST(test_fill_normal) {
    enum { N = 1200, GUARD = 4 };
    static float want[N], got[N + GUARD];
    static const uint64_t starts[] = {0, 5, 0xFFFFFFFAull, 0x1FFFFFF00ull + 3, 0xFFFFFFFFFFFFF000ull};
    static const size_t lens[] = {0, 1, 7, 8, 9, 31, 257, N};
    const epyq_kern_table *ref = epyq_kern_for_isa(EPYQ_ISA_REF);
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        for (size_t si = 0; si < sizeof starts / sizeof starts[0]; si++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                const uint64_t key = ((uint64_t)rnd_u32() << 32) | rnd_u32(), i0 = starts[si];
                const float mean = li % 2 ? 1.0f : 0.0f, sigma = 0.02f + (float)li;
                const size_t n = lens[li];
                ref->fill_normal(key, mean, sigma, i0, n, want);
                for (size_t o = 0; o < n + GUARD; o++) got[o] = NAN;
                t->fill_normal(key, mean, sigma, i0, n, got);
                for (size_t o = 0; o < n; o++) {
                    ck_assert_msg(same_bits(want[o], normal_at(key, mean, sigma, i0 + o)),
                                  "ref: i0 %llu elem %zu: %a, definition gives %a", (unsigned long long)i0,
                                  o, want[o], normal_at(key, mean, sigma, i0 + o));
                    ck_assert_msg(same_bits(got[o], want[o]), "%s: i0 %llu n %zu elem %zu: %a, ref %a",
                                  t->name, (unsigned long long)i0, n, o, got[o], want[o]);
                }
                for (size_t o = n; o < n + GUARD; o++) ck_assert_msg(isnan(got[o]), "%s wrote past n", t->name);
                if (n > 2) { /* a value depends on its index only: any split gives the same bits */
                    const size_t cut = n / 3;
                    for (size_t o = 0; o < n; o++) got[o] = NAN;
                    t->fill_normal(key, mean, sigma, i0 + cut, n - cut, got + cut);
                    t->fill_normal(key, mean, sigma, i0, cut, got);
                    ck_assert_msg(!memcmp(got, want, n * sizeof *got), "%s: split at %zu", t->name, cut);
                }
            }
    }
}
END_TEST

/* ---- minmax --------------------------------------------------------------------------- */

START_TEST(test_minmax) {
    enum { N = 300 };
    static float x[N];
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        for (size_t n = 1; n <= N; n += n < 20 ? 1 : 37) {
            const float span = (float)(n % 5) * 10.0f + 0.5f;
            for (size_t i = 0; i < n; i++) x[i] = rnd_f() * span + (n % 3 ? 0.0f : span);
            float lo = x[0], hi = x[0];
            for (size_t i = 1; i < n; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
            float mn = NAN, mx = NAN;
            t->minmax(x, n, &mn, &mx);
            ck_assert_msg(same_bits(mn, lo) && same_bits(mx, hi), "%s n %zu: [%a, %a], want [%a, %a]", t->name,
                          n, mn, mx, lo, hi);
        }
    }
}
END_TEST

/* ---- quant_codes ---------------------------------------------------------------------- */

/* kern.h's rules with libm rounding (rintf: half to even in the default mode). */
static uint8_t code_of(float x, float a, float z, epyq_q4_round rule) {
    float c;
    switch (rule) {
    case EPYQ_Q4_ROUND_DIV: c = fminf(fmaxf(rintf(x / a) + z, 0.0f), 15.0f); break;
    case EPYQ_Q4_ROUND_DIV_BF16: c = rintf(fminf(fmaxf(bf16_of(x / a), -8.0f), 7.0f)) + 8.0f; break;
    default: c = fminf(fmaxf(rintf(x * a), -8.0f), 7.0f) + 8.0f; break;
    }
    return (uint8_t)c;
}

START_TEST(test_quant_codes) {
    enum { N = 300, GUARD = 4 };
    static float x[N];
    static uint8_t want[N], got[N + GUARD];
    static const epyq_q4_round rules[] = {EPYQ_Q4_ROUND_DIV, EPYQ_Q4_ROUND_DIV_BF16, EPYQ_Q4_ROUND_MUL_SYM};
    static const char *const names[] = {"div", "div_bf16", "mul_sym"};
    const epyq_kern_table *ref = epyq_kern_for_isa(EPYQ_ISA_REF);
    int ties = 0, clamped = 0;
    for (size_t n = 1; n <= N; n += n < 40 ? 1 : 29)
        for (int r = 0; r < 3; r++) {
            const float s = 0.01f + (float)(rnd_u32() % 1000) / 100.0f, z = (float)(rnd_u32() % 16);
            const float a = rules[r] == EPYQ_Q4_ROUND_MUL_SYM ? 1.0f / s : s;
            for (size_t i = 0; i < n; i++) {
                /* t spread over [-12, 12) so the clamps bite; every fourth value an exact tie
                 * k + 1/2 (a power-of-two scale keeps x / a exact there) */
                x[i] = rnd_f() * 12.0f * s;
                if (i % 4 == 3) x[i] = ((float)(int)(rnd_u32() % 24) - 12.0f + 0.5f) * 0.25f;
            }
            const float a_tie = rules[r] == EPYQ_Q4_ROUND_MUL_SYM ? 4.0f : 0.25f;
            for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
                const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
                if (!t) continue;
                for (int pass = 0; pass < 2; pass++) { /* pass 1: the tie data with its exact factor */
                    const float af = pass ? a_tie : a;
                    if (l == 0)
                        for (size_t i = 0; i < n; i++) {
                            const float tt = rules[r] == EPYQ_Q4_ROUND_MUL_SYM ? x[i] * af : x[i] / af;
                            ties += pass && tt - floorf(tt) == 0.5f;
                            clamped += fabsf(tt) > 8.5f;
                        }
                    ref->quant_codes(x, n, af, z, rules[r], want);
                    for (size_t i = 0; i < n; i++)
                        ck_assert_msg(want[i] == code_of(x[i], af, z, rules[r]), "ref %s: x %a a %a z %g: %u, rule %u",
                                      names[r], x[i], af, z, want[i], code_of(x[i], af, z, rules[r]));
                    memset(got, 0xEE, sizeof got);
                    t->quant_codes(x, n, af, z, rules[r], got);
                    ck_assert_msg(!memcmp(got, want, n), "%s %s n %zu: codes differ from ref", t->name, names[r], n);
                    for (size_t i = n; i < n + GUARD; i++) ck_assert_msg(got[i] == 0xEE, "%s wrote past n", t->name);
                }
            }
        }
    ck_assert_int_gt(ties, 100); /* the data did exercise half-way cases and the clamps */
    ck_assert_int_gt(clamped, 100);
}
END_TEST

/* Every table this host runs has the three entries; levels without their own version serve
 * the level below's (avx512 and up: avx2's). */
START_TEST(test_tables) {
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        ck_assert_ptr_nonnull(t->fill_normal);
        ck_assert_ptr_nonnull(t->minmax);
        ck_assert_ptr_nonnull(t->quant_codes);
        if (l > EPYQ_ISA_AVX2) ck_assert(t->fill_normal == epyq_kern_for_isa(EPYQ_ISA_AVX2)->fill_normal);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("kern_fill_quant");
    TCase *tc = epyq_test_case(s, "kernels", 0);
    EPYQ_TESTS_ADD(tc, test_tables, test_fill_normal, test_minmax, test_quant_codes);
    return epyq_test_run(s);
}
