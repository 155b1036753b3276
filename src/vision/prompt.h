/* src/vision/prompt.h — a prompt with images, ready for epyq_model_forward_img: the images
 * through the processor and the tower, the pads expanded, the rows and the M-RoPE positions.
 *
 * Promise: the ids may carry one <|image_pad|> per image (what chat templates write; each is
 * expanded to the image's token count) or already the full runs; anything else is refused with
 * EPYQ_E_ARG saying how many pads were found for how many images. All images go through the tower
 * in one call. */
#ifndef EPYQ_VISION_PROMPT_H
#define EPYQ_VISION_PROMPT_H

#include <stdint.h>

#include "model/model.h"
#include "vision/image.h"
#include "vision/vision.h"

typedef struct {
    int32_t n;          /* prompt tokens after expansion */
    int32_t *ids;       /* [n] */
    float *rows;        /* [image tokens][out_hidden] tower output, images in order */
    const float **embd; /* [n] the row of each pad, NULL elsewhere */
    int32_t *pos;       /* [n][3] (t, h, w) rotary positions */
    int32_t delta;      /* rope delta after the prompt */
    int32_t n_img, image_tokens;
    double t_encode;    /* seconds spent in the tower */
    epyq_batch_img img; /* {embd, pos} */
} epyq_vision_prompt;

epyq_status epyq_vision_prompt_build(epyq_vision_prompt *vp, epyq_vision *v, const epyq_image *imgs,
                                     const char *const *labels, int32_t n_img, const int32_t *ids,
                                     int32_t n, epyq_err *err);
void epyq_vision_prompt_free(epyq_vision_prompt *vp);

#endif
