/* tests/kern/test_w4_act.c — the int4 path's activation helpers.
 *
 * silu_mul, the routed expert's h = silu(gate) * up (w4_impl.h): the AVX2 and AVX-512
 * versions against the plain-C twin bit for bit (w4_expert's tables promise the ref twin's
 * bits, and test_w4 relies on it), on every ragged length and offset up to 40 and on the
 * special values; the twin against silu in double precision. Accuracy of the twin (measured
 * here, printed): the exp is a degree-7 polynomial after a Cody-Waite split; then at most a
 * multiply, an add, a divide and the multiply by u. Bound used: |h - h64| <= 8 u |h64| + 1e-37
 * (u = 2^-24) for |g| <= 80, where e^-|g| is a normal float. Below g = -87 (where the exp
 * argument is clamped) the result is 0, as g / (1 + expf(-g)) gives there.
 *
 * epyq_act_gather (kern.h): rows of a prepared batch, repeats and any order, against
 * preparing the same f32 rows directly, code for code, on every table's act_prep and both
 * paths. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels-x86/w4_impl.h"
#include "kernels-x86/w4_layout.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

typedef void (*silu_fn)(const float *g, const float *u, float *h, int32_t n);

static uint64_t rng = 0x5111u;

/* g: mostly ordinary values over many magnitudes, with the specials among them */
static void make_inputs(float *g, float *u, int32_t n) {
    static const float special[] = {0.0f,    -0.0f, NAN,    INFINITY, -INFINITY, 1e-45f,
                                    -1e-45f, 88.0f, -86.9f, -87.0f,   -87.5f,    -100.0f,
                                    -1e30f,  1e30f, -20.0f, 20.0f,    0.5f,      -0.5f};
    const int32_t ns = (int32_t)(sizeof special / sizeof *special);
    for (int32_t i = 0; i < n; i++) {
        const uint64_t r = epyq_test_xorshift(&rng);
        const double mag = ldexp((double)(r >> 40) / 16777216.0, (int)((r >> 8) % 14) - 7);
        g[i] = (r & 1 ? -1.0f : 1.0f) * (float)(mag * 10.0);
        u[i] = (float)((double)(r >> 44) / 1048576.0 * 4.0 - 2.0);
        if (r % 7 == 0) g[i] = special[(r >> 16) % (uint64_t)ns];
    }
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

START_TEST(test_silu_tables_match_ref) {
    struct {
        epyq_isa isa;
        silu_fn fn;
        const char *name;
    } simd[] = {{EPYQ_ISA_AVX2, epyq_silu_mul_avx2, "avx2"},
                {EPYQ_ISA_AVX512, epyq_silu_mul_avx512, "avx512"}};
    enum { N = 4096 };
    float *g = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float));
    float *hr = malloc(N * sizeof(float)), *hs = malloc(N * sizeof(float));
    ck_assert(g && u && hr && hs);
    make_inputs(g, u, N);
    epyq_silu_mul_ref(g, u, hr, N);
    int tested = 0;
    for (size_t s = 0; s < sizeof simd / sizeof *simd; s++) {
        if (!epyq_kern_for_isa(simd[s].isa)) continue; /* this host cannot run it */
        tested++;
        for (int32_t off = 0; off < 8; off++)
            for (int32_t n = 0; n <= 40; n++) {
                for (int32_t i = 0; i < 48; i++) hs[i] = -7.0f; /* a sentinel past the end */
                simd[s].fn(g + off, u + off, hs, n);
                for (int32_t i = 0; i < n; i++)
                    ck_assert_msg(same_bits(hs[i], hr[off + i]),
                                  "%s silu_mul n=%d off=%d [%d]: g=%.9g u=%.9g -> %.9g, ref %.9g",
                                  simd[s].name, n, off, i, g[off + i], u[off + i], hs[i],
                                  hr[off + i]);
                for (int32_t i = n; i < 48; i++)
                    ck_assert_msg(hs[i] == -7.0f, "%s silu_mul n=%d wrote h[%d]", simd[s].name, n,
                                  i);
            }
        simd[s].fn(g, u, hs, N);
        for (int32_t i = 0; i < N; i++)
            ck_assert_msg(same_bits(hs[i], hr[i]), "%s silu_mul [%d]: g=%.9g -> %.9g, ref %.9g",
                          simd[s].name, i, g[i], hs[i], hr[i]);
    }
    printf("silu_mul: %d SIMD versions equal to the ref twin on %d values\n", tested, N);
    free(g), free(u), free(hr), free(hs);
}
END_TEST

