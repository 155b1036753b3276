/* tests/kern/test_w4.c — the int4 kernels of every table the host can run, against the
 * plain-C twin and a double-precision reference.
 *
 * What is asserted:
 *  - pack/unpack is integer-exact (codes, scales, zero points), the packed words follow the
 *    documented nibble order, and bad shapes/codes are refused with a message;
 *  - activation preparation: int8 / int16 codes within half a step, exact group sums;
 *  - w4_gemm on ragged n, k = a multiple of gs (32/64/128), m in 1..64, sym and asym, both
 *    paths: outputs are NaN-poisoned first, every element is checked, columns outside the
 *    slice stay untouched;
 *      both paths bit-identical to the ref twin (exact integer dots, same fp32 epilogue), and
 *            |y - y_double| <= sum_i |w_i| (1/2 + 1e-4) d_g(i) + (G + 3) 2^-24 C
 *      (the rounding of x is at most half a step d_g = amax_g / Q, Q = 127 for A8 and 32767
 *      for A16; C = sum_i |w_i| Q d_g(i) bounds the fp32 epilogue's magnitude);
 *  - computing rows [0, n) as one slice or as two slices gives identical bits (what a
 *    1-thread and a 2-thread run do);
 *  - w4_expert (fused gate/up/SiLU/down with routing weight) over a whole intermediate range
 *    and over two slices matches the double reference and the ref twin, and its two phases
 *    (w4_expert_gu, w4_expert_down) run in pieces give its exact bits, and so does one
 *    intermediate slice held on its own (gate/up row views, epyq_w4_cols' copy of down).
 * The measured worst errors, normalised by sum_i |w_i x_i|, are printed per path. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/kern.h"
#include "kernels-x86/w4_layout.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

static int fast_mode(void) {
    const char *f = getenv("EPYQ_FAST");
    return f && *f && strcmp(f, "0") != 0;
}

/* ---- deterministic random data ---------------------------------------------------------- */

static uint64_t rng_state;
static uint32_t rnd(void) { return (uint32_t)(epyq_test_xorshift(&rng_state) >> 32); }
static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

typedef struct {
    epyq_q4_canon c;
    uint8_t *q, *z; /* [n][k], [n][G] */
    float *s;       /* [n][G] */
    epyq_w4 w;
    void *mem;
} mat;

/* Random codes; bf16-exact scales of varied magnitude; asym zero points 0..16. */
static void mat_make(mat *a, int32_t n, int32_t k, int32_t gs, int asym) {
    const int32_t G = k / gs;
    memset(a, 0, sizeof *a);
    a->q = malloc((size_t)n * (size_t)k);
    a->s = malloc((size_t)n * (size_t)G * sizeof(float));
    a->z = asym ? malloc((size_t)n * (size_t)G) : NULL;
    ck_assert(a->q && a->s && (!asym || a->z));
    for (size_t i = 0; i < (size_t)n * (size_t)k; i++) a->q[i] = (uint8_t)(rnd() & 15);
    for (size_t i = 0; i < (size_t)n * (size_t)G; i++) {
        const float s = (0.25f + (float)(rnd() % 1000) / 250.0f) * ldexpf(1.0f, -(int)(rnd() % 8));
        a->s[i] = epyq_bf16_to_f32(epyq_f32_to_bf16(s));
        if (asym) a->z[i] = (uint8_t)(rnd() % 17);
    }
    a->c = (epyq_q4_canon){.n = n, .k = k, .gs = gs, .q = a->q, .s = a->s, .z = a->z};
    const size_t bytes = epyq_w4_pack_bytes(n, k, gs, asym);
    ck_assert_uint_gt(bytes, 0);
    a->mem = aligned_alloc(64, w4_align64(bytes));
    ck_assert_ptr_nonnull(a->mem);
    epyq_err err = {0};
    ck_assert_msg(epyq_w4_pack(&a->w, a->mem, &a->c, &err) == EPYQ_OK, "pack: %s", err.msg);
}

static void mat_free(mat *a) {
    free(a->q);
    free(a->s);
    free(a->z);
    free(a->mem);
}

static double wq(const mat *a, int32_t j, int32_t i) {
    const int32_t G = a->c.k / a->c.gs, g = i / a->c.gs;
    const int z = a->z ? a->z[(size_t)j * (size_t)G + (size_t)g] : 8;
    return ((double)a->q[(size_t)j * (size_t)a->c.k + (size_t)i] - z) *
           (double)a->s[(size_t)j * (size_t)G + (size_t)g];
}

/* Activations with a few outliers (what makes per-group int8 scales matter). */
static float *act_make(int32_t m, int32_t k, int outliers) {
    float *x = malloc((size_t)m * (size_t)k * sizeof(float));
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < (size_t)m * (size_t)k; i++)
        x[i] = rndf() * (outliers && rnd() % 64 == 0 ? 20.0f : 1.0f);
    return x;
}

static float *nan_buf(size_t n) {
    float *y = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(y);
    for (size_t i = 0; i < n; i++) y[i] = NAN;
    return y;
}

static void *act_buf(const epyq_kern_table *kt, epyq_act *a, const float *x, int32_t m,
                     int32_t k, int32_t gs, epyq_numpath path) {
    const size_t bytes = epyq_act_bytes(m, k, gs, path);
    ck_assert_uint_gt(bytes, 0);
    void *buf = aligned_alloc(64, w4_align64(bytes));
    ck_assert_ptr_nonnull(buf);
    kt->act_prep(a, x, m, k, gs, path, buf);
    return buf;
}

/* ---- pack / unpack -------------------------------------------------------------------- */

