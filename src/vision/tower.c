/* src/vision/tower.c — the runtime vision tower (vision.h; docs/vision.md §3).
 *
 * Every Linear is a bf16 GEMM of the kernel table, split into tasks of <= 64 activation rows
 * (the kernels' tuned range) x 64 weight rows, with the bias and GELU applied by the task that
 * produced the values. Attention is two more bf16 GEMMs per (image, head, block of 64 queries):
 * scores against the image's keys, then the softmax rows against the transposed values, so a
 * patch only ever sees its own image. A task's result depends only on its inputs, so neither
 * the thread count nor the other images of a call change any bit. GEMMs of >= 64 rows go to
 * oneDNN instead when the build has it (same contract, its own summation order), unless
 * no_dnnl. With `exact` the GEMMs take fp32 activations and attention runs in plain fp32 loops
 * (slow; for conformance). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/dnnl_gemm.h"
#include "kernels-x86/kern.h"
#include "load/tensor_f32.h"
#include "numa/pool.h"
#include "vision/vision.h"
#include "vision/vision_impl.h"

#define MB 64 /* activation rows per GEMM task */
#define NB 64 /* weight rows per GEMM task */

typedef struct {
    float *n1w, *n1b, *n2w, *n2b; /* [D] */
    uint16_t *qkv, *proj;         /* [3D][D], [D][D] bf16 */
    float *qkv_b, *proj_b;        /* [3D], [D] */
    uint16_t *fc1, *fc2;          /* [I][D], [D][I] bf16 */
    float *fc1_b, *fc2_b;         /* [I], [D] */
} vblock;

struct epyq_vision {
    epyq_vision_config c;
    epyq_vision_pp pp;
    const epyq_kern_table *kt;
    epyq_pool *pool;
    int32_t nt;
    bool exact, dnnl;  /* dnnl: large GEMMs through oneDNN (vision.h: epyq_vision_opts.no_dnnl) */
    uint16_t *patch_w; /* [D][K] bf16, K = 3 * T * p * p */
    float *patch_b;    /* [D] */
    float *pos;        /* [n_pos][D] */
    vblock *b;         /* [depth] */
    float *mnw, *mnb;  /* [D] merger norm */
    uint16_t *m1, *m2; /* [4D][4D], [out][4D] bf16 */
    float *m1b, *m2b;  /* [4D], [out] */
};

const epyq_vision_config *epyq_vision_cfg(const epyq_vision *v) { return &v->c; }
const epyq_vision_pp *epyq_vision_preproc(const epyq_vision *v) { return &v->pp; }

static void *xalloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size / 2) return NULL;
    size_t bytes = (n * size + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, bytes ? bytes : 64);
    if (p) memset(p, 0, bytes ? bytes : 64);
    return p;
}

