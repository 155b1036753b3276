/* kernels-x86/avx512/w4_bf16.c — int4 x bf16 (path A16) with VDPBF16PS.
 *
 *   y[j] = sum_g fma(s[j][g], sum_i (q[j][i] - 8) xb[i] - (z[j][g] - 8) sum(xb_g), .)
 * Per 64-byte block (16 rows x 8 k, layout in w4_layout.h): a shift by 4t puts codes
 * k0+t and k0+t+4 in the low nibbles of each lane's two 16-bit halves, and VPERMW (which
 * reads only the low 5 index bits, so no mask is needed) maps them through a 32-entry
 * table to the bf16 values q - 8. Four VDPBF16PS per block against broadcast pairs of
 * bf16 activations accumulate in fp32; each product is exact, so the result differs from
 * the ref twin only by fp32 summation order. The unpacked block is reused for up to MR_MAX
 * activation rows (stamped out per row count).
 * Error against the double-precision product (tests/kern/test_w4.c, measured): dominated
 * by the bf16 rounding of x. Worst |y - y_double| / sum_i |w_i x_i| = 2.2e-3 (bound 2^-8
 * plus fp32 summation); against the ref twin at most 4.6e-8 of C = sum_i |s| (|q - 8| +
 * |z - 8|) |xb_i| (summation order only); fused expert relative l2 error <= 4.0e-3. */
#include "kernels-x86/avx512/w4_common.h"
#include "kernels-x86/w4_impl.h"

#define MR_MAX 8 /* 2 x 8 accumulators + 4 unpacked vectors + table fill the registers */

/* bf16 bit patterns of (i & 15) - 8, for VPERMW's 5-bit index. */
static const uint16_t code_bf16[32] = {
    0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
    0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
};

W4_INLINE void a16_rows(const epyq_w4 *w, const uint8_t *tile, int32_t g0, int32_t g1,
                        const w4_a16_view *a, int32_t kx, int32_t t0, const int MR,
                        __m512 *facc) {
    /* Two accumulator chains per row whatever MR is: the chain count fixes the summation
     * order, and a row's result must not depend on how many rows share the call (batched
     * decode and --resume rely on it; tests/kern/test_w4.c checks it). Two chains keep a
     * single row above one core's share of DRAM bandwidth despite VDPBF16PS latency. */
    enum { NA = 4 };
    const int na = 2;
    const int32_t gs = w->gs, bpg = gs / W4_KBLK;
    const size_t rb = w4_rec_bytes(gs);
    const __m512i tbl = _mm512_loadu_si512(code_bf16);
    const uint8_t *zeros = w->asym ? w4_tile_zeros(w, tile) : NULL;
    __m512 f[W4_ROWS_MAX];
    W4_ROWS(MR, f[r] = _mm512_setzero_ps(););
    for (int32_t g = g0; g < g1; g++) {
        const uint8_t *rec = tile + (size_t)g * rb;
        const int32_t i0 = (g - g0) * gs;
        const uint16_t *xg = a->xb + (size_t)t0 * (size_t)kx + (size_t)i0;
        __m512 acc[W4_ROWS_MAX][NA];
        W4_ROWS(MR, acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps(););
        for (int32_t b = 0; b < bpg; b++) {
            const __m512i v = _mm512_loadu_si512(rec + (size_t)b * W4_BLOCK);
            _mm_prefetch((const char *)(rec + (size_t)b * W4_BLOCK + W4_PREFETCH), _MM_HINT_T0);
            const __m512i w0 = _mm512_permutexvar_epi16(v, tbl);
            const __m512i w1 = _mm512_permutexvar_epi16(_mm512_srli_epi32(v, 4), tbl);
            const __m512i w2 = _mm512_permutexvar_epi16(_mm512_srli_epi32(v, 8), tbl);
            const __m512i w3 = _mm512_permutexvar_epi16(_mm512_srli_epi32(v, 12), tbl);
            W4_ROWS(MR, {
                const uint16_t *xr = xg + (size_t)r * (size_t)kx + (size_t)b * W4_KBLK;
                acc[r][0] = w4_dpbf16_b(acc[r][0], w0, xr);
                acc[r][1] = w4_dpbf16_b(acc[r][1], w1, xr + 2);
                acc[r][na - 2] = w4_dpbf16_b(acc[r][na - 2], w2, xr + 4);
                acc[r][na - 1] = w4_dpbf16_b(acc[r][na - 1], w3, xr + 6);
            });
        }
        const __m512 s = _mm512_loadu_ps(rec + (size_t)bpg * W4_BLOCK);
        __m512 zf = _mm512_setzero_ps();
        if (zeros)
            zf = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                                   (const __m128i *)(zeros + (size_t)g * W4_TILE)))),
                               _mm512_set1_ps(8.0f));
        W4_ROWS(MR, {
            __m512 dot = _mm512_add_ps(acc[r][0], acc[r][1]);
            if (na == 4) dot = _mm512_add_ps(dot, _mm512_add_ps(acc[r][2], acc[r][3]));
            if (zeros)
                dot = _mm512_fnmadd_ps(zf, _mm512_set1_ps(w4_a16_group_sum(a, kx, t0 + r, i0, gs)),
                                       dot);
            f[r] = _mm512_fmadd_ps(s, dot, f[r]);
        });
    }
    W4_ROWS(MR, facc[r] = f[r];);
}

/* One activation row against NT consecutive tiles (see w4_tiles1_fn): per tile the same two
 * chains in the same order as a16_rows, so the same bits; NT tiles make NT weight streams. */
