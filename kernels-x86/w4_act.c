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

void epyq_act_gather(const epyq_act *src, const int32_t *rows, int32_t n, void *buf,
                     epyq_act *dst) {
    const int32_t k = src->k, gs = src->gs, G = k / gs, m = src->m;
    const int wide = src->path != EPYQ_PATH_A8;
    const size_t qb = wide ? sizeof(int16_t) : 1u; /* bytes per code */
    const uint8_t *s = (const uint8_t *)src->buf;
    uint8_t *b = (uint8_t *)buf;
    const size_t sd = wide ? w4_a16_off_d(m, k) : w4_a8_off_d(m, k),
                 ss = wide ? w4_a16_off_sum(m, k, gs) : w4_a8_off_sum(m, k, gs);
    const size_t dd = wide ? w4_a16_off_d(n, k) : w4_a8_off_d(n, k),
                 ds = wide ? w4_a16_off_sum(n, k, gs) : w4_a8_off_sum(n, k, gs);
    for (int32_t r = 0; r < n; r++) {
        const size_t from = (size_t)rows[r], to = (size_t)r;
        memcpy(b + to * (size_t)k * qb, s + from * (size_t)k * qb, (size_t)k * qb);
        memcpy(b + dd + to * (size_t)G * sizeof(float), s + sd + from * (size_t)G * sizeof(float),
               (size_t)G * sizeof(float));
        memcpy(b + ds + to * (size_t)G * sizeof(int32_t),
               s + ss + from * (size_t)G * sizeof(int32_t), (size_t)G * sizeof(int32_t));
    }
    *dst = (epyq_act){.m = n, .k = k, .gs = gs, .path = src->path, .f32 = NULL, .buf = buf};
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