static epyq_status load_f32(float **out, const epyq_tensor *t, epyq_err *err) {
    size_t n = epyq_tensor_numel(t);
    if (!(*out = xalloc(n, sizeof(float))))
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", t->name);
    return epyq_tensor_read_f32(t, 0, n, *out, err);
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* bf16 copy of a weight (BF16 as stored; F16/F32 rounded to bf16, nearest even). */
static epyq_status load_bf16(uint16_t **out, const epyq_tensor *t, epyq_err *err) {
    size_t n = epyq_tensor_numel(t);
    if (!(*out = xalloc(n, sizeof(uint16_t))))
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", t->name);
    if (t->dtype == EPYQ_DT_BF16) {
        memcpy(*out, t->data, n * 2);
        return EPYQ_OK;
    }
    float *f = malloc(n * sizeof(float));
    if (!f) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", t->name);
    epyq_status st = epyq_tensor_read_f32(t, 0, n, f, err);
    for (size_t i = 0; st == EPYQ_OK && i < n; i++) (*out)[i] = to_bf16(f[i]);
    free(f);
    return st;
}

void epyq_vision_free(epyq_vision *v) {
    if (!v) return;
    for (int32_t i = 0; v->b && i < v->c.depth; i++) {
        vblock *k = &v->b[i];
        free(k->n1w), free(k->n1b), free(k->n2w), free(k->n2b), free(k->qkv), free(k->proj);
        free(k->qkv_b), free(k->proj_b), free(k->fc1), free(k->fc2), free(k->fc1_b), free(k->fc2_b);
    }
    free(v->b);
    free(v->patch_w), free(v->patch_b), free(v->pos), free(v->mnw), free(v->mnb);
    free(v->m1), free(v->m2), free(v->m1b), free(v->m2b);
    epyq_pool_free(v->pool);
    free(v);
}

static epyq_status copy_weights(epyq_vision *v, const epyq_vision_w *w, epyq_err *err) {
    TRY(load_bf16(&v->patch_w, w->patch_w, err));
    TRY(load_f32(&v->patch_b, w->patch_b, err));
    TRY(load_f32(&v->pos, w->pos, err));
    if (!(v->b = calloc((size_t)v->c.depth, sizeof *v->b)))
        return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    for (int32_t i = 0; i < v->c.depth; i++) {
        const epyq_vision_block_w *s = &w->blocks[i];
        vblock *k = &v->b[i];
        TRY(load_f32(&k->n1w, s->norm1_w, err));
        TRY(load_f32(&k->n1b, s->norm1_b, err));
        TRY(load_f32(&k->n2w, s->norm2_w, err));
        TRY(load_f32(&k->n2b, s->norm2_b, err));
        TRY(load_bf16(&k->qkv, s->qkv_w, err));
        TRY(load_f32(&k->qkv_b, s->qkv_b, err));
        TRY(load_bf16(&k->proj, s->proj_w, err));
        TRY(load_f32(&k->proj_b, s->proj_b, err));
        TRY(load_bf16(&k->fc1, s->fc1_w, err));
        TRY(load_f32(&k->fc1_b, s->fc1_b, err));
        TRY(load_bf16(&k->fc2, s->fc2_w, err));
        TRY(load_f32(&k->fc2_b, s->fc2_b, err));
    }
    TRY(load_f32(&v->mnw, w->mnorm_w, err));
    TRY(load_f32(&v->mnb, w->mnorm_b, err));
    TRY(load_bf16(&v->m1, w->mfc1_w, err));
    TRY(load_f32(&v->m1b, w->mfc1_b, err));
    TRY(load_bf16(&v->m2, w->mfc2_w, err));
    return load_f32(&v->m2b, w->mfc2_b, err);
}

epyq_status epyq_vision_load(epyq_vision **out, const char *dir, const epyq_vision_opts *opts,
                             epyq_err *err) {
    *out = NULL;
    epyq_vision_opts none = {0};
    if (!opts) opts = &none;
    epyq_vision *v = calloc(1, sizeof *v);
    if (!v) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    bool present = false;
    epyq_status st = epyq_vision_config_load(&v->c, dir, &present, err);
    if (st == EPYQ_OK && !present)
        st = epyq_err_set(err, EPYQ_E_ARG,
                          "%s: config.json has no vision_config: this checkpoint takes no images",
                          dir);
    if (st == EPYQ_OK) st = epyq_vision_pp_load(&v->pp, dir, err);
    if (st == EPYQ_OK &&
        (v->pp.patch != v->c.patch || v->pp.merge != v->c.merge || v->pp.temporal != v->c.temporal))
        st = epyq_err_set(
            err, EPYQ_E_FORMAT,
            "%s: preprocessor_config.json patch/merge/temporal %d/%d/%d disagree with vision_config's %d/%d/%d",
            dir, v->pp.patch, v->pp.merge, v->pp.temporal, v->c.patch, v->c.merge, v->c.temporal);
    epyq_ckpt *ck = NULL;
    epyq_vision_w w = {0};
    if (st == EPYQ_OK) st = epyq_ckpt_open(&ck, dir, err);
    if (st == EPYQ_OK) st = epyq_vision_bind(&w, ck, &v->c, err);
    if (st == EPYQ_OK) st = copy_weights(v, &w, err);
    epyq_vision_w_free(&w);
    epyq_ckpt_free(ck);
    v->kt = epyq_kern();
    v->exact = opts->exact;
    v->dnnl = !opts->exact && !opts->no_dnnl && epyq_dnnl_available();
    epyq_pool_opts po = {.n_threads = opts->n_threads, .node = -1};
    if (st == EPYQ_OK) st = epyq_pool_create(&v->pool, &po, err);
    if (st != EPYQ_OK) {
        epyq_vision_free(v);
        return st;
    }
    v->nt = epyq_pool_size(v->pool);
    *out = v;
    return EPYQ_OK;
}

/* ---- GEMM over the pool: y [m][ldy] = act(x [m][k] . W^T + bias) */

typedef struct {
    const epyq_vision *v;
    const uint16_t *w;
    const float *bias, *x;
    float *y;
    int32_t m, n, k, ldy, act, mt; /* act: epyq_vision_act; mt = row blocks */
} gemm_job;

static void gemm_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const gemm_job *j = ctx;
    int32_t r0 = task % j->mt * MB, n0 = task / j->mt * NB;
    int32_t rows = j->m - r0 < MB ? j->m - r0 : MB, n1 = n0 + NB < j->n ? n0 + NB : j->n;
    epyq_act a = {.m = rows, .k = j->k, .f32 = j->x + (size_t)r0 * j->k};
    float *y = j->y + (size_t)r0 * j->ldy;
    if (j->v->exact) j->v->kt->bf16_gemm_f32(j->w, j->k, n0, n1, &a, y, j->ldy);
    else
        j->v->kt->bf16_gemm(j->w, j->k, n0, n1, &a, y, j->ldy);
    for (int32_t t = 0; t < rows; t++) {
        float *yr = y + (size_t)t * j->ldy;
        for (int32_t c = n0; c < n1; c++) yr[c] = epyq_vision_act_apply(j->act, yr[c] + j->bias[c]);
    }
}

