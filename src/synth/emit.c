/* src/synth/emit.c — the bytes of one planned tensor, generated in row-sized pieces straight into
 * the shard's output buffer (never a whole large tensor in memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "numa/pool.h"
#include "synth/synth_int.h"

#define DENSE_CHUNK (1u << 20) /* elements per output piece of a plain tensor */
#define DENSE_TASK (1u << 16)  /* elements per pool task */
#define GS SYNTH_GS
#define MAX_K 65536            /* widest int4 linear synth quantizes */

epyq_status epyq_synth_emitter_init(synth_emitter *e, const epyq_synth_dims *d, uint64_t seed,
                                    epyq_synth_format f, const synth_plan *p, epyq_pool *pool,
                                    epyq_err *err) {
    memset(e, 0, sizeof *e);
    e->d = d, e->seed = seed, e->f = f, e->p = p, e->cur = -1, e->pool = pool;
    e->nw = epyq_pool_size(pool);
    size_t nm = (size_t)p->n_modules + 1;
    e->ms = calloc(nm, sizeof *e->ms);
    e->mz = calloc(nm, sizeof *e->mz);
    e->left = malloc(nm * sizeof *e->left);
    if (!e->ms || !e->mz || !e->left) {
        epyq_synth_emitter_free(e);
        return epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory");
    }
    memcpy(e->left, p->module_parts, (size_t)p->n_modules * sizeof *e->left);
    return EPYQ_OK;
}

void epyq_synth_emitter_free(synth_emitter *e) {
    if (e->ms)
        for (int32_t i = 0; i < e->p->n_modules; i++) free(e->ms[i]), free(e->mz[i]);
    free(e->ms), free(e->mz), free(e->left), free(e->q), free(e->rows);
    memset(e, 0, sizeof *e);
}

static epyq_status grow(void **buf, size_t *cap, size_t need, size_t elem, epyq_err *err) {
    if (need <= *cap) return EPYQ_OK;
    void *nb = realloc(*buf, need * elem);
    if (!nb) return epyq_err_set(err, EPYQ_E_NOMEM, "synth: cannot allocate %zu bytes", need * elem);
    *buf = nb, *cap = need;
    return EPYQ_OK;
}

/* Rows of one module split over the pool; each row's draws, codes and scales depend only on its
 * index, so the result is the same for any number of workers. */
typedef struct {
    synth_emitter *e;
    const synth_rule *r;
    size_t n, k, gn, rows_per_task;
    float *s;
    uint8_t *z;
    const int32_t *perm; /* act-order column order, NULL = natural */
} quant_job;

static void quant_task(void *ctx, int32_t task, int32_t worker) {
    const quant_job *j = ctx;
    float *row = j->e->rows + (size_t)worker * j->e->row_cap;
    size_t r0 = (size_t)task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    for (size_t i = r0; i < r1 && i < j->n; i++) {
        epyq_synth_fill(j->r, i * j->k, j->k, row);
        if (!j->perm) {
            epyq_synth_quantize(j->e->f, row, 1, (int32_t)j->k, j->e->q + i * j->k, j->s + i * j->gn, j->z + i * j->gn);
            continue;
        }
        /* act-order: groups are runs of 128 in the permuted order; codes go back to their
         * original columns (the second half of the worker's buffer holds the gathered row,
         * the first half then the permuted codes) */
        float *rp = row + MAX_K;
        uint8_t *qp = (uint8_t *)row;
        for (size_t c = 0; c < j->k; c++) rp[c] = row[j->perm[c]];
        epyq_synth_quantize(j->e->f, rp, 1, (int32_t)j->k, qp, j->s + i * j->gn, j->z + i * j->gn);
        for (size_t c = 0; c < j->k; c++) j->e->q[i * j->k + (size_t)j->perm[c]] = qp[c];
    }
}

