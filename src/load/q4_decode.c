/* src/load/q4_decode.c — every on-disk int4 layout decoded to one canonical form
 * (kernels-x86/kern.h epyq_q4_canon) and to fp32; the bit-level rules are
 * docs/quant-formats.md §3–§7. Everything format-specific about int4 lives here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/weights.h"

/* Safetensors data is little-endian and may be unaligned: read through memcpy (x86 host). */
static inline uint32_t word_at(const epyq_tensor *t, size_t i) {
    uint32_t w;
    memcpy(&w, (const uint8_t *)t->data + 4 * i, 4);
    return w;
}

static inline float float_at(const epyq_tensor *t, size_t i) {
    const uint8_t *p = (const uint8_t *)t->data;
    uint16_t h;
    float f;
    switch (t->dtype) {
    case EPYQ_DT_BF16: memcpy(&h, p + 2 * i, 2); return epyq_bf16_to_f32(h);
    case EPYQ_DT_F16: memcpy(&h, p + 2 * i, 2); return epyq_f16_to_f32(h);
    default: memcpy(&f, p + 4 * i, 4); return f;
    }
}

/* Slot of element j of a run of 8 packed along N: AWQ order keeps even elements in the low
 * 16 bits (slot j/2) and odd ones in the high 16 bits (slot 4 + j/2), docs/quant-formats.md §3. */
static const uint8_t awq_slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};
static const uint8_t seq_slot[8] = {0, 1, 2, 3, 4, 5, 6, 7};

static inline uint8_t nib(uint32_t w, unsigned slot) { return (uint8_t)((w >> (4 * slot)) & 0xFu); }

/* Stored zero points of an int4 linear with a zero-point tensor, in the canonical unsigned
 * domain z [N][Gn] (8 = no offset), whatever the scheme says: the symmetric cases ignore them
 * when decoding but inspect checks they hold the bias. */
static void decode_zeros(const epyq_linear *l, const epyq_config *cfg, uint8_t *z) {
    const int64_t N = l->n_out, Gn = l->n_in / l->scheme.group_size;
    const epyq_tensor *zp = l->qzeros;
    switch (cfg->qformat) {
    case EPYQ_QF_GPTQ:
    case EPYQ_QF_AWQ: { /* [Gn][N/8] packed along N */
        const bool awq = cfg->qformat == EPYQ_QF_AWQ;
        /* GPTQ v1 stores zero - 1; GPTQModel restores it by adding 0x11111111 to the whole word. */
        const uint32_t fix = !awq && cfg->gptq_version == 1 ? 0x11111111u : 0;
        for (int64_t g = 0; g < Gn; g++)
            for (int64_t c = 0; c < N / 8; c++) {
                uint32_t w = word_at(zp, (size_t)(g * (N / 8) + c)) + fix;
                for (int j = 0; j < 8; j++) z[(8 * c + j) * Gn + g] = nib(w, awq ? awq_slot[j] : (unsigned)j);
            }
        break;
    }
    case EPYQ_QF_CT: { /* [ceil(N/8)][Gn] packed along N (dim 0), sequential, zero + 8 */
        for (int64_t n = 0; n < N; n++)
            for (int64_t g = 0; g < Gn; g++) z[n * Gn + g] = nib(word_at(zp, (size_t)((n / 8) * Gn + g)), (unsigned)(n % 8));
        break;
    }
    case EPYQ_QF_QUARK: { /* [Gn][ceil(N/8)] packed like the weight */
        const uint8_t *slot = cfg->quark_reorder ? awq_slot : seq_slot;
        const uint8_t flip = cfg->quark_signed ? 8 : 0;
        const int64_t W = (N + 7) / 8;
        for (int64_t g = 0; g < Gn; g++)
            for (int64_t n = 0; n < N; n++)
                z[n * Gn + g] = nib(word_at(zp, (size_t)(g * W + n / 8)), slot[n % 8]) ^ flip;
        break;
    }
    case EPYQ_QF_NONE: break;
    }
}

