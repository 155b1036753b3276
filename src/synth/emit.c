/* src/synth/emit.c — the bytes of one planned tensor, generated in row-sized pieces straight into
 * the shard's output buffer (never a whole large tensor in memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "synth/synth_int.h"

#define DENSE_CHUNK 65536 /* elements drawn per step for plain tensors */
#define GS 128            /* group size of every int4 format synth writes */

epyq_status synth_emitter_init(synth_emitter *e, const epyq_synth_dims *d, uint64_t seed,
                               epyq_synth_format f, const synth_plan *p, epyq_err *err) {
    memset(e, 0, sizeof *e);
    e->d = d, e->seed = seed, e->f = f, e->p = p, e->cur = -1;
    size_t nm = (size_t)p->n_modules + 1;
    e->ms = calloc(nm, sizeof *e->ms);
    e->mz = calloc(nm, sizeof *e->mz);
    e->left = malloc(nm * sizeof *e->left);
    e->row_cap = DENSE_CHUNK;
    e->row = malloc(e->row_cap * sizeof *e->row);
    if (!e->ms || !e->mz || !e->left || !e->row) {
        synth_emitter_free(e);
        return epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory");
    }
    memcpy(e->left, p->module_parts, (size_t)p->n_modules * sizeof *e->left);
    return EPYQ_OK;
}

void synth_emitter_free(synth_emitter *e) {
    if (e->ms)
        for (int32_t i = 0; i < e->p->n_modules; i++) free(e->ms[i]), free(e->mz[i]);
    free(e->ms), free(e->mz), free(e->left), free(e->q), free(e->row);
    memset(e, 0, sizeof *e);
}

static epyq_status grow(void **buf, size_t *cap, size_t need, size_t elem, epyq_err *err) {
    if (need <= *cap) return EPYQ_OK;
    void *nb = realloc(*buf, need * elem);
    if (!nb) return epyq_err_set(err, EPYQ_E_NOMEM, "synth: cannot allocate %zu bytes", need * elem);
    *buf = nb, *cap = need;
    return EPYQ_OK;
}

/* Quantize module t->module (codes into e->q; scales/zeros kept while parts need them). */
static epyq_status quantize_module(synth_emitter *e, const synth_tensor *t, epyq_err *err) {
    if (e->cur == t->module && (e->ms[t->module] || e->left[t->module] <= 0)) return EPYQ_OK;
    const size_t n = (size_t)t->n, k = (size_t)t->k, gn = k / GS;
    epyq_status st = grow((void **)&e->q, &e->q_cap, n * k, 1, err);
    if (!st) st = grow((void **)&e->row, &e->row_cap, k, sizeof(float), err);
    if (st) return st;
    float *s = e->ms[t->module];
    uint8_t *z = e->mz[t->module];
    if (!s) {
        s = malloc(n * gn * sizeof *s);
        z = malloc(n * gn);
        if (!s || !z) {
            free(s), free(z);
            return epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory quantizing %s", t->logical);
        }
    }
    char name[288];
    snprintf(name, sizeof name, "%s.weight", t->logical);
    synth_rule r;
    if ((st = synth_rule_for(e->d, e->seed, name, &r, err))) {
        free(s), free(z);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        synth_fill(&r, i * k, k, e->row);
        synth_quantize(e->f, e->row, 1, (int32_t)k, GS, e->q + i * k, s + i * gn, z + i * gn);
    }
    e->cur = t->module;
    if (e->left[t->module] > 0) e->ms[t->module] = s, e->mz[t->module] = z;
    else free(s), free(z);
    return EPYQ_OK;
}

static void put_f16(uint16_t *o, float v, synth_dtype dt) {
    *o = dt == SD_F16 ? epyq_f32_to_f16(v) : epyq_f32_to_bf16(v);
}

static epyq_status emit_dense_values(synth_emitter *e, const synth_rule *r, uint64_t first, uint64_t count,
                                     synth_dtype dt, synth_sink *sk) {
    while (count) {
        size_t m = count < DENSE_CHUNK ? (size_t)count : DENSE_CHUNK;
        synth_fill(r, first, m, e->row);
        void *o = synth_sink_get(sk, m * synth_dtype_size(dt));
        if (!o) return EPYQ_E_IO;
        if (dt == SD_F32) memcpy(o, e->row, m * sizeof(float));
        else
            for (size_t i = 0; i < m; i++) ((uint16_t *)o)[i] = epyq_f32_to_bf16(e->row[i]);
        first += m, count -= m;
    }
    return EPYQ_OK;
}

