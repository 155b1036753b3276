/* tests/kern/test_dense.c — every dense kernel of every table this host can run, against a
 * double-precision reference; plus the dispatcher (EPYQ_MAX_ISA parsing and capping).
 *
 * Each case poisons its outputs with NaN, runs the kernel, and checks every output element
 * (and that elements outside the requested row slice stay NaN). A bitwise case requires
 * identical bits however the rows are sliced (as thread pools slice them) and between the
 * GQA attention entry and one call per head. Tolerances are worst-case
 * fp32 rounding bounds computed per element from the data, so a kernel that drops a term,
 * reads a wrong row or mis-handles a ragged tail fails by orders of magnitude:
 *   bf16_gemm[_f32]: |y - y64| <= (k + 2) u sum_i |w_i x_i|           (u = 2^-24; products
 *                    are exact in fp32, each term passes through <= k-1 roundings in any order)
 *   stream_read:     |s - s64| <= (n + 2) u sum_i |x_i|
 *   attn_bf16:       |o - o64| <= 2 (2 eps_s + (n_ctx + hd + 16) u) max|v|, with
 *                    eps_s = (hd + 2) u scale max_s sum_d |q_d k_sd| the score error bound
 *                    (a score error e changes each softmax weight by a factor <= e^(2e))
 *   gdn_step:        o_j: 4 (dk + 4) u (sum_i |S_ij k_i| (1 + sum_i |k_i q_i|) + sum_i |S_ij q_i|
 *                    + sum_i |S'_ij q_i| + |delta_j| sum_i |k_i q_i| + |v_j|), S' elementwise
 *                    4 u (|S_ij| + |k_i| (|delta_j| + beta (dk + 2) sum_i |S_ij k_i|))
 *   l2norm, gated_rmsnorm: |got - want| <= 2 u / 12 u |want| (see norms_case)
 * Shapes: ragged n and k (any k >= 1 is supported, no multiple of 32 needed; k > 2048 runs
 * the VDPBF16PS path in chunks), m in 1..64,
 * hd in {8, 16, 40, 64, 128, 256}. The random seed is fixed; a failure prints the case. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"
#include "kernels-x86/kern.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

#define U32 (1.0 / 16777216.0) /* fp32 unit roundoff 2^-24 */

static int fast_mode(void) {
    const char *f = getenv("EPYQ_FAST");
    return f && *f && strcmp(f, "0") != 0;
}

/* ---- deterministic random numbers ----------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void) { return (uint32_t)(epyq_test_xorshift(&rng_state) >> 16); }

/* Uniform in [-1, 1). */
static float rnd_f(void) { return (float)((double)rnd_u32() / 2147483648.0 - 1.0); }

static int rnd_range(int lo, int hi) { return lo + (int)(rnd_u32() % (uint32_t)(hi - lo + 1)); }

/* bf16 value of a random float, widened, computed independently of the library: keep 8
 * significant bits with round-half-even (nearbyint in the default rounding mode). */
