/* kernels-x86/w4_act.c — prepares activations for the int4 kernels (layout in w4_layout.h).
 *
 * One plain-C preparation serves every ISA: it is O(m k) next to the O(n k) weight stream,
 * and keeping a single rounding rule makes the A8 results of every table bit-identical to
 * the ref twin (the int8 dot products are exact, so only this rounding could differ).
 *   A8 : d = amax/127 per group of gs; x8 = rint(x * (127/amax)) (nearest even), |x8| <= 127;
 *        all-zero groups get d = 0, x8 = 0.
 *   A16: the same with 32767 and int16: d = amax/32767, x16 = rint(x * (32767/amax)). */
#include <math.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/w4_impl.h"
#include "kernels-x86/w4_layout.h"

size_t epyq_act_bytes(int32_t m, int32_t k, int32_t gs, epyq_numpath path) {
    if (m < 1 || k < 32 || k % 32 != 0 || m > (1 << 20) || k > (1 << 24)) return 0;
    if (gs < 32 || k % gs != 0) return 0;
    if (path == EPYQ_PATH_A8)
        return w4_a8_off_sum(m, k, gs) + w4_align64((size_t)m * (size_t)(k / gs) * sizeof(int32_t));
    return w4_a16_off_sum(m, k, gs) + w4_align64((size_t)m * (size_t)(k / gs) * sizeof(int32_t));
}

/* Per group of gs: d = amax / qmax, q = rint(x * (qmax / amax)) clamped to +-qmax, stored at
 * pos(i & 7) within each 8-run (int8 or int16 per `wide`), and the sum of the q. */
static void prep_int(const float *x, int32_t m, int32_t k, int32_t gs, int wide, void *qv, float *d,
                     int32_t *sums) {
    const int32_t G = k / gs;
    const float qmax = wide ? 32767.0f : 127.0f;
    for (int32_t t = 0; t < m; t++) {
        for (int32_t g = 0; g < G; g++) {
            const size_t base = (size_t)t * (size_t)k + (size_t)g * (size_t)gs;
            const float *xg = x + base;
            float amax = 0.0f;
            for (int32_t i = 0; i < gs; i++) {
                const float a = fabsf(xg[i]);
                amax = a > amax ? a : amax;
            }
            const float id = amax > 0.0f ? qmax / amax : 0.0f;
            int32_t sum = 0;
            for (int32_t i = 0; i < gs; i++) {
                /* Nearest-even rounding by the 1.5 * 2^23 trick (exact for |v| < 2^22, here
                 * <= 32767): unlike a rintf() call it compiles to two vector adds. */
                float v = xg[i] * id;
                v = (v + 0x1.8p23f) - 0x1.8p23f;
                v = v > qmax ? qmax : v < -qmax ? -qmax : v;
                const size_t at = base + (size_t)(i & ~7);
                if (wide) ((int16_t *)qv)[at + (size_t)w4_a16_pos(i & 7)] = (int16_t)v;
                else ((int8_t *)qv)[at + (size_t)w4_a8_pos(i & 7)] = (int8_t)v;
                sum += (int32_t)v;
            }
            d[(size_t)t * (size_t)G + (size_t)g] = amax / qmax;
            sums[(size_t)t * (size_t)G + (size_t)g] = sum;
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
    uint8_t *b = (uint8_t *)buf;
    if (path == EPYQ_PATH_A8)
        prep_int(x, m, k, gs, 0, b, (float *)(b + w4_a8_off_d(m, k)),
                 (int32_t *)(b + w4_a8_off_sum(m, k, gs)));
    else
        prep_int(x, m, k, gs, 1, b, (float *)(b + w4_a16_off_d(m, k)),
                 (int32_t *)(b + w4_a16_off_sum(m, k, gs)));
}
