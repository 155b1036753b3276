/* tests/kern/test_f32_gemm.c — f32_gemm (the chunked DeltaNet's small fp32 products) of every
 * table this host can run, against a double-precision product.
 *
 * C is laid out with padding columns and a padding row, all NaN or a sentinel; for SET the
 * m x n block starts as NaN too, so an element never written fails. Per element:
 *   |C - C64| <= (k + 2) u (sum_l |a_l b_l| + |C0|),  u = 2^-24,
 * the worst case of k - 1 accumulation roundings, one per product (none where fused) and one
 * for the add into C. A dropped term, a wrong row or column or a ragged tail read past the
 * edge misses by orders of magnitude. Shapes: random m in 1..70, n in 1..140, k in 0..140,
 * plus the DeltaNet chunk shapes (64 x 128 x 128, 64 x 64 x 128, 128 x 128 x 64). The seed
 * is fixed; a failure prints the case. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels-x86/kern.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

#define U32 (1.0 / 16777216.0) /* fp32 unit roundoff 2^-24 */

static uint64_t rng_state = 0x7f4a7c159e3779b9ull;

static float rnd_f(void) {
    return (float)((double)(epyq_test_xorshift(&rng_state) >> 11) / 4503599627370496.0 - 1.0);
}

static int rnd_range(int lo, int hi) {
    return lo + (int)((epyq_test_xorshift(&rng_state) >> 16) % (uint64_t)(hi - lo + 1));
}

static float *rnd_mat(size_t n) {
    float *p = malloc((n + 1) * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++) p[i] = rnd_f();
    return p;
}

static const char *op_name[] = {"set", "add", "sub"};

/* One product; returns the worst err / bound seen. */
static double gemm_case(const epyq_kern_table *t, int m, int n, int k, epyq_gemm_op op) {
    const int lda = k + 3, ldb = n + 5, ldc = n + 7;
    float *A = rnd_mat((size_t)m * lda + 1), *B = rnd_mat((size_t)(k ? k : 1) * ldb),
          *C = rnd_mat((size_t)(m + 1) * ldc);
    const float sentinel = 1234.5f;
    for (int i = 0; i <= m; i++)
        for (int j = 0; j < ldc; j++)
            if (i == m || j >= n) C[(size_t)i * ldc + j] = sentinel;
            else if (op == EPYQ_GEMM_SET)
                C[(size_t)i * ldc + j] = NAN;
    float *C0 = malloc((size_t)(m + 1) * ldc * sizeof *C0);
    ck_assert_ptr_nonnull(C0);
    memcpy(C0, C, (size_t)(m + 1) * ldc * sizeof *C0);
    t->f32_gemm(C, ldc, A, lda, B, ldb, m, n, k, op);
    double worst = 0.0;
    for (int i = 0; i <= m; i++)
        for (int j = 0; j < ldc; j++) {
            const float got = C[(size_t)i * ldc + j];
            if (i == m || j >= n) {
                ck_assert_msg(got == sentinel, "%s f32_gemm %s m=%d n=%d k=%d: wrote C[%d][%d]",
                              t->name, op_name[op], m, n, k, i, j);
                continue;
            }
            double dot = 0.0, mag = 0.0;
            for (int l = 0; l < k; l++) {
                const double p = (double)A[(size_t)i * lda + l] * B[(size_t)l * ldb + j];
                dot += p, mag += fabs(p);
            }
            const double c0 = op == EPYQ_GEMM_SET ? 0.0 : C0[(size_t)i * ldc + j];
            const double want = op == EPYQ_GEMM_SUB ? c0 - dot : c0 + dot;
            const double bound = (k + 2) * U32 * (mag + fabs(c0)) + 1e-37;
            const double err = fabs(got - want);
            ck_assert_msg(
                err <= bound,
                "%s f32_gemm %s m=%d n=%d k=%d: C[%d][%d] = %.9g, want %.9g (err %.3g > %.3g)",
                t->name, op_name[op], m, n, k, i, j, got, want, err, bound);
            if (err / bound > worst) worst = err / bound;
        }
    free(A), free(B), free(C), free(C0);
    return worst;
}

START_TEST(test_f32_gemm) {
    static const int fixed[][3] = {{64, 128, 128}, {64, 64, 128}, {128, 128, 64}, {1, 1, 1},
                                   {4, 64, 0},     {5, 17, 3},    {63, 65, 64}};
    for (int l = 0; l < EPYQ_ISA_COUNT; l++) {
        const epyq_kern_table *t = epyq_kern_for_isa((epyq_isa)l);
        if (!t) continue;
        double worst = 0.0, w;
        for (size_t c = 0; c < sizeof fixed / sizeof *fixed; c++)
            for (int op = 0; op < 3; op++)
                if ((w = gemm_case(t, fixed[c][0], fixed[c][1], fixed[c][2], (epyq_gemm_op)op)) >
                    worst)
                    worst = w;
        for (int c = 0; c < 150; c++) {
            const int m = rnd_range(1, 70), n = rnd_range(1, 140), k = rnd_range(0, 140);
            if ((w = gemm_case(t, m, n, k, (epyq_gemm_op)(c % 3))) > worst) worst = w;
        }
        printf("%-12s %-14s worst err/bound %.3g\n", t->name, "f32_gemm", worst);
    }
}
END_TEST

static Suite *gemm_suite(void) {
    Suite *s = suite_create("kern_f32_gemm");
    TCase *tc = epyq_test_case(s, "kernels", 120);
    EPYQ_TESTS_ADD(tc, test_f32_gemm);
    return s;
}

int main(void) { return epyq_test_run(gemm_suite()); }