static double bf16_round_d(double v) {
    if (v == 0.0 || !isfinite(v)) return v;
    int e;
    const double m = frexp(v, &e); /* v = m 2^e, 0.5 <= |m| < 1 */
    return ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

static uint16_t bf16_bits(double v) { /* v already representable in bf16 */
    const float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static double bf16_val(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t *rnd_bf16(size_t n) {
    uint16_t *p = malloc(n * sizeof *p + 64);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++) p[i] = bf16_bits(bf16_round_d(rnd_f()));
    return p;
}

static float *rnd_floats(size_t n) {
    float *p = malloc(n * sizeof *p + 64);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++) p[i] = rnd_f();
    return p;
}

static float *nan_floats(size_t n) {
    float *p = malloc(n * sizeof *p + 64);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* ---- bf16 GEMM ------------------------------------------------------------------------- */

/* The shapes every table must pass: edges of the 32-wide steps, 4-row and 4-token tiles. */
static const int gemm_k[] = {1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 257, 1000, 2048, 2049, 4100};
static const int gemm_m[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 64};

/* One case: w [n][k], x [m][k], y [m][ldy] with ldy = n + 3; rows [n0, n1). */
static void gemm_case(const epyq_kern_table *t, int exact, int n, int k, int m, double *worst) {
    const int ldy = n + 3;
    const int n0 = n > 2 ? rnd_range(0, n / 3) : 0;
    const int n1 = n > 2 ? rnd_range(n0 + 1, n) : n;
    uint16_t *w = rnd_bf16((size_t)n * (size_t)k);
    float *x = rnd_floats((size_t)m * (size_t)k);
    float *y = nan_floats((size_t)m * (size_t)ldy);
    const epyq_act a = {.m = m, .k = k, .gs = 128, .path = EPYQ_PATH_A16, .f32 = x, .buf = NULL};
    (exact ? t->bf16_gemm_f32 : t->bf16_gemm)(w, k, n0, n1, &a, y, ldy);
    for (int tk = 0; tk < m; tk++) {
        for (int j = 0; j < ldy; j++) {
            const float got = y[(size_t)tk * (size_t)ldy + (size_t)j];
            if (j < n0 || j >= n1) {
                ck_assert_msg(isnan(got), "%s %s: wrote outside rows [%d,%d): y[%d][%d]",
                              t->name, exact ? "bf16_gemm_f32" : "bf16_gemm", n0, n1, tk, j);
                continue;
            }
            double ref = 0.0, mag = 0.0;
            for (int i = 0; i < k; i++) {
                const double xv = x[(size_t)tk * (size_t)k + (size_t)i];
                const double p = bf16_val(w[(size_t)j * (size_t)k + (size_t)i]) *
                                 (exact ? xv : bf16_round_d(xv));
                ref += p;
                mag += fabs(p);
            }
            const double bound = (k + 2) * U32 * mag + 1e-37;
            const double err = fabs((double)got - ref);
            ck_assert_msg(err <= bound,
                          "%s %s n=%d k=%d m=%d rows [%d,%d): y[%d][%d] = %.9g, want %.9g "
                          "(err %.3g > bound %.3g)",
                          t->name, exact ? "bf16_gemm_f32" : "bf16_gemm", n, k, m, n0, n1, tk, j,
                          got, ref, err, bound);
            if (err / bound > *worst) *worst = err / bound;
        }
    }
    free(w);
    free(x);
    free(y);
}

static void gemm_all_tables(int exact) {
    const int nk = (int)(sizeof gemm_k / sizeof *gemm_k), nm = (int)(sizeof gemm_m / sizeof *gemm_m);
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        double worst = 0.0;
        rng_state = 0x1234567ull + (uint64_t)l;
        /* Every k with a small ragged n, then random (n, k, m) mixes. */
        for (int ik = 0; ik < nk; ik++) gemm_case(t, exact, 7, gemm_k[ik], gemm_m[ik % nm], &worst);
        const int ncases = fast_mode() ? 12 : 40;
        for (int c = 0; c < ncases; c++) {
            const int n = rnd_range(1, 70);
            const int k = gemm_k[rnd_range(0, nk - 1)] + (c % 3 == 0 ? rnd_range(0, 5) : 0);
            const int m = gemm_m[rnd_range(0, nm - 1)];
            gemm_case(t, exact, n, k, m, &worst);
        }
        printf("%-12s %-14s worst err/bound %.3g\n", t->name, exact ? "bf16_gemm_f32" : "bf16_gemm",
               worst);
    }
}

START_TEST(test_bf16_gemm) { gemm_all_tables(0); }
END_TEST

START_TEST(test_bf16_gemm_f32) { gemm_all_tables(1); }
END_TEST

/* Bitwise mode: a thread pool hands each worker a slice of rows, so a row's value may not
 * depend on where the slices start or end (remainder rows run a narrower register tile),
 * and the GQA entry must give exactly what one call per head gives. */
/* A token's outputs may not depend on the tokens beside it: the engine batches sequences in
 * any mix, and a sequence must get the same bits alone or among others. So every token of an
 * m-token call equals the same token computed alone, across the many-token path's row blocks
 * (n past 64), k chunks (k past 2048) and token-tile tails (m % 4). */
START_TEST(test_bitwise_tokens) {
    static const int ks[] = {1, 17, 300, 2048, 2049, 4100};
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        rng_state = 0x70cull + (uint64_t)l;
        for (int c = 0; c < (fast_mode() ? 6 : 12); c++) {
            const int n = rnd_range(1, 200), k = ks[c % 6], m = rnd_range(4, 21);
            const int n0 = rnd_range(0, n - 1);
            uint16_t *w = rnd_bf16((size_t)n * (size_t)k);
            float *x = rnd_floats((size_t)m * (size_t)k);
            float *y = nan_floats((size_t)m * (size_t)n), *y1 = nan_floats((size_t)n);
            for (int exact = 0; exact < 2; exact++) {
                void (*fn)(const uint16_t *, int32_t, int32_t, int32_t, const epyq_act *, float *,
                           int32_t) = exact ? t->bf16_gemm_f32 : t->bf16_gemm;
                const epyq_act a = {.m = m, .k = k, .gs = 128, .path = EPYQ_PATH_A16, .f32 = x};
                fn(w, k, n0, n, &a, y, n);
                for (int tk = 0; tk < m; tk++) {
                    const epyq_act a1 = {.m = 1,
                                         .k = k,
                                         .gs = 128,
                                         .path = EPYQ_PATH_A16,
                                         .f32 = x + (size_t)tk * (size_t)k};
                    fn(w, k, n0, n, &a1, y1, n);
                    ck_assert_msg(
                        memcmp(y + (size_t)tk * (size_t)n + n0, y1 + n0,
                               (size_t)(n - n0) * sizeof *y1) == 0,
                        "%s %s n=%d k=%d m=%d rows [%d,%d): token %d differs from the token alone",
                        t->name, exact ? "bf16_gemm_f32" : "bf16_gemm", n, k, m, n0, n, tk);
                }
            }
            free(w);
            free(x);
            free(y);
            free(y1);
        }
    }
}
END_TEST

