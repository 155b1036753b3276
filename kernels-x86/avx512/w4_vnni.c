/* kernels-x86/avx512/w4_vnni.c — int4 x int8 (path A8) with VPDPBUSD.
 *
 *   y[j] = sum_g fma(s[j][g] * d[g], (float)(sum_i q[j][i] x8[i] - z[j][g] sum8[g]), .)
 * Per 64-byte block (16 rows x 8 k, layout in w4_layout.h): one load and an AND give the
 * unsigned codes of k0+{0,2,4,6} in the 4 bytes of each row's lane; a second AND (0xf0)
 * leaves 16 times those of k0+{1,3,5,7} in place where an accumulator of their own takes
 * them (shifted down by 4 when the group ends: exact, every term is a multiple of 16), so
 * the unpack is two operations; with 5+ rows, whose one accumulator per row takes both, the
 * second code is shifted down first. Two VPDPBUSD against 4 broadcast int8 activations
 * accumulate them.
 * The unpacked block is reused for up to MR_MAX activation rows (the kernel is stamped
 * out per row count, ik_llama style), so at M = 32 the unpack is a small fraction of the
 * VPDPBUSD work. The integer dot is exact and the epilogue matches the ref twin's
 * operation for operation, so results are bit-identical to ref/w4_ref.c.
 * Error against the double-precision product (tests/kern/test_w4.c, measured): the int8
 * rounding of x dominates. Worst |y - y_double| / sum_i |w_i x_i| = 4.4e-2 on the test's
 * activations with outliers (1 in 64 elements 20x larger, which coarsens their group's
 * step); every element stays inside the analytic bound sum_i |w_i| d_g(i) / 2 (+ fp32
 * slack); the fused expert's relative l2 error on outlier-free inputs is <= 1.5e-2. */
#include "kernels-x86/avx512/w4_common.h"
#include "kernels-x86/w4_impl.h"

/* 12 rows: 12 accumulators + 12 results + the unpacked block fit the 32 registers; with 16
 * the compiler spilled, and M = 32 ran at about half the speed of 3 chunks of <= 12. */
#define MR_MAX 12

/* facc[r] = 16 rows of W (one tile) . activation row t0 + r, for MR rows. */
W4_INLINE void a8_rows(const epyq_w4 *w, const uint8_t *tile, int32_t g0, int32_t g1,
                       const w4_a8_view *a, int32_t kx, int32_t t0, const int MR,
                       __m512 *facc) {
    /* Independent chains per row: four when few rows (VPDPBUSD latency would otherwise cap
     * a GEMV below the memory speed), one when many (the rows give enough chains, and the
     * registers go to more rows: up to MR_MAX rows share one unpack of each block). */
    enum { NA = 4 };
    const int na = MR <= 2 ? 4 : MR <= 4 ? 2 : 1;
    const int32_t gs = w->gs, bpg = gs / W4_KBLK, Gx = kx / gs;
    const size_t rb = w4_rec_bytes(gs);
    const __m512i m0f = _mm512_set1_epi8(0x0f), mf0 = _mm512_set1_epi8((char)0xf0);
    const uint8_t *zeros = w->asym ? w4_tile_zeros(w, tile) : NULL;
    __m512 f[W4_ROWS_MAX]; /* W4_ROWS_MAX: see w4_simd.h */
    W4_ROWS(MR, f[r] = _mm512_setzero_ps(););
    for (int32_t g = g0; g < g1; g++) {
        const uint8_t *rec = tile + (size_t)g * rb;
        const int8_t *xg = a->x8 + (size_t)t0 * (size_t)kx + (size_t)(g - g0) * (size_t)gs;
        __m512i acc[W4_ROWS_MAX][NA];
        W4_ROWS(MR, acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_si512(););
        /* Few rows: two blocks per step into four chains; otherwise one block per step. */
        for (int32_t b = 0; b < bpg; b += na == 4 ? 2 : 1) {
            const __m512i v0 = _mm512_loadu_si512(rec + (size_t)b * W4_BLOCK);
            _mm_prefetch((const char *)(rec + (size_t)b * W4_BLOCK + W4_PREFETCH), EPYQ_PF_WEIGHTS);
            const __m512i lo0 = _mm512_and_si512(v0, m0f);
            const __m512i hi0 = na == 1 ? _mm512_and_si512(_mm512_srli_epi16(v0, 4), m0f)
                                        : _mm512_and_si512(v0, mf0);
            W4_ROWS(MR, {
                const int8_t *xq = xg + (size_t)(r / 3 * 3) * (size_t)kx + (size_t)b * W4_KBLK;
                acc[r][0] = w4_dpbusd_row(acc[r][0], lo0, xq, (size_t)kx, r % 3, 0);
                acc[r][na > 1] = w4_dpbusd_row(acc[r][na > 1], hi0, xq, (size_t)kx, r % 3, 4);
            });
            if (na == 4) {
                const __m512i v1 = _mm512_loadu_si512(rec + (size_t)(b + 1) * W4_BLOCK);
                _mm_prefetch((const char *)(rec + (size_t)(b + 1) * W4_BLOCK + W4_PREFETCH),
                             EPYQ_PF_WEIGHTS);
                const __m512i lo1 = _mm512_and_si512(v1, m0f);
                const __m512i hi1 = _mm512_and_si512(v1, mf0);
                W4_ROWS(MR, {
                    const int8_t *xq =
                        xg + (size_t)(r / 3 * 3) * (size_t)kx + (size_t)(b + 1) * W4_KBLK;
                    acc[r][2] = w4_dpbusd_row(acc[r][2], lo1, xq, (size_t)kx, r % 3, 0);
                    acc[r][3] = w4_dpbusd_row(acc[r][3], hi1, xq, (size_t)kx, r % 3, 4);
                });
            }
        }
        W4_ROWS(MR, {
            /* the 16x accumulators ([1], [3]): at most 16 blocks x 4 x 240 x 127 < 2^21 */
            const __m512i dot = na == 1   ? acc[r][0]
                                : na == 2 ? w4_dot_x16(acc[r][0], acc[r][1])
                                          : w4_dot_x16(_mm512_add_epi32(acc[r][0], acc[r][2]),
                                                       _mm512_add_epi32(acc[r][1], acc[r][3]));
            const size_t tg = (size_t)(t0 + r) * (size_t)Gx + (size_t)(g - g0);
            f[r] = w4_int_epilogue(f[r], rec, bpg, zeros, g, dot, a->d[tg], a->sum8[tg]);
        });
    }
    W4_ROWS(MR, facc[r] = f[r];);
}

