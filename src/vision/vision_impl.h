/* src/vision/vision_impl.h — pieces of the runtime tower (tower.c) kept apart to keep files
 * short: activations, the learned position table and the 2-D rotary (vops.c). Only
 * src/vision/ includes it; the float64 twin (src/ref/ref_vision.c) has its own. */
#ifndef EPYQ_VISION_IMPL_H
#define EPYQ_VISION_IMPL_H

#include <math.h>
#include <stdint.h>

#include "vision/vision.h"

enum { EPYQ_VACT_NONE = 0, EPYQ_VACT_GELU_TANH, EPYQ_VACT_GELU_ERF };

/* The ViT MLP uses the tanh approximation (gelu_pytorch_tanh), the merger the exact erf GELU. */
static inline float epyq_vision_act_apply(int32_t act, float x) {
    if (act == EPYQ_VACT_GELU_TANH)
        return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    if (act == EPYQ_VACT_GELU_ERF) return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    return x;
}

/* cs [gh*gw][hd]: per patch row (block-major order) cos of the hd/2 angles, then their sin.
 * Angle d < hd/4 turns with the patch's grid row, d >= hd/4 with its column. */
void epyq_vision_rope_table(const epyq_vision_config *c, int32_t gh, int32_t gw, float *cs);
/* Rotate one head vector v [hd] by its patch's angles: pairs (d, d + hd/2). */
void epyq_vision_rope_apply(float *v, const float *cs, int32_t hd);
/* h [gh*gw][D] += the learned table pos [side*side][D] resampled bilinearly (align_corners)
 * to the grid, rows in block-major order. */
void epyq_vision_add_pos(const epyq_vision_config *c, const float *pos, int32_t gh, int32_t gw,
                         float *h);

#endif
