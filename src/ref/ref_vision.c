/* src/ref/ref_vision.c — float64 reference of the vision tower (ref_vision.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "load/tensor_f32.h"
#include "ref/ref_vision.h"

/* The whole tensor widened to double; NULL on failure (err filled). */
static double *wide(const epyq_tensor *t, epyq_err *err) {
    size_t n = epyq_tensor_numel(t);
    float *f = malloc(n * sizeof *f);
    double *d = malloc(n * sizeof *d);
    if (!f || !d || epyq_tensor_read_f32(t, 0, n, f, err) != EPYQ_OK) {
        if (!f || !d) epyq_err_set(err, EPYQ_E_NOMEM, "reference vision: out of memory");
        free(f), free(d);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    return d;
}

/* y [T][n] = x [T][k] . W^T + b, W [n][k] as stored. */
static epyq_status linear(const epyq_tensor *wt, const epyq_tensor *bt, const double *x, int32_t T,
                          int32_t k, int32_t n, double *y, epyq_err *err) {
    double *W = wide(wt, err), *B = W ? wide(bt, err) : NULL;
    if (!W || !B) {
        free(W);
        return err ? err->code : EPYQ_E_NOMEM;
    }
    for (int32_t t = 0; t < T; t++)
        for (int32_t j = 0; j < n; j++) {
            double s = B[j];
            for (int32_t i = 0; i < k; i++) s += W[(size_t)j * k + i] * x[(size_t)t * k + i];
            y[(size_t)t * n + j] = s;
        }
    free(W), free(B);
    return EPYQ_OK;
}

static epyq_status layernorm(const epyq_tensor *wt, const epyq_tensor *bt, const double *x,
                             int32_t T, int32_t n, double eps, double *y, epyq_err *err) {
    double *W = wide(wt, err), *B = W ? wide(bt, err) : NULL;
    if (!W || !B) {
        free(W);
        return err ? err->code : EPYQ_E_NOMEM;
    }
    for (int32_t t = 0; t < T; t++) {
        const double *r = x + (size_t)t * n;
        double mean = 0, var = 0;
        for (int32_t i = 0; i < n; i++) mean += r[i];
        mean /= n;
        for (int32_t i = 0; i < n; i++) var += (r[i] - mean) * (r[i] - mean);
        var /= n;
        for (int32_t i = 0; i < n; i++)
            y[(size_t)t * n + i] = (r[i] - mean) / sqrt(var + eps) * W[i] + B[i];
    }
    free(W), free(B);
    return EPYQ_OK;
}

epyq_status epyq_ref_vision_encode(const epyq_vision_w *w, const epyq_vision_input *in, double *out,
                                   epyq_err *err) {
    const epyq_vision_config *c = &w->cfg;
    const int32_t D = c->hidden, I = c->inter, hd = c->head_dim, H = c->heads, m = c->merge,
                  S = c->pos_side;
    const int32_t K = c->in_ch * c->temporal * c->patch * c->patch, N = in->n, gh = in->gh,
                  gw = in->gw;
    if (in->cols != K || N != gh * gw || gh % m || gw % m)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "reference vision: grid %dx%d, %d columns: expected %d", gh, gw,
                            in->cols, K);
    size_t wide_n = (size_t)N * (3 * D > I ? 3 * D : I);
    double *x = malloc((size_t)N * K * sizeof *x), *h = malloc((size_t)N * D * sizeof *h);
    double *a = malloc((size_t)N * D * sizeof *a), *t = malloc(wide_n * sizeof *t),
           *o = malloc((size_t)N * D * sizeof *o);
    double *sc = malloc((size_t)N * sizeof *sc), *pos = wide(w->pos, err);
    int32_t *row = malloc((size_t)N * sizeof *row), *col = malloc((size_t)N * sizeof *col);
    epyq_status st = EPYQ_OK;
    if (!x || !h || !a || !t || !o || !sc || !pos || !row || !col) {
        st = pos ? epyq_err_set(err, EPYQ_E_NOMEM, "reference vision: out of memory")
                 : (err ? err->code : EPYQ_E_NOMEM);
        goto done;
    }
    for (size_t i = 0; i < (size_t)N * K; i++) x[i] = in->pix[i];
    /* grid cell of each patch row: rows of one m x m merge block are consecutive */
    for (int32_t p = 0; p < N; p++) {
        int32_t blk = p / (m * m);
        row[p] = blk / (gw / m) * m + p / m % m;
        col[p] = blk % (gw / m) * m + p % m;
    }
    if ((st = linear(w->patch_w, w->patch_b, x, N, K, D, h, err))) goto done;
    /* learned positions, bilinear with align_corners: cell i of g maps to i*(S-1)/(g-1) */
    for (int32_t p = 0; p < N; p++) {
        double sy = gh > 1 ? (double)row[p] * (S - 1) / (gh - 1) : 0,
               sx = gw > 1 ? (double)col[p] * (S - 1) / (gw - 1) : 0;
        int32_t y0 = (int32_t)floor(sy), x0 = (int32_t)floor(sx), y1 = y0 + 1 < S ? y0 + 1 : S - 1,
                x1 = x0 + 1 < S ? x0 + 1 : S - 1;
        double dy = sy - y0, dx = sx - x0;
        for (int32_t d = 0; d < D; d++)
            h[(size_t)p * D + d] += (1 - dy) * (1 - dx) * pos[((size_t)y0 * S + x0) * D + d] +
                                    (1 - dy) * dx * pos[((size_t)y0 * S + x1) * D + d] +
                                    dy * (1 - dx) * pos[((size_t)y1 * S + x0) * D + d] +
                                    dy * dx * pos[((size_t)y1 * S + x1) * D + d];
    }
    for (int32_t l = 0; l < c->depth; l++) {
        const epyq_vision_block_w *b = &w->blocks[l];
        if ((st = layernorm(b->norm1_w, b->norm1_b, h, N, D, c->eps, a, err))) goto done;
        if ((st = linear(b->qkv_w, b->qkv_b, a, N, D, 3 * D, t, err))) goto done;
        /* 2-D rotary on q and k: pair (d, d + hd/2); the first hd/4 angles follow the row,
         * the next hd/4 the column; inv_k = theta^(-2k / (hd/2)) */
        for (int32_t p = 0; p < N; p++)
            for (int32_t part = 0; part < 2; part++)
                for (int32_t hh = 0; hh < H; hh++) {
                    double *v = t + (size_t)p * 3 * D + part * D + hh * hd;
                    for (int32_t d = 0; d < hd / 2; d++) {
                        int32_t k = d < hd / 4 ? d : d - hd / 4;
                        double ang = (d < hd / 4 ? row[p] : col[p]) *
                                     pow(c->rope_theta, -2.0 * k / (hd / 2));
                        double x0 = v[d], x1 = v[d + hd / 2];
                        v[d] = x0 * cos(ang) - x1 * sin(ang);
                        v[d + hd / 2] = x1 * cos(ang) + x0 * sin(ang);
                    }
                }
        /* full attention among the image's patches */
        for (int32_t hh = 0; hh < H; hh++)
            for (int32_t i = 0; i < N; i++) {
                const double *q = t + (size_t)i * 3 * D + hh * hd;
                double mx = -INFINITY, sum = 0;
                for (int32_t j = 0; j < N; j++) {
                    const double *k = t + (size_t)j * 3 * D + D + hh * hd;
                    double s = 0;
                    for (int32_t d = 0; d < hd; d++) s += q[d] * k[d];
                    sc[j] = s / sqrt((double)hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int32_t j = 0; j < N; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int32_t d = 0; d < hd; d++) {
                    double acc = 0;
                    for (int32_t j = 0; j < N; j++)
                        acc += sc[j] * t[(size_t)j * 3 * D + 2 * D + hh * hd + d];
                    o[(size_t)i * D + hh * hd + d] = acc / sum;
                }
            }
        if ((st = linear(b->proj_w, b->proj_b, o, N, D, D, a, err))) goto done;
        for (size_t i = 0; i < (size_t)N * D; i++) h[i] += a[i];
        if ((st = layernorm(b->norm2_w, b->norm2_b, h, N, D, c->eps, a, err))) goto done;
        if ((st = linear(b->fc1_w, b->fc1_b, a, N, D, I, t, err))) goto done;
        for (size_t i = 0; i < (size_t)N * I; i++) /* tanh GELU */
            t[i] = 0.5 * t[i] * (1 + tanh(sqrt(2 / M_PI) * (t[i] + 0.044715 * t[i] * t[i] * t[i])));
        if ((st = linear(b->fc2_w, b->fc2_b, t, N, I, D, a, err))) goto done;
        for (size_t i = 0; i < (size_t)N * D; i++) h[i] += a[i];
    }
    /* merger: per-patch LayerNorm, the m*m rows of a block side by side, fc1, erf GELU, fc2 */
    if ((st = layernorm(w->mnorm_w, w->mnorm_b, h, N, D, c->eps, a, err))) goto done;
    int32_t T = N / (m * m), M = D * m * m;
    if ((st = linear(w->mfc1_w, w->mfc1_b, a, T, M, M, t, err))) goto done;
    for (size_t i = 0; i < (size_t)T * M; i++) t[i] = 0.5 * t[i] * (1 + erf(t[i] / sqrt(2.0)));
    st = linear(w->mfc2_w, w->mfc2_b, t, T, M, c->out_hidden, out, err);
done:
    free(x), free(h), free(a), free(t), free(o), free(sc), free(pos), free(row), free(col);
    return st;
}