START_TEST(test_bitwise_slices) {
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        rng_state = 0xb17ull + (uint64_t)l;
        for (int c = 0; c < 8; c++) {
            const int n = rnd_range(9, 150), k = rnd_range(1, 3000), m = rnd_range(1, 11);
            uint16_t *w = rnd_bf16((size_t)n * (size_t)k);
            float *x = rnd_floats((size_t)m * (size_t)k);
            float *y1 = nan_floats((size_t)m * (size_t)n), *y2 = nan_floats((size_t)m * (size_t)n);
            const epyq_act a = {.m = m, .k = k, .gs = 128, .path = EPYQ_PATH_A16, .f32 = x};
            for (int exact = 0; exact < 2; exact++) {
                void (*fn)(const uint16_t *, int32_t, int32_t, int32_t, const epyq_act *, float *,
                           int32_t) = exact ? t->bf16_gemm_f32 : t->bf16_gemm;
                fn(w, k, 0, n, &a, y1, n);
                const int c1 = rnd_range(1, n / 3), c2 = rnd_range(c1 + 1, n - 1);
                fn(w, k, 0, c1, &a, y2, n);
                fn(w, k, c1, c2, &a, y2, n);
                fn(w, k, c2, n, &a, y2, n);
                ck_assert_msg(memcmp(y1, y2, (size_t)m * (size_t)n * sizeof *y1) == 0,
                              "%s %s n=%d k=%d m=%d: slices [0,%d) [%d,%d) [%d,%d) differ from one call",
                              t->name, exact ? "bf16_gemm_f32" : "bf16_gemm", n, k, m, c1, c1, c2, c2, n);
            }
            free(w);
            free(x);
            free(y1);
            free(y2);
        }
        static const int hds[] = {16, 64, 256};
        for (size_t ih = 0; ih < sizeof hds / sizeof *hds; ih++) {
            const int hd = hds[ih], nq = 11, n_ctx = 77;
            uint16_t *k = rnd_bf16((size_t)n_ctx * hd), *v = rnd_bf16((size_t)n_ctx * hd);
            float *q = rnd_floats((size_t)nq * hd);
            float *o1 = nan_floats((size_t)nq * hd), *o2 = nan_floats((size_t)nq * hd);
            t->attn_bf16_multi(q, nq, hd, k, v, n_ctx, hd, hd, 0.125f, o1, hd);
            for (int h = 0; h < nq; h++)
                t->attn_bf16(q + (size_t)h * hd, k, v, n_ctx, hd, hd, 0.125f, o2 + (size_t)h * hd);
            ck_assert_msg(memcmp(o1, o2, (size_t)nq * hd * sizeof *o1) == 0,
                          "%s: attn_bf16_multi differs from per-head attn_bf16 (hd=%d)", t->name, hd);
            free(k);
            free(v);
            free(q);
            free(o1);
            free(o2);
        }
    }
}
END_TEST

/* ---- attention --------------------------------------------------------------------------- */

/* One head's output [ldo] (columns [hd, ldo) must stay NaN) against the double reference
 * with the bound in the header; what names the case in a failure. */
static void check_attn_head(const char *what, const float *qh, const uint16_t *k, const uint16_t *v,
                            int n_ctx, int hd, int kv_stride, float scale, const float *oh, int ldo,
                            double *worst) {
    double *sc = malloc((size_t)(n_ctx > 0 ? n_ctx : 1) * sizeof *sc);
    ck_assert_ptr_nonnull(sc);
    double mx = -INFINITY, eps = 0.0, vmax = 0.0;
    for (int s = 0; s < n_ctx; s++) {
        double dot = 0.0, mag = 0.0;
        for (int d = 0; d < hd; d++) {
            const double p = qh[d] * bf16_val(k[(size_t)s * (size_t)kv_stride + (size_t)d]);
            dot += p;
            mag += fabs(p);
            const double vv = fabs(bf16_val(v[(size_t)s * (size_t)kv_stride + (size_t)d]));
            if (vv > vmax) vmax = vv;
        }
        sc[s] = dot * scale;
        if (sc[s] > mx) mx = sc[s];
        const double e = (hd + 2) * U32 * scale * mag;
        if (e > eps) eps = e;
    }
    double z = 0.0;
    for (int s = 0; s < n_ctx; s++) z += (sc[s] = exp(sc[s] - mx)); /* sc: weights now */
    const double bound = 2.0 * (2.0 * eps + (n_ctx + hd + 16) * U32) * vmax + 1e-30;
    for (int d = 0; d < ldo; d++) {
        const float got = oh[d];
        if (d >= hd) {
            ck_assert_msg(isnan(got), "%s: wrote past hd at col %d", what, d);
            continue;
        }
        double ref = 0.0;
        for (int s = 0; s < n_ctx; s++)
            ref += sc[s] / z * bf16_val(v[(size_t)s * (size_t)kv_stride + (size_t)d]);
        const double err = fabs((double)got - ref);
        ck_assert_msg(err <= bound, "%s: out[%d] = %.9g, want %.9g (err %.3g > %.3g)", what, d, got,
                      ref, err, bound);
        if (err / bound > *worst) *worst = err / bound;
    }
    free(sc);
}

