/* tests/files/img_enc.h — tiny in-memory PNG / JPEG writers for the image tests and seeds
 * (libpng and libjpeg's encoders), and a PNG chunk CRC for hand-patched headers. */
#ifndef EPYQ_TEST_IMG_ENC_H
#define EPYQ_TEST_IMG_ENC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
/* after stddef.h / stdio.h: jpeglib.h uses size_t and FILE */
#include <jpeglib.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *p;
    size_t n, cap;
} img_buf;

static void img_buf_put(png_structp png, png_bytep d, size_t n) {
    img_buf *b = png_get_io_ptr(png);
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void img_buf_flush(png_structp png) { (void)png; }

/* PNG of w x h pixels with `ch` channels of `depth` bits (8 or 16) given as 8-bit samples
 * px [h][w][ch] (16-bit samples are v * 257); color type from ch: 1 grey, 2 grey+alpha, 3 RGB,
 * 4 RGBA. interlace: Adam7. */
static inline uint8_t *img_png(const uint8_t *px, int w, int h, int ch, int depth, int interlace,
                               size_t *len) {
    static const int ct[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                              PNG_COLOR_TYPE_RGB_ALPHA};
    img_buf b = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    png_set_write_fn(png, &b, img_buf_put, img_buf_flush);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, ct[ch],
                 interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    size_t rb = (size_t)w * ch * (depth / 8);
    uint8_t *rows = malloc(rb * h);
    png_bytep *rp = malloc(sizeof *rp * h);
    for (int y = 0; y < h; y++) {
        rp[y] = rows + rb * y;
        for (int i = 0; i < w * ch; i++) {
            uint8_t v = px[(size_t)y * w * ch + i];
            if (depth == 16) rp[y][2 * i] = v, rp[y][2 * i + 1] = v;
            else
                rp[y][i] = v;
        }
    }
    png_write_image(png, rp);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows), free(rp);
    *len = b.n;
    return b.p;
}

/* JPEG (quality q) of px [h][w][ch]: ch 3 = RGB, 1 = grey, 4 = CMYK. */
static inline uint8_t *img_jpeg(const uint8_t *px, int w, int h, int ch, int q, int progressive,
                                size_t *len) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned char *out = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&c, &out, &n);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h, c.input_components = ch;
    c.in_color_space = ch == 3 ? JCS_RGB : ch == 1 ? JCS_GRAYSCALE : JCS_CMYK;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, q, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = (JSAMPROW)(px + (size_t)c.next_scanline * w * ch);
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    *len = n;
    return out;
}

static inline uint32_t img_crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return c ^ 0xffffffffu;
}

static inline void img_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

/* Rewrite a PNG's IHDR size (the first chunk, at offset 8) and fix its CRC. */
static inline void img_png_set_size(uint8_t *png, uint32_t w, uint32_t h) {
    img_be32(png + 16, w);
    img_be32(png + 20, h);
    img_be32(png + 29, img_crc32(png + 12, 17));
}

/* Rewrite a baseline JPEG's SOF0 size; 0 if there is no SOF0 marker. */
static inline int img_jpeg_set_size(uint8_t *j, size_t n, uint16_t w, uint16_t h) {
    for (size_t i = 2; i + 9 < n; i++)
        if (j[i] == 0xff && (j[i + 1] == 0xc0 || j[i + 1] == 0xc2)) {
            j[i + 5] = (uint8_t)(h >> 8), j[i + 6] = (uint8_t)h, j[i + 7] = (uint8_t)(w >> 8),
                  j[i + 8] = (uint8_t)w;
            return 1;
        }
    return 0;
}

/* A test pattern px [h][w][ch]: smooth ramps plus a checker, deterministic. */
static inline uint8_t *img_pattern(int w, int h, int ch) {
    uint8_t *p = malloc((size_t)w * h * ch);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++)
                p[((size_t)y * w + x) * ch + c] =
                    (uint8_t)((x * 7 + y * 3 + c * 50 + ((x / 4 + y / 4) % 2) * 40) & 255);
    return p;
}

#endif