static epyq_status emit_q_part(synth_emitter *e, const synth_tensor *t, synth_sink *sk, epyq_err *err) {
    const int32_t n = t->n, k = t->k, gn = k / GS, n8 = (n + 7) / 8;
    epyq_status st;
    if (t->src == SRC_Q_SHAPE) {
        int64_t *o = synth_sink_get(sk, 16);
        if (!o) return EPYQ_E_IO;
        o[0] = n, o[1] = k;
        return EPYQ_OK;
    }
    if (t->src == SRC_Q_GIDX) { /* desc_act false: trivial k / G, written anyway by GPTQModel */
        int32_t *o = synth_sink_get(sk, (size_t)k * 4);
        if (!o) return EPYQ_E_IO;
        for (int32_t i = 0; i < k; i++) o[i] = i / GS;
        return EPYQ_OK;
    }
    if (t->src == SRC_Q_PACKED || !e->ms[t->module])
        if ((st = quantize_module(e, t, err))) return st;
    const float *s = e->ms[t->module];
    const uint8_t *z = e->mz[t->module];
    if (t->src == SRC_Q_PACKED) {
        const int64_t rows = t->shape[0], cols = t->shape[1];
        for (int64_t r = 0; r < rows; r++) {
            uint32_t *o = synth_sink_get(sk, (size_t)cols * 4);
            if (!o) return EPYQ_E_IO;
            switch (e->f) {
            case EPYQ_SYNTH_GPTQ: synth_pack_gptq_qweight(e->q, n, k, (int32_t)r, o); break;
            case EPYQ_SYNTH_CT: synth_pack_ct(e->q, k, (int32_t)r, o); break;
            case EPYQ_SYNTH_QUARK: synth_pack_along_n(e->q, n, k, (int32_t)r, true, true, o); break;
            default: synth_pack_along_n(e->q, n, k, (int32_t)r, false, true, o); break;
            }
        }
        return EPYQ_OK;
    }
    if (t->src == SRC_Q_ZEROS) {
        for (int32_t g = 0; g < gn; g++) {
            uint32_t *o = synth_sink_get(sk, (size_t)(e->f == EPYQ_SYNTH_GPTQ ? n / 8 : n8) * 4);
            if (!o) return EPYQ_E_IO;
            if (e->f == EPYQ_SYNTH_GPTQ) synth_pack_gptq_qzeros(z, n, gn, g, o);
            else synth_pack_along_n(z, n, gn, g, e->f == EPYQ_SYNTH_QUARK, true, o);
        }
    } else if (e->f == EPYQ_SYNTH_CT) { /* weight_scale [n][gn] */
        uint16_t *o = synth_sink_get(sk, (size_t)n * (size_t)gn * 2);
        if (!o) return EPYQ_E_IO;
        for (size_t i = 0; i < (size_t)n * (size_t)gn; i++) put_f16(o + i, s[i], t->dtype);
    } else { /* scales [gn][n], transposed */
        for (int32_t g = 0; g < gn; g++) {
            uint16_t *o = synth_sink_get(sk, (size_t)n * 2);
            if (!o) return EPYQ_E_IO;
            for (int32_t c = 0; c < n; c++) put_f16(o + c, s[(size_t)c * gn + g], t->dtype);
        }
    }
    if (--e->left[t->module] <= 0) {
        free(e->ms[t->module]), free(e->mz[t->module]);
        e->ms[t->module] = NULL, e->mz[t->module] = NULL;
    }
    return EPYQ_OK;
}

epyq_status synth_emit_tensor(synth_emitter *e, const synth_tensor *t, synth_sink *sk, epyq_err *err) {
    synth_rule r;
    epyq_status st;
    char name[320];
    switch (t->src) {
    case SRC_DENSE: {
        if ((st = synth_rule_for(e->d, e->seed, t->logical, &r, err))) return st;
        uint64_t count = t->nbytes / synth_dtype_size(t->dtype);
        return emit_dense_values(e, &r, 0, count, t->dtype, sk);
    }
    case SRC_FUSED_GATE_UP:
    case SRC_FUSED_DOWN: {
        /* expert e's per-expert linears, in order: [e][gate rows; up rows] or [e][down rows] */
        static const char *const gu[2] = {"gate_proj", "up_proj"};
        const uint64_t per = (uint64_t)t->n * (uint64_t)t->k;
        for (int64_t x = 0; x < t->shape[0]; x++)
            for (int j = 0; j < (t->src == SRC_FUSED_GATE_UP ? 2 : 1); j++) {
                snprintf(name, sizeof name, "%s.experts.%lld.%s.weight", t->logical, (long long)x,
                         t->src == SRC_FUSED_DOWN ? "down_proj" : gu[j]);
                if ((st = synth_rule_for(e->d, e->seed, name, &r, err))) return st;
                if ((st = emit_dense_values(e, &r, 0, per, SD_BF16, sk))) return st;
            }
        return EPYQ_OK;
    }
    default:
        return emit_q_part(e, t, sk, err);
    }
}
