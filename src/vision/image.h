/* src/vision/image.h — still images in: PNG and JPEG decoded to 8-bit RGB.
 *
 * Promise: epyq_image_decode() never crashes on any byte string. It recognises the format by
 * its signature, reads the header first and refuses an image whose width x height exceeds
 * EPYQ_IMAGE_MAX_PIXELS *before* any pixel buffer is allocated (a tiny file can declare a
 * huge image: decompression bombs), then decodes with libpng / libjpeg(-turbo). Palette, grey,
 * 16-bit and alpha images become RGB (alpha dropped, as PIL's convert("RGB") does). Corrupt,
 * truncated, unsupported (CMYK JPEG, other formats) or oversized input gives one EPYQ_E_FORMAT
 * line that starts with the label (usually the file name) and says what was wrong. */
#ifndef EPYQ_VISION_IMAGE_H
#define EPYQ_VISION_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* 64 Mpixel: four times the processor's max_pixels (16,777,216), 192 MiB of RGB. */
#define EPYQ_IMAGE_MAX_PIXELS (64u << 20)
/* Largest image file read (bytes). */
#define EPYQ_IMAGE_MAX_FILE (256u << 20)

typedef struct {
    int32_t w, h;
    uint8_t *rgb; /* [h][w][3] row-major, owned */
} epyq_image;

/* Decode bytes (PNG or JPEG). label names the input in messages. max_pixels 0 = the default
 * cap. */
epyq_status epyq_image_decode(epyq_image *out, const uint8_t *data, size_t len, const char *label,
                              uint64_t max_pixels, epyq_err *err);
/* Read and decode a file (refused past EPYQ_IMAGE_MAX_FILE bytes). */
epyq_status epyq_image_load(epyq_image *out, const char *path, epyq_err *err);
void epyq_image_free(epyq_image *im);

#endif
