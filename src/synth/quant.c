/* src/synth/quant.c — int4 round-to-nearest quantizers with each tool's own scale rule, and the
 * per-format packers (docs/quant-formats.md §2-§7). Codes are canonical: w = (q - z) * s, q in
 * 0..15. All rounding is ties-to-even, like torch.round. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/kern.h"
#include "synth/synth_int.h"

static inline float to_f16(float x) { return epyq_f16_to_f32(epyq_f32_to_f16(x)); }
/* round half to even for |t| < 2^22 without a libm call */
static inline float rne(float t) { return (t + 12582912.0f) - 12582912.0f; }
static inline float clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

/* One group of SYNTH_GS values: codes into q, returns the stored scale, sets *z. Each tool's
 * scale rule is here; its code rule is the kernel table's quant_codes with the matching
 * epyq_q4_round (a = the divisor, or Quark's reciprocal). */
static float quant_group(const epyq_kern_table *kt, epyq_synth_format f, const float *x, uint8_t *q,
                         uint8_t *z) {
    float mn, mx;
    kt->minmax(x, SYNTH_GS, &mn, &mx);
    switch (f) {
    case EPYQ_SYNTH_GPTQ: {
        /* GPTQModel Quantizer.find_params, sym: range widened to 0, made symmetric only when the
         * group has a negative value (the "no negative value" quirk of §2 is kept) */
        float lo = mn < 0 ? mn : 0, hi = mx > 0 ? mx : 0;
        hi = fabsf(lo) > hi ? fabsf(lo) : hi;
        if (lo < 0) lo = -hi;
        if (lo == 0 && hi == 0) lo = -1, hi = 1;
        const float s = (hi - lo) / 15.0f;
        kt->quant_codes(x, SYNTH_GS, s, 8.0f, EPYQ_Q4_ROUND_DIV, q);
        *z = 8;
        return to_f16(s); /* codes use the unrounded scale; the fp16 copy is what is stored */
    }
    case EPYQ_SYNTH_CT: {
        /* compressed-tensors sym int4: absmax / 7.5 with 0 in range; divides in the bf16 dtype */
        float lo = mn < 0 ? -mn : 0, hi = mx > 0 ? mx : 0;
        float s = synth_round_bf16((lo > hi ? lo : hi) / 7.5f);
        if (s < FLT_EPSILON) s = synth_round_bf16(FLT_EPSILON);
        kt->quant_codes(x, SYNTH_GS, s, 8.0f, EPYQ_Q4_ROUND_DIV_BF16, q);
        *z = 8;
        return s;
    }
    case EPYQ_SYNTH_QUARK: {
        /* Quark int4 per_group symmetric: max(-min-, max+) / 7.5 floored at eps, x * (1/s) */
        float lo = mn < 0 ? -mn : 0, hi = mx > 0 ? mx : 0;
        float s = (lo > hi ? lo : hi) / 7.5f;
        if (s < FLT_EPSILON) s = FLT_EPSILON;
        kt->quant_codes(x, SYNTH_GS, 1.0f / s, 8.0f, EPYQ_Q4_ROUND_MUL_SYM, q);
        *z = 8;
        return synth_round_bf16(s);
    }
    case EPYQ_SYNTH_AWQ: {
        /* AutoAWQ zero_point=True: raw min/max (0 not forced in), integer zero point */
        const float s = (mx - mn > 1e-5f ? mx - mn : 1e-5f) / 15.0f;
        const float zz = clampf(-rne(mn / s), 0.0f, 15.0f);
        kt->quant_codes(x, SYNTH_GS, s, zz, EPYQ_Q4_ROUND_DIV, q);
        *z = (uint8_t)zz;
        return to_f16(s);
    }
    default:
        break;
    }
    return 0;
}

void epyq_synth_quantize(epyq_synth_format f, const float *w, int32_t n, int32_t k, uint8_t *q,
                         float *s, uint8_t *z) {
    const int32_t gn = k / SYNTH_GS;
    const epyq_kern_table *kt = epyq_kern();
    for (int32_t r = 0; r < n; r++)
        for (int32_t g = 0; g < gn; g++) {
            size_t o = (size_t)r * (size_t)k + (size_t)g * SYNTH_GS;
            s[(size_t)r * gn + g] = quant_group(kt, f, w + o, q + o, z + (size_t)r * gn + g);
        }
}