START_TEST(test_pack_roundtrip) {
    static const int32_t shapes[][3] = {{1, 32, 32},   {7, 64, 32},    {16, 128, 64},
                                        {17, 256, 128}, {33, 384, 128}, {100, 192, 64}};
    rng_state = 0x1234567u;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int asym = 0; asym < 2; asym++) {
            const int32_t n = shapes[si][0], k = shapes[si][1], gs = shapes[si][2], G = k / gs;
            mat a;
            mat_make(&a, n, k, gs, asym);
            ck_assert_int_eq(a.w.asym, asym);
            ck_assert_uint_eq(a.w.bytes, epyq_w4_pack_bytes(n, k, gs, asym));
            uint8_t *q = malloc((size_t)n * (size_t)k), *z = malloc((size_t)n * (size_t)G);
            float *s = malloc((size_t)n * (size_t)G * sizeof(float));
            ck_assert(q && z && s);
            epyq_w4_unpack(&a.w, q, s, z);
            ck_assert_mem_eq(q, a.q, (size_t)n * (size_t)k);
            ck_assert_mem_eq(s, a.s, (size_t)n * (size_t)G * sizeof(float));
            for (size_t i = 0; i < (size_t)n * (size_t)G; i++)
                ck_assert_uint_eq(z[i], asym ? a.z[i] : 8);
            free(q);
            free(z);
            free(s);
            mat_free(&a);
        }
}
END_TEST

/* The worked example of docs/quant-formats.md §3: U[n][k] = (n + k) mod 16. Row 0's first word
 * must be the GPTQ sequential word 0x76543210, row 7's 0xEDCBA987; a zero-point array of
 * all 8 is recognised as symmetric. */
START_TEST(test_pack_pinned_words) {
    uint8_t q[16 * 32], z[16];
    float s[16];
    for (int n = 0; n < 16; n++) {
        for (int k = 0; k < 32; k++) q[n * 32 + k] = (uint8_t)((n + k) % 16);
        s[n] = 1.0f;
        z[n] = 8;
    }
    const epyq_q4_canon c = {.n = 16, .k = 32, .gs = 32, .q = q, .s = s, .z = z};
    void *mem = aligned_alloc(64, w4_align64(epyq_w4_pack_bytes(16, 32, 32, 0)));
    epyq_w4 w;
    ck_assert_int_eq(epyq_w4_pack(&w, mem, &c, NULL), EPYQ_OK);
    ck_assert_int_eq(w.asym, 0);
    uint32_t w0, w7;
    memcpy(&w0, (const uint8_t *)mem + 0 * 4, 4);
    memcpy(&w7, (const uint8_t *)mem + 7 * 4, 4);
    ck_assert_uint_eq(w0, 0x76543210u);
    ck_assert_uint_eq(w7, 0xEDCBA987u);
    free(mem);
}
END_TEST

START_TEST(test_pack_refuses) {
    uint8_t q[4 * 64] = {0};
    float s[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    void *mem = aligned_alloc(64, 64 * 1024);
    epyq_w4 w;
    epyq_err err = {0};
    epyq_q4_canon c = {.n = 4, .k = 64, .gs = 16, .q = q, .s = s, .z = NULL};
    ck_assert_int_eq(epyq_w4_pack(&w, mem, &c, &err), EPYQ_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "group 16"));
    c.gs = 128; /* k = 64 is not a multiple of 128 */
    ck_assert_int_eq(epyq_w4_pack(&w, mem, &c, &err), EPYQ_E_UNSUPPORTED);
    ck_assert_uint_eq(epyq_w4_pack_bytes(4, 64, 128, 0), 0);
    c.gs = 32;
    q[70] = 16;
    ck_assert_int_eq(epyq_w4_pack(&w, mem, &c, &err), EPYQ_E_QUANT);
    ck_assert_ptr_nonnull(strstr(err.msg, "[1][6]"));
    free(mem);
}
END_TEST

/* ---- activation preparation ------------------------------------------------------------ */

/* Both paths: every code is the nearest integer to x / d (|error| <= 1/2 step plus fp32
 * rounding), |code| <= Q with the group's extreme at +-Q (Q = 127 for A8, 32767 for A16),
 * read at the documented permuted position, and the group sum is exact. */
START_TEST(test_act_prep) {
    const epyq_kern_table *kt = epyq_kern_for_isa(EPYQ_ISA_REF);
    const int32_t m = 3, k = 256, gs = 64, G = k / gs;
    rng_state = 0xabcdefu;
    float *x = act_make(m, k, 1);
    for (int32_t i = 0; i < gs; i++) x[i] = 0.0f; /* an all-zero group: d = 0, x8 = 0 */
    for (int p = 0; p < 2; p++) {
        const epyq_numpath path = p ? EPYQ_PATH_A8 : EPYQ_PATH_A16;
        const int Q = p ? 127 : 32767;
        epyq_act a;
        void *buf = act_buf(kt, &a, x, m, k, gs, path);
        const w4_a8_view v8 = w4_a8_of(&a);
        const w4_a16_view v16 = w4_a16_of(&a);
        const float *dv = p ? v8.d : v16.d;
        const int32_t *sums = p ? v8.sum8 : v16.sum16;
        for (int32_t t = 0; t < m; t++)
            for (int32_t g = 0; g < G; g++) {
                const float d = dv[t * G + g];
                int32_t sum = 0, top = 0;
                for (int32_t i = g * gs; i < (g + 1) * gs; i++) {
                    const size_t at = (size_t)t * (size_t)k + (size_t)(i & ~7);
                    const int q = p ? v8.x8[at + (size_t)w4_a8_pos(i & 7)]
                                    : v16.x16[at + (size_t)w4_a16_pos(i & 7)];
                    const float xi = x[(size_t)t * (size_t)k + (size_t)i];
                    ck_assert_int_le(abs(q), Q);
                    if (abs(q) > top) top = abs(q);
                    sum += q;
                    if (d > 0) ck_assert_msg(fabs(xi / d - q) <= 0.5 + 1e-4 * Q / 127.0,
                                             "path %d: x %.9g / d %.9g vs code %d", p, xi, d, q);
                    else ck_assert_int_eq(q, 0);
                }
                ck_assert_int_eq(sum, sums[t * G + g]);
                ck_assert_int_eq(top, d > 0 ? Q : 0);
            }
        free(buf);
    }
    free(x);
    ck_assert_uint_eq(epyq_act_bytes(1, 100, 32, EPYQ_PATH_A16), 0); /* k not a multiple of 32 */
    ck_assert_uint_eq(epyq_act_bytes(1, 96, 64, EPYQ_PATH_A16), 0);  /* k not a multiple of gs */
    ck_assert_uint_eq(epyq_act_bytes(1, 96, 64, EPYQ_PATH_A8), 0);   /* k not a multiple of gs */
    ck_assert_uint_eq(epyq_act_bytes(0, 128, 128, EPYQ_PATH_A8), 0);
}
END_TEST

