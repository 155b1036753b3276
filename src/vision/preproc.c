/* src/vision/preproc.c — processor settings, smart_resize, bicubic resize, patches
 * (preproc.h; docs/vision.md §2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/json.h"
#include "vision/preproc.h"

static epyq_status get_triple(const cJSON *o, const char *key, double *v, const char *label,
                              epyq_err *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!a)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: missing (expected 3 numbers)", label, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 3)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: expected an array of 3 numbers, found %s",
                            label, key, epyq_json_type_name(a));
    for (int i = 0; i < 3; i++) {
        const cJSON *it = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s[%d]: expected a number, found %s",
                                label, key, i, epyq_json_type_name(it));
        v[i] = it->valuedouble;
    }
    return EPYQ_OK;
}

static epyq_status pp_fill(epyq_vision_pp *pp, const cJSON *o, const char *label, epyq_err *err) {
    int64_t v;
    bool found;
    const struct {
        const char *key;
        int32_t *dst;
        int64_t hi;
    } ints[] = {{"patch_size", &pp->patch, 64},
                {"temporal_patch_size", &pp->temporal, 8},
                {"merge_size", &pp->merge, 8}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        TRY(epyq_json_get_int(o, ints[i].key, 1, ints[i].hi, &v, &found, label, err));
        if (!found) return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: missing", label, ints[i].key);
        *ints[i].dst = (int32_t)v;
    }
    /* min/max pixels: size.{shortest_edge,longest_edge} (current HF) or min_/max_pixels */
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(o, "size");
    bool fmin = false, fmax = false;
    if (size && cJSON_IsObject(size)) {
        TRY(epyq_json_get_int(size, "shortest_edge", 1, EPYQ_JSON_INT_MAX, &pp->min_pixels, &fmin,
                              label, err));
        TRY(epyq_json_get_int(size, "longest_edge", 1, EPYQ_JSON_INT_MAX, &pp->max_pixels, &fmax,
                              label, err));
    }
    if (!fmin)
        TRY(epyq_json_get_int(o, "min_pixels", 1, EPYQ_JSON_INT_MAX, &pp->min_pixels, &fmin, label,
                              err));
    if (!fmax)
        TRY(epyq_json_get_int(o, "max_pixels", 1, EPYQ_JSON_INT_MAX, &pp->max_pixels, &fmax, label,
                              err));
    if (!fmin || !fmax)
        return epyq_err_set(
            err, EPYQ_E_FORMAT,
            "%s: expected size.shortest_edge and size.longest_edge (min/max pixels)", label);
    if (pp->min_pixels > pp->max_pixels)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: min pixels %lld above max pixels %lld", label,
                            (long long)pp->min_pixels, (long long)pp->max_pixels);
    pp->do_resize = pp->do_rescale = pp->do_normalize = true;
    TRY(epyq_json_get_bool(o, "do_resize", &pp->do_resize, NULL, label, err));
    TRY(epyq_json_get_bool(o, "do_rescale", &pp->do_rescale, NULL, label, err));
    TRY(epyq_json_get_bool(o, "do_normalize", &pp->do_normalize, NULL, label, err));
    pp->rescale = 1.0 / 255.0;
    TRY(epyq_json_get_num(o, "rescale_factor", 0.0, 1.0, &pp->rescale, NULL, label, err));
    TRY(get_triple(o, "image_mean", pp->mean, label, err));
    TRY(get_triple(o, "image_std", pp->std, label, err));
    for (int i = 0; i < 3; i++)
        if (!(pp->std[i] > 0.0))
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: image_std[%d] = %g: expected > 0", label,
                                i, pp->std[i]);
    int64_t rs = 3;
    TRY(epyq_json_get_int(o, "resample", 0, 5, &rs, NULL, label, err));
    if (rs != 3) /* PIL's numbering: 3 = BICUBIC, the only one Qwen uses */
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: resample %lld: only 3 (bicubic) is implemented", label,
                            (long long)rs);
    return EPYQ_OK;
}

epyq_status epyq_vision_pp_parse(epyq_vision_pp *pp, const char *json, size_t len,
                                 const char *label, epyq_err *err) {
    memset(pp, 0, sizeof *pp);
    cJSON *o = NULL;
    TRY(epyq_json_parse(&o, json, len, label, err));
    epyq_status st = pp_fill(pp, o, label, err);
    cJSON_Delete(o);
    return st;
}

epyq_status epyq_vision_pp_load(epyq_vision_pp *pp, const char *dir, epyq_err *err) {
    char *path = epyq_path_join(dir, "preprocessor_config.json"), *buf = NULL;
    size_t len = 0;
    if (!path) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    epyq_status st = epyq_file_read(path, 1u << 20, &buf, &len, err);
    if (st == EPYQ_OK) st = epyq_vision_pp_parse(pp, buf, len, path, err);
    free(buf), free(path);
    return st;
}

