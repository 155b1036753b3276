/* kernels-x86/counter_rng.h — the counter-based random stream the fill_normal kernels draw
 * from, in plain C. This is its single scalar definition: the ref twin and the tails of the
 * SIMD versions compute with it, and callers that need single draws of the same stream
 * (uniform values, say) read its bits here. No intrinsics, no ISA, no state.
 *
 * Element i of stream `key` is a pure function of (key, i): a Weyl sequence whose odd step
 * and offset both come from the key (so streams are not shifts of one another), hashed
 * once. Everything lives in 32-bit lanes so a SIMD version draws 8 (AVX2) elements per
 * instruction, and any element can be computed on its own. */
#ifndef EPYQ_COUNTER_RNG_H
#define EPYQ_COUNTER_RNG_H

#include <stdint.h>

/* A 32-bit integer hash with low bias (xor-shift / multiply, two rounds). */
static inline uint32_t epyq_rng_hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    return x ^ (x >> 16);
}

/* 32 random bits for element i of stream `key`. The high word of i only moves the offset,
 * so a vector version keeps it constant within a run of 2^32 elements. */
static inline uint32_t epyq_rng_bits(uint64_t key, uint64_t i) {
    const uint32_t k0 = (uint32_t)key + (uint32_t)(i >> 32) * 0x632BE5ABu;
    const uint32_t step = (uint32_t)(key >> 32) | 1u;
    return epyq_rng_hash32((uint32_t)i * step + k0);
}

/* Normal-like value of 32 random bits: the Irwin-Hall sum of the four bytes, centred and
 * scaled to unit variance (1 / sqrt(4 * (256^2 - 1) / 12)), so bounded by +-3.45. The int
 * sum converts exactly; the one fp32 multiply is the only rounding. */
static inline float epyq_rng_normal(uint32_t bits) {
    const uint32_t p = (bits & 0x00FF00FFu) + ((bits >> 8) & 0x00FF00FFu);
    return (float)((int32_t)((p & 0xFFFFu) + (p >> 16)) - 510) * (1.0f / 147.80054f);
}

#endif