/* Every table's act_prep writes the ref preparation's bytes (codes, steps, sums), for both
 * paths, every group size, with outliers and an all-zero group. */
START_TEST(test_act_prep_tables) {
    const epyq_kern_table *ref = epyq_kern_for_isa(EPYQ_ISA_REF);
    const int32_t m = 5, k = 384;
    rng_state = 0x5eed1234u;
    float *x = act_make(m, k, 1);
    for (int32_t i = 64; i < 96; i++) x[k + i] = 0.0f; /* row 1: a zero group at gs 32 */
    for (int32_t gs = 32; gs <= 128; gs *= 2)
        for (int p = 0; p < 2; p++) {
            const epyq_numpath path = p ? EPYQ_PATH_A8 : EPYQ_PATH_A16;
            const size_t code_bytes = (size_t)m * (size_t)k * (p ? 1u : 2u);
            const size_t meta = (size_t)m * (size_t)(k / gs) * 4u;
            const size_t off_d = p ? w4_a8_off_d(m, k) : w4_a16_off_d(m, k);
            const size_t off_s = p ? w4_a8_off_sum(m, k, gs) : w4_a16_off_sum(m, k, gs);
            epyq_act ar;
            uint8_t *br = act_buf(ref, &ar, x, m, k, gs, path);
            for (int isa = 1; isa < EPYQ_ISA_COUNT; isa++) {
                const epyq_kern_table *kt = epyq_kern_for_isa((epyq_isa)isa);
                if (!kt) continue;
                epyq_act a;
                uint8_t *b = act_buf(kt, &a, x, m, k, gs, path);
                ck_assert_msg(memcmp(b, br, code_bytes) == 0 && memcmp(b + off_d, br + off_d, meta) == 0 &&
                                  memcmp(b + off_s, br + off_s, meta) == 0,
                              "%s act_prep %s gs %d differs from ref", kt->name, p ? "A8" : "A16", (int)gs);
                ck_assert(a.m == m && a.k == k && a.gs == gs && a.path == path && a.f32 == x);
                free(b);
            }
            free(br);
        }
    free(x);
}
END_TEST

/* ---- GEMM ------------------------------------------------------------------------------ */

typedef struct {
    double max_rel[2]; /* worst |y - y_double| / sum |w x|, per path */
} err_stats;
static err_stats stats;

/* Double reference and the error scales of one output element. */
typedef struct {
    double y;     /* sum_i w_i x_i, unrounded x */
    double absw;  /* sum_i |w_i x_i| */
    double q[2];  /* sum_i |w_i| d_g(i) with the A16 (int16) / A8 (int8) step */
    double c[2];  /* sum_i |w_i| Q d_g(i) (Q = 32767 / 127) */
} refval;

static refval ref_elem(const mat *a, const float *xt, int32_t j) {
    const int32_t k = a->c.k, gs = a->c.gs, G = k / gs;
    refval r = {0};
    for (int32_t g = 0; g < G; g++) {
        double amax = 0;
        for (int32_t i = g * gs; i < (g + 1) * gs; i++) amax = fmax(amax, fabs(xt[i]));
        const double d[2] = {(double)((float)amax / 32767.0f), (double)((float)amax / 127.0f)};
        for (int32_t i = g * gs; i < (g + 1) * gs; i++) {
            const double w = wq(a, j, i);
            r.y += w * xt[i];
            r.absw += fabs(w * xt[i]);
            for (int p = 0; p < 2; p++) {
                r.q[p] += fabs(w) * d[p];
                r.c[p] += fabs(w) * (p ? 127.0 : 32767.0) * d[p];
            }
        }
    }
    return r;
}

