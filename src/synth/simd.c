/* src/synth/simd.c — AVX2 versions of the generator's two hot loops (normal draws, group
 * quantization), chosen at run time. They perform exactly the float and integer operations of the
 * scalar definitions in synth_int.h / quant.c, in the same order (no FMA contraction; min/max
 * and cvtps2dq round-to-nearest-even match the scalar compare-select and rne for the finite
 * values synth produces; the compilers do not contract a*b+c into FMA here, none is enabled),
 * so files do not depend on the CPU. test_synth checks both paths agree. */
#include <immintrin.h>

#include "synth/synth_int.h"

bool synth_no_simd;

static bool use_avx2(void) {
    static int have = -1;
    if (have < 0) have = __builtin_cpu_supports("avx2") ? 1 : 0;
    return have && !synth_no_simd;
}

#define AVX2 __attribute__((target("avx2")))

AVX2 static inline __m256i lowbias8(__m256i x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7FEB352D));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846CA68Bu));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

AVX2 static void fill_normal_avx2(uint64_t key, float mean, float sg, uint64_t i0, size_t n, float *out) {
    const uint32_t k0 = (uint32_t)key + (uint32_t)(i0 >> 32) * 0x632BE5ABu, step = (uint32_t)(key >> 32) | 1u;
    const __m256i m8 = _mm256_set1_epi32(0x00FF00FF), m16 = _mm256_set1_epi32(0xFFFF);
    const __m256i c510 = _mm256_set1_epi32(510), r7fff = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u), vstep8 = _mm256_set1_epi32((int)(8u * step));
    const __m256 scale = _mm256_set1_ps(1.0f / 147.80054f), vsg = _mm256_set1_ps(sg), vmean = _mm256_set1_ps(mean);
    /* lane j holds (i0 + o + j) * step + k0, advanced by 8 * step (mod 2^32) per iteration */
    uint32_t base = (uint32_t)i0 * step + k0;
    __m256i w = _mm256_setr_epi32((int)base, (int)(base + step), (int)(base + 2 * step), (int)(base + 3 * step),
                                  (int)(base + 4 * step), (int)(base + 5 * step), (int)(base + 6 * step),
                                  (int)(base + 7 * step));
    size_t o = 0;
    for (; o + 8 <= n; o += 8) {
        __m256i x = lowbias8(w);
        __m256i p = _mm256_add_epi32(_mm256_and_si256(x, m8), _mm256_and_si256(_mm256_srli_epi32(x, 8), m8));
        __m256i sum = _mm256_sub_epi32(_mm256_add_epi32(_mm256_and_si256(p, m16), _mm256_srli_epi32(p, 16)), c510);
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), scale);
        v = _mm256_add_ps(vmean, _mm256_mul_ps(vsg, v));
        __m256i u = _mm256_castps_si256(v); /* bf16 round to nearest even */
        u = _mm256_add_epi32(u, _mm256_add_epi32(r7fff, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
        _mm256_storeu_ps(out + o, _mm256_castsi256_ps(_mm256_and_si256(u, hi16)));
        w = _mm256_add_epi32(w, vstep8);
    }
    if (o < n) synth_fill_normal_scalar(key, mean, sg, i0 + o, n - o, out + o);
}

void synth_fill_normal_range(uint64_t key, float mean, float sg, uint64_t i0, size_t n, float *out) {
    if (!use_avx2()) {
        synth_fill_normal_scalar(key, mean, sg, i0, n, out);
        return;
    }
    while (n) { /* the vector path keeps the index's high word constant: split at 2^32 */
        uint64_t room = 0x100000000ull - (i0 & 0xFFFFFFFFull);
        size_t m = room < n ? (size_t)room : n;
        fill_normal_avx2(key, mean, sg, i0, m, out);
        i0 += m, out += m, n -= m;
    }
}

AVX2 static void minmax_avx2(const float *x, float *mn, float *mx) {
    __m256 lo = _mm256_loadu_ps(x), hi = lo;
    for (int i = 8; i < SYNTH_GS; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        lo = _mm256_min_ps(v, lo); /* = v < lo ? v : lo */
        hi = _mm256_max_ps(v, hi);
    }
    float l[8], h[8];
    _mm256_storeu_ps(l, lo);
    _mm256_storeu_ps(h, hi);
    for (int i = 1; i < 8; i++) { /* min/max of finite values do not depend on the order */
        l[0] = l[i] < l[0] ? l[i] : l[0];
        h[0] = h[i] > h[0] ? h[i] : h[0];
    }
    *mn = l[0], *mx = h[0];
}

void synth_minmax(const float *x, float *mn, float *mx) {
    if (use_avx2()) minmax_avx2(x, mn, mx);
    else synth_minmax_scalar(x, mn, mx);
}

/* 8 codes as int32, by the rule of synth_codes_scalar */
AVX2 static inline __m256i codes8(epyq_synth_format f, __m256 x, __m256 a, __m256i zz) {
    const __m256i z0 = _mm256_setzero_si256(), c15 = _mm256_set1_epi32(15), c8 = _mm256_set1_epi32(8);
    switch (f) {
    case EPYQ_SYNTH_GPTQ: {
        __m256i r = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_div_ps(x, a)), c8);
        return _mm256_min_epi32(_mm256_max_epi32(r, z0), c15);
    }
    case EPYQ_SYNTH_CT: {
        __m256i u = _mm256_castps_si256(_mm256_div_ps(x, a)); /* quotient rounded to bf16 */
        u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF),
                                                 _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
        __m256 t = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000u)));
        t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-8.0f)), _mm256_set1_ps(7.0f));
        return _mm256_add_epi32(_mm256_cvtps_epi32(t), c8);
    }
    case EPYQ_SYNTH_QUARK: {
        __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(x, a));
        return _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(r, _mm256_set1_epi32(-8)), _mm256_set1_epi32(7)), c8);
    }
    default: {
        __m256i r = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_div_ps(x, a)), zz);
        return _mm256_min_epi32(_mm256_max_epi32(r, z0), c15);
    }
    }
}

AVX2 static void codes_avx2(epyq_synth_format f, const float *x, float a, float zz, uint8_t *q) {
    const __m256 va = _mm256_set1_ps(a);
    const __m256i vz = _mm256_set1_epi32((int)zz), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int i = 0; i < SYNTH_GS; i += 32) {
        __m256i c0 = codes8(f, _mm256_loadu_ps(x + i), va, vz), c1 = codes8(f, _mm256_loadu_ps(x + i + 8), va, vz);
        __m256i c2 = codes8(f, _mm256_loadu_ps(x + i + 16), va, vz), c3 = codes8(f, _mm256_loadu_ps(x + i + 24), va, vz);
        /* packs work per 128-bit lane; the dword permute puts the 32 bytes back in order */
        __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(b, order));
    }
}

void synth_codes(epyq_synth_format f, const float *x, float a, float zz, uint8_t *q) {
    if (use_avx2()) codes_avx2(f, x, a, zz, q);
    else synth_codes_scalar(f, x, a, zz, q);
}
