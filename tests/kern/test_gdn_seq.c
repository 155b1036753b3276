/* tests/kern/test_gdn_seq.c — gdn_seq (the Gated DeltaNet step over a run of tokens) of every
 * table this host can run, against n calls of the same table's gdn_step.
 *
 * The contract is bit equality with the table's own step (tests/kern/test_dense.c holds each
 * step to a double reference), so both the state and every output row are compared with
 * memcmp. Token rows come through a shuffled row map with gaps, q/k/v rows padded (ld larger
 * than a row) and output rows padded; rows no token maps to must stay NaN. A wrong fused
 * m (the next token's k, the state before instead of after the update), a strip copied back
 * short or an output written to the wrong row changes bits. Shapes: the model's 128 x 128,
 * ragged value widths (the SIMD tables' strips of 64 / 16 columns and their tails, widths
 * that fall back to the step), dk above the strip buffer, and n from 0 to past the model's
 * block of 128 tokens. The seed is fixed; a failure prints the case. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels-x86/kern.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

static uint64_t rng_state = 0x3c6ef372fe94f82bull;

static float rnd_f(void) {
    return (float)((double)(epyq_test_xorshift(&rng_state) >> 11) / 4503599627370496.0 - 1.0);
}

static int rnd_below(int n) { return (int)((epyq_test_xorshift(&rng_state) >> 16) % (uint64_t)n); }

static float *alloc_f(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* x scaled to unit L2 norm times post (the model normalises q and k before the step) */
static void unit(float *x, int n, float post) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    const float inv = (float)(post / sqrt(s + 1e-6));
    for (int i = 0; i < n; i++) x[i] *= inv;
}

static void seq_case(const epyq_kern_table *t, int dk, int dv, int n) {
    const int nrows = 2 * n + 3; /* rows no token maps to stay untouched */
    const size_t ld = (size_t)(2 * dk + dv + 5), ldo = (size_t)dv + 3;
    float *u = alloc_f((size_t)nrows * ld), *S = alloc_f((size_t)dk * dv),
          *S_ref = alloc_f((size_t)dk * dv), *o = alloc_f((size_t)nrows * ldo),
          *o_ref = alloc_f((size_t)nrows * ldo), *alpha = alloc_f((size_t)n),
          *beta = alloc_f((size_t)n);
    int32_t *rows = malloc((size_t)(n ? n : 1) * sizeof *rows);
    int *used = calloc((size_t)nrows, sizeof *used);
    ck_assert(rows && used);
    for (size_t e = 0; e < (size_t)nrows * ld; e++) u[e] = rnd_f();
    const float *k = u, *q = u + dk, *v = u + 2 * dk;
    for (int r = 0; r < nrows; r++) {
        unit(u + (size_t)r * ld, dk, 1.0f);                                 /* k */
        unit(u + (size_t)r * ld + dk, dk, (float)(1.0 / sqrt((double)dk))); /* q */
    }
    for (size_t e = 0; e < (size_t)dk * dv; e++) S[e] = S_ref[e] = rnd_f();
    for (size_t e = 0; e < (size_t)nrows * ldo; e++) o[e] = o_ref[e] = NAN;
    for (int tk = 0; tk < n; tk++) { /* distinct rows, in shuffled order */
        int r;
        do r = rnd_below(nrows);
        while (used[r]);
        used[r] = 1;
        rows[tk] = r;
        alpha[tk] = 0.3f + 0.7f * fabsf(rnd_f());
        beta[tk] = fabsf(rnd_f());
    }
    for (int tk = 0; tk < n; tk++) {
        const size_t r = (size_t)rows[tk];
        t->gdn_step(S_ref, k + r * ld, v + r * ld, q + r * ld, alpha[tk], beta[tk], dk, dv,
                    o_ref + r * ldo);
    }
    t->gdn_seq(S, k, v, q, ld, rows, n, alpha, beta, dk, dv, o, ldo);
    for (int i = 0; i < dk; i++)
        ck_assert_msg(memcmp(S + (size_t)i * dv, S_ref + (size_t)i * dv, (size_t)dv * sizeof *S) ==
                          0,
                      "%s gdn_seq dk=%d dv=%d n=%d: state row %d differs from %d gdn_step calls",
                      t->name, dk, dv, n, i, n);
    for (int r = 0; r < nrows; r++)
        for (size_t j = 0; j < ldo; j++) {
            const float got = o[(size_t)r * ldo + j], want = o_ref[(size_t)r * ldo + j];
            if (isnan(want))
                ck_assert_msg(isnan(got),
                              "%s gdn_seq dk=%d dv=%d n=%d: wrote o[%d][%zu], no token's", t->name,
                              dk, dv, n, r, j);
            else
                ck_assert_msg(memcmp(&got, &want, sizeof got) == 0,
                              "%s gdn_seq dk=%d dv=%d n=%d: o[%d][%zu] = %.9g, step gives %.9g",
                              t->name, dk, dv, n, r, j, got, want);
        }
    free(u), free(S), free(S_ref), free(o), free(o_ref), free(alpha), free(beta), free(rows);
    free(used);
}

START_TEST(test_seq_equals_steps) {
    static const int shapes[][2] = {{128, 128}, {16, 16},   {8, 24},  {33, 40},  {64, 144},
                                    {5, 7},     {128, 136}, {20, 80}, {300, 32}, {1, 16}};
    static const int ns[] = {0, 1, 2, 3, 17, 130};
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        ck_assert_ptr_nonnull(t->gdn_seq);
        for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++)
            for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
                seq_case(t, shapes[c][0], shapes[c][1], ns[i]);
        printf("%-12s gdn_seq: bit-equal to gdn_step over %zu shapes x %zu run lengths\n", t->name,
               sizeof shapes / sizeof *shapes, sizeof ns / sizeof *ns);
    }
}
END_TEST

/* The identity rows map (rows = NULL) reads token t from row t. */
START_TEST(test_seq_identity_rows) {
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        enum { DK = 32, DV = 48, N = 9 };
        const size_t ld = 2 * DK + DV + 1; /* q | k | v and a pad column */
        float u[N * (2 * DK + DV + 1)], S[DK * DV], S_ref[DK * DV], o[N * DV], o_ref[N * DV];
        float alpha[N], beta[N];
        for (size_t e = 0; e < sizeof u / sizeof *u; e++) u[e] = rnd_f() * 0.2f;
        for (int e = 0; e < DK * DV; e++) S[e] = S_ref[e] = rnd_f();
        for (int tk = 0; tk < N; tk++) alpha[tk] = 0.9f, beta[tk] = 0.5f;
        for (int tk = 0; tk < N; tk++)
            t->gdn_step(S_ref, u + DK + tk * ld, u + 2 * DK + tk * ld, u + tk * ld, alpha[tk],
                        beta[tk], DK, DV, o_ref + tk * DV);
        t->gdn_seq(S, u + DK, u + 2 * DK, u, ld, NULL, N, alpha, beta, DK, DV, o, DV);
        ck_assert_msg(memcmp(S, S_ref, sizeof S) == 0, "%s: state differs", t->name);
        ck_assert_msg(memcmp(o, o_ref, sizeof o) == 0, "%s: outputs differ", t->name);
    }
}
END_TEST

static Suite *gdn_seq_suite(void) {
    Suite *s = suite_create("kern_gdn_seq");
    TCase *tc = epyq_test_case(s, "gdn_seq", 120);
    EPYQ_TESTS_ADD(tc, test_seq_equals_steps, test_seq_identity_rows);
    return s;
}

int main(void) { return epyq_test_run(gdn_seq_suite()); }