static void check_gemm_shape(int32_t n, int32_t k, int32_t gs, int32_t m, int asym) {
    const epyq_kern_table *ref = epyq_kern_for_isa(EPYQ_ISA_REF);
    mat a;
    mat_make(&a, n, k, gs, asym);
    float *x = act_make(m, k, 1);
    const int32_t ldy = n + 5, G = k / gs;
    refval *rv = malloc((size_t)m * (size_t)n * sizeof *rv);
    ck_assert_ptr_nonnull(rv);
    for (int32_t t = 0; t < m; t++)
        for (int32_t j = 0; j < n; j++)
            rv[(size_t)t * (size_t)n + (size_t)j] = ref_elem(&a, x + (size_t)t * (size_t)k, j);
    for (int p = 0; p < 2; p++) {
        const epyq_numpath path = p ? EPYQ_PATH_A8 : EPYQ_PATH_A16;
        epyq_act xr;
        void *bref = act_buf(ref, &xr, x, m, k, gs, path);
        float *yref = nan_buf((size_t)m * (size_t)ldy);
        ref->w4_gemm(&a.w, 0, n, &xr, yref, ldy);
        for (int isa = 0; isa < EPYQ_ISA_COUNT; isa++) {
            const epyq_kern_table *kt = epyq_kern_for_isa((epyq_isa)isa);
            if (!kt) continue;
            epyq_act xa;
            void *buf = act_buf(kt, &xa, x, m, k, gs, path);
            float *y = nan_buf((size_t)m * (size_t)ldy), *y2 = nan_buf((size_t)m * (size_t)ldy);
            kt->w4_gemm(&a.w, 0, n, &xa, y, ldy);
            const int32_t cut = (int32_t)(rnd() % (uint32_t)(n + 1));
            kt->w4_gemm(&a.w, 0, cut, &xa, y2, ldy);
            kt->w4_gemm(&a.w, cut, n, &xa, y2, ldy);
            for (int32_t t = 0; t < m; t++) {
                const float *yt = y + (size_t)t * (size_t)ldy;
                const float *rt = yref + (size_t)t * (size_t)ldy;
                ck_assert_msg(memcmp(yt, y2 + (size_t)t * (size_t)ldy, (size_t)n * sizeof(float)) == 0,
                              "%s: rows split at %d differ from one slice (t=%d n=%d k=%d)",
                              kt->name, (int)cut, (int)t, (int)n, (int)k);
                for (int32_t j = n; j < ldy; j++) ck_assert(isnan(yt[j]));
                for (int32_t j = 0; j < n; j++) {
                    const refval *r = &rv[(size_t)t * (size_t)n + (size_t)j];
                    const double e = fabs((double)yt[j] - r->y);
                    /* half a step, plus the fp32 rounding of x * (Q / amax) before the
                     * rounding to an integer: up to ~4 Q 2^-24 steps (8e-3 at Q = 32767) */
                    const double half = 0.5 + (p ? 1e-4 : 8e-3);
                    const double bd = half * r->q[p] + (G + 3) * 0x1p-24 * r->c[p];
                    ck_assert_msg(isfinite(yt[j]) && e <= bd,
                                  "%s %s %s: y[%d][%d] = %.9g, double %.9g, err %.3g > bound "
                                  "%.3g (n=%d k=%d gs=%d m=%d)",
                                  kt->name, p ? "A8" : "A16", asym ? "asym" : "sym", (int)t,
                                  (int)j, yt[j], r->y, e, bd, (int)n, (int)k, (int)gs, (int)m);
                    ck_assert_msg(memcmp(&yt[j], &rt[j], sizeof(float)) == 0,
                                  "%s %s: y[%d][%d] = %.9g vs ref twin %.9g (must be the same bits)",
                                  kt->name, p ? "A8" : "A16", (int)t, (int)j, yt[j], rt[j]);
                    if (r->absw > 0 && e / r->absw > stats.max_rel[p]) stats.max_rel[p] = e / r->absw;
                }
            }
            /* A slice in the middle writes only its own columns. */
            if (n > 2) {
                float *y3 = nan_buf((size_t)m * (size_t)ldy);
                kt->w4_gemm(&a.w, 1, n - 1, &xa, y3, ldy);
                for (int32_t t = 0; t < m; t++)
                    for (int32_t j = 0; j < ldy; j++) {
                        const float v = y3[(size_t)t * (size_t)ldy + (size_t)j];
                        if (j >= 1 && j < n - 1)
                            ck_assert(memcmp(&v, &y[(size_t)t * (size_t)ldy + (size_t)j], 4) == 0);
                        else
                            ck_assert(isnan(v));
                    }
                free(y3);
            }
            free(y);
            free(y2);
            free(buf);
        }
        free(yref);
        free(bref);
    }
    free(rv);
    free(x);
    mat_free(&a);
}

START_TEST(test_gemm_shapes) {
    /* n (ragged), k, gs, m */
    static const int32_t full[][4] = {
        {1, 128, 128, 1},
        {7, 256, 64, 3},
        {15, 96, 32, 64},
        {17, 384, 128, 8},
        {33, 128, 32, 17},
        {100, 512, 128, 32},
        {16, 256, 128, 2},
        {48, 1024, 128, 5},
        {65, 192, 64, 64},
        {31, 128, 128, 9},
        /* every other row count a stamped-out kernel instance handles */
        {17, 128, 64, 4},
        {17, 128, 64, 6},
        {17, 128, 64, 7},
        {17, 128, 64, 10},
        {17, 128, 64, 12},
        {17, 128, 64, 13},
        {17, 128, 64, 14},
        {17, 128, 64, 15},
        {17, 128, 64, 16},
        /* one row walks up to 4 tiles at once: full groups of 4, a tail of 1..3, ragged n */
        {100, 256, 64, 1},
        {65, 192, 64, 1},
        {48, 128, 128, 1},
        {130, 128, 32, 1},
        /* the AMX core (16+ rows): blocks of 32 rows, a partial second / lone first block,
         * more rows than one pass takes (256; 64 at k = 4096), every group size */
        {48, 512, 128, 40},
        {33, 256, 32, 100},
        {20, 384, 64, 300},
        {16, 128, 128, 31},
        {20, 4096, 128, 100},
        /* many rows run in blocks of them (256 KiB of prepared activation each): 3 blocks of
         * 50 rows on A16, 2 of 75 on A8, each over every tile */
        {33, 2048, 128, 150},
    };
    static const int32_t fast[][4] = {{1, 128, 128, 1},  {17, 256, 128, 8}, {33, 64, 32, 3},
                                      {15, 128, 64, 33}, {17, 128, 64, 12}, {100, 256, 64, 1},
                                      {33, 256, 32, 100}};
    const int f = fast_mode();
    const size_t ns = f ? sizeof fast / sizeof fast[0] : sizeof full / sizeof full[0];
    rng_state = 0x9e3779b97f4a7c15ull;
    for (size_t si = 0; si < ns; si++)
        for (int asym = 0; asym < 2; asym++) {
            const int32_t *s = f ? fast[si] : full[si];
            check_gemm_shape(s[0], s[1], s[2], s[3], asym);
        }
    printf("test_w4: worst |y - y_double| / sum|w x|: A16 %.3g, A8 %.3g\n", stats.max_rel[0],
           stats.max_rel[1]);
}
END_TEST

