/* kernels-x86/w4_simd.h — code-generation helpers shared by the SIMD int4 files (no
 * intrinsics here, so every ISA's file can include it). */
#ifndef EPYQ_W4_SIMD_H
#define EPYQ_W4_SIMD_H

#include "kernels-x86/kern_impl.h" /* EPYQ_PF_WEIGHTS */

#define W4_INLINE static inline __attribute__((always_inline))

/* Runs the statements for r = 0 .. MR-1 (MR <= 16) with r a compile-time constant, so arrays
 * of registers indexed by r stay in registers with any compiler (a loop would rely on the
 * compiler choosing to unroll it fully; clang 14 at -O2 does not). */
/* Register arrays indexed by r are declared with W4_ROWS_MAX rows (unused ones cost nothing)
 * so the dead branches of W4_ROWS stay in bounds. */
#define W4_ROWS_MAX 16
#define W4_ROW_(MR, R, ...)                                                                      \
    if ((R) < (MR)) {                                                                            \
        enum { r = (R) };                                                                        \
        __VA_ARGS__                                                                              \
    }
#define W4_ROWS(MR, ...)                                                                         \
    do {                                                                                         \
        W4_ROW_(MR, 0, __VA_ARGS__) W4_ROW_(MR, 1, __VA_ARGS__) W4_ROW_(MR, 2, __VA_ARGS__)     \
        W4_ROW_(MR, 3, __VA_ARGS__) W4_ROW_(MR, 4, __VA_ARGS__) W4_ROW_(MR, 5, __VA_ARGS__)     \
        W4_ROW_(MR, 6, __VA_ARGS__) W4_ROW_(MR, 7, __VA_ARGS__) W4_ROW_(MR, 8, __VA_ARGS__)     \
        W4_ROW_(MR, 9, __VA_ARGS__) W4_ROW_(MR, 10, __VA_ARGS__) W4_ROW_(MR, 11, __VA_ARGS__)   \
        W4_ROW_(MR, 12, __VA_ARGS__) W4_ROW_(MR, 13, __VA_ARGS__) W4_ROW_(MR, 14, __VA_ARGS__)  \
        W4_ROW_(MR, 15, __VA_ARGS__)                                                             \
    } while (0)

/* Software prefetch distance in bytes along the weight stream (tiles are stored one after
 * another, so the stream is sequential). The hardware prefetcher alone left a single-thread
 * GEMV well below the read bandwidth: each 64-byte block carries ~8 instructions, so the
 * out-of-order window reaches only a few KiB ahead. */
#ifndef W4_PREFETCH
#define W4_PREFETCH 4096
#endif

#endif