epyq_status epyq_vision_smart_resize(int64_t h, int64_t w, int32_t factor, int64_t min_pixels,
                                     int64_t max_pixels, int32_t *oh, int32_t *ow, epyq_err *err) {
    if (h < 1 || w < 1 || factor < 1)
        return epyq_err_set(err, EPYQ_E_ARG, "image of %lld x %lld pixels: expected positive sides",
                            (long long)w, (long long)h);
    double hd = (double)h, wd = (double)w, f = factor;
    if ((h > w ? hd / wd : wd / hd) > 200.0)
        return epyq_err_set(err, EPYQ_E_ARG, "image of %lld x %lld pixels: aspect ratio above 200",
                            (long long)w, (long long)h);
    /* Python's round() is half-to-even: nearbyint in the default rounding mode */
    double hb = nearbyint(hd / f) * f, wb = nearbyint(wd / f) * f;
    if (hb * wb > (double)max_pixels) {
        double beta = sqrt(hd * wd / (double)max_pixels);
        hb = fmax(f, floor(hd / beta / f) * f);
        wb = fmax(f, floor(wd / beta / f) * f);
    } else if (hb * wb < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / (hd * wd));
        hb = ceil(hd * beta / f) * f;
        wb = ceil(wd * beta / f) * f;
    }
    if (hb < f || wb < f || hb > 1 << 20 || wb > 1 << 20)
        return epyq_err_set(
            err, EPYQ_E_ARG,
            "image of %lld x %lld pixels: resized to %.0f x %.0f: expected sides in [%d, 2^20]",
            (long long)w, (long long)h, wb, hb, factor);
    *oh = (int32_t)hb, *ow = (int32_t)wb;
    return EPYQ_OK;
}

/* ---- Pillow-style bicubic */

#define PREC 22 /* fixed-point bits of a tap: 32 - 8 (pixel) - 2 (headroom for negative lobes) */

static double cubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

/* Taps of one axis: out pixel o reads in[lo[o] .. lo[o] + cnt[o]) with fixed-point weights
 * k[o * ksize + j]. The window is centred on the output pixel's centre mapped into the input,
 * widened by the scale when shrinking (the filter then also low-passes). */
typedef struct {
    int32_t ksize;
    int32_t *lo, *cnt;
    int32_t *k;
} taps;

static void taps_free(taps *t) { free(t->lo), free(t->cnt), free(t->k); }

static epyq_status taps_make(taps *t, int32_t in, int32_t out, epyq_err *err) {
    double scale = (double)in / out, fs = scale < 1.0 ? 1.0 : scale, support = 2.0 * fs;
    t->ksize = (int32_t)ceil(support) * 2 + 1;
    t->lo = calloc((size_t)out, sizeof *t->lo);
    t->cnt = calloc((size_t)out, sizeof *t->cnt);
    t->k = calloc((size_t)out * t->ksize, sizeof *t->k);
    double *w = malloc((size_t)t->ksize * sizeof *w);
    if (!t->lo || !t->cnt || !t->k || !w) {
        free(w), taps_free(t);
        return epyq_err_set(err, EPYQ_E_NOMEM, "resize %d -> %d: out of memory", in, out);
    }
    for (int32_t o = 0; o < out; o++) {
        double c = (o + 0.5) * scale, sum = 0.0;
        int32_t a = (int32_t)(c - support + 0.5), b = (int32_t)(c + support + 0.5);
        if (a < 0) a = 0;
        if (b > in) b = in;
        int32_t n = b - a;
        for (int32_t j = 0; j < n; j++) sum += w[j] = cubic((j + a - c + 0.5) / fs);
        for (int32_t j = 0; j < n; j++) {
            double v = sum != 0.0 ? w[j] / sum : w[j];
            /* round half away from zero, as a C cast of v * 2^22 +- 0.5 does */
            t->k[(size_t)o * t->ksize + j] =
                (int32_t)(v < 0 ? v * (1 << PREC) - 0.5 : v * (1 << PREC) + 0.5);
        }
        t->lo[o] = a, t->cnt[o] = n;
    }
    free(w);
    return EPYQ_OK;
}