/* ---- fused expert ---------------------------------------------------------------------- */

static double silu_d(double v) { return v / (1.0 + exp(-v)); }

/* y_ref[t][o] = rw[t] sum_{i in [i0, i1)} down[o][i] silu(gate_i . x_t) (up_i . x_t). */
static void expert_double(const mat *gate, const mat *up, const mat *down, int32_t i0,
                          int32_t i1, const float *x, int32_t m, const float *rw, double *y) {
    const int32_t k = gate->c.k, nd = down->c.n;
    double *h = malloc((size_t)(i1 - i0) * sizeof(double));
    ck_assert_ptr_nonnull(h);
    for (int32_t t = 0; t < m; t++) {
        const float *xt = x + (size_t)t * (size_t)k;
        for (int32_t i = i0; i < i1; i++) {
            double g = 0, u = 0;
            for (int32_t c = 0; c < k; c++) {
                g += wq(gate, i, c) * xt[c];
                u += wq(up, i, c) * xt[c];
            }
            h[i - i0] = silu_d(g) * u;
        }
        for (int32_t o = 0; o < nd; o++) {
            double acc = 0;
            for (int32_t i = i0; i < i1; i++) acc += wq(down, o, i) * h[i - i0];
            y[(size_t)t * (size_t)nd + (size_t)o] = rw[t] * acc;
        }
    }
    free(h);
}

static void check_expert(int32_t hidden, int32_t inter, int32_t gs, int32_t m, int asym) {
    const epyq_kern_table *ref = epyq_kern_for_isa(EPYQ_ISA_REF);
    mat gate, up, down;
    mat_make(&gate, inter, hidden, gs, asym);
    mat_make(&up, inter, hidden, gs, asym);
    mat_make(&down, hidden, inter, gs, asym);
    float *x = act_make(m, hidden, 0);
    float *rw = malloc((size_t)m * sizeof(float));
    ck_assert_ptr_nonnull(rw);
    for (int32_t t = 0; t < m; t++) rw[t] = 0.05f + 0.9f * (float)(rnd() % 1000) / 1000.0f;
    const int32_t ldy = hidden + 3, half = (inter / gs / 2) * gs;
    const int32_t slices[3][2] = {{0, inter}, {0, half}, {half, inter}};
    double *yd = malloc((size_t)m * (size_t)hidden * sizeof(double));
    void *scratch = aligned_alloc(64, w4_align64(ref->w4_expert_scratch_bytes(m, inter, hidden)));
    ck_assert(yd && scratch);
    for (int sl = 0; sl < 3; sl++) {
        const int32_t i0 = slices[sl][0], i1 = slices[sl][1];
        if (i1 <= i0) continue;
        expert_double(&gate, &up, &down, i0, i1, x, m, rw, yd);
        for (int p = 0; p < 2; p++) {
            const epyq_numpath path = p ? EPYQ_PATH_A8 : EPYQ_PATH_A16;
            epyq_act xr;
            void *bref = act_buf(ref, &xr, x, m, hidden, gs, path);
            float *yref = nan_buf((size_t)m * (size_t)ldy);
            ref->w4_expert(&gate.w, &up.w, &down.w, i0, i1, &xr, rw, yref, ldy, scratch);
            for (int isa = 0; isa < EPYQ_ISA_COUNT; isa++) {
                const epyq_kern_table *kt = epyq_kern_for_isa((epyq_isa)isa);
                if (!kt) continue;
                epyq_act xa;
                void *buf = act_buf(kt, &xa, x, m, hidden, gs, path);
                float *y = nan_buf((size_t)m * (size_t)ldy);
                kt->w4_expert(&gate.w, &up.w, &down.w, i0, i1, &xa, rw, y, ldy, scratch);
                double num = 0, den = 0;
                for (int32_t t = 0; t < m; t++)
                    for (int32_t o = 0; o < ldy; o++) {
                        const float v = y[(size_t)t * (size_t)ldy + (size_t)o];
                        if (o >= hidden) {
                            ck_assert(isnan(v));
                            continue;
                        }
                        const float vr = yref[(size_t)t * (size_t)ldy + (size_t)o];
                        const double d = yd[(size_t)t * (size_t)hidden + (size_t)o];
                        ck_assert_msg(isfinite(v), "%s expert: y[%d][%d] not written", kt->name,
                                      (int)t, (int)o);
                        /* Both paths: the same bits as the twin. */
                        ck_assert_msg(memcmp(&v, &vr, 4) == 0, "%s %s expert [%d][%d]: %.9g vs %.9g",
                                      kt->name, p ? "A8" : "A16", (int)t, (int)o, v, vr);
                        num += (v - d) * (v - d);
                        den += d * d;
                    }
                /* Norm-wise error of the whole output against double. Two roundings
                 * (x, then h) of at most half a step each (for this uniform data
                 * amax/2Q = sqrt(3)/2Q rms, Q = 127 for A8, 32767 for A16): the bounds are
                 * twice that per-term worst case. A wrong slice, group or weight gives O(1). */
                const double rel = sqrt(num / den);
                ck_assert_msg(rel <= 2.0 * 2.0 * 1.7320508 / (p ? 254.0 : 65534.0), "%s %s expert [%d,%d): rel err %.3g",
                              kt->name, p ? "A8" : "A16", (int)i0, (int)i1, rel);
                if (isa == EPYQ_ISA_REF)
                    printf("test_w4: expert %s %s m=%d [%d,%d): rel l2 err %.3g\n",
                           p ? "A8" : "A16", asym ? "asym" : "sym", (int)m, (int)i0, (int)i1, rel);
                free(y);
                free(buf);
            }
            free(yref);
            free(bref);
        }
    }
    free(scratch);
    free(yd);
    free(rw);
    free(x);
    mat_free(&gate);
    mat_free(&up);
    mat_free(&down);
}