/* Canonical codes of one linear in on-disk column order: q [N][K] unsigned, s [N][Gn],
 * z [N][Gn] with W[n][k] = (q - z[n][g(k)]) * s[n][g(k)], g(k) = g_idx ? g_idx[k] : k / gs. */
static epyq_status decode(const epyq_linear *l, const epyq_config *cfg, uint8_t *q, float *s, uint8_t *z,
                          epyq_err *err) {
    const int64_t N = l->n_out, K = l->n_in, gs = l->scheme.group_size, Gn = K / gs;
    const epyq_tensor *qw = l->qweight, *sc = l->scales, *zp = l->qzeros;
    if (!qw || !sc || !qw->data || !sc->data || (zp && !zp->data))
        return epyq_err_set(err, EPYQ_E_ARG, "%s: int4 tensors are not bound to data", l->module);
    switch (cfg->qformat) {
    case EPYQ_QF_GPTQ: /* qweight [K/8][N]: word (i, n) slot j = q[n][8i + j] */
        for (int64_t i = 0; i < K / 8; i++)
            for (int64_t n = 0; n < N; n++) {
                uint32_t w = word_at(qw, (size_t)(i * N + n));
                for (int j = 0; j < 8; j++) q[n * K + 8 * i + j] = nib(w, (unsigned)j);
            }
        break;
    case EPYQ_QF_CT: { /* weight_packed [N][ceil(K/8)]: sequential along K, code + 8 */
        const int64_t W = (K + 7) / 8;
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < W; c++) {
                uint32_t w = word_at(qw, (size_t)(n * W + c));
                for (int j = 0; j < 8 && 8 * c + j < K; j++) q[n * K + 8 * c + j] = nib(w, (unsigned)j);
            }
        break;
    }
    case EPYQ_QF_QUARK:
    case EPYQ_QF_AWQ: { /* [K][ceil(N/8)]: 8 outputs of one input per word, packed along N */
        const bool awq_order = cfg->qformat == EPYQ_QF_AWQ || cfg->quark_reorder;
        const uint8_t *slot = awq_order ? awq_slot : seq_slot;
        /* Quark int4 stores two's complement; XOR 8 maps it to the unsigned code q + 8. */
        const uint8_t flip = cfg->qformat == EPYQ_QF_QUARK && cfg->quark_signed ? 8 : 0;
        const int64_t W = (N + 7) / 8;
        for (int64_t k = 0; k < K; k++)
            for (int64_t c = 0; c < W; c++) {
                uint32_t w = word_at(qw, (size_t)(k * W + c));
                for (int j = 0; j < 8 && 8 * c + j < N; j++) q[(8 * c + j) * K + k] = nib(w, slot[j]) ^ flip;
            }
        break;
    }
    case EPYQ_QF_NONE: return epyq_err_set(err, EPYQ_E_ARG, "%s: not an int4 linear", l->module);
    }
    /* Scales: [N][Gn] for compressed-tensors, transposed [Gn][N] for the others. */
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < Gn; g++) {
            size_t i = cfg->qformat == EPYQ_QF_CT ? (size_t)(n * Gn + g) : (size_t)(g * N + n);
            float v = float_at(sc, i);
            if (!isfinite(v))
                return epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s: non-finite scale %g for output %lld, group %lld",
                                    epyq_qformat_name(cfg->qformat), sc->name, (double)v, (long long)n, (long long)g);
            s[n * Gn + g] = v;
        }
    /* Zero points. */
    if (!zp || (l->scheme.sym && cfg->qformat != EPYQ_QF_QUARK)) {
        /* Symmetric: z = 8 in the unsigned domain (GPTQ ignores qzeros then, docs/quant-formats.md
         * §4.3). */
        memset(z, 8, (size_t)(N * Gn));
        return EPYQ_OK;
    }
    decode_zeros(l, cfg, z);
    return EPYQ_OK;
}

