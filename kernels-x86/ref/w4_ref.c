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

/* e^x for x <= 0, the operations of the SIMD tables' exp_neg_poly with the degree-7 term
 * (kernels-x86/avx512/vec512.h):
 * fmaxf, nearbyintf, fmaf and ldexpf are each one correctly rounded step, as VMAXPS (NaN gives
 * the clamp), VRNDSCALEPS (nearest even), VFNMADD/VFMADD and VSCALEFPS are (2^n stays normal:
 * n >= -126 after the clamp). */
static float exp_neg_ref(float x) {
    x = fmaxf(x, -87.0f);
    const float n = nearbyintf(x * 1.44269504f);
    float r = fmaf(-n, 0.693145752f, x);
    r = fmaf(-n, 1.42860677e-6f, r);
    float p = fmaf(1.0f / 5040.0f, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return ldexpf(p, (int)n);
}

void epyq_silu_mul_ref(const float *g, const float *u, float *h, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const float s = g[i], e = exp_neg_ref(-fabsf(s));
        const float num = s < -87.0f ? 0.0f : s < 0.0f ? s * e : s;
        h[i] = num / (1.0f + e) * u[i];
    }
}

static const epyq_w4_cores cores_ref = {epyq_w4_core_a8_ref, epyq_w4_core_a16_ref,
                                        epyq_act_prep_ref, epyq_silu_mul_ref};

EPYQ_DEFINE_W4(ref, cores_ref)
