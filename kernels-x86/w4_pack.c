/* kernels-x86/w4_pack.c — converts the canonical int4 form (what every on-disk format
 * decodes to) into the kernels' tiled layout, and back. The layout is described in
 * w4_layout.h; this file is the only writer of it. Packing is integer-exact: unpack(pack(c))
 * returns c's codes, scales and zero points bit for bit (tests/kern/test_w4.c). */
#include <string.h>

#include "core/util.h"
#include "kernels-x86/w4_layout.h"

/* Largest matrix side we accept: keeps every size product below 2^62 without checks in the
 * kernels' hot loops (the real model's largest int4 side is 248320). */
#define W4_MAX_SIDE (1 << 24)

static int shape_ok(int32_t n, int32_t k, int32_t gs) {
    return (gs == 32 || gs == 64 || gs == 128) && n >= 1 && k >= gs && k % gs == 0 &&
           n <= W4_MAX_SIDE && k <= W4_MAX_SIDE;
}

size_t epyq_w4_pack_bytes(int32_t n, int32_t k, int32_t gs, int asym) {
    if (!shape_ok(n, k, gs)) return 0;
    size_t total;
    if (!epyq_mul_size((size_t)w4_tiles(n), w4_tile_bytes(k, gs, asym), &total)) return 0;
    return total;
}

static int canon_asym(const epyq_q4_canon *c) {
    if (!c->z) return 0;
    const size_t nz = (size_t)c->n * (size_t)(c->k / c->gs);
    for (size_t i = 0; i < nz; i++)
        if (c->z[i] != 8) return 1;
    return 0;
}

epyq_status epyq_w4_pack(epyq_w4 *dst, void *mem, const epyq_q4_canon *src, epyq_err *err) {
    const int32_t n = src->n, k = src->k, gs = src->gs;
    if (!shape_ok(n, k, gs))
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                            "int4 pack: shape [%d][%d] group %d: expected group 32, 64 or 128 "
                            "dividing k, 1 <= n, k <= %d",
                            (int)n, (int)k, (int)gs, W4_MAX_SIDE);
    if (((uintptr_t)mem & 63u) != 0)
        return epyq_err_set(err, EPYQ_E_ARG, "int4 pack: destination not 64-byte aligned");
    const int32_t G = k / gs, nt = w4_tiles(n), bpg = gs / W4_KBLK;
    const int asym = canon_asym(src);
    const size_t tb = w4_tile_bytes(k, gs, asym), rb = w4_rec_bytes(gs);

    /* Codes above 15 or zero points above 16 would alias other values once packed. */
    for (size_t i = 0; i < (size_t)n * (size_t)k; i++)
        if (src->q[i] > 15)
            return epyq_err_set(err, EPYQ_E_QUANT, "int4 pack: code %u at [%zu][%zu] > 15",
                                src->q[i], i / (size_t)k, i % (size_t)k);
    if (asym)
        for (size_t i = 0; i < (size_t)n * (size_t)G; i++)
            if (src->z[i] > 16)
                return epyq_err_set(err, EPYQ_E_QUANT,
                                    "int4 pack: zero point %u at [%zu][%zu] > 16", src->z[i],
                                    i / (size_t)G, i % (size_t)G);

    /* Padding rows: codes 0, scale 0 (so they contribute exactly 0), zero point 8. */
    memset(mem, 0, (size_t)nt * tb);
    for (int32_t t = 0; t < nt; t++) {
        uint8_t *tile = (uint8_t *)mem + (size_t)t * tb;
        uint8_t *zeros = tile + (size_t)G * rb; /* [G][16] */
        for (int32_t r = 0; r < W4_TILE; r++) {
            const int32_t j = t * W4_TILE + r;
            for (int32_t g = 0; g < G; g++) {
                uint8_t *rec = tile + (size_t)g * rb;
                float s = 0.0f;
                uint8_t z = 8;
                if (j < n) {
                    s = src->s[(size_t)j * (size_t)G + (size_t)g];
                    if (asym) z = src->z[(size_t)j * (size_t)G + (size_t)g];
                    const uint8_t *q = src->q + (size_t)j * (size_t)k + (size_t)g * (size_t)gs;
                    for (int32_t b = 0; b < bpg; b++) {
                        uint32_t word = 0;
                        for (int p = 0; p < W4_KBLK; p++)
                            word |= (uint32_t)q[b * W4_KBLK + p] << (4 * p);
                        memcpy(rec + (size_t)b * W4_BLOCK + (size_t)r * 4, &word, 4);
                    }
                }
                memcpy(rec + (size_t)bpg * W4_BLOCK + (size_t)r * sizeof(float), &s, sizeof s);
                if (asym) zeros[(size_t)g * W4_TILE + (size_t)r] = z;
            }
        }
    }
    dst->n = n;
    dst->k = k;
    dst->gs = gs;
    dst->asym = asym;
    dst->mem = mem;
    dst->bytes = (size_t)nt * tb;
    return EPYQ_OK;
}

