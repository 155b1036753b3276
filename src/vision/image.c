/* src/vision/image.c — PNG (libpng) and JPEG (libjpeg-turbo) decoding to RGB8 (image.h).
 *
 * Both libraries report fatal errors through a callback that must not return, so each decode
 * runs under setjmp; the callbacks copy the library's message and jump back. Everything the
 * jump can skip is either set before setjmp or reached through a volatile pointer. */
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
/* jpeglib.h needs size_t and FILE declared before it */
#include <jpeglib.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "vision/image.h"

void epyq_image_free(epyq_image *im) {
    if (!im) return;
    free(im->rgb);
    memset(im, 0, sizeof *im);
}

static epyq_status too_big(epyq_err *err, const char *label, uint64_t w, uint64_t h, uint64_t cap) {
    return epyq_err_set(err, EPYQ_E_FORMAT,
                        "%s: image of %llu x %llu pixels: at most %llu pixels are decoded", label,
                        (unsigned long long)w, (unsigned long long)h, (unsigned long long)cap);
}

/* ---- PNG */

typedef struct {
    jmp_buf jb;
    char msg[200];
    const uint8_t *data;
    size_t len, off;
} png_ctx;

static void png_fail(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "error");
    longjmp(c->jb, 1);
}

static void png_quiet(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

static void png_read_mem(png_structp png, png_bytep out, size_t n) {
    png_ctx *c = png_get_io_ptr(png);
    if (n > c->len - c->off) png_error(png, "truncated (the data ends inside a chunk)");
    memcpy(out, c->data + c->off, n);
    c->off += n;
}

static epyq_status decode_png(epyq_image *out, const uint8_t *data, size_t len, const char *label,
                              uint64_t cap, epyq_err *err) {
    png_ctx c = {.data = data, .len = len};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &c, png_fail, png_quiet);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    }
    uint8_t *volatile rgb = NULL;
    png_bytep *volatile rows = NULL;
    if (setjmp(c.jb)) {
        png_destroy_read_struct(&png, &info, NULL);
        free(rgb), free(rows);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: corrupt PNG: %s", label, c.msg);
    }
    png_set_read_fn(png, &c, png_read_mem);
    /* bound what ancillary chunks (text, iCCP) may allocate; pixels are capped below */
    png_set_chunk_malloc_max(png, 8u << 20);
    png_set_chunk_cache_max(png, 1000);
    png_set_user_limits(png, 1u << 24, 1u << 24);
    png_read_info(png, info);
    uint32_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if ((uint64_t)w * h > cap) {
        png_destroy_read_struct(&png, &info, NULL);
        return too_big(err, label, w, h, cap);
    }
    int ct = png_get_color_type(png, info);
    png_set_strip_16(png);
    png_set_packing(png);
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) {
        png_set_expand_gray_1_2_4_to_8(png);
        png_set_gray_to_rgb(png);
    }
    png_set_strip_alpha(png); /* also drops tRNS transparency: convert("RGB") ignores it */
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3 || png_get_channels(png, info) != 3)
        png_error(png, "unexpected layout after conversion to RGB");
    rgb = malloc((size_t)w * h * 3);
    rows = malloc((size_t)h * sizeof *rows);
    if (!rgb || !rows) {
        snprintf(c.msg, sizeof c.msg, "out of memory for %u x %u pixels", w, h);
        longjmp(c.jb, 1);
    }
    for (uint32_t y = 0; y < h; y++) rows[y] = rgb + (size_t)y * w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL); /* reaches IEND: a file cut after the pixel data is refused too */
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    out->w = (int32_t)w, out->h = (int32_t)h, out->rgb = rgb;
    return EPYQ_OK;
}

/* ---- JPEG */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    bool warned; /* libjpeg only warns on a truncated or damaged stream and fills in grey */
    char warn[JMSG_LENGTH_MAX];
} jpg_err;

static void jpg_fail(j_common_ptr ci) {
    jpg_err *e = (jpg_err *)ci->err;
    (*ci->err->format_message)(ci, e->msg);
    longjmp(e->jb, 1);
}

static void jpg_emit(j_common_ptr ci, int level) {
    jpg_err *e = (jpg_err *)ci->err;
    if (level < 0 && !e->warned) {
        e->warned = true;
        (*ci->err->format_message)(ci, e->warn);
    }
}

static void jpg_silent(j_common_ptr ci) { (void)ci; }