/* Quantize module t->module (codes into e->q; scales/zeros kept while parts need them). */
static epyq_status quantize_module(synth_emitter *e, const synth_tensor *t, epyq_err *err) {
    if (e->cur == t->module && (e->ms[t->module] || e->left[t->module] <= 0)) return EPYQ_OK;
    const size_t n = (size_t)t->n, k = (size_t)t->k, gn = k / GS;
    if (k > MAX_K || k % GS) return epyq_err_set(err, EPYQ_E_INTERNAL, "synth: %s has in_features %zu", t->logical, k);
    epyq_status st = grow((void **)&e->q, &e->q_cap, n * k, 1, err);
    if (!st && !e->rows) {
        e->row_cap = 2 * MAX_K; /* a row, and its act-order gather */
        if (!(e->rows = malloc((size_t)e->nw * e->row_cap * sizeof *e->rows)))
            st = epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory");
    }
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
    if ((st = epyq_synth_rule_for(e->d, e->seed, name, &r, err))) {
        if (s != e->ms[t->module]) free(s), free(z);
        return st;
    }
    quant_job j = {.e = e, .r = &r, .n = n, .k = k, .gn = gn, .s = s, .z = z};
    int32_t *perm = NULL;
    if (e->d->act_order) {
        if (!(perm = malloc(k * sizeof *perm))) {
            if (s != e->ms[t->module]) free(s), free(z);
            return epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory quantizing %s", t->logical);
        }
        epyq_synth_act_perm(e->seed, t->logical, (int32_t)k, perm);
        j.perm = perm;
    }
    j.rows_per_task = (65536 + k - 1) / k; /* ~64k weights per task */
    epyq_pool_run(e->pool, quant_task, &j, (int32_t)((n + j.rows_per_task - 1) / j.rows_per_task));
    free(perm);
    e->cur = t->module;
    if (e->left[t->module] > 0) e->ms[t->module] = s, e->mz[t->module] = z;
    else free(s), free(z);
    return EPYQ_OK;
}

static void put_f16(uint16_t *o, float v, synth_dtype dt) {
    *o = dt == SD_F16 ? epyq_f32_to_f16(v) : epyq_f32_to_bf16(v);
}

typedef struct {
    const synth_rule *r;
    uint64_t first;
    size_t n;
    void *out;
    bool f32;
} dense_job;

static void dense_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const dense_job *j = ctx;
    size_t a = (size_t)task * DENSE_TASK, m = j->n - a < DENSE_TASK ? j->n - a : DENSE_TASK;
    if (j->f32) epyq_synth_fill(j->r, j->first + a, m, (float *)j->out + a); /* F32 copies hold the bf16 values */
    else epyq_synth_fill_bf16(j->r, j->first + a, m, (uint16_t *)j->out + a);
}

static epyq_status emit_dense_values(synth_emitter *e, const synth_rule *r, uint64_t first, uint64_t count,
                                     synth_dtype dt, synth_sink *sk) {
    while (count) {
        size_t m = count < DENSE_CHUNK ? (size_t)count : DENSE_CHUNK;
        void *o = epyq_synth_sink_get(sk, m * epyq_synth_dtype_size(dt));
        if (!o) return EPYQ_E_IO;
        dense_job j = {.r = r, .first = first, .n = m, .out = o, .f32 = dt == SD_F32};
        if (m <= DENSE_TASK) dense_task(&j, 0, 0);
        else epyq_pool_run(e->pool, dense_task, &j, (int32_t)((m + DENSE_TASK - 1) / DENSE_TASK));
        first += m, count -= m;
    }
    return EPYQ_OK;
}

/* One tensor of an int4 module. The packed tensor is always the first of its module in file order
 * (I32 before 16-bit, names sorted), so it computes the codes; scales/zeros come from the cache. */