static uint8_t clip8(int64_t acc) {
    int64_t v = acc >> PREC;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

epyq_status epyq_vision_resize_bicubic(const uint8_t *src, int32_t sw, int32_t sh, uint8_t *dst,
                                       int32_t dw, int32_t dh, epyq_err *err) {
    if (sw < 1 || sh < 1 || dw < 1 || dh < 1)
        return epyq_err_set(err, EPYQ_E_ARG, "resize %dx%d -> %dx%d: expected positive sizes", sw,
                            sh, dw, dh);
    taps tx = {0}, ty = {0};
    TRY(taps_make(&tx, sw, dw, err));
    epyq_status st = taps_make(&ty, sh, dh, err);
    uint8_t *mid = st == EPYQ_OK ? malloc((size_t)sh * dw * 3) : NULL; /* [sh][dw][3] */
    if (st == EPYQ_OK && !mid) st = epyq_err_set(err, EPYQ_E_NOMEM, "resize: out of memory");
    if (st == EPYQ_OK) {
        /* horizontal pass (skipped, as in Pillow, when the width does not change) */
        for (int32_t y = 0; y < sh; y++)
            for (int32_t o = 0; o < dw; o++)
                for (int c = 0; c < 3; c++) {
                    uint8_t *d = mid + ((size_t)y * dw + o) * 3 + c;
                    if (sw == dw) {
                        *d = src[((size_t)y * sw + o) * 3 + c];
                        continue;
                    }
                    int64_t acc = 1 << (PREC - 1);
                    const int32_t *k = tx.k + (size_t)o * tx.ksize;
                    for (int32_t j = 0; j < tx.cnt[o]; j++)
                        acc += (int64_t)src[((size_t)y * sw + tx.lo[o] + j) * 3 + c] * k[j];
                    *d = clip8(acc);
                }
        for (int32_t o = 0; o < dh; o++)
            for (int32_t x = 0; x < dw; x++)
                for (int c = 0; c < 3; c++) {
                    uint8_t *d = dst + ((size_t)o * dw + x) * 3 + c;
                    if (sh == dh) {
                        *d = mid[((size_t)o * dw + x) * 3 + c];
                        continue;
                    }
                    int64_t acc = 1 << (PREC - 1);
                    const int32_t *k = ty.k + (size_t)o * ty.ksize;
                    for (int32_t j = 0; j < ty.cnt[o]; j++)
                        acc += (int64_t)mid[((size_t)(ty.lo[o] + j) * dw + x) * 3 + c] * k[j];
                    *d = clip8(acc);
                }
    }
    free(mid);
    taps_free(&tx), taps_free(&ty);
    return st;
}

void epyq_vision_input_free(epyq_vision_input *in) {
    if (!in) return;
    free(in->pix);
    memset(in, 0, sizeof *in);
}

epyq_status epyq_vision_patchify(const epyq_vision_pp *pp, const uint8_t *rgb, int32_t h, int32_t w,
                                 epyq_vision_input *out, epyq_err *err) {
    memset(out, 0, sizeof *out);
    int32_t p = pp->patch, T = pp->temporal, m = pp->merge, f = p * m;
    if (h % f || w % f)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "image of %d x %d: sides must be multiples of %d (patch x merge)", w, h,
                            f);
    int32_t gh = h / p, gw = w / p, cols = 3 * T * p * p;
    float *pix = malloc((size_t)gh * gw * cols * sizeof(float));
    if (!pix)
        return epyq_err_set(err, EPYQ_E_NOMEM, "patches of a %d x %d image: out of memory", w, h);
    double lut[3][256]; /* value of each level per channel */
    for (int c = 0; c < 3; c++)
        for (int u = 0; u < 256; u++) {
            double x = pp->do_rescale ? u * pp->rescale : u;
            lut[c][u] = pp->do_normalize ? (x - pp->mean[c]) / pp->std[c] : x;
        }
    for (int32_t bh = 0; bh < gh / m; bh++)
        for (int32_t bw = 0; bw < gw / m; bw++)
            for (int32_t ih = 0; ih < m; ih++)
                for (int32_t iw = 0; iw < m; iw++) {
                    int32_t row = ((bh * (gw / m) + bw) * m + ih) * m + iw, r = bh * m + ih,
                            cc = bw * m + iw;
                    float *o = pix + (size_t)row * cols;
                    for (int c = 0; c < 3; c++)
                        for (int32_t t = 0; t < T; t++) /* a still image: every frame is the same */
                            for (int32_t py = 0; py < p; py++)
                                for (int32_t px = 0; px < p; px++) {
                                    uint8_t u =
                                        rgb[(((size_t)r * p + py) * w + (size_t)cc * p + px) * 3 +
                                            c];
                                    o[((c * T + t) * p + py) * p + px] = (float)lut[c][u];
                                }
                }
    out->gh = gh, out->gw = gw, out->h = h, out->w = w, out->n = gh * gw, out->cols = cols,
    out->pix = pix;
    return EPYQ_OK;
}

epyq_status epyq_vision_prepare(const epyq_vision_pp *pp, const epyq_image *im, const char *label,
                                epyq_vision_input *out, epyq_err *err) {
    memset(out, 0, sizeof *out);
    int32_t f = pp->patch * pp->merge, th = im->h, tw = im->w;
    if (pp->do_resize) {
        epyq_status st = epyq_vision_smart_resize(im->h, im->w, f, pp->min_pixels, pp->max_pixels,
                                                  &th, &tw, err);
        if (st != EPYQ_OK) return epyq_err_prefix(err, "%s: ", label ? label : "image");
    }
    if (th == im->h && tw == im->w) return epyq_vision_patchify(pp, im->rgb, th, tw, out, err);
    uint8_t *rs = malloc((size_t)th * tw * 3);
    if (!rs)
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: resize to %d x %d: out of memory", label, tw,
                            th);
    epyq_status st = epyq_vision_resize_bicubic(im->rgb, im->w, im->h, rs, tw, th, err);
    if (st == EPYQ_OK) st = epyq_vision_patchify(pp, rs, th, tw, out, err);
    free(rs);
    return st;
}
