/* tests/unit/test_synth_ref.h — each tool's int4 round-to-nearest rule (docs/quant-formats.md §2),
 * transcribed directly from the table in float math as the tools compute it: the independent
 * reference the synth tests compare the generator's codes and scales with. Header-only. */
#ifndef EPYQ_TEST_SYNTH_REF_H
#define EPYQ_TEST_SYNTH_REF_H

#include <math.h>
#include <stdint.h>

#include "core/util.h"
#include "synth/synth.h"

static inline float bf16r(float x) { return epyq_bf16_to_f32(epyq_f32_to_bf16(x)); }
static inline float f16r(float x) { return epyq_f16_to_f32(epyq_f32_to_f16(x)); }

/* Reference for one group: codes as canonical unsigned q with zero z, returns stored scale. */
static inline float ref_group(epyq_synth_format f, const float *x, int gs, uint8_t *q, uint8_t *z) {
    float mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < gs; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
    if (f == EPYQ_SYNTH_GPTQ) { /* GPTQModel Quantizer, sym */
        float xmin = fminf(mn, 0), xmax = fmaxf(mx, 0);
        xmax = fmaxf(fabsf(xmin), xmax);
        if (xmin < 0) xmin = -xmax;
        if (xmin == 0 && xmax == 0) xmin = -1, xmax = 1;
        float s = (xmax - xmin) / 15;
        for (int i = 0; i < gs; i++) q[i] = (uint8_t)fminf(fmaxf(rintf(x[i] / s) + 8, 0), 15);
        *z = 8;
        return f16r(s);
    }
    if (f == EPYQ_SYNTH_CT) { /* compressed-tensors sym: absmax/7.5 in the bf16 dtype */
        float am = fmaxf(fabsf(fminf(mn, 0)), fmaxf(mx, 0));
        float s = bf16r(am / 7.5f);
        for (int i = 0; i < gs; i++) q[i] = (uint8_t)(rintf(fminf(fmaxf(bf16r(x[i] / s), -8), 7)) + 8);
        *z = 8;
        return s;
    }
    if (f == EPYQ_SYNTH_QUARK) { /* Quark int4 per_group sym */
        float s = fmaxf(-fminf(mn, 0), fmaxf(mx, 0)) / 7.5f;
        for (int i = 0; i < gs; i++) q[i] = (uint8_t)(fminf(fmaxf(rintf(x[i] * (1 / s)), -8), 7) + 8);
        *z = 8;
        return bf16r(s);
    }
    /* AutoAWQ zero_point */
    float s = fmaxf(mx - mn, 1e-5f) / 15;
    float zz = fminf(fmaxf(-rintf(mn / s), 0), 15);
    for (int i = 0; i < gs; i++) q[i] = (uint8_t)fminf(fmaxf(rintf(x[i] / s) + zz, 0), 15);
    *z = (uint8_t)zz;
    return f16r(s);
}

#endif