START_TEST(test_expert) {
    rng_state = 0x51ed2701u;
    if (fast_mode()) {
        check_expert(128, 64, 32, 3, 0);
        check_expert(128, 128, 64, 1, 1);
        check_expert(128, 192, 64, 17, 1); /* 16+ rows: the AMX cores where the host has them */
        return;
    }
    check_expert(256, 256, 128, 1, 0);
    check_expert(256, 256, 128, 5, 1);
    check_expert(128, 192, 64, 17, 0);
    check_expert(192, 128, 32, 2, 1);
    check_expert(256, 256, 128, 33, 1); /* AMX: a full and a one-row block of activations */
}
END_TEST

/* A random expert (gate/up [inter][hidden], down [hidden][inter]), m activation rows (returned)
 * and m routing weights in rw. */
static float *expert_make(mat *gate, mat *up, mat *down, int32_t hidden, int32_t inter, int32_t gs,
                          int32_t m, int asym, float *rw) {
    mat_make(gate, inter, hidden, gs, asym);
    mat_make(up, inter, hidden, gs, asym);
    mat_make(down, hidden, inter, gs, asym);
    float *x = act_make(m, hidden, 1);
    for (int32_t t = 0; t < m; t++) rw[t] = 0.05f + 0.9f * (float)(rnd() % 1000) / 1000.0f;
    return x;
}

/* w4_expert_gu over p pieces of the intermediate rows, then w4_expert_down over q pieces of
 * the output rows (what moe.c's split mode spreads over threads), must give w4_expert's bits:
 * every table, both paths, m = 1, 3 and 17, an intermediate slice [i0, i1) too, uneven pieces. */
static void check_phases(int32_t hidden, int32_t inter, int32_t gs, int32_t m, int asym) {
    mat gate, up, down;
    float rw[32], *x = expert_make(&gate, &up, &down, hidden, inter, gs, m, asym, rw);
    const int32_t ranges[2][2] = {{0, inter}, {gs, inter}};
    for (int isa = 0; isa < EPYQ_ISA_COUNT; isa++) {
        const epyq_kern_table *kt = epyq_kern_for_isa((epyq_isa)isa);
        if (!kt) continue;
        void *scratch = aligned_alloc(64, w4_align64(kt->w4_expert_scratch_bytes(m, inter, hidden)));
        float *h = nan_buf((size_t)m * (size_t)inter);
        ck_assert_ptr_nonnull(scratch);
        for (int p = 0; p < 2; p++)
            for (int r = 0; r < 2; r++) {
                const epyq_numpath path = p ? EPYQ_PATH_A8 : EPYQ_PATH_A16;
                const int32_t i0 = ranges[r][0], i1 = ranges[r][1], ni = i1 - i0;
                if (ni <= 0) continue;
                epyq_act xa;
                void *buf = act_buf(kt, &xa, x, m, hidden, gs, path);
                float *whole = nan_buf((size_t)m * (size_t)hidden);
                kt->w4_expert(&gate.w, &up.w, &down.w, i0, i1, &xa, rw, whole, hidden, scratch);
                for (int32_t pieces = 1; pieces <= 3; pieces++) {
                    float *y = nan_buf((size_t)m * (size_t)hidden);
                    const int32_t ti = (ni + 15) / 16, to = (hidden + 15) / 16;
                    for (int32_t k = 0; k < pieces; k++) {
                        int32_t a = i0 + ti * k / pieces * 16, b = i0 + ti * (k + 1) / pieces * 16;
                        b = b < i1 ? b : i1;
                        if (b > a) kt->w4_expert_gu(&gate.w, &up.w, a, b, &xa, h + (a - i0), ni, scratch);
                    }
                    /* down in the other order: pieces are independent */
                    for (int32_t k = pieces - 1; k >= 0; k--) {
                        int32_t a = to * k / pieces * 16, b = to * (k + 1) / pieces * 16;
                        b = b < hidden ? b : hidden;
                        kt->w4_expert_down(&down.w, a, b, i0, i1, h, m, path, rw, y, hidden, scratch);
                    }
                    ck_assert_msg(memcmp(y, whole, (size_t)m * (size_t)hidden * sizeof(float)) == 0,
                                  "%s %s: gu + down in %d pieces over [%d,%d), m=%d, differ from w4_expert",
                                  kt->name, p ? "A8" : "A16", (int)pieces, (int)i0, (int)i1, (int)m);
                    free(y);
                }
                free(whole);
                free(buf);
            }
        free(h);
        free(scratch);
    }
    free(x);
    mat_free(&gate);
    mat_free(&up);
    mat_free(&down);
}