/* g_idx values, range-checked; *trivial when g_idx[k] == k / gs for every k. */
static epyq_status read_gidx(const epyq_linear *l, int32_t *gi, bool *trivial, epyq_err *err) {
    const int64_t K = l->n_in, gs = l->scheme.group_size, Gn = K / gs;
    *trivial = true;
    if (!l->g_idx) return EPYQ_OK;
    if (!l->g_idx->data) return epyq_err_set(err, EPYQ_E_ARG, "%s: g_idx not bound to data", l->module);
    for (int64_t k = 0; k < K; k++) {
        int32_t v = (int32_t)word_at(l->g_idx, (size_t)k);
        if (v < 0 || v >= Gn)
            return epyq_err_set(err, EPYQ_E_FORMAT, "tensor %s: g_idx[%lld] = %d, expected a group in [0, %lld)", l->g_idx->name,
                                (long long)k, v, (long long)Gn);
        gi[k] = v;
        if (v != k / gs) *trivial = false;
    }
    return EPYQ_OK;
}

static epyq_status dense_dequant(const epyq_linear *l, float *w, epyq_err *err) {
    const epyq_tensor *t = l->w;
    if (!t || !t->data) return epyq_err_set(err, EPYQ_E_ARG, "%s: weight not bound to data", l->module);
    int64_t rows = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    size_t base = (size_t)((l->slice * rows + l->row0) * l->n_in), n = (size_t)(l->n_out * l->n_in);
    if (base + n > t->nbytes / epyq_dtype_size(t->dtype))
        return epyq_err_set(err, EPYQ_E_INTERNAL, "%s: rows outside tensor %s", l->module, t->name);
    for (size_t i = 0; i < n; i++) w[i] = float_at(t, base + i);
    return EPYQ_OK;
}

epyq_status epyq_linear_dequant(const epyq_linear *l, const epyq_config *cfg, float *w, epyq_err *err) {
    if (l->kind == EPYQ_LIN_DENSE) return dense_dequant(l, w, err);
    const int64_t N = l->n_out, K = l->n_in, Gn = K / l->scheme.group_size;
    uint8_t *q = malloc((size_t)(N * K)), *z = malloc((size_t)(N * Gn));
    float *s = malloc((size_t)(N * Gn) * sizeof *s);
    int32_t *gi = malloc((size_t)K * sizeof *gi);
    epyq_status st = EPYQ_OK;
    bool trivial;
    if (!q || !z || !s || !gi) st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory decoding", l->module);
    if (!st) st = decode(l, cfg, q, s, z, err);
    if (!st) st = read_gidx(l, gi, &trivial, err);
    if (!st) {
        const int64_t gs = l->scheme.group_size;
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                int64_t g = l->g_idx ? gi[k] : k / gs;
                /* |q - z| <= 15 and s has <= 24 significant bits: the product is exact in fp32 */
                w[n * K + k] = (float)((int)q[n * K + k] - (int)z[n * Gn + g]) * s[n * Gn + g];
            }
    }
    free(q);
    free(z);
    free(s);
    free(gi);
    return st;
}

