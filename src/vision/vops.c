/* src/vision/vops.c — the learned position table and the 2-D rotary of the runtime tower
 * (vision_impl.h; docs/vision.md §3). */
#include <math.h>

#include "vision/vision_impl.h"

/* Grid cell of patch row `row` (block-major: the m x m rows of a merge block are consecutive). */
static void cell(int32_t row, int32_t gw, int32_t m, int32_t *r, int32_t *c) {
    int32_t iw = row % m, ih = row / m % m, blk = row / (m * m), bw = blk % (gw / m),
            bh = blk / (gw / m);
    *r = bh * m + ih, *c = bw * m + iw;
}

void epyq_vision_rope_table(const epyq_vision_config *c, int32_t gh, int32_t gw, float *cs) {
    int32_t hd = c->head_dim, half = hd / 2, q = hd / 4;
    for (int32_t p = 0; p < gh * gw; p++) {
        int32_t r, col;
        cell(p, gw, c->merge, &r, &col);
        for (int32_t d = 0; d < half; d++) {
            int32_t k = d < q ? d : d - q;
            /* double: the angle itself, before cos/sin, carries the position exactly */
            double inv = pow(c->rope_theta, -2.0 * k / half), ang = (d < q ? r : col) * inv;
            cs[(size_t)p * hd + d] = (float)cos(ang);
            cs[(size_t)p * hd + half + d] = (float)sin(ang);
        }
    }
}

void epyq_vision_rope_apply(float *v, const float *cs, int32_t hd) {
    int32_t half = hd / 2;
    for (int32_t d = 0; d < half; d++) {
        float co = cs[d], si = cs[half + d], a = v[d], b = v[d + half];
        v[d] = a * co - b * si;
        v[d + half] = b * co + a * si;
    }
}

/* Source index and weight of the two taps along one axis of `size` cells over `side` table
 * entries, with the corners of the grid on the corners of the table. */
static void taps(int32_t i, int32_t size, int32_t side, int32_t *t0, int32_t *t1, double *f) {
    double s = size > 1 ? (double)i * (side - 1) / (size - 1) : 0.0;
    *t0 = (int32_t)floor(s);
    *t1 = *t0 + 1 < side ? *t0 + 1 : side - 1;
    *f = s - *t0;
}

void epyq_vision_add_pos(const epyq_vision_config *c, const float *pos, int32_t gh, int32_t gw,
                         float *h) {
    int32_t D = c->hidden, S = c->pos_side;
    for (int32_t p = 0; p < gh * gw; p++) {
        int32_t r, col, y0, y1, x0, x1;
        double dy, dx;
        cell(p, gw, c->merge, &r, &col);
        taps(r, gh, S, &y0, &y1, &dy);
        taps(col, gw, S, &x0, &x1, &dx);
        const float *e00 = pos + ((size_t)y0 * S + x0) * D, *e01 = pos + ((size_t)y0 * S + x1) * D;
        const float *e10 = pos + ((size_t)y1 * S + x0) * D, *e11 = pos + ((size_t)y1 * S + x1) * D;
        float w00 = (float)((1 - dy) * (1 - dx)), w01 = (float)((1 - dy) * dx),
              w10 = (float)(dy * (1 - dx)), w11 = (float)(dy * dx);
        float *hr = h + (size_t)p * D;
        for (int32_t d = 0; d < D; d++)
            hr[d] += w00 * e00[d] + w01 * e01[d] + w10 * e10[d] + w11 * e11[d];
    }
}