static epyq_status emit_q_part(synth_emitter *e, const synth_tensor *t, synth_sink *sk, epyq_err *err) {
    const int32_t n = t->n, k = t->k, gn = k / GS, n8 = (n + 7) / 8;
    epyq_status st;
    if (t->src == SRC_Q_SHAPE) {
        int64_t *o = epyq_synth_sink_get(sk, 16);
        if (!o) return EPYQ_E_IO;
        o[0] = n, o[1] = k;
        return EPYQ_OK;
    }
    if (t->src == SRC_Q_GIDX) { /* desc_act false: trivial k / G, written anyway by GPTQModel */
        int32_t *o = epyq_synth_sink_get(sk, (size_t)k * 4);
        if (!o) return EPYQ_E_IO;
        if (!e->d->act_order) {
            for (int32_t i = 0; i < k; i++) o[i] = i / GS;
            return EPYQ_OK;
        }
        int32_t *perm = malloc((size_t)k * sizeof *perm);
        if (!perm) return epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory for %s", t->name);
        epyq_synth_act_perm(e->seed, t->logical, k, perm);
        for (int32_t i = 0; i < k; i++) o[perm[i]] = i / GS;
        free(perm);
        return EPYQ_OK;
    }
    if (t->src == SRC_Q_PACKED || !e->ms[t->module])
        if ((st = quantize_module(e, t, err))) return st;
    const float *s = e->ms[t->module];
    const uint8_t *z = e->mz[t->module];
    if (t->src == SRC_Q_PACKED) {
        const int64_t rows = t->shape[0], cols = t->shape[1];
        for (int64_t r = 0; r < rows; r++) {
            uint32_t *o = epyq_synth_sink_get(sk, (size_t)cols * 4);
            if (!o) return EPYQ_E_IO;
            switch (e->f) {
            case EPYQ_SYNTH_GPTQ: epyq_synth_pack_gptq_qweight(e->q, n, k, (int32_t)r, o); break;
            case EPYQ_SYNTH_CT: epyq_synth_pack_ct(e->q, k, (int32_t)r, o); break;
            case EPYQ_SYNTH_QUARK: epyq_synth_pack_along_n(e->q, n, k, (int32_t)r, true, true, o); break;
            default: epyq_synth_pack_along_n(e->q, n, k, (int32_t)r, false, true, o); break;
            }
        }
        return EPYQ_OK;
    }
    if (t->src == SRC_Q_ZEROS) {
        for (int32_t g = 0; g < gn; g++) {
            uint32_t *o = epyq_synth_sink_get(sk, (size_t)(e->f == EPYQ_SYNTH_GPTQ ? n / 8 : n8) * 4);
            if (!o) return EPYQ_E_IO;
            if (e->f == EPYQ_SYNTH_GPTQ) epyq_synth_pack_gptq_qzeros(z, n, gn, g, o);
            else epyq_synth_pack_along_n(z, n, gn, g, e->f == EPYQ_SYNTH_QUARK, true, o);
        }
    } else if (e->f == EPYQ_SYNTH_CT) { /* weight_scale [n][gn] */
        uint16_t *o = epyq_synth_sink_get(sk, (size_t)n * (size_t)gn * 2);
        if (!o) return EPYQ_E_IO;
        for (size_t i = 0; i < (size_t)n * (size_t)gn; i++) put_f16(o + i, s[i], t->dtype);
    } else { /* scales [gn][n], transposed */
        for (int32_t g = 0; g < gn; g++) {
            uint16_t *o = epyq_synth_sink_get(sk, (size_t)n * 2);
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

epyq_status epyq_synth_emit_tensor(synth_emitter *e, const synth_tensor *t, synth_sink *sk, epyq_err *err) {
    synth_rule r;
    epyq_status st;
    char name[320];
    switch (t->src) {
    case SRC_DENSE: {
        if ((st = epyq_synth_rule_for(e->d, e->seed, t->logical, &r, err))) return st;
        uint64_t count = t->nbytes / epyq_synth_dtype_size(t->dtype);
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
                if ((st = epyq_synth_rule_for(e->d, e->seed, name, &r, err))) return st;
                if ((st = emit_dense_values(e, &r, 0, per, SD_BF16, sk))) return st;
            }
        return EPYQ_OK;
    }
    default:
        return emit_q_part(e, t, sk, err);
    }
}
