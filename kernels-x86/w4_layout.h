/* kernels-x86/w4_layout.h — the private memory layouts of the int4 kernels: the packed
 * weight matrix (epyq_w4.mem) and the prepared activations (epyq_act.buf). Shared by the
 * packer, the ref twins and every SIMD file, so all of them read the same bytes.
 *
 * Packed weights. Output rows are grouped in tiles of 16 (one 512-bit register of fp32
 * accumulators, one lane per row); the last tile is padded with rows of scale 0. A tile
 * stores its groups in k order, then (asymmetric matrices only) its zero points:
 *
 *   tile  : [G] group records, [G][16] u8 zero points (asym only; padded to 64 bytes)
 *   record: [gs/8] blocks of 64 bytes, then [16] fp32 scales (64 bytes)
 *   block : [16 rows] u32; the u32 of row r holds its 8 codes k0+0 .. k0+7, code k0+p in
 *           bits 4p..4p+3 ("sequential" nibble order, as GPTQ writes it).
 *
 * One 64-byte load therefore carries 16 rows x 8 k, and both numeric paths get their
 * operands from it with shifts and masks (no shuffles across lanes):
 *   A8 (VPDPBUSD, 4 bytes per lane): v & 0x0f.. gives the codes of k0+{0,2,4,6},
 *       (v >> 4) & 0x0f.. those of k0+{1,3,5,7} (or v & 0xf0.., 16 times them, summed
 *       apart and divided by 16 at the group's end: exact);
 *   A16 (VPDPWSSD, 2 int16 per lane): (v >> 4t) & 0x000f000f.. keeps k0+t in the low and
 *       k0+t+4 in the high 16-bit half of each lane (t = 0..3; the SIMD cores take t = 1, 3
 *       as 16 times the code in the same way).
 * The activations are stored permuted within each run of 8 to match (below), so the
 * kernels broadcast 4 (A8) or 2 (A16) consecutive activation elements per instruction.
 *
 * Scales are kept in fp32 (exact widening of the on-disk bf16/f16, one format for every
 * checkpoint); they cost 64 of every 1088 bytes at gs 128.
 *
 * Prepared activations (m rows of k values, G = k / gs groups):
 *   A8 : x8   [m][k]    int8, per 8-run order 0,2,4,6,1,3,5,7; x8 = rint(x * 127/amax_g)
 *        d    [m][G]    fp32 amax_g / 127 (the int8 step of the group)
 *        sum8 [m][G]    int32 sum of the group's x8 (for the zero-point term)
 *   A16: x16  [m][k]    int16, per 8-run order 0,4,1,5,2,6,3,7; x16 = rint(x * 32767/amax_g)
 *        d    [m][G]    fp32 amax_g / 32767
 *        sum16 [m][G]   int32 sum of the group's x16
 *        (a group's dot, at most 128 x 15 x 32767 < 2^26, and its zero-point term, at most
 *        16 x 128 x 32767 < 2^26, are exact in int32)
 * Each array starts on a 64-byte boundary. Both paths need gs >= 32 and gs | k. */
#ifndef EPYQ_W4_LAYOUT_H
#define EPYQ_W4_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels-x86/kern.h"

#define W4_TILE 16    /* output rows per tile */
#define W4_BLOCK 64   /* bytes of one block: 16 rows x 8 codes */
#define W4_KBLK 8     /* k per block */

static inline size_t w4_align64(size_t b) { return (b + 63u) & ~(size_t)63u; }

static inline int32_t w4_tiles(int32_t n) { return (n + W4_TILE - 1) / W4_TILE; }

/* Bytes of one group record: code blocks + 16 fp32 scales. */
static inline size_t w4_rec_bytes(int32_t gs) {
    return (size_t)(gs / W4_KBLK) * W4_BLOCK + W4_TILE * sizeof(float);
}

/* Bytes of the zero-point block of one tile (0 when symmetric). */
static inline size_t w4_zero_bytes(int32_t k, int32_t gs, int asym) {
    return asym ? w4_align64((size_t)(k / gs) * W4_TILE) : 0;
}

static inline size_t w4_tile_bytes(int32_t k, int32_t gs, int asym) {
    return (size_t)(k / gs) * w4_rec_bytes(gs) + w4_zero_bytes(k, gs, asym);
}

/* Start of tile `t` of a packed matrix. */
static inline const uint8_t *w4_tile_ptr(const epyq_w4 *w, int32_t t) {
    return (const uint8_t *)w->mem + (size_t)t * w4_tile_bytes(w->k, w->gs, w->asym);
}

/* Zero points [G][16] of a tile (asym only). */
static inline const uint8_t *w4_tile_zeros(const epyq_w4 *w, const uint8_t *tile) {
    return tile + (size_t)(w->k / w->gs) * w4_rec_bytes(w->gs);
}

/* Position of element e (0..7) of an 8-run inside the permuted activation run. */
static inline int w4_a8_pos(int e) { return (e & 1) ? 4 + (e >> 1) : e >> 1; }
static inline int w4_a16_pos(int e) { return e < 4 ? 2 * e : 2 * (e - 4) + 1; }

/* Views into a prepared activation buffer. */
typedef struct {
    const int8_t *x8;    /* [m][k] */
    const float *d;      /* [m][G] */
    const int32_t *sum8; /* [m][G] */
} w4_a8_view;

typedef struct {
    const int16_t *x16;   /* [m][k] */
    const float *d;       /* [m][G] */
    const int32_t *sum16; /* [m][G] */
} w4_a16_view;

static inline size_t w4_a8_off_d(int32_t m, int32_t k) { return w4_align64((size_t)m * (size_t)k); }
static inline size_t w4_a8_off_sum(int32_t m, int32_t k, int32_t gs) {
    return w4_a8_off_d(m, k) + w4_align64((size_t)m * (size_t)(k / gs) * sizeof(float));
}
static inline size_t w4_a16_off_d(int32_t m, int32_t k) {
    return w4_align64((size_t)m * (size_t)k * sizeof(int16_t));
}
static inline size_t w4_a16_off_sum(int32_t m, int32_t k, int32_t gs) {
    return w4_a16_off_d(m, k) + w4_align64((size_t)m * (size_t)(k / gs) * sizeof(float));
}

static inline w4_a8_view w4_a8_of(const epyq_act *a) {
    const uint8_t *b = (const uint8_t *)a->buf;
    w4_a8_view v = {(const int8_t *)b, (const float *)(b + w4_a8_off_d(a->m, a->k)),
                    (const int32_t *)(b + w4_a8_off_sum(a->m, a->k, a->gs))};
    return v;
}

static inline w4_a16_view w4_a16_of(const epyq_act *a) {
    const uint8_t *b = (const uint8_t *)a->buf;
    w4_a16_view v = {(const int16_t *)b, (const float *)(b + w4_a16_off_d(a->m, a->k)),
                     (const int32_t *)(b + w4_a16_off_sum(a->m, a->k, a->gs))};
    return v;
}

#endif
