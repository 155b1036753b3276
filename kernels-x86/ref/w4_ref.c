/* kernels-x86/ref/w4_ref.c — plain-C twins of the int4 kernels: the test oracle.
 *
 *   A8 : y[j] = sum_g fma(s[j][g] * d[g], (float)(sum_i q[j][i] x8[i] - z[j][g] sum8[g]), .)
 *        The integer dot is exact, and every SIMD A8 core performs this same fp32 epilogue
 *        (multiply, convert, fused multiply-add, in group order), so their results equal
 *        this file's bit for bit.
 *   A16: y[j] = sum_g fma(s[j][g], sum_i (q[j][i] - 8) xb[i] - (z[j][g] - 8) sum(xb_g), .)
 *        Each product of a code (|q - 8| <= 8) and a bf16 is exact in fp32; SIMD versions
 *        differ from this only in the order of the fp32 sums.
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

void epyq_w4_core_a8_ref(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                         const epyq_act *x, float *y, int32_t ldy, const float *rw) {
    const int32_t gs = w->gs, G = x->k / gs;
    const size_t rb = w4_rec_bytes(gs);
    const w4_a8_view a = w4_a8_of(x);
    for (int32_t j = n0; j < n1; j++) {
        const uint8_t *tile = w4_tile_ptr(w, j / W4_TILE);
        const int32_t r = j % W4_TILE;
        for (int32_t t = 0; t < x->m; t++) {
            float acc = 0.0f;
            for (int32_t g = g0; g < g1; g++) {
                const uint8_t *rec = tile + (size_t)g * rb;
                const int8_t *xg = a.x8 + (size_t)t * (size_t)x->k + (size_t)(g - g0) * (size_t)gs;
                int32_t dot = 0;
                for (int32_t i = 0; i < gs; i++)
                    dot += code_at(rec, r, i) * xg[(i & ~7) + w4_a8_pos(i & 7)];
                const int32_t z =
                    w->asym ? w4_tile_zeros(w, tile)[(size_t)g * W4_TILE + (size_t)r] : 8;
                const size_t tg = (size_t)t * (size_t)G + (size_t)(g - g0);
                const float sd = scale_at(rec, gs, r) * a.d[tg];
                acc = fmaf(sd, (float)(dot - z * a.sum8[tg]), acc);
            }
            y[(size_t)t * (size_t)ldy + (size_t)(j - n0)] = rw ? acc * rw[t] : acc;
        }
    }
}

void epyq_w4_core_a16_ref(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                          const epyq_act *x, float *y, int32_t ldy, const float *rw) {
    const int32_t gs = w->gs;
    const size_t rb = w4_rec_bytes(gs);
    const w4_a16_view a = w4_a16_of(x);
    for (int32_t j = n0; j < n1; j++) {
        const uint8_t *tile = w4_tile_ptr(w, j / W4_TILE);
        const int32_t r = j % W4_TILE;
        for (int32_t t = 0; t < x->m; t++) {
            float acc = 0.0f;
            for (int32_t g = g0; g < g1; g++) {
                const uint8_t *rec = tile + (size_t)g * rb;
                const int32_t i0 = (g - g0) * gs;
                const uint16_t *xg = a.xb + (size_t)t * (size_t)x->k + (size_t)i0;
                float dot = 0.0f;
                for (int32_t i = 0; i < gs; i++)
                    dot += (float)(code_at(rec, r, i) - 8) *
                           epyq_bf16_to_f32(xg[(i & ~7) + w4_a16_pos(i & 7)]);
                if (w->asym) {
                    const int32_t z = w4_tile_zeros(w, tile)[(size_t)g * W4_TILE + (size_t)r];
                    dot = fmaf((float)(8 - z), w4_a16_group_sum(&a, x->k, t, i0, gs), dot);
                }
                acc = fmaf(scale_at(rec, gs, r), dot, acc);
            }
            y[(size_t)t * (size_t)ldy + (size_t)(j - n0)] = rw ? acc * rw[t] : acc;
        }
    }
}

static const epyq_w4_cores cores_ref = {epyq_w4_core_a8_ref, epyq_w4_core_a16_ref,
                                        epyq_act_prep_ref};

void epyq_w4_gemm_ref(const epyq_w4 *w, int32_t n0, int32_t n1, const epyq_act *x, float *y,
                      int32_t ldy) {
    epyq_w4_gemm_with(&cores_ref, w, n0, n1, x, y, ldy);
}

void epyq_w4_expert_ref(const epyq_w4 *gate, const epyq_w4 *up, const epyq_w4 *down, int32_t i0,
                        int32_t i1, const epyq_act *x, const float *rw, float *y, int32_t ldy,
                        void *scratch) {
    epyq_w4_expert_with(&cores_ref, gate, up, down, i0, i1, x, rw, y, ldy, scratch);
}