/* q [nq][ldq], K/V rows of kv_stride; checks out [nq][ldo] (and the padding stays NaN). */
static void attn_case(const epyq_kern_table *t, int multi, int nq, int hd, int n_ctx,
                      double *worst) {
    const int kv_stride = hd + 5, ldq = hd + 2, ldo = hd + 3;
    const float scale = (float)(1.0 / sqrt((double)hd)) * 2.0f; /* sharpen the softmax */
    const size_t kv_rows = (size_t)(n_ctx > 0 ? n_ctx : 1);
    uint16_t *k = rnd_bf16(kv_rows * (size_t)kv_stride);
    uint16_t *v = rnd_bf16(kv_rows * (size_t)kv_stride);
    float *q = rnd_floats((size_t)nq * (size_t)ldq);
    for (size_t i = 0; i < (size_t)nq * (size_t)ldq; i++) q[i] *= 3.0f;
    float *out = nan_floats((size_t)nq * (size_t)ldo);
    if (multi)
        t->attn_bf16_multi(q, nq, ldq, k, v, n_ctx, hd, kv_stride, scale, out, ldo);
    else
        for (int h = 0; h < nq; h++)
            t->attn_bf16(q + (size_t)h * (size_t)ldq, k, v, n_ctx, hd, kv_stride, scale,
                         out + (size_t)h * (size_t)ldo);
    for (int h = 0; h < nq; h++) {
        char what[128];
        snprintf(what, sizeof what, "%s %s nq=%d hd=%d n_ctx=%d head %d", t->name,
                 multi ? "attn_bf16_multi" : "attn_bf16", nq, hd, n_ctx, h);
        check_attn_head(what, q + (size_t)h * (size_t)ldq, k, v, n_ctx, hd, kv_stride, scale,
                        out + (size_t)h * (size_t)ldo, ldo, worst);
    }
    free(k);
    free(v);
    free(q);
    free(out);
}

static void attn_all_tables(int multi) {
    static const int hds[] = {8, 16, 40, 64, 128, 256};
    static const int ctxs[] = {0, 1, 2, 7, 8, 15, 16, 17, 33, 100, 300};
    const int nctx = fast_mode() ? 8 : (int)(sizeof ctxs / sizeof *ctxs);
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        double worst = 0.0;
        rng_state = 0xabcdefull + (uint64_t)l;
        for (size_t ih = 0; ih < sizeof hds / sizeof *hds; ih++)
            for (int ic = 0; ic < nctx; ic++) {
                const int nq = multi ? 1 + (int)((ih + (size_t)ic) % 11) : 2; /* 1..11 heads */
                attn_case(t, multi, nq, hds[ih], ctxs[ic], &worst);
            }
        printf("%-12s %-14s worst err/bound %.3g\n", t->name, multi ? "attn_multi" : "attn",
               worst);
    }
}

START_TEST(test_attn) { attn_all_tables(0); }
END_TEST

START_TEST(test_attn_multi) { attn_all_tables(1); }
END_TEST

/* Prompt tiles: nt tokens x nh heads with their own n_ctx (ragged, unordered, 0 allowed,
 * tiles of more than one 64-row pass), strided q/out; every row against the double reference,
 * and each row's bits equal to the same row computed alone (a one-token, one-head tile): the
 * contract that a row does not depend on its tile. hd 320 runs the ref fallback of the SIMD
 * tables. */
static void attn_tile_case(const epyq_kern_table *t, int nt, int nh, int hd, double *worst) {
    const int kv_stride = hd + 3, ldq_h = hd + 2, ldq_t = nh * ldq_h + 5, ldo_h = hd + 1,
              ldo_t = nh * ldo_h + 3;
    const float scale = (float)(1.0 / sqrt((double)hd)) * 2.0f;
    int n_ctx[24], max_n = 1;
    for (int i = 0; i < nt; i++) {
        n_ctx[i] = rnd_range(0, 6) == 0 ? 0 : rnd_range(1, 260);
        if (n_ctx[i] > max_n) max_n = n_ctx[i];
    }
    uint16_t *k = rnd_bf16((size_t)max_n * (size_t)kv_stride),
             *v = rnd_bf16((size_t)max_n * (size_t)kv_stride);
    float *q = rnd_floats((size_t)nt * (size_t)ldq_t);
    for (size_t i = 0; i < (size_t)nt * (size_t)ldq_t; i++) q[i] *= 3.0f;
    float *out = nan_floats((size_t)nt * (size_t)ldo_t), *one = nan_floats((size_t)ldo_h);
    t->attn_bf16_tile(q, nt, nh, ldq_t, ldq_h, n_ctx, k, v, hd, kv_stride, scale, out, ldo_t,
                      ldo_h);
    for (int i = 0; i < nt; i++) {
        for (int h = 0; h < nh; h++) {
            char what[128];
            snprintf(what, sizeof what,
                     "%s attn_bf16_tile nt=%d nh=%d hd=%d token %d (n_ctx %d) head %d", t->name, nt,
                     nh, hd, i, n_ctx[i], h);
            const float *qh = q + (size_t)i * (size_t)ldq_t + (size_t)h * (size_t)ldq_h;
            const float *oh = out + (size_t)i * (size_t)ldo_t + (size_t)h * (size_t)ldo_h;
            check_attn_head(what, qh, k, v, n_ctx[i], hd, kv_stride, scale, oh, ldo_h, worst);
            t->attn_bf16_tile(qh, 1, 1, 0, 0, &n_ctx[i], k, v, hd, kv_stride, scale, one, 0, 0);
            ck_assert_msg(memcmp(one, oh, (size_t)hd * sizeof *one) == 0,
                          "%s: differs from the row alone", what);
        }
        for (int d = nh * ldo_h; d < ldo_t; d++)
            ck_assert_msg(isnan(out[(size_t)i * (size_t)ldo_t + (size_t)d]),
                          "%s attn_bf16_tile: wrote padding", t->name);
    }
    free(k);
    free(v);
    free(q);
    free(out);
    free(one);
}

