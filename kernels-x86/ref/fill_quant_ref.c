/* kernels-x86/ref/fill_quant_ref.c — plain-C twins of the counter-based normal fill, the
 * min/max scan and the int4 rounding rules (kern.h fill_normal, minmax, quant_codes).
 *
 * These are the definitions: SIMD versions must give the same bits, so every step here is
 * one fp32 operation written as its own statement (a compiler allowed to contract within
 * an expression still cannot fuse the product and sum of fill_normal into an FMA). */
#include "core/util.h"
#include "kernels-x86/counter_rng.h"
#include "kernels-x86/kern_impl.h"

static inline float round_bf16(float x) { return epyq_bf16_to_f32(epyq_f32_to_bf16(x)); }
/* Round half to even for |t| < 2^22 without a libm call (larger |t| only ever meets the
 * clamps below, which it passes on the correct side). */
static inline float rne(float t) { return (t + 12582912.0f) - 12582912.0f; }
static inline float clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

void epyq_fill_normal_ref(uint64_t key, float mean, float sigma, uint64_t i0, size_t n,
                          float *out) {
    for (size_t o = 0; o < n; o++) {
        const float dev = sigma * epyq_rng_normal(epyq_rng_bits(key, i0 + o));
        out[o] = round_bf16(mean + dev);
    }
}

void epyq_minmax_ref(const float *x, size_t n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (size_t i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *mn = lo, *mx = hi;
}

void epyq_quant_codes_ref(const float *x, size_t n, float a, float z, epyq_q4_round rule,
                          uint8_t *q) {
    switch (rule) {
    case EPYQ_Q4_ROUND_DIV:
        for (size_t i = 0; i < n; i++) q[i] = (uint8_t)(int)clampf(rne(x[i] / a) + z, 0.0f, 15.0f);
        break;
    case EPYQ_Q4_ROUND_DIV_BF16:
        for (size_t i = 0; i < n; i++)
            q[i] = (uint8_t)(int)(rne(clampf(round_bf16(x[i] / a), -8.0f, 7.0f)) + 8.0f);
        break;
    case EPYQ_Q4_ROUND_MUL_SYM:
        for (size_t i = 0; i < n; i++)
            q[i] = (uint8_t)(int)(clampf(rne(x[i] * a), -8.0f, 7.0f) + 8.0f);
        break;
    }
}