int epyq_w4_view(const epyq_w4 *w, int32_t n0, int32_t n1, epyq_w4 *view) {
    if (n0 < 0 || n1 > w->n || n1 <= n0 || n0 % W4_TILE) return 0;
    *view = *w;
    view->n = n1 - n0;
    view->mem = (uint8_t *)w->mem + (size_t)(n0 / W4_TILE) * w4_tile_bytes(w->k, w->gs, w->asym);
    view->bytes = (size_t)w4_tiles(n1 - n0) * w4_tile_bytes(w->k, w->gs, w->asym);
    return 1;
}

int epyq_w4_cols(const epyq_w4 *w, int32_t g0, int32_t g1, void *mem, epyq_w4 *out) {
    const int32_t G = w->k / w->gs;
    if (g0 < 0 || g1 > G || g1 <= g0 || ((uintptr_t)mem & 63u) != 0) return 0;
    const int32_t kk = (g1 - g0) * w->gs, nt = w4_tiles(w->n);
    const size_t tb = w4_tile_bytes(w->k, w->gs, w->asym), rb = w4_rec_bytes(w->gs);
    const size_t ntb = w4_tile_bytes(kk, w->gs, w->asym);
    for (int32_t t = 0; t < nt; t++) {
        const uint8_t *src = (const uint8_t *)w->mem + (size_t)t * tb;
        uint8_t *dst = (uint8_t *)mem + (size_t)t * ntb;
        /* a tile's group records are in k order, so the slice's records are one run */
        memcpy(dst, src + (size_t)g0 * rb, (size_t)(g1 - g0) * rb);
        if (w->asym) { /* its zero points [G][16] likewise, the padding to 64 bytes zeroed */
            uint8_t *z = dst + (size_t)(g1 - g0) * rb;
            memset(z, 0, w4_zero_bytes(kk, w->gs, 1));
            memcpy(z, src + (size_t)G * rb + (size_t)g0 * W4_TILE, (size_t)(g1 - g0) * W4_TILE);
        }
    }
    *out = *w;
    out->k = kk;
    out->mem = mem;
    out->bytes = (size_t)nt * ntb;
    return 1;
}

void epyq_w4_unpack(const epyq_w4 *w, uint8_t *q, float *s, uint8_t *z) {
    const int32_t k = w->k, gs = w->gs, G = k / gs, bpg = gs / W4_KBLK;
    const size_t rb = w4_rec_bytes(gs);
    for (int32_t j = 0; j < w->n; j++) {
        const uint8_t *tile = w4_tile_ptr(w, j / W4_TILE);
        const int32_t r = j % W4_TILE;
        for (int32_t g = 0; g < G; g++) {
            const uint8_t *rec = tile + (size_t)g * rb;
            for (int32_t b = 0; b < bpg; b++) {
                uint32_t word;
                memcpy(&word, rec + (size_t)b * W4_BLOCK + (size_t)r * 4, 4);
                for (int p = 0; p < W4_KBLK; p++)
                    q[(size_t)j * (size_t)k + (size_t)g * (size_t)gs + (size_t)(b * W4_KBLK + p)] =
                        (uint8_t)((word >> (4 * p)) & 15u);
            }
            memcpy(&s[(size_t)j * (size_t)G + (size_t)g],
                   rec + (size_t)bpg * W4_BLOCK + (size_t)r * sizeof(float), sizeof(float));
            z[(size_t)j * (size_t)G + (size_t)g] =
                w->asym ? w4_tile_zeros(w, tile)[(size_t)g * W4_TILE + (size_t)r] : 8;
        }
    }
}
