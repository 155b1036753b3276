/* kernels-x86/avx512/w4_common.h — helpers shared by the AVX-512 int4 cores: broadcasting
 * 4 activation bytes from memory and writing one tile's 16 results to a slice of y.
 * Included only by files compiled with the AVX-512 flags. */
#ifndef EPYQ_W4_AVX512_COMMON_H
#define EPYQ_W4_AVX512_COMMON_H

#include <immintrin.h>
#include <string.h>

#include "kernels-x86/w4_layout.h"
#include "kernels-x86/w4_simd.h"

/* The 4 bytes at p in every 32-bit lane (folds into the {1to16} operand broadcast). */
W4_INLINE __m512i w4_bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* acc + VPDPBUSD(w, the 4 bytes at x4 broadcast). GCC 12 keeps the accumulators of an
 * unrolled row block in registers but copies each one before and after its VPDPBUSD (two
 * extra vector moves per multiply at 8 rows); the asm form ties the accumulator to its
 * register and folds the broadcast into the memory operand. clang needs no help. */
W4_INLINE __m512i w4_dpbusd_b(__m512i acc, __m512i w, const void *x4) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x4));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, w, w4_bcast32(x4));
#endif
}

/* The same for VDPBF16PS with a broadcast pair of bf16 at x2. */
W4_INLINE __m512 w4_dpbf16_b(__m512 acc, __m512i w, const void *x2) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x2));
    return acc;
#else
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)w4_bcast32(x2));
#endif
}

/* Rows [lo, hi) of tile `tile` (values v, lane = row - 16*tile) into yrow[row - n0]. */
W4_INLINE void w4_store_tile(float *yrow, int32_t n0, int32_t tile, int32_t lo, int32_t hi,
                             __m512 v) {
    const int32_t base = tile * W4_TILE;
    if (lo == base && hi == base + W4_TILE) {
        _mm512_storeu_ps(yrow + (base - n0), v);
    } else {
        float tmp[W4_TILE];
        _mm512_storeu_ps(tmp, v);
        memcpy(yrow + (lo - n0), tmp + (lo - base), (size_t)(hi - lo) * sizeof(float));
    }
}

#endif