START_TEST(test_attn_tile) {
    static const int hds[] = {8, 16, 40, 64, 128, 256, 320};
    static const int shapes[][2] = {{1, 1}, {1, 8},  {4, 8},  {2, 3}, {8, 8},
                                    {9, 8}, {5, 11}, {24, 2}, {3, 16}};
    const int nshape = fast_mode() ? 5 : (int)(sizeof shapes / sizeof *shapes);
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        double worst = 0.0;
        rng_state = 0x7113ull + (uint64_t)l;
        for (size_t ih = 0; ih < sizeof hds / sizeof *hds; ih++)
            for (int c = 0; c < nshape; c++)
                attn_tile_case(t, shapes[c][0], shapes[c][1], hds[ih], &worst);
        printf("%-12s %-14s worst err/bound %.3g\n", t->name, "attn_tile", worst);
    }
}
END_TEST

/* A softmax that is one-hot (one score far above the rest) must return that V row: the
 * online rescaling may not leak the earlier, smaller blocks' weights. */
START_TEST(test_attn_peaked) {
    const int hd = 64, n_ctx = 40;
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        uint16_t *k = calloc((size_t)n_ctx * hd, sizeof *k), *v = rnd_bf16((size_t)n_ctx * hd);
        float q[64], out[64];
        ck_assert_ptr_nonnull(k);
        for (int d = 0; d < hd; d++) q[d] = 1.0f;
        for (int d = 0; d < hd; d++) k[33 * hd + d] = bf16_bits(1.0); /* score 64*scale */
        t->attn_bf16(q, k, v, n_ctx, hd, hd, 4.0f, out);
        for (int d = 0; d < hd; d++)
            ck_assert_msg(fabs(out[d] - bf16_val(v[33 * hd + d])) <= 1e-6, "%s: col %d %g vs %g",
                          t->name, d, out[d], bf16_val(v[33 * hd + d]));
        free(k);
        free(v);
    }
}
END_TEST

/* ---- Gated DeltaNet step ------------------------------------------------------------------ */

static void l2norm(float *x, int n, float post) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    const float inv = (float)(1.0 / sqrt(s + 1e-6)) * post;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

static void gdn_case(const epyq_kern_table *t, int dk, int dv, double *worst) {
    const size_t ns = (size_t)dk * (size_t)dv;
    float *S = rnd_floats(ns), *k = rnd_floats((size_t)dk), *q = rnd_floats((size_t)dk);
    float *v = rnd_floats((size_t)dv), *o = nan_floats((size_t)dv + 4);
    l2norm(k, dk, 1.0f);
    l2norm(q, dk, (float)(1.0 / sqrt((double)dk)));
    const float alpha = 0.5f + 0.5f * fabsf(rnd_f()), beta = fabsf(rnd_f());
    double *S0 = malloc(ns * sizeof *S0), *Sn = malloc(ns * sizeof *Sn);
    ck_assert(S0 && Sn);
    for (size_t e = 0; e < ns; e++) S0[e] = S[e];
    t->gdn_step(S, k, v, q, alpha, beta, dk, dv, o);
    double kq = 0.0;
    for (int i = 0; i < dk; i++) kq += fabs((double)k[i] * q[i]);
    for (int j = 0; j < dv; j++) {
        double m = 0.0, sk = 0.0, sq0 = 0.0;
        for (int i = 0; i < dk; i++) {
            m += alpha * S0[(size_t)i * dv + j] * k[i];
            sk += fabs(S0[(size_t)i * dv + j] * k[i]);
            sq0 += fabs(S0[(size_t)i * dv + j] * q[i]);
        }
        const double delta = beta * ((double)v[j] - m);
        double oj = 0.0, sq = 0.0;
        for (int i = 0; i < dk; i++) {
            const size_t e = (size_t)i * dv + j;
            Sn[e] = alpha * S0[e] + k[i] * delta;
            oj += Sn[e] * q[i];
            sq += fabs(Sn[e] * q[i]);
        }
        const double bound =
            4.0 * (dk + 4) * U32 * (sk * (1.0 + kq) + sq + sq0 + fabs(delta) * kq + fabs(v[j]));
        const double err = fabs(o[j] - oj);
        ck_assert_msg(err <= bound, "%s gdn dk=%d dv=%d: o[%d] = %.9g, want %.9g (err %.3g > %.3g)",
                      t->name, dk, dv, j, o[j], oj, err, bound);
        if (err / bound > *worst) *worst = err / bound;
        for (int i = 0; i < dk; i++) {
            const size_t e = (size_t)i * dv + j;
            const double sb = 4.0 * U32 * (fabs(S0[e]) + fabs(k[i]) * (fabs(delta) + beta * (dk + 2) * sk));
            ck_assert_msg(fabs(S[e] - Sn[e]) <= sb + 1e-30, "%s gdn dk=%d dv=%d: S[%d][%d] = %.9g, want %.9g",
                          t->name, dk, dv, i, j, S[e], Sn[e]);
        }
    }
    for (int j = dv; j < dv + 4; j++) ck_assert_msg(isnan(o[j]), "%s gdn: wrote o[%d] past dv", t->name, j);
    free(S0);
    free(Sn);
    free(S);
    free(k);
    free(q);
    free(v);
    free(o);
}

