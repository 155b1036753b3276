/* src/model/mtp.c — the MTP head (docs/architecture.md §5): fc over [normed embedding | normed
 * hidden], one full-attention MoE layer with its own KV cache in the sequence, mtp.norm, trunk
 * lm_head. */
#include <stdlib.h>
#include <string.h>

#include "load/tensor_f32.h"
#include "model/model_impl.h"

epyq_status epyq_model_mtp(epyq_model *m, epyq_seq *s, int32_t n, const float *h,
                           const int32_t *tok, const int32_t *pos, int32_t n_logits,
                           float *logits, float *h_out, epyq_err *err) {
    return epyq_mtp_run(m, s, n, h, tok, pos, n_logits, logits, h_out, false, err);
}

epyq_status epyq_mtp_run(epyq_model *m, epyq_seq *s, int32_t n, const float *h, const int32_t *tok,
                         const int32_t *pos, int32_t n_logits, float *logits, float *h_out, bool draft,
                         epyq_err *err) {
    if (!m->has_mtp) return epyq_err_set(err, EPYQ_E_ARG, "this model has no MTP head (mtp.*)");
    if (s->m != m) return epyq_err_set(err, EPYQ_E_ARG, "MTP: sequence of another model");
    if (s->broken[0])
        return epyq_err_set(err, EPYQ_E_ARG, "MTP: the sequence was left half-advanced by a failed forward (%s);"
                            " reset it before use", s->broken);
    if (n <= 0) return EPYQ_OK;
    if (n_logits < 0 || n_logits > n)
        return epyq_err_set(err, EPYQ_E_ARG, "MTP: %d logit rows asked of %d rows", n_logits, n);
    for (int32_t i = 0; i < n; i++) {
        if (pos[i] < 0 || pos[i] >= s->n_ctx)
            return epyq_err_set(err, EPYQ_E_CTX_FULL, "MTP row %d: position %d outside the context of %d",
                                i, pos[i], s->n_ctx);
        if (tok[i] < 0 || tok[i] >= m->d.V)
            return epyq_err_set(err, EPYQ_E_ARG, "MTP row %d: id %d outside the vocabulary [0, %d)",
                                i, tok[i], m->d.V);
    }
    int32_t H = m->d.H;
    float *cat = epyq_model_alloc((size_t)n * 2 * H, sizeof(float));
    float *x = epyq_model_alloc((size_t)n * H, sizeof(float));
    epyq_seq **seqs = malloc((size_t)n * sizeof *seqs);
    int32_t *pp = malloc((size_t)n * sizeof *pp), *grp_tok = malloc((size_t)n * sizeof *grp_tok);
    int32_t grp_off[2] = {0, n};
    epyq_act act = {0};
    void *abuf = NULL;
    epyq_status st = cat && x && seqs && pp && grp_tok ? EPYQ_OK
                                                       : epyq_err_set(err, EPYQ_E_NOMEM, "MTP: out of memory");
    if (st != EPYQ_OK) goto done;
    for (int32_t i = 0; i < n; i++) {
        float *e = cat + (size_t)i * 2 * H;
        if ((st = epyq_tensor_read_f32(&m->embed, (size_t)tok[i] * H, (size_t)H, e, err)) !=
            EPYQ_OK)
            goto done;
        epyq_rmsnorm_zc_rows(e, m->mtp_norm_e, 1, H, m->eps, e); /* embedding first */
        epyq_rmsnorm_zc_rows(h + (size_t)i * H, m->mtp_norm_h, 1, H, m->eps, e + H); /* then hidden */
        seqs[i] = s, pp[i] = pos[i], grp_tok[i] = i;
    }
    if ((st = epyq_rlin_act(m, cat, n, 2 * H, &act, &abuf, err)) != EPYQ_OK) goto done;
    epyq_rlin_run(m, &m->mtp_fc, &act, x, H);
    epyq_batch_plan p = {
        .T = n, .seq = seqs, .pos = pp, .n_groups = 1, .grp_off = grp_off, .grp_tok = grp_tok};
    if ((st = epyq_layer_forward(m, &m->mtp, &p, x, err)) != EPYQ_OK) goto done;
    epyq_rmsnorm_zc_rows(x, m->mtp_norm, n, H, m->eps, x);
    if (h_out) memcpy(h_out, x, (size_t)n * H * sizeof(float));
    const epyq_rlin *head = draft && m->draft_head.n ? &m->draft_head : &m->lm_head;
    if (logits && n_logits)
        st = epyq_head_run(m, head, x + (size_t)(n - n_logits) * H, n_logits, logits, err);
done:
    free(abuf), free(cat), free(x), free(seqs), free(pp), free(grp_tok);
    return st;
}
