/* src/model/moe_ep.c — one MoE layer's exchange under expert parallelism (model.h: epyq_ep).
 *
 * Every rank holds the dense part, so every token's hidden state and routing (sel) is already
 * on every rank: no input has to travel to the experts, and every rank can tell which rank ran
 * each (token, slot) row without being told (epyq_model_ep_runner). What travels is output:
 *
 *   1. Tokens are cut into N contiguous blocks, block r = [t0(r), t0(r + 1)) with
 *      t0(r) = ceil(r T / N); rank r combines its block. A one-token decode step is rank 0's,
 *      which ran the shared expert and its share of the routed ones, so most rows stay home.
 *   2. MPI_Alltoallv: every rank sends each row it computed for another block to that block's
 *      rank, rows in (token, slot) order; a receiver knows the order and so where each row of
 *      each sender goes, and no row index travels. Its own rows are already in place.
 *   3. The receiver adds each token's rows in slot order (epyq_moe_sum, what one process does),
 *      so the sums are one process's bits, not the "any order" of a reduction.
 *   4. MPI_Allgatherv (in place) gives every rank every block's sums: the next layer's dense
 *      part needs every token on every rank.
 *
 * Per token and layer that is (top-k + 1) x (N - 1) / N rows in step 2 and N - 1 rows in step 4
 * (a row = hidden floats, 8 KiB on the real model), against (top-k + 1) rows in both directions
 * of an all-reduce of the whole [T][top-k + 1][H] buffer, most of it zeros. */
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

/* First token of rank r's block: ceil(r T / N), so blocks differ by at most one token. */
static int32_t block_start(int32_t r, int32_t T, int32_t N) {
    return (int32_t)(((int64_t)r * T + N - 1) / N);
}

/* Rank of row (t, s): slots 0..K-1 ran on their expert's rank, slot K (shared) on rank 0. */
static int32_t row_runner(const epyq_model *m, const int32_t *sel, int32_t t, int32_t s) {
    int32_t K = m->d.topk;
    return epyq_model_ep_runner(m, s < K ? sel[(size_t)t * K + s] : m->d.E);
}

epyq_status epyq_moe_ep_combine(const epyq_model *m, int32_t T, const int32_t *sel, float *ys,
                                float *out, epyq_err *err) {
    const epyq_ep *ep = m->ep;
    const int32_t N = ep->size, me = ep->rank, S = m->d.topk + 1, H = m->d.H;
    const int32_t my0 = block_start(me, T, N), my1 = block_start(me + 1, T, N);
    int32_t *cnt = calloc((size_t)N * 6, sizeof(int32_t));
    if (!cnt)
        return epyq_err_set(err, EPYQ_E_NOMEM, "MoE exchange over %d ranks: out of memory", N);
    int32_t *scount = cnt, *sdispl = cnt + N, *rcount = cnt + 2 * N, *rdispl = cnt + 3 * N;
    int32_t *bcount = cnt + 4 * N, *bdispl = cnt + 5 * N;
    /* counts: rows this rank ran for each other block, and rows of its block each other ran */
    int32_t n_send = 0, n_recv = 0;
    for (int32_t r = 0; r < N; r++) {
        bdispl[r] = block_start(r, T, N);
        bcount[r] = block_start(r + 1, T, N) - bdispl[r];
        for (int32_t t = bdispl[r]; r != me && t < bdispl[r] + bcount[r]; t++)
            for (int32_t s = 0; s < S; s++) scount[r] += row_runner(m, sel, t, s) == me;
        sdispl[r] = n_send, n_send += scount[r];
    }
    for (int32_t t = my0; t < my1; t++)
        for (int32_t s = 0; s < S; s++) {
            int32_t q = row_runner(m, sel, t, s);
            if (q != me) rcount[q]++;
        }
    for (int32_t q = 0; q < N; q++) rdispl[q] = n_recv, n_recv += rcount[q];
    /* at least one row each, so a rank with nothing to send or take passes valid buffers */
    float *sbuf = malloc(((size_t)n_send + 1) * H * sizeof(float));
    float *rbuf = malloc(((size_t)n_recv + 1) * H * sizeof(float));
    int32_t *fill = malloc((size_t)N * sizeof(int32_t));
    epyq_status st = EPYQ_OK;
    if (!sbuf || !rbuf || !fill) {
        st = epyq_err_set(err, EPYQ_E_NOMEM,
                          "MoE exchange: %d + %d rows of %d floats: out of memory", n_send, n_recv,
                          H);
        goto done;
    }
    for (int32_t r = 0, at = 0; r < N; r++)
        for (int32_t t = bdispl[r]; r != me && t < bdispl[r] + bcount[r]; t++)
            for (int32_t s = 0; s < S; s++)
                if (row_runner(m, sel, t, s) == me)
                    memcpy(sbuf + (size_t)at++ * H, ys + ((size_t)t * S + s) * H,
                           (size_t)H * sizeof(float));
    st = ep->alltoallv(ep->ctx, sbuf, scount, sdispl, rbuf, rcount, rdispl, H, err);
    if (st != EPYQ_OK) goto done;
    /* each sender's rows arrive in (token, slot) order: put them back in their slots */
    memcpy(fill, rdispl, (size_t)N * sizeof(int32_t));
    for (int32_t t = my0; t < my1; t++)
        for (int32_t s = 0; s < S; s++) {
            int32_t q = row_runner(m, sel, t, s);
            if (q != me)
                memcpy(ys + ((size_t)t * S + s) * H, rbuf + (size_t)fill[q]++ * H,
                       (size_t)H * sizeof(float));
        }
    epyq_moe_sum(ys, my0, my1, S, H, out);
    st = ep->allgatherv(ep->ctx, out, bcount, bdispl, H, err);
done:
    free(sbuf), free(rbuf), free(fill), free(cnt);
    return st;
}