START_TEST(test_silu_ref_accuracy) {
    enum { N = 200000 };
    float *g = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float)),
          *h = malloc(N * sizeof(float));
    ck_assert(g && u && h);
    make_inputs(g, u, N);
    epyq_silu_mul_ref(g, u, h, N);
    double worst = 0.0;
    for (int32_t i = 0; i < N; i++) {
        const double gd = g[i], ud = u[i], want = gd / (1.0 + exp(-gd)) * ud;
        if (isnan(gd)) {
            ck_assert_msg(isnan(h[i]), "silu(NaN) * %g = %g, want NaN", ud, h[i]);
        } else if (fabs(gd) <= 80.0) {
            const double err = fabs(h[i] - want), bound = 8.0 * 0x1p-24 * fabs(want) + 1e-37;
            ck_assert_msg(err <= bound, "silu(%.9g) * %.9g = %.9g, want %.9g (err %.3g > %.3g)", gd,
                          ud, h[i], want, err, bound);
            if (err / bound > worst) worst = err / bound;
        } else if (gd > 80.0) { /* silu(g) = g to within e^-80 */
            ck_assert_msg(h[i] == g[i] * u[i] || (isinf(gd) && isinf(h[i])),
                          "silu(%.9g) * %.9g = %.9g, want %.9g", gd, ud, h[i],
                          (double)(g[i] * u[i]));
        } else if (gd < -87.0 && !isinf(gd)) {
            ck_assert_msg(h[i] == 0.0f, "silu(%.9g) * %.9g = %.9g, want 0", gd, ud, h[i]);
        } else if (!isinf(gd)) { /* [-87, -80]: |silu(g)| < 1e-32 */
            ck_assert_msg(fabs(h[i]) <= 1e-32 * fabs(ud), "silu(%.9g) * %.9g = %.9g, want ~0", gd,
                          ud, h[i]);
        }
    }
    float g0[] = {0.0f, -0.0f}, u0[] = {3.0f, 3.0f}, h0[2];
    epyq_silu_mul_ref(g0, u0, h0, 2);
    ck_assert(h0[0] == 0.0f && h0[1] == 0.0f);
    printf("silu_mul ref: worst error / bound %.3g over %d values\n", worst, N);
    free(g), free(u), free(h);
}
END_TEST

/* The prepared rows of a (codes, steps, code sums), as one comparable list of numbers. */
static void act_row(const epyq_act *a, int32_t r, int32_t *codes, float *d, int32_t *sums) {
    const int32_t k = a->k, G = k / a->gs;
    if (a->path == EPYQ_PATH_A8) {
        const w4_a8_view v = w4_a8_of(a);
        for (int32_t i = 0; i < k; i++) codes[i] = v.x8[(size_t)r * k + i];
        memcpy(d, v.d + (size_t)r * G, (size_t)G * sizeof(float));
        memcpy(sums, v.sum8 + (size_t)r * G, (size_t)G * sizeof(int32_t));
    } else {
        const w4_a16_view v = w4_a16_of(a);
        for (int32_t i = 0; i < k; i++) codes[i] = v.x16[(size_t)r * k + i];
        memcpy(d, v.d + (size_t)r * G, (size_t)G * sizeof(float));
        memcpy(sums, v.sum16 + (size_t)r * G, (size_t)G * sizeof(int32_t));
    }
}

