/* kernels-x86/avx512/w4_i16.c — int4 x int16 (path A16) with VPDPWSSD (AVX-512 VNNI).
 *
 *   y[j] = sum_g fma(s[j][g] * d[g], (float)(sum_i q[j][i] x16[i] - z[j][g] sum16[g]), .)
 * Per 64-byte block (16 rows x 8 k, layout in w4_layout.h): the codes of k0+t and k0+t+4
 * sit in the two 16-bit halves of each row's lane at bits 4t (t = 0..3), and four VPDPWSSD
 * against broadcast int16 pairs accumulate them in int32. No shuffles, and five operations
 * unpack a block (a16_unpack) where a shift and a mask per code took seven: the codes of
 * t = 1 and 3 are masked with 0x00f000f0 (of v and of v >> 8), i.e. taken 16 times over,
 * into an accumulator of their own that is shifted down by 4 when the group ends (exact:
 * every term is a multiple of 16). The integer dot is exact and the epilogue
 * matches the ref twin's operation for operation, so results are bit-identical to
 * ref/w4_ref.c (and to every other table's A16 core). The unpacked block is reused for up
 * to MR_MAX activation rows; one row walks W4_MULTI_NT tiles at once (w4_tiles1_fn).
 * Error against the double-precision product (tests/kern/test_w4.c, measured): the int16
 * rounding of x, at most half a step (amax_g / 65534) per element, so every element stays
 * inside sum_i |w_i| d_g(i) / 2 (+ fp32 slack) — about 2^-16 of the group's largest
 * activation, where bf16 rounding would cost 2^-9 of each activation. */
#include "kernels-x86/avx512/w4_common.h"
#include "kernels-x86/w4_impl.h"

#define MR_MAX 8 /* 2 x 8 accumulators + 8 results + the unpacked block fill the registers */

/* acc + VPDPWSSD(w, the int16 pair at x2 broadcast); see w4_dpbusd_b for the asm form. */
W4_INLINE __m512i w4_dpwssd_b(__m512i acc, __m512i w, const void *x2) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x2));
    return acc;
#else
    return _mm512_dpwssd_epi32(acc, w, w4_bcast32(x2));
#endif
}

/* The four code operands of block v: c[0], c[2] the codes of k0+0|4 and k0+2|6; c[1], c[3]
 * 16 times those of k0+1|5 and k0+3|7 (for w4_dot_x16's second accumulator). Bounds of that
 * accumulator over a group (gs <= 128: 16 blocks, 2 VPDPWSSD each, 2 products each):
 * 64 x 240 x 32767 < 2^29, so int32 holds it. */
W4_INLINE void a16_unpack(__m512i v, __m512i c[4]) {
    const __m512i lo = _mm512_set1_epi32(0x000f000f), hi = _mm512_set1_epi32(0x00f000f0);
    const __m512i u = _mm512_srli_epi32(v, 8);
    c[0] = _mm512_and_si512(v, lo);
    c[1] = _mm512_and_si512(v, hi);
    c[2] = _mm512_and_si512(u, lo);
    c[3] = _mm512_and_si512(u, hi);
}

/* facc[r] = 16 rows of W (one tile) . activation row t0 + r, for MR rows. */
W4_INLINE void a16_rows(const epyq_w4 *w, const uint8_t *tile, int32_t g0, int32_t g1,
                        const w4_a16_view *a, int32_t kx, int32_t t0, const int MR,
                        __m512 *facc) {
    const int32_t gs = w->gs, bpg = gs / W4_KBLK, Gx = kx / gs;
    const size_t rb = w4_rec_bytes(gs);
    const uint8_t *zeros = w->asym ? w4_tile_zeros(w, tile) : NULL;
    __m512 f[W4_ROWS_MAX];
    W4_ROWS(MR, f[r] = _mm512_setzero_ps(););
    for (int32_t g = g0; g < g1; g++) {
        const uint8_t *rec = tile + (size_t)g * rb;
        const int16_t *xg = a->x16 + (size_t)t0 * (size_t)kx + (size_t)(g - g0) * (size_t)gs;
        __m512i acc[W4_ROWS_MAX][2];
        W4_ROWS(MR, acc[r][0] = acc[r][1] = _mm512_setzero_si512(););
        for (int32_t b = 0; b < bpg; b++) {
            const __m512i v = _mm512_loadu_si512(rec + (size_t)b * W4_BLOCK);
            _mm_prefetch((const char *)(rec + (size_t)b * W4_BLOCK + W4_PREFETCH), EPYQ_PF_WEIGHTS);
            __m512i c[4];
            a16_unpack(v, c);
            /* rows 3q + s from base q (w4_dpwssd_row) */
            W4_ROWS(MR, {
                const int16_t *xq = xg + (size_t)(r / 3 * 3) * (size_t)kx + (size_t)b * W4_KBLK;
                const size_t st = (size_t)kx * sizeof(int16_t);
                acc[r][0] = w4_dpwssd_row(acc[r][0], c[0], xq, st, r % 3, 0);
                acc[r][1] = w4_dpwssd_row(acc[r][1], c[1], xq, st, r % 3, 4);
                acc[r][0] = w4_dpwssd_row(acc[r][0], c[2], xq, st, r % 3, 8);
                acc[r][1] = w4_dpwssd_row(acc[r][1], c[3], xq, st, r % 3, 12);
            });
        }
        W4_ROWS(MR, {
            const size_t tg = (size_t)(t0 + r) * (size_t)Gx + (size_t)(g - g0);
            f[r] = w4_int_epilogue(f[r], rec, bpg, zeros, g, w4_dot_x16(acc[r][0], acc[r][1]),
                                   a->d[tg], a->sum16[tg]);
        });
    }
    W4_ROWS(MR, facc[r] = f[r];);
}