/* bias + activation over rows of a product oneDNN wrote */
static void epilogue_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const gemm_job *j = ctx;
    int32_t r0 = task * MB, r1 = r0 + MB < j->m ? r0 + MB : j->m;
    for (int32_t t = r0; t < r1; t++) {
        float *yr = j->y + (size_t)t * j->ldy;
        for (int32_t c = 0; c < j->n; c++)
            yr[c] = epyq_vision_act_apply(j->act, yr[c] + j->bias[c]);
    }
}

static void gemm(epyq_vision *v, const uint16_t *w, const float *bias, const float *x, int32_t m,
                 int32_t n, int32_t k, float *y, int32_t act) {
    gemm_job j = {v, w, bias, x, y, m, n, k, n, act, (m + MB - 1) / MB};
    /* oneDNN's blocked bf16 matmul reads each weight block once per call rather than once per
     * 64 rows; when it declines (no oneDNN, out of memory) the kernel table's path runs */
    if (v->dnnl && m >= EPYQ_DNNL_MIN_M &&
        epyq_dnnl_gemm_bf16(x, m, k, w, n, y, n, v->nt, NULL) == EPYQ_OK) {
        epyq_pool_run(v->pool, epilogue_task, &j, j.mt);
        return;
    }
    epyq_pool_run(v->pool, gemm_task, &j, j.mt * ((n + NB - 1) / NB));
}

/* ---- attention within each image */

typedef struct {
    epyq_vision *v;
    const float *qkv;         /* [N][3D] after rotary */
    const uint16_t *kb;       /* [heads][N][hd] keys, bf16 */
    const uint16_t *vt;       /* [heads] blocks of [hd][n_img] per image: values transposed, bf16 */
    const int32_t *off;       /* [n_img + 1] patch offsets */
    int32_t n_img, N, qb_max; /* qb_max: query blocks per (image, head) slot */
    float *scratch;           /* [nt][MB * (hd + n_max)] */
    int32_t n_max;
    float *out; /* [N][D] */
} attn_job;