/* A progressive stream can carry thousands of tiny scans, each costing a pass over the
 * image: stop past a number no encoder produces. */
static void jpg_progress(j_common_ptr ci) {
    j_decompress_ptr d = (j_decompress_ptr)ci;
    if (d->input_scan_number > 500) {
        jpg_err *e = (jpg_err *)ci->err;
        snprintf(e->msg, sizeof e->msg, "more than 500 scans");
        longjmp(e->jb, 1);
    }
}

static epyq_status decode_jpeg(epyq_image *out, const uint8_t *data, size_t len, const char *label,
                               uint64_t cap, epyq_err *err) {
    struct jpeg_decompress_struct ci;
    jpg_err je;
    struct jpeg_progress_mgr pm = {.progress_monitor = jpg_progress};
    memset(&je, 0, sizeof je);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jpg_fail;
    je.pub.emit_message = jpg_emit;
    je.pub.output_message = jpg_silent;
    uint8_t *volatile rgb = NULL;
    if (setjmp(je.jb)) {
        jpeg_destroy_decompress(&ci);
        free(rgb);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: corrupt JPEG: %s", label, je.msg);
    }
    jpeg_create_decompress(&ci);
    ci.progress = &pm;
    jpeg_mem_src(&ci, data, (unsigned long)len);
    jpeg_read_header(&ci, TRUE);
    uint64_t w = ci.image_width, h = ci.image_height;
    if (w * h > cap) {
        jpeg_destroy_decompress(&ci);
        return too_big(err, label, w, h, cap);
    }
    if (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&ci);
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: CMYK JPEG: only greyscale and YCbCr/RGB JPEGs are supported",
                            label);
    }
    ci.out_color_space = JCS_RGB;
    /* HF's default (PIL) decoder uses the accurate integer IDCT and fancy upsampling */
    ci.dct_method = JDCT_ISLOW;
    ci.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&ci);
    if (ci.output_components != 3 || ci.output_width != w || ci.output_height != h) {
        snprintf(je.msg, sizeof je.msg, "unexpected output layout (%d components)",
                 ci.output_components);
        longjmp(je.jb, 1);
    }
    rgb = malloc((size_t)w * h * 3);
    if (!rgb) {
        snprintf(je.msg, sizeof je.msg, "out of memory for %llu x %llu pixels",
                 (unsigned long long)w, (unsigned long long)h);
        longjmp(je.jb, 1);
    }
    while (ci.output_scanline < ci.output_height) {
        JSAMPROW row = rgb + (size_t)ci.output_scanline * w * 3;
        jpeg_read_scanlines(&ci, &row, 1);
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    if (je.warned) {
        free(rgb);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: corrupt or truncated JPEG: %s", label,
                            je.warn);
    }
    out->w = (int32_t)w, out->h = (int32_t)h, out->rgb = rgb;
    return EPYQ_OK;
}

epyq_status epyq_image_decode(epyq_image *out, const uint8_t *data, size_t len, const char *label,
                              uint64_t max_pixels, epyq_err *err) {
    memset(out, 0, sizeof *out);
    if (!label) label = "image";
    uint64_t cap = max_pixels ? max_pixels : EPYQ_IMAGE_MAX_PIXELS;
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len >= 8 && !memcmp(data, png_sig, 8)) return decode_png(out, data, len, label, cap, err);
    if (len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff)
        return decode_jpeg(out, data, len, label, cap, err);
    if (len == 0)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: empty file: expected a PNG or JPEG image",
                            label);
    const char *what = len >= 4 && !memcmp(data, "GIF8", 4) ? "a GIF"
                       : len >= 12 && !memcmp(data, "RIFF", 4) && !memcmp(data + 8, "WEBP", 4)
                           ? "a WebP"
                       : len >= 2 && !memcmp(data, "BM", 2) ? "a BMP"
                                                            : "not an image";
    return epyq_err_set(err, EPYQ_E_FORMAT,
                        "%s: unsupported format (%s): expected a PNG or JPEG image", label, what);
}

epyq_status epyq_image_load(epyq_image *out, const char *path, epyq_err *err) {
    memset(out, 0, sizeof *out);
    char *buf = NULL;
    size_t len = 0;
    TRY(epyq_file_read(path, EPYQ_IMAGE_MAX_FILE, &buf, &len, err));
    epyq_status st = epyq_image_decode(out, (const uint8_t *)buf, len, path, 0, err);
    free(buf);
    return st;
}
