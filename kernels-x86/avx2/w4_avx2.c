/* kernels-x86/avx2/w4_avx2.c — int4 kernels for AVX2 + FMA (Haswell+, Zen 1-3; also used
 * by the avx512 level, whose F/BW set has no faster int4 product than these).
 *
 * Same packed layout as the AVX-512 cores (w4_layout.h); a 64-byte block is two 256-bit
 * halves (tile rows 0-7 and 8-15).
 *   A8 : VPMADDUBSW (u8 codes x s8 activations, pairs to int16: at most 2*15*127, no
 *        saturation) and VPMADDWD by 1 to int32 replace VPDPBUSD; the integer dot is exact
 *        and the fp32 epilogue is the ref twin's, so results equal ref bit for bit.
 *        Error vs double: that of the A8 path (see avx512/w4_vnni.c).
 *   A16: VPMADDWD (codes as int16 pairs x int16 activations, to int32) replaces VPDPWSSD;
 *        exact, with the ref twin's epilogue, so again equal to ref bit for bit.
 *        Error vs double: that of the A16 path (see avx512/w4_vnni.c).
 * Fewer registers (16) than AVX-512 allow fewer activation rows per weight unpack. */
#include <immintrin.h>
#include <string.h>

#include "kernels-x86/w4_impl.h"
#include "kernels-x86/w4_layout.h"
#include "kernels-x86/w4_simd.h"

#define A8_MR 4
#define A16_MR 4

W4_INLINE __m256i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* Rows [lo, hi) of tile `tile`, lanes in two halves, into yrow[row - n0]. */
static void store_tile(float *yrow, int32_t n0, int32_t tile, int32_t lo, int32_t hi,
                       __m256 v0, __m256 v1, float rw) {
    float tmp[W4_TILE];
    _mm256_storeu_ps(tmp, _mm256_mul_ps(v0, _mm256_set1_ps(rw)));
    _mm256_storeu_ps(tmp + 8, _mm256_mul_ps(v1, _mm256_set1_ps(rw)));
    const int32_t base = tile * W4_TILE;
    memcpy(yrow + (lo - n0), tmp + (lo - base), (size_t)(hi - lo) * sizeof(float));
}

/* Zero points of 8 rows as int32 (8 when symmetric). */
W4_INLINE __m256i zeros8(const uint8_t *zeros, int32_t g, int h) {
    if (!zeros) return _mm256_set1_epi32(8);
    return _mm256_cvtepu8_epi32(
        _mm_loadl_epi64((const __m128i *)(zeros + (size_t)g * W4_TILE + (size_t)h * 8)));
}