static void attn_task(void *ctx, int32_t task, int32_t worker) {
    const attn_job *j = ctx;
    const epyq_vision_config *c = &j->v->c;
    int32_t hd = c->head_dim, D = c->hidden, qb = task % j->qb_max, h = task / j->qb_max % c->heads,
            img = task / j->qb_max / c->heads;
    int32_t o = j->off[img], n = j->off[img + 1] - o, q0 = qb * MB;
    if (q0 >= n) return;
    int32_t rows = n - q0 < MB ? n - q0 : MB;
    float *q = j->scratch + (size_t)worker * MB * (hd + j->n_max), *s = q + (size_t)MB * hd;
    for (int32_t t = 0; t < rows; t++)
        memcpy(q + (size_t)t * hd, j->qkv + (size_t)(o + q0 + t) * 3 * D + h * hd, hd * 4);
    epyq_act a = {.m = rows, .k = hd, .f32 = q};
    const uint16_t *kb = j->kb + ((size_t)h * j->N + o) * hd;
    if (j->v->exact) /* fp32 keys and values: plain loops, no bf16 rounding anywhere */
        for (int32_t t = 0; t < rows; t++)
            for (int32_t i = 0; i < n; i++) {
                const float *k = j->qkv + (size_t)(o + i) * 3 * D + D + h * hd;
                float acc = 0;
                for (int32_t d = 0; d < hd; d++) acc += q[(size_t)t * hd + d] * k[d];
                s[(size_t)t * n + i] = acc;
            }
    else
        j->v->kt->bf16_gemm(kb, hd, 0, n, &a, s, n);
    float scale = (float)(1.0 / sqrt((double)hd));
    for (int32_t t = 0; t < rows; t++) {
        float *r = s + (size_t)t * n, mx = -INFINITY;
        for (int32_t i = 0; i < n; i++) mx = fmaxf(mx, r[i] * scale);
        double sum = 0;
        for (int32_t i = 0; i < n; i++) sum += r[i] = expf(r[i] * scale - mx);
        float inv = (float)(1.0 / sum);
        for (int32_t i = 0; i < n; i++) r[i] *= inv;
    }
    epyq_act p = {.m = rows, .k = n, .f32 = s};
    const uint16_t *vt = j->vt + (size_t)h * hd * j->N + (size_t)hd * o;
    float *y = j->out + (size_t)(o + q0) * D + h * hd;
    if (j->v->exact)
        for (int32_t t = 0; t < rows; t++)
            for (int32_t d = 0; d < hd; d++) {
                float acc = 0;
                for (int32_t i = 0; i < n; i++)
                    acc +=
                        s[(size_t)t * n + i] * j->qkv[(size_t)(o + i) * 3 * D + 2 * D + h * hd + d];
                y[(size_t)t * D + d] = acc;
            }
    else
        j->v->kt->bf16_gemm(vt, n, 0, hd, &p, y, D);
}

/* keys [heads][N][hd] and per-image transposed values, bf16 (what the GEMMs read) */
typedef struct {
    const epyq_vision_config *c;
    const float *qkv;
    uint16_t *kb, *vt;
    const int32_t *off;
    int32_t N;
} kv_job;

static void kv_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const kv_job *j = ctx;
    int32_t hd = j->c->head_dim, D = j->c->hidden, h = task % j->c->heads, img = task / j->c->heads;
    int32_t o = j->off[img], n = j->off[img + 1] - o;
    uint16_t *vt = j->vt + (size_t)h * hd * j->N + (size_t)hd * o;
    for (int32_t t = 0; t < n; t++) {
        const float *row = j->qkv + (size_t)(o + t) * 3 * D;
        for (int32_t d = 0; d < hd; d++) {
            j->kb[((size_t)h * j->N + o + t) * hd + d] = to_bf16(row[D + h * hd + d]);
            vt[(size_t)d * n + t] = to_bf16(row[2 * D + h * hd + d]);
        }
    }
}

static void layernorm(const float *x, const float *w, const float *b, int32_t T, int32_t n,
                      double eps, float *y) {
    for (int32_t t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *yr = y + (size_t)t * n;
        double mean = 0, var = 0;
        for (int32_t i = 0; i < n; i++) mean += xr[i];
        mean /= n;
        for (int32_t i = 0; i < n; i++) var += (xr[i] - mean) * (xr[i] - mean);
        float inv = (float)(1.0 / sqrt(var / n + eps)), mf = (float)mean;
        for (int32_t i = 0; i < n; i++) yr[i] = (xr[i] - mf) * inv * w[i] + b[i];
    }
}

