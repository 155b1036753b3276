/* kernels-x86/w4_act.c — prepares activations for the int4 kernels (layout in w4_layout.h).
 *
 * One plain-C preparation serves every ISA: it is O(m k) next to the O(n k) weight stream,
 * and keeping a single rounding rule makes the A8 results of every table bit-identical to
 * the ref twin (the int8 dot products are exact, so only this rounding could differ).
 *   A8 : d = amax/127 per group of gs; x8 = rint(x * (127/amax)) (nearest even), |x8| <= 127;
 *        all-zero groups get d = 0, x8 = 0.
 *   A16: xb = bf16(x), nearest even. */
#include <math.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/w4_impl.h"
#include "kernels-x86/w4_layout.h"

size_t epyq_act_bytes(int32_t m, int32_t k, int32_t gs, epyq_numpath path) {
    if (m < 1 || k < 32 || k % 32 != 0 || m > (1 << 20) || k > (1 << 24)) return 0;
    if (path == EPYQ_PATH_A8) {
        if (gs < 32 || k % gs != 0) return 0;
        return w4_a8_off_sum(m, k, gs) + w4_align64((size_t)m * (size_t)(k / gs) * sizeof(int32_t));
    }
    return w4_a16_off_s32(m, k) + w4_align64((size_t)m * (size_t)(k / 32) * sizeof(float));
}

static void prep_a8(const float *x, int32_t m, int32_t k, int32_t gs, uint8_t *buf) {
    const int32_t G = k / gs;
    int8_t *x8 = (int8_t *)buf;                                  /* [m][k] */
    float *d = (float *)(buf + w4_a8_off_d(m, k));               /* [m][G] */
    int32_t *sum8 = (int32_t *)(buf + w4_a8_off_sum(m, k, gs));  /* [m][G] */
    for (int32_t t = 0; t < m; t++) {
        for (int32_t g = 0; g < G; g++) {
            const float *xg = x + (size_t)t * (size_t)k + (size_t)g * (size_t)gs;
            int8_t *qg = x8 + (size_t)t * (size_t)k + (size_t)g * (size_t)gs;
            float amax = 0.0f;
            for (int32_t i = 0; i < gs; i++) {
                const float a = fabsf(xg[i]);
                amax = a > amax ? a : amax;
            }
            const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            int32_t sum = 0;
            for (int32_t i = 0; i < gs; i++) {
                /* Nearest-even rounding by the 1.5 * 2^23 trick (exact for |v| < 2^22, here
                 * <= 127): unlike a rintf() call it compiles to two vector adds. */
                float v = xg[i] * id;
                v = (v + 0x1.8p23f) - 0x1.8p23f;
                v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                qg[(i & ~7) + w4_a8_pos(i & 7)] = (int8_t)v;
                sum += (int32_t)v;
            }
            d[(size_t)t * (size_t)G + (size_t)g] = amax / 127.0f;
            sum8[(size_t)t * (size_t)G + (size_t)g] = sum;
        }
    }
}

static void prep_a16(const float *x, int32_t m, int32_t k, uint8_t *buf) {
    uint16_t *xb = (uint16_t *)buf;                        /* [m][k] */
    float *s32 = (float *)(buf + w4_a16_off_s32(m, k));    /* [m][k/32] */
    for (int32_t t = 0; t < m; t++) {
        for (int32_t r = 0; r < k / 32; r++) {
            const float *xr = x + (size_t)t * (size_t)k + (size_t)r * 32;
            uint16_t *br = xb + (size_t)t * (size_t)k + (size_t)r * 32;
            float sum = 0.0f;
            for (int32_t i = 0; i < 32; i++) {
                const uint16_t h = epyq_f32_to_bf16(xr[i]);
                br[(i & ~7) + w4_a16_pos(i & 7)] = h;
                sum += epyq_bf16_to_f32(h);
            }
            s32[(size_t)t * (size_t)(k / 32) + (size_t)r] = sum;
        }
    }
}

void epyq_act_prep_ref(epyq_act *a, const float *x, int32_t m, int32_t k, int32_t gs,
                       epyq_numpath path, void *buf) {
    a->m = m;
    a->k = k;
    a->gs = gs;
    a->path = path;
    a->f32 = x;
    a->buf = buf;
    if (path == EPYQ_PATH_A8)
        prep_a8(x, m, k, gs, (uint8_t *)buf);
    else
        prep_a16(x, m, k, (uint8_t *)buf);
}
