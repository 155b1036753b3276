/* src/vision/preproc.h — the image processor of Qwen3.x (Qwen2VLImageProcessor rules): the
 * target size (smart_resize), Pillow-compatible bicubic resampling, rescale + normalise, and the
 * patch matrix in the processor's order (docs/vision.md §2).
 *
 * Promise: every setting comes from the checkpoint's preprocessor_config.json (the processor
 * class defaults — patch 14, CLIP mean/std — are not Qwen3.x's, so a missing file or key is an
 * error, not a guess). The resize is Pillow's BICUBIC (a = -0.5, support scaled when
 * shrinking, 22-bit fixed-point taps, horizontal pass then vertical, 8-bit intermediate), which
 * is what the HF PIL processor runs. */
#ifndef EPYQ_VISION_PREPROC_H
#define EPYQ_VISION_PREPROC_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "vision/image.h"

typedef struct {
    int32_t patch, temporal, merge; /* patch_size 16, temporal_patch_size 2, merge_size 2 */
    int64_t min_pixels, max_pixels; /* size.shortest_edge / longest_edge (or min_/max_pixels) */
    bool do_resize, do_rescale, do_normalize;
    double rescale;         /* rescale_factor 1/255 */
    double mean[3], std[3]; /* image_mean, image_std */
} epyq_vision_pp;

/* Read dir/preprocessor_config.json. */
epyq_status epyq_vision_pp_load(epyq_vision_pp *pp, const char *dir, epyq_err *err);
/* Parse the file's text (tests, fuzzing). label names it in messages. */
epyq_status epyq_vision_pp_parse(epyq_vision_pp *pp, const char *json, size_t len,
                                 const char *label, epyq_err *err);

/* smart_resize(h, w): sides rounded to multiples of factor, scaled into [min, max] pixels with
 * the aspect ratio kept (the newest HF rule: the shrinking branch keeps each side >= factor).
 * Refuses an aspect ratio above 200 and a result of a zero side. */
epyq_status epyq_vision_smart_resize(int64_t h, int64_t w, int32_t factor, int64_t min_pixels,
                                     int64_t max_pixels, int32_t *oh, int32_t *ow, epyq_err *err);

/* Pillow BICUBIC resize of src [sh][sw][3] to dst [dh][dw][3] (RGB8). */
epyq_status epyq_vision_resize_bicubic(const uint8_t *src, int32_t sw, int32_t sh, uint8_t *dst,
                                       int32_t dw, int32_t dh, epyq_err *err);

/* One image ready for the tower. */
typedef struct {
    int32_t gh, gw; /* grid of patches: h / patch, w / patch (image_grid_thw = [1, gh, gw]) */
    int32_t h, w;   /* the resized size */
    int32_t n;      /* gh * gw patches */
    int32_t cols;   /* 3 * temporal * patch * patch = 1536 */
    float *pix;     /* [n][cols] normalised patches in the processor's order, owned */
} epyq_vision_input;

/* The patch matrix of an RGB8 image that already has the target size: the image repeated to
 * `temporal` frames; row ((bh*(gw/m)+bw)*m+ih)*m+iw is the patch at grid (m*bh+ih, m*bw+iw);
 * column c*(T*p*p) + t*(p*p) + py*p + px. Values (u8*rescale - mean)/std in double, stored
 * float. */
epyq_status epyq_vision_patchify(const epyq_vision_pp *pp, const uint8_t *rgb, int32_t h, int32_t w,
                                 epyq_vision_input *out, epyq_err *err);
/* smart_resize + resize (when do_resize and the size changes) + patchify. */
epyq_status epyq_vision_prepare(const epyq_vision_pp *pp, const epyq_image *im, const char *label,
                                epyq_vision_input *out, epyq_err *err);
void epyq_vision_input_free(epyq_vision_input *in);

#endif