epyq_status epyq_vision_encode(epyq_vision *v, const epyq_vision_input *in, int32_t n_img,
                               float *out, epyq_err *err) {
    const epyq_vision_config *c = &v->c;
    int32_t D = c->hidden, I = c->inter, hd = c->head_dim,
            K = c->in_ch * c->temporal * c->patch * c->patch;
    int32_t mm = c->merge * c->merge, N = 0, n_max = 0;
    int32_t *off = calloc((size_t)n_img + 1, sizeof *off);
    if (!off) return epyq_err_set(err, EPYQ_E_NOMEM, "vision: out of memory");
    for (int32_t i = 0; i < n_img; i++) {
        if (in[i].cols != K || in[i].n != in[i].gh * in[i].gw || in[i].gh % c->merge ||
            in[i].gw % c->merge) {
            free(off);
            return epyq_err_set(
                err, EPYQ_E_ARG,
                "vision: image %d: grid %dx%d with %d columns: expected %d columns and sides divisible by %d",
                i, in[i].gh, in[i].gw, in[i].cols, K, c->merge);
        }
        off[i + 1] = off[i] + in[i].n;
        n_max = in[i].n > n_max ? in[i].n : n_max;
    }
    N = off[n_img];
    size_t big = (size_t)N * (3 * D > I ? 3 * D : I);
    float *x = xalloc((size_t)N * K, 4), *h = xalloc((size_t)N * D, 4),
          *a = xalloc((size_t)N * D, 4);
    float *t = xalloc(big, 4), *o = xalloc((size_t)N * D, 4), *cs = xalloc((size_t)N * hd, 4);
    uint16_t *kb = xalloc((size_t)N * D, 2), *vt = xalloc((size_t)N * D, 2);
    float *scratch = xalloc((size_t)v->nt * MB * (hd + n_max), 4);
    float *mid = xalloc((size_t)N / mm * D * mm, 4);
    epyq_status st = EPYQ_OK;
    if (!x || !h || !a || !t || !o || !cs || !kb || !vt || !scratch || !mid)
        st =
            epyq_err_set(err, EPYQ_E_NOMEM, "vision: activations for %d patches: out of memory", N);
    if (st == EPYQ_OK) {
        for (int32_t i = 0; i < n_img; i++) {
            memcpy(x + (size_t)off[i] * K, in[i].pix, (size_t)in[i].n * K * 4);
            /* cos/sin [n][hd/2] then the learned positions, per image */
            epyq_vision_rope_table(c, in[i].gh, in[i].gw, cs + (size_t)off[i] * hd);
        }
        gemm(v, v->patch_w, v->patch_b, x, N, D, K, h, EPYQ_VACT_NONE);
        for (int32_t i = 0; i < n_img; i++)
            epyq_vision_add_pos(c, v->pos, in[i].gh, in[i].gw, h + (size_t)off[i] * D);
        for (int32_t l = 0; l < c->depth; l++) {
            const vblock *b = &v->b[l];
            layernorm(h, b->n1w, b->n1b, N, D, c->eps, a);
            gemm(v, b->qkv, b->qkv_b, a, N, 3 * D, D, t, EPYQ_VACT_NONE);
            for (int32_t p = 0; p < N; p++)
                for (int32_t hh = 0; hh < c->heads; hh++)
                    for (int32_t part = 0; part < 2; part++) /* q then k */
                        epyq_vision_rope_apply(t + (size_t)p * 3 * D + part * D + hh * hd,
                                               cs + (size_t)p * hd, hd);
            kv_job kj = {c, t, kb, vt, off, N};
            epyq_pool_run(v->pool, kv_task, &kj, n_img * c->heads);
            int32_t qb_max = (n_max + MB - 1) / MB;
            attn_job aj = {v, t, kb, vt, off, n_img, N, qb_max, scratch, n_max, o};
            epyq_pool_run(v->pool, attn_task, &aj, n_img * c->heads * qb_max);
            gemm(v, b->proj, b->proj_b, o, N, D, D, a, EPYQ_VACT_NONE);
            for (size_t i = 0; i < (size_t)N * D; i++) h[i] += a[i];
            layernorm(h, b->n2w, b->n2b, N, D, c->eps, a);
            gemm(v, b->fc1, b->fc1_b, a, N, I, D, t, EPYQ_VACT_GELU_TANH);
            gemm(v, b->fc2, b->fc2_b, t, N, D, I, a, EPYQ_VACT_NONE);
            for (size_t i = 0; i < (size_t)N * D; i++) h[i] += a[i];
        }
        /* merger: LayerNorm per patch, each merge block's rows side by side, MLP */
        layernorm(h, v->mnw, v->mnb, N, D, c->eps, a);
        gemm(v, v->m1, v->m1b, a, N / mm, D * mm, D * mm, mid, EPYQ_VACT_GELU_ERF);
        gemm(v, v->m2, v->m2b, mid, N / mm, c->out_hidden, D * mm, out, EPYQ_VACT_NONE);
    }
    free(x), free(h), free(a), free(t), free(o), free(cs), free(kb), free(vt), free(scratch),
        free(mid), free(off);
    return st;
}
