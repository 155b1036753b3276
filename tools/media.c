/* tools/media.c — see media.h. */
#include "tools/media.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

static int b64_val(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62; /* '-' and '_': the URL-safe alphabet, seen in the wild */
    if (c == '/' || c == '_') return 63;
    return -1;
}

epyq_status epyq_media_base64(const char *s, size_t len, uint8_t **out, size_t *n_out,
                              epyq_err *err) {
    *out = NULL, *n_out = 0;
    while (len && s[len - 1] == '=') len--;
    if (len % 4 == 1)
        return epyq_err_set(err, EPYQ_E_FORMAT, "base64: %zu characters cannot end a quantum", len);
    uint8_t *o = malloc(len / 4 * 3 + 3);
    if (!o) return epyq_err_set(err, EPYQ_E_NOMEM, "base64: %zu characters: out of memory", len);
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) {
            free(o);
            return epyq_err_set(err, EPYQ_E_FORMAT,
                                "base64: expected A-Z a-z 0-9 + / =, found byte 0x%02x at %zu",
                                (unsigned char)s[i], i);
        }
        acc = (acc << 6) | (uint32_t)v, bits += 6;
        if (bits >= 8) bits -= 8, o[k++] = (uint8_t)(acc >> bits);
    }
    *out = o, *n_out = k;
    return EPYQ_OK;
}

/* One URL into an image. */
static epyq_status load_url(epyq_image *im, const char *url, const char *allowed_dir,
                            epyq_err *err) {
    if (!strncmp(url, "data:", 5)) {
        const char *comma = strchr(url, ',');
        if (!comma || strncmp(url + 5, "image/", 6) != 0 || comma - url < 12 ||
            strncmp(comma - 7, ";base64", 7) != 0)
            return epyq_err_set(
                err, EPYQ_E_ARG,
                "expected a data:image/png;base64,... or data:image/jpeg;base64,... "
                "URL, found '%.40s'",
                url);
        uint8_t *bytes = NULL;
        size_t n = 0;
        epyq_status st = epyq_media_base64(comma + 1, strlen(comma + 1), &bytes, &n, err);
        if (st == EPYQ_OK) st = epyq_image_decode(im, bytes, n, "image", 0, err);
        free(bytes);
        return st;
    }
    if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8))
        return epyq_err_set(err, EPYQ_E_ARG,
                            "remote image URLs are not fetched (this server has no network): "
                            "send the image as a data:image/...;base64 URL");
    const char *path = !strncmp(url, "file://", 7) ? url + 7 : url;
    if (!allowed_dir)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "expected a data:image/...;base64 URL, found '%.40s' (local files "
                            "only with --allowed-media-dir)",
                            url);
    char dir[PATH_MAX], real[PATH_MAX];
    if (!realpath(allowed_dir, dir))
        return epyq_err_set(err, EPYQ_E_IO, "--allowed-media-dir %s cannot be resolved",
                            allowed_dir);
    if (!realpath(path, real))
        return epyq_err_set(err, EPYQ_E_ARG, "image file '%.200s' does not exist", path);
    size_t dl = strlen(dir);
    if (strncmp(real, dir, dl) != 0 || (real[dl] != '/' && !(dl == 1 && dir[0] == '/')))
        return epyq_err_set(err, EPYQ_E_ARG, "image file '%.200s' is outside --allowed-media-dir",
                            path);
    return epyq_image_load(im, real, err);
}

void epyq_media_free(epyq_media *md) {
    if (!md) return;
    for (int32_t i = 0; i < md->n_img; i++) epyq_image_free(&md->imgs[i]);
    free(md->imgs);
    cJSON_Delete(md->messages);
    memset(md, 0, sizeof *md);
}

