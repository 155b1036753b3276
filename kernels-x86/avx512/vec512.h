/* kernels-x86/avx512/vec512.h — small AVX-512 helpers shared by the dense and attention
 * kernels of kernels-x86/avx512/ (private to that folder): forced inlining and unrolling,
 * bf16 -> fp32 widening and the softmax exp. */
#ifndef EPYQ_VEC512_H
#define EPYQ_VEC512_H

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))
/* Tile loops have compile-time trip counts after inlining; -O2 does not always unroll them,
 * and a rolled loop keeps the accumulators in memory instead of registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* bf16 lanes (16 x u16) -> fp32: a bf16 is the top half of the fp32 with the same bits. */
INLINE __m512 widen_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* e^x for x <= 0 (softmax arguments): x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of
 * ln2), e^r by its degree-6 Taylor polynomial (truncation < 1.2e-7 relative, ~1 ulp), then
 * scaled by 2^n with VSCALEFPS. Arguments below -87 are clamped: their true value is below
 * 1e-38, i.e. zero next to the block maximum's weight of 1. deg7 (a constant) adds the next
 * term (truncation < 5e-9): SiLU takes it, the softmax keeps the shorter form. */
INLINE __m512 exp_neg_poly(__m512 x, const int deg7) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    if (deg7) p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 5040.0f), r, p);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
INLINE __m512 exp_neg(__m512 x) { return exp_neg_poly(x, 0); }

#endif