epyq_status epyq_linear_unpack_q4(const epyq_linear *l, const epyq_config *cfg, uint8_t *q, float *s, uint8_t *z,
                                  int32_t *perm, bool *has_perm, epyq_err *err) {
    *has_perm = false;
    if (l->kind != EPYQ_LIN_Q4) return epyq_err_set(err, EPYQ_E_ARG, "%s: not an int4 linear", l->module);
    const int64_t N = l->n_out, K = l->n_in, gs = l->scheme.group_size, Gn = K / gs;
    uint8_t *zt = z ? z : malloc((size_t)(N * Gn));
    int32_t *gi = malloc((size_t)K * sizeof *gi);
    uint8_t *row = malloc((size_t)K);
    int32_t *fill = calloc((size_t)Gn, sizeof *fill);
    bool trivial = true;
    epyq_status st = EPYQ_OK;
    if (!zt || !gi || !row || !fill) st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory decoding", l->module);
    if (!st) st = decode(l, cfg, q, s, zt, err);
    if (!st && !z)
        for (int64_t i = 0; i < N * Gn; i++)
            if (zt[i] != 8) {
                st = epyq_err_set(err, EPYQ_E_ARG, "%s: zero point %d is not 8: the caller must pass a zero buffer", l->module,
                                  zt[i]);
                break;
            }
    if (!st) st = read_gidx(l, gi, &trivial, err);
    if (!st && !trivial) {
        /* Act-order: gather columns so each canonical group is contiguous; a stable counting
         * sort by group keeps the original column order inside every group. */
        if (!perm) st = epyq_err_set(err, EPYQ_E_ARG, "%s: act-order g_idx needs a perm buffer", l->module);
        for (int64_t k = 0; !st && k < K; k++) fill[gi[k]]++;
        for (int64_t g = 0; !st && g < Gn; g++)
            if (fill[g] != gs)
                st = epyq_err_set(err, EPYQ_E_QUANT, "tensor %s: group %lld has %d columns, expected group_size %lld",
                                  l->g_idx->name, (long long)g, fill[g], (long long)gs);
        if (!st) {
            for (int64_t g = 0; g < Gn; g++) fill[g] = (int32_t)(g * gs);
            for (int64_t k = 0; k < K; k++) perm[fill[gi[k]]++] = (int32_t)k;
            for (int64_t n = 0; n < N; n++) {
                memcpy(row, q + n * K, (size_t)K);
                for (int64_t i = 0; i < K; i++) q[n * K + i] = row[perm[i]];
            }
            *has_perm = true;
        }
    }
    if (zt != z) free(zt);
    free(gi);
    free(row);
    free(fill);
    return st;
}

uint64_t epyq_linear_bytes(const epyq_linear *l) {
    if (l->kind == EPYQ_LIN_DENSE)
        return l->w ? (uint64_t)l->n_out * (uint64_t)l->n_in * epyq_dtype_size(l->w->dtype) : 0;
    /* A GEMV streams the packed codes and the scales; zero points only when they vary. */
    uint64_t b = l->qweight->nbytes + l->scales->nbytes;
    if (l->qzeros && !l->scheme.sym) b += l->qzeros->nbytes;
    return b;
}

/* ---- checks without decoding the codes (inspect's default scan) ---- */

/* Index of the first scale that is not a positive finite number, or -1. Every writer of the
 * four formats produces strictly positive scales (GPTQ's quantizer widens an all-zero group
 * to [-1, 1], compressed-tensors and Quark clamp to eps, AutoAWQ to 1e-5), so zero, negative,
 * NaN and inf all mean a damaged file. Done on the raw bits: positive finite non-zero is one
 * unsigned range per dtype (bf16 0x0001..0x7F7F, f16 0x0001..0x7BFF, f32 1..0x7F7FFFFF). */
static int64_t first_bad_scale(const epyq_tensor *t, int64_t count) {
    const uint8_t *p = (const uint8_t *)t->data;
    if (t->dtype == EPYQ_DT_F32) {
        for (int64_t i = 0; i < count; i++) {
            uint32_t b;
            memcpy(&b, p + 4 * i, 4);
            if (b - 1u >= 0x7F7FFFFFu) return i;
        }
        return -1;
    }
    const uint16_t top = t->dtype == EPYQ_DT_BF16 ? 0x7F7F : 0x7BFF;
    for (int64_t i = 0; i < count; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        if ((uint16_t)(h - 1u) >= top) return i;
    }
    return -1;
}

