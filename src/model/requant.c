/* src/model/requant.c — cheaper copies of 16-bit linears, made at load (--requant).
 *
 * Why: the BF16 lm_head is 1.0 GB of the 2.3 GB a decoded token reads on the int4 releases,
 * and the GPTQModel release keeps attention and the shared experts in BF16 too. Nothing here
 * is written to disk, and the exact BF16 path stays the default.
 *
 * Both kinds reuse the int4 kernels (their integer dots are exact on every table, so no new
 * SIMD code and no new twin):
 *   int4: round-to-nearest per group of gs, asymmetric: the group's range widened to hold 0,
 *         s = (max - min) / 15, z = rne(-min / s), q = clamp(rne(x / s) + z, 0, 15).
 *   int8: round-to-nearest per group, symmetric: s = amax / 127, c = clamp(rne(x / s), -127,
 *         127). c + 128 is split into nibble planes, c = 16 (h - 8) + l with h = (c + 128) >> 4
 *         and l = (c + 128) & 15, and each plane is an int4 matrix: h with zero 8 and scale 16 s,
 *         l with zero 0 and scale s. W x = H x + L x; both dots are exact integers, so the only
 *         rounding beyond int8 RTN is the fp32 epilogue's. The two planes stream 2 x 1104 bytes
 *         per 2048-wide row (a native int8 row with fp32 scales: 2112).
 * Codes use the kernel table's quant_codes (EPYQ_Q4_ROUND_DIV), identical on every table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

const char *epyq_requant_name(epyq_requant r) {
    switch (r) {
    case EPYQ_REQUANT_INT8: return "int8";
    case EPYQ_REQUANT_INT4: return "int4";
    default: return "bf16";
    }
}

static epyq_status parse_kind(const char *v, size_t n, epyq_requant *out, epyq_err *err);

epyq_status epyq_requant_parse_kind(const char *v, epyq_requant *out, epyq_err *err) {
    return parse_kind(v, strlen(v), out, err);
}

static epyq_status parse_kind(const char *v, size_t n, epyq_requant *out, epyq_err *err) {
    if (n == 4 && !strncmp(v, "int8", 4)) *out = EPYQ_REQUANT_INT8;
    else if (n == 4 && !strncmp(v, "int4", 4)) *out = EPYQ_REQUANT_INT4;
    else if ((n == 4 && !strncmp(v, "bf16", 4)) || (n == 4 && !strncmp(v, "none", 4))) *out = EPYQ_REQUANT_NONE;
    else
        return epyq_err_set(err, EPYQ_E_ARG, "expected int8, int4 or bf16, found '%.*s'", (int)n,
                            v);
    return EPYQ_OK;
}

epyq_status epyq_requant_parse(const char *spec, epyq_requant *lm_head, epyq_requant *dense,
                               epyq_err *err) {
    if (!strcmp(spec, "none")) {
        *lm_head = *dense = EPYQ_REQUANT_NONE;
        return EPYQ_OK;
    }
    for (const char *p = spec;;) {
        const char *end = strchr(p, ','), *eq = strchr(p, '=');
        if (!end) end = p + strlen(p);
        if (!eq || eq > end || eq == p)
            return epyq_err_set(err, EPYQ_E_ARG, "--requant: expected WHAT=KIND (lm_head=int8, "
                                "dense=int4, ...), found '%.*s'", (int)(end - p), p);
        epyq_requant *dst = NULL;
        if (eq - p == 7 && !strncmp(p, "lm_head", 7)) dst = lm_head;
        else if (eq - p == 5 && !strncmp(p, "dense", 5)) dst = dense;
        else
            return epyq_err_set(err, EPYQ_E_ARG, "--requant: expected lm_head or dense, found '%.*s'",
                                (int)(eq - p), p);
        epyq_status st = parse_kind(eq + 1, (size_t)(end - eq - 1), dst, err);
        if (st != EPYQ_OK) return epyq_err_prefix(err, "--requant: "), st;
        if (!*end) return EPYQ_OK;
        p = end + 1;
    }
}

/* Groups of one row: codes and scale/zero per group for the int4 rule. */
static void row_int4(const epyq_kern_table *kt, const float *x, int32_t k, int32_t gs,
                     uint8_t *q, float *s, uint8_t *z) {
    for (int32_t g = 0; g < k / gs; g++) {
        float mn, mx;
        kt->minmax(x + (size_t)g * gs, (size_t)gs, &mn, &mx);
        if (mn > 0.0f) mn = 0.0f;
        if (mx < 0.0f) mx = 0.0f;
        float sc = (mx - mn) / 15.0f;
        if (!(sc > 0.0f) || !isfinite(sc)) sc = 1.0f; /* an all-zero group: any scale is exact */
        float zf = rintf(-mn / sc);
        if (zf < 0.0f) zf = 0.0f;
        if (zf > 15.0f) zf = 15.0f;
        s[g] = sc, z[g] = (uint8_t)zf;
        kt->quant_codes(x + (size_t)g * gs, (size_t)gs, sc, zf, EPYQ_Q4_ROUND_DIV, q + (size_t)g * gs);
    }
}

