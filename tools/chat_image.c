/* tools/chat_image.c — images in `epyq chat` (/image FILE; chat_repl.h).
 *
 * Every prompt of a conversation with images carries all of them (the history is rendered
 * whole each turn), so each image is encoded once, when attached, and its rows kept; each turn
 * expands the rendered pads and recomputes the M-RoPE positions of the whole prompt. The
 * sequence that held the previous turn continues with its rope delta; copies from the prefix
 * cache are never restored past the first image (tools/chat_state.c: the cache keys are ids,
 * and pads are the same ids for different images) and prompts with images fill no copies
 * (tools/gen.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tools/chat_repl.h"
#include "vision/mrope.h"

epyq_status chat_image_add(repl *r, const char *path, epyq_err *err) {
    if (r->n_imgs >= 64)
        return epyq_err_set(err, EPYQ_E_ARG, "/image: at most 64 images per conversation");
    if (!r->vision) {
        const epyq_vision_opts vo = {.n_threads = r->threads};
        epyq_status st = epyq_vision_load(&r->vision, r->dir, &vo, err);
        if (st != EPYQ_OK) return st;
    }
    chat_img *grow = realloc(r->imgs, (size_t)(r->n_imgs + 1) * sizeof *grow);
    if (!grow) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    r->imgs = grow;
    epyq_image im = {0};
    epyq_vision_input in = {0};
    chat_img ci = {0};
    const epyq_vision_config *vc = epyq_vision_cfg(r->vision);
    double t0 = epyq_now();
    epyq_status st = epyq_image_load(&im, path, err);
    if (st == EPYQ_OK)
        st = epyq_vision_prepare(epyq_vision_preproc(r->vision), &im, path, &in, err);
    if (st == EPYQ_OK) {
        ci.tokens = epyq_vision_tokens(vc, in.gh, in.gw);
        ci.grid[0] = in.gh, ci.grid[1] = in.gw;
        if (!(ci.rows = malloc((size_t)ci.tokens * (size_t)vc->out_hidden * sizeof *ci.rows)))
            st = epyq_err_set(err, EPYQ_E_NOMEM, "image rows [%d][%d]: out of memory", ci.tokens,
                              vc->out_hidden);
    }
    if (st == EPYQ_OK) st = epyq_vision_encode(r->vision, &in, 1, ci.rows, err);
    epyq_vision_input_free(&in);
    epyq_image_free(&im);
    if (st != EPYQ_OK) {
        free(ci.rows);
        return st;
    }
    r->imgs[r->n_imgs++] = ci;
    r->n_pending++;
    fprintf(stderr,
            "[ image %s: %d image tokens, encoded in %.2f s; it goes with your next message ]\n",
            path, ci.tokens, epyq_now() - t0);
    return EPYQ_OK;
}

int32_t chat_image_attach(repl *r, cJSON *msg) {
    int32_t k = r->n_pending;
    cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content"), *parts = cJSON_CreateArray();
    if (!k || !cJSON_IsString(c) || !parts) {
        cJSON_Delete(parts);
        return 0;
    }
    for (int32_t i = 0; i < k; i++) {
        cJSON *im = cJSON_CreateObject();
        cJSON_AddStringToObject(im, "type", "image");
        cJSON_AddItemToArray(parts, im);
    }
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "type", "text");
    cJSON_AddStringToObject(t, "text", c->valuestring);
    cJSON_AddItemToArray(parts, t);
    cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", parts);
    r->n_pending = 0;
    return k;
}

void chat_image_drop(repl *r, int32_t n) {
    if (n < 0 || n > r->n_imgs) n = r->n_imgs;
    for (int32_t i = r->n_imgs - n; i < r->n_imgs; i++) free(r->imgs[i].rows);
    r->n_imgs -= n;
    if (r->n_pending > r->n_imgs) r->n_pending = r->n_imgs;
    free(r->img_embd), free(r->img_pos);
    r->img_embd = NULL, r->img_pos = NULL, r->gen.img = NULL;
}

epyq_status chat_image_prompt(repl *r, int32_t **ids, size_t *n, epyq_err *err) {
    free(r->img_embd), free(r->img_pos);
    r->img_embd = NULL, r->img_pos = NULL, r->gen.img = NULL;
    int32_t k = r->n_imgs - r->n_pending; /* images already in the messages */
    if (k == 0) return EPYQ_OK;
    const epyq_vision_config *vc = epyq_vision_cfg(r->vision);
    int32_t *tokens = malloc((size_t)k * sizeof *tokens),
            (*grid)[2] = malloc((size_t)k * sizeof *grid);
    int32_t *x = NULL, nx = 0, delta = 0;
    epyq_status st = tokens && grid ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    for (int32_t i = 0; st == EPYQ_OK && i < k; i++)
        tokens[i] = r->imgs[i].tokens, grid[i][0] = r->imgs[i].grid[0],
        grid[i][1] = r->imgs[i].grid[1];
    if (st == EPYQ_OK) st = epyq_vision_expand_pads(vc, *ids, (int32_t)*n, tokens, k, &x, &nx, err);
    if (st == EPYQ_OK) {
        r->img_pos = malloc((size_t)nx * 3 * sizeof *r->img_pos);
        r->img_embd = calloc((size_t)nx, sizeof *r->img_embd);
        if (!r->img_pos || !r->img_embd) st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    if (st == EPYQ_OK)
        st =
            epyq_vision_positions(vc, x, nx, (const int32_t(*)[2])grid, k, r->img_pos, &delta, err);
    if (st == EPYQ_OK) {
        for (int32_t i = 0, img = 0, row = 0; i < nx; i++) {
            if (x[i] != vc->image_token_id) continue;
            if (row == r->imgs[img].tokens) img++, row = 0;
            r->img_embd[i] = r->imgs[img].rows + (size_t)row++ * (size_t)vc->out_hidden;
        }
        free(*ids);
        *ids = x, *n = (size_t)nx, x = NULL;
        r->bimg = (epyq_batch_img){r->img_embd, r->img_pos};
        r->gen.img = &r->bimg;
    }
    free(x), free(tokens), free(grid);
    return st;
}
