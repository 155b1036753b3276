/* kernels-x86/avx2/fill_quant_avx2.c — AVX2 versions of the counter-based normal fill, the
 * min/max scan and the int4 rounding rules (kern.h fill_normal, minmax, quant_codes).
 *
 * They perform exactly the fp32 and integer operations of the plain-C twins in
 * ref/fill_quant_ref.c, in the same order, so every table gives the same bits:
 *   - no FMA: the product and the sum of fill_normal are separate intrinsics (the build is
 *     ISO C, where gcc does not contract, and clang contracts only within one expression);
 *   - min/max compare-select as the scalar scan does, and the minimum of NaN-free values
 *     does not depend on the order of the scan;
 *   - cvtps2dq rounds half to even like the scalar rne(), and the integer clamps give the
 *     scalar float clamps' codes for every |t| < 2^31.
 * Tails shorter than a vector go to the ref twins. tests/kern/test_fill_quant.c checks
 * every table against ref bit for bit. */
#include <immintrin.h>

#include "kernels-x86/kern_impl.h"

#define INLINE static inline __attribute__((always_inline))

/* epyq_rng_hash32 on 8 lanes */
INLINE __m256i hash32x8(__m256i x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7FEB352D));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846CA68Bu));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* A run of indices [i0, i0 + n) sharing the high word of i0 (what epyq_rng_bits needs). */
static void fill_run(uint64_t key, float mean, float sigma, uint64_t i0, size_t n, float *out) {
    const uint32_t k0 = (uint32_t)key + (uint32_t)(i0 >> 32) * 0x632BE5ABu;
    const uint32_t step = (uint32_t)(key >> 32) | 1u;
    const __m256i m8 = _mm256_set1_epi32(0x00FF00FF), m16 = _mm256_set1_epi32(0xFFFF);
    const __m256i c510 = _mm256_set1_epi32(510), r7fff = _mm256_set1_epi32(0x7FFF);
    const __m256i one = _mm256_set1_epi32(1), hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i vstep8 = _mm256_set1_epi32((int)(8u * step));
    const __m256 scale = _mm256_set1_ps(1.0f / 147.80054f), vsg = _mm256_set1_ps(sigma);
    const __m256 vmean = _mm256_set1_ps(mean);
    /* lane j holds (i0 + o + j) * step + k0, advanced by 8 * step (mod 2^32) per iteration */
    const uint32_t base = (uint32_t)i0 * step + k0;
    __m256i w = _mm256_setr_epi32((int)base, (int)(base + step), (int)(base + 2 * step),
                                  (int)(base + 3 * step), (int)(base + 4 * step),
                                  (int)(base + 5 * step), (int)(base + 6 * step),
                                  (int)(base + 7 * step));
    size_t o = 0;
    for (; o + 8 <= n; o += 8) {
        const __m256i x = hash32x8(w);
        const __m256i p = _mm256_add_epi32(_mm256_and_si256(x, m8),
                                           _mm256_and_si256(_mm256_srli_epi32(x, 8), m8));
        const __m256i sum = _mm256_sub_epi32(
            _mm256_add_epi32(_mm256_and_si256(p, m16), _mm256_srli_epi32(p, 16)), c510);
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), scale);
        v = _mm256_add_ps(vmean, _mm256_mul_ps(vsg, v));
        __m256i u = _mm256_castps_si256(v); /* bf16 round to nearest even */
        u = _mm256_add_epi32(u, _mm256_add_epi32(r7fff, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
        _mm256_storeu_ps(out + o, _mm256_castsi256_ps(_mm256_and_si256(u, hi16)));
        w = _mm256_add_epi32(w, vstep8);
    }
    if (o < n) epyq_fill_normal_ref(key, mean, sigma, i0 + o, n - o, out + o);
}

void epyq_fill_normal_avx2(uint64_t key, float mean, float sigma, uint64_t i0, size_t n,
                           float *out) {
    while (n) { /* split where the index's high word changes */
        const uint64_t room = 0x100000000ull - (i0 & 0xFFFFFFFFull);
        const size_t m = room < n ? (size_t)room : n;
        fill_run(key, mean, sigma, i0, m, out);
        i0 += m, out += m, n -= m;
    }
}

void epyq_minmax_avx2(const float *x, size_t n, float *mn, float *mx) {
    if (n < 8) {
        epyq_minmax_ref(x, n, mn, mx);
        return;
    }
    __m256 lo = _mm256_loadu_ps(x), hi = lo;
    size_t i = 8;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        lo = _mm256_min_ps(v, lo); /* = v < lo ? v : lo */
        hi = _mm256_max_ps(v, hi);
    }
    float l[8], h[8];
    _mm256_storeu_ps(l, lo);
    _mm256_storeu_ps(h, hi);
    for (int j = 1; j < 8; j++) {
        l[0] = l[j] < l[0] ? l[j] : l[0];
        h[0] = h[j] > h[0] ? h[j] : h[0];
    }
    for (; i < n; i++) {
        l[0] = x[i] < l[0] ? x[i] : l[0];
        h[0] = x[i] > h[0] ? x[i] : h[0];
    }
    *mn = l[0], *mx = h[0];
}

/* 8 codes as int32 by `rule` (kern.h epyq_q4_round) */
INLINE __m256i codes8(epyq_q4_round rule, __m256 x, __m256 a, __m256i z) {
    const __m256i z0 = _mm256_setzero_si256(), c15 = _mm256_set1_epi32(15);
    const __m256i c8 = _mm256_set1_epi32(8);
    switch (rule) {
    case EPYQ_Q4_ROUND_DIV_BF16: {
        __m256i u = _mm256_castps_si256(_mm256_div_ps(x, a)); /* quotient rounded to bf16 */
        u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF),
                                                 _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
        __m256 t = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000u)));
        t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-8.0f)), _mm256_set1_ps(7.0f));
        return _mm256_add_epi32(_mm256_cvtps_epi32(t), c8);
    }
    case EPYQ_Q4_ROUND_MUL_SYM: {
        const __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(x, a));
        return _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(r, _mm256_set1_epi32(-8)),
                                                 _mm256_set1_epi32(7)), c8);
    }
    case EPYQ_Q4_ROUND_DIV:
    default: {
        const __m256i r = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_div_ps(x, a)), z);
        return _mm256_min_epi32(_mm256_max_epi32(r, z0), c15);
    }
    }
}

void epyq_quant_codes_avx2(const float *x, size_t n, float a, float z, epyq_q4_round rule,
                           uint8_t *q) {
    const __m256 va = _mm256_set1_ps(a);
    const __m256i vz = _mm256_set1_epi32((int)z), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i c0 = codes8(rule, _mm256_loadu_ps(x + i), va, vz);
        const __m256i c1 = codes8(rule, _mm256_loadu_ps(x + i + 8), va, vz);
        const __m256i c2 = codes8(rule, _mm256_loadu_ps(x + i + 16), va, vz);
        const __m256i c3 = codes8(rule, _mm256_loadu_ps(x + i + 24), va, vz);
        /* packs work per 128-bit lane; the dword permute puts the 32 bytes back in order */
        const __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(b, order));
    }
    if (i < n) epyq_quant_codes_ref(x + i, n - i, a, z, rule, q + i);
}