START_TEST(test_gdn_step) {
    static const int shapes[][2] = {{128, 128}, {16, 16}, {8, 24}, {33, 40}, {64, 144}, {5, 7}, {128, 136}};
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        double worst = 0.0;
        rng_state = 0x5151ull + (uint64_t)l;
        for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++)
            for (int rep = 0; rep < 3; rep++) gdn_case(t, shapes[c][0], shapes[c][1], &worst);
        printf("%-12s %-14s worst err/bound %.3g\n", t->name, "gdn_step", worst);
    }
}
END_TEST

/* ---- causal conv + SiLU ------------------------------------------------------------------- */

/* One token over n channels with kc taps, rows padded (lds, ldw > n) to catch writes past n.
 * The state must move exactly (the raw input into the last row); the output is held to
 * |got - silu(s)| <= 1.1 (kc + 1) u sum |w t| + 8 u |silu(s)|: the sum's fp32 rounding,
 * through a slope of SiLU below 1.1, plus a few ulp for the sigmoid (exp and division). */
static void conv_case(const epyq_kern_table *t, int n, int kc, double *worst) {
    const size_t lds = (size_t)n + 5, ldw = (size_t)n + 3;
    float *x = rnd_floats((size_t)n + 4), *st = rnd_floats((size_t)kc * lds),
          *w = rnd_floats((size_t)kc * ldw);
    for (int c = 0; c < n; c++) x[c] *= 4.0f; /* reach both tails of the sigmoid */
    x[0] = n > 1 ? -100.0f : x[0];            /* e^-|s| clamped: silu -> -0 */
    float *x0 = malloc(((size_t)n + 4) * sizeof *x0), *st0 = malloc((size_t)kc * lds * sizeof *st0);
    ck_assert(x0 && st0);
    memcpy(x0, x, ((size_t)n + 4) * sizeof *x0);
    memcpy(st0, st, (size_t)kc * lds * sizeof *st0);
    for (int c = 0; c < n; c++)
        w[(size_t)(kc - 1) * ldw + c] = c == 0 ? 1.0f : w[(size_t)(kc - 1) * ldw + c];
    t->conv_silu(x, st, lds, w, ldw, kc, n);
    for (int c = 0; c < n; c++) {
        double s = (double)w[(size_t)(kc - 1) * ldw + c] * x0[c], mag = fabs(s);
        for (int r = 0; r < kc - 1; r++) {
            const double p = (double)w[(size_t)r * ldw + c] * st0[(size_t)r * lds + c];
            s += p, mag += fabs(p);
        }
        const double want = s / (1.0 + exp(-s));
        /* + the exp clamp at -87 (dense_avx512.c): e^-|s| is at least e^-87 there */
        const double bound =
            1.1 * (kc + 1) * U32 * mag + 8.0 * U32 * fabs(want) + fabs(s) * 1.7e-38 + 1e-37;
        const double err = fabs(x[c] - want);
        ck_assert_msg(err <= bound, "%s conv n=%d kc=%d: x[%d] = %.9g, want %.9g (err %.3g > %.3g)",
                      t->name, n, kc, c, x[c], want, err, bound);
        if (err / bound > *worst) *worst = err / bound;
        for (int r = 0; r < kc - 1; r++) {
            const float e = r + 1 < kc - 1 ? st0[(size_t)(r + 1) * lds + c] : x0[c];
            ck_assert_msg(memcmp(&st[(size_t)r * lds + c], &e, sizeof e) == 0,
                          "%s conv n=%d kc=%d: state[%d][%d] = %.9g, want %.9g", t->name, n, kc, r,
                          c, st[(size_t)r * lds + c], e);
        }
    }
    for (int c = n; c < n + 4; c++)
        ck_assert_msg(memcmp(&x[c], &x0[c], sizeof *x) == 0, "%s conv: wrote x[%d]", t->name, c);
    for (int r = 0; r < kc; r++)
        for (size_t c = (size_t)n; c < lds; c++)
            ck_assert_msg(memcmp(&st[(size_t)r * lds + c], &st0[(size_t)r * lds + c], sizeof *st) ==
                              0,
                          "%s conv: wrote state[%d][%zu] past n", t->name, r, c);
    free(x), free(st), free(w), free(x0), free(st0);
}