START_TEST(test_expert_phases) {
    rng_state = 0x9e3779b9u;
    check_phases(256, 256, 128, 1, 0);
    check_phases(128, 192, 64, 3, 1);
    if (!fast_mode()) {
        check_phases(256, 512, 128, 1, 0); /* the 35b experts' intermediate size */
        check_phases(192, 160, 32, 17, 0);
        check_phases(256, 256, 128, 40, 1);
    }
}
END_TEST

/* One intermediate slice [i0, i1) of an expert held on its own, as the NUMA loader places it:
 * gate/up as row views, down as epyq_w4_cols' copy of the slice's columns. The copy unpacks
 * to exactly those columns (codes, scales, zero points), and w4_expert over [0, i1 - i0) of
 * the pieces gives w4_expert(full, i0, i1)'s bits: every table, both paths, sym and asym, the
 * slice at the start, in the middle and at the end, m = 1, 3 and 17. */
static void check_slice_copy(int32_t hidden, int32_t inter, int32_t gs, int32_t m, int asym) {
    mat gate, up, down;
    float rw[32], *x = expert_make(&gate, &up, &down, hidden, inter, gs, m, asym, rw);
    const int32_t G = inter / gs;
    for (int32_t g0 = 0; g0 < G; g0++)
        for (int32_t g1 = g0 + 1; g1 <= G; g1++) {
            const int32_t i0 = g0 * gs, i1 = g1 * gs, ni = i1 - i0, G1 = g1 - g0;
            if (i0 % 16) continue; /* a row view starts on a tile */
            const size_t bytes = epyq_w4_pack_bytes(hidden, ni, gs, down.w.asym);
            void *mem = aligned_alloc(64, w4_align64(bytes));
            ck_assert_ptr_nonnull(mem);
            memset(mem, 0xa5, w4_align64(bytes)); /* what the copy leaves unwritten shows */
            epyq_w4 dc, gv, uv;
            ck_assert(epyq_w4_cols(&down.w, g0, g1, mem, &dc));
            ck_assert(epyq_w4_view(&gate.w, i0, i1, &gv) && epyq_w4_view(&up.w, i0, i1, &uv));
            ck_assert_int_eq(dc.n, hidden);
            ck_assert_int_eq(dc.k, ni);
            ck_assert_uint_eq(dc.bytes, bytes);
            uint8_t *q = malloc((size_t)hidden * (size_t)ni),
                    *z = malloc((size_t)hidden * (size_t)G1);
            float *sc = malloc((size_t)hidden * (size_t)G1 * sizeof(float));
            ck_assert(q && z && sc);
            epyq_w4_unpack(&dc, q, sc, z);
            for (int32_t j = 0; j < hidden; j++) {
                ck_assert_msg(
                    memcmp(q + (size_t)j * ni, down.q + (size_t)j * inter + i0, (size_t)ni) == 0,
                    "cols [%d,%d): codes of row %d differ", (int)i0, (int)i1, (int)j);
                for (int32_t g = 0; g < G1; g++) {
                    ck_assert(sc[(size_t)j * G1 + g] == down.s[(size_t)j * G + g0 + g]);
                    ck_assert_int_eq(z[(size_t)j * G1 + g],
                                     asym ? down.z[(size_t)j * G + g0 + g] : 8);
                }
            }
            if (asym) /* the zero-point padding of every tile is zero, as the packer leaves it */
                for (int32_t t = 0; t < w4_tiles(hidden); t++) {
                    const uint8_t *zt = w4_tile_zeros(&dc, w4_tile_ptr(&dc, t));
                    for (size_t b = (size_t)G1 * W4_TILE; b < w4_zero_bytes(ni, gs, 1); b++)
                        ck_assert_int_eq(zt[b], 0);
                }
            for (int isa = 0; isa < EPYQ_ISA_COUNT; isa++) {
                const epyq_kern_table *kt = epyq_kern_for_isa((epyq_isa)isa);
                if (!kt) continue;
                void *scratch =
                    aligned_alloc(64, w4_align64(kt->w4_expert_scratch_bytes(m, inter, hidden)));
                ck_assert_ptr_nonnull(scratch);
                for (int p = 0; p < 2; p++) {
                    const epyq_numpath path = p ? EPYQ_PATH_A8 : EPYQ_PATH_A16;
                    epyq_act xa;
                    void *buf = act_buf(kt, &xa, x, m, hidden, gs, path);
                    float *whole = nan_buf((size_t)m * (size_t)hidden),
                          *y = nan_buf((size_t)m * (size_t)hidden);
                    kt->w4_expert(&gate.w, &up.w, &down.w, i0, i1, &xa, rw, whole, hidden, scratch);
                    kt->w4_expert(&gv, &uv, &dc, 0, ni, &xa, rw, y, hidden, scratch);
                    ck_assert_msg(
                        memcmp(y, whole, (size_t)m * (size_t)hidden * sizeof(float)) == 0,
                        "%s %s: slice [%d,%d) held on its own differs from w4_expert over it, m=%d",
                        kt->name, p ? "A8" : "A16", (int)i0, (int)i1, (int)m);
                    free(whole), free(y), free(buf);
                }
                free(scratch);
            }
            free(q), free(z), free(sc), free(mem);
        }
    ck_assert(!epyq_w4_cols(&down.w, 0, G + 1, down.mem, &(epyq_w4){0}));
    ck_assert(!epyq_w4_cols(&down.w, 1, 1, down.mem, &(epyq_w4){0}));
    free(x);
    mat_free(&gate);
    mat_free(&up);
    mat_free(&down);
}

