/* kernels-x86/avx512/f32_gemm_avx512.c — epyq_f32_gemm_avx512: the small fp32 matrix product
 * of kern.h (f32_gemm) for the chunked DeltaNet's 64 x 128 x 128 steps.
 *
 * A register tile is up to 4 rows of C x 64 columns (4 vectors, 16 accumulators): per l it
 * loads 4 vectors of B's row l and broadcasts 4 elements of A, 16 FMAs for 8 loads. Column
 * blocks of 64 are the outer loop, so the k x 64 panel of B (32 KiB at k = 128) stays in L1
 * while every row tile of A passes over it. Ragged n uses masked loads and stores (zero lanes
 * add nothing); ragged m a shorter tile. Error bound: tests/kern/test_f32_gemm.c. */
#include <immintrin.h>

#include "kernels-x86/avx512/vec512.h"
#include "kernels-x86/kern_impl.h"

#define GM_R 4 /* rows of C per register tile */
#define GM_V 4 /* 16-lane vectors of C per register tile */

INLINE void gemm_tile(float *C, int32_t ldc, const float *A, int32_t lda, const float *B,
                      int32_t ldb, int32_t k, const __mmask16 mk[GM_V], epyq_gemm_op op,
                      const int R) {
    __m512 acc[GM_R][GM_V];
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int v = 0; v < GM_V; v++) acc[r][v] = _mm512_setzero_ps();
    }
    for (int32_t l = 0; l < k; l++) {
        const float *b = B + (size_t)l * (size_t)ldb;
        __m512 bv[GM_V];
        UNROLL
        for (int v = 0; v < GM_V; v++) bv[v] = _mm512_maskz_loadu_ps(mk[v], b + 16 * v);
        UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(A[(size_t)r * (size_t)lda + (size_t)l]);
            UNROLL
            for (int v = 0; v < GM_V; v++) acc[r][v] = _mm512_fmadd_ps(a, bv[v], acc[r][v]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        float *c = C + (size_t)r * (size_t)ldc;
        UNROLL
        for (int v = 0; v < GM_V; v++) {
            __m512 y = acc[r][v];
            if (op != EPYQ_GEMM_SET) {
                const __m512 c0 = _mm512_maskz_loadu_ps(mk[v], c + 16 * v);
                y = op == EPYQ_GEMM_ADD ? _mm512_add_ps(c0, y) : _mm512_sub_ps(c0, y);
            }
            _mm512_mask_storeu_ps(c + 16 * v, mk[v], y);
        }
    }
}

void epyq_f32_gemm_avx512(float *C, int32_t ldc, const float *A, int32_t lda, const float *B,
                          int32_t ldb, int32_t m, int32_t n, int32_t k, epyq_gemm_op op) {
    for (int32_t j0 = 0; j0 < n; j0 += 16 * GM_V) {
        __mmask16 mk[GM_V];
        for (int v = 0; v < GM_V; v++) {
            const int32_t left = n - j0 - 16 * v;
            mk[v] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        }
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
