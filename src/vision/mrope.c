/* src/vision/mrope.c — image pads and M-RoPE positions of a prompt (mrope.h). */
#include <stdlib.h>

#include "vision/mrope.h"

epyq_status epyq_vision_expand_pads(const epyq_vision_config *vc, const int32_t *ids, int32_t n,
                                    const int32_t *tokens, int32_t n_img, int32_t **out,
                                    int32_t *n_out, epyq_err *err) {
    *out = NULL, *n_out = 0;
    int64_t total = 0;
    int32_t pads = 0;
    for (int32_t i = 0; i < n; i++) pads += ids[i] == vc->image_token_id;
    if (pads != n_img)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "prompt has %d image placeholders (<|image_pad|>) for %d images", pads,
                            n_img);
    for (int32_t k = 0; k < n_img; k++) total += tokens[k];
    total += n - n_img;
    if (total > INT32_MAX / 4)
        return epyq_err_set(err, EPYQ_E_ARG, "prompt with images: %lld tokens is too long",
                            (long long)total);
    int32_t *o = malloc((size_t)(total ? total : 1) * sizeof *o);
    if (!o) return epyq_err_set(err, EPYQ_E_NOMEM, "prompt with images: out of memory");
    int32_t j = 0, k = 0;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] != vc->image_token_id) o[j++] = ids[i];
        else
            for (int32_t r = 0, c = tokens[k++]; r < c; r++) o[j++] = ids[i];
    *out = o, *n_out = j;
    return EPYQ_OK;
}

epyq_status epyq_vision_positions(const epyq_vision_config *vc, const int32_t *ids, int32_t n,
                                  const int32_t (*grid)[2], int32_t n_img, int32_t *pos,
                                  int32_t *delta, epyq_err *err) {
    int32_t p = 0, k = 0, mx = -1, m = vc->merge;
    for (int32_t i = 0; i < n;) {
        if (ids[i] != vc->image_token_id) {
            pos[3 * i] = pos[3 * i + 1] = pos[3 * i + 2] = p;
            mx = p > mx ? p : mx;
            p++, i++;
            continue;
        }
        /* one image: the next gh/m * gw/m pads (two images may sit back to back) */
        if (k >= n_img)
            return epyq_err_set(err, EPYQ_E_ARG,
                                "prompt: image pads at token %d beyond the %d images given", i,
                                n_img);
        int32_t H = grid[k][0] / m, W = grid[k][1] / m, run = 0;
        while (i + run < n && ids[i + run] == vc->image_token_id && run < H * W) run++;
        if (run != H * W)
            return epyq_err_set(
                err, EPYQ_E_ARG,
                "prompt: image %d needs %d pads (%dx%d merged grid), found %d at token %d", k + 1,
                H * W, H, W, run, i);
        for (int32_t r = 0; r < H; r++)
            for (int32_t c = 0; c < W; c++, i++) {
                pos[3 * i] = p, pos[3 * i + 1] = p + r, pos[3 * i + 2] = p + c;
                int32_t hi = p + (r > c ? r : c);
                mx = hi > mx ? hi : mx;
            }
        p += H > W ? H : W;
        k++;
    }
    if (k != n_img)
        return epyq_err_set(err, EPYQ_E_ARG, "prompt: %d images given, pads for %d found", n_img,
                            k);
    *delta = mx + 1 - n;
    return EPYQ_OK;
}