W4_INLINE void a16_tiles1(const epyq_w4 *w, const uint8_t *tile0, int32_t g0, int32_t g1,
                          const w4_a16_view *a, int32_t kx, size_t pf, const int NT,
                          __m512 *facc) {
    const int32_t gs = w->gs, bpg = gs / W4_KBLK;
    const size_t rb = w4_rec_bytes(gs), tb = w4_tile_bytes(w->k, gs, w->asym);
    const __m512i tbl = _mm512_loadu_si512(code_bf16);
    __m512 f[W4_ROWS_MAX]; /* W4_ROWS_MAX: see w4_simd.h */
    W4_ROWS(NT, f[r] = _mm512_setzero_ps(););
    for (int32_t g = g0; g < g1; g++) {
        const uint8_t *rec0 = tile0 + (size_t)g * rb;
        const int32_t i0 = (g - g0) * gs;
        const uint16_t *xg = a->xb + (size_t)i0;
        __m512 acc[W4_ROWS_MAX][2];
        W4_ROWS(NT, acc[r][0] = acc[r][1] = _mm512_setzero_ps(););
        for (int32_t b = 0; b < bpg; b++) {
            const uint16_t *xr = xg + (size_t)b * W4_KBLK;
            W4_ROWS(NT, {
                const uint8_t *p = rec0 + (size_t)r * tb + (size_t)b * W4_BLOCK;
                const __m512i v = _mm512_loadu_si512(p);
                _mm_prefetch((const char *)(p + pf), _MM_HINT_T0);
                acc[r][0] = w4_dpbf16_b(acc[r][0], _mm512_permutexvar_epi16(v, tbl), xr);
                acc[r][1] = w4_dpbf16_b(acc[r][1],
                                        _mm512_permutexvar_epi16(_mm512_srli_epi32(v, 4), tbl), xr + 2);
                acc[r][0] = w4_dpbf16_b(acc[r][0],
                                        _mm512_permutexvar_epi16(_mm512_srli_epi32(v, 8), tbl), xr + 4);
                acc[r][1] = w4_dpbf16_b(
                    acc[r][1], _mm512_permutexvar_epi16(_mm512_srli_epi32(v, 12), tbl), xr + 6);
            });
        }
        const __m512 gsum = w->asym ? _mm512_set1_ps(w4_a16_group_sum(a, kx, 0, i0, gs))
                                    : _mm512_setzero_ps();
        W4_ROWS(NT, {
            const uint8_t *tile = tile0 + (size_t)r * tb;
            const __m512 s = _mm512_loadu_ps(tile + (size_t)g * rb + (size_t)bpg * W4_BLOCK);
            __m512 dot = _mm512_add_ps(acc[r][0], acc[r][1]);
            if (w->asym) {
                const __m512 zf = _mm512_sub_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                        (const __m128i *)(w4_tile_zeros(w, tile) + (size_t)g * W4_TILE)))),
                    _mm512_set1_ps(8.0f));
                dot = _mm512_fnmadd_ps(zf, gsum, dot);
            }
            f[r] = _mm512_fmadd_ps(s, dot, f[r]);
        });
    }
    W4_ROWS(NT, facc[r] = f[r];);
}

#define A16_T1(NT)                                                                               \
    static void a16_tiles1_##NT(const epyq_w4 *w, const uint8_t *tile0, int32_t g0, int32_t g1, \
                                const void *a, int32_t kx, size_t pf, __m512 *facc) {           \
        a16_tiles1(w, tile0, g0, g1, (const w4_a16_view *)a, kx, pf, NT, facc);                  \
    }
A16_T1(1)
A16_T1(2)
A16_T1(3)
A16_T1(4)

static const w4_tiles1_fn a16_tiles1_of[W4_MULTI_NT + 1] = {NULL, a16_tiles1_1, a16_tiles1_2,
                                                            a16_tiles1_3, a16_tiles1_4};

#define A16_INST(MR)                                                                             \
    static void a16_rows_##MR(const epyq_w4 *w, const uint8_t *tile, int32_t g0, int32_t g1,    \
                              const void *a, int32_t kx, int32_t t0, __m512 *facc) {            \
        a16_rows(w, tile, g0, g1, (const w4_a16_view *)a, kx, t0, MR, facc);                     \
    }
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

void epyq_w4_core_a16_avx512bf16(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0,
                                 int32_t g1, const epyq_act *x, float *y, int32_t ldy,
                                 const float *rw) {
    const w4_a16_view a = w4_a16_of(x);
    w4_tiles_run(w, n0, n1, g0, g1, x, y, ldy, rw, &a, a16_rows_of, MR_MAX, a16_tiles1_of);
}

static const epyq_w4_cores cores_bf16 = {epyq_w4_core_a8_avx512vnni, epyq_w4_core_a16_avx512bf16,
                                         epyq_act_prep_ref};

void epyq_w4_gemm_avx512bf16(const epyq_w4 *w, int32_t n0, int32_t n1, const epyq_act *x,
                             float *y, int32_t ldy) {
    epyq_w4_gemm_with(&cores_bf16, w, n0, n1, x, y, ldy);
}

void epyq_w4_expert_avx512bf16(const epyq_w4 *gate, const epyq_w4 *up, const epyq_w4 *down,
                               int32_t i0, int32_t i1, const epyq_act *x, const float *rw,
                               float *y, int32_t ldy, void *scratch) {
    epyq_w4_expert_with(&cores_bf16, gate, up, down, i0, i1, x, rw, y, ldy, scratch);
}
