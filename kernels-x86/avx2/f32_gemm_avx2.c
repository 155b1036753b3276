/* kernels-x86/avx2/f32_gemm_avx2.c — epyq_f32_gemm_avx2: the small fp32 matrix product of
 * kern.h (f32_gemm) with AVX2 + FMA.
 *
 * A register tile is up to 4 rows of C x 24 columns (3 vectors of 8: 12 accumulators, 3 B
 * vectors and a broadcast in the 16 ymm registers). Column blocks are the outer loop, so
 * B's k x 24 panel stays in L1 across the row tiles. Ragged n uses VMASKMOVPS (masked lanes
 * read as zero, are never written). Error bound: tests/kern/test_f32_gemm.c. */
#include <immintrin.h>

#include "kernels-x86/kern_impl.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define GM_R 4 /* rows of C per register tile */
#define GM_V 3 /* 8-lane vectors of C per register tile */

INLINE void gemm_tile(float *C, int32_t ldc, const float *A, int32_t lda, const float *B,
                      int32_t ldb, int32_t k, const __m256i mk[GM_V], epyq_gemm_op op,
                      const int R) {
    __m256 acc[GM_R][GM_V];
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int v = 0; v < GM_V; v++) acc[r][v] = _mm256_setzero_ps();
    }
    for (int32_t l = 0; l < k; l++) {
        const float *b = B + (size_t)l * (size_t)ldb;
        __m256 bv[GM_V];
        UNROLL
        for (int v = 0; v < GM_V; v++) bv[v] = _mm256_maskload_ps(b + 8 * v, mk[v]);
        UNROLL
        for (int r = 0; r < R; r++) {
            const __m256 a = _mm256_broadcast_ss(A + (size_t)r * (size_t)lda + (size_t)l);
            UNROLL
            for (int v = 0; v < GM_V; v++) acc[r][v] = _mm256_fmadd_ps(a, bv[v], acc[r][v]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        float *c = C + (size_t)r * (size_t)ldc;
        UNROLL
        for (int v = 0; v < GM_V; v++) {
            __m256 y = acc[r][v];
            if (op != EPYQ_GEMM_SET) {
                const __m256 c0 = _mm256_maskload_ps(c + 8 * v, mk[v]);
                y = op == EPYQ_GEMM_ADD ? _mm256_add_ps(c0, y) : _mm256_sub_ps(c0, y);
            }
            _mm256_maskstore_ps(c + 8 * v, mk[v], y);
        }
    }
}

void epyq_f32_gemm_avx2(float *C, int32_t ldc, const float *A, int32_t lda, const float *B,
                        int32_t ldb, int32_t m, int32_t n, int32_t k, epyq_gemm_op op) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int32_t j0 = 0; j0 < n; j0 += 8 * GM_V) {
        __m256i mk[GM_V];
        for (int v = 0; v < GM_V; v++) /* lane x is on while x < columns left in vector v */
            mk[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j0 - 8 * v), lane);
        const float *b = B + j0;
        int32_t i = 0;
        for (; i + GM_R <= m; i += GM_R)
            gemm_tile(C + (size_t)i * (size_t)ldc + (size_t)j0, ldc, A + (size_t)i * (size_t)lda,
                      lda, b, ldb, k, mk, op, GM_R);
        float *c = C + (size_t)i * (size_t)ldc + (size_t)j0;
        const float *a = A + (size_t)i * (size_t)lda;
        switch (m - i) {
        case 3: gemm_tile(c, ldc, a, lda, b, ldb, k, mk, op, 3); break;
        case 2: gemm_tile(c, ldc, a, lda, b, ldb, k, mk, op, 2); break;
        case 1: gemm_tile(c, ldc, a, lda, b, ldb, k, mk, op, 1); break;
        default: break;
        }
    }
}