/* The int8 rule: nibble planes h (zero 8, scale 16 s) and l (zero 0, scale s). */
static void row_int8(const float *x, int32_t k, int32_t gs, uint8_t *qh, float *sh, uint8_t *zh,
                     uint8_t *ql, float *sl, uint8_t *zl) {
    for (int32_t g = 0; g < k / gs; g++) {
        const float *xg = x + (size_t)g * gs;
        float amax = 0.0f;
        for (int32_t i = 0; i < gs; i++) amax = fmaxf(amax, fabsf(xg[i]));
        float sc = amax / 127.0f;
        if (!(sc > 0.0f) || !isfinite(sc)) sc = 1.0f;
        for (int32_t i = 0; i < gs; i++) {
            float c = rintf(xg[i] / sc);
            if (c < -127.0f) c = -127.0f;
            if (c > 127.0f) c = 127.0f;
            int u = (int)c + 128;
            qh[(size_t)g * gs + i] = (uint8_t)(u >> 4);
            ql[(size_t)g * gs + i] = (uint8_t)(u & 15);
        }
        sh[g] = 16.0f * sc, zh[g] = 8;
        sl[g] = sc, zl[g] = 0;
    }
}

typedef struct {
    uint8_t *q, *z;
    float *s;
    void *mem;
} plane;

static void plane_free(const epyq_model *m, plane *p) {
    free(p->q), free(p->z), free(p->s), epyq_wmem_release(m->wmem, p->mem);
}

static epyq_status plane_alloc(const epyq_model *m, plane *p, int32_t n, int32_t k, int32_t gs,
                               const char *module, epyq_err *err) {
    size_t nk = (size_t)n * (size_t)k, ng = nk / (size_t)gs;
    p->q = malloc(nk), p->z = malloc(ng), p->s = malloc(ng * sizeof(float));
    /* asymmetric always: the int8 low plane's zero is 0, and an int4 matrix whose zeros all
     * happen to be 8 packs the same either way */
    p->mem = epyq_wmem_alloc(m->wmem, epyq_w4_pack_bytes(n, k, gs, 1), 1);
    if (!p->q || !p->z || !p->s || !p->mem)
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory while requantising [%d][%d]",
                            module, n, k);
    return EPYQ_OK;
}

static epyq_status plane_pack(epyq_w4 *dst, plane *p, int32_t n, int32_t k, int32_t gs,
                              const char *module, epyq_err *err) {
    epyq_q4_canon cn = {n, k, gs, p->q, p->s, p->z};
    epyq_status st = epyq_w4_pack(dst, p->mem, &cn, err);
    if (st != EPYQ_OK) return epyq_err_prefix(err, "%s: ", module), st;
    p->mem = NULL; /* owned by dst now */
    return EPYQ_OK;
}

