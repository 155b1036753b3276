/* src/model/seq.c — sequences: KV caches (bf16, or fp8 e4m3 to halve them) and DeltaNet
 * states, allocated for the context asked for. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/model_impl.h"

/* OCP fp8 E4M3 ("e4m3fn": bias 7, no infinities, max 448): round to nearest even, saturate. */
static uint8_t f32_to_e4m3(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (isnan(x)) return 0x7f;
    if (a < 0x1p-6f) return sign | (uint8_t)nearbyintf(a * 512.0f); /* subnormal; 8 = min normal */
    int ex;
    frexpf(a, &ex);
    int e = ex - 1;                                        /* a in [2^e, 2^(e+1)) */
    int mant = (int)nearbyintf((ldexpf(a, -e) - 1.0f) * 8.0f);
    if (mant == 8) e++, mant = 0;
    int code = ((e + 7) << 3) | mant;
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

static float e4m3_to_f32(uint8_t c) {
    int e = (c >> 3) & 15, mt = c & 7;
    float v = e ? ldexpf(1.0f + mt / 8.0f, e - 7) : ldexpf((float)mt, -9);
    return c & 0x80 ? -v : v;
}

epyq_status epyq_seq_create(epyq_seq **out, epyq_model *m, int32_t n_ctx, epyq_kv_type kv,
                            epyq_err *err) {
    *out = NULL;
    if (n_ctx < 1 || n_ctx > m->c->max_ctx)
        return epyq_err_set(err, EPYQ_E_ARG, "context %d outside [1, %lld] (%s)", n_ctx, (long long)m->c->max_ctx,
                            m->c->yarn ? "YaRN: original_max_position_embeddings x factor" : "max_position_embeddings");
    epyq_seq *s = calloc(1, sizeof *s);
    if (!s) return epyq_err_set(err, EPYQ_E_NOMEM, "sequence: out of memory");
    s->m = m, s->n_ctx = n_ctx, s->kv = kv;
    s->n_kv_layers = m->n_attn + (m->has_mtp ? 1 : 0);
    s->kv_elem = kv == EPYQ_KV_FP8 ? 1 : 2;
    size_t rows = (size_t)s->n_kv_layers * (size_t)n_ctx, per_row, kv_bytes = 0;
    bool ok = epyq_mul_size((size_t)m->d.nkv * m->d.hd, s->kv_elem, &per_row) &&
              epyq_mul_size(rows, per_row, &kv_bytes);
    if (ok && kv_bytes) {
        s->k = epyq_model_alloc(kv_bytes, 1);
        s->v = epyq_model_alloc(kv_bytes, 1);
        ok = s->k && s->v;
    }
    if (ok && m->n_gdn) {
        s->conv = epyq_model_alloc((size_t)m->n_gdn * (size_t)(m->d.Kc - 1 > 0 ? m->d.Kc - 1 : 1),
                                   (size_t)m->d.conv_dim * sizeof(float));
        s->S =
            epyq_model_alloc((size_t)m->n_gdn * m->d.Hv, (size_t)m->d.Dk * m->d.Dv * sizeof(float));
        ok = s->conv && s->S;
    }
    if (!ok) {
        epyq_seq_free(s);
        return epyq_err_set(err, EPYQ_E_NOMEM, "sequence of %d positions: out of memory (KV %zu bytes x 2)",
                            n_ctx, kv_bytes);
    }
    *out = s;
    return EPYQ_OK;
}

void epyq_seq_free(epyq_seq *s) {
    if (!s) return;
    free(s->k), free(s->v), free(s->conv), free(s->S), free(s->spec_S), free(s->spec_conv);
    free(s);
}

void epyq_seq_reset(epyq_seq *s) {
    const epyq_model *m = s->m;
    /* KV rows past pos are never read, so only the recurrent states need clearing */
    if (m->n_gdn) {
        memset(s->conv, 0,
               (size_t)m->n_gdn * (size_t)(m->d.Kc - 1) * m->d.conv_dim * sizeof(float));
        memset(s->S, 0, (size_t)m->n_gdn * m->d.Hv * m->d.Dk * m->d.Dv * sizeof(float));
    }
    s->pos = 0;
    s->broken[0] = '\0';
    s->spec_n = 0;
}

static size_t state_floats(const epyq_model *m) {
    return (size_t)m->n_gdn * m->d.Hv * m->d.Dk * m->d.Dv;
}
static size_t conv_floats(const epyq_model *m) {
    return (size_t)m->n_gdn * (size_t)(m->d.Kc - 1 > 0 ? m->d.Kc - 1 : 1) * m->d.conv_dim;
}

epyq_status epyq_seq_spec_begin(epyq_seq *s, int32_t n, epyq_err *err) {
    if (n < 1 || n > EPYQ_SPEC_MAX)
        return epyq_err_set(err, EPYQ_E_ARG, "speculative verification of %d tokens (1..%d)", n, EPYQ_SPEC_MAX);
    const epyq_model *m = s->m;
    /* copies after tokens 0 .. n - 2: after the last one the state itself is that copy */
    if (m->n_gdn && n - 1 > s->spec_cap) {
        free(s->spec_S), free(s->spec_conv);
        s->spec_cap = 0;
        s->spec_S = epyq_model_alloc((size_t)(n - 1), state_floats(m) * sizeof(float));
        s->spec_conv = epyq_model_alloc((size_t)(n - 1), conv_floats(m) * sizeof(float));
        if (!s->spec_S || !s->spec_conv) {
            free(s->spec_S), free(s->spec_conv);
            s->spec_S = s->spec_conv = NULL;
            return epyq_err_set(err, EPYQ_E_NOMEM,
                                "speculative state snapshots (%d x %zu MB): out of memory", n - 1,
                                state_floats(m) * sizeof(float) >> 20);
        }
        s->spec_cap = n - 1;
    }
    s->spec_n = n, s->spec_pos0 = s->pos;
    return EPYQ_OK;
}

epyq_status epyq_seq_rollback(epyq_seq *s, int32_t keep, epyq_err *err) {
    int32_t n = s->spec_n;
    s->spec_n = 0;
    if (n <= 0) return epyq_err_set(err, EPYQ_E_ARG, "rollback without a speculative verification");
    if (keep < 1 || keep > n || s->pos != s->spec_pos0 + n)
        return epyq_err_set(err, EPYQ_E_ARG, "rollback to %d of %d verified tokens (position %d, started at %d)",
                            keep, n, s->pos, s->spec_pos0);
    const epyq_model *m = s->m;
    if (keep < n && m->n_gdn) {
        memcpy(s->S, s->spec_S + (size_t)(keep - 1) * state_floats(m), state_floats(m) * sizeof(float));
        memcpy(s->conv, s->spec_conv + (size_t)(keep - 1) * conv_floats(m), conv_floats(m) * sizeof(float));
    }
    /* attention KV rows past the new position are never read before being written again */
    s->pos = s->spec_pos0 + keep;
    return EPYQ_OK;
}

int32_t epyq_seq_pos(const epyq_seq *s) { return s->pos; }
int32_t epyq_seq_ctx(const epyq_seq *s) { return s->n_ctx; }

uint64_t epyq_seq_bytes(const epyq_seq *s) { return epyq_model_seq_bytes(s->m, s->n_ctx, s->kv, NULL); }

uint64_t epyq_model_seq_bytes(const epyq_model *m, int32_t n_ctx, epyq_kv_type kv, uint64_t *kv_bytes) {
    /* the same sizes epyq_seq_create allocates */
    uint64_t layers = (uint64_t)m->n_attn + (m->has_mtp ? 1u : 0u), elem = kv == EPYQ_KV_FP8 ? 1 : 2;
    uint64_t k = 2ull * layers * (uint64_t)n_ctx * (uint64_t)m->d.nkv * (uint64_t)m->d.hd * elem;
    uint64_t st = (uint64_t)m->n_gdn *
                  ((uint64_t)(m->d.Kc - 1) * m->d.conv_dim + (uint64_t)m->d.Hv * m->d.Dk * m->d.Dv);
    if (kv_bytes) *kv_bytes = k;
    return k + st * sizeof(float);
}

void epyq_seq_kv_store(epyq_seq *s, int32_t layer_slot, int32_t pos, const float *k, const float *v) {
    const epyq_model *m = s->m;
    size_t kvd = (size_t)m->d.nkv * m->d.hd;
    size_t off = ((size_t)layer_slot * s->n_ctx + (size_t)pos) * kvd;
    if (s->kv == EPYQ_KV_FP8) {
        for (size_t i = 0; i < kvd; i++) {
            s->k[off + i] = f32_to_e4m3(k[i]);
            s->v[off + i] = f32_to_e4m3(v[i]);
        }
        return;
    }
    uint16_t *kb = (uint16_t *)s->k + off, *vb = (uint16_t *)s->v + off;
    for (size_t i = 0; i < kvd; i++) {
        kb[i] = epyq_f32_to_bf16(k[i]);
        vb[i] = epyq_f32_to_bf16(v[i]);
    }
}

void epyq_seq_kv_view(const epyq_seq *s, int32_t layer_slot, int32_t kvh, int32_t n, uint16_t *tmp,
                      const uint16_t **k, const uint16_t **v, int32_t *stride) {
    const epyq_model *m = s->m;
    size_t kvd = (size_t)m->d.nkv * m->d.hd;
    size_t off = (size_t)layer_slot * s->n_ctx * kvd + (size_t)kvh * m->d.hd;
    if (s->kv == EPYQ_KV_BF16) {
        *k = (const uint16_t *)s->k + off;
        *v = (const uint16_t *)s->v + off;
        *stride = (int32_t)kvd;
        return;
    }
    /* e4m3 values are exactly representable in bf16: widening loses nothing */
    uint16_t *tk = tmp, *tv = tmp + (size_t)n * m->d.hd;
    for (int32_t r = 0; r < n; r++)
        for (int32_t d = 0; d < m->d.hd; d++) {
            size_t src = off + (size_t)r * kvd + (size_t)d;
            tk[(size_t)r * m->d.hd + d] = epyq_f32_to_bf16(e4m3_to_f32(s->k[src]));
            tv[(size_t)r * m->d.hd + d] = epyq_f32_to_bf16(e4m3_to_f32(s->v[src]));
        }
    *k = tk, *v = tv, *stride = m->d.hd;
}
