/* src/vision/prompt.c — images into a prompt (prompt.h). */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "vision/mrope.h"
#include "vision/prompt.h"

void epyq_vision_prompt_free(epyq_vision_prompt *vp) {
    if (!vp) return;
    free(vp->ids), free(vp->rows), free(vp->embd), free(vp->pos);
    memset(vp, 0, sizeof *vp);
}

epyq_status epyq_vision_prompt_build(epyq_vision_prompt *vp, epyq_vision *v, const epyq_image *imgs,
                                     const char *const *labels, int32_t n_img, const int32_t *ids,
                                     int32_t n, epyq_err *err) {
    memset(vp, 0, sizeof *vp);
    const epyq_vision_config *vc = epyq_vision_cfg(v);
    if (n_img < 1) return epyq_err_set(err, EPYQ_E_ARG, "no images");
    epyq_vision_input *in = calloc((size_t)n_img, sizeof *in);
    int32_t *tokens = calloc((size_t)n_img, sizeof *tokens),
            (*grid)[2] = calloc((size_t)n_img, sizeof *grid);
    epyq_status st =
        in && tokens && grid ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "images: out of memory");
    int64_t total = 0;
    for (int32_t k = 0; st == EPYQ_OK && k < n_img; k++) {
        st = epyq_vision_prepare(epyq_vision_preproc(v), &imgs[k], labels ? labels[k] : "image",
                                 &in[k], err);
        if (st != EPYQ_OK) break;
        tokens[k] = epyq_vision_tokens(vc, in[k].gh, in[k].gw);
        grid[k][0] = in[k].gh, grid[k][1] = in[k].gw;
        total += tokens[k];
    }
    int32_t pads = 0;
    for (int32_t i = 0; i < n; i++) pads += ids[i] == vc->image_token_id;
    if (st == EPYQ_OK && pads == n_img && total != n_img) {
        st = epyq_vision_expand_pads(vc, ids, n, tokens, n_img, &vp->ids, &vp->n, err);
    } else if (st == EPYQ_OK && pads == total) {
        vp->n = n;
        if (!(vp->ids = malloc((size_t)n * sizeof *vp->ids)))
            st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        else
            memcpy(vp->ids, ids, (size_t)n * sizeof *ids);
    } else if (st == EPYQ_OK) {
        st = epyq_err_set(
            err, EPYQ_E_ARG,
            "prompt has %d <|image_pad|> tokens for %d images: expected one per image (or %lld in all)",
            pads, n_img, (long long)total);
    }
    if (st == EPYQ_OK) {
        vp->pos = malloc((size_t)vp->n * 3 * sizeof *vp->pos);
        vp->embd = calloc((size_t)vp->n, sizeof *vp->embd);
        vp->rows = malloc((size_t)total * vc->out_hidden * sizeof *vp->rows);
        if (!vp->pos || !vp->embd || !vp->rows)
            st = epyq_err_set(err, EPYQ_E_NOMEM, "images: out of memory");
    }
    if (st == EPYQ_OK)
        st = epyq_vision_positions(vc, vp->ids, vp->n, (const int32_t(*)[2])grid, n_img, vp->pos,
                                   &vp->delta, err);
    if (st == EPYQ_OK) {
        double t0 = epyq_now();
        st = epyq_vision_encode(v, in, n_img, vp->rows, err);
        vp->t_encode = epyq_now() - t0;
    }
    if (st == EPYQ_OK) {
        int32_t r = 0;
        for (int32_t i = 0; i < vp->n; i++)
            if (vp->ids[i] == vc->image_token_id)
                vp->embd[i] = vp->rows + (size_t)r++ * vc->out_hidden;
        vp->n_img = n_img, vp->image_tokens = (int32_t)total;
        vp->img.embd = vp->embd, vp->img.mrope = vp->pos;
    }
    for (int32_t k = 0; in && k < n_img; k++) epyq_vision_input_free(&in[k]);
    free(in), free(tokens), free(grid);
    if (st != EPYQ_OK) epyq_vision_prompt_free(vp);
    return st;
}