void epyq_synth_pack_gptq_qweight(const uint8_t *q, int32_t n, int32_t k, int32_t row, uint32_t *out) {
    /* word (row, c): slot j = code of output c, input 8*row + j (packed along K, sequential) */
    for (int32_t c = 0; c < n; c++) {
        const uint8_t *p = q + (size_t)c * (size_t)k + (size_t)row * 8;
        uint32_t w = 0;
        for (int j = 0; j < 8; j++) w |= (uint32_t)p[j] << (4 * j);
        out[c] = w;
    }
}

void epyq_synth_pack_gptq_qzeros(const uint8_t *z, int32_t n, int32_t gn, int32_t g, uint32_t *out) {
    /* v1 storage (checkpoint_format "gptq"): GPTQModel subtracts 0x11111111 from each v2 word */
    for (int32_t c = 0; c < n / 8; c++) {
        uint32_t w = 0;
        for (int j = 0; j < 8; j++) w |= (uint32_t)z[(size_t)(8 * c + j) * gn + g] << (4 * j);
        out[c] = w - 0x11111111u;
    }
}

void epyq_synth_pack_ct(const uint8_t *q, int32_t k, int32_t row, uint32_t *out) {
    /* word (row, c): slot j = q[row][8c + j]; q is already the signed code + 8 */
    const uint8_t *p = q + (size_t)row * (size_t)k;
    int32_t c = 0;
    for (; 8 * c + 8 <= k; c++) {
        /* eight code bytes (little-endian u64) folded into eight nibbles, byte j -> slot j */
        uint64_t v;
        memcpy(&v, p + 8 * c, 8);
        v = (v | (v >> 4)) & 0x00FF00FF00FF00FFull;
        v = (v | (v >> 8)) & 0x0000FFFF0000FFFFull;
        out[c] = (uint32_t)(v | (v >> 16));
    }
    for (; c < (k + 7) / 8; c++) { /* a partial last word is zero-padded */
        uint32_t w = 0;
        for (int j = 0; 8 * c + j < k; j++) w |= (uint32_t)p[8 * c + j] << (4 * j);
        out[c] = w;
    }
}

void epyq_synth_pack_along_n(const uint8_t *q, int32_t n, int32_t stride, int32_t kk,
                             bool twos_compl, bool awq_order, uint32_t *out) {
    /* slot i of word c holds output 8c + order[i]; AWQ order puts even outputs in the low half */
    static const int awq[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (int32_t c = 0; c < (n + 7) / 8; c++) {
        uint32_t w = 0;
        for (int i = 0; i < 8; i++) {
            int32_t o = 8 * c + (awq_order ? awq[i] : i);
            if (o >= n) continue; /* Quark leaves padding slots 0 */
            uint32_t nib = q[(size_t)o * (size_t)stride + (size_t)kk];
            if (twos_compl) nib ^= 8; /* signed code q - 8 as a two's-complement nibble */
            w |= nib << (4 * i);
        }
        out[c] = w;
    }
}

void epyq_synth_act_perm(uint64_t seed, const char *logical, int32_t k, int32_t *perm) {
    /* FNV-1a of the name mixed with the seed, then a splitmix64 stream driving Fisher-Yates:
     * the same module always gets the same order, every module its own */
    uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
    /* an expert's up_proj takes gate_proj's order: GPTQ orders columns by the Hessian of the
     * input, which the two share (the runtime's fused expert kernel relies on it). q/k/v and
     * the DeltaNet projections share an input too but keep orders of their own here, so the
     * runtime's per-order activations are exercised. */
    size_t len = strlen(logical), cut = len;
    if (len >= 8 && !strcmp(logical + len - 8, ".up_proj")) cut = len - 8;
    for (size_t i = 0; i < cut; i++) h = (h ^ (uint8_t)logical[i]) * 1099511628211ull;
    if (cut != len)
        for (const char *c = ".gate_proj"; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    else
        for (size_t i = cut; i < len; i++) h = (h ^ (uint8_t)logical[i]) * 1099511628211ull;
    for (int32_t i = 0; i < k; i++) perm[i] = i;
    for (int32_t i = k - 1; i > 0; i--) {
        uint64_t z = (h += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        int32_t j = (int32_t)(z % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
}