START_TEST(test_conv_silu) {
    static const int ns[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 128, 200, 8192};
    static const int kcs[] = {1, 2, 3, 4, 5};
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        double worst = 0.0;
        rng_state = 0xc0417ull + (uint64_t)l;
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof kcs / sizeof *kcs; b++)
                conv_case(t, ns[a], kcs[b], &worst);
        printf("%-12s %-14s worst err/bound %.3g\n", t->name, "conv_silu", worst);
    }
}
END_TEST

/* ---- DeltaNet's per-head norms -------------------------------------------------------------- */

/* l2norm and gated_rmsnorm over n elements (poisoned past n), against a double oracle. Every
 * table sums the squares in double, so the factor is the oracle's up to its fp32 rounding:
 *   l2norm:        |got - want| <= 2.01 u |want| (two fp32 roundings; the double sum < 0.01 u)
 *   gated_rmsnorm: |got - want| <= 12 u |want| + the exp clamp at -87 (the conv test's terms):
 * the factor, three products and a few ulp of the sigmoid (exp and division). */
static void norms_case(const epyq_kern_table *t, int n, double *worst) {
    float *v = rnd_floats((size_t)n + 4), *z = rnd_floats((size_t)n + 4),
          *w = rnd_floats((size_t)n);
    const float mag = (float)ldexp(1.0, rnd_range(-20, 20)); /* the norm is scale-free */
    for (int i = 0; i < n; i++) v[i] *= mag, z[i] *= 6.0f;   /* both tails of the sigmoid */
    z[0] = n > 1 ? -100.0f : z[0];
    float *v0 = malloc(((size_t)n + 4) * sizeof *v0), *o = malloc(((size_t)n + 4) * sizeof *o);
    ck_assert(v0 && o);
    memcpy(v0, v, ((size_t)n + 4) * sizeof *v0);
    memcpy(o, v, ((size_t)n + 4) * sizeof *o);
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)v0[i] * v0[i];
    const float scale = 0.0883883f;
    t->l2norm(v, n, scale, 1e-6);
    t->gated_rmsnorm(o, z, w, n, 1e-6);
    for (int i = 0; i < n; i++) {
        const double l2 = v0[i] * (scale / sqrt(ss + 1e-6));
        const double bl = 2.01 * U32 * fabs(l2) + 1e-300;
        const double el = fabs(v[i] - l2);
        ck_assert_msg(el <= bl, "%s l2norm n=%d: v[%d] = %.9g, want %.9g (err %.3g > %.3g)",
                      t->name, n, i, v[i], l2, el, bl);
        const double zi = z[i], sig = 1.0 / (1.0 + exp(-zi));
        const double base = v0[i] / sqrt(ss / n + 1e-6) * w[i];
        const double g = base * zi * sig;
        const double bg = 12.0 * U32 * fabs(g) + fabs(base * zi) * 1.7e-38 + 1e-37;
        const double eg = fabs(o[i] - g);
        ck_assert_msg(eg <= bg, "%s gated_rmsnorm n=%d: o[%d] = %.9g, want %.9g (err %.3g > %.3g)",
                      t->name, n, i, o[i], g, eg, bg);
        if (el / bl > *worst) *worst = el / bl;
        if (eg / bg > *worst) *worst = eg / bg;
    }
    for (int i = n; i < n + 4; i++) {
        ck_assert_msg(memcmp(&v[i], &v0[i], sizeof *v) == 0, "%s l2norm: wrote v[%d]", t->name, i);
        ck_assert_msg(memcmp(&o[i], &v0[i], sizeof *o) == 0, "%s gated_rmsnorm: wrote o[%d]",
                      t->name, i);
    }
    free(v), free(z), free(w), free(v0), free(o);
}

START_TEST(test_gdn_norms) {
    static const int ns[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 128, 129, 256};
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        double worst = 0.0;
        rng_state = 0x4e0e5ull + (uint64_t)l;
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (int rep = 0; rep < 4; rep++) norms_case(t, ns[a], &worst);
        printf("%-12s %-14s worst err/bound %.3g\n", t->name, "gdn_norms", worst);
    }
}
END_TEST

/* ---- stream read --------------------------------------------------------------------------- */

START_TEST(test_stream_read) {
    static const size_t ns[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 4097, 100003};
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        rng_state = 0x77ull + (uint64_t)l;
        for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
            float *b = rnd_floats(ns[c] + 1);
            double ref = 0.0, mag = 0.0;
            for (size_t i = 0; i < ns[c]; i++) {
                ref += b[i];
                mag += fabs(b[i]);
            }
            b[ns[c]] = 1e30f; /* one past the end: must not be read */
            const double got = t->stream_read(b, ns[c]);
            ck_assert_msg(fabs(got - ref) <= (ns[c] + 2) * U32 * mag, "%s stream_read n=%zu: %.9g vs %.9g",
                          t->name, ns[c], got, ref);
            free(b);
        }
    }
}
END_TEST

/* ---- dispatch -------------------------------------------------------------------------------- */

static const char *const level_names[] = {"ref",         "avx2",        "avx512",
                                          "avx512_vnni", "avx512_bf16", "avx512_amx"};

