/* src/vision/mrope.h — images in the prompt (docs/vision.md §4): expanding each image's single
 * <|image_pad|> to its token count, and the (t, h, w) rotary positions of a prompt with images.
 *
 * Promise: both walk the ids once and check that the pads and the images agree (count and, for
 * positions, each run's length), failing with EPYQ_E_ARG naming the image and the numbers;
 * positions equal transformers' get_rope_index for still images. */
#ifndef EPYQ_VISION_MROPE_H
#define EPYQ_VISION_MROPE_H

#include <stdint.h>

#include "core/status.h"
#include "vision/vision.h"

/* ids [n] with exactly n_img pads (one per image, as the chat template writes them) ->
 * *out [*n_out] (malloc'd) where pad k became tokens[k] pads. */
epyq_status epyq_vision_expand_pads(const epyq_vision_config *vc, const int32_t *ids, int32_t n,
                                    const int32_t *tokens, int32_t n_img, int32_t **out,
                                    int32_t *n_out, epyq_err *err);

/* pos [n][3] for ids [n] whose pads are already expanded; image k has the patch grid
 * grid[k] = {gh, gw}. Text takes (p, p, p) then p + 1; an image's merged gh/m x gw/m tokens,
 * starting when p = P, take (P, P + i, P + j) in raster order, then p = P + max(gh/m, gw/m).
 * *delta = (largest position + 1) - n: decoding token n' then rotates by n' + delta. */
epyq_status epyq_vision_positions(const epyq_vision_config *vc, const int32_t *ids, int32_t n,
                                  const int32_t (*grid)[2], int32_t n_img, int32_t *pos,
                                  int32_t *delta, epyq_err *err);

#endif