/* One activation row against NT consecutive tiles (see w4_tiles1_fn): two chains per tile,
 * NT tiles give 2 NT independent VPDPBUSD chains and NT weight streams. The epilogue is
 * a8_rows's with MR = 1, so the results are the same bits. */
W4_INLINE void a8_tiles1(const epyq_w4 *w, const uint8_t *tile0, int32_t g0, int32_t g1,
                         const w4_a8_view *a, int32_t kx, size_t pf, const int NT,
                         __m512 *facc) {
    const int32_t gs = w->gs, bpg = gs / W4_KBLK;
    (void)kx; /* one row: the activation row stride is never needed */
    const size_t rb = w4_rec_bytes(gs), tb = w4_tile_bytes(w->k, gs, w->asym);
    const __m512i m0f = _mm512_set1_epi8(0x0f), mf0 = _mm512_set1_epi8((char)0xf0);
    __m512 f[W4_ROWS_MAX]; /* W4_ROWS_MAX: see w4_simd.h */
    W4_ROWS(NT, f[r] = _mm512_setzero_ps(););
    for (int32_t g = g0; g < g1; g++) {
        const uint8_t *rec0 = tile0 + (size_t)g * rb;
        const int8_t *xg = a->x8 + (size_t)(g - g0) * (size_t)gs;
        __m512i acc[W4_ROWS_MAX][2];
        W4_ROWS(NT, acc[r][0] = acc[r][1] = _mm512_setzero_si512(););
        for (int32_t b = 0; b < bpg; b++) {
            const int8_t *xr = xg + (size_t)b * W4_KBLK;
            W4_ROWS(NT, {
                const uint8_t *p = rec0 + (size_t)r * tb + (size_t)b * W4_BLOCK;
                const __m512i v = _mm512_loadu_si512(p);
                _mm_prefetch((const char *)(p + pf), EPYQ_PF_WEIGHTS);
                acc[r][0] = w4_dpbusd_b(acc[r][0], _mm512_and_si512(v, m0f), xr);
                acc[r][1] = w4_dpbusd_b(acc[r][1], _mm512_and_si512(v, mf0), xr + 4);
            });
        }
        const size_t tg = (size_t)(g - g0);
        W4_ROWS(NT, {
            const uint8_t *tile = tile0 + (size_t)r * tb;
            f[r] = w4_int_epilogue(f[r], tile + (size_t)g * rb, bpg,
                                   w->asym ? w4_tile_zeros(w, tile) : NULL, g,
                                   w4_dot_x16(acc[r][0], acc[r][1]), a->d[tg], a->sum8[tg]);
        });
    }
    W4_ROWS(NT, facc[r] = f[r];);
}

W4_TILES1_TABLE(a8_tiles1, a8_tiles1, w4_a8_view)

#define A8_INST(MR) W4_ROWS_FN(a8_rows, a8_rows, w4_a8_view, MR)
A8_INST(1)
A8_INST(2)
A8_INST(3)
A8_INST(4)
A8_INST(5)
A8_INST(6)
A8_INST(7)
A8_INST(8)
A8_INST(9)
A8_INST(10)
A8_INST(11)
A8_INST(12)

static const w4_rows_fn a8_rows_of[MR_MAX + 1] = {
    NULL,      a8_rows_1, a8_rows_2, a8_rows_3,  a8_rows_4,  a8_rows_5, a8_rows_6,
    a8_rows_7, a8_rows_8, a8_rows_9, a8_rows_10, a8_rows_11, a8_rows_12};

void epyq_w4_core_a8_avx512vnni(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0,
                                int32_t g1, const epyq_act *x, float *y, int32_t ldy,
                                const float *rw) {
    const w4_a8_view a = w4_a8_of(x);
    w4_tiles_run(w, n0, n1, g0, g1, x, y, ldy, rw, &a, a8_rows_of, MR_MAX, a8_tiles1_of);
}

static const epyq_w4_cores cores_vnni = {epyq_w4_core_a8_avx512vnni, epyq_w4_core_a16_avx512vnni,
                                         epyq_act_prep_avx512, epyq_silu_mul_avx512};

EPYQ_DEFINE_W4(avx512vnni, cores_vnni)