epyq_status epyq_rlin_requant(epyq_model *m, epyq_rlin *dst, const epyq_linear *src,
                              epyq_requant kind, int32_t gs, epyq_err *err) {
    if (kind == EPYQ_REQUANT_NONE || src->kind == EPYQ_LIN_Q4)
        return epyq_err_set(err, EPYQ_E_INTERNAL, "%s: nothing to requantise", src->module);
    if (src->n_out < 1 || src->n_in < 1 || src->n_out > INT32_MAX || src->n_in > INT32_MAX)
        return epyq_err_set(err, EPYQ_E_SHAPE, "%s: shape [%lld][%lld] out of range", src->module,
                            (long long)src->n_out, (long long)src->n_in);
    int32_t n = (int32_t)src->n_out, k = (int32_t)src->n_in;
    if (gs < 32 || k % gs)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                            "%s: --requant %s needs in_features divisible by the group size %d, "
                            "found %d", src->module, epyq_requant_name(kind), gs, k);
    memset(dst, 0, sizeof *dst);
    dst->n = n, dst->k = k, dst->q4 = true, dst->requant = kind;
    enum { BLOCK_ROWS = 256 };
    int32_t G = k / gs;
    float *f = malloc((size_t)BLOCK_ROWS * (size_t)k * sizeof(float));
    plane hi = {0}, lo = {0};
    epyq_status st = f ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", src->module);
    if (st != EPYQ_OK) goto done;
    if ((st = plane_alloc(m, &hi, n, k, gs, src->module, err)) != EPYQ_OK) goto done;
    if (kind == EPYQ_REQUANT_INT8 &&
        (st = plane_alloc(m, &lo, n, k, gs, src->module, err)) != EPYQ_OK)
        goto done;
    for (int32_t r0 = 0; r0 < n; r0 += BLOCK_ROWS) {
        int32_t rows = n - r0 < BLOCK_ROWS ? n - r0 : BLOCK_ROWS;
        if ((st = epyq_rlin_read_rows(src, r0, rows, f, err)) != EPYQ_OK) goto done;
        for (int32_t r = 0; r < rows; r++) {
            const float *x = f + (size_t)r * k;
            size_t j = (size_t)(r0 + r);
            for (int32_t i = 0; i < k; i++)
                if (!isfinite(x[i])) {
                    st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: weight [%zu][%d] is %g: cannot "
                                      "requantise a non-finite weight", src->module, j, i, x[i]);
                    goto done;
                }
            if (kind == EPYQ_REQUANT_INT4)
                row_int4(m->kt, x, k, gs, hi.q + j * k, hi.s + j * G, hi.z + j * G);
            else
                row_int8(x, k, gs, hi.q + j * k, hi.s + j * G, hi.z + j * G, lo.q + j * k,
                         lo.s + j * G, lo.z + j * G);
        }
    }
    /* the staging rows go before packing, which allocates the linear's final planes */
    free(f), f = NULL;
    if ((st = plane_pack(&dst->w4, &hi, n, k, gs, src->module, err)) != EPYQ_OK) goto done;
    if (kind == EPYQ_REQUANT_INT8) st = plane_pack(&dst->w4lo, &lo, n, k, gs, src->module, err);
done:
    free(f);
    plane_free(m, &hi), plane_free(m, &lo);
    if (st != EPYQ_OK) epyq_rlin_free(m, dst);
    return st;
}

int32_t epyq_requant_group(const epyq_weights *w) {
    /* the checkpoint's own int4 group size, so a requantised linear reads the activation the
     * model already prepares for its int4 linears; else the largest size that divides every
     * input width of the model (hidden, intermediate, value heads) */
    for (int32_t l = 0; l < w->cfg.num_hidden_layers; l++)
        if (w->layers[l].moe.gate && w->layers[l].moe.gate[0].kind == EPYQ_LIN_Q4)
            return w->layers[l].moe.gate[0].scheme.group_size;
    const epyq_config *c = &w->cfg;
    int64_t widths[] = {c->hidden_size, c->moe_intermediate_size, c->shared_expert_intermediate_size,
                        (int64_t)c->lin_num_value_heads * c->lin_value_head_dim,
                        (int64_t)c->num_attention_heads * c->head_dim};
    for (int32_t gs = 128; gs >= 32; gs /= 2) {
        bool ok = true;
        for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) ok = ok && widths[i] % gs == 0;
        if (ok) return gs;
    }
    return 0;
}

uint64_t epyq_requant_bytes(int64_t n, int64_t k, int32_t gs, epyq_requant kind) {
    if (n < 1 || k < 1 || n > INT32_MAX || k > INT32_MAX || gs < 32 || k % gs) return 0;
    /* int8: the high plane packs symmetric (zeros all 8), the low one with its zeros */
    if (kind == EPYQ_REQUANT_INT8)
        return epyq_w4_pack_bytes((int32_t)n, (int32_t)k, gs, 0) +
               epyq_w4_pack_bytes((int32_t)n, (int32_t)k, gs, 1);
    if (kind == EPYQ_REQUANT_INT4) return epyq_w4_pack_bytes((int32_t)n, (int32_t)k, gs, 1);
    return (uint64_t)n * (uint64_t)k * 2u;
}