epyq_status epyq_media_collect(epyq_media *md, const cJSON *messages, const char *allowed_dir,
                               epyq_err *err) {
    memset(md, 0, sizeof *md);
    epyq_status st = EPYQ_OK;
    int i = 0;
    for (const cJSON *m = cJSON_IsArray(messages) ? messages->child : NULL; m; m = m->next, i++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        int k = 0;
        for (const cJSON *p = cJSON_IsArray(c) ? c->child : NULL; p; p = p->next, k++) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "image_url") != 0) continue;
            snprintf(md->param, sizeof md->param, "messages[%d].content[%d].image_url", i, k);
            if (!md->first[0]) memcpy(md->first, md->param, sizeof md->first);
            const cJSON *iu = cJSON_GetObjectItemCaseSensitive(p, "image_url");
            const cJSON *u = cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "url") : iu;
            if (!cJSON_IsString(u)) {
                st = epyq_err_set(err, EPYQ_E_ARG, "'%s' must be {\"url\": STRING}", md->param);
                goto done;
            }
            if (md->n_img == EPYQ_MEDIA_MAX_IMAGES) {
                st = epyq_err_set(err, EPYQ_E_ARG, "at most %d images per request",
                                  EPYQ_MEDIA_MAX_IMAGES);
                goto done;
            }
            if (!md->imgs && !(md->imgs = calloc(EPYQ_MEDIA_MAX_IMAGES, sizeof *md->imgs))) {
                st = epyq_err_set(err, EPYQ_E_NOMEM, "images: out of memory");
                goto done;
            }
            epyq_err e2 = {0};
            if ((st = load_url(&md->imgs[md->n_img], u->valuestring, allowed_dir, &e2)) !=
                EPYQ_OK) {
                epyq_err_set(err, st, "'%s': %s", md->param, e2.msg);
                for (char *q = err->msg; *q; q++)
                    if (*q == '\n' || *q == '\r') *q = ' '; /* one line, whatever the URL holds */
                goto done;
            }
            md->n_img++;
        }
    }
    md->param[0] = 0;
    if (md->n_img == 0) return EPYQ_OK;
    /* the template's copy: image parts as {"type": "image"}, no data URLs inside it */
    if (!(md->messages = cJSON_Duplicate(messages, 1))) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "images: out of memory");
        goto done;
    }
    for (cJSON *m = md->messages->child; m; m = m->next) {
        cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        for (cJSON *p = cJSON_IsArray(c) ? c->child : NULL; p; p = p->next) {
            cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "image_url") != 0) continue;
            cJSON_DeleteItemFromObjectCaseSensitive(p, "image_url");
            if (!cJSON_SetValuestring(ty, "image")) {
                st = epyq_err_set(err, EPYQ_E_NOMEM, "images: out of memory");
                goto done;
            }
        }
    }
done:
    if (st != EPYQ_OK) {
        char keep[sizeof md->param];
        memcpy(keep, md->param, sizeof keep);
        epyq_media_free(md);
        memcpy(md->param, keep, sizeof keep);
    }
    return st;
}

epyq_status epyq_media_prompt(epyq_vision *v, const epyq_media *md, int32_t **ids, size_t *n,
                              epyq_vision_prompt *vp, epyq_engine_img *ei, epyq_err *err) {
    if (*n > INT32_MAX) return epyq_err_set(err, EPYQ_E_ARG, "the prompt has %zu tokens", *n);
    epyq_status st =
        epyq_vision_prompt_build(vp, v, md->imgs, NULL, md->n_img, *ids, (int32_t)*n, err);
    if (st != EPYQ_OK) return st;
    int32_t *x = malloc((size_t)vp->n * sizeof *x);
    if (!x) {
        epyq_vision_prompt_free(vp);
        return epyq_err_set(err, EPYQ_E_NOMEM, "prompt [%d]: out of memory", vp->n);
    }
    memcpy(x, vp->ids, (size_t)vp->n * sizeof *x);
    free(*ids);
    *ids = x, *n = (size_t)vp->n;
    const epyq_vision_config *vc = epyq_vision_cfg(v);
    *ei =
        (epyq_engine_img){vc->image_token_id, vp->image_tokens, vc->out_hidden, vp->rows, vp->pos};
    return EPYQ_OK;
}

epyq_status epyq_media_tower(const char *dir, int32_t n_threads, epyq_vision **out, char *why,
                             size_t why_len, epyq_err *err) {
    *out = NULL;
    epyq_vision_config vc;
    bool present = false;
    epyq_err e2 = {0};
    epyq_status st = epyq_vision_config_load(&vc, dir, &present, &e2);
    if (st == EPYQ_OK && !present) {
        snprintf(why, why_len, "this checkpoint has no vision tower (no vision_config)");
        return EPYQ_OK;
    }
    const epyq_vision_opts vo = {.n_threads = n_threads};
    if (st == EPYQ_OK) st = epyq_vision_load(out, dir, &vo, &e2);
    if (st == EPYQ_E_NOMEM) return epyq_err_set(err, st, "%s", e2.msg);
    if (st != EPYQ_OK)
        snprintf(why, why_len, "this checkpoint has no usable vision tower: %s", e2.msg);
    return EPYQ_OK;
}
