/* kernels-x86/avx512/act_avx512.c — the activation preparation of the int4 kernels in
 * AVX-512 F: the same rule as epyq_act_prep_ref (kernels-x86/w4_act.c), operation for
 * operation, so the same bytes (tests/kern/test_w4.c compares them):
 *   amax = max |x| over the group (NaN-free input: max is exact in any order),
 *   id = Q / amax and d = amax / Q as scalars, v = x * id, v = (v + 1.5 2^23) - 1.5 2^23
 *   (nearest even), clamp to +-Q, then the code at its permuted place in each 8-run
 *   (w4_layout.h) and the exact int32 sum. A prefill of 512 tokens prepares every linear's
 *   input, and the scalar loop took 10% of the prefill time. */
#include <immintrin.h>

#include "kernels-x86/w4_impl.h"
#include "kernels-x86/w4_layout.h"

/* One group of gs (a multiple of 16) values: codes to q (int8 or int16), returns the sum. */
static inline int32_t group_codes(const float *xg, int32_t gs, float qmax, int wide, void *q,
                                  float *d_out) {
    __m512 mx = _mm512_setzero_ps();
    for (int32_t i = 0; i < gs; i += 16) mx = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xg + i)), mx);
    const float amax = _mm512_reduce_max_ps(mx);
    const float id = amax > 0.0f ? qmax / amax : 0.0f;
    *d_out = amax / qmax;
    /* out[p] = in[idx[p]] within each 8-run: A8 puts elements 0,2,4,6 then 1,3,5,7; A16
     * interleaves 0,4,1,5,2,6,3,7 (the inverses of w4_a8_pos / w4_a16_pos). */
    const __m512i idx = wide ? _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15)
                             : _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    const __m512 vid = _mm512_set1_ps(id), magic = _mm512_set1_ps(0x1.8p23f);
    const __m512 hi = _mm512_set1_ps(qmax), lo = _mm512_set1_ps(-qmax);
    __m512i sum = _mm512_setzero_si512();
    for (int32_t i = 0; i < gs; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xg + i), vid);
        v = _mm512_sub_ps(_mm512_add_ps(v, magic), magic);
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        const __m512i c = _mm512_permutexvar_epi32(idx, _mm512_cvtps_epi32(v));
        sum = _mm512_add_epi32(sum, c);
        if (wide) _mm256_storeu_si256((__m256i *)((int16_t *)q + i), _mm512_cvtepi32_epi16(c));
        else _mm_storeu_si128((__m128i *)((int8_t *)q + i), _mm512_cvtepi32_epi8(c));
    }
    return _mm512_reduce_add_epi32(sum);
}

void epyq_act_prep_avx512(epyq_act *a, const float *x, int32_t m, int32_t k, int32_t gs,
                          epyq_numpath path, void *buf) {
    a->m = m, a->k = k, a->gs = gs, a->path = path, a->f32 = x, a->buf = buf;
    const int wide = path != EPYQ_PATH_A8;
    const int32_t G = k / gs;
    uint8_t *b = (uint8_t *)buf;
    float *d = (float *)(b + (wide ? w4_a16_off_d(m, k) : w4_a8_off_d(m, k)));
    int32_t *sums = (int32_t *)(b + (wide ? w4_a16_off_sum(m, k, gs) : w4_a8_off_sum(m, k, gs)));
    for (int32_t t = 0; t < m; t++)
        for (int32_t g = 0; g < G; g++) {
            const size_t off = (size_t)t * (size_t)k + (size_t)g * (size_t)gs;
            void *q = wide ? (void *)((int16_t *)b + off) : (void *)((int8_t *)b + off);
            const size_t tg = (size_t)t * (size_t)G + (size_t)g;
            sums[tg] = group_codes(x + off, gs, wide ? 32767.0f : 127.0f, wide, q, &d[tg]);
        }
}