/* One activation row against NT consecutive tiles (see w4_tiles1_fn). */
W4_INLINE void a16_tiles1(const epyq_w4 *w, const uint8_t *tile0, int32_t g0, int32_t g1,
                          const w4_a16_view *a, int32_t kx, size_t pf, const int NT,
                          __m512 *facc) {
    (void)kx; /* one row: the activation row stride is never needed */
    const int32_t gs = w->gs, bpg = gs / W4_KBLK;
    const size_t rb = w4_rec_bytes(gs), tb = w4_tile_bytes(w->k, gs, w->asym);
    __m512 f[W4_ROWS_MAX]; /* W4_ROWS_MAX: see w4_simd.h */
    W4_ROWS(NT, f[r] = _mm512_setzero_ps(););
    for (int32_t g = g0; g < g1; g++) {
        const uint8_t *rec0 = tile0 + (size_t)g * rb;
        const int16_t *xg = a->x16 + (size_t)(g - g0) * (size_t)gs;
        __m512i acc[W4_ROWS_MAX][2];
        W4_ROWS(NT, acc[r][0] = acc[r][1] = _mm512_setzero_si512(););
        for (int32_t b = 0; b < bpg; b++) {
            const int16_t *xr = xg + (size_t)b * W4_KBLK;
            W4_ROWS(NT, {
                const uint8_t *p = rec0 + (size_t)r * tb + (size_t)b * W4_BLOCK;
                const __m512i v = _mm512_loadu_si512(p);
                _mm_prefetch((const char *)(p + pf), EPYQ_PF_WEIGHTS);
                __m512i c[4];
                a16_unpack(v, c);
                acc[r][0] = w4_dpwssd_b(acc[r][0], c[0], xr);
                acc[r][1] = w4_dpwssd_b(acc[r][1], c[1], xr + 2);
                acc[r][0] = w4_dpwssd_b(acc[r][0], c[2], xr + 4);
                acc[r][1] = w4_dpwssd_b(acc[r][1], c[3], xr + 6);
            });
        }
        const size_t tg = (size_t)(g - g0);
        W4_ROWS(NT, {
            const uint8_t *tile = tile0 + (size_t)r * tb;
            f[r] = w4_int_epilogue(f[r], tile + (size_t)g * rb, bpg,
                                   w->asym ? w4_tile_zeros(w, tile) : NULL, g,
                                   w4_dot_x16(acc[r][0], acc[r][1]), a->d[tg], a->sum16[tg]);
        });
    }
    W4_ROWS(NT, facc[r] = f[r];);
}

#define A16_INST(MR) W4_ROWS_FN(a16_rows, a16_rows, w4_a16_view, MR)
A16_INST(1)
A16_INST(2)
A16_INST(3)
A16_INST(4)
A16_INST(5)
A16_INST(6)
A16_INST(7)
A16_INST(8)

static const w4_rows_fn a16_rows_of[MR_MAX + 1] = {NULL,       a16_rows_1, a16_rows_2,
                                                  a16_rows_3, a16_rows_4, a16_rows_5,
                                                  a16_rows_6, a16_rows_7, a16_rows_8};

W4_TILES1_TABLE(a16_tiles1, a16_tiles1, w4_a16_view)

void epyq_w4_core_a16_avx512vnni(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0,
                                 int32_t g1, const epyq_act *x, float *y, int32_t ldy,
                                 const float *rw) {
    const w4_a16_view a = w4_a16_of(x);
    w4_tiles_run(w, n0, n1, g0, g1, x, y, ldy, rw, &a, a16_rows_of, MR_MAX, a16_tiles1_of);
}