W4_INLINE void a8_rows(const epyq_w4 *w, const uint8_t *tile, int32_t g0, int32_t g1,
                       const w4_a8_view *a, int32_t kx, int32_t t0, const int MR,
                       __m256 (*facc)[2]) {
    const int32_t gs = w->gs, bpg = gs / W4_KBLK, Gx = kx / gs;
    const size_t rb = w4_rec_bytes(gs);
    const __m256i m0f = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const uint8_t *zeros = w->asym ? w4_tile_zeros(w, tile) : NULL;
    W4_ROWS(MR, facc[r][0] = facc[r][1] = _mm256_setzero_ps(););
    for (int32_t g = g0; g < g1; g++) {
        const uint8_t *rec = tile + (size_t)g * rb;
        const int8_t *xg = a->x8 + (size_t)t0 * (size_t)kx + (size_t)(g - g0) * (size_t)gs;
        __m256i acc[W4_ROWS_MAX][2];
        W4_ROWS(MR, acc[r][0] = acc[r][1] = _mm256_setzero_si256(););
        for (int32_t b = 0; b < bpg; b++) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)(rec + (size_t)b * W4_BLOCK));
            const __m256i v1 =
                _mm256_loadu_si256((const __m256i *)(rec + (size_t)b * W4_BLOCK + 32));
            _mm_prefetch((const char *)(rec + (size_t)b * W4_BLOCK + W4_PREFETCH), EPYQ_PF_WEIGHTS);
            const __m256i lo0 = _mm256_and_si256(v0, m0f);
            const __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m0f);
            const __m256i lo1 = _mm256_and_si256(v1, m0f);
            const __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m0f);
            W4_ROWS(MR, {
                const int8_t *xr = xg + (size_t)r * (size_t)kx + (size_t)b * W4_KBLK;
                const __m256i xl = bcast32(xr), xh = bcast32(xr + 4);
                const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo0, xl),
                                                    _mm256_maddubs_epi16(hi0, xh));
                const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo1, xl),
                                                    _mm256_maddubs_epi16(hi1, xh));
                acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
                acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
            });
        }
        for (int h = 0; h < 2; h++) {
            const __m256 s = _mm256_loadu_ps((const float *)(rec + (size_t)bpg * W4_BLOCK) + 8 * h);
            const __m256i z = zeros8(zeros, g, h);
            W4_ROWS(MR, {
                const size_t tg = (size_t)(t0 + r) * (size_t)Gx + (size_t)(g - g0);
                const __m256i corr = _mm256_sub_epi32(
                    acc[r][h], _mm256_mullo_epi32(z, _mm256_set1_epi32(a->sum8[tg])));
                const __m256 sd = _mm256_mul_ps(s, _mm256_set1_ps(a->d[tg]));
                facc[r][h] = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(corr), facc[r][h]);
            });
        }
    }
}

W4_INLINE void a16_rows(const epyq_w4 *w, const uint8_t *tile, int32_t g0, int32_t g1,
                        const w4_a16_view *a, int32_t kx, int32_t t0, const int MR,
                        __m256 (*facc)[2]) {
    const int32_t gs = w->gs, bpg = gs / W4_KBLK, Gx = kx / gs;
    const size_t rb = w4_rec_bytes(gs);
    const __m256i m0f = _mm256_set1_epi32(0x000f000f);
    const uint8_t *zeros = w->asym ? w4_tile_zeros(w, tile) : NULL;
    W4_ROWS(MR, facc[r][0] = facc[r][1] = _mm256_setzero_ps(););
    for (int32_t g = g0; g < g1; g++) {
        const uint8_t *rec = tile + (size_t)g * rb;
        const int16_t *xg = a->x16 + (size_t)t0 * (size_t)kx + (size_t)(g - g0) * (size_t)gs;
        __m256i acc[W4_ROWS_MAX][2];
        W4_ROWS(MR, acc[r][0] = acc[r][1] = _mm256_setzero_si256(););
        for (int32_t b = 0; b < bpg; b++) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)(rec + (size_t)b * W4_BLOCK));
            const __m256i v1 =
                _mm256_loadu_si256((const __m256i *)(rec + (size_t)b * W4_BLOCK + 32));
            _mm_prefetch((const char *)(rec + (size_t)b * W4_BLOCK + W4_PREFETCH), EPYQ_PF_WEIGHTS);
            /* Step p: codes k0+p (low half) and k0+p+4 (high half) against x16 pair p. */
#define A16_STEP(P)                                                                              \
    do {                                                                                         \
        const __m256i c0 = _mm256_and_si256(_mm256_srli_epi32(v0, 4 * (P)), m0f);               \
        const __m256i c1 = _mm256_and_si256(_mm256_srli_epi32(v1, 4 * (P)), m0f);               \
        W4_ROWS(MR, {                                                                            \
            const __m256i xv = bcast32(xg + (size_t)r * (size_t)kx + (size_t)b * W4_KBLK + 2 * (P)); \
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(c0, xv));                  \
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(c1, xv));                  \
        });                                                                                      \
    } while (0)
            A16_STEP(0);
            A16_STEP(1);
            A16_STEP(2);
            A16_STEP(3);