START_TEST(test_expert_slice_copy) {
    rng_state = 0x7f4a7c15u;
    check_slice_copy(256, 512, 128, 1, 0); /* the 35b experts: 4 slices of 128 */
    check_slice_copy(128, 192, 64, 3, 1);
    if (!fast_mode()) check_slice_copy(160, 128, 32, 17, 1);
}
END_TEST

/* A row's result must not depend on how many other rows share the call: batched decode puts
 * a varying number of tokens of different sequences into one kernel call, and epyq batch
 * --resume promises the same bytes as an uninterrupted run. Every m in 1..17 against m = 1,
 * for w4_gemm and w4_expert, both paths, every table, bit for bit. */
/* Scratch sized for m rows serves any call with fewer rows: the size never decreases in m. */
START_TEST(test_scratch_monotonic) {
    for (int isa = 0; isa < EPYQ_ISA_COUNT; isa++) {
        const epyq_kern_table *kt = epyq_kern_for_isa((epyq_isa)isa);
        if (!kt) continue;
        for (int32_t ni = 32; ni <= 1024; ni *= 2) {
            size_t prev = 0;
            for (int32_t m = 1; m <= 64; m++) {
                const size_t b = kt->w4_expert_scratch_bytes(m, ni, 2048);
                ck_assert_msg(b >= prev, "%s: scratch for m=%d (%zu) < for m=%d (%zu), n_inter %d", kt->name,
                              (int)m, b, (int)m - 1, prev, (int)ni);
                prev = b;
            }
        }
    }
}
END_TEST

START_TEST(test_rows_independent) {
    rng_state = 0x2c0ffee5u;
    const int32_t hidden = 256, inter = 128, gs = 128, mmax = fast_mode() ? 10 : 17;
    mat gate, up, down;
    mat_make(&gate, inter, hidden, gs, 0);
    mat_make(&up, inter, hidden, gs, 0);
    mat_make(&down, hidden, inter, gs, 1);
    float *x = act_make(mmax, hidden, 1), rw[32];
    for (int32_t t = 0; t < mmax; t++) rw[t] = 0.05f + 0.9f * (float)(rnd() % 1000) / 1000.0f;
    for (int isa = 0; isa < EPYQ_ISA_COUNT; isa++) {
        const epyq_kern_table *kt = epyq_kern_for_isa((epyq_isa)isa);
        if (!kt) continue;
        void *scratch = aligned_alloc(64, w4_align64(kt->w4_expert_scratch_bytes(mmax, inter, hidden)));
        ck_assert_ptr_nonnull(scratch);
        for (int p = 0; p < 2; p++) {
            const epyq_numpath path = p ? EPYQ_PATH_A8 : EPYQ_PATH_A16;
            for (int32_t m = 2; m <= mmax; m++) {
                epyq_act xm, x1;
                void *bm = act_buf(kt, &xm, x, m, hidden, gs, path);
                float *ym = nan_buf((size_t)m * hidden), *ye = nan_buf((size_t)m * hidden);
                kt->w4_gemm(&up.w, 0, inter, &xm, ym, hidden);
                kt->w4_expert(&gate.w, &up.w, &down.w, 0, inter, &xm, rw, ye, hidden, scratch);
                for (int32_t t = 0; t < m; t++) {
                    void *b1 = act_buf(kt, &x1, x + (size_t)t * hidden, 1, hidden, gs, path);
                    float *y1 = nan_buf(hidden), *e1 = nan_buf(hidden);
                    kt->w4_gemm(&up.w, 0, inter, &x1, y1, hidden);
                    kt->w4_expert(&gate.w, &up.w, &down.w, 0, inter, &x1, &rw[t], e1, hidden, scratch);
                    ck_assert_msg(memcmp(y1, ym + (size_t)t * hidden, (size_t)inter * sizeof(float)) == 0,
                                  "%s %s w4_gemm: row %d of m=%d differs from the same row alone",
                                  kt->name, p ? "A8" : "A16", (int)t, (int)m);
                    ck_assert_msg(memcmp(e1, ye + (size_t)t * hidden, (size_t)hidden * sizeof(float)) == 0,
                                  "%s %s w4_expert: row %d of m=%d differs from the same row alone",
                                  kt->name, p ? "A8" : "A16", (int)t, (int)m);
                    free(y1), free(e1), free(b1);
                }
                free(ym), free(ye), free(bm);
            }
        }
        free(scratch);
    }
    free(x);
    mat_free(&gate);
    mat_free(&up);
    mat_free(&down);
}
END_TEST

static Suite *w4_suite(void) {
    Suite *s = suite_create("w4");
    TCase *tc = epyq_test_case(s, "core", 300);
    EPYQ_TESTS_ADD(tc, test_pack_roundtrip, test_pack_pinned_words, test_pack_refuses,
                   test_act_prep, test_act_prep_tables, test_gemm_shapes, test_expert,
                   test_expert_phases, test_expert_slice_copy, test_scratch_monotonic,
                   test_rows_independent);
    return s;
}

int main(void) {
    for (int isa = 0; isa < EPYQ_ISA_COUNT; isa++)
        if (epyq_kern_for_isa((epyq_isa)isa))
            printf("test_w4: testing table %s\n", epyq_isa_name((epyq_isa)isa));
    return epyq_test_run(w4_suite());
}
