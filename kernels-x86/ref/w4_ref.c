/* kernels-x86/ref/w4_ref.c — plain-C twins of the int4 kernels: the test oracle.
 *
 *   y[j] = sum_g fma(s[j][g] * d[g], (float)(sum_i q[j][i] xq[i] - z[j][g] sumq[g]), .)
 *   with xq the int8 (A8) or int16 (A16) activations, d their step and sumq their sum per
 *   group. The integer dot is exact, and every SIMD core performs this same fp32 epilogue
 *   (multiply, convert, fused multiply-add, in group order), so their results equal this
 *   file's bit for bit, on both paths.
 * Error against the double-precision product of the unrounded x with the dequantised W:
 * see the bounds measured in tests/kern/test_w4.c and quoted in each SIMD file. */
#include <math.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/w4_impl.h"
#include "kernels-x86/w4_layout.h"

/* Code of row r (of its tile), k index i inside a group record. */
static inline int32_t code_at(const uint8_t *rec, int32_t r, int32_t i) {
    uint32_t word;
    memcpy(&word, rec + (size_t)(i / W4_KBLK) * W4_BLOCK + (size_t)r * 4, 4);
    return (int32_t)((word >> (4 * (i % W4_KBLK))) & 15u);
}

static inline float scale_at(const uint8_t *rec, int32_t gs, int32_t r) {
    float s;
    memcpy(&s, rec + (size_t)(gs / W4_KBLK) * W4_BLOCK + (size_t)r * sizeof(float), sizeof s);
    return s;
}

/* One core for both paths: xq holds int8 (wide = 0) or int16 activations. */
static void core_int_ref(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                         const epyq_act *x, float *y, int32_t ldy, const float *rw,
                         const void *xq, int wide, const float *d, const int32_t *sums) {
    const int32_t gs = w->gs, G = x->k / gs;
    const size_t rb = w4_rec_bytes(gs);
    for (int32_t j = n0; j < n1; j++) {
        const uint8_t *tile = w4_tile_ptr(w, j / W4_TILE);
        const int32_t r = j % W4_TILE;
        for (int32_t t = 0; t < x->m; t++) {
            float acc = 0.0f;
            for (int32_t g = g0; g < g1; g++) {
                const uint8_t *rec = tile + (size_t)g * rb;
                const size_t xg = (size_t)t * (size_t)x->k + (size_t)(g - g0) * (size_t)gs;
                int32_t dot = 0;
                for (int32_t i = 0; i < gs; i++) {
                    const size_t at = xg + (size_t)(i & ~7);
                    const int32_t xv = wide ? ((const int16_t *)xq)[at + (size_t)w4_a16_pos(i & 7)]
                                            : ((const int8_t *)xq)[at + (size_t)w4_a8_pos(i & 7)];
                    dot += code_at(rec, r, i) * xv;
                }
                const int32_t z =
                    w->asym ? w4_tile_zeros(w, tile)[(size_t)g * W4_TILE + (size_t)r] : 8;
                const size_t tg = (size_t)t * (size_t)G + (size_t)(g - g0);
                const float sd = scale_at(rec, gs, r) * d[tg];
                acc = fmaf(sd, (float)(dot - z * sums[tg]), acc);
            }
            y[(size_t)t * (size_t)ldy + (size_t)(j - n0)] = rw ? acc * rw[t] : acc;
        }
    }
}

void epyq_w4_core_a8_ref(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                         const epyq_act *x, float *y, int32_t ldy, const float *rw) {
    const w4_a8_view a = w4_a8_of(x);
    core_int_ref(w, n0, n1, g0, g1, x, y, ldy, rw, a.x8, 0, a.d, a.sum8);
}

void epyq_w4_core_a16_ref(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                          const epyq_act *x, float *y, int32_t ldy, const float *rw) {
    const w4_a16_view a = w4_a16_of(x);
    core_int_ref(w, n0, n1, g0, g1, x, y, ldy, rw, a.x16, 1, a.d, a.sum16);
}

static const epyq_w4_cores cores_ref = {epyq_w4_core_a8_ref, epyq_w4_core_a16_ref,
                                        epyq_act_prep_ref};

EPYQ_DEFINE_W4(ref, cores_ref)
