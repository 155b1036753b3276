/* tools/media.h — image content parts of OpenAI chat messages, for `epyq serve` and
 * `epyq batch`: {"type": "image_url", "image_url": {"url": URL}} (or "image_url": URL).
 *
 * Promise: epyq_media_collect() reads every such part in order and decodes its image: a
 * data:image/...;base64, URL is decoded in memory; http(s) URLs are refused (there is no
 * network); a local path (or file:// URL) only when allowed_dir is set, resolved with realpath
 * and refused outside it. A bad part fails with the field (messages[i].content[j].image_url) in
 * md->param and one line saying what was expected and found; never a crash. The copy of the
 * messages it keeps has each image part turned into {"type": "image"}, which the chat template
 * renders as <|vision_start|><|image_pad|><|vision_end|>. epyq_media_prompt() then runs the
 * tower over the images of a tokenised prompt (one pad per image, src/vision/prompt.h). */
#ifndef EPYQ_TOOLS_MEDIA_H
#define EPYQ_TOOLS_MEDIA_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "vision/prompt.h"

#define EPYQ_MEDIA_MAX_IMAGES 16 /* per request */

typedef struct {
    cJSON *messages;  /* with images: the copy to render; NULL when the request has none */
    epyq_image *imgs; /* [n_img] decoded */
    int32_t n_img;
    char param[96]; /* failure: the offending field; "" = none */
    char first[96]; /* the first image part's field (a server without a tower names it) */
} epyq_media;

epyq_status epyq_media_collect(epyq_media *md, const cJSON *messages, const char *allowed_dir,
                               epyq_err *err);
void epyq_media_free(epyq_media *md);

/* The tower over md's images for the prompt *ids [*n] (one <|image_pad|> per image): *ids
 * (malloc'd, freed here) becomes the expanded prompt; *vp owns the rows and positions and *ei
 * borrows them for epyq_engine_add_img. On failure *ids is unchanged. */
epyq_status epyq_media_prompt(epyq_vision *v, const epyq_media *md, int32_t **ids, size_t *n,
                              epyq_vision_prompt *vp, epyq_engine_img *ei, epyq_err *err);

/* The checkpoint's vision tower when it has one: *out NULL (and EPYQ_OK) when config.json has no
 * vision_config or the tower's tensors are absent (synthetic 35b-a3b shapes); *why then says which
 * (image parts are refused with it). Other failures (memory) are errors. */
epyq_status epyq_media_tower(const char *dir, int32_t n_threads, epyq_vision **out, char *why,
                             size_t why_len, epyq_err *err);

/* Decode standard base64 (padding optional, no whitespace) into *out (malloc'd). */
epyq_status epyq_media_base64(const char *s, size_t len, uint8_t **out, size_t *n_out,
                              epyq_err *err);

#endif