#undef A16_STEP
        }
        for (int h = 0; h < 2; h++) {
            const __m256 s = _mm256_loadu_ps((const float *)(rec + (size_t)bpg * W4_BLOCK) + 8 * h);
            const __m256i z = zeros8(zeros, g, h);
            W4_ROWS(MR, {
                const size_t tg = (size_t)(t0 + r) * (size_t)Gx + (size_t)(g - g0);
                const __m256i corr = _mm256_sub_epi32(
                    acc[r][h], _mm256_mullo_epi32(z, _mm256_set1_epi32(a->sum16[tg])));
                const __m256 sd = _mm256_mul_ps(s, _mm256_set1_ps(a->d[tg]));
                facc[r][h] = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(corr), facc[r][h]);
            });
        }
    }
}

#define INST(KIND, VIEW, MR)                                                                     \
    static void KIND##_rows_##MR(const epyq_w4 *w, const uint8_t *tile, int32_t g0, int32_t g1, \
                                 const VIEW *a, int32_t kx, int32_t t0, __m256 (*facc)[2]) {    \
        KIND##_rows(w, tile, g0, g1, a, kx, t0, MR, facc);                                       \
    }
INST(a8, w4_a8_view, 1)
INST(a8, w4_a8_view, 2)
INST(a8, w4_a8_view, 3)
INST(a8, w4_a8_view, 4)
INST(a16, w4_a16_view, 1)
INST(a16, w4_a16_view, 2)
INST(a16, w4_a16_view, 3)
INST(a16, w4_a16_view, 4)

typedef void (*a8_fn)(const epyq_w4 *, const uint8_t *, int32_t, int32_t, const w4_a8_view *,
                      int32_t, int32_t, __m256 (*)[2]);
typedef void (*a16_fn)(const epyq_w4 *, const uint8_t *, int32_t, int32_t, const w4_a16_view *,
                       int32_t, int32_t, __m256 (*)[2]);
static const a8_fn a8_of[A8_MR + 1] = {NULL, a8_rows_1, a8_rows_2, a8_rows_3, a8_rows_4};
static const a16_fn a16_of[A16_MR + 1] = {NULL, a16_rows_1, a16_rows_2, a16_rows_3, a16_rows_4};

/* The tile/row-chunk loop shared by both paths. */
#define TILE_LOOP(MRMAX, CALL)                                                                   \
    for (int32_t tile = n0 / W4_TILE; tile * W4_TILE < n1; tile++) {                             \
        const uint8_t *tp = w4_tile_ptr(w, tile);                                                \
        const int32_t lo = tile * W4_TILE > n0 ? tile * W4_TILE : n0;                            \
        const int32_t hi = tile * W4_TILE + W4_TILE < n1 ? tile * W4_TILE + W4_TILE : n1;        \
        for (int32_t t0 = 0; t0 < x->m; t0 += MRMAX) {                                           \
            const int mr = x->m - t0 < MRMAX ? x->m - t0 : MRMAX;                                \
            __m256 facc[MRMAX][2];                                                               \
            CALL;                                                                                \
            for (int r = 0; r < mr; r++)                                                         \
                store_tile(y + (size_t)(t0 + r) * (size_t)ldy, n0, tile, lo, hi, facc[r][0],     \
                           facc[r][1], rw ? rw[t0 + r] : 1.0f);                                  \
        }                                                                                        \
    }

void epyq_w4_core_a8_avx2(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                          const epyq_act *x, float *y, int32_t ldy, const float *rw) {
    const w4_a8_view a = w4_a8_of(x);
    TILE_LOOP(A8_MR, a8_of[mr](w, tp, g0, g1, &a, x->k, t0, facc))
}

void epyq_w4_core_a16_avx2(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                           const epyq_act *x, float *y, int32_t ldy, const float *rw) {
    const w4_a16_view a = w4_a16_of(x);
    TILE_LOOP(A16_MR, a16_of[mr](w, tp, g0, g1, &a, x->k, t0, facc))
}

static const epyq_w4_cores cores_avx2 = {epyq_w4_core_a8_avx2, epyq_w4_core_a16_avx2,
                                         epyq_act_prep_ref, epyq_silu_mul_avx2};

EPYQ_DEFINE_W4(avx2, cores_avx2)