START_TEST(test_isa_parse) {
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        ck_assert_int_eq(epyq_isa_parse(level_names[l]), l);
        ck_assert_str_eq(epyq_isa_name((epyq_isa)l), level_names[l]);
    }
    static const char *const bad[] = {"", "AVX2", "avx512bf16", "avx-512", "sse4", "avx2 ", "avx512_"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) ck_assert_int_eq(epyq_isa_parse(bad[i]), -1);
    ck_assert_int_eq(epyq_isa_parse(NULL), -1);
    ck_assert_str_eq(epyq_isa_name(EPYQ_ISA_COUNT), "unknown");
}
END_TEST

START_TEST(test_select_caps) {
    for (int h = 0; h < EPYQ_ISA_COUNT; h++) {
        if ((epyq_isa)h > epyq_cpu_isa()) continue; /* tables above the host are not handed out */
        const epyq_kern_table *t = NULL;
        epyq_err err;
        ck_assert_int_eq(epyq_kern_select((epyq_isa)h, NULL, &t, &err), EPYQ_OK);
        ck_assert_int_eq(t->isa, h);
        ck_assert_int_eq(epyq_kern_select((epyq_isa)h, "", &t, &err), EPYQ_OK);
        ck_assert_int_eq(t->isa, h);
        for (int c = 0; c < EPYQ_ISA_COUNT; c++) {
            ck_assert_int_eq(epyq_kern_select((epyq_isa)h, level_names[c], &t, &err), EPYQ_OK);
            ck_assert_int_eq(t->isa, c < h ? c : h); /* a cap never raises the level */
            ck_assert_str_eq(t->name, level_names[t->isa]);
        }
        ck_assert_int_eq(epyq_kern_select((epyq_isa)h, "avx9000", &t, &err), EPYQ_E_ARG);
        ck_assert_ptr_null(t);
        ck_assert_msg(strstr(err.msg, "EPYQ_MAX_ISA=avx9000") != NULL, "message: %s", err.msg);
    }
}
END_TEST

/* Every level's table is complete (fallback filled every dense slot), levels the host lacks
 * are refused, and a level without its own kernel serves the level below's. */
START_TEST(test_tables) {
    const epyq_isa host = epyq_cpu_isa();
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if ((epyq_isa)l > host) {
            ck_assert_ptr_null(t);
            continue;
        }
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(t->isa, l);
        ck_assert_ptr_nonnull(t->bf16_gemm);
        ck_assert_ptr_nonnull(t->bf16_gemm_f32);
        ck_assert_ptr_nonnull(t->attn_bf16);
        ck_assert_ptr_nonnull(t->attn_bf16_multi);
        ck_assert_ptr_nonnull(t->attn_bf16_tile);
        ck_assert_ptr_nonnull(t->gdn_step);
        ck_assert_ptr_nonnull(t->conv_silu);
        ck_assert_ptr_nonnull(t->l2norm);
        ck_assert_ptr_nonnull(t->gated_rmsnorm);
        ck_assert_ptr_nonnull(t->stream_read);
    }
    if (host >= EPYQ_ISA_AVX512_VNNI) /* vnni adds no dense kernel of its own */
        ck_assert(epyq_kern_for_isa(EPYQ_ISA_AVX512_VNNI)->gdn_step ==
                  epyq_kern_for_isa(EPYQ_ISA_AVX512)->gdn_step);
    ck_assert_ptr_null(epyq_kern_for_isa(EPYQ_ISA_COUNT));
}
END_TEST

/* The process table honours EPYQ_MAX_ISA: run epyq_kern() in a fresh child per value
 * (the choice is made once per process). Exit code = chosen level, 100 + level when
 * epyq_kern_init() refused the value. */
static int child_level(const char *cap) {
    const pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (cap)
            setenv("EPYQ_MAX_ISA", cap, 1);
        else
            unsetenv("EPYQ_MAX_ISA");
        epyq_err err;
        const epyq_status st = epyq_kern_init(&err);
        const epyq_kern_table *t = epyq_kern();
        _exit((st == EPYQ_OK ? 0 : 100) + (int)t->isa);
    }
    int ws = 0;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert(WIFEXITED(ws));
    return WEXITSTATUS(ws);
}

START_TEST(test_env_cap) {
    const int host = (int)epyq_cpu_isa();
    ck_assert_int_eq(child_level(NULL), host);
    for (int c = 0; c < EPYQ_ISA_COUNT; c++) ck_assert_int_eq(child_level(level_names[c]), c < host ? c : host);
    ck_assert_int_eq(child_level("bogus"), 100 + EPYQ_ISA_REF); /* refused, ref kernels */
}
END_TEST

static Suite *dense_suite(void) {
    Suite *s = suite_create("kern_dense");
    TCase *tc = epyq_test_case(s, "dispatch", 0);
    EPYQ_TESTS_ADD(tc, test_isa_parse, test_select_caps, test_tables, test_env_cap);
    tc = epyq_test_case(s, "kernels", 120);
    EPYQ_TESTS_ADD(tc, test_bf16_gemm, test_bf16_gemm_f32, test_bitwise_tokens, test_bitwise_slices,
                   test_attn, test_attn_multi, test_attn_tile, test_attn_peaked, test_gdn_step,
                   test_conv_silu, test_gdn_norms, test_stream_read);
    return s;
}

int main(void) { return epyq_test_run(dense_suite()); }