START_TEST(test_act_gather) {
    static const int32_t shapes[][3] = {
        {7, 256, 64}, {13, 384, 128}, {1, 2048, 128}}; /* m, k, gs */
    for (int isa = 0; isa < EPYQ_ISA_COUNT; isa++) {
        const epyq_kern_table *kt = epyq_kern_for_isa((epyq_isa)isa);
        if (!kt) continue;
        for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
            for (int p = 0; p < 2; p++) {
                const int32_t m = shapes[sh][0], k = shapes[sh][1], gs = shapes[sh][2], G = k / gs;
                const int32_t n = 11;
                const epyq_numpath path = p ? EPYQ_PATH_A8 : EPYQ_PATH_A16;
                float *x = malloc((size_t)m * k * sizeof(float)),
                      *xs = malloc((size_t)n * k * sizeof(float));
                int32_t rows[11];
                void *ball = aligned_alloc(64, w4_align64(epyq_act_bytes(m, k, gs, path)));
                void *bg = aligned_alloc(64, w4_align64(epyq_act_bytes(n, k, gs, path)));
                void *bd = aligned_alloc(64, w4_align64(epyq_act_bytes(n, k, gs, path)));
                ck_assert(x && xs && ball && bg && bd);
                for (int32_t i = 0; i < m * k; i++) {
                    const uint64_t r = epyq_test_xorshift(&rng);
                    x[i] = (float)((double)(r >> 40) / 16777216.0 - 0.5) *
                           (r % 29 == 0 ? 40.0f : 1.0f);
                }
                for (int32_t r = 0; r < n; r++) {
                    rows[r] = (int32_t)(epyq_test_xorshift(&rng) % (uint64_t)m); /* repeats too */
                    memcpy(xs + (size_t)r * k, x + (size_t)rows[r] * k, (size_t)k * sizeof(float));
                }
                epyq_act all, gathered, direct;
                kt->act_prep(&all, x, m, k, gs, path, ball);
                memset(bg, 0x5a, epyq_act_bytes(n, k, gs, path));
                epyq_act_gather(&all, rows, n, bg, &gathered);
                kt->act_prep(&direct, xs, n, k, gs, path, bd);
                ck_assert(gathered.m == n && gathered.k == k && gathered.gs == gs &&
                          gathered.path == path && gathered.f32 == NULL && gathered.buf == bg);
                int32_t *c1 = malloc((size_t)k * sizeof(int32_t)),
                        *c2 = malloc((size_t)k * sizeof(int32_t));
                float d1[32], d2[32];
                int32_t s1[32], s2[32];
                ck_assert(c1 && c2 && G <= 32);
                for (int32_t r = 0; r < n; r++) {
                    act_row(&gathered, r, c1, d1, s1);
                    act_row(&direct, r, c2, d2, s2);
                    ck_assert_msg(!memcmp(c1, c2, (size_t)k * sizeof(int32_t)) &&
                                      !memcmp(d1, d2, (size_t)G * sizeof(float)) &&
                                      !memcmp(s1, s2, (size_t)G * sizeof(int32_t)),
                                  "%s act_gather %s m=%d k=%d gs=%d: row %d (batch row %d) differs "
                                  "from preparing it directly",
                                  kt->name, p ? "A8" : "A16", m, k, gs, r, rows[r]);
                }
                free(c1), free(c2), free(x), free(xs), free(ball), free(bg), free(bd);
            }
    }
}
END_TEST

static Suite *w4_act_suite(void) {
    Suite *s = suite_create("kern_w4_act");
    TCase *tc = epyq_test_case(s, "kernels", 60);
    EPYQ_TESTS_ADD(tc, test_silu_tables_match_ref, test_silu_ref_accuracy, test_act_gather);
    return s;
}

int main(void) { return epyq_test_run(w4_act_suite()); }
