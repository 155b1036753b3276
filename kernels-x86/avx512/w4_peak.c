/* kernels-x86/avx512/w4_peak.c — register-only loops that measure the instruction peak the
 * kernels are judged against (benchmarks/kernels): VPDPBUSD (int4 path A8), VPDPWSSD (int4
 * path A16), VDPBF16PS (bf16 GEMM) and fp32 VFMADD (the widening bf16_gemm_f32). 16 independent
 * accumulators cover the latency x issue width of every current core (Zen 4/5: 2 per cycle, latency
 * <= 6), so the loop runs at the issue limit and touches no memory. Each returns the number of int8
 * / bf16 operations it executed (a multiply-add counts 2), and folds the accumulators into *sink so
 * the loop cannot be optimised away. */
#include "kernels-x86/avx512/w4_common.h"
#include "kernels-x86/w4_impl.h"

/* 16 accumulators as separate variables (an array would be kept in memory at -O2). */
#define ACC16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

/* An integer VNNI peak loop: 16 chains of STEP_I (defined by the caller); ops_per is the
 * int operations one instruction performs (a multiply-add counts 2). */
#define INT_PEAK(ops_per)                                                              \
    do {                                                                                         \
        ACC16(DECL_I)                                                                            \
        for (uint64_t it = 0; it < iters; it++) {                                                \
            ACC16(STEP_I)                                                                        \
        }                                                                                        \
        __m512i s = _mm512_setzero_si512();                                                      \
        ACC16(SUM_I)                                                                             \
        *sink = _mm512_reduce_add_epi32(s);                                                      \
        return iters * 16u * (ops_per);                                                          \
    } while (0)
#define DECL_I(i) __m512i acc##i = _mm512_set1_epi32(i);
#define SUM_I(i) s = _mm512_add_epi32(s, acc##i);

uint64_t epyq_w4_peak_dpbusd_avx512vnni(uint64_t iters, int32_t *sink) {
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
#define STEP_I(i) acc##i = _mm512_dpbusd_epi32(acc##i, a, b);
    INT_PEAK(64u * 2u);
#undef STEP_I
}

uint64_t epyq_w4_peak_dpwssd_avx512vnni(uint64_t iters, int32_t *sink) {
    const __m512i a = _mm512_set1_epi16(3), b = _mm512_set1_epi16(-2);
#define STEP_I(i) acc##i = _mm512_dpwssd_epi32(acc##i, a, b);
    INT_PEAK(32u * 2u);
#undef STEP_I
}

/* The fp32-accumulator twin of INT_PEAK: 16 chains of STEP_F (defined by the caller). */
#define FLT_PEAK(ops_per)                                                                          \
    do {                                                                                           \
        ACC16(DECL_F)                                                                              \
        for (uint64_t it = 0; it < iters; it++) {                                                  \
            ACC16(STEP_F)                                                                          \
        }                                                                                          \
        __m512 s = _mm512_setzero_ps();                                                            \
        ACC16(SUM_F)                                                                               \
        *sink = _mm512_reduce_add_ps(s);                                                           \
        return iters * 16u * (ops_per);                                                            \
    } while (0)
#define DECL_F(i) __m512 acc##i = _mm512_set1_ps((float)(i));
#define SUM_F(i) s = _mm512_add_ps(s, acc##i);

uint64_t epyq_w4_peak_dpbf16_avx512bf16(uint64_t iters, float *sink) {
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
#define STEP_F(i) acc##i = _mm512_dpbf16_ps(acc##i, a, b);
    FLT_PEAK(32u * 2u);
#undef STEP_F
}

uint64_t epyq_w4_peak_fma_avx512(uint64_t iters, float *sink) {
    const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
#define STEP_F(i) acc##i = _mm512_fmadd_ps(acc##i, a, b);
    FLT_PEAK(16u * 2u);
#undef STEP_F
}