epyq_status epyq_linear_check_q4(const epyq_linear *l, const epyq_config *cfg, epyq_err *err) {
    if (l->kind != EPYQ_LIN_Q4) return EPYQ_OK;
    const int64_t N = l->n_out, K = l->n_in, gs = l->scheme.group_size, Gn = K / gs;
    const epyq_tensor *sc = l->scales, *zp = l->qzeros;
    const char *fmt = epyq_qformat_name(cfg->qformat);
    if (!sc || !sc->data || (zp && !zp->data))
        return epyq_err_set(err, EPYQ_E_ARG, "%s: int4 tensors are not bound to data", l->module);
    int64_t i = first_bad_scale(sc, N * Gn);
    if (i >= 0) {
        /* [N][Gn] for compressed-tensors, transposed [Gn][N] for the others */
        bool ct = cfg->qformat == EPYQ_QF_CT;
        int64_t n = ct ? i / Gn : i % N, g = ct ? i % Gn : i / N;
        float v = float_at(sc, (size_t)i);
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: tensor %s: scale %g for output row %lld, group %lld: expected a positive finite "
                            "scale (%s)",
                            fmt, sc->name, (double)v, (long long)n, (long long)g,
                            isnan(v) ? "found NaN" : isinf(v) ? "found inf" : v == 0 ? "found zero" : "found a negative one");
    }
    /* Asymmetric zero points: every 4-bit value is a valid zero (GPTQ v1's whole-word "zero - 1"
     * storage round-trips all of 0..15 through its borrows), so there is no range to check. A
     * symmetric scheme fixes the zero at the bias, 8 unsigned: GPTQ sym stores it (7 in v1, 8
     * in v2) though loaders ignore it, Quark int4 stores signed 0. Anything else means the
     * checkpoint was not the symmetric one its config claims. */
    if (l->scheme.sym && zp) {
        uint8_t *z = malloc((size_t)(N * Gn));
        if (!z) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory checking zero points", l->module);
        decode_zeros(l, cfg, z);
        epyq_status st = EPYQ_OK;
        for (int64_t j = 0; j < N * Gn; j++)
            if (z[j] != 8) {
                int stored = cfg->qformat == EPYQ_QF_GPTQ && cfg->gptq_version == 1 ? z[j] - 1
                           : cfg->qformat == EPYQ_QF_QUARK && cfg->quark_signed ? (z[j] ^ 8) - ((z[j] ^ 8) & 8) * 2
                           : z[j];
                int want = cfg->qformat == EPYQ_QF_GPTQ && cfg->gptq_version == 1 ? 7
                         : cfg->qformat == EPYQ_QF_QUARK && cfg->quark_signed ? 0 : 8;
                st = epyq_err_set(err, EPYQ_E_FORMAT,
                                  "%s: tensor %s: zero point %d stored for output row %lld, group %lld of a symmetric "
                                  "scheme: expected %d (the symmetric zero 8)",
                                  fmt, zp->name, stored, (long long)(j / Gn), (long long)(j % Gn), want);
                break;
            }
        free(z);
        if (st) return st;
    }
    /* g_idx: every value a group, and (act-order) every group exactly group_size columns,
     * which is what the loader's gather needs. */
    if (l->g_idx) {
        if (!l->g_idx->data) return epyq_err_set(err, EPYQ_E_ARG, "%s: g_idx not bound to data", l->module);
        int32_t *fill = calloc((size_t)Gn, sizeof *fill);
        if (!fill) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory checking g_idx", l->module);
        epyq_status st = EPYQ_OK;
        for (int64_t k = 0; k < K && !st; k++) {
            int32_t v = (int32_t)word_at(l->g_idx, (size_t)k);
            if (v < 0 || v >= Gn)
                st = epyq_err_set(err, EPYQ_E_FORMAT, "tensor %s: g_idx[%lld] = %d, expected a group in [0, %lld)",
                                  l->g_idx->name, (long long)k, v, (long long)Gn);
            else fill[v]++;
        }
        for (int64_t g = 0; g < Gn && !st; g++)
            if (fill[g] != gs)
                st = epyq_err_set(err, EPYQ_E_QUANT, "tensor %s: group %lld has %d columns, expected group_size %lld",
                                  l->g_idx->name, (long long)g, fill[g], (long long)gs);
        free(fill);
        if (st) return st;
    }
    return EPYQ_OK;
}
